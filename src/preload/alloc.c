/* The runtime's stream-ordered allocator answered by tidepool:
 * cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync, the cudaMemPool*
 * family, default and current pools, and cudaFree of tidepool's pointers.
 * The runtime's structs and enums are translated field by field; calls on
 * pools or pointers tidepool did not make go to the runtime. */
#include <stdlib.h>
#include <string.h>

#include "preload.h"

typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*malloc_pool_fn)(void **, size_t, cudaMemPool_t,
                                      cudaStream_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*pool_create_fn)(cudaMemPool_t *,
                                      const struct cudaMemPoolProps *);
typedef cudaError_t (*pool_destroy_fn)(cudaMemPool_t);
typedef cudaError_t (*pool_attr_fn)(cudaMemPool_t, enum cudaMemPoolAttr,
                                    void *);
typedef cudaError_t (*pool_set_access_fn)(cudaMemPool_t,
                                          const struct cudaMemAccessDesc *,
                                          size_t);
typedef cudaError_t (*pool_get_access_fn)(enum cudaMemAccessFlags *,
                                          cudaMemPool_t,
                                          struct cudaMemLocation *);
typedef cudaError_t (*pool_trim_fn)(cudaMemPool_t, size_t);
typedef cudaError_t (*pool_export_fn)(void *, cudaMemPool_t,
                                      enum cudaMemAllocationHandleType,
                                      unsigned);
typedef cudaError_t (*pool_import_fn)(cudaMemPool_t *, void *,
                                      enum cudaMemAllocationHandleType,
                                      unsigned);
typedef cudaError_t (*ptr_export_fn)(struct cudaMemPoolPtrExportData *, void *);
typedef cudaError_t (*ptr_import_fn)(void **, cudaMemPool_t,
                                     struct cudaMemPoolPtrExportData *);
typedef cudaError_t (*device_pool_fn)(cudaMemPool_t *, int);
typedef cudaError_t (*device_set_pool_fn)(int, cudaMemPool_t);
typedef cudaError_t (*mem_pool_fn)(cudaMemPool_t *, struct cudaMemLocation *,
                                   enum cudaMemAllocationType);
typedef cudaError_t (*mem_set_pool_fn)(struct cudaMemLocation *,
                                       enum cudaMemAllocationType,
                                       cudaMemPool_t);

TP_PL_NEXT(cudaMallocAsync, malloc_async_fn)
TP_PL_NEXT(cudaMallocAsync_ptsz, malloc_async_fn)
TP_PL_NEXT(cudaFreeAsync, free_async_fn)
TP_PL_NEXT(cudaFreeAsync_ptsz, free_async_fn)
TP_PL_NEXT(cudaMallocFromPoolAsync, malloc_pool_fn)
TP_PL_NEXT(cudaMallocFromPoolAsync_ptsz, malloc_pool_fn)
TP_PL_NEXT(cudaFree, free_fn)
TP_PL_NEXT(cudaMemPoolCreate, pool_create_fn)
TP_PL_NEXT(cudaMemPoolDestroy, pool_destroy_fn)
TP_PL_NEXT(cudaMemPoolGetAttribute, pool_attr_fn)
TP_PL_NEXT(cudaMemPoolSetAttribute, pool_attr_fn)
TP_PL_NEXT(cudaMemPoolSetAccess, pool_set_access_fn)
TP_PL_NEXT(cudaMemPoolGetAccess, pool_get_access_fn)
TP_PL_NEXT(cudaMemPoolTrimTo, pool_trim_fn)
TP_PL_NEXT(cudaMemPoolExportToShareableHandle, pool_export_fn)
TP_PL_NEXT(cudaMemPoolImportFromShareableHandle, pool_import_fn)
TP_PL_NEXT(cudaMemPoolExportPointer, ptr_export_fn)
TP_PL_NEXT(cudaMemPoolImportPointer, ptr_import_fn)
TP_PL_NEXT(cudaDeviceGetDefaultMemPool, device_pool_fn)
TP_PL_NEXT(cudaDeviceGetMemPool, device_pool_fn)
TP_PL_NEXT(cudaDeviceSetMemPool, device_set_pool_fn)
TP_PL_NEXT(cudaMemGetDefaultMemPool, mem_pool_fn)
TP_PL_NEXT(cudaMemGetMemPool, mem_pool_fn)
TP_PL_NEXT(cudaMemSetMemPool, mem_set_pool_fn)

