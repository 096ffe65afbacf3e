/* Allocation traces of real workloads: reading the gzip'd CSV format of
 * ../shared/traces (action,addr,size,stream) into memory, with errors that
 * name the file and line. */
#ifndef TP_TRACE_H
#define TP_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef enum trace_action {
  TRACE_ALLOC = 0,
  TRACE_FREE = 1,      /* free_requested: the stream-ordered free */
  TRACE_COMPLETED = 2, /* free_completed: a hint that the free finished */
} trace_action;

typedef struct trace_op {
  uint32_t name;   /* dense id of the allocation's address in the trace */
  uint16_t stream; /* 0 is the default stream */
  uint8_t action;
  uint64_t size;
} trace_op;

typedef struct trace {
  char *path;
  trace_op *ops;
  size_t nops, cap;
  uint32_t nnames;   /* distinct allocation names */
  uint16_t nstreams; /* highest stream number + 1 */
  size_t nallocs;
} trace;

/* Reads a trace. On failure returns -1 and writes a message naming the file
 * and, where it applies, the line into err. */
int trace_load(trace *t, const char *path, char *err, size_t errlen);
/* Parses one CSV line (without its newline) into op, with `names` mapping
 * addresses to dense ids; returns 0, or -1 with a reason in err. Exposed for
 * the tests of the parser. */
typedef struct trace_names trace_names;
trace_names *trace_names_new(void);
void trace_names_free(trace_names *n);
int trace_parse_line(const char *line, trace_names *names, trace_op *op,
                     uint32_t *nnames, char *err, size_t errlen);
void trace_free(trace *t);

#endif /* TP_TRACE_H */
