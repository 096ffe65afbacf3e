/* Tidepool's own CSV: action,addr,size,stream with an optional fifth column,
 * done (traces/README.md). One of the readers that trace_load.c calls; it
 * builds the trace through the builder of trace.c. */
#include <stdlib.h>
#include <string.h>

#include "trace_internal.h"

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
  if (*p != ',' && *p != '\0') {
    unsigned char c = (unsigned char)*p;
    if (c >= 0x20 && c < 0x7f)
      return trace_failf(err, len, "%s has a stray character '%c'", what, c);
    return trace_failf(err, len, "%s has a stray byte 0x%02x", what, c);
  }
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

/* The header of a file with the fifth column; trace_load.c told the format
 * by this header or the shorter one. */
static const char csv_header_done[] = TRACE_CSV_HEADER_DONE;

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
