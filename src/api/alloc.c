/* The allocator's entry points, tp_malloc_async, tp_malloc_from_pool_async
 * and tp_free_async: the fast path first (a stream resolved, a pool's cache),
 * a capture's allocation where the stream captures (capture.h); and
 * tp_pointer_get_attribute, what a pointer is. */
#include "pool/alloc.h"
#include "api/api.h"
#include "api/capture.h"
#include "api/pools.h"
#include "common/guard.h"
#include "ipc/ipc.h"

/* ---- the quick entries -----------------------------------------------------
 * The common case, a thread that used the stream a moment ago and the
 * stream's cache at hand, is written as one straight run whose every other
 * way out hands the call, arguments unchanged, to the whole path below (a
 * jump, not a call). With no call on the way that it must come back from,
 * the compiler keeps the run's values in registers rather than saving them
 * across calls: a pair took 429 instructions with the whole path inlined,
 * and about 356 this way (bench/RESULTS.md). */

static tp_error_t malloc_entered(void **ptr, size_t size, tp_stream_t stream,
                                 bool uncaptured);
static tp_error_t malloc_in_pool(void **ptr, size_t size, tp_stream_t stream,
                                 bool uncaptured, tp__stream *s, tp__pool *p);
static tp_error_t malloc_whole(void **ptr, size_t size, tp_stream_t stream,
                               bool uncaptured);
static tp_error_t free_entered(void *ptr, tp_stream_t stream, bool uncaptured);
static tp_error_t free_whole(void *ptr, tp_stream_t stream, bool uncaptured);

/* An allocation from the current pool of the stream's device, where nothing
 * captures: a small one from the stream's cache right here, any other from
 * the pool once the stream and the pool are found. Inline, so that the
 * public entry point gets a copy for its constant `uncaptured`. */
static TP_ALWAYS_INLINE tp_error_t malloc_quick(void **ptr, size_t size,
                                                tp_stream_t stream,
                                                bool uncaptured) {
  if (TP_UNLIKELY(!tp__api_quick || !ptr || !tp__guard_try_enter()))
    return malloc_whole(ptr, size, stream, uncaptured);
  tp__stream *s = tp__stream_quick(stream);
  tp_pool_t pool;
  tp__pool *p;
  if (TP_UNLIKELY(size == 0 || s == NULL || !(uncaptured || tp__no_capture()) ||
                  (pool = tp__current_pool_made(s->device * 2)) == NULL ||
                  tp__pool_get_known(pool, &p) != TP_SUCCESS))
    return malloc_entered(ptr, size, stream, uncaptured);
  if (TP_LIKELY(tp__pool_malloc_quick(p, ptr, size, s))) {
    tp__guard_exit_quick();
    return TP_SUCCESS;
  }
  /* The stream and the pool are known: a stream shared by threads (the
   * lock out of bias), a large size or an empty class go on from them. */
  return malloc_in_pool(ptr, size, stream, uncaptured, s, p);
}

/* A free of a pool's pointer that no other process shares, where nothing
 * captures. */
static TP_ALWAYS_INLINE tp_error_t free_quick(void *ptr, tp_stream_t stream,
                                              bool uncaptured) {
  if (TP_UNLIKELY(!tp__api_quick || !ptr || !tp__guard_try_enter()))
    return free_whole(ptr, stream, uncaptured);
  tp__stream *s = tp__stream_quick(stream);
  tp__pool *p;
  tp__claim c;
  if (TP_UNLIKELY(s == NULL || !(uncaptured || tp__no_capture()) ||
                  (p = tp__registry_find((uintptr_t)ptr)) == NULL ||
                  !tp__pool_claim_local(p, ptr, &c)))
    return free_entered(ptr, stream, uncaptured);
  tp__pool_free_put(p, s, &c);
  tp__guard_exit_quick();
  return TP_SUCCESS;
}

tp_error_t tp__malloc_async_as(void **ptr, size_t size, tp_stream_t stream,
                               bool uncaptured) {
  return malloc_quick(ptr, size, stream, uncaptured);
}

tp_error_t tp__free_async_as(void *ptr, tp_stream_t stream, bool uncaptured) {
  return free_quick(ptr, stream, uncaptured);
}

