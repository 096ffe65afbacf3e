/* tidepool: CUDA's stream-ordered memory allocator as an open library.
 *
 * This header is the manual. It declares the whole public API: the
 * stream-ordered allocator (a one-to-one rename of cudaMallocAsync and the
 * cudaMemPool* family) and the small stream runtime that the host platform
 * needs. Every function may be called from any thread unless its comment
 * says otherwise, and every function returns a tp_error_t. As with CUDA, a
 * child made by fork() cannot use tidepool once the parent has: it has
 * none of the parent's threads (the host platform's stream workers among
 * them) and, on cuda, no usable context, so every call there answers
 * TP_ERROR_NOT_PERMITTED. Exec first, or fork before the first call.
 * Once loaded, the shared library stays loaded until the process ends: a
 * dlclose leaves it in place (it is linked with -z nodelete), since its
 * threads, pools and thread-exit handlers outlive any caller's handle, and
 * a later dlopen finds the same library and its state.
 *
 * Where tidepool deliberately answers differently from the CUDA driver:
 *  - freeing a pointer that no tidepool pool gave out is
 *    TP_ERROR_INVALID_VALUE (the driver silently accepts pointers it owns
 *    through other allocators);
 *  - reserved-memory figures grow in platform chunks (2 MiB), not in the
 *    driver's 32 MiB steps. What is kept is the rule: at a synchronize,
 *    reserved falls to the release threshold, holding onto at least the
 *    threshold (whole chunks, up to one more) where it held more, and
 *    "used" counts the bytes asked for, not the bytes handed out;
 *  - a synchronize releases the frees it shows complete: those of the
 *    stream or event it waited for, of the streams that work waited for
 *    (events), and every one at a device synchronize. A free on another
 *    stream that happens to have completed waits for one of those (the
 *    driver may release it at any synchronize), and so does a blocking
 *    stream's free that a synchronize of the legacy stream covered;
 *  - a stream's own allocations and frees may join its free ranges: a
 *    free joined with a later free of its stream (or a completed range
 *    with a pending free of the one stream using the pool) counts, for
 *    other streams, event waiters, trims and releases, as the later free.
 *    Nothing is reused early; such memory is reused or released later. */
#ifndef TIDEPOOL_H
#define TIDEPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t, for the PyTorch entry points */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TP_BUILDING_LIBRARY) && defined(__GNUC__)
#define TP_API __attribute__((visibility("default")))
#else
#define TP_API
#endif

#define TP_VERSION_MAJOR 0
#define TP_VERSION_MINOR 1
#define TP_VERSION_PATCH 0

/* ========================================================================
 * Errors
 * ======================================================================== */

/* One list generates the enum, tp_error_name and tp_error_string. */
#define TP_ERROR_LIST(X)                                                       \
  X(TP_SUCCESS, 0, "no error")                                                 \
  X(TP_ERROR_INVALID_VALUE, 1,                                                 \
    "an argument is out of range, NULL where it may not be, or names an "      \
    "object tidepool does not know")                                           \
  X(TP_ERROR_OUT_OF_MEMORY, 2,                                                 \
    "the pool could not obtain enough memory for the request")                 \
  X(TP_ERROR_NOT_SUPPORTED, 3,                                                 \
    "the operation is not supported on this platform or for this object")      \
  X(TP_ERROR_INVALID_DEVICE, 4, "the device ordinal or location is invalid")   \
  X(TP_ERROR_NOT_PERMITTED, 5, "the operation is not permitted")               \
  X(TP_ERROR_NOT_READY, 6, "the work has not completed yet")                   \
  X(TP_ERROR_NO_DEVICE, 7, "no device is available on this platform")          \
  X(TP_ERROR_ILLEGAL_ADDRESS, 8,                                               \
    "stream work accessed memory it may not access")                           \
  X(TP_ERROR_PLATFORM, 9,                                                      \
    "the platform underneath failed; tp_get_last_platform_error has detail")   \
  TP_ERROR_LIST_CAPTURE_(X)

/* Stream capture's errors carry the CUDA runtime's values and meanings. */
#define TP_ERROR_LIST_CAPTURE_(X)                                              \
  X(TP_ERROR_ILLEGAL_STATE, 401,                                               \
    "the object is not in a state that allows the operation (ending a "        \
    "capture that is not active, beginning one that is)")                      \
  X(TP_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900,                                  \
    "the operation is not permitted while the stream is capturing")            \
  X(TP_ERROR_STREAM_CAPTURE_INVALIDATED, 901,                                  \
    "the capture was invalidated by an earlier error")                         \
  X(TP_ERROR_STREAM_CAPTURE_MERGE, 902,                                        \
    "the operation would merge two independent captures")                      \
  X(TP_ERROR_STREAM_CAPTURE_UNMATCHED, 903,                                    \
    "the capture was not begun on this stream")                                \
  X(TP_ERROR_STREAM_CAPTURE_UNJOINED, 904,                                     \
    "the capture forked into a stream that did not join back")                 \
  X(TP_ERROR_STREAM_CAPTURE_ISOLATION, 905,                                    \
    "a dependency would cross the capture's boundary")                         \
  X(TP_ERROR_STREAM_CAPTURE_IMPLICIT, 906,                                     \
    "legacy-stream work would depend implicitly on a capture")                 \
  X(TP_ERROR_CAPTURED_EVENT, 907, "the event was last recorded in a capture")  \
  X(TP_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908,                                 \
    "a capture not begun in relaxed mode was ended from another thread")

typedef enum tp_error {
#define TP_ERROR_ENUM_(name, value, text) name = value,
  TP_ERROR_LIST(TP_ERROR_ENUM_)
#undef TP_ERROR_ENUM_
} tp_error_t;

/* The enumerator's name as a string ("TP_ERROR_INVALID_VALUE"); an unknown
 * value gives "TP_ERROR_UNKNOWN". Never NULL. */
TP_API const char *tp_error_name(tp_error_t error);

/* A sentence describing the error. Never NULL. */
TP_API const char *tp_error_string(tp_error_t error);

/* Detail of the last TP_ERROR_PLATFORM returned on the calling thread: the
 * platform's own code (a CUresult on cuda, an errno on host) and its name.
 * Either pointer may be NULL. Errors: none (returns TP_SUCCESS). */
TP_API tp_error_t tp_get_last_platform_error(int *code, const char **name);

/* "host" or "cuda": the platform this process runs on. The platform is
 * chosen once per process, at the first call into the library, from
 * TIDEPOOL_PLATFORM=host|cuda; without it, cuda where libcuda loads and a
 * device exists, else host. Returns NULL only when initialisation failed.
 * On cuda, TIDEPOOL_CAPTURES=tidepool, read then too, promises that every
 * capture of the process begins with tp_stream_begin_capture and ends with
 * tp_stream_end_capture: allocations and frees then ask the driver whether
 * their stream captures only while such a capture is under way, rather than
 * on every call (a capture begun otherwise is then not seen). */
TP_API const char *tp_platform_name(void);

/* ========================================================================
 * Types
 * ======================================================================== */

typedef struct tp_stream_opaque *tp_stream_t; /* NULL: legacy default stream */
typedef struct tp_event_opaque *tp_event_t;
/* A pool handle. Any value may be passed: one that is not a pool's, or a
 * destroyed pool's, answers TP_ERROR_INVALID_VALUE, also while another
 * thread destroys the pool (a call that raced with the destroy either
 * completes or answers so). A destroyed pool's handle stays recognised
 * until a new pool takes its slot: the first four million pools get slots
 * of their own, and after them each new pool takes the slot of the pool
 * destroyed longest ago. */
