/* The driver's stream-ordered allocator answered by tidepool, for programs
 * whose runtime reaches the driver through cuGetProcAddress (a runtime
 * linked statically) or that call the driver API: cuMemAllocAsync,
 * cuMemFreeAsync, cuMemAllocFromPoolAsync (and their _ptsz variants), the
 * cuMemPool* family, default and current pools, and cuMemFree of tidepool's
 * pointers; on streams being captured too, where tidepool's capture path
 * makes graph allocations. Calls on pools or pointers tidepool did not make
 * go to the driver, as in alloc.c. */
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* The driver's own function of each wrapper. */
static _Atomic(tp__pl_fn) r_alloc, r_alloc_ptsz, r_free, r_free_ptsz,
    r_from_pool, r_from_pool_ptsz, r_mem_free, r_pool_create, r_pool_destroy,
    r_pool_get_attr, r_pool_set_attr, r_pool_set_access, r_pool_get_access,
    r_pool_trim, r_pool_export, r_pool_import, r_ptr_export, r_ptr_import,
    r_dev_default_pool, r_dev_get_pool, r_dev_set_pool, r_mem_default_pool,
    r_mem_get_pool, r_mem_set_pool, r_ptr_attr, r_ptr_attrs, r_addr_range;

typedef PFN_cuMemAllocAsync_v11020 alloc_fn;
typedef PFN_cuMemFreeAsync_v11020 free_fn;
typedef PFN_cuMemAllocFromPoolAsync_v11020 from_pool_fn;

/* Calls the driver's function with `args`. */
#define PASS(slot, type, args) return TP_PL_DRV_CALL(slot, type, args)

/* A call tidepool does not answer while on, counted as such. */
#define FORWARD(slot, type, args)                                              \
  do {                                                                         \
    tp__pl_drv_count(TP_PL_COUNT_FORWARDED);                                   \
    PASS(slot, type, args);                                                    \
  } while (0)

/* A call on an object that may be tidepool's (a pool, a pointer) goes to
 * tidepool in any context where it is (`ours`): where tp__pl_drv_enter
 * sends it to the driver for the context (OTHER), tidepool answers in a
 * primary context (tp__pl_drv_own), borrowed until leave_on. A pointer is
 * only maybe tidepool's (tidepool tells by answering): where no primary
 * context can be borrowed, it goes to the driver rather than fail. */
typedef struct borrowed {
  bool on;
  CUcontext saved;
} borrowed;

static int enter_on(bool decide, bool ours, bool maybe, bool has_stream,
                    CUstream stream, borrowed *b, CUresult *err) {
  b->on = false;
  int where = tp__pl_drv_enter(decide, err);
  if (where != TP_PL_DRV_OTHER || !ours)
    return where;
  where = tp__pl_drv_own(has_stream, stream, &b->saved, err);
  b->on = where == TP_PL_DRV_OURS;
  return where == TP_PL_DRV_FAILED && maybe ? TP_PL_DRV_OTHER : where;
}

static void leave_on(const borrowed *b) {
  if (b->on)
    tp__pl_drv_ctx_restore(b->saved);
}

/* Goes on only where tidepool answers (enter_on, with *b to leave_on
 * after); else passes the call to the driver, or returns the failure. */
#define ENTER_ON(b, decide, ours, maybe, has_stream, stream, slot, type, args) \
  do {                                                                         \
    CUresult enter_err_ = CUDA_SUCCESS;                                        \
    switch (                                                                   \
        enter_on(decide, ours, maybe, has_stream, stream, b, &enter_err_)) {   \
    case TP_PL_DRV_PASS: PASS(slot, type, args);                               \
    case TP_PL_DRV_OTHER: FORWARD(slot, type, args);                           \
    case TP_PL_DRV_FAILED: tp__pl_count(TP_PL_COUNT_FAILED);                   \
        return enter_err_;                                                     \
    default: break;                                                            \
    }                                                                          \
  } while (0)

