/* The free-range index for large blocks: size-segregated bins searched for
 * the best fit, block descriptors split and merged in address order, and the
 * tags that say which stream's free a free range still waits on. All under
 * the pool lock. */
#include <string.h>

#include "pool/pool.h"

tp__block *tp__block_new(tp__pool *p) {
  tp__block *b = p->spare_blocks;
  if (b)
    p->spare_blocks = b->fnext;
  else
    b = malloc(sizeof *b);
  if (!b)
    return NULL;
  memset(b, 0, sizeof *b);
  return b;
}

/* Descriptors are recycled within the pool, never returned to libc while it
 * lives, so that a racing bad free reads a descriptor, not freed memory. */
void tp__block_recycle(tp__pool *p, tp__block *b) {
  b->fnext = p->spare_blocks;
  p->spare_blocks = b;
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
}

/* Sixteen bins per power of two above 8 KiB, exact below: a bin's blocks
 * differ by at most a sixteenth, which keeps the scan for the best fit in a
 * bin short. */
unsigned tp__bin_of(size_t size) {
  uint64_t g = size >> TP_GRANULE_SHIFT;
  if (g < 16)
    return (unsigned)g;
  unsigned e = 63u - (unsigned)__builtin_clzll(g);
  unsigned bin = 16 + (e - 4) * 16 + (unsigned)((g >> (e - 4)) & 15);
  return bin < TP_NBINS ? bin : TP_NBINS - 1;
}

void tp__bin_insert(tp__pool *p, tp__block *b) {
  unsigned bin = tp__bin_of(b->size);
  b->bin = (uint16_t)bin;
  b->fprev = NULL;
  b->fnext = p->bins[bin];
  if (b->fnext)
    b->fnext->fprev = b;
  p->bins[bin] = b;
  p->binmap[bin / 64] |= UINT64_C(1) << (bin % 64);
  atomic_store_explicit(&b->state, TP_BLOCK_FREE, memory_order_relaxed);
}

void tp__bin_remove(tp__pool *p, tp__block *b) {
  if (b->fprev)
    b->fprev->fnext = b->fnext;
  else
    p->bins[b->bin] = b->fnext;
  if (b->fnext)
    b->fnext->fprev = b->fprev;
  if (!p->bins[b->bin])
    p->binmap[b->bin / 64] &= ~(UINT64_C(1) << (b->bin % 64));
  b->fprev = b->fnext = NULL;
}

static size_t chunk_of(const tp__pool *p, uintptr_t addr) {
  return (addr - p->base) / p->gran;
}

/* Keeps the segment-edge pointers of the chunk map true for `b`. */
static void seg_fix(tp__pool *p, tp__block *b) {
  if (!b->prev)
    p->chunks[chunk_of(p, b->addr)].seg_first = b;
  if (!b->next)
    p->chunks[chunk_of(p, b->addr + b->size - 1)].seg_last = b;
}

void tp__segment_link(tp__pool *p, tp__block *b) {
  size_t c0 = chunk_of(p, b->addr), c1 = chunk_of(p, b->addr + b->size);
  b->prev =
      c0 > 0 && p->chunks[c0 - 1].phys ? p->chunks[c0 - 1].seg_last : NULL;
  b->next =
      c1 < p->nchunks && p->chunks[c1].phys ? p->chunks[c1].seg_first : NULL;
  if (b->prev)
    b->prev->next = b;
  if (b->next)
    b->next->prev = b;
  seg_fix(p, b);
}

tp__block *tp__block_split(tp__pool *p, tp__block *b, size_t size) {
  if (b->size - size < TP_GRANULE)
    return NULL;
  tp__block *n = tp__block_new(p);
  if (!n)
    return NULL; /* the block stays whole: a little waste, no failure */
  n->addr = b->addr + size;
  n->size = b->size - size;
  n->tag = b->tag;
  if (n->tag.stream)
    tp__stream_ref(n->tag.stream);
  atomic_store_explicit(&n->state,
                        atomic_load_explicit(&b->state, memory_order_relaxed),
                        memory_order_relaxed);
  n->prev = b;
  n->next = b->next;
  if (n->next)
    n->next->prev = n;
  b->next = n;
  b->size = size;
  seg_fix(p, n);
  return n;
}

void tp__tag_clear(tp__tag *t) {
  if (t->stream)
    tp__stream_unref(t->stream);
  *t = (tp__tag){0};
}

static bool is_free(const tp__block *b) {
  return b &&
         atomic_load_explicit(&b->state, memory_order_relaxed) == TP_BLOCK_FREE;
}