typedef struct tp_pool_opaque *tp_pool_t;

/* Location types. As in CUDA, TP_LOCATION_NONE and TP_LOCATION_INVALID are
 * the same value: "none" is meaningful only for managed memory. */
typedef enum tp_location_type {
  TP_LOCATION_INVALID = 0,
  TP_LOCATION_NONE = 0,
  TP_LOCATION_DEVICE = 1,
  TP_LOCATION_HOST = 2,
  TP_LOCATION_HOST_NUMA = 3,
  TP_LOCATION_HOST_NUMA_CURRENT = 4,
  TP_LOCATION_DEVICE_LOCALITY_DOMAIN = 5,
  TP_LOCATION_INVISIBLE = 6
} tp_location_type_t;

typedef struct tp_location {
  tp_location_type_t type;
  int id;                 /* device ordinal or NUMA node, by type */
  int locality_domain_id; /* TP_LOCATION_DEVICE_LOCALITY_DOMAIN only */
} tp_location_t;

typedef enum tp_allocation_type {
  TP_ALLOCATION_INVALID = 0,
  TP_ALLOCATION_PINNED = 1,
  TP_ALLOCATION_MANAGED = 2
} tp_allocation_type_t;

/* A bit set. */
typedef enum tp_handle_type {
  TP_HANDLE_NONE = 0,
  TP_HANDLE_POSIX_FD = 1,
  TP_HANDLE_FABRIC = 8
} tp_handle_type_t;

/* Pool properties. Zero everything you do not set: a zeroed struct has
 * location type TP_LOCATION_INVALID, which tp_pool_create rejects. */
typedef struct tp_pool_props {
  tp_allocation_type_t alloc_type;
  unsigned handle_types; /* tp_handle_type_t bits */
  tp_location_t location;
  size_t max_size;      /* bytes of physical memory the pool may hold; 0: no
                           limit but the location's capacity. The pool holds
                           whole chunks (TP_POOL_ATTR_CHUNK_SIZE, 2 MiB on
                           both platforms), as many as fit in max_size */
  unsigned short usage; /* must be 0 */
} tp_pool_props_t;

typedef enum tp_pool_attr {
  /* The seed's attributes, same meaning and value types. */
  TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1, /* int, read-write */
  TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,       /* int, read-write */
  /* int, read-write. The allocating stream is made to wait for the freeing
   * stream's work up to the moment of the allocation, not only up to the
   * free (tidepool dates frees lazily, see docs/design.md): a program whose
   * freeing stream later waits for the allocating stream turns it off. */
  TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
  TP_POOL_ATTR_RELEASE_THRESHOLD = 4,    /* uint64_t, rw */
  TP_POOL_ATTR_RESERVED_MEM_CURRENT = 5, /* uint64_t, read-only */
  TP_POOL_ATTR_RESERVED_MEM_HIGH = 6,    /* uint64_t, reset to 0 only */
  TP_POOL_ATTR_USED_MEM_CURRENT = 7,     /* uint64_t, read-only */
  /* uint64_t, reset to 0 only. Never below the current figure when read.
   * Exact when one stream, or one thread, does all the allocating (any
   * number of threads on one stream, any number of streams from one
   * thread). The exact total is taken whenever an allocation raises its
   * stream's or its thread's own count above the highest it reached since
   * that was last done (or since the last reset); a peak made only of
   * allocations by several threads on several streams that each stayed
   * below both marks is missed. */
  TP_POOL_ATTR_USED_MEM_HIGH = 8,
  TP_POOL_ATTR_ALLOCATION_TYPE = 9,        /* int, read-only */
  TP_POOL_ATTR_EXPORT_HANDLE_TYPES = 10,   /* int, read-only */
  TP_POOL_ATTR_LOCATION_ID = 11,           /* int, read-only */
  TP_POOL_ATTR_LOCATION_TYPE = 12,         /* int, read-only */
  TP_POOL_ATTR_LOCALITY_DOMAIN_ID = 13,    /* int, read-only */
  TP_POOL_ATTR_MAX_POOL_SIZE = 14,         /* uint64_t, read-only */
  TP_POOL_ATTR_HW_DECOMPRESS_ENABLED = 15, /* int, read-only (always 0) */
  /* tidepool's own. */
  /* int, read-write, default 1: before failing with out-of-memory, wait on
   * the host for pending frees and try once more. Turn it off in a program
   * whose pending frees may sit behind stream work that waits on the
   * allocating thread: the wait would deadlock it. On cuda, a free pending
   * on another thread's per-thread default stream is waited for through an
   * event on the device's legacy stream, so the wait also waits for the
   * device's other blocking streams' earlier work. Frees pending on a
   * stream its owner destroyed cannot be waited for unless an event tidepool
   * recorded there already follows them (the stream cannot be asked any
   * more): they become reusable at a synchronize that covers them. The
   * wait is tidepool's own: a capture in progress, on this thread or
   * another, in any mode, neither refuses it nor is invalidated by it. */
  TP_POOL_ATTR_OOM_WAIT = 100,
  TP_POOL_ATTR_CHUNK_MAPS = 101,   /* uint64_t, read-only: chunks mapped */
  TP_POOL_ATTR_CHUNK_UNMAPS = 102, /* uint64_t, read-only: chunks unmapped */
  TP_POOL_ATTR_CHUNK_SIZE = 103,   /* uint64_t, read-only: platform chunk */
  /* uint64_t, read-write, parts per million, at most 1000000; default 3906
   * (1/256), or TIDEPOOL_GROWTH_SLACK's value where the process has it set
   * (read once): how far above the peak of bytes its users asked for the
   * pool may grow by making new chunks. Beyond it, growth moves wholly free
   * chunks behind the new range instead (driver calls that cost tens of
   * microseconds a chunk on the allocating thread, more while the GPU is
   * busy). More slack trades memory for fewer moves: a GPT training loop
   * that moves about 21 chunks a step at the default moves none at 25000
   * (2.5%), holding 1.022 times its peak instead of 1.012 (bench/RESULTS.md).
   * Where no chunk can be made (the pool's max_size, a full device), growth
   * moves wholly free chunks whatever the slack. Applies to growth from
   * then on. Errors: INVALID_VALUE above 1000000. */
  TP_POOL_ATTR_GROWTH_SLACK = 104
} tp_pool_attr_t;

typedef enum tp_access_flags {
  TP_ACCESS_NONE = 0,
  TP_ACCESS_READ = 1,
  TP_ACCESS_READ_WRITE = 3
} tp_access_flags_t;

typedef struct tp_access_desc {
  tp_location_t location;
  tp_access_flags_t flags;
} tp_access_desc_t;

/* Opaque, 64 bytes like the driver's; passed between processes as bytes. */
typedef struct tp_pool_ptr_export_data {
  unsigned char reserved[64];
} tp_pool_ptr_export_data_t;

/* What tp_pointer_get_attribute tells of a pointer; the values are the
 * driver's CU_POINTER_ATTRIBUTE_* of the same names. */
typedef enum tp_pointer_attr {
  TP_POINTER_ATTR_RANGE_START_ADDR = 11, /* void *: the allocation's start */
  TP_POINTER_ATTR_RANGE_SIZE = 12,       /* size_t: the bytes it asked for */
  TP_POINTER_ATTR_MEMPOOL_HANDLE = 17    /* tp_pool_t: the pool it is of */
} tp_pointer_attr_t;