/* ENTER_ON for a call that names no object tidepool may own (an
 * allocation, a pool made or looked up): tp__pl_drv_enter alone decides. */
#define ENTER(decide, slot, type, args)                                        \
  do {                                                                         \
    borrowed none_;                                                            \
    ENTER_ON(&none_, decide, false, false, false, NULL, slot, type, args);     \
  } while (0)

/* ENTER for a call on `pool` (and `stream` where `has_stream`): the
 * driver's pools go to the driver, tidepool's are answered by `answer` (a
 * CUresult expression). */
#define POOL_CALL_ON(slot, type, pool, has_stream, stream, args, answer)       \
  do {                                                                         \
    borrowed b_;                                                               \
    bool ours_ = tp__pl_pool_known((tp_pool_t)(pool));                         \
    ENTER_ON(&b_, true, ours_, false, has_stream, stream, slot, type, args);   \
    if (!ours_)                                                                \
      FORWARD(slot, type, args);                                               \
    CUresult r_ = (answer);                                                    \
    leave_on(&b_);                                                             \
    return r_;                                                                 \
  } while (0)
#define POOL_CALL(slot, type, pool, args, answer)                              \
  POOL_CALL_ON(slot, type, pool, false, NULL, args, answer)

static void *ptr_of(CUdeviceptr p) {
  return (void *)(uintptr_t)p;
}

/* ---- allocation ---------------------------------------------------------- */

static CUresult alloc_async(_Atomic(tp__pl_fn) *slot, CUdeviceptr *dptr,
                            size_t size, CUstream stream, bool per_thread) {
  ENTER(true, *slot, alloc_fn, (dptr, size, stream));
  void *p = NULL;
  tp_error_t err =
      dptr ? tp_malloc_async(&p, size, tp__pl_stream(stream, per_thread))
           : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    *dptr = (CUdeviceptr)(uintptr_t)p;
  return tp__pl_drv_answer(err, TP_PL_COUNT_MALLOC);
}

static CUresult mem_alloc_async(CUdeviceptr *dptr, size_t size,
                                CUstream stream) {
  return alloc_async(&r_alloc, dptr, size, stream, false);
}

static CUresult mem_alloc_async_ptsz(CUdeviceptr *dptr, size_t size,
                                     CUstream stream) {
  return alloc_async(&r_alloc_ptsz, dptr, size, stream, true);
}

static CUresult alloc_from(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                           CUstream stream, bool per_thread) {
  void *p = NULL;
  tp_error_t err =
      dptr ? tp_malloc_from_pool_async(&p, size, (tp_pool_t)pool,
                                       tp__pl_stream(stream, per_thread))
           : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    *dptr = (CUdeviceptr)(uintptr_t)p;
  return tp__pl_drv_answer(err, TP_PL_COUNT_MALLOC);
}

static CUresult from_pool(_Atomic(tp__pl_fn) *slot, CUdeviceptr *dptr,
                          size_t size, CUmemoryPool pool, CUstream stream,
                          bool per_thread) {
  POOL_CALL_ON(*slot, from_pool_fn, pool, true, stream,
               (dptr, size, pool, stream),
               alloc_from(dptr, size, pool, stream, per_thread));
}

static CUresult mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t size,
                                          CUmemoryPool pool, CUstream stream) {
  return from_pool(&r_from_pool, dptr, size, pool, stream, false);
}

static CUresult mem_alloc_from_pool_async_ptsz(CUdeviceptr *dptr, size_t size,
                                               CUmemoryPool pool,
                                               CUstream stream) {
  return from_pool(&r_from_pool_ptsz, dptr, size, pool, stream, true);
}

/* A free tidepool refuses as not its own goes to the driver, which gives
 * its answer; tidepool's refusal changed nothing. 0 goes there too. A free
 * needs no decision: before one, tidepool gave nothing out. */
