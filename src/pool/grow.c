/* Growth and release of a pool's large-block memory (blocks.h): which
 * chunks move, which are made, where a grown block goes, which go back, and
 * the chunks two segment edges share. Under the pool lock. */
#include "pool/blocks.h"

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
  if (!tp__block_is_free(b))
    return false;
  if (!b->tag.stream)
    return true;
  return t && !t->deps && tp__stream_may_use(t->a, &b->tag, t->follow);
}

/* Takes whole chunks [c0, c1), already unmapped, out of free block b
 * (which holds them), leaving the pieces on either side free; `right` is
 * the descriptor for the piece above them, where there is one. */
static void cut(tp__heap *h, tp__block *b, size_t c0, size_t c1,
                tp__block *right) {
  tp__space *sp = h->space;
  uintptr_t lo = b->addr, hi = b->addr + b->size;
  uintptr_t a = tp__space_addr(sp, c0), z = tp__space_addr(sp, c1);
  tp__bin_remove(h, b);
  tp__block *prev = b->prev, *next = b->next;
  for (size_t c = c0; c < c1; c++)
    h->segs[c] = (tp__seg){0};
  /* The pieces on either side were freed at the same point as b. */
  if (z < hi) {
    right->tag = b->tag;
    if (right->tag.stream)
      tp__stream_ref(right->tag.stream);
    right->addr = z;
    right->size = hi - z;
    right->prev = NULL;
    right->next = next;
    if (next)
      next->prev = right;
    else
      h->segs[tp__space_chunk(sp, hi - 1)].last = right;
    h->segs[c1].first = right;
    tp__bin_insert(h, right);
  } else if (next) {
    next->prev = NULL;
    h->segs[c1].first = next;
  }
  if (lo < a) {
    b->size = a - lo;
    b->next = NULL;
    h->segs[c0 - 1].last = b;
    tp__bin_insert(h, b);
  } else {
    if (prev) {
      prev->next = NULL;
      h->segs[c0 - 1].last = prev;
    }
    tp__tag_clear(&b->tag);
    tp__block_recycle(h, b);
  }
}

/* Removes whole chunks [c0, c1) from free block b and unmaps them (or, for
 * a pending free, leaves their old mappings as ghosts); the physical chunks
 * go to phys[]. */
static tp_error_t carve(tp__heap *h, tp__block *b, size_t c0, size_t c1,
                        tp__phys *phys) {
  tp__space *sp = h->space;
  tp__block *right = NULL;
  if (tp__space_addr(sp, c1) < b->addr + b->size && !(right = tp__block_new(h)))
    return TP_ERROR_OUT_OF_MEMORY;
  tp_error_t err = b->tag.stream ? tp__space_detach(sp, c0, c1, phys, &b->tag)
                                 : tp__space_unmap(sp, c0, c1, phys);
  if (err != TP_SUCCESS) {
    if (right)
      tp__block_recycle(h, right);
    return err;
  }
  cut(h, b, c0, c1, right);
  return TP_SUCCESS;
}

/* Whether gathering may take the whole chunks [*c0, *c1) of free block b
 * for the taker: it holds some, may move (see movable), and is neither
 * `keep` nor `keep2`. */
static bool takable(const tp__heap *h, const tp__taker *t, const tp__block *b,
                    const tp__block *keep, const tp__block *keep2, size_t *c0,
                    size_t *c1) {
  return b != keep && b != keep2 && movable(b, t) &&
         whole_chunks(h->space, b, c0, c1);
}

/* What a free block is to its segment: all of it, an end, or a middle. */
static int segment_part(const tp__block *b) {
  return !b->prev && !b->next ? 0 : !b->prev || !b->next ? 1 : 2;
}

/* Takes up to `want` chunks that may move for the taker (see movable) out
 * of the bins, from their high end: first free blocks that are whole
 * segments, then free ends of segments, then free middles, each largest
 * first. Taking chunks out of a middle splits its segment in two, and each
 * split leaves two partly used chunks at the new edges, which only small
 * blocks fit; a 300-step GPT run that took largest first had split its
 * pool into 138 segments by the end, and held 2% above its peak against
 * 1% at step 20 (1.5% taking middles last). `keep` and `keep2` are blocks
 * not to touch. Returns how many were taken; *pending tells whether any
 * came from a pending free. */
