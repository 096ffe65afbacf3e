/* RMM's logging_resource_adaptor CSV: Thread,Time,Action,Pointer,Size,Stream
 * with actions allocate, free and "allocate failure" (skipped: nothing was
 * allocated), pointers and streams in hex (0x...) or decimal. Thread and
 * time are not used: the replay keeps the file's order. */
#include <string.h>

#include "trace_internal.h"

/* A hex (0x...) or decimal number, or glibc's "(nil)" for a null pointer;
 * the whole field must be one. */
static int field_number(const char *s, size_t n, uint64_t *out) {
  if (n == 5 && memcmp(s, "(nil)", 5) == 0) {
    *out = 0;
    return 0;
  }
  unsigned base = 10;
  if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s += 2;
    n -= 2;
  }
  if (n == 0 || n > (base == 16 ? 16u : 20u))
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned d;
    char c = s[i];
    if (c >= '0' && c <= '9')
      d = (unsigned)(c - '0');
    else if (base == 16 && c >= 'a' && c <= 'f')
      d = (unsigned)(c - 'a' + 10);
    else if (base == 16 && c >= 'A' && c <= 'F')
      d = (unsigned)(c - 'A' + 10);
    else
      return -1;
    if (v > (UINT64_MAX - d) / base)
      return -1;
    v = v * base + d;
  }
  *out = v;
  return 0;
}

static int rmm_each(void *ctx, const char *line, uint64_t lineno, char *err,
                    size_t len) {
  trace_builder *b = ctx;
  if (lineno == 1 || !*line)
    return 0;
  const char *f[6];
  size_t n[6];
  const char *s = line;
  int k = 0;
  for (; k < 6; k++) {
    f[k] = s;
    const char *comma = strchr(s, ',');
    n[k] = comma ? (size_t)(comma - s) : strlen(s);
    if (!comma) {
      k++;
      break;
    }
    s = comma + 1;
    if (k == 5)
      return trace_failf(err, len, "more than six fields");
  }
  if (k < 6)
    return trace_failf(err, len, "%d fields where RMM writes six", k);
  trace_action a;
  if (n[2] == 8 && memcmp(f[2], "allocate", 8) == 0)
    a = TRACE_ALLOC;
  else if ((n[2] == 4 && memcmp(f[2], "free", 4) == 0) ||
           (n[2] == 10 && memcmp(f[2], "deallocate", 10) == 0))
    a = TRACE_FREE;
  else if (n[2] == 16 && memcmp(f[2], "allocate failure", 16) == 0)
    return 0;
  else
    return trace_failf(err, len, "unknown action '%.*s'",
                       (int)(n[2] > 40 ? 40 : n[2]), f[2]);
  uint64_t ptr, size, stream;
  if (field_number(f[3], n[3], &ptr) != 0)
    return trace_failf(err, len, "the pointer '%.*s' is not a number",
                       (int)(n[3] > 40 ? 40 : n[3]), f[3]);
  if (field_number(f[4], n[4], &size) != 0)
    return trace_failf(err, len, "the size '%.*s' is not a number",
                       (int)(n[4] > 40 ? 40 : n[4]), f[4]);
  if (field_number(f[5], n[5], &stream) != 0)
    return trace_failf(err, len, "the stream '%.*s' is not a number",
                       (int)(n[5] > 40 ? 40 : n[5]), f[5]);
  /* cudaStreamLegacy (1) is the default stream as well. */
  uint16_t id;
  if (tb_stream(b, stream == 1 ? 0 : stream, &id) != 0)
    return trace_failf(err, len, "more than %d streams", TRACE_MAX_STREAMS - 1);
  return tb_add(b, a, ptr, size, id, lineno, err, len);
}

int trace_read_rmm(trace *t, const char *data, size_t len, trace_limit *limit,
                   char *err, size_t errlen) {
  trace_builder b;
  t->where_is = "line";
  if (tb_init(&b, t, limit) != 0)
    return trace_failf(err, errlen, "%s: out of memory", t->path);
  int rc = trace_each_line(data, len, t->path, rmm_each, &b, err, errlen);
  tb_fini(&b);
  return rc;
}
