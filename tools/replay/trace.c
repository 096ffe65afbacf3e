/* The trace and what its readers share (trace_internal.h): the error helper,
 * the reading limit, the address table, the builder and the line walk. It
 * calls no reader: the readers call it, and trace_load.c calls them. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mix.h"
#include "trace_internal.h"

int trace_failf(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- the limit on what reading a trace may hold ---------------------------
 */

bool trace_charge(trace_limit *l, uint64_t bytes) {
  if (bytes > l->limit - l->held)
    return false;
  l->held += bytes;
  return true;
}

/* A byte count as a person writes it: "64 MiB" where it is whole. */
static void bytes_text(uint64_t n, char *out, size_t len) {
  static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; i++) {
    unsigned shift = 10u * (unsigned)(4 - i);
    if (n >= (UINT64_C(1) << shift) && n % (UINT64_C(1) << shift) == 0) {
      snprintf(out, len, "%llu %s", (unsigned long long)(n >> shift), units[i]);
      return;
    }
  }
  snprintf(out, len, "%llu bytes", (unsigned long long)n);
}

int trace_limit_fail(const trace_limit *l, const char *what, char *why,
                     size_t len) {
  char n[40];
  bytes_text(l->limit, n, sizeof n);
  return trace_failf(why, len,
                     "%s more than %s, the memory reading a trace may take "
                     "(TIDEPOOL_REPLAY_MEMORY_LIMIT)",
                     what, n);
}

/* ---- 64-bit keys -> 32-bit values -----------------------------------------
 * Open addressing with tombstones. The hash mixes every bit of the key with
 * a seed that differs from table to table: the multiplication alone left
 * the addresses k * 2^40 / 0x9E3779B97F4A7C15 all in one slot, so that a
 * file of n of them cost n^2 (100,000 lines, 1 MB gzip'd: 20 s). */

#define EMPTY UINT32_MAX
#define DELETED TRACE_MAP_ABSENT

struct trace_map {
  uint64_t *keys;
  uint32_t *vals; /* EMPTY, DELETED or a value */
  size_t cap, used;
  uint64_t seed;
};

