/* Size classes for small blocks (up to 32 KiB): slabs of one class carved
 * from large blocks, their free bits, and the blocks that left a stream
 * cache before their free completed. Pool lock held throughout. */
#include <string.h>

#include "pool/pool.h"

/* 512-byte steps to 4 KiB (the driver's step), then four classes per
 * doubling: at most a quarter wasted, on sizes that are a sliver of any
 * real workload's memory. */
static const uint32_t class_sizes[TP_NCLASSES] = {
    512,  1024, 1536,  2048,  2560,  3072,  3584,  4096,  5120,  6144,
    7168, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768};

#define SLAB_MAX_BLOCKS 128u
#define SLAB_TARGET (64u * 1024u)

uint32_t tp__class_size(unsigned cls) {
  return class_sizes[cls];
}

/* The class of each size in 512-byte steps, so that the fast path looks a
 * class up instead of searching for it. */
static const uint8_t class_of_steps[TP_SMALL_MAX / TP_GRANULE + 1] = {
    0,  0,  1,  2,  3,  4,  5,  6,  7,  8,  8,  9,  9,  10, 10, 11, 11,
    12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15, 16,
    16, 16, 16, 16, 16, 16, 16, 17, 17, 17, 17, 17, 17, 17, 17, 18, 18,
    18, 18, 18, 18, 18, 18, 19, 19, 19, 19, 19, 19, 19, 19};

unsigned tp__class_of(size_t rounded) {
  return class_of_steps[rounded >> TP_GRANULE_SHIFT];
}

static uint32_t blocks_per_slab(uint32_t bsize) {
  uint32_t n = SLAB_TARGET / bsize;
  return n < 8 ? 8 : n > SLAB_MAX_BLOCKS ? SLAB_MAX_BLOCKS : n;
}

static void list_add(tp__pool *p, tp__slab *s) {
  if (s->listed)
    return;
  s->prev = NULL;
  s->next = p->partial[s->cls];
  if (s->next)
    s->next->prev = s;
  p->partial[s->cls] = s;
  s->listed = true;
}

static void list_del(tp__pool *p, tp__slab *s) {
  if (!s->listed)
    return;
  if (s->prev)
    s->prev->next = s->next;
  else
    p->partial[s->cls] = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->listed = false;
}

static void bit_set(tp__slab *s, uint32_t i) {
  s->free[i / 64] |= UINT64_C(1) << (i % 64);
  s->nfree++;
}

/* Makes a slab of class `cls` from a large block fitted for it. */
static tp_error_t slab_make(tp__pool *p, unsigned cls, tp__block *b) {
  tp__slab *s = p->spare_slabs;
  if (s) {
    p->spare_slabs = s->next;
  } else if ((s = calloc(1, sizeof *s)) != NULL) {
    s->req = calloc(SLAB_MAX_BLOCKS, sizeof *s->req);
    if (!s->req) {
      free(s);
      s = NULL;
    }
  }
  TP_RETURN_IF(!s, TP_ERROR_OUT_OF_MEMORY);
  _Atomic uint32_t *req = s->req;
  memset(s, 0, sizeof *s);
  s->req = req;
  s->block = b;
  s->base = b->addr;
  s->cls = cls;
  s->bsize = class_sizes[cls];
  s->inv = ((UINT64_C(1) << 40) + s->bsize - 1) / s->bsize;
  s->nblocks = blocks_per_slab(s->bsize);
  for (uint32_t i = 0; i < s->nblocks; i++) {
    _Atomic uintptr_t *e = tp__space_entry(p, s->base + i * s->bsize, true);
    if (!e) {
      while (i-- > 0)
        atomic_store(tp__space_entry(p, s->base + i * s->bsize, false), 0);
      s->next = p->spare_slabs;
      p->spare_slabs = s;
      return TP_ERROR_OUT_OF_MEMORY;
    }
    atomic_store_explicit(&s->req[i], 0, memory_order_relaxed);
    atomic_store_explicit(e, (uintptr_t)s | 1u, memory_order_release);
  }
  /* Carved from a free still pending for other streams, the blocks wait
   * with the block's tag; else they are free for all at once. */
  for (uint32_t i = 0; i < s->nblocks; i++) {
    if (!b->tag.stream) {
      bit_set(s, i);
    } else {
      tp__centry e = {s->base + (uintptr_t)i * s->bsize, s, b->tag.epoch,
                      b->tag.lseq};
      tp__slab_put(p, cls, &e, b->tag.stream);
    }
  }
  tp__tag_clear(&b->tag);
  b->slab = s;
  atomic_store_explicit(&b->state, TP_BLOCK_SLAB, memory_order_relaxed);
  if (s->nfree)
    list_add(p, s);
  return TP_SUCCESS;
}

/* Returns an empty slab's memory to the large blocks. Its descriptor stays
 * in the pool for reuse: a racing bad free may still read it. */
static void slab_unmake(tp__pool *p, tp__slab *s) {
  list_del(p, s);
  for (uint32_t i = 0; i < s->nblocks; i++)
    atomic_store_explicit(tp__space_entry(p, s->base + i * s->bsize, false), 0,
                          memory_order_release);
  tp__block *b = s->block;
  b->slab = NULL;
  b->tag = (tp__tag){0};
  tp__block_release(p, b);
  s->block = NULL;
  s->next = p->spare_slabs;
  p->spare_slabs = s;
}

static bool pending_usable(tp__pool *p, tp__stream *a, const tp__tag *t) {
  return t->stream == a || tp__stream_done(t) ||
         (atomic_load_explicit(&p->follow_events, memory_order_relaxed) &&
          tp__stream_follows(a, t));
}

