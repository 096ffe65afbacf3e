/* Loading a trace: the whole file through zlib (which reads plain files as
 * they are), its format told by its first bytes, then the reader of that
 * format. Also the builder the readers share, and tidepool's own CSV format
 * (action,addr,size,stream with an optional fifth column, done). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zlib.h>

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

/* TIDEPOOL_REPLAY_MEMORY_LIMIT, or the default. */
static int memory_limit(const char *path, uint64_t *out, char *err,
                        size_t len) {
  const char *s = getenv("TIDEPOOL_REPLAY_MEMORY_LIMIT");
  *out = TRACE_DEFAULT_MEMORY_LIMIT;
  if (!s || !*s)
    return 0;
  uint64_t v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      break;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  unsigned shift = 0;
  if (p > s && *p) {
    const char *u = strchr("KMGT", *p >= 'a' ? *p - 'a' + 'A' : *p);
    shift = u ? 10u * (unsigned)(u - "KMGT" + 1) : 0;
    p += u != NULL;
  }
  if (p == s || *p || v == 0 || (shift && v > UINT64_MAX >> shift))
    return trace_failf(err, len,
                       "%s: TIDEPOOL_REPLAY_MEMORY_LIMIT=%s is not a byte "
                       "count (such as 512M or 32G)",
                       path, s);
  *out = v << shift;
  return 0;
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

/* ---- tidepool's CSV ---------------------------------------------------------
 */

/* A decimal field ending at a comma or the end; advances *s past it. */
static int number(const char **s, uint64_t *out, const char *what, char *err,
                  size_t len) {
  const char *p = *s;
  if (*p < '0' || *p > '9')
    return trace_failf(err, len, "%s is not a number", what);
  uint64_t v = 0;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10)
      return trace_failf(err, len, "%s is too large", what);
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (*p != ',' && *p != '\0')
    return trace_failf(err, len, "%s has a stray character '%c'", what, *p);
  *s = *p == ',' ? p + 1 : p;
  *out = v;
  return 0;
}

typedef struct csv_ctx {
  trace_builder b;
  bool with_done;
  size_t capdone;
} csv_ctx;

static int csv_line(csv_ctx *c, const char *line, uint64_t lineno, char *err,
                    size_t len) {
  bool with_done = c->with_done;
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
    return trace_failf(err, len, "unknown action '%.*s'", n > 40 ? 40 : n, s);
  }
  s += strlen(actions[a].word);
  uint64_t addr, size, stream, done = 0;
  if (number(&s, &addr, "addr", err, len) ||
      number(&s, &size, "size", err, len))
    return -1;
  if (*s == '\0' && s[-1] != ',')
    return trace_failf(err, len, "the stream field is missing");
  if (number(&s, &stream, "stream", err, len))
    return -1;
  bool unknown_done = false;
  if (with_done) {
    if (*s == '\0' && s[-1] != ',')
      return trace_failf(err, len, "the done field is missing");
    if (strcmp(s, "-1") == 0)
      unknown_done = true;
    else if (number(&s, &done, "done", err, len))
      return -1;
    else if (*s != '\0')
      return trace_failf(err, len, "more than five fields");
  } else if (*s != '\0') {
    return trace_failf(err, len, "more than four fields");
  }
  if (stream >= TRACE_MAX_STREAMS)
    return trace_failf(err, len, "stream %llu is out of range (0 to %d)",
                       (unsigned long long)stream, TRACE_MAX_STREAMS - 1);
  trace *t = c->b.t;
  if (with_done && !unknown_done && done > t->nops)
    return trace_failf(err, len,
                       "done %llu names an operation after this one (%zu)",
                       (unsigned long long)done, t->nops);
  if (with_done) {
    if (t->nops == c->capdone) {
      size_t cap = c->capdone ? c->capdone * 2 : 4096;
      if (!trace_charge(c->b.limit, (cap - c->capdone) * sizeof *t->done))
        return trace_limit_fail(c->b.limit, "its operations need", err, len);
      int64_t *d = realloc(t->done, cap * sizeof *d);
      if (!d)
        return trace_failf(err, len, "out of memory");
      t->done = d;
      c->capdone = cap;
    }
    t->done[t->nops] = unknown_done ? -1 : (int64_t)done;
  }
  return tb_add(&c->b, actions[a].action, addr, size, (uint16_t)stream, lineno,
                err, len);
}

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

static const char csv_header[] = "action,addr,size,stream";
static const char csv_header_done[] = "action,addr,size,stream,done";

static int csv_each(void *ctx, const char *line, uint64_t lineno, char *err,
                    size_t len) {
  csv_ctx *c = ctx;
  if (lineno == 1)
    return 0; /* the header, checked by the caller */
  if (!*line)
    return 0;
  return csv_line(c, line, lineno, err, len);
}

