/* The allocation and free fast path, inline: a stream's own cache, under its
 * own lock, touching nothing another stream writes. The API's entry points
 * hold it whole, with no call in between; everything else (the pool lock,
 * the reuse policy, a full cache) is alloc.c's, behind one call. */
#ifndef TP_ALLOC_H
#define TP_ALLOC_H

#include "pool/pool.h"

/* ---- alloc.c's slow paths ------------------------------------------------ */

/* An allocation the stream's cache could not serve (`r`: `size` rounded to
 * granules). */
tp_error_t tp__pool_malloc_slow(tp__pool *p, tp__stream *s, size_t r,
                                size_t size, void **ptr);
/* A freed block that its stream's cache had no room for. */
void tp__pool_free_slow(tp__pool *p, tp__stream *s, unsigned cls, bool large,
                        const tp__centry *e, int64_t req);

/* ---- each thread's share of the bytes in use (see alloc.c) --------------- */

typedef struct tp__peak_slot {
  uint64_t key; /* the pool's peak key when the slot began */
  int64_t count, mark;
} tp__peak_slot;
extern TP_TLS tp__peak_slot tp__peak_slots[4];

static inline uint64_t tp__peak_key(const tp__pool *p) {
  return atomic_load_explicit(&p->peak_key, memory_order_relaxed);
}

/* Notes a change of the calling thread's bytes in use, after it was
 * counted; `rose`: the cache's count passed its mark. A thread's first
 * operation on a pool since the high was last reset (or since its slot
 * served another pool) starts the slot over. */
static inline void tp__peak_note(tp__pool *p, int64_t delta, bool rose) {
  uint64_t key = tp__peak_key(p);
  tp__peak_slot *t = &tp__peak_slots[key % 4];
  if (TP_UNLIKELY(t->key != key))
    *t = (tp__peak_slot){key, 0, 0};
  t->count += delta;
  if (TP_UNLIKELY(delta > 0 && (t->count > t->mark || rose))) {
    if (t->count > t->mark)
      t->mark = t->count;
    tp__pool_peak_raise(p);
  }
}

/* ---- allocation ------------------------------------------------------------
 * The bytes-asked word (or entry) is written before the pointer is handed
 * out, so that a free racing on another thread finds the allocation. */

static inline void *tp__finish_small(const tp__centry *e, size_t size) {
  tp__slab *s = e->owner;
  TP_CHECK(tp__slab_index(s, e->addr) >= 0);
  atomic_store_explicit(&s->req[tp__slab_index_of(s, e->addr)], (uint32_t)size,
                        memory_order_release);
  return (void *)e->addr;
}

/* The entry goes in before the state says USED, so that a walker that sees
 * a used block sees its entry. */
static inline void *tp__finish_large(tp__pool *p, tp__block *b, size_t size) {
  atomic_store_explicit(&b->req, size, memory_order_relaxed);
  _Atomic uintptr_t *e = tp__space_entry(&p->space, b->addr, false);
  atomic_store_explicit(e, (uintptr_t)b, memory_order_release);
  atomic_store_explicit(&b->state, TP_BLOCK_USED, memory_order_release);
  return (void *)b->addr;
}

static TP_ALWAYS_INLINE tp_error_t tp__pool_malloc(tp__pool *p, void **ptr,
                                                   size_t size, tp__stream *s) {
  /* The limit is a multiple of the chunk size, so that no size below it
   * overflows when rounded up (space.c). */
  TP_RETURN_IF(size > p->space.limit, TP_ERROR_OUT_OF_MEMORY);
  size_t r = tp__align_up(size, TP_GRANULE);
  bool biased = tp__blspin_enter(&s->lock);
  tp__cache *c = tp__cache_find(s, &p->caches);
  tp__centry e = {0, NULL, 0, 0};
  tp__block *b = NULL;
  bool hit = r <= TP_SMALL_MAX
                 ? tp__cache_pop_small(c, tp__class_of(r), &e)
                 : (b = tp__cache_pop_large(c, r, p->space.gran)) != NULL;
  bool rose = hit && tp__cache_count_up(c, (int64_t)size, tp__peak_key(p));
  tp__blspin_leave(&s->lock, biased);
  if (TP_UNLIKELY(!hit))
    return tp__pool_malloc_slow(p, s, r, size, ptr);
  *ptr = b ? tp__finish_large(p, b, size) : tp__finish_small(&e, size);
  tp__peak_note(p, (int64_t)size, rose);
  return TP_SUCCESS;
}

