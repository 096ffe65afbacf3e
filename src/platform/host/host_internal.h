/* Private interface between the files of the host platform, which stand in
 * layers, each calling only the ones below it: host_device.c (devices, their
 * capacity accounts, fault injection, live counts), host_memory.c (memory
 * and the access-checked memory work that workers run), host_stream.c
 * (streams and events), host_capture.c (captures, graphs and execs), and at
 * the top host_platform.c (the ops table). */
#ifndef TP_HOST_INTERNAL_H
#define TP_HOST_INTERNAL_H

#include <stdbool.h>

#include "common/common.h"
#include "common/lock.h"
#include "platform/host/host_testing.h"
#include "platform/platform.h"

#define TP__HOST_MAX_DEVICES 16
/* Chunks are 2 MiB for every kind of memory, as on the H200. */
#define TP__HOST_GRANULARITY ((size_t)2 << 20)
/* Capacity accounts are indexed by device; host memory comes after them.
 * The same index is the location's bit in the access masks of a granule. */
#define TP__HOST_ACCOUNT_HOST TP__HOST_MAX_DEVICES
#define TP__HOST_ACCOUNTS (TP__HOST_MAX_DEVICES + 1)

/* ---- devices (host_device.c) -------------------------------------------- */

/* Written once by a successful init, before any other op can run. */
extern int tp__host_devices;
extern uint64_t tp__host_capacity[TP__HOST_ACCOUNTS];
/* Physical bytes charged to each account. */
extern _Atomic uint64_t tp__host_charged[TP__HOST_ACCOUNTS];

/* Live objects other than physical bytes, reported by tp__host_live_get. */
typedef struct tp__host_counts {
  _Atomic uint64_t reservations;
  _Atomic uint64_t chunks;
  _Atomic uint64_t mapped_chunks;
  _Atomic uint64_t streams;
  _Atomic uint64_t events;
} tp__host_counts;
extern tp__host_counts tp__host_counted;

/* Reads the settings from the environment into the variables above; a bad
 * one is reported on stderr and answered INVALID_VALUE. The caller
 * serialises it with every other op (host_platform.c's init). */
tp_error_t tp__host_configure(void);

/* Counts one operation of `kind`; true when it is the armed one, which must
 * then fail without any effect. */
bool tp__host_fault_fires(tp__host_fault_kind kind);
/* The failure of an armed operation that does not allocate. */
tp_error_t tp__host_fault_fail(void);

/* The capacity account of a kind of memory, or INVALID_DEVICE (a device or
 * NUMA node that does not exist), INVALID_VALUE (a location type the host
 * platform has no memory for), NOT_SUPPORTED (allocation or handle types). */
tp_error_t tp__host_account_of(const tp__mem_kind *kind, int *account);

/* The index of a device, the host or host NUMA node 0: its capacity account
 * and its bit in access masks. INVALID_DEVICE for a device or NUMA node that
 * does not exist, INVALID_VALUE for other location types. */
tp_error_t tp__host_location_index(const tp_location_t *location,
                                   unsigned *index);

/* The device ops of the ops table. */
tp_error_t tp__host_device_count(int *count);
tp_error_t tp__host_device_attribute(int *value, tp_device_attr_t attr,
                                     int device);
tp_error_t tp__host_set_device(int device);
tp_error_t tp__host_mem_query(const tp__mem_kind *kind, size_t *granularity,
                              uint64_t *capacity);
tp_error_t tp__host_device_uuid(int device, unsigned char uuid[16]);
bool tp__host_graph_maps_at_capture(void);

/* ---- memory (host_memory.c) -------------------------------------------- */

tp_error_t tp__host_reserve(const tp__mem_kind *kind, size_t size, size_t align,
                            tp__pres **res, uintptr_t *base);
tp_error_t tp__host_unreserve(tp__pres *res);
tp_error_t tp__host_chunk_create(tp__pres *res, tp__phys *phys);
tp_error_t tp__host_chunk_release(tp__pres *res, tp__phys phys);
tp_error_t tp__host_map(tp__pres *res, size_t offset, const tp__phys *phys,
                        size_t n);
tp_error_t tp__host_unmap(tp__pres *res, size_t offset, size_t n);
tp_error_t tp__host_set_access(tp__pres *res, size_t offset, size_t size,
                               const tp_access_desc_t *list, size_t count);

/* The memfd backing a reservation: chunk k lives at offset (k - 1) times the
 * granularity. The reservation keeps ownership. */