/* Calls the real `name` with `args`, or answers that the runtime lacks it.
 * The call is marked as on its way through the runtime, so that the
 * driver-level layer lets the runtime's driver calls for it pass. */
#define FORWARD(name, args)                                                    \
  return next_##name() ? TP_PL_THROUGH_RUNTIME(next_##name(), args)            \
                       : TP_PL_NO_RUNTIME

/* A call tidepool does not answer, counted as such. */
#define FORWARD_COUNTED(name, args)                                            \
  do {                                                                         \
    tp__pl_count(TP_PL_COUNT_FORWARDED);                                       \
    FORWARD(name, args);                                                       \
  } while (0)

/* Enters tidepool (see tp__pl_enter) or returns the runtime's error. */
#define ENTER()                                                                \
  do {                                                                         \
    cudaError_t enter_rc_ = tp__pl_enter(true);                                \
    if (enter_rc_ != cudaSuccess)                                              \
      return enter_rc_;                                                        \
  } while (0)

/* tidepool's answer as the runtime's, counted under `counter`. */
static cudaError_t answer(tp_error_t err, int counter) {
  tp__pl_count(counter);
  return tp__pl_fail(err);
}

/* The translations of preload.h, on the runtime's structs. */
static bool location_in(const struct cudaMemLocation *in, tp_location_t *out) {
  return tp__pl_location_in((int)in->type, in->id, out);
}

static bool alloc_type_in(enum cudaMemAllocationType in,
                          tp_allocation_type_t *out) {
  return tp__pl_alloc_type_in((int)in, out);
}

/* ---- allocation ---------------------------------------------------------- */

static cudaError_t malloc_async(void **ptr, size_t size, cudaStream_t stream,
                                bool per_thread) {
  ENTER();
  tp_error_t err =
      tp_malloc_async(ptr, size, tp__pl_stream(stream, per_thread));
  return answer(err, TP_PL_COUNT_MALLOC);
}

/* On a stream being captured too: tidepool's capture path makes the
 * allocation a graph's (see tidepool.h, "Stream capture and graphs"), on a
 * capture begun by the runtime or the driver as on one of tidepool's. */
TP_PL_EXPORT cudaError_t cudaMallocAsync(void **ptr, size_t size,
                                         cudaStream_t stream) {
  if (!tp__pl_active())
    FORWARD(cudaMallocAsync, (ptr, size, stream));
  return malloc_async(ptr, size, stream, false);
}

TP_PL_EXPORT cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size,
                                              cudaStream_t stream) {
  if (!tp__pl_active())
    FORWARD(cudaMallocAsync_ptsz, (ptr, size, stream));
  return malloc_async(ptr, size, stream, true);
}

static cudaError_t malloc_from_pool(void **ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream, bool per_thread) {
  ENTER();
  tp_error_t err = tp_malloc_from_pool_async(ptr, size, (tp_pool_t)pool,
                                             tp__pl_stream(stream, per_thread));
  return answer(err, TP_PL_COUNT_MALLOC);
}

TP_PL_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size,
                                                 cudaMemPool_t pool,
                                                 cudaStream_t stream) {
  if (!tp__pl_active())
    FORWARD(cudaMallocFromPoolAsync, (ptr, size, pool, stream));
  if (!tp__pl_pool_known((tp_pool_t)pool))
    FORWARD_COUNTED(cudaMallocFromPoolAsync, (ptr, size, pool, stream));
  return malloc_from_pool(ptr, size, pool, stream, false);
}

TP_PL_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size,
                                                      cudaMemPool_t pool,
                                                      cudaStream_t stream) {
  if (!tp__pl_active())
    FORWARD(cudaMallocFromPoolAsync_ptsz, (ptr, size, pool, stream));
  if (!tp__pl_pool_known((tp_pool_t)pool))
    FORWARD_COUNTED(cudaMallocFromPoolAsync_ptsz, (ptr, size, pool, stream));
  return malloc_from_pool(ptr, size, pool, stream, true);
}