static size_t gather(tp__heap *h, const tp__taker *t, size_t want,
                     const tp__block *keep, const tp__block *keep2,
                     tp__phys *phys, bool *pending, tp_error_t *err) {
  size_t got = 0;
  for (int part = 0; part < 3; part++) {
    for (int bin = TP_NBINS - 1; bin >= 0 && got < want; bin--) {
      tp__block *b = h->bins[bin];
      while (b && got < want) {
        tp__block *next = b->fnext;
        size_t c0, c1;
        if (segment_part(b) == part &&
            takable(h, t, b, keep, keep2, &c0, &c1)) {
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
  }
  return got;
}

/* Counts the chunks that gather() could take. */
static size_t count_movable(const tp__heap *h, const tp__taker *t,
                            const tp__block *keep, const tp__block *keep2) {
  size_t n = 0;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (const tp__block *b = h->bins[bin]; b; b = b->fnext) {
      size_t c0, c1;
      if (takable(h, t, b, keep, keep2, &c0, &c1))
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
  tp__block *bridge; /* the free first block of the segment the run joins */
} placement;

/* How many free chunk slots (neither mapped nor held by a ghost) follow
 * chunk c, up to `max`. */
static size_t unmapped_run(const tp__space *sp, size_t c, size_t max) {
  size_t r = 0;
  while (r < max && c + r < sp->nchunks && !tp__space_occupied(sp, c + r))
    r++;
  return r;
}

/* A segment's free last block `b` and the next segment's free first block,
 * with the unmapped chunks between them, may hold `size` together: mapping
 * those chunks joins the two segments, and the partly used chunks at their
 * facing edges (see gather) become part of one free block again. Only a
 * completed free first block joins, so that the joined block keeps the tag
 * of the rest. Returns the chunks to map, 0 when no join fits. Taking
 * middles last without this: multistream_train 1.0255 to 1.0319. */
static size_t bridge(const tp__heap *h, const tp__taker *t, tp__block *b,
                     size_t size, size_t n, tp__block **head) {
  const tp__space *sp = h->space;
  size_t after = tp__space_chunk(sp, b->addr + b->size);
  size_t r = unmapped_run(sp, after, n);
  if (r == 0 || r >= n || after + r >= sp->nchunks ||
      !tp__space_mapped(sp, after + r))
    return 0;
  tp__block *f = h->segs[after + r].first;
  if (!tp__block_is_free(f) || f->tag.stream || !movable(f, t) ||
      b->size + r * sp->gran + f->size < size)
    return 0;
  *head = f;
  return r;
}

static bool place(const tp__heap *h, const tp__taker *t, size_t size,
                  placement *out) {
  const tp__space *sp = h->space;
  size_t fresh = tp__align_up(size, sp->gran) / sp->gran;
  out->c0 = 0;
  bool found = tp__space_first_run(sp, fresh, &out->c0);
  out->n = fresh;
  out->extend = NULL;
  out->bridge = NULL;
  for (unsigned bin = 0; bin < TP_NBINS; bin++) {
    for (tp__block *b = h->bins[bin]; b; b = b->fnext) {
      if (!movable(b, t) || b->size >= size || (b->next && b->prev))
        continue;
      size_t n = tp__align_up(size - b->size, sp->gran) / sp->gran;
      size_t after = tp__space_chunk(sp, b->addr + b->size);
      size_t before = tp__space_chunk(sp, b->addr);
      /* A join maps fewer chunks than extending b would (see bridge). */
      tp__block *head = NULL;
      size_t r = b->next ? 0 : bridge(h, t, b, size, n, &head);
      if (r > 0 && (!found || r < out->n)) {
        *out = (placement){after, r, b, head};
        found = true;
      }
      if (found && n >= out->n)
        continue;
      if (!b->next && tp__space_unmapped(sp, after, n)) {
        *out = (placement){after, n, b, NULL};
        found = true;
      } else if (!b->prev && before >= n &&
                 tp__space_unmapped(sp, before - n, n)) {
        *out = (placement){before - n, n, b, NULL};
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
    tp__seg_link(h, b);
    return b;
  }
  tp__bin_remove(h, b);
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

/* ---- shared edge chunks ----------------------------------------------------
 * A block that ends inside a chunk of its own leaves the rest of that chunk
 * free, and so does the free start of a segment whose first block is in use
 * beyond it: such partly used chunks at segment edges were most of what a
 * replay held above its peak (gpt2_generate: 19.5 MiB at the peak, in the
 * two edges of nine segments). When a new block's partial chunk uses only
 * the bytes that a segment edge chunk has free, both can be one physical
 * chunk mapped twice, each mapping holding the other's bytes as a shadow.
 * Only completed free bytes are lent; once one mapping holds nothing but
 * completed free bytes, the next synchronize, trim or growth ends the
 * sharing (tp__heap_unshare). */

/* Donor kinds: a segment's free first block (HEAD: its bytes are the
 * chunk's low ones) or free last block (TAIL: the high ones). */
enum { HEAD = 1, TAIL = 2 };
/* Growths of more chunks than this do not share (see tp__heap_grow). */
#define TP_SHARE_CHUNKS 32

static bool twinned(const tp__heap *h, size_t c) {
  for (uint32_t i = 0; i < h->ntwins; i++)
    if (h->twins[i].lo == c || h->twins[i].hi == c)
      return true;
  return false;
}

/* The smallest donor of one of `kinds`, completed, smaller than a chunk, of
 * at least `need` bytes, in a chunk not shared yet, other than `keep`. */
static tp__block *donor(const tp__heap *h, int kinds, size_t need,
                        const tp__block *keep, int *kind) {
  const tp__space *sp = h->space;
  tp__block *best = NULL;
  unsigned top = tp__bin_of(sp->gran);
  for (unsigned bin = tp__bin_of(need); bin <= top; bin++) {
    for (tp__block *b = h->bins[bin]; b; b = b->fnext) {
      if (b->size < need || b->size >= sp->gran || b->tag.stream || b == keep ||
          (best && b->size >= best->size))
        continue;
      int k = !b->prev && b->next ? HEAD : b->prev && !b->next ? TAIL : 0;
      if (!(k & kinds) || twinned(h, tp__space_chunk(sp, b->addr)))
        continue;
      best = b;
      *kind = k;
    }
    if (best)
      break; /* the bins above hold larger blocks */
  }
  return best;
}

/* How a grown range is laid out: the taken block at `at`, and the chunk
 * that shares a donor's physical chunk, if any. */
typedef struct layout {
  uintptr_t at;
  tp__block *donor;
  int kind; /* the donor's */
} layout;

/* Chooses the block's place among the new chunks [pl->c0, +n) and the block
 * they extend: where the placement says or, in a fresh run, at whichever end
 * lets its partial chunk share a donor's (with `share`). */
static layout lay_out(const tp__heap *h, const placement *pl, size_t size,
                      bool share) {
  const tp__space *sp = h->space;
  uintptr_t first = tp__space_addr(sp, pl->c0);
  uintptr_t last = tp__space_addr(sp, pl->c0 + pl->n); /* end of new chunks */
  const tp__block *e = pl->extend;
  layout l = {first, NULL, 0};
  int kinds = 0;
  size_t need = 0;
  bool below = pl->c0 == 0 || !tp__space_mapped(sp, pl->c0 - 1);
  bool above =
      pl->c0 + pl->n == sp->nchunks || !tp__space_mapped(sp, pl->c0 + pl->n);
  if (!e) {
    need = size % sp->gran;
    kinds = (above ? HEAD : 0) | (below ? TAIL : 0);
  } else if (e->addr < first) { /* extended upwards: the block ends in it */
    l.at = e->addr;
    need = (l.at + size - sp->base) % sp->gran;
    kinds = above && l.at + size > first ? HEAD : 0;
  } else { /* extended downwards: the block ends where e does */
    l.at = e->addr + e->size - size;
    need = sp->gran - (l.at - sp->base) % sp->gran;
    kinds = below && l.at < last && need < sp->gran ? TAIL : 0;
  }
  if (!share || !h->share || !kinds || !need || need >= sp->gran)
    return l;
  l.donor = donor(h, kinds, need, e, &l.kind);
  if (l.donor && !e && l.kind == TAIL)
    l.at = last - size;
  return l;
}

/* Room for the descriptors and records a layout may need, so that nothing
 * fails once memory is mapped. */
static bool layout_room(tp__heap *h) {
  tp__block *d[4];
  int n = 0;
  while (n < 4 && (d[n] = tp__block_new(h)))
    n++;
  bool ok = n == 4;
  while (n-- > 0)
    tp__block_recycle(h, d[n]);
  return ok && TP_ARRAY_ROOM(h->twins, h->ntwins, h->captwins) &&
         tp__space_lend_room(h->space) == TP_SUCCESS;
}

static void make_shadow(tp__block *b) {
  tp__tag_clear(&b->tag);
  atomic_store_explicit(&b->state, TP_BLOCK_SHADOW, memory_order_relaxed);
}

/* Gives the grown block b (out of the bins) its layout: the taken block
 * at l->at and, with a donor, the shadows on both sides. Returns the taken
 * block. */
static tp__block *lay(tp__heap *h, const tp__taker *t, tp__block *b,
                      const layout *l, size_t size, size_t c0, size_t n) {
  tp__space *sp = h->space;
  tp__block *low = NULL, *rest = NULL;
  if (l->at > b->addr) {
    low = b;
    b = tp__block_split(h, b, l->at - b->addr);
  }
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
  if (b->size - size >= TP_GRANULE)
    rest = tp__block_split(h, b, size);
  if (l->donor) {
    tp__block *d = l->donor;
    tp__twin tw;
    tp__bin_remove(h, d);
    if (l->kind == HEAD) { /* our last chunk is lo, the donor's chunk hi */
      size_t cl = c0 + n - 1, k = d->size;
      uintptr_t cut_at = tp__space_addr(sp, cl) + k;
      tp__block *s = rest;
      if (cut_at > rest->addr) {
        s = tp__block_split(h, rest, cut_at - rest->addr);
      } else {
        rest = NULL;
      }
      make_shadow(s);
      make_shadow(d);
      tw = (tp__twin){cl, tp__space_chunk(sp, d->addr), s, d};
    } else { /* our first chunk is hi, the donor's chunk lo */
      size_t cf = c0, k = sp->gran - d->size;
      uintptr_t cut_at = tp__space_addr(sp, cf) + k;
      tp__block *s = low;
      if (cut_at < b->addr) {
        tp__block *free_part = tp__block_split(h, low, cut_at - low->addr);
        low = free_part;
      } else {
        low = NULL;
      }
      make_shadow(s);
      make_shadow(d);
      tw = (tp__twin){tp__space_chunk(sp, d->addr), cf, d, s};
    }
    h->twins[h->ntwins++] = tw;
    tp__space_lend(sp, tw.lo);
  }
  if (low) {
    atomic_store_explicit(&low->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(h, low);
  }
  if (rest) {
    atomic_store_explicit(&rest->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(h, rest);
  }
  tp__block_retag(t->a, &b->tag, tp__tag_pending(&b->tag));
  return b;
}

tp_error_t tp__heap_grow(tp__heap *h, const tp__taker *t, size_t size,
                         size_t create, tp__block **out) {
  tp__space *sp = h->space;
  (void)tp__heap_unshare(h); /* best effort: a later try ends what is left */
  placement pl;
  TP_RETURN_IF(!place(h, t, size, &pl), TP_ERROR_OUT_OF_MEMORY);
  TP_RETURN_IF(!layout_room(h), TP_ERROR_OUT_OF_MEMORY);
  size_t have = count_movable(h, t, pl.extend, pl.bridge);
  /* Sharing is for growth that makes memory (moving a chunk costs none),
   * and for blocks of up to TP_SHARE_CHUNKS chunks: one chunk is little
   * beside a larger block, whose segment edges are where the next growth
   * extends (gpt_train moved more chunks a step when they were shared). */
  bool makes = create > 0 || pl.n > have;
  layout l =
      lay_out(h, &pl, size, makes && pl.n <= TP_SHARE_CHUNKS && !pl.bridge);
  /* A donor lends the chunk at one end of the new ones: the first (TAIL)
   * or the last (HEAD); the others come from moving and making. */
  size_t need = pl.n - (l.donor ? 1 : 0);
  size_t slot = l.donor && l.kind == HEAD ? pl.n - 1 : 0;
  if (create > need)
    create = need;
  if (need - create > have)
    create = need - have;
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
  tp__phys *fill = phys + (l.donor && l.kind == TAIL ? 1 : 0);
  tp_error_t err = TP_SUCCESS;
  bool pending = false;
  size_t made = gather(h, t, need - create, pl.extend,
                       pl.bridge ? pl.bridge : l.donor, fill, &pending, &err);
  /* The placement stays valid: gathering only takes chunks outside it,
   * and the block it extends was kept out of the gathering. */
  while (err == TP_SUCCESS && made < need)
    if ((err = tp__space_create(sp, &fill[made])) == TP_SUCCESS)
      made++;
  if (l.donor)
    phys[slot] = sp->phys[tp__space_chunk(sp, l.donor->addr)];
  if (err == TP_SUCCESS)
    err = tp__space_map(sp, pl.c0, phys, pl.n);
  if (err != TP_SUCCESS) {
    (void)tp__space_release(sp, fill, made); /* the first failure answers */
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
  /* A joined segment's first block becomes part of the grown block, which
   * keeps its own tag: the first block's free had completed. */
  if (pl.bridge) {
    tp__bin_remove(h, pl.bridge);
    tp__block_merge(h, b, pl.bridge);
  }
  if (!l.donor) {
    tp__block_release(h, b);
    *out = tp__heap_take(h, t, size);
    return *out ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
  }
  *out = lay(h, t, b, &l, size, pl.c0, pl.n);
  return TP_SUCCESS;
}

/* Ends twin i from the side `lo` (else hi), whose free neighbour f covers
 * all the bytes that side uses. The other side's shadow becomes free. */
static tp_error_t end_twin(tp__heap *h, uint32_t i, bool from_lo,
                           tp__block *f) {
  tp__space *sp = h->space;
  tp__twin tw = h->twins[i];
  size_t c = from_lo ? tw.lo : tw.hi;
  tp__block *right = NULL;
  if (!from_lo && f->addr + f->size > tp__space_addr(sp, c + 1) &&
      !(right = tp__block_new(h)))
    return TP_ERROR_OUT_OF_MEMORY;
  tp__phys phys;
  tp_error_t err = tp__space_unmap(sp, c, c + 1, &phys);
  if (err != TP_SUCCESS) {
    if (right)
      tp__block_recycle(h, right);
    return err;
  }
  /* The shadow on this side joins f, and the chunk goes from the pair. */
  tp__block *s = from_lo ? tw.slo : tw.shi;
  tp__block *lo = from_lo ? f : s, *hi = from_lo ? s : f;
  tp__bin_remove(h, f);
  tp__block_merge(h, lo, hi);
  tp__bin_insert(h, lo);
  cut(h, lo, c, c + 1, right);
  tp__space_unlend(sp, tw.lo);
  h->twins[i] = h->twins[--h->ntwins];
  tp__block *other = from_lo ? tw.shi : tw.slo;
  atomic_store_explicit(&other->state, TP_BLOCK_FREE, memory_order_relaxed);
  tp__block_release(h, other);
  return TP_SUCCESS;
}

tp_error_t tp__heap_unshare(tp__heap *h) {
  const tp__space *sp = h->space;
  tp_error_t first = TP_SUCCESS, err;
  for (uint32_t i = h->ntwins; i-- > 0;) {
    const tp__twin *tw = &h->twins[i];
    tp__block *f = tw->slo->prev;
    if (tp__block_is_free(f) && !f->tag.stream &&
        f->addr <= tp__space_addr(sp, tw->lo)) {
      err = end_twin(h, i, true, f);
      if (err == TP_SUCCESS)
        continue;
      first = first != TP_SUCCESS ? first : err;
    }
    f = tw->shi->next;
    if (tp__block_is_free(f) && !f->tag.stream &&
        f->addr + f->size >= tp__space_addr(sp, tw->hi + 1)) {
      err = end_twin(h, i, false, f);
      first = first != TP_SUCCESS ? first : err;
    }
  }
  return first;
}

tp_error_t tp__heap_release(tp__heap *h, uint64_t keep) {
  tp__space *sp = h->space;
  tp_error_t uerr = tp__heap_unshare(h);
  tp_error_t err = tp__space_release_orphans(sp);
  if (err == TP_SUCCESS)
    err = uerr;
  uint64_t reserved = atomic_load_explicit(&sp->reserved, memory_order_relaxed);
  if (reserved <= keep)
    return err;
  size_t want = (size_t)((reserved - keep + sp->gran - 1) / sp->gran);
  tp__phys *phys = calloc(want, sizeof *phys);
  TP_RETURN_IF(!phys, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t gerr = TP_SUCCESS;
  bool pending = false;
  size_t got = gather(h, NULL, want, NULL, NULL, phys, &pending, &gerr);
  tp_error_t rerr = tp__space_release(sp, phys, got);
  free(phys);
  return err != TP_SUCCESS ? err : gerr != TP_SUCCESS ? gerr : rerr;
}
