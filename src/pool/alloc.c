/* Allocation and free behind the fast path of alloc.h: the slow paths (the
 * pool lock and the reuse policy), frees from elsewhere (another process's
 * hold), and each thread's share of the bytes-in-use accounting. */
#include "pool/alloc.h"

#include <string.h>

/* ---- the slow paths -------------------------------------------------------
 * They take the pool lock and may find the pool torn down there, when it was
 * destroyed while the call was on its way in: the pool is gone for the caller
 * (INVALID_VALUE), and its object stays readable until the call leaves the
 * guard. */

/* Why a stream has no cache in a pool: it is being destroyed by another
 * thread (the caller's handle is gone), or memory is short. */
static tp_error_t gone_or_short(const tp__stream *s) {
  return atomic_load_explicit(&s->destroyed, memory_order_acquire)
             ? TP_ERROR_INVALID_VALUE
             : TP_ERROR_OUT_OF_MEMORY;
}

static tp__reuse reuse_of(tp__pool *p) {
  return (tp__reuse){
      .heap = &p->heap,
      .slabs = &p->slabs,
      .caches = &p->caches,
      .lock = &p->lock,
      .gone = &p->torn_down,
      .waiters = &p->oom_waiters,
      .used_high = &p->used_high,
      .follow_events =
          atomic_load_explicit(&p->follow_events, memory_order_relaxed),
      .opportunistic =
          atomic_load_explicit(&p->opportunistic, memory_order_relaxed),
      .internal_deps =
          atomic_load_explicit(&p->internal_deps, memory_order_relaxed),
      .oom_wait = atomic_load_explicit(&p->oom_wait, memory_order_relaxed),
      .growth_slack =
          atomic_load_explicit(&p->growth_slack, memory_order_relaxed)};
}

/* The pool lock, taken for stream `s`'s own allocation or free: the heap
 * may make the joins that serve that stream alone (blocks.c, tags_join)
 * until unlock_for. */
static void lock_for(tp__pool *p, tp__stream *s) {
  tp__mutex_lock(&p->lock);
  p->heap.joiner = s;
}

static void unlock_for(tp__pool *p) {
  p->heap.joiner = NULL;
  tp__mutex_unlock(&p->lock);
}

static tp_error_t small_slow(tp__pool *p, tp__stream *s, unsigned cls,
                             size_t size, void **ptr) {
  tp__centry got[16];
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  uint32_t n = 0;
  bool rose = false;
  lock_for(p, s);
  tp__cache *c = p->torn_down ? NULL : tp__cache_ensure(&p->caches, s);
  if (c) {
    tp__reuse r = reuse_of(p);
    n = tp__reuse_small(&r, s, cls, got, 16, &err);
  } else if (!p->torn_down) {
    err = gone_or_short(s);
  }
  if (n > 0) {
    /* The first block is the caller's; the rest wait in the cache, found
     * again: the reuse may have waited with the pool lock dropped, and a
     * destroy of the stream freed its cache meanwhile (the allocation then
     * raced it and answers so). */
    tp__blspin_lock(&s->lock);
    c = tp__cache_find(s, &p->caches);
    uint32_t kept = c ? 1 : 0;
    while (c && kept < n && c->n[cls] < TP_SMALL_CACHE)
      c->v[cls][c->n[cls]++] = got[kept++];
    if (c)
      rose = tp__cache_count_up(c, (int64_t)size, tp__peak_key(p));
    tp__blspin_unlock(&s->lock);
    tp__cache_give_back(&p->caches, s, cls, false, got + kept, n - kept);
    if (!c) {
      n = 0;
      err = TP_ERROR_INVALID_VALUE;
    }
  }
  TP_DEBUG_WALK(p);
  unlock_for(p);
  TP_RETURN_IF(n == 0, err);
  *ptr = tp__finish_small(&got[0], size);
  tp__peak_note(p, (int64_t)size, rose);
  return TP_SUCCESS;
}

