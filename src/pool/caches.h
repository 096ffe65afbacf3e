/* What each stream keeps of a pool for itself: small blocks per class and a
 * few large blocks, all freed on that stream (or handed out ready), which it
 * reuses in stream order under its own lock, and the exact count of the
 * bytes its allocations asked for. The inline functions below are the
 * allocation fast path; the rest gives blocks back to the pool, under the
 * pool lock. */
#ifndef TP_CACHES_H
#define TP_CACHES_H

#include "pool/slabs.h"

#define TP_LARGE_CACHE 4  /* large blocks a stream keeps for itself */
#define TP_SMALL_CACHE 64 /* small blocks a stream keeps per class */

typedef struct tp__caches tp__caches;

struct tp__cache {
  /* The first line holds all that a pop or a push reads and writes besides
   * the entry itself, so that a call in a busy process, whose caches hold
   * the application's data, misses on two lines here rather than up to
   * four. */
  _Alignas(64) tp__caches *set; /* the pool's; what a lookup compares */
  /* Bytes asked for by allocations made on this stream, less those freed
   * on it (negative when it frees others' blocks); written under the
   * stream's lock, read by anyone. `mark` is the highest `used` reached
   * since the pool's high was last taken for this cache, under the pool's
   * peak key `key` (another key: the mark is forgotten). */
  _Atomic int64_t used;
  int64_t mark;
  uint64_t key;
  uint8_t n[TP_NCLASSES + 1]; /* entries per class; [TP_NCLASSES]: large */
  tp__stream *stream;
  tp__cache *next_in_stream, *next_in_set, *prev_in_set;
  tp__centry v[TP_NCLASSES][TP_SMALL_CACHE];
  tp__centry large[TP_LARGE_CACHE];
};
_Static_assert(TP_SMALL_CACHE <= 255 && TP_LARGE_CACHE <= 255,
               "a cache's counts are bytes");

/* A pool's caches, where they give blocks back, and the bytes counted
 * outside any cache. The list changes under the pool lock. */
struct tp__caches {
  tp__cache *list;
  tp__heap *heap;
  tp__slabs *slabs;
  _Atomic int64_t base;
};

/* The cache of `s` for `set`, or NULL; stream lock held. */
static inline tp__cache *tp__cache_find(tp__stream *s, tp__caches *set) {
  tp__cache *c = s->hint;
  if (TP_LIKELY(c && c->set == set))
    return c;
  for (c = s->caches; c && c->set != set; c = c->next_in_stream) {
  }
  if (c)
    s->hint = c;
  return c;
}

/* Moves a cache's count; stream lock held. */
static inline void tp__cache_count(tp__cache *c, int64_t delta) {
  atomic_store_explicit(
      &c->used, atomic_load_explicit(&c->used, memory_order_relaxed) + delta,
      memory_order_relaxed);
}

/* Counts an allocation of `size` bytes; stream lock held. True when the
 * cache's count rose above its mark, which may make a new peak of the pool
 * (the caller then takes the exact total); `key` is the pool's peak key. */
static inline bool tp__cache_count_up(tp__cache *c, int64_t size,
                                      uint64_t key) {
  int64_t u = atomic_load_explicit(&c->used, memory_order_relaxed) + size;
  atomic_store_explicit(&c->used, u, memory_order_relaxed);
  if (TP_UNLIKELY(c->key != key)) {
    c->key = key;
    c->mark = u - size;
  }
  if (u <= c->mark)
    return false;
  c->mark = u;
  return true;
}

/* Takes a block of small class `cls`; stream lock held. */
static inline bool tp__cache_pop_small(tp__cache *c, unsigned cls,
                                       tp__centry *e) {
  if (!c || !c->n[cls])
    return false;
  *e = c->v[cls][--c->n[cls]];
  return true;
}

/* Takes the smallest cached large block that holds `r` bytes with at most
 * a 64th to spare, and whose spare reaches into no chunk the `r` bytes do
 * not (`gran`: the chunk size): a live block that did would hold a chunk
 * that no release could give back (the fuzzer: 2 MiB - 512 bytes served
 * from a freed 2 MiB + 512 kept 4 MiB reserved at threshold 0). Stream lock
 * held. */
static inline tp__block *tp__cache_pop_large(tp__cache *c, size_t r,
                                             size_t gran) {
  int best = -1;
  for (uint32_t i = 0; c && i < c->n[TP_NCLASSES]; i++) {
    tp__block *b = c->large[i].owner;
    if (b->size >= r && b->size - r <= r / 64 &&
        (b->addr + r - 1) / gran == (b->addr + b->size - 1) / gran &&
        (best < 0 || b->size < ((tp__block *)c->large[best].owner)->size))
      best = (int)i;
  }
  if (best < 0)
    return NULL;
  tp__block *b = c->large[best].owner;
  c->large[best] = c->large[--c->n[TP_NCLASSES]];
  return b;
}

/* Keeps a freed block's entry when there is room, counting the free: true
 * when kept. Stream lock held. */
static inline bool tp__cache_push(tp__cache *c, unsigned cls, bool large,
                                  tp__centry e, int64_t req) {
  if (!c)
    return false;
  uint8_t *n = &c->n[large ? TP_NCLASSES : cls];
  if (*n == (large ? TP_LARGE_CACHE : TP_SMALL_CACHE))
    return false;
  /* Field by field: a copy of the whole entry, just built, would read it
   * back wider than it was written and stall store forwarding. */
  tp__centry *d = &(large ? c->large : c->v[cls])[(*n)++];
  d->addr = e.addr;
  d->owner = e.owner;
  d->epoch = e.epoch;
  d->lseq = e.lseq;
  tp__cache_count(c, -req);
  return true;
}

/* ---- under the pool lock ---------------------------------------------------
 */

/* The cache of `s` in `set`, made on first use; NULL when memory is short
 * or `s` is being destroyed. */
tp__cache *tp__cache_ensure(tp__caches *set, tp__stream *s);
/* Hands entries that left stream `s`'s cache to the pool (a class's small
 * blocks, or large ones when `large`); the stream lock not held, since a
 * pending small block may make the pool wait on `s`. */
void tp__cache_give_back(tp__caches *set, tp__stream *s, unsigned cls,
                         bool large, const tp__centry *v, uint32_t n);
/* Takes room out of a full class (its oldest half) or a full large list
 * (its oldest block) into out[]; stream lock held. Returns how many. */
uint32_t tp__cache_evict(tp__cache *c, unsigned cls, bool large,
                         tp__centry *out);
/* Gives every block of `c` back, a class at a time under the stream lock,
 * so that no block is ever outside both the cache and the pool where a
 * teardown could miss it. */
void tp__cache_drain(tp__caches *set, tp__cache *c);
/* Drains every cache, or the one of stream `s` (returned, or NULL). */
void tp__caches_drain_all(tp__caches *set);
tp__cache *tp__caches_drain_one(tp__caches *set, tp__stream *s);
/* Unlinks, drains and frees a cache; its count moves to the base. */
void tp__cache_free(tp__caches *set, tp__cache *c);
/* The exact bytes in use: every cache's count and the base. */
uint64_t tp__caches_used(const tp__caches *set);

#endif /* TP_CACHES_H */
