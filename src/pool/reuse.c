/* The reuse policy (reuse.h). Cheapest first, each step tried only when the
 * ones before found nothing:
 *   1. memory the stream may use now: its own frees, completed ones, and
 *      (REUSE_FOLLOW_EVENT_DEPENDENCIES) frees it follows through events or
 *      the legacy stream;
 *   2. frees found completed by querying their markers
 *      (REUSE_ALLOW_OPPORTUNISTIC), then runs of adjacent free blocks;
 *   3. the same after every stream's cache gave its blocks back;
 *   4. a pending free, the stream being made to wait for it
 *      (REUSE_ALLOW_INTERNAL_DEPENDENCIES);
 *   5. growth: moving wholly free chunks behind a new range, or making new
 *      ones, within the growth budget;
 *   6. waiting on the host for pending frees and growing again
 *      (TP_POOL_ATTR_OOM_WAIT), the last resort before out-of-memory.
 * Free memory that needs no dependency wins over memory that does: a
 * dependency serialises streams. */
#include "pool/reuse.h"

static tp__taker taker(const tp__reuse *r, tp__stream *a, bool deps) {
  return (tp__taker){a, r->follow_events, deps};
}

/* Chunks that growth may make new rather than move: as many as keep the
 * pool within its growth slack above the peak of bytes asked for. */
static size_t growth_budget(const tp__reuse *r, size_t size) {
  const tp__space *sp = r->heap->space;
  uint64_t reserved = atomic_load_explicit(&sp->reserved, memory_order_relaxed);
  uint64_t peak =
      tp__max_u64(atomic_load(r->used_high), tp__caches_used(r->caches) + size);
  uint64_t ppm = r->growth_slack, million = TP_GROWTH_SLACK_MAX;
  uint64_t budget =
      peak + peak / million * ppm + peak % million * ppm / million;
  return budget > reserved ? (size_t)((budget - reserved) / sp->gran) : 0;
}

/* Waits on the host for every pending free of the pool, the pool lock
 * dropped meanwhile so that stream work that calls into tidepool can still
 * finish; then settles what completed. */
static void wait_pending(const tp__reuse *r) {
  tp__tag *tags = NULL;
  uint32_t n = 0, cap = 0;
  tp__heap_pending_tags(r->heap, &tags, &n, &cap);
  tp__slabs_pending_tags(r->slabs, &tags, &n, &cap);
  (*r->waiters)++;
  /* Whoever takes the lock meanwhile must not join for this stream. */
  const tp__stream *joiner = r->heap->joiner;
  r->heap->joiner = NULL;
  tp__mutex_unlock(r->lock);
  for (uint32_t i = 0; i < n; i++) {
    (void)tp__stream_wait_host(&tags[i]);
    tp__stream_unref(tags[i].stream);
  }
  free(tags);
  tp__mutex_lock(r->lock);
  r->heap->joiner = joiner;
  (*r->waiters)--;
  if (*r->gone)
    return;
  tp__slabs_settle(r->slabs, false, true);
  tp__heap_settle(r->heap, false);
}

/* Steps 1 to 4 for a large block. */
static tp__block *reuse_free(const tp__reuse *r, tp__stream *a, size_t size) {
  tp__taker now = taker(r, a, false), later = taker(r, a, true);
  tp__block *b = tp__heap_take(r->heap, &now, size);
  if (!b && r->opportunistic) {
    tp__heap_settle(r->heap, true);
    b = tp__heap_take(r->heap, &now, size);
  }
  if (!b)
    b = tp__heap_take_run(r->heap, &now, size);
  if (!b) {
    tp__caches_drain_all(r->caches);
    tp__slabs_settle(r->slabs, r->opportunistic, true);
    tp__heap_settle(r->heap, r->opportunistic);
    b = tp__heap_take(r->heap, &now, size);
  }
  if (!b && r->internal_deps) {
    b = tp__heap_take(r->heap, &later, size);
    if (!b)
      b = tp__heap_take_run(r->heap, &later, size);
  }
  return b;
}

tp_error_t tp__reuse_large(const tp__reuse *r, tp__stream *a, size_t size,
                           bool grow, tp__block **out) {
  TP_CHECK_HELD(r->lock);
  tp__block *b = reuse_free(r, a, size);
  tp_error_t err = TP_SUCCESS;
  tp__taker now = taker(r, a, false);
  for (int attempt = 0; !b && grow && attempt < 2; attempt++) {
    tp__block *grown = NULL;
    size_t budget = growth_budget(r, size);
    err = tp__heap_grow(r->heap, &now, size, budget, &grown);
    /* Making chunks failed (the pool's max_size or the device is full):
     * moving wholly free chunks may still serve the request. */
    if (err == TP_ERROR_OUT_OF_MEMORY && budget > 0)
      err = tp__heap_grow(r->heap, &now, size, 0, &grown);
    if (err == TP_SUCCESS) {
      b = grown;
      break;
    }
    if (err != TP_ERROR_OUT_OF_MEMORY || attempt > 0 || !r->oom_wait)
      break;
    wait_pending(r);
    TP_RETURN_IF(*r->gone, TP_ERROR_INVALID_VALUE);
    b = tp__heap_take(r->heap, &now, size);
  }
  TP_RETURN_IF(!b, err != TP_SUCCESS ? err : TP_ERROR_OUT_OF_MEMORY);
  *out = b;
  return TP_SUCCESS;
}

/* A new slab of the class, carved from a large block found through the
 * large order (growing only when `grow`). */
static tp_error_t slab_new(const tp__reuse *r, tp__stream *a, unsigned cls,
                           bool grow) {
  tp__block *b = NULL;
  TP_FORWARD(tp__reuse_large(r, a, tp__slab_bytes(cls), grow, &b));
  tp_error_t err = tp__slabs_make(r->slabs, cls, b);
  if (err != TP_SUCCESS)
    tp__block_release(r->heap, b);
  return err;
}

/* For small blocks the same order, a class at a time: ready blocks or a
 * pending one the stream may use, then ones found completed by polling, a
 * slab from free memory, a pending block behind a dependency, and only then
 * a slab from new memory. */
uint32_t tp__reuse_small(const tp__reuse *r, tp__stream *a, unsigned cls,
                         tp__centry *out, uint32_t want, tp_error_t *err) {
  TP_CHECK_HELD(r->lock);
  tp__taker now = taker(r, a, false), later = taker(r, a, true);
  *err = TP_ERROR_OUT_OF_MEMORY;
  for (int step = 0; step < 4; step++) {
    uint32_t n = tp__slabs_take_ready(r->slabs, cls, out, want);
    if (n)
      return n;
    if ((n = tp__slabs_take_pending(r->slabs, cls, &now, out, want)) != 0)
      return n;
    switch (step) {
    case 0:
      if (r->opportunistic)
        tp__slabs_settle(r->slabs, true, false);
      break;
    case 1: *err = slab_new(r, a, cls, false); break;
    case 2:
      if (r->internal_deps &&
          (n = tp__slabs_take_pending(r->slabs, cls, &later, out, 1)) != 0)
        return n;
      *err = slab_new(r, a, cls, true);
      break;
    default: break;
    }
    if (*err == TP_ERROR_INVALID_VALUE)
      return 0;
  }
  return 0;
}