typedef enum tp_device_attr {
  TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED = 1,
  TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES = 2,
  TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT = 3,
  TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS = 4
} tp_device_attr_t;

/* tp_stream_create flags. */
#define TP_STREAM_DEFAULT 0u
#define TP_STREAM_NON_BLOCKING 1u

/* ========================================================================
 * Stream-ordered allocation
 * ======================================================================== */

/* Allocates `size` bytes from the current pool of the stream's device,
 * usable by work ordered after this call on `stream` (and by any work that
 * follows it through events). size 0 succeeds with *ptr = NULL. The pointer
 * is aligned to at least 512 bytes. Should another thread destroy the
 * current pool meanwhile, the allocation comes from the pool current then.
 * Errors: INVALID_VALUE (ptr NULL, unknown stream), OUT_OF_MEMORY (size too
 * large for the pool, including sizes whose rounding overflows). */
TP_API tp_error_t tp_malloc_async(void **ptr, size_t size, tp_stream_t stream);

/* As tp_malloc_async, from `pool`, which may belong to another device than
 * the stream's. Errors: INVALID_VALUE (ptr NULL, pool unknown or destroyed,
 * pool imported from another process), OUT_OF_MEMORY. */
TP_API tp_error_t tp_malloc_from_pool_async(void **ptr, size_t size,
                                            tp_pool_t pool, tp_stream_t stream);

/* Frees `ptr` in stream order: the bytes may be reused by work ordered after
 * this call on `stream`, and by other streams as the pool's reuse policies
 * allow. NULL on a known stream succeeds and does nothing. A pointer
 * imported from another process gives its hold back once `stream` reaches
 * the free; an exported allocation that importers still hold is reused only
 * after they free it.
 * Errors: INVALID_VALUE (a pointer no tidepool pool gave out, an interior
 * pointer, a pointer already freed, unknown stream). A rejected free changes
 * nothing. */
TP_API tp_error_t tp_free_async(void *ptr, tp_stream_t stream);

/* Writes to *data what `attr` tells of the live allocation that holds
 * `ptr` (its start or any byte up to the size it asked for), as
 * cuPointerGetAttribute does for the driver's pools: its start, its size
 * (the bytes asked for) or its pool. Errors: INVALID_VALUE (data or ptr
 * NULL, another attribute, a pointer in no live allocation of a pool of
 * this process: freed, never given out, or imported from another
 * process). Thread-safe; racing a free of the same allocation, the answer
 * may be from before the free. */
TP_API tp_error_t tp_pointer_get_attribute(void *data, tp_pointer_attr_t attr,
                                           const void *ptr);

/* ========================================================================
 * Pools
 * ======================================================================== */

/* Creates a pool. The location must be a device ordinal that exists
 * (TP_LOCATION_DEVICE), the host (TP_LOCATION_HOST), a host NUMA node
 * (TP_LOCATION_HOST_NUMA), or, for managed memory, TP_LOCATION_NONE.
 * Errors: INVALID_VALUE for NULL pointers, unknown allocation types or
 * locations, usage != 0, handle types the location cannot export
 * (TP_LOCATION_HOST pools are not IPC-capable, as in CUDA; host NUMA pools
 * are), managed pools with max_size != 0, a
 * max_size below one chunk, TP_LOCATION_HOST_NUMA_CURRENT; NOT_SUPPORTED for
 * handle types the platform lacks; OUT_OF_MEMORY when the virtual range cannot
 * be reserved. On cuda, where the driver's virtual memory API makes no managed
 * memory, managed pools are made of pinned host memory mapped for the host and
 * every device: reachable from everywhere, never migrated. */
TP_API tp_error_t tp_pool_create(tp_pool_t *pool, const tp_pool_props_t *props);

/* Destroys a pool. With allocations still live, succeeds and defers: the
 * pool's free memory goes at once (its release threshold becomes 0), the
 * rest as frees complete, and the pool itself when the last allocation is
 * freed (and its free has completed) and, for an exported pool, importers
 * hold no block of it; it accepts no new importers meanwhile. A pool that was
 * current for its location stops being so. Errors: INVALID_VALUE (unknown or
 * destroyed pool, a default pool). */
TP_API tp_error_t tp_pool_destroy(tp_pool_t pool);

/* Reads an attribute into *value, whose type the tp_pool_attr_t list gives.
 * Errors: INVALID_VALUE (unknown pool or attribute, value NULL). */
TP_API tp_error_t tp_pool_get_attribute(tp_pool_t pool, tp_pool_attr_t attr,
                                        void *value);

/* Writes an attribute. Read-only attributes refuse (INVALID_VALUE); the
 * high watermarks accept only 0, which resets them to the current value.
 * Errors: INVALID_VALUE. */
TP_API tp_error_t tp_pool_set_attribute(tp_pool_t pool, tp_pool_attr_t attr,
                                        void *value);

/* Access of a location to the pool's memory: the own device always has
 * TP_ACCESS_READ_WRITE. Errors: INVALID_VALUE (NULL arguments, unknown pool,
 * location a device that does not exist, as the driver answers). */
TP_API tp_error_t tp_pool_get_access(tp_access_flags_t *flags, tp_pool_t pool,
                                     const tp_location_t *location);

/* Grants or revokes access for each descriptor, for memory already mapped
 * and mapped later. All descriptors are checked before any is applied.
 * Errors: INVALID_VALUE (NULL list with count > 0, unknown flags, unknown
 * pool), INVALID_DEVICE (unknown device, or the pool's own device set to
 * TP_ACCESS_NONE), NOT_SUPPORTED (the own device set to TP_ACCESS_READ), as
 * the driver answers. */
TP_API tp_error_t tp_pool_set_access(tp_pool_t pool,
                                     const tp_access_desc_t *desc_list,
                                     size_t count);

/* Releases free memory of the pool, whatever the release threshold, as
 * cudaMemPoolTrimTo: a pool holding more than min_bytes_to_keep keeps at
 * least that much reserved (in whole chunks: up to a chunk more), one
 * holding less is left as it is. Only frees already known to
 * have completed count as free; every stream's cached blocks are given back
 * first. Errors: INVALID_VALUE (unknown pool), PLATFORM (the platform would
 * not unmap or release a chunk: it stays reserved and counted, and a later
 * trim or synchronize tries again). */
TP_API tp_error_t tp_pool_trim_to(tp_pool_t pool, size_t min_bytes_to_keep);

/* ========================================================================
 * Default and current pools
 * ======================================================================== */

/* The default pool of a location and allocation type: device (pinned or
 * managed), host, host NUMA node, and managed with TP_LOCATION_NONE.
 * Errors: INVALID_VALUE (NULL arguments, combinations with no default pool,
 * such as pinned with TP_LOCATION_NONE), INVALID_DEVICE (unknown device). */
TP_API tp_error_t tp_mem_get_default_pool(tp_pool_t *pool,
                                          const tp_location_t *location,
                                          tp_allocation_type_t type);

/* The current pool of a location and type (initially its default pool): the
 * one tp_malloc_async uses for a stream of that device. Errors: as above. */
TP_API tp_error_t tp_mem_get_pool(tp_pool_t *pool,
                                  const tp_location_t *location,
                                  tp_allocation_type_t type);

/* Makes `pool` current for a location and type. The pool's own location and
 * allocation type must match. Errors: INVALID_VALUE (mismatch, unknown or
 * destroyed pool), INVALID_DEVICE. */
