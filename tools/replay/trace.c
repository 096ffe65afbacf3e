/* Reads allocation traces (gzip'd CSV: action,addr,size,stream) into memory
 * with zlib. Each allocation gets a dense id; a free names the allocation
 * that its address held at that point of the trace. */
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define UNKNOWN_NAME UINT32_MAX

/* Address -> live allocation id: open addressing with tombstones. */
struct trace_names {
  uint64_t *keys;
  uint32_t *vals; /* UNKNOWN_NAME: empty; UNKNOWN_NAME - 1: deleted */
  size_t cap, used;
};
#define DELETED (UNKNOWN_NAME - 1)

trace_names *trace_names_new(void) {
  trace_names *n = calloc(1, sizeof *n);
  if (!n)
    return NULL;
  n->cap = 1024;
  n->keys = calloc(n->cap, sizeof *n->keys);
  n->vals = malloc(n->cap * sizeof *n->vals);
  if (!n->keys || !n->vals) {
    trace_names_free(n);
    return NULL;
  }
  memset(n->vals, 0xff, n->cap * sizeof *n->vals);
  return n;
}

void trace_names_free(trace_names *n) {
  if (!n)
    return;
  free(n->keys);
  free(n->vals);
  free(n);
}

static size_t slot(const trace_names *n, uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 17) & (n->cap - 1);
}

static uint32_t *find(trace_names *n, uint64_t key, bool insert) {
  size_t i = slot(n, key), tomb = SIZE_MAX;
  for (;; i = (i + 1) & (n->cap - 1)) {
    if (n->vals[i] == UNKNOWN_NAME)
      break;
    if (n->vals[i] == DELETED) {
      if (tomb == SIZE_MAX)
        tomb = i;
    } else if (n->keys[i] == key) {
      return &n->vals[i];
    }
  }
  if (!insert)
    return NULL;
  if (tomb != SIZE_MAX)
    i = tomb;
  else
    n->used++;
  n->keys[i] = key;
  return &n->vals[i];
}

static bool grow(trace_names *n) {
  if ((n->used + 1) * 2 < n->cap)
    return true;
  trace_names bigger = {0};
  bigger.cap = n->cap * 2;
  bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
  bigger.vals = malloc(bigger.cap * sizeof *bigger.vals);
  if (!bigger.keys || !bigger.vals) {
    free(bigger.keys);
    free(bigger.vals);
    return false;
  }
  memset(bigger.vals, 0xff, bigger.cap * sizeof *bigger.vals);
  for (size_t i = 0; i < n->cap; i++)
    if (n->vals[i] < DELETED)
      *find(&bigger, n->keys[i], true) = n->vals[i];
  free(n->keys);
  free(n->vals);
  *n = bigger;
  return true;
}