/* A free tidepool refuses as not its own (a pointer of a driver-made pool,
 * during capture a graph allocation of one, or no allocation at all) goes
 * to the runtime, which gives the driver's answer; tidepool's refusal
 * changed nothing. NULL goes there too, so that its answer is the
 * runtime's. */
#define FREE_ASYNC_BODY(name, per_thread)                                      \
  do {                                                                         \
    if (!ptr || !tp__pl_on())                                                  \
      FORWARD(name, (ptr, stream));                                            \
    ENTER();                                                                   \
    tp_error_t err = tp_free_async(ptr, tp__pl_stream(stream, per_thread));    \
    if (err == TP_ERROR_INVALID_VALUE)                                         \
      FORWARD_COUNTED(name, (ptr, stream));                                    \
    return answer(err, TP_PL_COUNT_FREE);                                      \
  } while (0)

TP_PL_EXPORT cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  FREE_ASYNC_BODY(cudaFreeAsync, false);
}

TP_PL_EXPORT cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream) {
  FREE_ASYNC_BODY(cudaFreeAsync_ptsz, true);
}

/* cudaFree accepts stream-ordered allocations too; the program has made
 * sure that no work still uses them. The free is queued on the legacy
 * stream, which follows all earlier work of blocking streams, and waited
 * for, so that the memory is free for everyone when cudaFree returns (and
 * falls to the release threshold), as cudaFree's callers expect. */
TP_PL_EXPORT cudaError_t cudaFree(void *ptr) {
  if (!ptr || !tp__pl_on())
    FORWARD(cudaFree, (ptr));
  ENTER();
  tp_error_t err = tp_free_async(ptr, NULL);
  if (err == TP_ERROR_INVALID_VALUE)
    FORWARD(cudaFree, (ptr));
  if (err == TP_SUCCESS)
    err = tp_stream_synchronize(NULL);
  return answer(err, TP_PL_COUNT_FREE);
}

/* ---- pools ----------------------------------------------------------------
 */

/* The start of every call that takes a pool: to the runtime while tidepool
 * does not answer, or when the pool is not tidepool's. */
#define POOL_CALL(name, pool, args)                                            \
  do {                                                                         \
    if (!tp__pl_active())                                                      \
      FORWARD(name, args);                                                     \
    if (!tp__pl_pool_known((tp_pool_t)(pool)))                                 \
      FORWARD_COUNTED(name, args);                                             \
    ENTER();                                                                   \
  } while (0)