static void pending_remove(tp__pool *p, unsigned cls, uint32_t i) {
  tp__pending *v = p->pending[cls];
  if (v[i].tag.stream)
    tp__stream_unref(v[i].tag.stream);
  v[i] = v[--p->npending[cls]];
}

/* Free, completed blocks from the class's slabs, taken from one group of
 * 16 neighbours: the bytes-asked words of a group share a cache line, which
 * then stays with the one stream that caches the group. */
static uint32_t take_ready(tp__pool *p, unsigned cls, tp__centry *out,
                           uint32_t want) {
  tp__slab *s = p->partial[cls];
  if (!s)
    return 0;
  unsigned w = s->free[0] ? 0 : 1;
  unsigned shift = (unsigned)__builtin_ctzll(s->free[w]) / 16 * 16;
  uint64_t group = (s->free[w] >> shift) & 0xffff;
  uint32_t n = 0;
  while (group && n < want) {
    uint32_t i = w * 64 + shift + (uint32_t)__builtin_ctzll(group);
    group &= group - 1;
    s->free[w] &= ~(UINT64_C(1) << (i % 64));
    s->nfree--;
    out[n++] = (tp__centry){s->base + (uintptr_t)i * s->bsize, s, 0, 0};
  }
  if (!s->nfree)
    list_del(p, s);
  return n;
}

/* A pending block `a` may use: its own, completed, or one it follows; with
 * `deps`, any, after making `a` wait for its free. It is handed out at once,
 * never cached, so that its tag is not lost. */
static bool take_pending(tp__pool *p, tp__stream *a, unsigned cls, bool deps,
                         tp__centry *out) {
  for (uint32_t i = 0; i < p->npending[cls]; i++) {
    tp__pending *e = &p->pending[cls][i];
    if (!pending_usable(p, a, &e->tag) &&
        (!deps || tp__stream_make_wait(a, &e->tag) != TP_SUCCESS))
      continue;
    out[0] = (tp__centry){e->slab->base + (uintptr_t)e->idx * e->slab->bsize,
                          e->slab, 0, 0};
    pending_remove(p, cls, i);
    return true;
  }
  return false;
}

/* A new slab for the class, carved from a large block. */
static tp_error_t slab_grow(tp__pool *p, tp__stream *a, unsigned cls,
                            bool grow) {
  uint32_t bsize = class_sizes[cls];
  tp__block *b = NULL;
  TP_FORWARD(
      tp__large_get(p, a, (size_t)bsize * blocks_per_slab(bsize), grow, &b));
  tp_error_t err = slab_make(p, cls, b);
  if (err != TP_SUCCESS)
    tp__block_release(p, b);
  return err;
}

/* The reuse order of DESIGN.md for small blocks: completed or own blocks,
 * completed ones found by polling, a slab from free memory (after the
 * other streams' caches were given back), a pending block behind a
 * dependency, and only then a slab from new memory. */
uint32_t tp__slab_take(tp__pool *p, tp__stream *a, unsigned cls,
                       tp__centry *out, uint32_t want, tp_error_t *err) {
  bool opportunistic =
      atomic_load_explicit(&p->opportunistic, memory_order_relaxed);
  bool deps = atomic_load_explicit(&p->internal_deps, memory_order_relaxed);
  *err = TP_ERROR_OUT_OF_MEMORY;
  for (int stage = 0; stage < 4; stage++) {
    uint32_t n = take_ready(p, cls, out, want);
    if (n)
      return n;
    if (take_pending(p, a, cls, false, out))
      return 1;
    switch (stage) {
    case 0:
      if (opportunistic)
        tp__slab_settle(p, true, false);
      break;
    case 1: *err = slab_grow(p, a, cls, false); break;
    case 2:
      if (deps && take_pending(p, a, cls, true, out))
        return 1;
      *err = slab_grow(p, a, cls, true);
      break;
    default: break;
    }
  }
  return 0;
}

void tp__slab_put(tp__pool *p, unsigned cls, const tp__centry *e,
                  tp__stream *s) {
  tp__slab *slab = e->owner;
  uint32_t idx = (uint32_t)tp__slab_index(slab, e->addr);
  tp__tag t = {s, e->epoch, e->lseq};
  if (!e->epoch || tp__stream_done(&t)) {
    bit_set(slab, idx);
    list_add(p, slab);
    return;
  }
  if (!TP_RESERVE(p->pending[cls], p->npending[cls], p->cappending[cls])) {
    /* No room to remember the tag: wait for the free instead of losing it. */
    (void)tp__stream_wait_host(&t);
    bit_set(slab, idx);
    list_add(p, slab);
    return;
  }
  tp__stream_ref(s);
  p->pending[cls][p->npending[cls]++] = (tp__pending){slab, idx, t};
}

void tp__slab_settle(tp__pool *p, bool poll, bool release_empty) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++) {
    for (uint32_t i = 0; i < p->npending[cls];) {
      tp__pending *e = &p->pending[cls][i];
      if (!tp__stream_done(&e->tag) && !(poll && tp__stream_poll(&e->tag))) {
        i++;
        continue;
      }
      tp__slab *s = e->slab;
      bit_set(s, e->idx);
      list_add(p, s);
      pending_remove(p, cls, i);
    }
    if (!release_empty)
      continue;
    for (tp__slab *s = p->partial[cls], *next; s; s = next) {
      next = s->next;
      if (s->nfree == s->nblocks)
        slab_unmake(p, s);
    }
  }
}

void tp__slab_fini(tp__pool *p) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++) {
    while (p->npending[cls])
      pending_remove(p, cls, 0);
    free(p->pending[cls]);
    p->pending[cls] = NULL;
    p->cappending[cls] = 0;
  }
  while (p->spare_slabs) {
    tp__slab *s = p->spare_slabs;
    p->spare_slabs = s->next;
    free((void *)s->req);
    free(s);
  }
}