static int failf(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* A decimal field ending at a comma or the end; advances *s past it. */
static int number(const char **s, uint64_t *out, const char *what, char *err,
                  size_t len) {
  const char *p = *s;
  if (*p < '0' || *p > '9')
    return failf(err, len, "%s is not a number", what);
  uint64_t v = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      return failf(err, len, "%s is too large", what);
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (*p != ',' && *p != '\0')
    return failf(err, len, "%s has a stray character '%c'", what, *p);
  *s = *p == ',' ? p + 1 : p;
  *out = v;
  return 0;
}

int trace_parse_line(const char *line, trace_names *names, trace_op *op,
                     uint32_t *nnames, char *err, size_t len) {
  static const struct {
    const char *word;
    trace_action action;
  } actions[] = {{"alloc,", TRACE_ALLOC},
                 {"free_requested,", TRACE_FREE},
                 {"free_completed,", TRACE_COMPLETED}};
  const char *s = line;
  int a = -1;
  for (int i = 0; i < 3 && a < 0; i++)
    if (strncmp(s, actions[i].word, strlen(actions[i].word)) == 0)
      a = i;
  if (a < 0) {
    const char *comma = strchr(s, ',');
    int n = comma ? (int)(comma - s) : (int)strlen(s);
    return failf(err, len, "unknown action '%.*s'", n > 40 ? 40 : n, s);
  }
  s += strlen(actions[a].word);
  uint64_t addr, size, stream;
  if (number(&s, &addr, "addr", err, len) ||
      number(&s, &size, "size", err, len))
    return -1;
  if (*s == '\0' && s[-1] != ',')
    return failf(err, len, "the stream field is missing");
  if (number(&s, &stream, "stream", err, len))
    return -1;
  if (*s != '\0')
    return failf(err, len, "more than four fields");
  if (stream > UINT16_MAX)
    return failf(err, len, "stream %llu is out of range",
                 (unsigned long long)stream);
  op->action = (uint8_t)actions[a].action;
  op->size = size;
  op->stream = (uint16_t)stream;
  op->name = UNKNOWN_NAME;
  if (actions[a].action == TRACE_ALLOC) {
    if (*nnames >= DELETED)
      return failf(err, len, "too many allocations");
    if (!grow(names))
      return failf(err, len, "out of memory");
    op->name = (*nnames)++;
    *find(names, addr, true) = op->name;
  } else if (actions[a].action == TRACE_FREE) {
    uint32_t *v = find(names, addr, false);
    if (v) {
      op->name = *v;
      *v = DELETED;
    }
  }
  return 0;
}

static const char header[] = "action,addr,size,stream";

int trace_load(trace *t, const char *path, char *err, size_t len) {
  memset(t, 0, sizeof *t);
  gzFile f = gzopen(path, "rb");
  if (!f)
    return failf(err, len, "%s: cannot open: %s", path,
                 errno ? strerror(errno) : "out of memory");
  t->path = strdup(path);
  trace_names *names = trace_names_new();
  char line[256];
  size_t lineno = 0;
  int rc = 0;
  char why[160];
  while (rc == 0 && gzgets(f, line, sizeof line)) {
    lineno++;
    size_t n = strlen(line);
    bool whole = n > 0 && line[n - 1] == '\n';
    if (!whole) {
      /* Without its newline, a line is the file's last, longer than the
       * buffer, or cut short by a damaged stream; one more read tells. */
      int c = gzgetc(f), zerr = Z_OK;
      const char *zmsg = gzerror(f, &zerr);
      if (zerr != Z_OK && zerr != Z_STREAM_END) {
        rc = failf(err, len, "%s: corrupt or truncated gzip at line %zu: %s",
                   path, lineno, zmsg);
        break;
      }
      if (c != -1) {
        rc = failf(err, len, "%s:%zu: line too long", path, lineno);
        break;
      }
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
      line[--n] = '\0';
    if (lineno == 1) {
      if (strcmp(line, header) != 0)
        rc = failf(err, len, "%s:1: expected the header '%s'", path, header);
      continue;
    }
    if (n == 0)
      continue;
    if (t->nops == t->cap) {
      size_t cap = t->cap ? t->cap * 2 : 4096;
      trace_op *ops = realloc(t->ops, cap * sizeof *ops);
      if (!ops) {
        rc = failf(err, len, "%s: out of memory", path);
        break;
      }
      t->ops = ops;
      t->cap = cap;
    }
    trace_op *op = &t->ops[t->nops];
    if (!names ||
        trace_parse_line(line, names, op, &t->nnames, why, sizeof why) != 0) {
      rc = failf(err, len, "%s:%zu: %s", path, lineno,
                 names ? why : "out of memory");
      break;
    }
    t->nops++;
    if (op->stream + 1u > t->nstreams)
      t->nstreams = (uint16_t)(op->stream + 1u);
    t->nallocs += op->action == TRACE_ALLOC;
  }
  int zerr = Z_OK;
  const char *zmsg = gzerror(f, &zerr);
  if (rc == 0 && zerr != Z_OK && zerr != Z_STREAM_END)
    rc = failf(err, len, "%s: corrupt or truncated gzip after line %zu: %s",
               path, lineno, zmsg);
  if (rc == 0 && lineno == 0)
    rc = failf(err, len, "%s: empty file", path);
  gzclose(f);
  trace_names_free(names);
  if (rc != 0)
    trace_free(t);
  return rc;
}

void trace_free(trace *t) {
  free(t->ops);
  free(t->path);
  memset(t, 0, sizeof *t);
}
