/* Where a pool's large blocks are (blocks.h): descriptors split and merged
 * in address order, size-segregated bins searched for the best fit, the
 * tags of pending frees, and growth and release by whole chunks. */
#include "pool/blocks.h"

#include <string.h>

tp_error_t tp__heap_init(tp__heap *h, tp__space *sp) {
  h->space = sp;
  h->segs = calloc(sp->nchunks, sizeof *h->segs);
  /* An exported pool's importers map its chunks one by one. */
  h->share = sp->kind.handle_types == TP_HANDLE_NONE;
  return h->segs ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
}

tp__block *tp__block_new(tp__heap *h) {
  tp__block *b = h->spare;
  if (b)
    h->spare = b->fnext;
  else
    b = malloc(sizeof *b);
  if (!b)
    return NULL;
  memset(b, 0, sizeof *b);
  return b;
}

/* Descriptors are recycled within the pool, never returned to libc while it
 * lives, so that a racing bad free reads a descriptor, not freed memory. */
void tp__block_recycle(tp__heap *h, tp__block *b) {
  b->fnext = h->spare;
  h->spare = b;
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
}

/* ---- bins -------------------------------------------------------------------
 * Sixteen bins per power of two above 8 KiB, exact below: a bin's blocks
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

void tp__bin_insert(tp__heap *h, tp__block *b) {
  unsigned bin = tp__bin_of(b->size);
  b->bin = (uint16_t)bin;
  b->fprev = NULL;
  b->fnext = h->bins[bin];
  if (b->fnext)
    b->fnext->fprev = b;
  h->bins[bin] = b;
  h->binmap[bin / 64] |= UINT64_C(1) << (bin % 64);
  atomic_store_explicit(&b->state, TP_BLOCK_FREE, memory_order_relaxed);
}

void tp__bin_remove(tp__heap *h, tp__block *b) {
  if (b->fprev)
    b->fprev->fnext = b->fnext;
  else
    h->bins[b->bin] = b->fnext;
  if (b->fnext)
    b->fnext->fprev = b->fprev;
  if (!h->bins[b->bin])
    h->binmap[b->bin / 64] &= ~(UINT64_C(1) << (b->bin % 64));
  b->fprev = b->fnext = NULL;
}

static int next_bin(const tp__heap *h, unsigned from) {
  for (unsigned w = from / 64; w < TP_NBINS / 64; w++) {
    uint64_t m = h->binmap[w];
    if (w == from / 64)
      m &= ~UINT64_C(0) << (from % 64);
    if (m)
      return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
  }
  return -1;
}

/* ---- segments --------------------------------------------------------------
 */

/* Keeps the segment-edge pointers true for `b`. */
static void seg_fix(tp__heap *h, tp__block *b) {
  if (!b->prev)
    h->segs[tp__space_chunk(h->space, b->addr)].first = b;
  if (!b->next)
    h->segs[tp__space_chunk(h->space, b->addr + b->size - 1)].last = b;
}

/* Links a new block covering [addr, addr + size) between the segments
 * mapped beside it. */
void tp__seg_link(tp__heap *h, tp__block *b) {
  const tp__space *sp = h->space;
  size_t c0 = tp__space_chunk(sp, b->addr);
  size_t c1 = tp__space_chunk(sp, b->addr + b->size);
  b->prev =
      c0 > 0 && tp__space_mapped(sp, c0 - 1) ? h->segs[c0 - 1].last : NULL;
  b->next =
      c1 < sp->nchunks && tp__space_mapped(sp, c1) ? h->segs[c1].first : NULL;
  if (b->prev)
    b->prev->next = b;
  if (b->next)
    b->next->prev = b;
  seg_fix(h, b);
}

tp__block *tp__block_split(tp__heap *h, tp__block *b, size_t size) {
  if (b->size - size < TP_GRANULE)
    return NULL;
  tp__block *n = tp__block_new(h);
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
  seg_fix(h, n);
  return n;
}

bool tp__block_is_free(const tp__block *b) {
  return b &&
         atomic_load_explicit(&b->state, memory_order_relaxed) == TP_BLOCK_FREE;
}

/* Whether two adjacent free ranges may become one. Both completed, or both
 * pending on the same free point, lose nothing. Other joins date a range
 * later than its own free: a range pending on a stream joined with a later
 * free of the same stream, or a completed range joined with a range pending
 * on the stream that alone uses the pool (with other streams it would make
 * them wait for that stream's work). The joined range is then usable, by
 * other streams, an event's waiter, a trim or a release, only once the
 * later free completed. They are made only while that stream's own
 * allocation or free works on the heap, for whom the pending part is as
 * good as free and fewer, larger ranges pack better: over the bundled
 * traces, peak reserved / peak used fell on every single-stream one
 * (gpt_train 1.0215 to 1.0154, llama_train 1.0153 to 1.0059; without them
 * gpt2_generate rises from 1.0249 to 1.0378) and chunk moves with it, while
 * joining with other streams cost multistream_train 1.0287 to 1.0319. */