TP_API tp_error_t tp_mem_set_pool(const tp_location_t *location,
                                  tp_allocation_type_t type, tp_pool_t pool);

/* The device forms of the above, for pinned device memory. As the driver's,
 * the get and set forms answer INVALID_VALUE for a device that does not
 * exist (the default-pool form INVALID_DEVICE). */
TP_API tp_error_t tp_device_get_default_mem_pool(tp_pool_t *pool, int device);
TP_API tp_error_t tp_device_set_mem_pool(int device, tp_pool_t pool);
TP_API tp_error_t tp_device_get_mem_pool(tp_pool_t *pool, int device);

/* TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED (1 on every device),
 * MEMORY_POOL_SUPPORTED_HANDLE_TYPES (tp_handle_type_t bits),
 * LOCALITY_DOMAIN_COUNT, CONCURRENT_MANAGED_ACCESS.
 * Errors: INVALID_VALUE (value NULL, unknown attribute), INVALID_DEVICE. */
TP_API tp_error_t tp_device_get_attribute(int *value, tp_device_attr_t attr,
                                          int device);

/* ========================================================================
 * Sharing between processes
 *
 * A pool created with TP_HANDLE_POSIX_FD exports a descriptor; a process
 * that receives it (over a Unix socket with SCM_RIGHTS, or by inheritance
 * across fork and exec) imports the pool, then imports pointers that the
 * exporter describes in 64 bytes. An imported pointer maps the exporter's
 * own bytes, at an address of the importer's; chunks the exporter maps
 * after the export are reachable too. The rules are the driver's:
 *  - imported memory is not accessed before the allocation has completed in
 *    the exporter (synchronize, or an event, before handing the record on);
 *  - importers free before the exporter does. An importer's tp_free_async
 *    is stream-ordered: its hold on the block goes when its stream reaches
 *    the free.
 * Beyond the driver: the exporter knows which blocks importers hold, and a
 * block it frees while an importer holds it stays out of reuse (and counts
 * as used) until the importer's free has completed; an importer that exits
 * or dies releases all it held. The exporter can still trim every chunk
 * that no importer maps. Only processes of the exporter's user may import.
 * TP_HANDLE_FABRIC: on cuda a device pool may be created with it where
 * the device reports fabric handles, as the driver allows (its chunks are
 * then made with fabric handles, and an allocation answers NOT_SUPPORTED
 * where the machine grants no IMEX channel); no platform exports or
 * imports pools through it yet (NOT_SUPPORTED).
 *
 * Limits. Every wait of an importer on its exporter ends: the answer to a
 * pool import, to a pointer import (and each chunk it maps), and room to
 * send a request, each within 30 s (TIDEPOOL_IPC_TIMEOUT_MS sets another
 * bound, in milliseconds, for the whole process); a release never waits.
 * An exporter that does not answer in time: the call fails with
 * INVALID_VALUE, and so does every later import through that pool, but the
 * exporter may only be slow, so it keeps what this process holds: releases
 * it had no room for go, in order, once it reads again, and a hold that a
 * late answer made for a pointer this process never got goes back. An
 * exporting process serves at most 64 importing channels (one per pool
 * import) per importing process and pool, 1024 over all its pools, and
 * never so many that fewer than 64 of its descriptors stay free
 * (RLIMIT_NOFILE): a pool import beyond them is NOT_PERMITTED. Everything
 * one process reads from another is checked before it is used.
 * ======================================================================== */

/* Exports a pool created with `type` among its handle types. For
 * TP_HANDLE_POSIX_FD, *(int *)handle receives a new descriptor (close on
 * exec) that the caller owns and closes once it has passed it on; each call
 * gives another, and any number of processes may import through one. The
 * pool serves importers from a thread of its own, started by the first
 * export and stopped when the destroyed pool goes.
 * Errors: INVALID_VALUE (pool not created for `type`, imported pool,
 * flags != 0, NULL handle), NOT_SUPPORTED (TP_HANDLE_FABRIC, for a pool
 * created with it), PLATFORM. */
TP_API tp_error_t tp_pool_export_to_shareable_handle(void *handle,
                                                     tp_pool_t pool,
                                                     tp_handle_type_t type,
                                                     unsigned flags);

/* Imports a pool from a descriptor another process (or this one) exported. For
 * TP_HANDLE_POSIX_FD the descriptor comes by value, cast to a pointer, as the
 * driver takes it: (void *)(uintptr_t)fd, so that NULL is descriptor 0. The
 * caller keeps the descriptor and may close it afterwards. Waits for the
 * exporter's answer (30 s at most, see Limits). The imported pool cannot
 * allocate; it reports the exporter's allocation type and size limit, no export
 * handle types, and the exporter's location as this process names it:
 * TP_LOCATION_INVISIBLE (id -2) where the exporter's device is not one of this
 * process's (access then goes to the calling thread's device). Its reserved and
 * used figures are this process's mappings and imports. tp_pool_set_access
 * grants further devices; tp_pool_trim_to unmaps chunks no imported pointer
 * uses (a synchronize does so too). Destroying it waits for frees of its
 * pointers still queued on streams, then releases every pointer not freed.
 * Errors: INVALID_VALUE (not an open descriptor of an exported pool, no answer
 * in time, an answer no exporter would give), NOT_PERMITTED (the exporter runs
 * as another user, or serves as many channels as it allows), NOT_SUPPORTED
 * (TP_HANDLE_FABRIC, a chunk size this process cannot map), OUT_OF_MEMORY,
 * PLATFORM. */
TP_API tp_error_t tp_pool_import_from_shareable_handle(tp_pool_t *pool,
                                                       void *handle,
                                                       tp_handle_type_t type,
                                                       unsigned flags);

/* Describes a live allocation of an exportable pool in 64 opaque bytes,
 * good until the allocation is freed; every export of one allocation gives
 * the same bytes.
 * Errors: INVALID_VALUE (pointer not the start of a live allocation of an
 * exportable pool, NULL), OUT_OF_MEMORY.
 * Thread-safety: any thread, but not racing the allocation's free (a race
 * of the program's): an export that races it may describe the freed
 * allocation, and its bytes then stay good for the next allocation of the
 * same size at the same address until that one is freed. */
TP_API tp_error_t tp_pool_export_pointer(tp_pool_ptr_export_data_t *data,
                                         void *ptr);

/* Maps an exported allocation through a pool imported from its exporter,
 * and holds it there until tp_free_async of the returned pointer (on any
 * stream) has completed. Importing the same allocation twice gives the same
 * pointer, to be freed twice. The exporter checks every record: a
 * corrupted, forged or stale one (its allocation freed), or one of another
 * pool, maps nothing. Waits for the exporter's answers, 30 s at most each
 * (see Limits).
 * Errors: INVALID_VALUE (such records, NULL arguments, pool not imported,
 * exporter gone, silent past the bound, or its pool destroyed),
 * OUT_OF_MEMORY, PLATFORM. */
TP_API tp_error_t tp_pool_import_pointer(void **ptr, tp_pool_t pool,
                                         tp_pool_ptr_export_data_t *data);

/* ========================================================================
 * Stream runtime
 *
 * On the host platform these are tidepool's emulated device; on cuda they
 * are thin wrappers of the driver, and any CUstream or cudaStream_t cast to
 * tp_stream_t is accepted wherever a stream is taken.
 * ======================================================================== */

/* Number of devices. Errors: INVALID_VALUE (count NULL), NO_DEVICE (the
 * platform found none, as every call that initialises it answers then). */