static CUresult free_async(_Atomic(tp__pl_fn) *slot, CUdeviceptr ptr,
                           CUstream stream, bool per_thread) {
  if (!ptr)
    PASS(*slot, free_fn, (ptr, stream));
  borrowed b;
  ENTER_ON(&b, false, true, true, true, stream, *slot, free_fn, (ptr, stream));
  tp_error_t err =
      tp_free_async(ptr_of(ptr), tp__pl_stream(stream, per_thread));
  leave_on(&b);
  if (err == TP_ERROR_INVALID_VALUE)
    FORWARD(*slot, free_fn, (ptr, stream));
  return tp__pl_drv_answer(err, TP_PL_COUNT_FREE);
}

static CUresult mem_free_async(CUdeviceptr ptr, CUstream stream) {
  return free_async(&r_free, ptr, stream, false);
}

static CUresult mem_free_async_ptsz(CUdeviceptr ptr, CUstream stream) {
  return free_async(&r_free_ptsz, ptr, stream, true);
}

/* cuMemFree accepts stream-ordered allocations too: the free is queued on
 * the legacy stream and waited for, as cudaFree in alloc.c. Memory that is
 * not tidepool's is the driver's, unremarked: cuMemFree is mostly called on
 * cuMemAlloc's memory. */
static CUresult mem_free(CUdeviceptr ptr) {
  if (!ptr)
    PASS(r_mem_free, PFN_cuMemFree_v3020, (ptr));
  borrowed b;
  CUresult enter_err = CUDA_SUCCESS;
  int where = enter_on(false, true, true, false, NULL, &b, &enter_err);
  if (where == TP_PL_DRV_FAILED)
    return enter_err;
  if (where != TP_PL_DRV_OURS)
    PASS(r_mem_free, PFN_cuMemFree_v3020, (ptr));
  tp_error_t err = tp_free_async(ptr_of(ptr), NULL);
  if (err == TP_SUCCESS)
    err = tp_stream_synchronize(NULL);
  leave_on(&b);
  if (err == TP_ERROR_INVALID_VALUE)
    PASS(r_mem_free, PFN_cuMemFree_v3020, (ptr));
  return tp__pl_drv_answer(err, TP_PL_COUNT_FREE);
}

/* ---- pools ----------------------------------------------------------------
 * Calls that take a pool go to the driver when the pool is not tidepool's
 * (POOL_CALL). */

static CUresult pool_create(CUmemoryPool *pool, const CUmemPoolProps *props) {
  ENTER(true, r_pool_create, PFN_cuMemPoolCreate_v11020, (pool, props));
  if (!pool || !props)
    return tp__pl_drv_answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp_pool_props_t tp = {0};
  if (!tp__pl_alloc_type_in((int)props->allocType, &tp.alloc_type) ||
      !tp__pl_location_in((int)props->location.type, props->location.id,
                          &tp.location))
    return tp__pl_drv_answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  /* Win32 handle types and unknown bits: a bad value, as the driver
   * answers on Linux (bench/edge_answers.cu). */
  if (!tp__pl_handle_types_in((unsigned)props->handleTypes, &tp.handle_types))
    return tp__pl_drv_answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  tp.max_size = props->maxSize;
  tp.usage = props->usage;
  tp_pool_t made = NULL;
  tp_error_t err = tp_pool_create(&made, &tp);
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(made);
    *pool = (CUmemoryPool)made;
  }
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static CUresult pool_answer(tp_error_t err) {
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static CUresult pool_destroy(CUmemoryPool pool) {
  POOL_CALL(r_pool_destroy, PFN_cuMemPoolDestroy_v11020, pool, (pool),
            pool_answer(tp_pool_destroy((tp_pool_t)pool)));
}

static tp_error_t get_attribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                void *value) {
  tp_pool_attr_t a;
  if (!tp__pl_attr_in((int)attr, &a))
    return TP_ERROR_INVALID_VALUE;
  return tp_pool_get_attribute((tp_pool_t)pool, a, value);
}