/* Whether two adjacent free ranges may become one: both completed, or both
 * pending on the same stream. A completed range never joins a pending one,
 * which would make it wait for that stream's work. */
static bool tags_join(const tp__tag *a, const tp__tag *b) {
  if (!a->stream || !b->stream)
    return !a->stream && !b->stream;
  return a->stream == b->stream;
}

/* Merges `hi` into `lo` (adjacent, both out of the bins). */
static void merge_into(tp__pool *p, tp__block *lo, tp__block *hi) {
  if (!lo->tag.stream) {
    lo->tag = hi->tag;
  } else if (hi->tag.stream) {
    lo->tag.epoch = tp__max_u64(lo->tag.epoch, hi->tag.epoch);
    lo->tag.lseq = tp__max_u64(lo->tag.lseq, hi->tag.lseq);
    tp__stream_unref(hi->tag.stream);
  }
  lo->size += hi->size;
  lo->next = hi->next;
  if (lo->next)
    lo->next->prev = lo;
  seg_fix(p, lo);
  tp__block_recycle(p, hi);
}

tp__block *tp__block_release(tp__pool *p, tp__block *b) {
  tp__block *prev = b->prev, *next = b->next;
  if (is_free(prev) && tags_join(&prev->tag, &b->tag)) {
    tp__bin_remove(p, prev);
    merge_into(p, prev, b);
    b = prev;
  }
  if (is_free(next) && tags_join(&b->tag, &next->tag)) {
    tp__bin_remove(p, next);
    merge_into(p, b, next);
  }
  tp__bin_insert(p, b);
  return b;
}

/* Whether `a` may take free block `b` now: its free completed, was on `a`,
 * or is ordered before `a` through events or the legacy stream. */
static bool usable(tp__pool *p, tp__stream *a, tp__block *b) {
  if (!b->tag.stream || b->tag.stream == a)
    return true;
  if (tp__stream_done(&b->tag)) {
    tp__tag_clear(&b->tag);
    return true;
  }
  return atomic_load_explicit(&p->follow_events, memory_order_relaxed) &&
         tp__stream_follows(a, &b->tag);
}

/* The smallest block of the bin that is at least `size` and passes the
 * filter, lowest address first among equals. */
static tp__block *bin_best(tp__pool *p, tp__stream *a, unsigned bin,
                           size_t size, bool any) {
  tp__block *best = NULL;
  for (tp__block *b = p->bins[bin]; b; b = b->fnext) {
    if (b->size < size)
      continue;
    if (best && (b->size > best->size ||
                 (b->size == best->size && b->addr > best->addr)))
      continue;
    if (any || usable(p, a, b))
      best = b;
  }
  return best;
}

static int next_bin(const tp__pool *p, unsigned from) {
  for (unsigned w = from / 64; w < TP_NBINS / 64; w++) {
    uint64_t m = p->binmap[w];
    if (w == from / 64)
      m &= ~UINT64_C(0) << (from % 64);
    if (m)
      return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
  }
  return -1;
}

/* The tag a taken block keeps: none when its free completed; otherwise
 * "after the work `a` has queued so far", which follows the pending free
 * (as `a`'s own, or through the dependency `a` was just given). Whoever
 * hands part of the block to another stream must honour it. */
static void retag(tp__stream *a, tp__tag *t, bool pending) {
  tp__tag_clear(t);
  if (pending) {
    *t = tp__stream_tag(a);
    tp__stream_ref(a);
  }
}

static bool pending(const tp__tag *t) {
  return t->stream && !tp__stream_done(t);
}

/* Marks `b`, already out of the bins, as taken and gives back all of it
 * beyond its first `size` bytes. It stops being free before the split, so
 * that the rest does not merge back into it; the rest keeps b's own tag. */