int trace_read_csv(trace *t, const char *data, size_t len, trace_limit *limit,
                   char *err, size_t errlen) {
  csv_ctx c = {.with_done = strncmp(data, csv_header_done,
                                    sizeof csv_header_done - 1) == 0};
  t->where_is = "line";
  if (tb_init(&c.b, t, limit) != 0)
    return trace_failf(err, errlen, "%s: out of memory", t->path);
  int rc = trace_each_line(data, len, t->path, csv_each, &c, err, errlen);
  tb_fini(&c.b);
  return rc;
}

/* ---- loading ----------------------------------------------------------------
 */

/* Room in *buf for at least `more` bytes after the n it holds, and a NUL:
 * the capacity doubles, so that a file costs its size, not its square. */
static bool room_for(char **buf, size_t *cap, size_t n, size_t more) {
  if (*cap - n >= more)
    return true;
  size_t c = *cap;
  while (c - n < more) {
    if (c > SIZE_MAX / 4)
      return false;
    c *= 2;
  }
  char *b = realloc(*buf, c + 1);
  if (!b)
    return false;
  *buf = b;
  *cap = c;
  return true;
}

static size_t count_lines(const char *buf, size_t n) {
  size_t lines = 0;
  for (size_t i = 0; i < n; i++)
    lines += buf[i] == '\n';
  return lines;
}

#define READ_CHUNK ((size_t)1 << 20)
/* inflate counts in unsigned int: at most 1 GiB a call, so that a trace of
 * more than 4 GiB reads on. */
#define INFLATE_MAX ((size_t)1 << 30)

/* Inflates the gzip file f, whose first `have` bytes are already in `in`,
 * into *buf. Members concatenated one after the other are one stream, as
 * gzip itself reads them (zlib's gzread does too); anything else after the
 * last member is refused, where gzread skipped it without a word. */
static int inflate_file(FILE *f, const char *path, const trace_limit *l,
                        unsigned char *in, size_t have, char **buf, size_t *cap,
                        size_t *n, char *err, size_t errlen) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 15 + 16) != Z_OK) /* gzip only */
    return trace_failf(err, errlen, "%s: out of memory", path);
  z.next_in = in;
  z.avail_in = (uInt)have;
  unsigned long long at = 0; /* the file offset of in[0] */
  bool between = false;      /* after a whole member */
  int rc = 0;
  while (rc == 0) {
    if (z.avail_in < 2 && !feof(f)) {
      /* Two bytes at least, so that a member's magic can be told. */
      size_t keep = z.avail_in;
      at += (unsigned long long)(z.next_in - in);
      memmove(in, z.next_in, keep);
      have = keep + fread(in + keep, 1, READ_CHUNK - keep, f);
      if (ferror(f)) {
        rc = trace_failf(err, errlen, "%s: cannot read: %s", path,
                         strerror(errno));
        break;
      }
      z.next_in = in;
      z.avail_in = (uInt)have;
    }
    if (between) {
      if (z.avail_in == 0)
        break; /* the end of the file after a whole member */
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        rc = trace_failf(err, errlen,
                         "%s: data after the end of the gzip stream at byte "
                         "%llu that is not another gzip member (after line "
                         "%zu)",
                         path, at + (unsigned long long)(z.next_in - in),
                         count_lines(*buf, *n));
        break;
      }
      inflateReset(&z);
      between = false;
    }
    /* One byte past the limit tells that the file goes past it. */
    uint64_t left = l->limit - l->held - *n;
    left += left < UINT64_MAX;
    if (!room_for(buf, cap, *n, left < 1u << 16 ? (size_t)left : 1u << 16)) {
      rc = trace_failf(err, errlen, "%s: out of memory", path);
      break;
    }
    size_t room = *cap - *n < INFLATE_MAX ? *cap - *n : INFLATE_MAX;
    room = room < left ? room : (size_t)left;
    z.next_out = (unsigned char *)*buf + *n;
    z.avail_out = (uInt)room;
    int zr = z.avail_in ? inflate(&z, Z_NO_FLUSH) : Z_BUF_ERROR;
    *n += room - z.avail_out;
    if (*n > l->limit - l->held) {
      char why[200];
      trace_limit_fail(l, "decompresses to", why, sizeof why);
      rc = trace_failf(err, errlen,
                       "%s: %s, by line %zu (compressed byte %llu): a gzip "
                       "bomb, or a trace to read with a higher limit",
                       path, why, count_lines(*buf, *n) + 1,
                       at + (unsigned long long)(z.next_in - in));
    } else if (zr == Z_STREAM_END)
      between = true;
    else if (zr == Z_BUF_ERROR && z.avail_in == 0 && feof(f))
      rc = trace_failf(err, errlen,
                       "%s: corrupt or truncated gzip after line %zu: the "
                       "file ends inside a gzip member",
                       path, count_lines(*buf, *n));
    else if (zr == Z_MEM_ERROR)
      rc = trace_failf(err, errlen, "%s: out of memory", path);
    else if (zr != Z_OK && zr != Z_BUF_ERROR)
      rc = trace_failf(err, errlen,
                       "%s: corrupt or truncated gzip after line %zu: %s", path,
                       count_lines(*buf, *n), z.msg ? z.msg : "damaged data");
  }
  inflateEnd(&z);
  return rc;
}