TP_API tp_error_t tp_malloc_async(void **ptr, size_t size, tp_stream_t stream) {
  return malloc_quick(ptr, size, stream, false);
}

TP_API tp_error_t tp_free_async(void *ptr, tp_stream_t stream) {
  return free_quick(ptr, stream, false);
}

/* ---- the whole path ------------------------------------------------------ */

/* An allocation on `s` from `pool`: a graph's when the stream is being
 * captured, else the pool's. `idle`: resolving the stream just showed that
 * it does not capture. */
static TP_ALWAYS_INLINE tp_error_t malloc_on(void **ptr, size_t size,
                                             tp_pool_t pool, tp__pool *p,
                                             tp__stream *s, bool idle) {
  if (TP_LIKELY(idle || !tp__graph_capturing(s)))
    return tp__pool_malloc(p, ptr, size, s);
  return tp__graph_malloc(ptr, size, pool, s);
}

/* The current pool of the stream's device. A pool destroyed by another
 * thread stops being current before it stops answering, and the core
 * answers INVALID_VALUE for a pool destroyed while the call was on its way
 * in: then the call looks again (while the pool it found answers, the
 * error stands). Should a destroyed pool still be found there (made current
 * while it was being destroyed), the slot goes back to the default pool,
 * which cannot be destroyed. */
static TP_ALWAYS_INLINE tp_error_t malloc_current(void **ptr, size_t size,
                                                  tp__stream *s, bool idle) {
  for (int tries = 0;; tries++) {
    tp_pool_t pool;
    tp__pool *p;
    TP_FORWARD(tp__current_pool_of(s->device * 2, &pool));
    tp_error_t err = tp__pool_get_known(pool, &p);
    if (err == TP_SUCCESS)
      err = malloc_on(ptr, size, pool, p, s, idle);
    if (err != TP_ERROR_INVALID_VALUE ||
        tp__pool_get_known(pool, &p) == TP_SUCCESS)
      return err;
    if (tries > 0)
      tp__current_pools_forget(pool);
  }
}

/* The stream is resolved inside the guard, which keeps a stream destroyed
 * meanwhile readable until the call leaves (see tp_stream_destroy).
 * `uncaptured`: the caller knows that nothing captures (see api.h). */
static TP_ALWAYS_INLINE tp_error_t malloc_async(void **ptr, size_t size,
                                                tp_stream_t stream,
                                                bool uncaptured) {
  tp__stream *s;
  bool idle;
  TP_FORWARD(tp__stream_resolve(stream, uncaptured, &s, &idle));
  if (size == 0) {
    *ptr = NULL;
    return TP_SUCCESS;
  }
  return malloc_current(ptr, size, s, idle || uncaptured);
}

/* Inside the guard, entered by the quick entry. */
static TP_NOINLINE tp_error_t malloc_entered(void **ptr, size_t size,
                                             tp_stream_t stream,
                                             bool uncaptured) {
  tp_error_t err = malloc_async(ptr, size, stream, uncaptured);
  tp__guard_exit();
  return err;
}

/* The pool's own path where the quick entry found the stream and the
 * current pool. A pool destroyed meanwhile answers INVALID_VALUE, and the
 * whole path then looks again (see malloc_current). */
static TP_NOINLINE tp_error_t malloc_in_pool(void **ptr, size_t size,
                                             tp_stream_t stream,
                                             bool uncaptured, tp__stream *s,
                                             tp__pool *p) {
  tp_error_t err = tp__pool_malloc_rest(p, ptr, size, s);
  if (TP_UNLIKELY(err == TP_ERROR_INVALID_VALUE))
    err = malloc_async(ptr, size, stream, uncaptured);
  tp__guard_exit();
  return err;
}

static TP_NOINLINE tp_error_t malloc_whole(void **ptr, size_t size,
                                           tp_stream_t stream,
                                           bool uncaptured) {
  TP_RETURN_IF(!ptr, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  tp__guard_enter();
  return malloc_entered(ptr, size, stream, uncaptured);
}

static tp_error_t malloc_from(void **ptr, size_t size, tp_pool_t pool,
                              tp_stream_t stream) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(p->imported, TP_ERROR_INVALID_VALUE);
  tp__stream *s;
  bool idle;
  TP_FORWARD(tp__stream_resolve(stream, false, &s, &idle));
  if (size == 0) {
    *ptr = NULL;
    return TP_SUCCESS;
  }
  return malloc_on(ptr, size, pool, p, s, idle);
}

