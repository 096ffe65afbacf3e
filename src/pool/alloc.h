/* The allocation and free fast path, inline: a stream's own cache, under its
 * own lock, touching nothing another stream writes. The API's entry points
 * hold it whole, with no call in between; everything else (the pool lock,
 * the reuse policy, a full cache) is alloc.c's, behind one call. */
#ifndef TP_ALLOC_H
#define TP_ALLOC_H

#include "pool/claim.h"

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

/* The calling thread's slot for `p`. A thread's first operation on a pool
 * since the high was last reset (or since its slot served another pool)
 * starts the slot over. */
static inline tp__peak_slot *tp__peak_slot_of(const tp__pool *p) {
  uint64_t key = tp__peak_key(p);
  tp__peak_slot *t = &tp__peak_slots[key % 4];
  if (TP_UNLIKELY(t->key != key))
    *t = (tp__peak_slot){key, 0, 0};
  return t;
}

/* Notes an allocation of `size` bytes by the calling thread, after it was
 * counted; `rose`: the cache's count passed its mark. */
static inline void tp__peak_note(tp__pool *p, int64_t size, bool rose) {
  tp__peak_slot *t = tp__peak_slot_of(p);
  int64_t n = t->count + size;
  t->count = n;
  if (TP_UNLIKELY(n > t->mark || rose)) {
    if (n > t->mark)
      t->mark = n;
    tp__pool_peak_raise(p);
  }
}

/* Notes a free of `size` bytes by the calling thread: never a new peak. */
static inline void tp__peak_drop(tp__pool *p, int64_t size) {
  tp__peak_slot *t = tp__peak_slot_of(p);
  t->count -= size;
}

/* ---- allocation ---------------------------------------------------------- */

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
 * claim.h's tp__pool_claim takes the block back; then it goes into its
 * stream's cache with the free's position, and to the pool lock only when
 * the cache is full or missing. */

/* The free's second half. The thread's count drops first: a free never
 * makes a peak, and this way the fast path's rooms are entered in one order.
 * A destroyed pool may go once its last allocation is freed: every free
 * asks, and the answer is rarely yes. */
static TP_ALWAYS_INLINE void tp__pool_free_put(tp__pool *p, tp__stream *s,
                                               const tp__claim *c) {
  tp__peak_drop(p, c->req);
  bool biased = tp__blspin_enter(&s->lock);
  tp__tag t = tp__stream_tag(s);
  tp__centry e = {c->addr, c->owner, t.epoch, t.lseq};
  bool kept = tp__cache_push(tp__cache_find(s, &p->caches), c->cls, c->large, e,
                             c->req);
  tp__blspin_leave(&s->lock, biased);
  if (TP_UNLIKELY(!kept))
    tp__pool_free_slow(p, s, c->cls, c->large, &e, c->req);
  if (TP_UNLIKELY(atomic_load_explicit(&p->destroyed, memory_order_acquire)))
    tp__pools_reap();
}

#endif /* TP_ALLOC_H */