static void keep_head(tp__pool *p, tp__block *b, size_t size) {
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
  tp__block *rest = tp__block_split(p, b, size);
  if (rest) {
    atomic_store_explicit(&rest->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(p, rest);
  }
}

/* Takes `size` bytes of `b` out of the bins. From a block that starts its
 * segment and has a neighbour in use, the high end goes, so that the rest
 * stays at the segment's edge where whole chunks of it can be moved or
 * given back, and growth can extend it (bert_train: 1.019 to 1.015). */
static tp__block *take(tp__pool *p, tp__stream *a, tp__block *b, size_t size) {
  tp__bin_remove(p, b);
  tp__block *left = NULL, *got = b;
  if (!b->prev && b->next && b->size - size >= TP_GRANULE) {
    tp__block *high = tp__block_split(p, b, b->size - size);
    if (high) {
      left = b;
      got = high;
    }
  }
  keep_head(p, got, size);
  if (left)
    tp__block_release(p, left);
  retag(a, &got->tag, pending(&got->tag));
  return got;
}

tp__block *tp__fit_take(tp__pool *p, tp__stream *a, size_t size, bool deps) {
  for (int bin = next_bin(p, tp__bin_of(size)); bin >= 0;
       bin = next_bin(p, (unsigned)bin + 1)) {
    tp__block *b = bin_best(p, a, (unsigned)bin, size, deps);
    if (!b)
      continue;
    if (deps && !usable(p, a, b) &&
        tp__stream_make_wait(a, &b->tag) != TP_SUCCESS)
      continue;
    return take(p, a, b, size);
  }
  return NULL;
}

/* Runs of adjacent free blocks that together fit although no single one
 * does: blocks whose tags keep them apart (frees of several streams, or
 * pending and completed ones). Without `deps` only blocks `a` may use now
 * count; with it, `a` waits for each pending one. */
tp__block *tp__fit_take_run(tp__pool *p, tp__stream *a, size_t size,
                            bool deps) {
  tp__block *best = NULL;
  size_t best_total = SIZE_MAX;
  for (int bin = next_bin(p, 0); bin >= 0;
       bin = next_bin(p, (unsigned)bin + 1)) {
    for (tp__block *b = p->bins[bin]; b; b = b->fnext) {
      if (is_free(b->prev) && (deps || usable(p, a, b->prev)))
        continue; /* runs are counted from their first block */
      size_t total = 0;
      for (tp__block *r = b;
           is_free(r) && (deps || usable(p, a, r)) && total < size; r = r->next)
        total += r->size;
      if (total >= size && total < best_total) {
        best = b;
        best_total = total;
      }
    }
  }
  if (!best)
    return NULL;
  size_t before = 0;
  tp__block *last = best;
  for (;; last = last->next) {
    if (!usable(p, a, last) &&
        tp__stream_make_wait(a, &last->tag) != TP_SUCCESS)
      return NULL;
    if (before + last->size >= size)
      break;
    before += last->size;
  }
  /* The last block gives only what is needed; its remainder keeps its own
   * tag, since whoever freed it may still be using it. */
  tp__bin_remove(p, last);
  keep_head(p, last, size - before);
  if (best != last) {
    tp__bin_remove(p, best);
    atomic_store_explicit(&best->state, TP_BLOCK_CACHED, memory_order_relaxed);
  }
  bool was_pending = pending(&best->tag);
  tp__tag_clear(&best->tag);
  for (bool done = best == last; !done;) {
    tp__block *n = best->next;
    done = n == last;
    if (!done)
      tp__bin_remove(p, n);
    was_pending = was_pending || pending(&n->tag);
    tp__tag_clear(&n->tag);
    merge_into(p, best, n);
  }
  retag(a, &best->tag, was_pending);
  return best;
}

static void settle_tag(tp__block *b, bool poll) {
  if (b->tag.stream &&
      (tp__stream_done(&b->tag) || (poll && tp__stream_poll(&b->tag))))
    tp__tag_clear(&b->tag);
}

void tp__fit_settle(tp__pool *p, bool poll) {
  for (size_t c = tp__segment_next(p, 0); c < p->nchunks;
       c = tp__segment_next(p, c + 1)) {
    for (tp__block *b = p->chunks[c].seg_first; b; b = b->next) {
      if (!is_free(b))
        continue;
      settle_tag(b, poll);
      bool out = false;
      while (is_free(b->next)) {
        tp__block *n = b->next;
        settle_tag(n, poll);
        if (!tags_join(&b->tag, &n->tag))
          break;
        if (!out)
          tp__bin_remove(p, b);
        out = true;
        tp__bin_remove(p, n);
        merge_into(p, b, n);
      }
      if (out)
        tp__bin_insert(p, b);
    }
  }
}

void tp__fit_fini(tp__pool *p) {
  for (size_t c = p->chunks ? tp__segment_next(p, 0) : p->nchunks;
       c < p->nchunks; c = tp__segment_next(p, c + 1)) {
    for (tp__block *b = p->chunks[c].seg_first, *n; b; b = n) {
      n = b->next;
      if (b->tag.stream)
        tp__stream_unref(b->tag.stream);
      free(b);
    }
  }
  while (p->spare_blocks) {
    tp__block *b = p->spare_blocks;
    p->spare_blocks = b->fnext;
    free(b);
  }
}
