/* Where a pool's small blocks are (slabs.h): size classes, slabs carved
 * from large blocks, their free bits, and the pending list of blocks whose
 * free had not completed when they left a stream cache. */
#include "pool/slabs.h"

#include "common/guard.h"

#include <string.h>

/* 512-byte steps to 4 KiB (the driver's step), then four classes per
 * doubling: at most a quarter wasted, on sizes that are a sliver of any
 * real workload's memory. */
static const uint32_t class_sizes[TP_NCLASSES] = {
    512,  1024, 1536,  2048,  2560,  3072,  3584,  4096,  5120,  6144,
    7168, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768};

#define SLAB_TARGET (64u * 1024u)

uint32_t tp__class_size(unsigned cls) {
  return class_sizes[cls];
}

/* The class of each size in 512-byte steps, so that the fast path looks a
 * class up instead of searching for it. */
const uint8_t tp__class_of_steps[TP_SMALL_MAX / TP_GRANULE + 1] = {
    0,  0,  1,  2,  3,  4,  5,  6,  7,  8,  8,  9,  9,  10, 10, 11, 11,
    12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15, 16,
    16, 16, 16, 16, 16, 16, 16, 17, 17, 17, 17, 17, 17, 17, 17, 18, 18,
    18, 18, 18, 18, 18, 18, 19, 19, 19, 19, 19, 19, 19, 19};

static uint32_t blocks_per_slab(uint32_t bsize) {
  uint32_t n = SLAB_TARGET / bsize;
  return n < 8 ? 8 : n > TP_SLAB_MAX_BLOCKS ? TP_SLAB_MAX_BLOCKS : n;
}

size_t tp__slab_bytes(unsigned cls) {
  return (size_t)class_sizes[cls] * blocks_per_slab(class_sizes[cls]);
}

static void list_add(tp__slabs *ss, tp__slab *s) {
  if (s->listed)
    return;
  s->prev = NULL;
  s->next = ss->partial[s->cls];
  if (s->next)
    s->next->prev = s;
  ss->partial[s->cls] = s;
  s->listed = true;
}

static void list_del(tp__slabs *ss, tp__slab *s) {
  if (!s->listed)
    return;
  if (s->prev)
    s->prev->next = s->next;
  else
    ss->partial[s->cls] = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->listed = false;
}

static void bit_set(tp__slab *s, uint32_t i) {
  s->free[i / 64] |= UINT64_C(1) << (i % 64);
  s->nfree++;
}

/* ---- taking ----------------------------------------------------------------
 */

uint32_t tp__slabs_take_ready(tp__slabs *ss, unsigned cls, tp__centry *out,
                              uint32_t want) {
  tp__slab *s = ss->partial[cls];
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
    list_del(ss, s);
  return n;
}

/* The hold slot of stream s, made (with the stream's reference) where s
 * has none; UINT32_MAX for want of memory. Slots stay where they are while
 * used, so that a pending block names its own; a burst gives back the
 * blocks of one stream, which the last slot found answers at once. */
static uint32_t hold_add(tp__slabs *ss, tp__stream *s) {
  uint32_t slot = ss->hold_last, empty = UINT32_MAX;
  if (slot >= ss->nholds || ss->holds[slot].stream != s) {
    for (slot = 0; slot < ss->nholds && ss->holds[slot].stream != s; slot++)
      if (!ss->holds[slot].stream && empty == UINT32_MAX)
        empty = slot;
  }
  if (slot == ss->nholds) {
    if (empty == UINT32_MAX) {
      if (!TP_ARRAY_ROOM(ss->holds, ss->nholds, ss->capholds))
        return UINT32_MAX;
      empty = ss->nholds++;
    }
    slot = empty;
    tp__stream_ref(s);
    ss->holds[slot] = (tp__slab_hold){s, 0};
  }
  ss->holds[slot].n++;
  ss->hold_last = slot;
  return slot;
}

static void hold_drop(tp__slabs *ss, uint32_t slot) {
  tp__slab_hold *h = &ss->holds[slot];
  if (--h->n)
    return;
  tp__stream_unref(h->stream);
  h->stream = NULL;
}

static void pending_remove(tp__slabs *ss, unsigned cls, uint32_t i) {
  tp__pending *v = ss->pending[cls];
  if (v[i].tag.stream)
    hold_drop(ss, v[i].hold);
  v[i] = v[--ss->npending[cls]];
}

