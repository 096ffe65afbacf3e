/* The slow half of the stream caches (caches.h): making them, giving their
 * blocks back to the pool, freeing them, and summing their counts. Pool
 * lock held throughout; a stream's lock only where its cache is read. */
#include "pool/caches.h"

#include <string.h>

tp__cache *tp__cache_ensure(tp__caches *set, tp__stream *s) {
  tp__blspin_lock(&s->lock);
  tp__cache *c = tp__cache_find(s, set);
  tp__blspin_unlock(&s->lock);
  /* A stream being destroyed has had its caches dropped, under each pool's
   * lock, after it was marked: a cache made now would outlive it. */
  if (c || atomic_load_explicit(&s->destroyed, memory_order_acquire))
    return c;
  c = aligned_alloc(_Alignof(tp__cache), sizeof *c);
  if (!c)
    return NULL;
  memset(c, 0, sizeof *c);
  c->set = set;
  c->stream = s;
  tp__stream_ref(s);
  c->next_in_set = set->list;
  if (c->next_in_set)
    c->next_in_set->prev_in_set = c;
  set->list = c;
  set->heap->sole = c->next_in_set ? NULL : s;
  tp__blspin_lock(&s->lock);
  c->next_in_stream = s->caches;
  s->caches = c;
  s->hint = c;
  tp__blspin_unlock(&s->lock);
  return c;
}

void tp__cache_give_back(tp__caches *set, tp__stream *s, unsigned cls,
                         bool large, const tp__centry *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    if (!large) {
      tp__slabs_put(set->slabs, cls, &v[i], s);
      continue;
    }
    tp__block *b = v[i].owner;
    b->tag = (tp__tag){s, v[i].epoch, v[i].lseq};
    tp__stream_ref(s);
    tp__block_release(set->heap, b);
  }
}

uint32_t tp__cache_evict(tp__cache *c, unsigned cls, bool large,
                         tp__centry *out) {
  tp__centry *v = large ? c->large : c->v[cls];
  uint8_t *n = &c->n[large ? TP_NCLASSES : cls];
  uint32_t cap = large ? TP_LARGE_CACHE : TP_SMALL_CACHE;
  if (*n < cap)
    return 0;
  /* The oldest leave: the newest are the likeliest to be reused. */
  uint32_t k = large ? 1 : cap / 2;
  memcpy(out, v, k * sizeof *v);
  memmove(v, v + k, (*n - k) * sizeof *v);
  *n -= k;
  return k;
}

/* The classes of `c` that hold blocks (bit TP_NCLASSES: large ones), read
 * under one taking of the stream lock: most are empty, and a drain should
 * not take the lock once a class to learn so. */
static uint32_t filled(tp__cache *c, bool locked) {
  _Static_assert(TP_NCLASSES < 32, "a class mask fits in 32 bits");
  uint8_t n[24] = {0};
  _Static_assert(sizeof c->n <= sizeof n, "the counts fit in three words");
  if (locked)
    tp__blspin_lock(&c->stream->lock);
  memcpy(n, c->n, sizeof c->n);
  if (locked)
    tp__blspin_unlock(&c->stream->lock);
  /* Eight counts a word: the high bit of each nonzero byte, then those
   * bits gathered into the byte's position by one multiplication. */
  uint32_t m = 0;
  for (unsigned w = 0; w < 3; w++) {
    uint64_t v, low7 = UINT64_C(0x7f7f7f7f7f7f7f7f);
    memcpy(&v, n + 8 * w, 8);
    uint64_t high = (((v & low7) + low7) | v) & ~low7;
    m |= (uint32_t)(((high >> 7) * UINT64_C(0x0102040810204080)) >> 56)
         << (8 * w);
  }
  return m;
}

/* Drains `c`; `locked` takes the stream lock around each class (false once
 * the cache is unlinked and no other thread can reach it). A class filled
 * by another thread after filled() looked waits for the next drain. */
static void drain(tp__caches *set, tp__cache *c, bool locked) {
  tp__stream *s = c->stream;
  tp__centry v[TP_SMALL_CACHE];
  for (uint32_t m = filled(c, locked); m; m &= m - 1) {
    unsigned cls = (unsigned)__builtin_ctz(m);
    bool large = cls == TP_NCLASSES;
    if (locked)
      tp__blspin_lock(&s->lock);
    uint32_t n = c->n[cls];
    memcpy(v, large ? c->large : c->v[cls], n * sizeof v[0]);
    c->n[cls] = 0;
    if (locked)
      tp__blspin_unlock(&s->lock);
    tp__cache_give_back(set, s, cls, large, v, n);
  }
}

void tp__cache_drain(tp__caches *set, tp__cache *c) {
  drain(set, c, true);
}

void tp__caches_drain_all(tp__caches *set) {
  for (tp__cache *c = set->list; c; c = c->next_in_set)
    drain(set, c, true);
}

tp__cache *tp__caches_drain_one(tp__caches *set, tp__stream *s) {
  tp__blspin_lock(&s->lock);
  tp__cache *c = tp__cache_find(s, set);
  tp__blspin_unlock(&s->lock);
  if (c)
    drain(set, c, true);
  return c;
}

void tp__cache_free(tp__caches *set, tp__cache *c) {
  tp__stream *s = c->stream;
  tp__blspin_lock(&s->lock);
  tp__cache **pp = &s->caches;
  while (*pp != c)
    pp = &(*pp)->next_in_stream;
  *pp = c->next_in_stream;
  if (s->hint == c)
    s->hint = NULL;
  tp__blspin_unlock(&s->lock);
  drain(set, c, false);
  atomic_fetch_add_explicit(
      &set->base, atomic_load_explicit(&c->used, memory_order_relaxed),
      memory_order_relaxed);
  if (c->prev_in_set)
    c->prev_in_set->next_in_set = c->next_in_set;
  else
    set->list = c->next_in_set;
  if (c->next_in_set)
    c->next_in_set->prev_in_set = c->prev_in_set;
  set->heap->sole =
      set->list && !set->list->next_in_set ? set->list->stream : NULL;
  free(c);
  tp__stream_unref(s);
}

uint64_t tp__caches_used(const tp__caches *set) {
  int64_t t = atomic_load_explicit(&set->base, memory_order_relaxed);
  for (const tp__cache *c = set->list; c; c = c->next_in_set)
    t += atomic_load_explicit(&c->used, memory_order_relaxed);
  return t > 0 ? (uint64_t)t : 0;
}
