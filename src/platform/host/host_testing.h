/* Test hooks of the host platform: fault injection and counts of live
 * platform objects. Linked into the static library only for tests and tools;
 * not part of the public API. */
#ifndef TP_HOST_TESTING_H
#define TP_HOST_TESTING_H

#include <stdint.h>

typedef enum tp__host_fault_kind {
  /* reserve, chunk_create, map, unmap, set_access */
  TP__HOST_FAULT_MEMORY = 0,
  /* stream_create, event_create, event_record, stream_wait_event,
   * memset_async, memcpy_async, launch_host_func */
  TP__HOST_FAULT_STREAM = 1,
  TP__HOST_FAULT_KINDS = 2
} tp__host_fault_kind;

/* Makes the nth next operation of `kind` fail (1: the very next one) with
 * TP_ERROR_OUT_OF_MEMORY for memory operations that allocate (reserve,
 * chunk_create) and TP_ERROR_PLATFORM for the others. 0 disarms. Only that
 * one operation fails; later ones succeed. Thread-safe. */
void tp__host_fault_arm(tp__host_fault_kind kind, uint64_t nth);

/* How many operations of `kind` have run since the process started. */
uint64_t tp__host_fault_ops(tp__host_fault_kind kind);

/* How many operations have been queued on a host stream (NULL: the legacy
 * stream of `device`) since it was made, its own and those the core queued
 * (barriers of stream waits): a tool that queues work of its own learns from
 * it whether anything else was queued. The stream must be live. */
uint64_t tp__host_stream_submitted(tp_stream_t stream, int device);

/* Live platform objects, for leak checks in tests. */
typedef struct tp__host_live {
  uint64_t reservations;
  uint64_t chunks;        /* created and not released */
  uint64_t mapped_chunks; /* mapped granules */
  uint64_t streams;       /* created by stream_create and not destroyed */
  uint64_t events;
  uint64_t device_bytes[16]; /* physical bytes held per emulated device */
  uint64_t host_bytes;       /* physical bytes held in host memory */
} tp__host_live;
void tp__host_live_get(tp__host_live *out);

#endif /* TP_HOST_TESTING_H */
