/* What the trace readers share, defined in trace.c: the builder that turns
 * (action, address, size, raw stream) events into a trace's operations, the
 * address table, the memory limit, the line walk and the error helper. */
#ifndef TP_TRACE_INTERNAL_H
#define TP_TRACE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#include "trace.h"

/* The files stand in layers, so that none calls back into one that calls it:
 * trace.c calls no reader; the readers (trace_csv.c, trace_rmm.c,
 * trace_snapshot.c) call trace.c; trace_load.c, which none of them calls,
 * reads the file and calls the reader of its format. */

/* What reading one trace may hold: the decompressed file, a snapshot's
 * pickled values and the operations built. A gzip'd file decompresses to
 * up to 1032 times its size, and its lines or opcodes make operations or
 * values larger than themselves, so that a file of a few MB could ask for
 * tens of GiB; past the limit the reader stops with a message naming the
 * place. TRACE_DEFAULT_MEMORY_LIMIT, or TIDEPOOL_REPLAY_MEMORY_LIMIT
 * (bytes, with K, M, G or T). */
#define TRACE_DEFAULT_MEMORY_LIMIT ((uint64_t)16 << 30)
typedef struct trace_limit {
  uint64_t limit, held;
} trace_limit;

/* Counts `bytes` more; false past the limit. */
bool trace_charge(trace_limit *l, uint64_t bytes);
/* Writes why a reader stopped at the limit, "<what> more than ..."; returns
 * -1. */
int trace_limit_fail(const trace_limit *l, const char *what, char *why,
                     size_t len);

/* A hash table from 64-bit keys (addresses) to 32-bit values below
 * TRACE_MAP_ABSENT, so that a reader looks an address up in constant time
 * however many are live. */
typedef struct trace_map trace_map;
#define TRACE_MAP_ABSENT (UINT32_MAX - 1)
trace_map *trace_map_new(void);
void trace_map_free(trace_map *m);
/* Room for one more key: 0, -1 out of memory, -2 past the limit. */
int trace_map_room(trace_map **m, trace_limit *l);
/* The value's slot of a key, or NULL where it is absent and insert is
 * false; a key inserted holds TRACE_MAP_ABSENT until the caller stores a
 * value in its slot. Call trace_map_room before each insertion. */
uint32_t *trace_map_find(trace_map *m, uint64_t key, bool insert);
void trace_map_remove(uint32_t *slot);

/* The builder names allocations by address, numbers streams by first use
 * and counts live bytes. */
typedef struct trace_builder {
  trace *t;
  trace_limit *limit;
  trace_map *names; /* address -> live allocation id */
  uint64_t *sizes;  /* size of each allocation id while it is live */
  size_t capsizes;
  uint64_t live;
  uint64_t *raw_streams; /* raw stream value of each stream number > 0 */
} trace_builder;

int tb_init(trace_builder *b, trace *t, trace_limit *limit);
void tb_fini(trace_builder *b);
/* The dense number of a raw stream value: 0 for 0 (the default stream),
 * then 1, 2, ... in order of first use. -1 past TRACE_MAX_STREAMS. */
int tb_stream(trace_builder *b, uint64_t raw, uint16_t *out);
/* Appends one operation; -1 with a reason in why (out of memory, the
 * limit, too many allocations). */
int tb_add(trace_builder *b, trace_action a, uint64_t addr, uint64_t size,
           uint16_t stream, uint64_t where, char *why, size_t len);

int trace_failf(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Calls fn on each line of data (without its newline or a trailing \r),
 * numbering lines from 1; a failure of fn becomes "path:LINE: why". */
typedef int (*trace_line_fn)(void *ctx, const char *line, uint64_t lineno,
                             char *err, size_t len);
int trace_each_line(const char *data, size_t len, const char *path,
                    trace_line_fn fn, void *ctx, char *err, size_t errlen);

/* The headers of tidepool's CSV: trace_load.c tells the format by either,
 * and the CSV reader tells by the second that the fifth column is there. */
#define TRACE_CSV_HEADER "action,addr,size,stream"
#define TRACE_CSV_HEADER_DONE TRACE_CSV_HEADER ",done"

/* The readers of each format, which trace_load.c calls: t->path is set; `data`
 * holds the whole (decompressed) file, already counted in `limit`. Each returns
 * 0 or -1 with a message in err. */
int trace_read_csv(trace *t, const char *data, size_t len, trace_limit *limit,
                   char *err, size_t errlen);
int trace_read_rmm(trace *t, const char *data, size_t len, trace_limit *limit,
                   char *err, size_t errlen);
int trace_read_snapshot(trace *t, const unsigned char *data, size_t len,
                        trace_limit *limit, char *err, size_t errlen);

#endif /* TP_TRACE_INTERNAL_H */
