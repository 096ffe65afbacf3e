/* Allocation traces of real workloads, read into memory from three formats
 * told apart by content: tidepool's gzip'd CSV (traces/README.md), PyTorch
 * memory snapshots (the pickle of torch.cuda.memory._dump_snapshot) and
 * RMM's logging_resource_adaptor CSV. Errors name the file and the line or
 * entry. */
#ifndef TP_TRACE_H
#define TP_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum trace_action {
  TRACE_ALLOC = 0,
  TRACE_FREE = 1,      /* free_requested: the stream-ordered free */
  TRACE_COMPLETED = 2, /* free_completed: a hint that the free finished */
} trace_action;

/* The name of an operation that refers to no allocation of the trace. */
#define TRACE_NO_NAME UINT32_MAX
/* Streams a trace may use: the replay runs one platform stream (on host, a
 * thread) for each, and real traces use a few (PyTorch's recording numbers
 * at most 65). A file with more is refused, naming its line. */
#define TRACE_MAX_STREAMS 1024

typedef struct trace_op {
  uint32_t name;   /* dense id of the allocation, or TRACE_NO_NAME */
  uint16_t stream; /* 0 is the default stream */
  uint8_t action;
  uint64_t size;
  /* The line (CSV formats) or entry (snapshots) it came from: 64 bits, as a
   * file of 4 GiB of blank lines has more than 2^32 of them. */
  uint64_t where;
} trace_op;

typedef enum trace_format {
  TRACE_FORMAT_CSV,      /* tidepool's action,addr,size,stream[,done] */
  TRACE_FORMAT_SNAPSHOT, /* a PyTorch memory snapshot */
  TRACE_FORMAT_RMM       /* RMM's Thread,Time,Action,Pointer,Size,Stream */
} trace_format;

typedef struct trace {
  char *path;
  trace_format format;
  trace_op *ops;
  size_t nops, cap;
  uint32_t nnames;   /* distinct allocations */
  uint16_t nstreams; /* highest stream number + 1 */
  size_t nallocs;
  size_t unknown_frees; /* frees of addresses with no live allocation */
  size_t double_allocs; /* allocations at an address still live: the earlier
                           allocation stays live, as the trace never frees it */
  uint64_t peak_live; /* peak of live bytes asked for, counted while reading */
  /* The optional fifth CSV column, one per op: the index of the newest
   * operation of the op's stream known complete when it was issued (see
   * traces/README.md), or -1. NULL when the trace has no such column. */
  int64_t *done;
  /* Snapshots: what the recorded program's own allocator reserved, from its
   * segment events over the same trace. */
  bool has_user;
  uint64_t user_peak_reserved;
  int device;           /* snapshots: the device whose events were read */
  int devices;          /* snapshots: devices with events (only one read) */
  const char *where_is; /* "line" or "entry": what trace_op.where counts */
} trace;

/* Reads a trace of any of the formats. On failure returns -1 and writes a
 * message naming the file and, where it applies, the line or entry. */
int trace_load(trace *t, const char *path, char *err, size_t errlen);
void trace_free(trace *t);
/* "file:LINE" or "file, entry N" for an operation's origin, for messages. */
void trace_where(const trace *t, const trace_op *op, char *out, size_t len);
/* The name of a format, for messages and JSON. */
const char *trace_format_name(trace_format f);

#endif /* TP_TRACE_H */