TP_PL_EXPORT cudaError_t
cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
  if (!tp__pl_active())
    FORWARD(cudaMemPoolCreate, (pool, props));
  ENTER();
  if (!pool || !props)
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp_pool_props_t tp = {0};
  if (!alloc_type_in(props->allocType, &tp.alloc_type) ||
      !location_in(&props->location, &tp.location))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  /* Win32 handle types and unknown bits: a bad value, as the driver
   * answers on Linux (bench/edge_answers.cu). */
  if (!tp__pl_handle_types_in((unsigned)props->handleTypes, &tp.handle_types))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp.max_size = props->maxSize;
  tp.usage = props->usage;
  tp_pool_t made = NULL;
  tp_error_t err = tp_pool_create(&made, &tp);
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(made);
    *pool = (cudaMemPool_t)made;
  }
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  POOL_CALL(cudaMemPoolDestroy, pool, (pool));
  return answer(tp_pool_destroy((tp_pool_t)pool), TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool,
                                                 enum cudaMemPoolAttr attr,
                                                 void *value) {
  POOL_CALL(cudaMemPoolGetAttribute, pool, (pool, attr, value));
  tp_pool_attr_t a;
  if (!tp__pl_attr_in((int)attr, &a))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  return answer(tp_pool_get_attribute((tp_pool_t)pool, a, value),
                TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool,
                                                 enum cudaMemPoolAttr attr,
                                                 void *value) {
  POOL_CALL(cudaMemPoolSetAttribute, pool, (pool, attr, value));
  tp_pool_attr_t a;
  if (!tp__pl_attr_in((int)attr, &a))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  return answer(tp_pool_set_attribute((tp_pool_t)pool, a, value),
                TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolSetAccess(
    cudaMemPool_t pool, const struct cudaMemAccessDesc *list, size_t count) {
  POOL_CALL(cudaMemPoolSetAccess, pool, (pool, list, count));
  if (!list && count)
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  /* A few descriptors on the stack; a longer list on the heap. A count too
   * large to copy is no list a program holds (the runtime documents only
   * cudaErrorInvalidValue here). */
  tp_access_desc_t small[8];
  tp_access_desc_t *descs = small;
  if (count > sizeof small / sizeof small[0]) {
    descs =
        count < SIZE_MAX / sizeof *descs ? malloc(count * sizeof *descs) : NULL;
    if (!descs)
      return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  }
  tp_error_t err = TP_SUCCESS;
  for (size_t i = 0; i < count && err == TP_SUCCESS; i++)
    if (!location_in(&list[i].location, &descs[i].location) ||
        !tp__pl_access_in((int)list[i].flags, &descs[i].flags))
      err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp_pool_set_access((tp_pool_t)pool, count ? descs : NULL, count);
  if (descs != small)
    free(descs);
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t
cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t pool,
                     struct cudaMemLocation *location) {
  POOL_CALL(cudaMemPoolGetAccess, pool, (flags, pool, location));
  tp_location_t loc;
  if (!flags || !location || !location_in(location, &loc))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp_access_flags_t got = TP_ACCESS_NONE;
  tp_error_t err = tp_pool_get_access(&got, (tp_pool_t)pool, &loc);
  if (err == TP_SUCCESS)
    *flags = (enum cudaMemAccessFlags)tp__pl_access_out(got);
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  POOL_CALL(cudaMemPoolTrimTo, pool, (pool, keep));
  return answer(tp_pool_trim_to((tp_pool_t)pool, keep), TP_PL_COUNT_POOL);
}

/* ---- sharing between processes --------------------------------------------
 * A POSIX descriptor is exported through a pointer to an int, and imported
 * by value, cast to a pointer, as the driver takes it. */

TP_PL_EXPORT cudaError_t cudaMemPoolExportToShareableHandle(
    void *handle, cudaMemPool_t pool, enum cudaMemAllocationHandleType type,
    unsigned int flags) {
  POOL_CALL(cudaMemPoolExportToShareableHandle, pool,
            (handle, pool, type, flags));
  return answer(
      tp_pool_export_to_shareable_handle(
          handle, (tp_pool_t)pool, tp__pl_handle_type_in((int)type), flags),
      TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolImportFromShareableHandle(
    cudaMemPool_t *pool, void *handle, enum cudaMemAllocationHandleType type,
    unsigned int flags) {
  if (!tp__pl_active())
    FORWARD(cudaMemPoolImportFromShareableHandle, (pool, handle, type, flags));
  ENTER();
  if (!pool)
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  if (tp__pl_import_foreign(handle, (int)type))
    FORWARD_COUNTED(cudaMemPoolImportFromShareableHandle,
                    (pool, handle, type, flags));
  /* Both take a posix descriptor by value. */
  tp_pool_t imported = NULL;
  tp_error_t err = tp_pool_import_from_shareable_handle(
      &imported, handle, tp__pl_handle_type_in((int)type), flags);
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(imported);
    *pool = (cudaMemPool_t)imported;
  }
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t
cudaMemPoolExportPointer(struct cudaMemPoolPtrExportData *data, void *ptr) {
  if (!tp__pl_active())
    FORWARD(cudaMemPoolExportPointer, (data, ptr));
  ENTER();
  tp_pool_ptr_export_data_t record;
  tp_error_t err =
      data ? tp_pool_export_pointer(&record, ptr) : TP_ERROR_INVALID_VALUE;
  /* A pointer of a pool tidepool did not make is the runtime's to export;
   * one inside a live allocation of tidepool's is refused here, as the
   * driver refuses one of a pool without a shareable handle type (the
   * driver, asked, knows nothing of the address). */
  if (err == TP_ERROR_INVALID_VALUE && data && ptr && !tp__pl_ptr_ours(ptr))
    FORWARD_COUNTED(cudaMemPoolExportPointer, (data, ptr));
  if (err == TP_SUCCESS)
    memcpy(data, &record, sizeof record);
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaMemPoolImportPointer(
    void **ptr, cudaMemPool_t pool, struct cudaMemPoolPtrExportData *data) {
  POOL_CALL(cudaMemPoolImportPointer, pool, (ptr, pool, data));
  if (!data)
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp_pool_ptr_export_data_t record;
  memcpy(&record, data, sizeof record);
  return answer(tp_pool_import_pointer(ptr, (tp_pool_t)pool, &record),
                TP_PL_COUNT_POOL);
}

/* ---- default and current pools --------------------------------------------
 */

/* Remembers the pool a getter gave out and answers. */
static cudaError_t give_pool(tp_error_t err, tp_pool_t got,
                             cudaMemPool_t *out) {
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(got);
    *out = (cudaMemPool_t)got;
  }
  return answer(err, TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool,
                                                     int device) {
  if (!tp__pl_active())
    FORWARD(cudaDeviceGetDefaultMemPool, (pool, device));
  ENTER();
  tp_pool_t got = NULL;
  tp_error_t err = pool ? tp_device_get_default_mem_pool(&got, device)
                        : TP_ERROR_INVALID_VALUE;
  return give_pool(err, got, pool);
}

TP_PL_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int device) {
  if (!tp__pl_active())
    FORWARD(cudaDeviceGetMemPool, (pool, device));
  ENTER();
  tp_pool_t got = NULL;
  tp_error_t err =
      pool ? tp_device_get_mem_pool(&got, device) : TP_ERROR_INVALID_VALUE;
  return give_pool(err, got, pool);
}

/* Only tidepool's pools can become current while tidepool answers: the
 * allocations of cudaMallocAsync come from tidepool's current pool, so a
 * pool of the driver's made current would never be used. */
TP_PL_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  if (!tp__pl_active())
    FORWARD(cudaDeviceSetMemPool, (device, pool));
  ENTER();
  if (!tp__pl_pool_known((tp_pool_t)pool))
    return answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  return answer(tp_device_set_mem_pool(device, (tp_pool_t)pool),
                TP_PL_COUNT_POOL);
}

TP_PL_EXPORT cudaError_t
cudaMemGetDefaultMemPool(cudaMemPool_t *pool, struct cudaMemLocation *location,
                         enum cudaMemAllocationType type) {
  if (!tp__pl_active())
    FORWARD(cudaMemGetDefaultMemPool, (pool, location, type));
  ENTER();
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_pool_t got = NULL;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  if (pool && location && location_in(location, &loc) &&
      alloc_type_in(type, &t))
    err = tp_mem_get_default_pool(&got, &loc, t);
  return give_pool(err, got, pool);
}

TP_PL_EXPORT cudaError_t cudaMemGetMemPool(cudaMemPool_t *pool,
                                           struct cudaMemLocation *location,
                                           enum cudaMemAllocationType type) {
  if (!tp__pl_active())
    FORWARD(cudaMemGetMemPool, (pool, location, type));
  ENTER();
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_pool_t got = NULL;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  if (pool && location && location_in(location, &loc) &&
      alloc_type_in(type, &t))
    err = tp_mem_get_pool(&got, &loc, t);
  return give_pool(err, got, pool);
}

TP_PL_EXPORT cudaError_t cudaMemSetMemPool(struct cudaMemLocation *location,
                                           enum cudaMemAllocationType type,
                                           cudaMemPool_t pool) {
  if (!tp__pl_active())
    FORWARD(cudaMemSetMemPool, (location, type, pool));
  ENTER();
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  if (location && location_in(location, &loc) && alloc_type_in(type, &t) &&
      tp__pl_pool_known((tp_pool_t)pool))
    err = tp_mem_set_pool(&loc, t, (tp_pool_t)pool);
  return answer(err, TP_PL_COUNT_POOL);
}