static CUresult pool_get_attribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                   void *value) {
  POOL_CALL(r_pool_get_attr, PFN_cuMemPoolGetAttribute_v11020, pool,
            (pool, attr, value), pool_answer(get_attribute(pool, attr, value)));
}

static tp_error_t set_attribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                void *value) {
  tp_pool_attr_t a;
  if (!tp__pl_attr_in((int)attr, &a))
    return TP_ERROR_INVALID_VALUE;
  return tp_pool_set_attribute((tp_pool_t)pool, a, value);
}

static CUresult pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                   void *value) {
  POOL_CALL(r_pool_set_attr, PFN_cuMemPoolSetAttribute_v11020, pool,
            (pool, attr, value), pool_answer(set_attribute(pool, attr, value)));
}

static tp_error_t set_access(CUmemoryPool pool, const CUmemAccessDesc *map,
                             size_t count) {
  if (!map && count)
    return TP_ERROR_INVALID_VALUE;
  /* A few descriptors on the stack; a longer list on the heap. A count too
   * large to copy is no list a program holds: INVALID_VALUE, as in
   * cudaMemPoolSetAccess. */
  tp_access_desc_t small[8];
  tp_access_desc_t *descs = small;
  if (count > sizeof small / sizeof small[0]) {
    descs =
        count < SIZE_MAX / sizeof *descs ? malloc(count * sizeof *descs) : NULL;
    if (!descs)
      return TP_ERROR_INVALID_VALUE;
  }
  tp_error_t err = TP_SUCCESS;
  for (size_t i = 0; i < count && err == TP_SUCCESS; i++)
    if (!tp__pl_location_in((int)map[i].location.type, map[i].location.id,
                            &descs[i].location) ||
        !tp__pl_access_in((int)map[i].flags, &descs[i].flags))
      err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp_pool_set_access((tp_pool_t)pool, count ? descs : NULL, count);
  if (descs != small)
    free(descs);
  return err;
}

static CUresult pool_set_access(CUmemoryPool pool, const CUmemAccessDesc *map,
                                size_t count) {
  POOL_CALL(r_pool_set_access, PFN_cuMemPoolSetAccess_v11020, pool,
            (pool, map, count), pool_answer(set_access(pool, map, count)));
}

static tp_error_t get_access(CUmemAccess_flags *flags, CUmemoryPool pool,
                             CUmemLocation *location) {
  tp_location_t loc;
  if (!flags || !location ||
      !tp__pl_location_in((int)location->type, location->id, &loc))
    return TP_ERROR_INVALID_VALUE;
  tp_access_flags_t got = TP_ACCESS_NONE;
  tp_error_t err = tp_pool_get_access(&got, (tp_pool_t)pool, &loc);
  if (err == TP_SUCCESS)
    *flags = (CUmemAccess_flags)tp__pl_access_out(got);
  return err;
}

static CUresult pool_get_access(CUmemAccess_flags *flags, CUmemoryPool pool,
                                CUmemLocation *location) {
  POOL_CALL(r_pool_get_access, PFN_cuMemPoolGetAccess_v11020, pool,
            (flags, pool, location),
            pool_answer(get_access(flags, pool, location)));
}

static CUresult pool_trim_to(CUmemoryPool pool, size_t keep) {
  POOL_CALL(r_pool_trim, PFN_cuMemPoolTrimTo_v11020, pool, (pool, keep),
            pool_answer(tp_pool_trim_to((tp_pool_t)pool, keep)));
}

/* ---- sharing between processes --------------------------------------------
 * A POSIX descriptor is exported through a pointer to an int and imported
 * by value, cast to a pointer, as in alloc.c. */

static tp_error_t export_pool(void *handle, CUmemoryPool pool,
                              CUmemAllocationHandleType type,
                              unsigned long long flags) {
  if (flags > UINT32_MAX)
    return TP_ERROR_INVALID_VALUE;
  return tp_pool_export_to_shareable_handle(handle, (tp_pool_t)pool,
                                            tp__pl_handle_type_in((int)type),
                                            (unsigned)flags);
}