/* A class's pending list this long came from a burst of frees (a stream
 * caches 64 blocks a class): the taker's own pending blocks then leave in a
 * batch, so that a burst of allocations takes the slow path once in 16
 * instead of every time. Shorter lists, as in a training step, leave one
 * block a call: batches there were mostly given back unused by the next
 * large slow path (bench/RESULTS.md, "Small slow paths taking their
 * stream's pending blocks in a batch"). */
#define PENDING_BURST 256u

uint32_t tp__slabs_take_pending(tp__slabs *ss, unsigned cls, const tp__taker *t,
                                tp__centry *out, uint32_t want) {
  if (ss->npending[cls] < PENDING_BURST)
    want = 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < ss->npending[cls] && n < want;) {
    tp__pending *e = &ss->pending[cls][i];
    /* The first block may be anyone's the taker may use; the rest are its
     * own frees, which keep their tags in the cache entries so that a
     * drain gives them back pending as they were. */
    bool own = e->tag.stream == t->a;
    if (n > 0 ? !own
              : !tp__stream_may_use(t->a, &e->tag, t->follow) &&
                    (!t->deps ||
                     tp__stream_make_wait(t->a, &e->tag) != TP_SUCCESS)) {
      i++;
      continue;
    }
    bool kept = n > 0;
    out[n] =
        (tp__centry){e->slab->base + (uintptr_t)e->idx * e->slab->bsize,
                     e->slab, kept ? e->tag.epoch : 0, kept ? e->tag.lseq : 0};
    n++;
    pending_remove(ss, cls, i); /* the last entry moves to i */
  }
  return n;
}

/* ---- making and unmaking
 * ------------------------------------------------------
 */

/* Keeps an unmade descriptor for reuse, stamped: a free that read one of
 * its granule entries before they were cleared may still be on its way to
 * a bytes-asked word. */
static void spare_put(tp__slabs *ss, tp__slab *s) {
  s->spare_since = tp__guard_stamp();
  s->next = NULL;
  if (ss->spare_last)
    ss->spare_last->next = s;
  else
    ss->spare = s;
  ss->spare_last = s;
}

/* The oldest spare descriptor, where no thread inside the library still
 * holds it from before it went spare: reused sooner, a free that decoded
 * an old entry would take another slab's block (a double free racing the
 * unmaking, a review found). Else a new one. */
static tp__slab *spare_take(tp__slabs *ss) {
  tp__slab *s = ss->spare;
  if (s && tp__guard_quiet_since(s->spare_since)) {
    ss->spare = s->next;
    if (!ss->spare)
      ss->spare_last = NULL;
    return s;
  }
  s = aligned_alloc(_Alignof(tp__slab), sizeof *s);
  if (s)
    memset(s, 0, sizeof *s);
  return s;
}

tp_error_t tp__slabs_make(tp__slabs *ss, unsigned cls, tp__block *b) {
  tp__space *sp = ss->heap->space;
  tp__slab *s = spare_take(ss);
  TP_RETURN_IF(!s, TP_ERROR_OUT_OF_MEMORY);
  /* The bytes-asked words stay as they are, all 0 in a spare slab (it
   * went empty): a racing bad free may still read them. */
  memset(s, 0, offsetof(tp__slab, req));
  s->block = b;
  s->base = b->addr;
  s->cls = cls;
  s->bsize = class_sizes[cls];
  s->inv = ((UINT64_C(1) << 40) + s->bsize - 1) / s->bsize;
  s->nblocks = blocks_per_slab(s->bsize);
  for (uint32_t i = 0; i < s->nblocks; i++) {
    _Atomic uintptr_t *e = tp__space_entry(sp, s->base + i * s->bsize, true);
    if (!e) {
      while (i-- > 0)
        atomic_store(tp__space_entry(sp, s->base + i * s->bsize, false), 0);
      spare_put(ss, s);
      return TP_ERROR_OUT_OF_MEMORY;
    }
    atomic_store_explicit(&s->req[i], 0, memory_order_relaxed);
    atomic_store_explicit(e, tp__slab_entry(s, i), memory_order_release);
  }
  /* Carved from a free still pending for other streams, the blocks wait
   * with the block's tag; else they are free for all at once. */
  for (uint32_t i = 0; i < s->nblocks; i++) {
    if (!b->tag.stream) {
      bit_set(s, i);
    } else {
      tp__centry e = {s->base + (uintptr_t)i * s->bsize, s, b->tag.epoch,
                      b->tag.lseq};
      tp__slabs_put(ss, cls, &e, b->tag.stream);
    }
  }
  tp__tag_clear(&b->tag);
  b->slab = s;
  atomic_store_explicit(&b->state, TP_BLOCK_SLAB, memory_order_relaxed);
  if (s->nfree)
    list_add(ss, s);
  return TP_SUCCESS;
}