int tp__host_res_fd(tp__pres *res);

/* Sharing between processes: the memfd travels once, chunks as offsets in
 * it. */
tp_error_t tp__host_share_reservation(tp__pres *res, int *fd);
tp_error_t tp__host_share_chunk(tp__pres *res, tp__phys phys,
                                tp__chunk_share *share);
tp_error_t tp__host_reserve_imported(const tp__mem_kind *kind, size_t size,
                                     size_t align, int fd, tp__pres **res,
                                     uintptr_t *base);
tp_error_t tp__host_chunk_import(tp__pres *res, const tp__chunk_share *share,
                                 tp__phys *phys);

/* Runs a memset (src NULL) or memcpy as device `device` would: every granule
 * of a reservation that the range touches must be mapped and grant the
 * device write access (destination) or read access (source). Returns false,
 * having done nothing, when one does not. Safe against concurrent unmap. */
bool tp__host_mem_run(int device, void *dst, const void *src, int value,
                      size_t size);

/* ---- streams and events (host_stream.c) -------------------------------- */

tp_error_t tp__host_streams_init(void);
tp_error_t tp__host_stream_create(int device, unsigned flags, tp__pstream **ps,
                                  tp_stream_t *handle, uint64_t *uid);
tp_error_t tp__host_stream_legacy(int device, tp__stream_desc *desc);
tp_error_t tp__host_stream_adopt(tp_stream_t handle, tp__stream_desc *desc);
tp_error_t tp__host_stream_poll(tp__pstream *ps);
tp_error_t tp__host_stream_wait_event(tp__pstream *ps, tp__pevent *ev);
tp_error_t tp__host_event_create(int device, tp__pevent **ev);
tp_error_t tp__host_event_record(tp__pevent *ev, tp__pstream *ps);
tp_error_t tp__host_event_query(tp__pevent *ev);
tp_error_t tp__host_event_synchronize(tp__pevent *ev);

/* The ops in which a capture has a say, as the stream does them:
 * host_platform.c lets the capture code act first (take the work, refuse
 * the call, or let go of the stream or event), then calls these. */
tp_error_t tp__host_stream_destroy(tp__pstream *ps);
tp_error_t tp__host_stream_synchronize(tp__pstream *ps);
tp_error_t tp__host_stream_query(tp__pstream *ps);
tp_error_t tp__host_device_synchronize(int device);
tp_error_t tp__host_event_destroy(tp__pevent *ev);
/* Queues a memset (src NULL) or memcpy, or a host function, on ps. The
 * caller has counted the op for fault injection and checked its arguments,
 * as the ops table's entry points do. */
tp_error_t tp__host_stream_mem(tp__pstream *ps, void *dst, const void *src,
                               int value, size_t size);
tp_error_t tp__host_stream_host_func(tp__pstream *ps, void (*fn)(void *),
                                     void *arg);

/* Work that the layers above queue on a stream (a graph launch): the worker
 * calls run in the op's turn, and a false answer, memory work that faulted,
 * faults the stream; drop runs once when the op is done with, whether run
 * ran or not. */
typedef struct tp__host_job {
  bool (*run)(void *arg);
  void (*drop)(void *arg);
  void *arg;
} tp__host_job;
/* Queues `job` on ps after `after`'s position `after_pos` (NULL: none),
 * giving its position in *pos; the job is dropped on failure too. */
tp_error_t tp__host_stream_job(tp__pstream *ps, const tp__host_job *job,
                               tp__pstream *after, uint64_t after_pos,
                               uint64_t *pos);

/* Waits until the workers of every destroyed stream have exited, so that a
 * test's leak check sees no stream still draining. */
void tp__host_quiesce(void);

/* What streams keep for the capture code above them. A stream that takes
 * part in a capture holds its membership, an event recorded in a capture its
 * position there; both are host_capture.c's, which changes them under its
 * lock. Streams never look inside them, only at whether there is one, so
 * they keep them untyped and name none of the capture code's types. */
void *tp__host_stream_member(tp__pstream *ps);
/* ps joins a capture as `member`, or leaves it; a blocking stream is
 * counted on its device meanwhile. */
void tp__host_stream_join(tp__pstream *ps, void *member);
void tp__host_stream_leave(tp__pstream *ps);
/* Whether a blocking stream of the device takes part in a capture, which
 * puts the device's legacy stream under it too. */