TP_API tp_error_t tp_get_device_count(int *count);

/* The calling thread's current device (initially 0), like cudaSetDevice
 * and cudaGetDevice. Errors: INVALID_DEVICE (set: no such device),
 * INVALID_VALUE (get: device NULL). */
TP_API tp_error_t tp_set_device(int device);
TP_API tp_error_t tp_get_device(int *device);

/* Creates a stream on the current device. TP_STREAM_NON_BLOCKING streams do
 * not synchronise with the legacy default stream (NULL).
 * Errors: INVALID_VALUE (stream NULL, unknown flags), PLATFORM. */
TP_API tp_error_t tp_stream_create(tp_stream_t *stream, unsigned flags);

/* Destroys a stream once its queued work has run; blocks freed on it stay
 * reusable by other streams as their frees complete. A call on the stream
 * that races the destroy from another thread (undefined in CUDA) either
 * completes on the stream or answers INVALID_VALUE, and never touches freed
 * memory; a free it made after the destroy completes with the stream's
 * work. On cuda a handle used once the stream is gone is the driver's to
 * judge, as in CUDA (a stream tidepool did not make may have taken its
 * value); on host it answers INVALID_VALUE. The stream that began a
 * capture (tp_stream_begin_capture) still under way is destroyed, as the
 * driver destroys it (an H100, driver 580: success): its capture is
 * invalidated and can never end, so the memory it allocated goes as a
 * failed capture's. A stream that only joined a capture leaves it quietly, its
 * work staying in the graph (CUDA's graphMemoryNodes sample destroys such a
 * stream once joined back; one not joined back makes the end fail with
 * STREAM_CAPTURE_UNJOINED), and is not waited for: frees it made before
 * the capture become reusable at the next device synchronize.
 * Errors: INVALID_VALUE (unknown stream, the legacy default stream). */
TP_API tp_error_t tp_stream_destroy(tp_stream_t stream);

/* Waits for all work queued on the stream, then makes the frees it covered
 * reusable by every stream and releases pool memory above the release
 * threshold. On cuda, where frees were made on the legacy stream (NULL)
 * since it last completed, its synchronize and query first record an event
 * there, which waits for the work of the device's blocking streams that
 * those frees follow: the driver's own answer covers only the legacy
 * stream's queue. That event also follows what those streams queued after
 * the frees, so such a synchronize waits for that work too, where the
 * driver's own free, an action of its moment, would not. Errors:
 * INVALID_VALUE, ILLEGAL_ADDRESS (stream work faulted since the last
 * synchronize), STREAM_CAPTURE_UNSUPPORTED (a capture forbids it: see
 * "Forbidden while capturing"). */
TP_API tp_error_t tp_stream_synchronize(tp_stream_t stream);

/* TP_SUCCESS when the stream's work has completed, else NOT_READY; a
 * stream found complete makes its frees reusable by every stream, as a
 * synchronize does. Errors: INVALID_VALUE (unknown stream),
 * STREAM_CAPTURE_UNSUPPORTED (the stream captures: its capture is
 * invalidated, as in CUDA). */
TP_API tp_error_t tp_stream_query(tp_stream_t stream);

/* Makes future work on `stream` wait for `event`'s recorded work; frees
 * ordered before the event become reusable by the stream (pools with
 * REUSE_FOLLOW_EVENT_DEPENDENCIES). flags must be 0. Errors: INVALID_VALUE. */
TP_API tp_error_t tp_stream_wait_event(tp_stream_t stream, tp_event_t event,
                                       unsigned flags);

/* Events: positions in a stream's work. An event belongs to the device
 * current where it was created, and is recorded only on that device's
 * streams (INVALID_VALUE otherwise, as CUDA's event and stream must share
 * a context); any device's stream may wait on it. Errors: INVALID_VALUE
 * (NULL or unknown event or stream). tp_event_query returns NOT_READY while the
 * recorded work runs; an event never recorded has completed.
 * tp_event_synchronize also releases pool memory like a stream
 * synchronize. Once the work an event covers has faulted, both answer
 * ILLEGAL_ADDRESS, as CUDA's do, until the stream's synchronize reports
 * the fault (on cuda the driver's fault stays for the context's life).
 * tp_event_synchronize answers STREAM_CAPTURE_UNSUPPORTED where a capture
 * forbids it (see "Forbidden while capturing"). */
TP_API tp_error_t tp_event_create(tp_event_t *event);
TP_API tp_error_t tp_event_destroy(tp_event_t event);
TP_API tp_error_t tp_event_record(tp_event_t event, tp_stream_t stream);
TP_API tp_error_t tp_event_query(tp_event_t event);
TP_API tp_error_t tp_event_synchronize(tp_event_t event);

/* Waits for all work on every stream of the current device, then releases
 * pool memory as tp_stream_synchronize does. Errors: ILLEGAL_ADDRESS. */
TP_API tp_error_t tp_device_synchronize(void);

/* Stream-ordered memset and memcpy (any direction). On host, an access the
 * memory's pool does not grant to the stream's device, or an address the
 * process does not have, faults the stream: TP_ERROR_ILLEGAL_ADDRESS at its
 * next synchronize (bytes before the faulting one may have been written).
 * On cuda the driver decides, and may refuse such a call at once
 * (INVALID_VALUE) rather than fault the stream.
 * Errors: INVALID_VALUE (NULL pointers with size > 0, a range that wraps
 * around the end of the address space, unknown stream). */
TP_API tp_error_t tp_memset_async(void *ptr, int value, size_t size,
                                  tp_stream_t stream);
TP_API tp_error_t tp_memcpy_async(void *dst, const void *src, size_t size,
                                  tp_stream_t stream);

/* Runs fn(arg) on a host thread in stream order. fn must not call tidepool
 * functions that wait on the same stream. On cuda fn runs as a driver host
 * function (cuLaunchHostFunc), which CUDA forbids to make CUDA calls: there
 * fn must not call tidepool at all, since most calls may reach the driver.
 * Errors: INVALID_VALUE. */
TP_API tp_error_t tp_launch_host_func(tp_stream_t stream, void (*fn)(void *),
                                      void *arg);

