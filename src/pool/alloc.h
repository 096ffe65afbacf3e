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
/* A free's second half that the quick case below could not take (see
 * tp__pool_free_put), given the claim's fields one by one so that the
 * claim need not live in memory. */
void tp__pool_free_put_slow(tp__pool *p, tp__stream *s, uintptr_t addr,
                            void *owner, unsigned cls, bool large, int64_t req);
/* After a free into a destroyed pool on `s`: finishes the pool where its
 * frees are known complete (see alloc.c). */
void tp__pool_freed_into_destroyed(tp__stream *s);

/* ---- each thread's share of the bytes in use (see alloc.c) --------------- */

typedef struct tp__peak_slot {
  uint64_t key; /* the pool's peak key when the slot began */
  int64_t count, mark;
} tp__peak_slot;
extern TP_TLS tp__peak_slot tp__peak_slots[4];

static inline uint64_t tp__peak_key(const tp__pool *p) {
  return atomic_load_explicit(&p->peak_key, memory_order_relaxed);
}

/* The calling thread's slot for a pool whose peak key is `key`; it counts
 * for that pool only where its own key is the same. */
static inline tp__peak_slot *tp__peak_slot_at(uint64_t key) {
  return &tp__peak_slots[key %
                         (sizeof tp__peak_slots / sizeof *tp__peak_slots)];
}

/* The out-of-line halves of the two below: a thread's first operation on a
 * pool since the high was last reset (or since its slot served another
 * pool) starts the slot over, and an allocation that passes a mark takes
 * the exact total. */
void tp__peak_note_slow(tp__pool *p, int64_t size, bool rose);
void tp__peak_drop_slow(tp__pool *p, int64_t size);

/* Notes an allocation of `size` bytes by the calling thread, after it was
 * counted; `rose`: the cache's count passed its mark. */
static inline void tp__peak_note(tp__pool *p, int64_t size, bool rose) {
  /* The key is read after the cache's count was stored, in the program's
   * order too, which the reset of the high counts on (pool.c). */
  atomic_signal_fence(memory_order_seq_cst);
  uint64_t key = tp__peak_key(p);
  tp__peak_slot *t = tp__peak_slot_at(key);
  int64_t n = t->count + size;
  if (TP_LIKELY(t->key == key && n <= t->mark && !rose))
    t->count = n;
  else
    tp__peak_note_slow(p, size, rose);
}

/* Notes a free of `size` bytes by the calling thread: never a new peak. */
static inline void tp__peak_drop(tp__pool *p, int64_t size) {
  uint64_t key = tp__peak_key(p);
  tp__peak_slot *t = tp__peak_slot_at(key);
  if (TP_LIKELY(t->key == key))
    t->count -= size;
  else
    tp__peak_drop_slow(p, size);
}

/* ---- allocation ------------------------------------------------------------
 * A small allocation that the stream's cache holds, with the stream's lock
 * in bias, is served without a call; anything else takes the whole path,
 * which may call out (another thread's lock, an empty class, a large size). */

/* The quick case: false, with nothing done, where it does not apply. */
static TP_ALWAYS_INLINE bool tp__pool_malloc_quick(tp__pool *p, void **ptr,
                                                   size_t size, tp__stream *s) {
  size_t r = tp__align_up(size, TP_GRANULE);
  if (TP_UNLIKELY(size - 1 >= TP_SMALL_MAX || size > p->space.limit ||
                  !tp__blspin_try_bias(&s->lock)))
    return false;
  tp__cache *c = tp__cache_find(s, &p->caches);
  tp__centry e;
  if (TP_UNLIKELY(!tp__cache_pop_small(c, tp__class_of(r), &e))) {
    tp__blspin_leave(&s->lock, true);
    return false;
  }
  bool rose = tp__cache_count_up(c, (int64_t)size, tp__peak_key(p));
  tp__blspin_leave(&s->lock, true);
  *ptr = tp__finish_small(&e, size);
  tp__peak_note(p, (int64_t)size, rose);
  return true;
}

/* Any allocation from `p` on `s`, the quick case apart: the stream's lock
 * taken whichever way it must be, a small or large block from its cache,
 * or alloc.c's slow path. */
static TP_ALWAYS_INLINE tp_error_t tp__pool_malloc_rest(tp__pool *p, void **ptr,
                                                        size_t size,
                                                        tp__stream *s) {
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

static TP_ALWAYS_INLINE tp_error_t tp__pool_malloc(tp__pool *p, void **ptr,
                                                   size_t size, tp__stream *s) {
  if (TP_LIKELY(tp__pool_malloc_quick(p, ptr, size, s)))
    return TP_SUCCESS;
  return tp__pool_malloc_rest(p, ptr, size, s);
}

/* ---- free ------------------------------------------------------------------
 * claim.h's tp__pool_claim takes the block back; then it goes into its
 * stream's cache with the free's position, and to the pool lock only when
 * the cache is full or missing. */

/* Keeps a block taken back in the stream's cache, with the free's position
 * in the stream (in *e), and counts the free; stream lock held. False where
 * the stream has no cache in the pool or no room in it. */
static TP_ALWAYS_INLINE bool tp__pool_cache_keep(tp__pool *p, tp__stream *s,
                                                 uintptr_t addr, void *owner,
                                                 unsigned cls, bool large,
                                                 int64_t req, tp__centry *e) {
  tp__tag tag = tp__stream_tag(s);
  *e = (tp__centry){addr, owner, tag.epoch, tag.lseq};
  return tp__cache_push(tp__cache_find(s, &p->caches), cls, large, *e, req);
}

/* The second half's quick case, the stream's lock in bias and room in the
 * cache: false, with nothing done, otherwise. The thread's own count, which
 * no other thread reads, drops once the block is kept, so that nothing of
 * its slot stays in registers across the cache's work: looked up before
 * the lock, it pushed three of the free's values out to the stack. */
static TP_ALWAYS_INLINE bool tp__pool_free_put_quick(tp__pool *p, tp__stream *s,
                                                     const tp__claim *c) {
  if (TP_UNLIKELY(!tp__blspin_try_bias(&s->lock)))
    return false;
  tp__centry e;
  bool kept = tp__pool_cache_keep(p, s, c->addr, c->owner, c->cls, c->large,
                                  c->req, &e);
  tp__blspin_leave(&s->lock, true);
  if (TP_LIKELY(kept))
    tp__peak_drop(p, c->req);
  return kept;
}

/* The second half whole: the quick case, or alloc.c's. A destroyed pool may
 * go once its last allocation is freed: every free asks, and the answer is
 * rarely yes. */
static TP_ALWAYS_INLINE void tp__pool_free_put(tp__pool *p, tp__stream *s,
                                               const tp__claim *c) {
  if (TP_UNLIKELY(!tp__pool_free_put_quick(p, s, c))) {
    tp__pool_free_put_slow(p, s, c->addr, c->owner, c->cls, c->large, c->req);
    return;
  }
  if (TP_UNLIKELY(atomic_load_explicit(&p->destroyed, memory_order_acquire)))
    tp__pool_freed_into_destroyed(s);
}

#endif /* TP_ALLOC_H */