TP_API tp_error_t tp_malloc_from_pool_async(void **ptr, size_t size,
                                            tp_pool_t pool,
                                            tp_stream_t stream) {
  TP_RETURN_IF(!ptr, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(malloc_from(ptr, size, pool, stream));
}

/* A free of a graph's allocation, or during a capture, is the graph's; with
 * no capture anywhere, or none on `s` (`idle`: resolving it just showed so),
 * a pointer of a pool is the pool's at once. Otherwise the capture decides,
 * and hands back the pool it found where the free is not the graph's. The
 * pool's free has two steps: the pool takes the block back, then the
 * stream's cache keeps it. */
static TP_ALWAYS_INLINE tp_error_t free_on(void *ptr, tp__stream *s,
                                           bool idle) {
  tp__pool *p = NULL;
  if (TP_LIKELY(idle || tp__no_capture()))
    p = tp__registry_find((uintptr_t)ptr);
  if (TP_UNLIKELY(p == NULL)) {
    tp_error_t err;
    if (tp__graph_free(ptr, s, &p, &err))
      return err;
    if (p == NULL)
      return TP_ERROR_INVALID_VALUE;
  }
  tp__claim c;
  tp_error_t err = tp__pool_claim(p, ptr, s, &c);
  if (TP_LIKELY(err == TP_SUCCESS && !c.kept))
    tp__pool_free_put(p, s, &c);
  return err;
}

static TP_ALWAYS_INLINE tp_error_t free_async(void *ptr, tp_stream_t stream,
                                              bool uncaptured) {
  tp__stream *s;
  bool idle;
  TP_FORWARD(tp__stream_resolve(stream, uncaptured, &s, &idle));
  if (!ptr)
    return TP_SUCCESS;
  return free_on(ptr, s, idle || uncaptured);
}

static TP_NOINLINE tp_error_t free_entered(void *ptr, tp_stream_t stream,
                                           bool uncaptured) {
  tp_error_t err = free_async(ptr, stream, uncaptured);
  tp__guard_exit();
  return err;
}

static TP_NOINLINE tp_error_t free_whole(void *ptr, tp_stream_t stream,
                                         bool uncaptured) {
  TP_FORWARD(tp__api_init());
  tp__guard_enter();
  return free_entered(ptr, stream, uncaptured);
}

/* ---- what a pointer is --------------------------------------------------- */

static tp_error_t pointer_attribute(void *data, tp_pointer_attr_t attr,
                                    const void *ptr) {
  tp__pool *p = tp__registry_find((uintptr_t)ptr);
  TP_RETURN_IF(!p || p->imported, TP_ERROR_INVALID_VALUE);
  uintptr_t start = 0;
  size_t size = 0;
  TP_FORWARD(tp__pool_live_range(p, (uintptr_t)ptr, &start, &size));
  /* Freed here, and kept only for the importers that still hold it. */
  TP_RETURN_IF(p->props.handle_types && tp__ipc_export_freed(p, start),
               TP_ERROR_INVALID_VALUE);
  if (attr == TP_POINTER_ATTR_RANGE_START_ADDR)
    *(void **)data = (void *)start;
  else if (attr == TP_POINTER_ATTR_RANGE_SIZE)
    *(size_t *)data = size;
  else
    *(tp_pool_t *)data = p->handle;
  return TP_SUCCESS;
}

TP_API tp_error_t tp_pointer_get_attribute(void *data, tp_pointer_attr_t attr,
                                           const void *ptr) {
  TP_RETURN_IF(!data || !ptr, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(attr != TP_POINTER_ATTR_RANGE_START_ADDR &&
                   attr != TP_POINTER_ATTR_RANGE_SIZE &&
                   attr != TP_POINTER_ATTR_MEMPOOL_HANDLE,
               TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pointer_attribute(data, attr, ptr));
}