/* ========================================================================
 * Stream capture and graphs
 *
 * Work queued on a capturing stream is recorded into a graph instead of
 * running; an instantiated graph (an exec) replays it at every launch.
 * Memsets, copies, host functions and event record and wait are captured,
 * also on other streams that join the capture by waiting on an event
 * recorded in it (fork), which must be joined back to the stream that began
 * it before it ends. The rules and errors are CUDA's (cudaStreamBeginCapture
 * and its family); on cuda these functions wrap the driver's, and a capture
 * begun by the application with cuStreamBeginCapture or
 * cudaStreamBeginCapture is recognised as well.
 *
 * Allocation during capture: tp_malloc_async and tp_malloc_from_pool_async
 * on a capturing stream return memory owned by the graph (an allocation
 * node), from device pools only (NOT_SUPPORTED for host and managed pools);
 * the pool's location and its access list at capture time set the node's
 * parameters, and the pool itself is not touched. The address is fixed for
 * the life of the graph and of each exec made from it. tp_free_async
 * during capture takes only a graph allocation (INVALID_VALUE for any
 * other pointer, which leaves its pool and the capture as they were); the
 * bytes it frees serve later allocations of the same graph that are
 * ordered after the free. An allocation the graph does not free outlives
 * each launch: it is freed afterwards by tp_free_async on any stream, or
 * by a free captured in another graph, and launching its graph again
 * before that free is refused (INVALID_VALUE), unless the exec was
 * instantiated with TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH, which frees
 * it at the next launch. Such memory stays valid after its exec and graph
 * are destroyed, until it is freed.
 *
 * Graph memory is counted per device (tp_device_get_graph_mem_attribute),
 * never in pool statistics. On host it is mapped when a graph is
 * instantiated, held while an exec of it exists (and its launches run),
 * and then kept for reuse by the device's graphs until
 * tp_device_graph_mem_trim. On cuda, where an application may instantiate
 * and launch a captured graph through the driver, it is mapped during
 * capture. A graph that tp_stream_end_capture returned is tidepool's
 * alone: its memory is held until the graph and every exec of it are
 * destroyed and their launches have completed, and launches of it carry
 * nothing of tidepool's. A graph whose capture the application ended with
 * the driver holds its memory until the driver reports it and every exec
 * of it destroyed (a CUDA user object in the graph); tidepool does not see
 * its launches, so they behave as if instantiated with
 * TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH, and each allocation that
 * outlives them may be freed once with tp_free_async (a graph's outputs),
 * also after the graph is gone, until which it stays mapped.
 *
 * Forbidden while capturing, as in CUDA, with the error CUDA gives and the
 * capture invalidated: synchronizing or querying a capturing stream
 * (STREAM_CAPTURE_UNSUPPORTED); work on the legacy stream while a blocking
 * stream of its device captures (STREAM_CAPTURE_IMPLICIT); waiting on an
 * event recorded outside the capture, whether or not its work is done
 * (STREAM_CAPTURE_ISOLATION; waiting on one never recorded orders nothing,
 * and the capture goes on, as the driver allows); tp_device_synchronize,
 * and tp_stream_synchronize or tp_event_synchronize of any stream or
 * event, during a capture in global mode on any thread, or in thread-local
 * mode on the capturing thread (STREAM_CAPTURE_UNSUPPORTED; a capture in
 * relaxed mode forbids none; queries are allowed). tp_event_query and
 * tp_event_synchronize refuse an event last recorded in a capture
 * (CAPTURED_EVENT), and tp_stream_wait_event refuses it once that capture
 * has ended (INVALID_VALUE, as the driver answers on an H200);
 * while it runs, a stream that waits on such an event joins it, unless the
 * capture was invalidated (INVALID_VALUE, the stream stays out). Two
 * captures that would merge through an event are both invalidated
 * (STREAM_CAPTURE_MERGE).
 *
 * Costs: on cuda, tp_malloc_async, tp_free_async, tp_event_record and
 * tp_stream_wait_event ask the driver whether their stream captures (one
 * cuStreamIsCapturing, some 15 to 20 ns; the capture's details only while
 * it captures). The answer is never kept: the driver lets any stream,
 * tidepool's included, begin a capture (cuStreamBeginCapture) or join one
 * (cuStreamWaitEvent) without tidepool seeing it. On host the question is
 * a load. A launch of a graph tidepool ended costs one more lock of its
 * stream (the order that tells when the graph's memory may go).
 * ======================================================================== */

/* Graph and exec handles. Any value may be passed: one that is not a live
 * graph's or exec's answers TP_ERROR_INVALID_VALUE, a destroyed one's also
 * after another graph or exec has taken its slot (a handle is no address
 * but a slot's number and generation; slots are reused, so that a program
 * that captures a graph per step does not run out). */
typedef struct tp_graph_opaque *tp_graph_t;
typedef struct tp_graph_exec_opaque *tp_graph_exec_t;

typedef enum tp_capture_mode {
  TP_CAPTURE_MODE_GLOBAL = 0,
  TP_CAPTURE_MODE_THREAD_LOCAL = 1,
  TP_CAPTURE_MODE_RELAXED = 2
} tp_capture_mode_t;

typedef enum tp_capture_status {
  TP_CAPTURE_STATUS_NONE = 0,
  TP_CAPTURE_STATUS_ACTIVE = 1,
  TP_CAPTURE_STATUS_INVALIDATED = 2
} tp_capture_status_t;

/* tp_graph_instantiate flags. */
#define TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH 1ull

typedef enum tp_graph_mem_attr {
  TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,     /* uint64_t, read-only */
  TP_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,        /* uint64_t, reset to 0 only */
  TP_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2, /* uint64_t, read-only */
  TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3     /* uint64_t, reset to 0 only */
} tp_graph_mem_attr_t;

/* Begins capturing the work queued on `stream`. In global mode, calls
 * CUDA deems unsafe are refused on every thread while the capture runs; in
 * thread-local mode, on the capturing thread; relaxed mode refuses none.
 * Errors: INVALID_VALUE (unknown stream or mode), STREAM_CAPTURE_UNSUPPORTED
 * (the legacy default stream), ILLEGAL_STATE (the stream already captures).
 * Thread-safe; the capture belongs to the calling thread unless relaxed. */
TP_API tp_error_t tp_stream_begin_capture(tp_stream_t stream,
                                          tp_capture_mode_t mode);

/* Ends the capture begun on `stream` and returns its graph in *graph, which
 * the caller destroys with tp_graph_destroy. Every stream that joined the
 * capture stops capturing. On failure *graph is NULL.
 * Errors: INVALID_VALUE (graph NULL, unknown stream), ILLEGAL_STATE (the
 * stream is not capturing), STREAM_CAPTURE_UNMATCHED (it joined a capture
 * begun on another stream: that capture is invalidated),
 * STREAM_CAPTURE_WRONG_THREAD (not relaxed, and not the thread that began
 * it: the capture ends, with no graph), STREAM_CAPTURE_INVALIDATED (an
 * earlier error invalidated it: it ends, with no graph),
 * STREAM_CAPTURE_UNJOINED (a forked stream did not join back: it ends,
 * with no graph). As the driver answers. Thread-safe. */
TP_API tp_error_t tp_stream_end_capture(tp_stream_t stream, tp_graph_t *graph);

/* The capture status of `stream`. Errors: INVALID_VALUE (status NULL,
 * unknown stream), STREAM_CAPTURE_IMPLICIT (the legacy stream while a
 * blocking stream of its device captures; that capture goes on).
 * Thread-safe. */
TP_API tp_error_t tp_stream_is_capturing(tp_stream_t stream,
                                         tp_capture_status_t *status);

/* Makes an executable graph of `graph`; flags is 0 or
 * TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH. A graph with allocations has at
 * most one exec at a time, as in CUDA; on host its memory is mapped here.
 * Errors: INVALID_VALUE (exec NULL, unknown or destroyed graph, unknown
 * flags), NOT_SUPPORTED (a second exec of a graph with allocations, as the
 * driver answers), OUT_OF_MEMORY (the graph's memory cannot be mapped),
 * PLATFORM. Thread-safe, also against
 * tp_graph_destroy of the same graph: the exec is made whole, or the call
 * answers INVALID_VALUE. */
TP_API tp_error_t tp_graph_instantiate(tp_graph_exec_t *exec, tp_graph_t graph,
                                       unsigned long long flags);