bool tp__host_stream_blocking_captures(int device);
/* Whether work on ps must go through the capture code: ps captures, or it
 * is the legacy stream of a device where a blocking stream captures. */
bool tp__host_stream_capture_involved(tp__pstream *ps);
void *tp__host_event_capture(const tp__pevent *ev);
void tp__host_event_set_capture(tp__pevent *ev, void *recorded_in);
void tp__host_stream_describe(const tp__pstream *ps, int *device, bool *legacy,
                              bool *blocking);
void tp__host_stream_ref(tp__pstream *ps);
void tp__host_stream_unref(tp__pstream *ps);

/* ---- stream capture (host_capture.c) ------------------------------------ */

/* Captures under way on the host platform. */
extern _Atomic uint32_t tp__host_captures_active;

typedef enum tp__host_node_kind {
  TP__HOST_NODE_EMPTY = 0,
  TP__HOST_NODE_HOST_FUNC,
  TP__HOST_NODE_MEMSET,
  TP__HOST_NODE_MEMCPY
} tp__host_node_kind;

/* The work of one graph node, as a stream op would do it. */
typedef struct tp__host_node {
  tp__host_node_kind kind;
  /* The device of the stream it was captured on, whose access it runs
   * with wherever the graph is launched (set by the capture). */
  int device;
  union {
    struct {
      void (*fn)(void *);
      void *arg;
    } host;
    struct {
      void *dst;
      const void *src; /* NULL for a memset */
      int value;
      size_t size;
    } mem;
  } u;
} tp__host_node;

/* Records `node` in ps's capture (STREAM_CAPTURE_IMPLICIT, invalidating,
 * for the legacy stream; STREAM_CAPTURE_INVALIDATED for an invalidated
 * capture). *captured is false when ps turns out not to capture any more:
 * the caller then queues the work. */
tp_error_t tp__host_capture_node(tp__pstream *ps, const tp__host_node *node,
                                 bool *captured);
/* A synchronize or query of ps, which captures or is the legacy stream of
 * a device with a blocking capture: the error CUDA gives, invalidating the
 * capture (SUCCESS when the capture ended meanwhile). */
tp_error_t tp__host_capture_refuse(tp__pstream *ps);
/* Whether a synchronize of a stream or an event that takes part in no
 * capture is allowed now under the modes of the captures in progress;
 * invalidates those that forbid it. */
tp_error_t tp__host_capture_check_sync(void);
/* Whether a synchronize of the whole device is allowed now: never while a
 * capture has a stream on it, which it invalidates. */
tp_error_t tp__host_capture_check_device_sync(int device);
/* A capturing stream is being destroyed. */
void tp__host_capture_stream_gone(tp__pstream *ps);
/* An event recorded in a capture is being destroyed. */
void tp__host_capture_event_forget(tp__pevent *ev);
tp_error_t tp__host_capture_begin(tp__pstream *ps, tp_capture_mode_t mode);
tp_error_t tp__host_capture_end(tp__pstream *ps, tp__pgraph **graph,
                                uint64_t *id);
tp_error_t tp__host_capture_status(tp__pstream *ps, tp_capture_status_t *status,
                                   uint64_t *id);
tp_error_t tp__host_capture_invalidate(tp__pstream *ps);
tp_error_t tp__host_capture_point(tp__pstream *ps, uint64_t id,
                                  tp__pnode *node);
tp_error_t tp__host_capture_follows(tp__pstream *ps, const tp__pnode *nodes,
                                    size_t n, unsigned char *out);
tp_error_t tp__host_capture_attach(tp__pstream *ps, uint64_t id,
                                   void (*release)(void *), void *arg,
                                   void **tie, tp__pgraph **graph);
tp_error_t tp__host_capture_detach(tp__pgraph *g, void *tie);
tp_error_t tp__host_capture_event_record(tp__pevent *ev, tp__pstream *ps);
tp_error_t tp__host_capture_event_wait(tp__pstream *ps, tp__pevent *ev);
tp_error_t tp__host_graph_instantiate(tp__pgraph *graph,
                                      unsigned long long flags,
                                      void (*release)(void *), void *arg,
                                      tp__pexec **exec);
tp_error_t tp__host_graph_launch(tp__pexec *exec, tp__pstream *ps);
tp_error_t tp__host_graph_exec_destroy(tp__pexec *exec);
tp_error_t tp__host_graph_destroy(tp__pgraph *graph);

#endif /* TP_HOST_INTERNAL_H */