static CUresult pool_export(void *handle, CUmemoryPool pool,
                            CUmemAllocationHandleType type,
                            unsigned long long flags) {
  POOL_CALL(r_pool_export, PFN_cuMemPoolExportToShareableHandle_v11020, pool,
            (handle, pool, type, flags),
            pool_answer(export_pool(handle, pool, type, flags)));
}

static CUresult pool_import(CUmemoryPool *pool, void *handle,
                            CUmemAllocationHandleType type,
                            unsigned long long flags) {
  ENTER(true, r_pool_import, PFN_cuMemPoolImportFromShareableHandle_v11020,
        (pool, handle, type, flags));
  if (!pool || flags > UINT32_MAX)
    return tp__pl_drv_answer(TP_ERROR_INVALID_VALUE, TP_PL_COUNT_POOL);
  if (tp__pl_import_foreign(handle, (int)type))
    FORWARD(r_pool_import, PFN_cuMemPoolImportFromShareableHandle_v11020,
            (pool, handle, type, flags));
  /* Both take a posix descriptor by value. */
  tp_pool_t imported = NULL;
  tp_error_t err = tp_pool_import_from_shareable_handle(
      &imported, handle, tp__pl_handle_type_in((int)type), (unsigned)flags);
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(imported);
    *pool = (CUmemoryPool)imported;
  }
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static CUresult ptr_export(CUmemPoolPtrExportData *data, CUdeviceptr ptr) {
  borrowed b;
  ENTER_ON(&b, true, true, true, false, NULL, r_ptr_export,
           PFN_cuMemPoolExportPointer_v11020, (data, ptr));
  tp_pool_ptr_export_data_t record;
  tp_error_t err = data ? tp_pool_export_pointer(&record, ptr_of(ptr))
                        : TP_ERROR_INVALID_VALUE;
  leave_on(&b);
  /* A pointer of a pool tidepool did not make is the driver's to export
   * (see alloc.c's cudaMemPoolExportPointer). */
  if (err == TP_ERROR_INVALID_VALUE && data && ptr &&
      !tp__pl_ptr_ours(ptr_of(ptr)))
    FORWARD(r_ptr_export, PFN_cuMemPoolExportPointer_v11020, (data, ptr));
  if (err == TP_SUCCESS)
    memcpy(data, &record, sizeof record);
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static tp_error_t import_pointer(CUdeviceptr *ptr, CUmemoryPool pool,
                                 CUmemPoolPtrExportData *data) {
  if (!data || !ptr)
    return TP_ERROR_INVALID_VALUE;
  tp_pool_ptr_export_data_t record;
  memcpy(&record, data, sizeof record);
  void *p = NULL;
  tp_error_t err = tp_pool_import_pointer(&p, (tp_pool_t)pool, &record);
  if (err == TP_SUCCESS)
    *ptr = (CUdeviceptr)(uintptr_t)p;
  return err;
}

static CUresult ptr_import(CUdeviceptr *ptr, CUmemoryPool pool,
                           CUmemPoolPtrExportData *data) {
  POOL_CALL(r_ptr_import, PFN_cuMemPoolImportPointer_v11020, pool,
            (ptr, pool, data), pool_answer(import_pointer(ptr, pool, data)));
}

/* ---- default and current pools --------------------------------------------
 */

/* Remembers the pool a getter gave out and answers. */
static CUresult give_pool(tp_error_t err, tp_pool_t got, CUmemoryPool *out) {
  if (err == TP_SUCCESS) {
    tp__pl_pool_remember(got);
    *out = (CUmemoryPool)got;
  }
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static CUresult dev_default_pool(CUmemoryPool *pool, CUdevice dev) {
  ENTER(true, r_dev_default_pool, PFN_cuDeviceGetDefaultMemPool_v11020,
        (pool, dev));
  int ordinal = tp__pl_drv_ordinal(dev);
  tp_pool_t got = NULL;
  tp_error_t err = !pool ? TP_ERROR_INVALID_VALUE
                   : ordinal < 0
                       ? TP_ERROR_INVALID_DEVICE
                       : tp_device_get_default_mem_pool(&got, ordinal);
  return give_pool(err, got, pool);
}

/* A device that does not exist: INVALID_VALUE for the get and set forms,
 * INVALID_DEVICE for the default pool's, as the runtime answers on an H200
 * (bench/edge_answers.cu), which passes the driver's answer on. */
static CUresult dev_get_pool(CUmemoryPool *pool, CUdevice dev) {
  ENTER(true, r_dev_get_pool, PFN_cuDeviceGetMemPool_v11020, (pool, dev));
  int ordinal = tp__pl_drv_ordinal(dev);
  tp_pool_t got = NULL;
  tp_error_t err = !pool || ordinal < 0 ? TP_ERROR_INVALID_VALUE
                                        : tp_device_get_mem_pool(&got, ordinal);
  return give_pool(err, got, pool);
}

/* Only tidepool's pools can become current while tidepool answers, as in
 * alloc.c: allocations come from tidepool's current pool. */
static CUresult dev_set_pool(CUdevice dev, CUmemoryPool pool) {
  ENTER(true, r_dev_set_pool, PFN_cuDeviceSetMemPool_v11020, (dev, pool));
  int ordinal = tp__pl_drv_ordinal(dev);
  tp_error_t err = !tp__pl_pool_known((tp_pool_t)pool) || ordinal < 0
                       ? TP_ERROR_INVALID_VALUE
                       : tp_device_set_mem_pool(ordinal, (tp_pool_t)pool);
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

static tp_error_t location_and_type(const CUmemLocation *location,
                                    CUmemAllocationType type,
                                    tp_location_t *loc,
                                    tp_allocation_type_t *t) {
  if (!location ||
      !tp__pl_location_in((int)location->type, location->id, loc) ||
      !tp__pl_alloc_type_in((int)type, t))
    return TP_ERROR_INVALID_VALUE;
  return TP_SUCCESS;
}

static CUresult mem_default_pool(CUmemoryPool *pool, CUmemLocation *location,
                                 CUmemAllocationType type) {
  ENTER(true, r_mem_default_pool, PFN_cuMemGetDefaultMemPool_v13000,
        (pool, location, type));
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_pool_t got = NULL;
  tp_error_t err = pool ? location_and_type(location, type, &loc, &t)
                        : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp_mem_get_default_pool(&got, &loc, t);
  return give_pool(err, got, pool);
}

static CUresult mem_get_pool(CUmemoryPool *pool, CUmemLocation *location,
                             CUmemAllocationType type) {
  ENTER(true, r_mem_get_pool, PFN_cuMemGetMemPool_v13000,
        (pool, location, type));
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_pool_t got = NULL;
  tp_error_t err = pool ? location_and_type(location, type, &loc, &t)
                        : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp_mem_get_pool(&got, &loc, t);
  return give_pool(err, got, pool);
}

static CUresult mem_set_pool(CUmemLocation *location, CUmemAllocationType type,
                             CUmemoryPool pool) {
  ENTER(true, r_mem_set_pool, PFN_cuMemSetMemPool_v13000,
        (location, type, pool));
  tp_location_t loc;
  tp_allocation_type_t t;
  tp_error_t err = location_and_type(location, type, &loc, &t);
  if (err == TP_SUCCESS && !tp__pl_pool_known((tp_pool_t)pool))
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp_mem_set_pool(&loc, t, (tp_pool_t)pool);
  return tp__pl_drv_answer(err, TP_PL_COUNT_POOL);
}

/* ---- what a pointer is ------------------------------------------------------
 * The driver tells of tidepool's memory what it knows: the range reserved
 * for a whole pool, the chunk mapped there, no pool. Where the pointer is
 * in one of tidepool's allocations, tidepool answers for the allocation, as
 * the driver does for its own pools'; the driver answers everything else.
 * tidepool's lookup is made with the caller's context kept (a thread's
 * first call into tidepool makes a context current). */

static bool pointer_attr_in(CUpointer_attribute attr, tp_pointer_attr_t *out) {
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    *out = TP_POINTER_ATTR_RANGE_START_ADDR;
    return true;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    *out = TP_POINTER_ATTR_RANGE_SIZE;
    return true;
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    *out = TP_POINTER_ATTR_MEMPOOL_HANDLE;
    return true;
  default: return false;
  }
}

/* tidepool's answer for `attr` of `ptr` in *data; false, *data untouched,
 * where the driver answers. The three values are as wide as the driver's
 * (a CUdeviceptr, a size_t, a CUmemoryPool, which is tidepool's handle). */
static bool pointer_attr_ours(void *data, CUpointer_attribute attr,
                              CUdeviceptr ptr) {
  tp_pointer_attr_t a;
  if (!data || !ptr || !pointer_attr_in(attr, &a) || !tp__pl_on())
    return false;
  CUcontext saved = tp__pl_drv_ctx_save();
  bool ours = tp_pointer_get_attribute(data, a, ptr_of(ptr)) == TP_SUCCESS;
  tp__pl_drv_ctx_restore(saved);
  return ours;
}

static CUresult ptr_get_attribute(void *data, CUpointer_attribute attr,
                                  CUdeviceptr ptr) {
  if (pointer_attr_ours(data, attr, ptr))
    return CUDA_SUCCESS;
  PASS(r_ptr_attr, PFN_cuPointerGetAttribute_v4000, (data, attr, ptr));
}

/* The driver answers every attribute first (its errors stand), then
 * tidepool's replace the three it knows better. */
static CUresult ptr_get_attributes(unsigned n, CUpointer_attribute *attrs,
                                   void **data, CUdeviceptr ptr) {
  CUresult r = TP_PL_DRV_CALL(r_ptr_attrs, PFN_cuPointerGetAttributes_v7000,
                              (n, attrs, data, ptr));
  tp_pointer_attr_t a;
  for (unsigned i = 0; r == CUDA_SUCCESS && attrs && data && i < n; i++)
    if (pointer_attr_in(attrs[i], &a) &&
        !pointer_attr_ours(data[i], attrs[i], ptr))
      break; /* not tidepool's: the driver's answers stand */
  return r;
}

static CUresult mem_get_address_range(CUdeviceptr *base, size_t *size,
                                      CUdeviceptr ptr) {
  CUdeviceptr b = 0;
  size_t n = 0;
  bool ours = false;
  if (ptr && tp__pl_on()) {
    CUcontext saved = tp__pl_drv_ctx_save();
    ours = tp_pointer_get_attribute(&b, TP_POINTER_ATTR_RANGE_START_ADDR,
                                    ptr_of(ptr)) == TP_SUCCESS &&
           tp_pointer_get_attribute(&n, TP_POINTER_ATTR_RANGE_SIZE,
                                    ptr_of(ptr)) == TP_SUCCESS;
    tp__pl_drv_ctx_restore(saved);
  }
  if (ours) {
    if (base)
      *base = b;
    if (size)
      *size = n;
    return CUDA_SUCCESS;
  }
  PASS(r_addr_range, PFN_cuMemGetAddressRange_v3020, (base, size, ptr));
}

/* ---- the entries -------------------------------------------------------- */

/* A wrapper's address as the generic function type of the table. */
#define FN(f) ((tp__pl_fn)(f))

const tp__pl_drv_entry tp__pl_drv_alloc_entries[] = {
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, false, false,
     FN(mem_alloc_async), &r_alloc},
    {"cuMemAllocAsync", "cuMemAllocAsync_ptsz", 11020, true, false,
     FN(mem_alloc_async_ptsz), &r_alloc_ptsz},
    {"cuMemFreeAsync", "cuMemFreeAsync", 11020, false, false,
     FN(mem_free_async), &r_free},
    {"cuMemFreeAsync", "cuMemFreeAsync_ptsz", 11020, true, false,
     FN(mem_free_async_ptsz), &r_free_ptsz},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, false, false,
     FN(mem_alloc_from_pool_async), &r_from_pool},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", 11020, true,
     false, FN(mem_alloc_from_pool_async_ptsz), &r_from_pool_ptsz},
    {"cuMemFree", "cuMemFree_v2", 3020, false, false, FN(mem_free),
     &r_mem_free},
    {"cuMemPoolCreate", "cuMemPoolCreate", 11020, false, false, FN(pool_create),
     &r_pool_create},
    {"cuMemPoolDestroy", "cuMemPoolDestroy", 11020, false, false,
     FN(pool_destroy), &r_pool_destroy},
    {"cuMemPoolGetAttribute", "cuMemPoolGetAttribute", 11020, false, false,
     FN(pool_get_attribute), &r_pool_get_attr},
    {"cuMemPoolSetAttribute", "cuMemPoolSetAttribute", 11020, false, false,
     FN(pool_set_attribute), &r_pool_set_attr},
    {"cuMemPoolSetAccess", "cuMemPoolSetAccess", 11020, false, false,
     FN(pool_set_access), &r_pool_set_access},
    {"cuMemPoolGetAccess", "cuMemPoolGetAccess", 11020, false, false,
     FN(pool_get_access), &r_pool_get_access},
    {"cuMemPoolTrimTo", "cuMemPoolTrimTo", 11020, false, false,
     FN(pool_trim_to), &r_pool_trim},
    {"cuMemPoolExportToShareableHandle", "cuMemPoolExportToShareableHandle",
     11020, false, false, FN(pool_export), &r_pool_export},
    {"cuMemPoolImportFromShareableHandle", "cuMemPoolImportFromShareableHandle",
     11020, false, false, FN(pool_import), &r_pool_import},
    {"cuMemPoolExportPointer", "cuMemPoolExportPointer", 11020, false, false,
     FN(ptr_export), &r_ptr_export},
    {"cuMemPoolImportPointer", "cuMemPoolImportPointer", 11020, false, false,
     FN(ptr_import), &r_ptr_import},
    {"cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", 11020, false,
     false, FN(dev_default_pool), &r_dev_default_pool},
    {"cuDeviceGetMemPool", "cuDeviceGetMemPool", 11020, false, false,
     FN(dev_get_pool), &r_dev_get_pool},
    {"cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020, false, false,
     FN(dev_set_pool), &r_dev_set_pool},
    {"cuMemGetDefaultMemPool", "cuMemGetDefaultMemPool", 13000, false, false,
     FN(mem_default_pool), &r_mem_default_pool},
    {"cuMemGetMemPool", "cuMemGetMemPool", 13000, false, false,
     FN(mem_get_pool), &r_mem_get_pool},
    {"cuMemSetMemPool", "cuMemSetMemPool", 13000, false, false,
     FN(mem_set_pool), &r_mem_set_pool},
    {"cuPointerGetAttribute", "cuPointerGetAttribute", 4000, false, false,
     FN(ptr_get_attribute), &r_ptr_attr},
    {"cuPointerGetAttributes", "cuPointerGetAttributes", 7000, false, false,
     FN(ptr_get_attributes), &r_ptr_attrs},
    {"cuMemGetAddressRange", "cuMemGetAddressRange_v2", 3020, false, false,
     FN(mem_get_address_range), &r_addr_range},
};
const size_t tp__pl_drv_alloc_count =
    sizeof tp__pl_drv_alloc_entries / sizeof tp__pl_drv_alloc_entries[0];