static trace_map *map_new(size_t cap) {
  trace_map *n = calloc(1, sizeof *n);
  if (!n)
    return NULL;
  n->cap = cap;
  n->keys = calloc(cap, sizeof *n->keys);
  n->vals = malloc(cap * sizeof *n->vals);
  if (!n->keys || !n->vals) {
    free(n->keys);
    free(n->vals);
    free(n);
    return NULL;
  }
  memset(n->vals, 0xff, cap * sizeof *n->vals);
  /* Where the arrays lie and when: what a file cannot know. */
  n->seed = tp_replay_mix64((uint64_t)(uintptr_t)n->keys ^
                            (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull);
  return n;
}

trace_map *trace_map_new(void) {
  return map_new(1024);
}

void trace_map_free(trace_map *n) {
  if (!n)
    return;
  free(n->keys);
  free(n->vals);
  free(n);
}

uint32_t *trace_map_find(trace_map *n, uint64_t key, bool insert) {
  size_t i = (size_t)tp_replay_mix64(key ^ n->seed) & (n->cap - 1);
  size_t tomb = SIZE_MAX;
  for (;; i = (i + 1) & (n->cap - 1)) {
    if (n->vals[i] == EMPTY)
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
  n->vals[i] = DELETED; /* until the caller stores a value */
  return &n->vals[i];
}

void trace_map_remove(uint32_t *slot) {
  *slot = DELETED;
}

/* Rehashes (dropping tombstones) when half full. */
int trace_map_room(trace_map **pn, trace_limit *l) {
  trace_map *n = *pn;
  if ((n->used + 1) * 2 < n->cap)
    return 0;
  size_t live = 0;
  for (size_t i = 0; i < n->cap; i++)
    live += n->vals[i] < DELETED;
  size_t cap = live * 4 > n->cap ? n->cap * 2 : n->cap;
  if (!trace_charge(l, (cap - n->cap) * (sizeof *n->keys + sizeof *n->vals)))
    return -2;
  trace_map *bigger = map_new(cap);
  if (!bigger)
    return -1;
  for (size_t i = 0; i < n->cap; i++)
    if (n->vals[i] < DELETED)
      *trace_map_find(bigger, n->keys[i], true) = n->vals[i];
  trace_map_free(n);
  *pn = bigger;
  return 0;
}

/* ---- the builder ----------------------------------------------------------
 */

int tb_init(trace_builder *b, trace *t, trace_limit *limit) {
  memset(b, 0, sizeof *b);
  b->t = t;
  b->limit = limit;
  b->names = trace_map_new();
  return b->names ? 0 : -1;
}

void tb_fini(trace_builder *b) {
  trace_map_free(b->names);
  free(b->sizes);
  free(b->raw_streams);
  memset(b, 0, sizeof *b);
}

int tb_stream(trace_builder *b, uint64_t raw, uint16_t *out) {
  if (raw == 0) {
    *out = 0;
    return 0;
  }
  uint16_t n = b->t->nstreams ? b->t->nstreams : 1;
  for (uint16_t i = 1; i < n; i++)
    if (b->raw_streams[i] == raw) {
      *out = i;
      return 0;
    }
  if (n == TRACE_MAX_STREAMS)
    return -1;
  uint64_t *r = realloc(b->raw_streams, (n + 1u) * sizeof *r);
  if (!r)
    return -1;
  b->raw_streams = r;
  r[n] = raw;
  b->t->nstreams = (uint16_t)(n + 1u);
  *out = n;
  return 0;
}

int tb_add(trace_builder *b, trace_action a, uint64_t addr, uint64_t size,
           uint16_t stream, uint64_t where, char *why, size_t len) {
  trace *t = b->t;
  if (t->nops == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 4096;
    if (!trace_charge(b->limit, (cap - t->cap) * sizeof *t->ops))
      return trace_limit_fail(b->limit, "its operations need", why, len);
    trace_op *ops = realloc(t->ops, cap * sizeof *ops);
    if (!ops)
      return trace_failf(why, len, "out of memory");
    t->ops = ops;
    t->cap = cap;
  }
  trace_op *op = &t->ops[t->nops];
  *op = (trace_op){.name = TRACE_NO_NAME,
                   .stream = stream,
                   .action = (uint8_t)a,
                   .size = size,
                   .where = where};
  if (a == TRACE_ALLOC) {
    if (t->nnames >= DELETED)
      return trace_failf(why, len, "too many allocations");
    int grown = trace_map_room(&b->names, b->limit);
    if (grown != 0)
      return grown == -2
                 ? trace_limit_fail(b->limit, "its operations need", why, len)
                 : trace_failf(why, len, "out of memory");
    if (t->nnames == b->capsizes) {
      size_t cap = b->capsizes ? b->capsizes * 2 : 4096;
      if (!trace_charge(b->limit, (cap - b->capsizes) * sizeof *b->sizes))
        return trace_limit_fail(b->limit, "its operations need", why, len);
      uint64_t *s = realloc(b->sizes, cap * sizeof *s);
      if (!s)
        return trace_failf(why, len, "out of memory");
      b->sizes = s;
      b->capsizes = cap;
    }
    uint32_t *slot = trace_map_find(b->names, addr, true);
    if (*slot < DELETED)
      t->double_allocs++;
    op->name = t->nnames++;
    *slot = op->name;
    b->sizes[op->name] = size;
    b->live += size;
    if (b->live > t->peak_live)
      t->peak_live = b->live;
    t->nallocs++;
  } else if (a == TRACE_FREE) {
    uint32_t *slot = trace_map_find(b->names, addr, false);
    if (slot) {
      op->name = *slot;
      trace_map_remove(slot);
      b->live -= b->sizes[op->name];
    } else {
      t->unknown_frees++;
    }
  }
  if (stream + 1u > t->nstreams)
    t->nstreams = (uint16_t)(stream + 1u);
  t->nops++;
  return 0;
}

/* The 64-bit `where` fills what was padding after `size`. */
_Static_assert(sizeof(trace_op) == 24, "an operation is 24 bytes");

/* ---- the lines of a text trace --------------------------------------------
 */

/* Lines longer than this are refused: neither CSV format has any, and
 * binary garbage does. */
#define LINE_MAX_CHARS 256
int trace_each_line(const char *data, size_t len, const char *path,
                    trace_line_fn fn, void *ctx, char *err, size_t errlen) {
  char line[LINE_MAX_CHARS + 2], why[200];
  /* 64 bits: a counter of 32 wrapped after 4 GiB of blank lines, so that
   * line 2^32 + 1 was taken for the header and skipped. */
  uint64_t lineno = 0;
  for (size_t at = 0; at < len;) {
    const char *start = data + at;
    const char *nl = memchr(start, '\n', len - at);
    size_t n = nl ? (size_t)(nl - start) : len - at;
    at += n + (nl != NULL);
    lineno++;
    if (n > 0 && start[n - 1] == '\r')
      n--;
    if (n > LINE_MAX_CHARS)
      return trace_failf(err, errlen, "%s:%llu: line too long", path,
                         (unsigned long long)lineno);
    memcpy(line, start, n);
    line[n] = '\0';
    if (memchr(line, '\0', n))
      return trace_failf(err, errlen, "%s:%llu: a NUL byte in a text line",
                         path, (unsigned long long)lineno);
    if (fn(ctx, line, lineno, why, sizeof why) != 0)
      return trace_failf(err, errlen, "%s:%llu: %s", path,
                         (unsigned long long)lineno, why);
  }
  return 0;
}

/* ---- the trace ------------------------------------------------------------
 */

void trace_free(trace *t) {
  free(t->ops);
  free(t->path);
  free(t->done);
  memset(t, 0, sizeof *t);
}

void trace_where(const trace *t, const trace_op *op, char *out, size_t len) {
  if (t->format == TRACE_FORMAT_SNAPSHOT)
    snprintf(out, len, "%s, device_traces[%d][%llu]", t->path, t->device,
             (unsigned long long)op->where);
  else
    snprintf(out, len, "%s:%llu", t->path, (unsigned long long)op->where);
}

const char *trace_format_name(trace_format f) {
  switch (f) {
  case TRACE_FORMAT_CSV: return "tidepool CSV";
  case TRACE_FORMAT_SNAPSHOT: return "PyTorch snapshot";
  case TRACE_FORMAT_RMM: return "RMM log";
  }
  return "?";
}