/* Queues one run of the exec on `stream`, after the stream's earlier work
 * and after the exec's earlier launches (for a graph with allocations or
 * frees, also those of its earlier execs, whose memory has the same
 * addresses), and after every tp_free_async (on any stream) of an
 * allocation the graph did not free. Makes no allocator
 * call. Errors: INVALID_VALUE (unknown or destroyed exec, unknown stream,
 * an allocation of the graph still live from an earlier launch without
 * AUTO_FREE_ON_LAUNCH, an allocation of another graph that this graph
 * frees and that is not live), STREAM_CAPTURE_UNSUPPORTED (a launch into
 * a capture, valid or invalidated, as the driver answers: a valid one is
 * invalidated by it), STREAM_CAPTURE_IMPLICIT (the legacy stream during a
 * blocking capture).
 * Thread-safe, but one exec's launches must not race each other; a launch
 * that races tp_graph_exec_destroy of its exec is queued whole or answers
 * INVALID_VALUE. */
TP_API tp_error_t tp_graph_launch(tp_graph_exec_t exec, tp_stream_t stream);

/* Destroys an exec; launches already queued still run, and its memory is
 * released once they have (on cuda, noticed at a later graph call or free
 * of graph memory). Errors: INVALID_VALUE (unknown or already destroyed
 * exec). Thread-safe. */
TP_API tp_error_t tp_graph_exec_destroy(tp_graph_exec_t exec);

/* Destroys a graph made by tp_stream_end_capture; its execs live on.
 * Errors: INVALID_VALUE (unknown or already destroyed graph).
 * Thread-safe. */
TP_API tp_error_t tp_graph_destroy(tp_graph_t graph);

/* Adopts an exec the platform made (cuda: cuGraphInstantiate*) of a graph
 * the application captured itself (cuStreamBeginCapture to
 * cuStreamEndCapture) while tidepool allocated in it, so that tidepool
 * books its launches: tp_graph_launch of the adopted exec launches the
 * platform's exec with the rules above (refused while an allocation of the
 * graph is live from an earlier launch, unless `flags` has
 * AUTO_FREE_ON_LAUNCH; after every tp_free_async of one), and each such
 * allocation may be freed once after each launch. Without adoption tidepool
 * does not see the launches, and each allocation that outlives them may be
 * freed once in all. tp_graph_exec_destroy of the adopted exec forgets it
 * and leaves the platform's exec to its owner; an exec the platform made
 * with the handle of one adopted before replaces it. The owner calls
 * tp_graph_forget before destroying the platform's graph. tidepool-run
 * adopts every exec the application instantiates. Errors: INVALID_VALUE (exec
 * or a handle NULL, a graph in whose capture tidepool allocated and freed
 * nothing), NOT_SUPPORTED (a graph whose graph memory already has an exec,
 * as the driver answers for a second exec of a graph with memory nodes;
 * host, where tidepool makes every exec). Thread-safe. */
TP_API tp_error_t tp_graph_exec_adopt(tp_graph_exec_t *exec,
                                      void *platform_exec, void *platform_graph,
                                      unsigned long long flags);

/* Whether tidepool allocated or freed in the capture that made the
 * platform's graph `platform_graph` (1) or not (0), in *adoptable: an
 * interposer tells so a refusal of tp_graph_exec_adopt that the
 * application must see (the graph's memory already has an exec, which
 * CUDA's instantiation refuses for a graph with memory nodes) from a graph
 * that is none of tidepool's. Errors: INVALID_VALUE (a pointer NULL),
 * NOT_SUPPORTED (host, as for tp_graph_exec_adopt). Thread-safe. */
TP_API tp_error_t tp_graph_adoptable(const void *platform_graph,
                                     int *adoptable);

/* The live adopted exec of the platform's exec `platform_exec`, in *exec.
 * Errors: INVALID_VALUE (exec NULL, none adopted). Thread-safe. */
TP_API tp_error_t tp_graph_exec_find(tp_graph_exec_t *exec,
                                     const void *platform_exec);

/* Tells tidepool that the platform's graph `platform_graph` is about to be
 * destroyed by its owner, since the platform may give its handle to a new
 * graph: from now on it names nothing to tp_graph_exec_adopt. Adopted execs
 * of it live on. Errors: INVALID_VALUE (NULL). Thread-safe. */
TP_API tp_error_t tp_graph_forget(void *platform_graph);

/* Gives back to the system the device's graph memory that no graph holds
 * (memory of destroyed execs and graphs, once their work has completed).
 * Errors: INVALID_DEVICE, PLATFORM (a chunk the platform would not release
 * stays reserved and counted). Thread-safe. */
TP_API tp_error_t tp_device_graph_mem_trim(int device);

/* Reads a graph memory attribute of the device into *(uint64_t *)value:
 * USED is memory mapped for graphs, RESERVED that plus what is kept for
 * reuse; the HIGHs are their watermarks. A failed call (an allocation in
 * capture, an instantiation) leaves all four as they were.
 * Errors: INVALID_VALUE (value NULL, unknown attribute), INVALID_DEVICE.
 * Thread-safe. */
TP_API tp_error_t tp_device_get_graph_mem_attribute(int device,
                                                    tp_graph_mem_attr_t attr,
                                                    void *value);

/* Resets a high watermark to the current value; *(uint64_t *)value must
 * be 0. Errors: INVALID_VALUE (value NULL or not 0, a current attribute),
 * INVALID_DEVICE. Thread-safe. */
TP_API tp_error_t tp_device_set_graph_mem_attribute(int device,
                                                    tp_graph_mem_attr_t attr,
                                                    void *value);

/* ========================================================================
 * PyTorch pluggable allocator
 *
 * Entry points with the signatures of torch.cuda.memory.
 * CUDAPluggableAllocator, so that PyTorch hands all its device allocations
 * to tidepool: integrations/pytorch/ loads the library and installs them
 * (tidepool_torch.install()). Unlike the rest of this header, the allocation
 * pair cannot return a tp_error_t: PyTorch fixes their signatures.
 *
 * Each call works on the current pool of `device` (tp_device_get_mem_pool)
 * with `stream` as PyTorch passes it (a cudaStream_t; NULL is the legacy
 * default stream of `device`). Only tidepool's notion of the thread's
 * current device is set to `device`, for the call: the thread's CUDA
 * context stays as it is, except that a thread's first call into tidepool
 * makes the context of `device` current (in an allocation, PyTorch's
 * current device already).
 *
 * Configuration, read from the environment once, at the first of these
 * calls, and applied to a device's current pool at the first call that
 * names that device (a pool made current later keeps its own settings):
 *
 *   TIDEPOOL_TORCH_RELEASE_THRESHOLD   TP_POOL_ATTR_RELEASE_THRESHOLD, in
 *       bytes with an optional K, M, G or T suffix (powers of 1024), or
 *       "max". Default: max, as PyTorch's backend:cudaMallocAsync sets it:
 *       memory stays reserved for reuse until tp_torch_trim.
 *   TIDEPOOL_TORCH_GROWTH_SLACK  TP_POOL_ATTR_GROWTH_SLACK, in parts per
 *       million (0 to 1000000). Default: 25000, so that a training loop
 *       moves no chunks once its pool has reached its peak; where
 *       TIDEPOOL_GROWTH_SLACK is set, the pool's own.
 *   TIDEPOOL_TORCH_REUSE_FOLLOW_EVENTS  (..._REUSE_FOLLOW_EVENT_DEPENDENCIES)
 *   TIDEPOOL_TORCH_REUSE_OPPORTUNISTIC  (..._REUSE_ALLOW_OPPORTUNISTIC)
 *   TIDEPOOL_TORCH_REUSE_INTERNAL_DEPS  (..._REUSE_ALLOW_INTERNAL_DEPENDENCIES)
 *       0 or 1: the TP_POOL_ATTR_ reuse policy in parentheses. Default: the
 *       pool's own setting (1 for each, as in CUDA).
 *   TIDEPOOL_TORCH_TRACE  a file that records every allocation and free in
 *       the CSV format of traces/, for tidepool-replay. Streams are numbered
 *       in order of first use, 0 being the legacy default stream; streams
 *       after the 64th all get number 64. Each %p in the path is replaced
 *       by the process id (%% by %), so that the processes of one
 *       environment (torchrun's ranks) each record a file of their own;
 *       a process that finds the file being recorded by another process
 *       records nothing and says so on stderr, rather than write over it;
 *       on a file system without locks the file is recorded without that
 *       check, with a note on stderr. A child made by fork() records
 *       nothing and leaves the parent's file alone. A failed write (a full
 *       disk, the lines still buffered at exit included) is reported on
 *       stderr and ends the recording.
 *   TIDEPOOL_TORCH_TRACE_COMPLETION  K > 0: the trace gets a fifth column,
 *       how far each operation's stream had completed when it was issued,
 *       from an event recorded every Kth operation of the stream
 *       (traces/README.md). Default 0: four columns.
 *
 * A value that does not parse is reported on stderr and ignored.
 * ======================================================================== */