static tp_error_t large_slow(tp__pool *p, tp__stream *s, size_t r, size_t size,
                             void **ptr) {
  tp__block *b = NULL;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  bool rose = false;
  tp__cache *c = NULL;
  lock_for(p, s);
  if (!p->torn_down) {
    /* The stream's own cached blocks go back first, so that they merge
     * with their neighbours before the search. The small ones too: kept
     * cached unless the search would grow, their frees had less time to
     * complete, fewer slabs emptied, and gpt2_generate replayed at 1.0335
     * instead of 1.0249 (bench/RESULTS.md, "Small slow paths taking their
     * stream's pending blocks in a batch"). */
    c = tp__caches_drain_one(&p->caches, s);
    if (!c)
      c = tp__cache_ensure(&p->caches, s);
    if (c) {
      tp__reuse ctx = reuse_of(p);
      err = tp__reuse_large(&ctx, s, r, true, &b);
    } else {
      err = gone_or_short(s);
    }
  }
  /* The cache is found again, as in small_slow. */
  if (err == TP_SUCCESS) {
    tp__blspin_lock(&s->lock);
    c = tp__cache_find(s, &p->caches);
    tp__blspin_unlock(&s->lock);
  }
  if (err == TP_SUCCESS && (!c || !tp__space_entry(&p->space, b->addr, true))) {
    atomic_store_explicit(&b->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(&p->heap, b);
    err = c ? TP_ERROR_OUT_OF_MEMORY : TP_ERROR_INVALID_VALUE;
  }
  /* Success implies a cache; `c` is tested too so that the compiler sees
   * no path to a null one. */
  if (err == TP_SUCCESS && c) {
    tp__tag_clear(&b->tag); /* the user's now, in stream order on `s` */
    *ptr = tp__finish_large(p, b, size);
    tp__blspin_lock(&s->lock);
    rose = tp__cache_count_up(c, (int64_t)size, tp__peak_key(p));
    tp__blspin_unlock(&s->lock);
  }
  TP_DEBUG_WALK(p);
  unlock_for(p);
  if (err == TP_SUCCESS)
    tp__peak_note(p, (int64_t)size, rose);
  return err;
}

/* Either slow path. A destroyed pool whose last frees completed unseen
 * still holds device memory: finding the device full, the allocation
 * finishes such pools and tries once more. A failed allocation from a
 * destroyed pool finishes it too: its teardown may have been put off while
 * the allocation waited out of memory. */
tp_error_t tp__pool_malloc_slow(tp__pool *p, tp__stream *s, size_t r,
                                size_t size, void **ptr) {
  for (int attempt = 0;; attempt++) {
    tp_error_t err = r <= TP_SMALL_MAX
                         ? small_slow(p, s, tp__class_of(r), size, ptr)
                         : large_slow(p, s, r, size, ptr);
    if (TP_UNLIKELY(err != TP_SUCCESS &&
                    atomic_load_explicit(&p->destroyed, memory_order_acquire)))
      tp__pools_reap();
    if (TP_LIKELY(err != TP_ERROR_OUT_OF_MEMORY) || attempt > 0 ||
        !tp__pools_reap_polling())
      return err;
  }
}

/* A freed block whose cache is full or missing: under the pool lock, the
 * cache's oldest entries make room, or, without a cache, the block goes to
 * the pool. The free is counted in the same step, so that a teardown never
 * sees the pool unused while an entry is on its way. */
static void free_slow(tp__pool *p, tp__stream *s, unsigned cls, bool large,
                      const tp__centry *e, int64_t req) {
  tp__centry out[TP_SMALL_CACHE / 2 + 1];
  uint32_t nout = 0;
  lock_for(p, s);
  tp__cache *c = p->torn_down ? NULL : tp__cache_ensure(&p->caches, s);
  tp__blspin_lock(&s->lock);
  if (c)
    nout = tp__cache_evict(c, cls, large, out);
  bool kept = tp__cache_push(c, cls, large, *e, req);
  tp__blspin_unlock(&s->lock);
  if (!kept) {
    out[nout++] = *e;
    atomic_fetch_add_explicit(&p->caches.base, -req, memory_order_relaxed);
  }
  tp__cache_give_back(&p->caches, s, cls, large, out, nout);
  TP_DEBUG_WALK(p);
  unlock_for(p);
}

/* The free's second half where alloc.h's quick case did not apply: the
 * stream's lock taken whichever way it must be, and the slow path above
 * when the cache has no room. */
void tp__pool_free_put_slow(tp__pool *p, tp__stream *s, uintptr_t addr,
                            void *owner, unsigned cls, bool large,
                            int64_t req) {
  tp__peak_drop(p, req);
  bool biased = tp__blspin_enter(&s->lock);
  tp__centry e;
  bool kept = tp__pool_cache_keep(p, s, addr, owner, cls, large, req, &e);
  tp__blspin_leave(&s->lock, biased);
  if (!kept)
    free_slow(p, s, cls, large, &e, req);
  if (atomic_load_explicit(&p->destroyed, memory_order_acquire))
    tp__pool_freed_into_destroyed(s);
}

/* A destroyed pool goes once its frees are known complete, and with no
 * synchronize to come only an allocation that finds the device full asks
 * their streams. A stream whose own answer cannot show its frees complete
 * (the legacy stream on cuda, a blocking stream there that follows legacy
 * work) needs a marker, which such an allocation would only record: it
 * then failed out of memory though the frees had completed long before
 * (the same allocation at once after succeeded). The marker is recorded
 * here instead, with the free, so that the allocation finds it done. */
void tp__pool_freed_into_destroyed(tp__stream *s) {
  if (s->legacy || tp__stream_misses_legacy(s)) {
    tp__tag t = tp__stream_tag(s);
    (void)tp__stream_poll(&t);
  }
  tp__pools_reap();
}

/* ---- frees from elsewhere
 * ------------------------------------------------------
 */

tp_error_t tp__pool_live_size(tp__pool *p, void *ptr, size_t *size) {
  uintptr_t addr = (uintptr_t)ptr;
  tp__found f;
  TP_RETURN_IF(addr % TP_GRANULE || !tp__claim_find(p, addr, &f),
               TP_ERROR_INVALID_VALUE);
  *size =
      f.block ? atomic_load(&f.block->req) : atomic_load(&f.slab->req[f.idx]);
  TP_RETURN_IF(*size == 0, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

/* The block that covers `addr` (free, cached, in use, or a slab), or NULL
 * outside the mapped chunks: from the first block of the segment of mapped
 * chunks that holds it, along the segment's blocks, so that the time goes
 * with the blocks before it rather than with its bytes. Pool lock held. */
static tp__block *block_covering(tp__heap *h, uintptr_t addr) {
  const tp__space *sp = h->space;
  size_t c = tp__space_chunk(sp, addr);
  if (!tp__space_mapped(sp, c))
    return NULL;
  while (c > 0 && tp__space_mapped(sp, c - 1))
    c--;
  for (tp__block *b = h->segs[c].first; b && b->addr <= addr; b = b->next)
    if (addr - b->addr < b->size)
      return b;
  return NULL;
}

tp_error_t tp__pool_live_range(tp__pool *p, uintptr_t addr, uintptr_t *start,
                               size_t *size) {
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  tp__mutex_lock(&p->lock);
  tp__block *b = !p->torn_down && addr >= p->space.base &&
                         addr - p->space.base < p->space.va_size
                     ? block_covering(&p->heap, addr)
                     : NULL;
  tp__slab *s = b ? b->slab : NULL;
  if (s) {
    uint64_t i = (addr - s->base) / s->bsize;
    *start = s->base + i * s->bsize;
    *size = i < s->nblocks
                ? atomic_load_explicit(&s->req[i], memory_order_acquire)
                : 0;
  } else if (b) {
    /* A large block is live while its entry names it (claim.h). */
    _Atomic uintptr_t *e = tp__space_entry(&p->space, b->addr, false);
    bool live =
        e && atomic_load_explicit(e, memory_order_acquire) == (uintptr_t)b;
    *start = b->addr;
    *size = live ? atomic_load_explicit(&b->req, memory_order_acquire) : 0;
  }
  if (b && addr - *start < *size)
    err = TP_SUCCESS;
  tp__mutex_unlock(&p->lock);
  return err;
}

/* The block goes to the pool, counted in the same step. */
static void free_to_pool(tp__pool *p, tp__stream *s, unsigned cls, bool large,
                         const tp__centry *e, int64_t req) {
  lock_for(p, s);
  tp__cache_give_back(&p->caches, s, cls, large, e, 1);
  atomic_fetch_add_explicit(&p->caches.base, -req, memory_order_relaxed);
  TP_DEBUG_WALK(p);
  unlock_for(p);
}

tp_error_t tp__pool_free_tagged(tp__pool *p, void *ptr, tp__tag tag) {
  tp__claim c;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  if (tp__claim_take(p, (uintptr_t)ptr, &c)) {
    tp__centry e = {c.addr, c.owner, tag.epoch, tag.lseq};
    free_to_pool(p, tag.stream, c.cls, c.large, &e, c.req);
    err = TP_SUCCESS;
  }
  tp__stream_unref(tag.stream);
  return err;
}

/* ---- bytes in use -------------------------------------------------------
 *
 * "Used" changes on every allocate and free, and one shared counter would be
 * a cache line that every thread's pair bounces. So each stream cache counts
 * its own bytes exactly, and the total is their sum, taken under the pool
 * lock. The high watermark needs that sum only when the total may pass it,
 * which two cheap marks tell without touching anything shared:
 *  - each cache's mark, the highest its count reached since the sum was
 *    last taken for it: with one stream, its count is the total, whatever
 *    the threads (PyTorch frees on its autograd thread what the forward
 *    pass allocated on another);
 *  - each thread's mark over its own running count (what it allocated less
 *    what it freed, per pool): with one thread, its count is the total less
 *    a constant, whatever the streams.
 * An allocation that raises either above its mark takes the exact sum. The
 * high is exact when one stream or one thread does all the allocating; a
 * peak is missed only when several threads on several streams each stay
 * below their marks (see the header). */
TP_TLS tp__peak_slot tp__peak_slots[4];

static tp__peak_slot *peak_slot_of(const tp__pool *p) {
  uint64_t key = tp__peak_key(p);
  tp__peak_slot *t = tp__peak_slot_at(key);
  if (t->key != key)
    *t = (tp__peak_slot){.key = key};
  return t;
}

void tp__peak_note_slow(tp__pool *p, int64_t size, bool rose) {
  tp__peak_slot *t = peak_slot_of(p);
  int64_t n = t->count + size;
  t->count = n;
  if (n > t->mark || rose) {
    if (n > t->mark)
      t->mark = n;
    tp__pool_peak_raise(p);
  }
}

void tp__peak_drop_slow(tp__pool *p, int64_t size) {
  peak_slot_of(p)->count -= size;
}