/* ---- free ------------------------------------------------------------------
 * A freed block goes into its stream's cache with the free's position; the
 * pool lock only when the cache is full or missing. */

static TP_ALWAYS_INLINE void tp__free_entry(tp__pool *p, tp__stream *s,
                                            unsigned cls, bool large,
                                            uintptr_t addr, void *owner,
                                            int64_t req) {
  bool biased = tp__blspin_enter(&s->lock);
  tp__tag t = tp__stream_tag(s);
  tp__centry e = {addr, owner, t.epoch, t.lseq};
  bool kept = tp__cache_push(tp__cache_find(s, &p->caches), cls, large, e, req);
  tp__blspin_leave(&s->lock, biased);
  if (TP_UNLIKELY(!kept))
    tp__pool_free_slow(p, s, cls, large, &e, req);
  tp__peak_note(p, -req, false);
  tp__pool_maybe_reap(p);
}

/* The free of a large block, found at `entry`: the entry is taken first, so
 * that of two racing frees one fails. */
static inline tp_error_t tp__pool_free_large(tp__pool *p, tp__block *b,
                                             _Atomic uintptr_t *entry,
                                             tp__stream *s) {
  uintptr_t expect = (uintptr_t)b;
  TP_RETURN_IF(!atomic_compare_exchange_strong_explicit(entry, &expect, 0,
                                                        memory_order_acq_rel,
                                                        memory_order_relaxed),
               TP_ERROR_INVALID_VALUE);
  int64_t req = (int64_t)atomic_load_explicit(&b->req, memory_order_relaxed);
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
  tp__free_entry(p, s, 0, true, b->addr, b, req);
  return TP_SUCCESS;
}

/* The free of `ptr` once the caller found its pool (tp__registry_find). A
 * pool another process shares may consume the free itself: an importer
 * gives up its hold, an exporter keeps a block an importer still holds
 * (and frees it with this free's tag once released). The acquire pairs
 * with the exporter's store: a pool seen unwatched shows the free that the
 * exporter finished before its last entry went. */
static TP_ALWAYS_INLINE tp_error_t tp__pool_free_in(tp__pool *p, void *ptr,
                                                    tp__stream *s) {
  uintptr_t addr = (uintptr_t)ptr;
  TP_RETURN_IF(addr % TP_GRANULE, TP_ERROR_INVALID_VALUE);
  if (TP_UNLIKELY(p->imported ||
                  atomic_load_explicit(&p->watched, memory_order_acquire))) {
    bool kept = false;
    TP_FORWARD(p->ops->free(p, addr, s, &kept));
    if (kept)
      return TP_SUCCESS;
  }
  _Atomic uintptr_t *entry = tp__space_entry(&p->space, addr, false);
  uintptr_t v = entry ? atomic_load_explicit(entry, memory_order_acquire) : 0;
  TP_RETURN_IF(!v, TP_ERROR_INVALID_VALUE);
  if (TP_UNLIKELY(!(v & 1u)))
    return tp__pool_free_large(p, (tp__block *)v, entry, s);
  tp__slab *slab = (tp__slab *)(v & ~(uintptr_t)1);
  int64_t idx = tp__slab_index(slab, addr);
  TP_RETURN_IF(idx < 0, TP_ERROR_INVALID_VALUE);
  uint32_t req =
      atomic_exchange_explicit(&slab->req[idx], 0, memory_order_acq_rel);
  TP_RETURN_IF(req == 0, TP_ERROR_INVALID_VALUE);
  tp__free_entry(p, s, slab->cls, false, addr, slab, req);
  return TP_SUCCESS;
}

#endif /* TP_ALLOC_H */