static bool tags_join(const tp__heap *h, const tp__tag *a, const tp__tag *b) {
  if (!a->stream && !b->stream)
    return true;
  if (a->stream == b->stream && a->epoch == b->epoch && a->lseq == b->lseq)
    return true;
  const tp__stream *s = a->stream ? a->stream : b->stream;
  if (s != h->joiner)
    return false;
  if (!a->stream || !b->stream)
    return s == h->sole;
  return a->stream == b->stream;
}

/* Merges `hi` into `lo` (adjacent, both out of the bins). */
void tp__block_merge(tp__heap *h, tp__block *lo, tp__block *hi) {
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
  seg_fix(h, lo);
  tp__block_recycle(h, hi);
}

tp__block *tp__block_release(tp__heap *h, tp__block *b) {
  tp__block *prev = b->prev, *next = b->next;
  if (tp__block_is_free(prev) && tags_join(h, &prev->tag, &b->tag)) {
    tp__bin_remove(h, prev);
    tp__block_merge(h, prev, b);
    b = prev;
  }
  if (tp__block_is_free(next) && tags_join(h, &b->tag, &next->tag)) {
    tp__bin_remove(h, next);
    tp__block_merge(h, b, next);
  }
  tp__bin_insert(h, b);
  return b;
}

/* ---- taking ----------------------------------------------------------------
 */

/* Whether the taker may take `b` without a new dependency. The tag of
 * another stream's free found completed is dropped on the way; the taker's
 * own tags stay until a settle, which keeps its freshly freed blocks apart
 * from completed neighbours (dropping those too was measured worse:
 * bert_train 1.015 to 1.026). */
static bool usable(const tp__taker *t, tp__block *b) {
  if (b->tag.stream && b->tag.stream != t->a && tp__stream_done(&b->tag))
    tp__tag_clear(&b->tag);
  return tp__stream_may_use(t->a, &b->tag, t->follow);
}

/* The smallest block of the bin that is at least `size` and passes the
 * filter, lowest address first among equals. */
static tp__block *bin_best(tp__heap *h, const tp__taker *t, unsigned bin,
                           size_t size) {
  tp__block *best = NULL;
  for (tp__block *b = h->bins[bin]; b; b = b->fnext) {
    if (b->size < size)
      continue;
    if (best && (b->size > best->size ||
                 (b->size == best->size && b->addr > best->addr)))
      continue;
    if (t->deps || usable(t, b))
      best = b;
  }
  return best;
}

bool tp__tag_pending(const tp__tag *t) {
  return t->stream && !tp__stream_done(t);
}

/* The tag a taken block keeps: none when its free completed; otherwise
 * "after the work `a` has queued so far", which follows the pending free
 * (as `a`'s own, or through the dependency `a` was just given). */
void tp__block_retag(tp__stream *a, tp__tag *t, bool was_pending) {
  tp__tag_clear(t);
  if (was_pending) {
    *t = tp__stream_tag(a);
    tp__stream_ref(a);
  }
}

/* Marks `b`, already out of the bins, as taken and gives back all of it
 * beyond its first `size` bytes. It stops being free before the split, so
 * that the rest does not merge back into it; the rest keeps b's own tag. */
