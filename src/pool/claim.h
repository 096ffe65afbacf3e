/* An allocation's record at its address: written as the allocation is handed
 * out (the bytes asked, a large block's entry), read by the questions about a
 * live pointer, and claimed by its free, so that of two frees of one pointer,
 * racing or not, exactly one succeeds. */
#ifndef TP_CLAIM_H
#define TP_CLAIM_H

#include "pool/pool.h"

/* A live allocation as its address leads to it: a large block, or a slab
 * and the small block's index there. */
typedef struct tp__found {
  _Atomic uintptr_t *entry; /* the address's entry in the space */
  tp__block *block;         /* large; NULL for a small one */
  tp__slab *slab;           /* small; NULL for a large one */
  int64_t idx;
} tp__found;

/* What a free took back, for the stream cache: the block (a tp__block, or
 * the small block's slab) and the bytes its allocation asked for. `kept`:
 * the room that shares the pool with other processes took the free itself
 * (see tp__pool_ops.free), and the cache has nothing to do. */
typedef struct tp__claim {
  uintptr_t addr;
  void *owner;
  unsigned cls;
  bool large, kept;
  int64_t req;
} tp__claim;

/* ---- handing out ----------------------------------------------------------
 * The record is written before the pointer is handed out, so that a free
 * racing on another thread finds the allocation. */

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

/* ---- finding and taking back ----------------------------------------------
 * `addr` is a multiple of the granule. A small block is live while its
 * bytes-asked word is nonzero; a large one while its entry names it. */

/* Where the allocation that starts at `addr` is recorded; false where none
 * of the pool's blocks starts there. A small block found may be free. */
static inline bool tp__claim_find(tp__pool *p, uintptr_t addr, tp__found *f) {
  f->entry = tp__space_entry(&p->space, addr, false);
  uintptr_t v =
      f->entry ? atomic_load_explicit(f->entry, memory_order_acquire) : 0;
  f->block = NULL;
  f->slab = NULL;
  f->idx = -1;
  if (!(v & 1u)) {
    f->block = (tp__block *)v;
    return f->block != NULL;
  }
  f->slab = tp__slab_of_entry(v);
  f->idx = tp__slab_index_of_entry(v);
  return true;
}

/* Takes the live allocation at `addr` back: its entry (large) or its
 * bytes-asked word (small) is cleared in one atomic step, so that of two
 * racing frees one fails. False where nothing live starts there. */
static inline bool tp__claim_take(tp__pool *p, uintptr_t addr, tp__claim *c) {
  tp__found f;
  if (TP_UNLIKELY(!tp__claim_find(p, addr, &f)))
    return false;
  c->addr = addr;
  if (TP_UNLIKELY(f.block != NULL)) {
    uintptr_t expect = (uintptr_t)f.block;
    if (!atomic_compare_exchange_strong_explicit(
            f.entry, &expect, 0, memory_order_acq_rel, memory_order_relaxed))
      return false;
    c->req = (int64_t)atomic_load_explicit(&f.block->req, memory_order_relaxed);
    atomic_store_explicit(&f.block->state, TP_BLOCK_CACHED,
                          memory_order_relaxed);
    c->owner = f.block;
    c->cls = 0;
    c->large = true;
    return true;
  }
  c->req =
      atomic_exchange_explicit(&f.slab->req[f.idx], 0, memory_order_acq_rel);
  c->owner = f.slab;
  c->cls = f.slab->cls;
  c->large = false;
  return c->req != 0;
}

/* The free's first half where no other process shares the pool: false,
 * with nothing done, where one does, `ptr` is no granule's start, or
 * nothing live starts there (tp__pool_claim then tells which). */
static TP_ALWAYS_INLINE bool tp__pool_claim_local(tp__pool *p, void *ptr,
                                                  tp__claim *c) {
  uintptr_t addr = (uintptr_t)ptr;
  if (TP_UNLIKELY(addr % TP_GRANULE || p->imported ||
                  atomic_load_explicit(&p->watched, memory_order_acquire)))
    return false;
  c->kept = false;
  return tp__claim_take(p, addr, c);
}

/* The free's first half (the second is alloc.h's tp__pool_free_put):
 * INVALID_VALUE where no live allocation of `p` starts at `ptr`. A pool
 * another process shares may consume the free itself: an importer gives up
 * its hold, an exporter keeps a block an importer still holds (and frees it
 * with this free's tag once released). The acquire pairs with the
 * exporter's store: a pool seen unwatched shows the free that the exporter
 * finished before its last entry went. */
static TP_ALWAYS_INLINE tp_error_t tp__pool_claim(tp__pool *p, void *ptr,
                                                  tp__stream *s, tp__claim *c) {
  if (TP_LIKELY(tp__pool_claim_local(p, ptr, c)))
    return TP_SUCCESS;
  uintptr_t addr = (uintptr_t)ptr;
  if (TP_UNLIKELY(addr % TP_GRANULE))
    return TP_ERROR_INVALID_VALUE;
  c->kept = false;
  if (TP_UNLIKELY(p->imported ||
                  atomic_load_explicit(&p->watched, memory_order_acquire))) {
    /* A local flag, so that the claim itself need not live in memory. */
    bool kept = false;
    tp_error_t err = p->ops->free(p, addr, s, &kept);
    c->kept = kept;
    if (err != TP_SUCCESS || kept)
      return err;
  }
  return tp__claim_take(p, addr, c) ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
}

#endif /* TP_CLAIM_H */