/* Returns an empty slab's memory to the large blocks. Its descriptor stays
 * in the pool for reuse (spare_take): a racing bad free may still read it. */
static void slab_unmake(tp__slabs *ss, tp__slab *s) {
  list_del(ss, s);
  for (uint32_t i = 0; i < s->nblocks; i++)
    atomic_store_explicit(
        tp__space_entry(ss->heap->space, s->base + i * s->bsize, false), 0,
        memory_order_release);
  tp__block *b = s->block;
  b->slab = NULL;
  b->tag = (tp__tag){0};
  tp__block_release(ss->heap, b);
  s->block = NULL;
  spare_put(ss, s);
}

/* ---- giving back and settling
 * -------------------------------------------------
 */

void tp__slabs_put(tp__slabs *ss, unsigned cls, const tp__centry *e,
                   tp__stream *s) {
  tp__slab *slab = e->owner;
  uint32_t idx = (uint32_t)tp__slab_index(slab, e->addr);
  tp__tag t = {s, e->epoch, e->lseq};
  if (!e->epoch || tp__stream_done(&t)) {
    bit_set(slab, idx);
    list_add(ss, slab);
    return;
  }
  uint32_t hold = UINT32_MAX;
  if (!TP_ARRAY_ROOM(ss->pending[cls], ss->npending[cls],
                     ss->cappending[cls]) ||
      (hold = hold_add(ss, s)) == UINT32_MAX) {
    /* No room to remember the tag: wait for the free instead of losing it. */
    (void)tp__stream_wait_host(&t);
    bit_set(slab, idx);
    list_add(ss, slab);
    return;
  }
  ss->pending[cls][ss->npending[cls]++] = (tp__pending){slab, idx, hold, t};
}

void tp__slabs_settle(tp__slabs *ss, bool poll, bool release_empty) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++) {
    for (uint32_t i = 0; i < ss->npending[cls];) {
      tp__pending *e = &ss->pending[cls][i];
      if (!tp__stream_settles(&e->tag, poll)) {
        i++;
        continue;
      }
      tp__slab *s = e->slab;
      bit_set(s, e->idx);
      list_add(ss, s);
      pending_remove(ss, cls, i);
    }
    if (!release_empty)
      continue;
    for (tp__slab *s = ss->partial[cls], *next; s; s = next) {
      next = s->next;
      if (s->nfree == s->nblocks)
        slab_unmake(ss, s);
    }
  }
}

bool tp__slabs_pending(const tp__slabs *ss) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++)
    if (ss->npending[cls])
      return true;
  return false;
}

void tp__slabs_pending_tags(const tp__slabs *ss, tp__tag **tags, uint32_t *n,
                            uint32_t *cap) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++)
    for (uint32_t i = 0; i < ss->npending[cls]; i++)
      if (tp__array_room((void **)tags, *n, cap, sizeof **tags)) {
        (*tags)[(*n)++] = ss->pending[cls][i].tag;
        tp__stream_ref(ss->pending[cls][i].tag.stream);
      }
}

void tp__slabs_fini(tp__slabs *ss) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++) {
    while (ss->npending[cls])
      pending_remove(ss, cls, 0);
    free(ss->pending[cls]);
    ss->pending[cls] = NULL;
    ss->cappending[cls] = 0;
  }
  while (ss->spare) {
    tp__slab *s = ss->spare;
    ss->spare = s->next;
    free(s);
  }
  free(ss->holds);
  ss->holds = NULL;
  ss->nholds = ss->capholds = 0;
}

bool tp__slabs_holds_agree(const tp__slabs *ss) {
  uint32_t *seen = calloc(ss->nholds ? ss->nholds : 1, sizeof *seen);
  if (!seen)
    return true; /* nothing to count with: not a disagreement */
  bool ok = true;
  for (unsigned cls = 0; ok && cls < TP_NCLASSES; cls++) {
    for (uint32_t i = 0; ok && i < ss->npending[cls]; i++) {
      const tp__pending *e = &ss->pending[cls][i];
      if (!e->tag.stream)
        continue;
      ok = e->hold < ss->nholds && ss->holds[e->hold].stream == e->tag.stream;
      if (ok)
        seen[e->hold]++;
    }
  }
  for (uint32_t h = 0; ok && h < ss->nholds; h++)
    ok = seen[h] == ss->holds[h].n && (seen[h] > 0) == !!ss->holds[h].stream;
  free(seen);
  return ok;
}