static void keep_head(tp__heap *h, tp__block *b, size_t size) {
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
  tp__block *rest = tp__block_split(h, b, size);
  if (rest) {
    atomic_store_explicit(&rest->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(h, rest);
  }
}

/* Takes `size` bytes of `b` out of the bins. From a block that starts its
 * segment and has a neighbour in use, the high end goes, so that the rest
 * stays at the segment's edge where whole chunks of it can be moved or
 * given back, and growth can extend it (bert_train: 1.019 to 1.015). */
static tp__block *take(tp__heap *h, tp__stream *a, tp__block *b, size_t size) {
  tp__bin_remove(h, b);
  tp__block *left = NULL, *got = b;
  if (!b->prev && b->next && b->size - size >= TP_GRANULE) {
    tp__block *high = tp__block_split(h, b, b->size - size);
    if (high) {
      left = b;
      got = high;
    }
  }
  keep_head(h, got, size);
  if (left)
    tp__block_release(h, left);
  tp__block_retag(a, &got->tag, tp__tag_pending(&got->tag));
  return got;
}

tp__block *tp__heap_take(tp__heap *h, const tp__taker *t, size_t size) {
  for (int bin = next_bin(h, tp__bin_of(size)); bin >= 0;
       bin = next_bin(h, (unsigned)bin + 1)) {
    tp__block *b = bin_best(h, t, (unsigned)bin, size);
    if (!b)
      continue;
    if (t->deps && !usable(t, b) &&
        tp__stream_make_wait(t->a, &b->tag) != TP_SUCCESS)
      continue;
    return take(h, t->a, b, size);
  }
  return NULL;
}

tp__block *tp__heap_take_run(tp__heap *h, const tp__taker *t, size_t size) {
  tp__block *best = NULL;
  size_t best_total = SIZE_MAX;
  for (int bin = next_bin(h, 0); bin >= 0;
       bin = next_bin(h, (unsigned)bin + 1)) {
    for (tp__block *b = h->bins[bin]; b; b = b->fnext) {
      if (tp__block_is_free(b->prev) && (t->deps || usable(t, b->prev)))
        continue; /* runs are counted from their first block */
      size_t total = 0;
      for (tp__block *r = b;
           tp__block_is_free(r) && (t->deps || usable(t, r)) && total < size;
           r = r->next)
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
    if (!usable(t, last) &&
        tp__stream_make_wait(t->a, &last->tag) != TP_SUCCESS)
      return NULL;
    if (before + last->size >= size)
      break;
    before += last->size;
  }
  /* The last block gives only what is needed; its remainder keeps its own
   * tag, since whoever freed it may still be using it. */
  tp__bin_remove(h, last);
  keep_head(h, last, size - before);
  if (best != last) {
    tp__bin_remove(h, best);
    atomic_store_explicit(&best->state, TP_BLOCK_CACHED, memory_order_relaxed);
  }
  bool was_pending = tp__tag_pending(&best->tag);
  tp__tag_clear(&best->tag);
  for (bool done = best == last; !done;) {
    tp__block *n = best->next;
    done = n == last;
    if (!done)
      tp__bin_remove(h, n);
    was_pending = was_pending || tp__tag_pending(&n->tag);
    tp__tag_clear(&n->tag);
    tp__block_merge(h, best, n);
  }
  tp__block_retag(t->a, &best->tag, was_pending);
  return best;
}

/* ---- settling
 * ----------------------------------------------------------------
 */

static void settle_tag(tp__block *b, bool poll) {
  if (b->tag.stream && tp__stream_settles(&b->tag, poll))
    tp__tag_clear(&b->tag);
}

void tp__heap_settle(tp__heap *h, bool poll) {
  tp__space *sp = h->space;
  tp__space_settle_ghosts(sp, poll);
  for (size_t c = tp__space_segment_next(sp, 0); c < sp->nchunks;
       c = tp__space_segment_next(sp, c + 1)) {
    for (tp__block *b = h->segs[c].first; b; b = b->next) {
      if (!tp__block_is_free(b))
        continue;
      settle_tag(b, poll);
      bool out = false;
      while (tp__block_is_free(b->next)) {
        tp__block *n = b->next;
        settle_tag(n, poll);
        if (!tags_join(h, &b->tag, &n->tag))
          break;
        if (!out)
          tp__bin_remove(h, b);
        out = true;
        tp__bin_remove(h, n);
        tp__block_merge(h, b, n);
      }
      if (out)
        tp__bin_insert(h, b);
    }
  }
}

bool tp__heap_pending(const tp__heap *h) {
  if (h->space->nghosts)
    return true;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (const tp__block *b = h->bins[bin]; b; b = b->fnext)
      if (b->tag.stream)
        return true;
  return false;
}

void tp__heap_pending_tags(const tp__heap *h, tp__tag **tags, uint32_t *n,
                           uint32_t *cap) {
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (const tp__block *b = h->bins[bin]; b; b = b->fnext)
      if (b->tag.stream &&
          tp__array_room((void **)tags, *n, cap, sizeof **tags)) {
        (*tags)[(*n)++] = b->tag;
        tp__stream_ref(b->tag.stream);
      }
}

void tp__heap_fini(tp__heap *h) {
  const tp__space *sp = h->space;
  size_t end = h->segs && sp && sp->phys ? sp->nchunks : 0;
  for (size_t c = end ? tp__space_segment_next(sp, 0) : 0; c < end;
       c = tp__space_segment_next(sp, c + 1)) {
    for (tp__block *b = h->segs[c].first, *n; b; b = n) {
      n = b->next;
      if (b->tag.stream)
        tp__stream_unref(b->tag.stream);
      free(b);
    }
  }
  while (h->spare) {
    tp__block *b = h->spare;
    h->spare = b->fnext;
    free(b);
  }
  free(h->segs);
  h->segs = NULL;
  free(h->twins);
  h->twins = NULL;
}