/* Allocates `size` bytes in stream order on `stream`. Returns NULL for size
 * <= 0 and on failure, which is reported on stderr (the first few times):
 * PyTorch (2.11) does not check the pointer, so a failed allocation shows
 * up as a fault of the first kernel that touches the tensor. */
TP_API void *tp_torch_alloc(ssize_t size, int device, void *stream);

/* Frees `ptr` in stream order on `stream`, the stream it was allocated on
 * (PyTorch remembers it). `size` is unused. NULL is ignored; a pointer that
 * tidepool did not give out is reported on stderr and otherwise ignored (a
 * TIDEPOOL_TORCH_TRACE being recorded still shows the request). A pool
 * allocation freed during a capture PyTorch announced
 * (tp_torch_capture_begin) is freed once the last announced capture has
 * ended, waiting then for its recorded streams, where the capture refuses
 * the free (also one invalidated already) or a stream recorded for it
 * captures while the free does not (the work that stream queued before its
 * capture cannot be waited for until then). Outside an announced capture
 * such a free is reported and the memory stays allocated: never reused
 * under work that may still use it. During such a capture a
 * free on the legacy stream (NULL) is always deferred so, without asking
 * whether it captures: where a blocking stream captures, both the free and
 * the question would cost that capture its validity. So is a free that
 * would wait for a recorded stream destroyed since (the device would be
 * synchronized). A free so deferred on the calling thread's per-thread
 * stream is made on the legacy stream, which follows that stream's work;
 * one whose stream the program destroyed before the end is made there too,
 * after a device synchronize. */
TP_API void tp_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* The current pool's statistics of `device`: out[0] reserved bytes,
 * out[1] reserved high watermark, out[2] bytes in use (as asked for),
 * out[3] in-use high watermark, exact where one thread or one stream does
 * the allocating (TP_POOL_ATTR_USED_MEM_HIGH says when a peak may be
 * missed). The four are read one after another, not as one snapshot:
 * while other threads allocate they may come from slightly different
 * moments, but a high is never below the current read with it. Errors:
 * INVALID_VALUE (out NULL), INVALID_DEVICE. */
TP_API tp_error_t tp_torch_stats(int device, uint64_t out[4]);

/* Resets both high watermarks of the current pool of `device` to the
 * current values. Errors: INVALID_DEVICE. */
TP_API tp_error_t tp_torch_reset_peaks(int device);

/* The host time spent in tp_torch_alloc and tp_torch_free since the process
 * started, all devices and threads together: out[0] nanoseconds in
 * allocations, out[1] allocations, out[2] nanoseconds in frees, out[3]
 * frees (a free deferred past a capture counts once, when PyTorch made it).
 * Measured only where TIDEPOOL_TORCH_TIMING=1 was set when the first
 * allocation came (zeros otherwise): the clock costs tens of nanoseconds a
 * call. Errors: INVALID_VALUE (out NULL). Thread-safe. */
TP_API tp_error_t tp_torch_timing(uint64_t out[4]);

/* Waits for all work on `device` (tp_device_synchronize), then releases the
 * current pool's free memory as tp_pool_trim_to does: a pool that held more
 * than `keep` keeps at least `keep`, in whole chunks (tidepool_torch.trim();
 * torch.cuda.empty_cache() reaches it with keep 0 through
 * tp_torch_empty_cache). Errors: INVALID_DEVICE, ILLEGAL_ADDRESS, PLATFORM,
 * STREAM_CAPTURE_UNSUPPORTED (a capture in global mode is under way, which
 * the call invalidates, as cudaDeviceSynchronize does). */
TP_API tp_error_t tp_torch_trim(int device, size_t keep);

/* The hooks that integrations/pytorch installs on its CUDAPluggableAllocator
 * where PyTorch offers them (set_record_stream_fn, set_reset_fn,
 * set_begin_allocate_to_pool, set_end_allocate_to_pool_fn). None reports
 * an error to its caller, since PyTorch gives them no way to: failures go
 * to stderr, as in tp_torch_alloc. Thread-safe. */

/* Tensor.record_stream: the memory at `ptr` (as tp_torch_alloc returned it)
 * is also used by the work queued on `stream`. Its tp_torch_free makes the
 * freeing stream wait for the work queued on each recorded stream until
 * then (an event), so that the memory is reused only after it, wherever the
 * next allocation runs. A NULL `ptr` is ignored. A NULL `stream`, the
 * legacy default stream's handle on every device, names the legacy stream
 * of the device that tp_torch_free is given (the allocation's, as PyTorch
 * frees), whichever device is current where the record is made. A handle
 * that names the calling thread's own stream (cuda's per-thread default
 * stream, 0x2) is recorded as the legacy stream of that stream's device,
 * which waits for every blocking stream's work there, that thread's too:
 * the handle itself would name the freeing thread's own stream at the
 * free. */
TP_API void tp_torch_record_stream(void *ptr, void *stream);

/* torch.cuda.empty_cache(): tp_torch_trim(device, 0) on every device that
 * tidepool has served for PyTorch. */
TP_API void tp_torch_empty_cache(void);

/* PyTorch's CUDAGraph calls the first before it begins a capture and the
 * second after the capture ended (and the pair around use_mem_pool); each
 * ignores the arguments PyTorch passes. After tp_torch_announce_captures,
 * tp_torch_alloc and tp_torch_free ask whether their stream captures (a
 * driver call each) only while a pair is open, as PyTorch's own allocator
 * does: a capture begun by other code, on a stream where PyTorch then
 * allocates, is not seen (with PyTorch's allocator neither). An end with no
 * open pair is ignored. While a pair is open, every free on the legacy
 * stream is deferred to its end (asking the legacy stream could cost a
 * capture its validity): a pair with no capture behind it (use_mem_pool),
 * or a begin whose end never comes, holds that memory until then, and the
 * legacy stream's allocations meanwhile grow the pool. The end that closes
 * the last pair makes those frees; a begin on another thread meanwhile
 * waits until they are made (or deferred again), so that none of them
 * lands on the legacy stream after that thread's capture began.
 * tp_torch_record_stream's first call on a thread makes the context of
 * the tensor's device current (see tp_torch_alloc). */
TP_API void tp_torch_capture_begin(void);
TP_API void tp_torch_capture_end(void);
TP_API void tp_torch_announce_captures(void);

#ifdef __cplusplus
}
#endif
#endif /* TIDEPOOL_H */
