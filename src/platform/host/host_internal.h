/* Private interface between the files of the host platform: devices and
 * their capacity accounts, fault injection, live counts, each file's ops for
 * the ops table, and the access-checked memory work that workers run. */
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

/* Streams and events (host_stream.c). */
tp_error_t tp__host_streams_init(void);
tp_error_t tp__host_stream_create(int device, unsigned flags, tp__pstream **ps,
                                  tp_stream_t *handle, uint64_t *uid);
tp_error_t tp__host_stream_destroy(tp__pstream *ps);
tp_error_t tp__host_stream_legacy(int device, tp__stream_desc *desc);
tp_error_t tp__host_stream_adopt(tp_stream_t handle, tp__stream_desc *desc);
tp_error_t tp__host_stream_synchronize(tp__pstream *ps);
tp_error_t tp__host_stream_query(tp__pstream *ps);
tp_error_t tp__host_stream_wait_event(tp__pstream *ps, tp__pevent *ev);
tp_error_t tp__host_memset_async(tp__pstream *ps, void *ptr, int value,
                                 size_t size);
tp_error_t tp__host_memcpy_async(tp__pstream *ps, void *dst, const void *src,
                                 size_t size);
tp_error_t tp__host_launch_host_func(tp__pstream *ps, void (*fn)(void *),
                                     void *arg);
tp_error_t tp__host_device_synchronize(int device);
tp_error_t tp__host_event_create(int device, tp__pevent **ev);
tp_error_t tp__host_event_destroy(tp__pevent *ev);
tp_error_t tp__host_event_record(tp__pevent *ev, tp__pstream *ps);
tp_error_t tp__host_event_query(tp__pevent *ev);
tp_error_t tp__host_event_synchronize(tp__pevent *ev);

/* Waits until the workers of every destroyed stream have exited, so that a
 * test's leak check sees no stream still draining. */
void tp__host_quiesce(void);

/* Memory (host_memory.c). */
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

/* Sharing between processes (host_memory.c): the memfd travels once, chunks
 * as offsets in it. */
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

#endif /* TP_HOST_INTERNAL_H */