/* The whole file, decompressed when it begins with gzip's magic bytes and
 * as it is otherwise. The message of a damaged gzip stream counts the whole
 * lines read before the damage. */
static int slurp(const char *path, trace_limit *l, char **out, size_t *outlen,
                 char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0)
    return trace_failf(err, errlen, "%s: cannot open: %s", path,
                       strerror(errno));
  if (S_ISDIR(st.st_mode))
    return trace_failf(err, errlen, "%s: is a directory, not a trace", path);
  char why[200];
  if ((uint64_t)st.st_size > l->limit - l->held) {
    trace_limit_fail(l, "is", why, sizeof why);
    return trace_failf(err, errlen, "%s: a file of %lld bytes %s", path,
                       (long long)st.st_size, why);
  }
  FILE *f = fopen(path, "rb");
  if (!f)
    return trace_failf(err, errlen, "%s: cannot open: %s", path,
                       strerror(errno));
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap + 1);
  unsigned char *in = malloc(READ_CHUNK);
  int rc = buf && in ? 0 : trace_failf(err, errlen, "%s: out of memory", path);
  size_t have = rc == 0 ? fread(in, 1, READ_CHUNK, f) : 0;
  if (rc == 0 && have >= 2 && in[0] == 0x1f && in[1] == 0x8b) {
    rc = inflate_file(f, path, l, in, have, &buf, &cap, &n, err, errlen);
  } else if (rc == 0) {
    while (have > 0) {
      if (have > l->limit - l->held - n) {
        /* The file grew since its size was read. */
        trace_limit_fail(l, "holds", why, sizeof why);
        rc = trace_failf(err, errlen, "%s: %s", path, why);
        break;
      }
      if (!room_for(&buf, &cap, n, have)) {
        rc = trace_failf(err, errlen, "%s: out of memory", path);
        break;
      }
      memcpy(buf + n, in, have);
      n += have;
      have = fread(in, 1, READ_CHUNK, f);
    }
  }
  if (rc == 0 && ferror(f))
    rc = trace_failf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
  fclose(f);
  free(in);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  trace_charge(l, n);
  buf[n] = '\0';
  *out = buf;
  *outlen = n;
  return 0;
}

int trace_load(trace *t, const char *path, char *err, size_t len) {
  memset(t, 0, sizeof *t);
  char *data = NULL;
  size_t n = 0;
  trace_limit limit = {0};
  if (memory_limit(path, &limit.limit, err, len) != 0 ||
      slurp(path, &limit, &data, &n, err, len) != 0)
    return -1;
  t->path = strdup(path);
  int rc = t->path ? 0 : trace_failf(err, len, "%s: out of memory", path);
  static const char rmm_header[] = "Thread,Time,Action,Pointer,Size,Stream";
  size_t first = strcspn(data, "\r\n");
  if (rc != 0) {
    /* reported */
  } else if (n == 0) {
    rc = trace_failf(err, len, "%s: empty file", path);
  } else if ((unsigned char)data[0] == 0x80) {
    t->format = TRACE_FORMAT_SNAPSHOT;
    rc = trace_read_snapshot(t, (const unsigned char *)data, n, &limit, err,
                             len);
  } else if ((first == sizeof csv_header - 1 &&
              strncmp(data, csv_header, first) == 0) ||
             (first == sizeof csv_header_done - 1 &&
              strncmp(data, csv_header_done, first) == 0)) {
    t->format = TRACE_FORMAT_CSV;
    rc = trace_read_csv(t, data, n, &limit, err, len);
  } else if (first == sizeof rmm_header - 1 &&
             strncmp(data, rmm_header, first) == 0) {
    t->format = TRACE_FORMAT_RMM;
    rc = trace_read_rmm(t, data, n, &limit, err, len);
  } else {
    rc = trace_failf(err, len,
                     "%s:1: expected the header '%s' (tidepool), '%s' (RMM's "
                     "logging adaptor) or a PyTorch memory snapshot (a pickle)",
                     path, csv_header, rmm_header);
  }
  if (rc == 0 && t->nops == 0)
    rc = trace_failf(err, len, "%s: no allocations or frees in the file", path);
  free(data);
  if (rc != 0)
    trace_free(t);
  return rc;
}

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
