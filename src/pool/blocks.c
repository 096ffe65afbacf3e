/* Where a pool's large blocks are (blocks.h): descriptors split and merged
 * in address order, size-segregated bins searched for the best fit, the
 * tags of pending frees, and growth and release by whole chunks. */
#include "pool/blocks.h"

#include <string.h>

tp_error_t tp__heap_init(tp__heap *h, tp__space *sp) {
  h->space = sp;
  h->segs = calloc(sp->nchunks, sizeof *h->segs);
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

static void bin_insert(tp__heap *h, tp__block *b) {
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

static void bin_remove(tp__heap *h, tp__block *b) {
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
static void seg_link(tp__heap *h, tp__block *b) {
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

static tp__block *block_split(tp__heap *h, tp__block *b, size_t size) {
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

static bool is_free(const tp__block *b) {
  return b &&
         atomic_load_explicit(&b->state, memory_order_relaxed) == TP_BLOCK_FREE;
}

/* Whether two adjacent free ranges may become one: both completed, or both
 * pending on the same stream. A completed range joins one pending on the
 * stream (and takes its tag) only while that stream alone uses the pool:
 * with others it would make them wait for that stream's work. Joining there
 * leaves fewer, larger ranges: over the bundled traces, peak reserved / peak
 * used fell on every single-stream one (gpt_train 1.0215 to 1.0154,
 * llama_train 1.0153 to 1.0059) and chunk moves with it, while joining always
 * cost multistream_train 1.0287 to 1.0319. */
static bool tags_join(const tp__heap *h, const tp__tag *a, const tp__tag *b) {
  if (!a->stream || !b->stream)
    return (!a->stream && !b->stream) ||
           (h->sole && (a->stream == h->sole || b->stream == h->sole));
  return a->stream == b->stream;
}

/* Merges `hi` into `lo` (adjacent, both out of the bins). */
static void merge_into(tp__heap *h, tp__block *lo, tp__block *hi) {
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
  if (is_free(prev) && tags_join(h, &prev->tag, &b->tag)) {
    bin_remove(h, prev);
    merge_into(h, prev, b);
    b = prev;
  }
  if (is_free(next) && tags_join(h, &b->tag, &next->tag)) {
    bin_remove(h, next);
    merge_into(h, b, next);
  }
  bin_insert(h, b);
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

static bool pending(const tp__tag *t) {
  return t->stream && !tp__stream_done(t);
}

/* The tag a taken block keeps: none when its free completed; otherwise
 * "after the work `a` has queued so far", which follows the pending free
 * (as `a`'s own, or through the dependency `a` was just given). */
static void retag(tp__stream *a, tp__tag *t, bool was_pending) {
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
  tp__block *rest = block_split(h, b, size);
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
  bin_remove(h, b);
  tp__block *left = NULL, *got = b;
  if (!b->prev && b->next && b->size - size >= TP_GRANULE) {
    tp__block *high = block_split(h, b, b->size - size);
    if (high) {
      left = b;
      got = high;
    }
  }
  keep_head(h, got, size);
  if (left)
    tp__block_release(h, left);
  retag(a, &got->tag, pending(&got->tag));
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
      if (is_free(b->prev) && (t->deps || usable(t, b->prev)))
        continue; /* runs are counted from their first block */
      size_t total = 0;
      for (tp__block *r = b;
           is_free(r) && (t->deps || usable(t, r)) && total < size; r = r->next)
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
  bin_remove(h, last);
  keep_head(h, last, size - before);
  if (best != last) {
    bin_remove(h, best);
    atomic_store_explicit(&best->state, TP_BLOCK_CACHED, memory_order_relaxed);
  }
  bool was_pending = pending(&best->tag);
  tp__tag_clear(&best->tag);
  for (bool done = best == last; !done;) {
    tp__block *n = best->next;
    done = n == last;
    if (!done)
      bin_remove(h, n);
    was_pending = was_pending || pending(&n->tag);
    tp__tag_clear(&n->tag);
    merge_into(h, best, n);
  }
  retag(t->a, &best->tag, was_pending);
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
      if (!is_free(b))
        continue;
      settle_tag(b, poll);
      bool out = false;
      while (is_free(b->next)) {
        tp__block *n = b->next;
        settle_tag(n, poll);
        if (!tags_join(h, &b->tag, &n->tag))
          break;
        if (!out)
          bin_remove(h, b);
        out = true;
        bin_remove(h, n);
        merge_into(h, b, n);
      }
      if (out)
        bin_insert(h, b);
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

/* ---- growth and release by whole chunks
 * --------------------------------------
 */

/* The whole chunks inside free block b: [*c0, *c1). */
static bool whole_chunks(const tp__space *sp, const tp__block *b, size_t *c0,
                         size_t *c1) {
  size_t lo = tp__align_up(b->addr - sp->base, sp->gran);
  size_t hi = (b->addr + b->size - sp->base) / sp->gran * sp->gran;
  if (hi <= lo)
    return false;
  *c0 = lo / sp->gran;
  *c1 = hi / sp->gran;
  return true;
}

/* Whether the chunks of free block `b` may move for the taker (NULL: only
 * completed ones, as release wants): completed, or pending on a free the
 * taker may use now, whose chunks then move in stream order (the old
 * mappings stay until the free completed). */
static bool movable(const tp__block *b, const tp__taker *t) {
  if (!is_free(b))
    return false;
  if (!b->tag.stream)
    return true;
  return t && !t->deps && tp__stream_may_use(t->a, &b->tag, t->follow);
}

/* Removes whole chunks [c0, c1) from free block b (which must hold them),
 * leaving the pieces on either side free, and unmaps them. The physical
 * chunks go to phys[]. */
static tp_error_t carve(tp__heap *h, tp__block *b, size_t c0, size_t c1,
                        tp__phys *phys) {
  tp__space *sp = h->space;
  uintptr_t lo = b->addr, hi = b->addr + b->size;
  uintptr_t a = tp__space_addr(sp, c0), z = tp__space_addr(sp, c1);
  tp__block *right = NULL;
  if (z < hi && !(right = tp__block_new(h)))
    return TP_ERROR_OUT_OF_MEMORY;
  tp_error_t err = b->tag.stream ? tp__space_detach(sp, c0, c1, phys, &b->tag)
                                 : tp__space_unmap(sp, c0, c1, phys);
  if (err != TP_SUCCESS) {
    if (right)
      tp__block_recycle(h, right);
    return err;
  }
  bin_remove(h, b);
  tp__block *prev = b->prev, *next = b->next;
  for (size_t c = c0; c < c1; c++)
    h->segs[c] = (tp__seg){0};
  /* The pieces on either side were freed at the same point as b. */
  if (right) {
    right->tag = b->tag;
    if (right->tag.stream)
      tp__stream_ref(right->tag.stream);
    right->addr = z;
    right->size = hi - z;
    right->next = next;
    if (next)
      next->prev = right;
    else
      h->segs[tp__space_chunk(sp, hi - 1)].last = right;
    h->segs[c1].first = right;
    bin_insert(h, right);
  } else if (next) {
    next->prev = NULL;
    h->segs[c1].first = next;
  }
  if (lo < a) {
    b->size = a - lo;
    b->next = NULL;
    h->segs[c0 - 1].last = b;
    bin_insert(h, b);
  } else {
    if (prev) {
      prev->next = NULL;
      h->segs[c0 - 1].last = prev;
    }
    tp__tag_clear(&b->tag);
    tp__block_recycle(h, b);
  }
  return TP_SUCCESS;
}

/* Takes up to `want` chunks that may move for the taker (see movable) out
 * of the bins, largest blocks first, from their high end. `keep` is a block
 * not to touch. Returns how many were taken; *pending tells whether any
 * came from a pending free. */
static size_t gather(tp__heap *h, const tp__taker *t, size_t want,
                     const tp__block *keep, tp__phys *phys, bool *pending,
                     tp_error_t *err) {
  size_t got = 0;
  for (int bin = TP_NBINS - 1; bin >= 0 && got < want; bin--) {
    tp__block *b = h->bins[bin];
    while (b && got < want) {
      tp__block *next = b->fnext;
      size_t c0, c1;
      if (b != keep && movable(b, t) && whole_chunks(h->space, b, &c0, &c1)) {
        if (c1 - c0 > want - got)
          c0 = c1 - (want - got);
        bool was_pending = b->tag.stream != NULL;
        *err = carve(h, b, c0, c1, phys + got);
        if (*err != TP_SUCCESS)
          return got;
        *pending = *pending || was_pending;
        got += c1 - c0;
      }
      b = next;
    }
  }
  return got;
}

/* Counts the chunks that gather() could take. */
static size_t count_movable(const tp__heap *h, const tp__taker *t,
                            const tp__block *keep) {
  size_t n = 0;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (const tp__block *b = h->bins[bin]; b; b = b->fnext) {
      size_t c0, c1;
      if (b != keep && movable(b, t) && whole_chunks(h->space, b, &c0, &c1))
        n += c1 - c0;
    }
  return n;
}

/* Where new chunks go: extending a free block the taker may use at a
 * segment's end (or start) when the chunks beside it are unmapped, else a
 * fresh run at the lowest address that has room. */
typedef struct placement {
  size_t c0, n;
  tp__block *extend; /* NULL for a fresh run */
} placement;

static bool place(const tp__heap *h, const tp__taker *t, size_t size,
                  placement *out) {
  const tp__space *sp = h->space;
  size_t fresh = tp__align_up(size, sp->gran) / sp->gran;
  out->c0 = 0;
  bool found = tp__space_first_run(sp, fresh, &out->c0);
  out->n = fresh;
  out->extend = NULL;
  for (unsigned bin = 0; bin < TP_NBINS; bin++) {
    for (tp__block *b = h->bins[bin]; b; b = b->fnext) {
      if (!movable(b, t) || b->size >= size || (b->next && b->prev))
        continue;
      size_t n = tp__align_up(size - b->size, sp->gran) / sp->gran;
      if (found && n >= out->n)
        continue;
      size_t after = tp__space_chunk(sp, b->addr + b->size);
      size_t before = tp__space_chunk(sp, b->addr);
      if (!b->next && tp__space_unmapped(sp, after, n)) {
        *out = (placement){after, n, b};
        found = true;
      } else if (!b->prev && before >= n &&
                 tp__space_unmapped(sp, before - n, n)) {
        *out = (placement){before - n, n, b};
        found = true;
      }
    }
  }
  return found;
}

/* Joins freshly mapped chunks [pl->c0, +n) to the block they extend, or
 * makes them a block of their own; returns the block, out of the bins. */
static tp__block *adopt(tp__heap *h, const placement *pl, tp__block *fresh) {
  tp__space *sp = h->space;
  uintptr_t a = tp__space_addr(sp, pl->c0);
  size_t bytes = pl->n * sp->gran;
  tp__block *b = pl->extend;
  if (!b) {
    b = fresh;
    b->addr = a;
    b->size = bytes;
    seg_link(h, b);
    return b;
  }
  bin_remove(h, b);
  if (b->addr > a) { /* growing the segment's first block downwards */
    b->addr = a;
    b->size += bytes;
    tp__block *prev = pl->c0 > 0 && tp__space_mapped(sp, pl->c0 - 1)
                          ? h->segs[pl->c0 - 1].last
                          : NULL;
    b->prev = prev;
    if (prev)
      prev->next = b;
    else
      h->segs[pl->c0].first = b;
  } else {
    b->size += bytes;
    size_t c1 = pl->c0 + pl->n;
    tp__block *next =
        c1 < sp->nchunks && tp__space_mapped(sp, c1) ? h->segs[c1].first : NULL;
    b->next = next;
    if (next)
      next->prev = b;
    else
      h->segs[c1 - 1].last = b;
  }
  return b;
}

tp_error_t tp__heap_grow(tp__heap *h, const tp__taker *t, size_t size,
                         size_t create, tp__block **out) {
  tp__space *sp = h->space;
  placement pl;
  TP_RETURN_IF(!place(h, t, size, &pl), TP_ERROR_OUT_OF_MEMORY);
  if (create > pl.n)
    create = pl.n;
  size_t have = count_movable(h, t, pl.extend);
  if (pl.n - create > have)
    create = pl.n - have;
  uint64_t reserved = atomic_load_explicit(&sp->reserved, memory_order_relaxed);
  TP_RETURN_IF(reserved + (uint64_t)create * sp->gran > sp->limit,
               TP_ERROR_OUT_OF_MEMORY);
  tp__phys *phys = calloc(pl.n, sizeof *phys);
  tp__block *fresh = pl.extend ? NULL : tp__block_new(h);
  if (!phys || (!pl.extend && !fresh)) {
    free(phys);
    if (fresh)
      tp__block_recycle(h, fresh);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  tp_error_t err = TP_SUCCESS;
  bool pending = false;
  size_t made = gather(h, t, pl.n - create, pl.extend, phys, &pending, &err);
  /* The placement stays valid: gathering only takes chunks outside it,
   * and the block it extends was kept out of the gathering. */
  while (err == TP_SUCCESS && made < pl.n)
    if ((err = tp__space_create(sp, &phys[made])) == TP_SUCCESS)
      made++;
  if (err == TP_SUCCESS)
    err = tp__space_map(sp, pl.c0, phys, pl.n);
  if (err != TP_SUCCESS) {
    (void)tp__space_release(sp, phys, made); /* the first failure answers */
    free(phys);
    if (fresh)
      tp__block_recycle(h, fresh);
    return err;
  }
  free(phys);
  tp__block *b = adopt(h, &pl, fresh);
  /* Chunks that moved from pending frees the taker follows are usable in
   * stream order after the taker's work so far, and by others only after
   * that (the tag a taken pending block gets, see retag). */
  if (pending) {
    tp__tag_clear(&b->tag);
    b->tag = tp__stream_tag(t->a);
    tp__stream_ref(t->a);
  }
  *out = tp__block_release(h, b);
  return TP_SUCCESS;
}

tp_error_t tp__heap_release(tp__heap *h, uint64_t keep) {
  tp__space *sp = h->space;
  tp_error_t err = tp__space_release_orphans(sp);
  uint64_t reserved = atomic_load_explicit(&sp->reserved, memory_order_relaxed);
  if (reserved <= keep)
    return err;
  size_t want = (size_t)((reserved - keep + sp->gran - 1) / sp->gran);
  tp__phys *phys = calloc(want, sizeof *phys);
  TP_RETURN_IF(!phys, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t gerr = TP_SUCCESS;
  bool pending = false;
  size_t got = gather(h, NULL, want, NULL, phys, &pending, &gerr);
  tp_error_t rerr = tp__space_release(sp, phys, got);
  free(phys);
  return err != TP_SUCCESS ? err : gerr != TP_SUCCESS ? gerr : rerr;
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
}
