/* What the readers of the trace formats share: a builder that turns
 * (action, address, size, raw stream) events into a trace's operations,
 * naming allocations by address, numbering streams by first use and
 * counting live bytes, and the error helper. */
#ifndef TP_TRACE_INTERNAL_H
#define TP_TRACE_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>

#include "trace.h"

typedef struct trace_names trace_names;

typedef struct trace_builder {
  trace *t;
  trace_names *names; /* address -> live allocation id */
  uint64_t *sizes;    /* size of each allocation id while it is live */
  size_t capsizes;
  uint64_t live;
  uint64_t *raw_streams; /* raw stream value of each stream number > 0 */
} trace_builder;

int tb_init(trace_builder *b, trace *t);
void tb_fini(trace_builder *b);
/* The dense number of a raw stream value: 0 for 0 (the default stream),
 * then 1, 2, ... in order of first use. -1 past TRACE_MAX_STREAMS. */
int tb_stream(trace_builder *b, uint64_t raw, uint16_t *out);
/* Appends one operation; -1 with a reason in why (out of memory, too many
 * allocations). */
int tb_add(trace_builder *b, trace_action a, uint64_t addr, uint64_t size,
           uint16_t stream, uint32_t where, char *why, size_t len);

int trace_failf(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Calls fn on each line of data (without its newline or a trailing \r),
 * numbering lines from 1; a failure of fn becomes "path:LINE: why". */
typedef int (*trace_line_fn)(void *ctx, const char *line, uint32_t lineno,
                             char *err, size_t len);
int trace_each_line(const char *data, size_t len, const char *path,
                    trace_line_fn fn, void *ctx, char *err, size_t errlen);

/* The readers of each format: t->path is set; `data` holds the whole
 * (decompressed) file. Each returns 0 or -1 with a message in err. */
int trace_read_csv(trace *t, const char *data, size_t len, char *err,
                   size_t errlen);
int trace_read_rmm(trace *t, const char *data, size_t len, char *err,
                   size_t errlen);
int trace_read_snapshot(trace *t, const unsigned char *data, size_t len,
                        char *err, size_t errlen);

#endif /* TP_TRACE_INTERNAL_H */
