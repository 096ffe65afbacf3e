/* The invariant walker: checks a pool's segments, bins, slabs, granule
 * entries and accounting against each other. Tests call it; debug builds
 * call it after every slow-path operation so that a bug stops where it
 * happens. */
#include <stdarg.h>
#include <string.h>

#include "pool/pool.h"
#include "pool/pool_verify.h"

static int fail(char *why, size_t len, const char *fmt, ...) {
  if (why && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  return 1;
}

#define CHECK_OR_FAIL(cond, ...)                                               \
  do {                                                                         \
    if (!(cond))                                                               \
      return fail(why, len, __VA_ARGS__);                                      \
  } while (0)

static uint8_t state_of(const tp__block *b) {
  return atomic_load_explicit(&b->state, memory_order_acquire);
}

static bool in_bin(const tp__heap *h, const tp__block *b) {
  for (const tp__block *x = h->bins[b->bin]; x; x = x->fnext)
    if (x == b)
      return true;
  return false;
}

static int walk_slab(tp__space *sp, const tp__block *b, uint64_t *used,
                     char *why, size_t len) {
  const tp__slab *s = b->slab;
  CHECK_OR_FAIL(s && s->block == b && s->base == b->addr,
                "slab block %#lx has no matching slab", (unsigned long)b->addr);
  CHECK_OR_FAIL((uint64_t)s->nblocks * s->bsize <= b->size,
                "slab at %#lx overflows its block", (unsigned long)b->addr);
  uint32_t bits = 0;
  for (uint32_t i = 0; i < s->nblocks; i++) {
    bool is_free = (s->free[i / 64] >> (i % 64)) & 1;
    uint32_t req = atomic_load(&s->req[i]);
    CHECK_OR_FAIL(!(is_free && req), "slab block %u free and used", i);
    bits += is_free;
    *used += req;
    _Atomic uintptr_t *e =
        tp__space_entry(sp, s->base + (uintptr_t)i * s->bsize, false);
    CHECK_OR_FAIL(e && atomic_load(e) == tp__slab_entry(s, i),
                  "slab block %u lacks its granule entry", i);
  }
  for (uint32_t i = s->nblocks; i < TP_SLAB_MAX_BLOCKS; i++)
    CHECK_OR_FAIL(!((s->free[i / 64] >> (i % 64)) & 1),
                  "slab free bit %u beyond its blocks", i);
  CHECK_OR_FAIL(bits == s->nfree, "slab counts %u free, bits say %u", s->nfree,
                bits);
  CHECK_OR_FAIL(s->listed == (s->nfree > 0), "slab listed %d with %u free",
                s->listed, s->nfree);
  return 0;
}

/* Each shared chunk: mapped at both places, one physical chunk, each side's
 * shadow exactly the bytes the other side uses, and nothing else a shadow. */
static int walk_twins(const tp__heap *h, size_t shadows, char *why,
                      size_t len) {
  const tp__space *sp = h->space;
  CHECK_OR_FAIL(shadows == 2 * (size_t)h->ntwins && sp->nlent == h->ntwins,
                "%zu shadow blocks, %u lent chunks, %u shared chunks", shadows,
                sp->nlent, h->ntwins);
  for (uint32_t i = 0; i < h->ntwins; i++) {
    const tp__twin *t = &h->twins[i];
    uintptr_t lo = tp__space_addr(sp, t->lo), hi = tp__space_addr(sp, t->hi);
    CHECK_OR_FAIL(
        t->lo != t->hi && tp__space_mapped(sp, t->lo) &&
            tp__space_mapped(sp, t->hi) && sp->phys[t->lo] == sp->phys[t->hi],
        "chunks %zu and %zu are not one chunk mapped twice", t->lo, t->hi);
    CHECK_OR_FAIL(state_of(t->slo) == TP_BLOCK_SHADOW &&
                      state_of(t->shi) == TP_BLOCK_SHADOW &&
                      t->slo->addr + t->slo->size == lo + sp->gran &&
                      t->shi->addr == hi && t->slo->addr > lo &&
                      t->slo->addr - lo == t->shi->size,
                  "the shadows of chunks %zu and %zu do not match", t->lo,
                  t->hi);
  }
  return 0;
}

int tp__pool_walk(tp__pool *p, bool check_used, char *why, size_t len) {
  if (p->imported || p->torn_down)
    return 0;
  tp__space *sp = &p->space;
  uint64_t mapped = 0, used = 0;
  size_t free_blocks = 0, shadows = 0;
  for (size_t c = tp__space_segment_next(sp, 0); c < sp->nchunks;
       c = tp__space_segment_next(sp, c + 1)) {
    size_t e = tp__space_segment_end(sp, c);
    for (size_t i = c; i < e; i++)
      CHECK_OR_FAIL(sp->phys[i], "chunk %zu mapped without a handle", i);
    mapped += e - c;
    uintptr_t at = tp__space_addr(sp, c), end = tp__space_addr(sp, e);
    const tp__block *prev = NULL;
    const tp__block *b = p->heap.segs[c].first;
    CHECK_OR_FAIL(b && !b->prev, "segment at chunk %zu has no first block", c);
    for (; b; prev = b, b = b->next) {
      CHECK_OR_FAIL(b->addr == at, "block at %#lx, expected %#lx",
                    (unsigned long)b->addr, (unsigned long)at);
      CHECK_OR_FAIL(b->size >= TP_GRANULE && b->size % TP_GRANULE == 0,
                    "block at %#lx has size %zu", (unsigned long)b->addr,
                    b->size);
      CHECK_OR_FAIL(b->prev == prev, "block at %#lx: bad prev link",
                    (unsigned long)b->addr);
      at += b->size;
      CHECK_OR_FAIL(at <= end, "block at %#lx runs past its segment",
                    (unsigned long)b->addr);
      switch (state_of(b)) {
      case TP_BLOCK_FREE:
        free_blocks++;
        CHECK_OR_FAIL(b->bin == tp__bin_of(b->size) && in_bin(&p->heap, b),
                      "free block at %#lx not in its bin",
                      (unsigned long)b->addr);
        break;
      case TP_BLOCK_USED: {
        /* A free in flight clears the entry before the state: only a
         * quiescent pool must show both. */
        _Atomic uintptr_t *ent = tp__space_entry(sp, b->addr, false);
        uintptr_t v = ent ? atomic_load(ent) : 0;
        CHECK_OR_FAIL(v == (uintptr_t)b || (!check_used && v == 0),
                      "used block at %#lx lacks its granule entry",
                      (unsigned long)b->addr);
        used += atomic_load(&b->req);
        break;
      }
      case TP_BLOCK_SLAB:
        if (walk_slab(sp, b, &used, why, len))
          return 1;
        break;
      case TP_BLOCK_SHADOW: shadows++; break;
      default: break; /* cached by a stream */
      }
      if (!b->next)
        CHECK_OR_FAIL(p->heap.segs[e - 1].last == b,
                      "segment ending at chunk %zu: wrong last block", e - 1);
    }
    CHECK_OR_FAIL(at == end, "segment [%zu, %zu) not tiled by its blocks", c,
                  e);
  }
  size_t binned = 0;
  for (unsigned bin = 0; bin < TP_NBINS; bin++) {
    bool bit = (p->heap.binmap[bin / 64] >> (bin % 64)) & 1;
    CHECK_OR_FAIL(bit == (p->heap.bins[bin] != NULL), "bin map wrong at %u",
                  bin);
    for (const tp__block *b = p->heap.bins[bin]; b; b = b->fnext) {
      CHECK_OR_FAIL(state_of(b) == TP_BLOCK_FREE,
                    "bin %u holds a block in state %u at %#lx size %zu", bin,
                    state_of(b), (unsigned long)b->addr, b->size);
      binned++;
    }
  }
  CHECK_OR_FAIL(binned == free_blocks,
                "%zu blocks in bins, %zu free in "
                "segments",
                binned, free_blocks);
  if (walk_twins(&p->heap, shadows, why, len))
    return 1;
  /* A chunk released while a ghost still maps it stays counted, and a
   * chunk mapped twice counts once. */
  uint64_t kept = 0;
  for (uint32_t i = 0; i < sp->nghosts; i++) {
    const tp__ghost *g = &sp->ghosts[i];
    CHECK_OR_FAIL(g->tag.stream && !tp__space_mapped(sp, g->chunk) &&
                      tp__space_occupied(sp, g->chunk),
                  "ghost at chunk %zu is not a lone ghost", g->chunk);
    kept += g->release;
  }
  uint64_t reserved = atomic_load(&sp->reserved);
  CHECK_OR_FAIL(reserved ==
                    (mapped - sp->nlent + sp->norphans + kept) * sp->gran,
                "reserved %llu but %llu chunks mapped, %u unreleased and "
                "%llu under old mappings",
                (unsigned long long)reserved, (unsigned long long)mapped,
                sp->norphans, (unsigned long long)kept);
  CHECK_OR_FAIL(reserved <= sp->limit, "reserved %llu over the limit %llu",
                (unsigned long long)reserved, (unsigned long long)sp->limit);
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++)
    for (const tp__slab *s = p->slabs.partial[cls]; s; s = s->next)
      CHECK_OR_FAIL(s->cls == cls && s->nfree > 0 && s->block &&
                        s->block->slab == s,
                    "partial list of class %u holds a bad slab", cls);
  CHECK_OR_FAIL(tp__slabs_holds_agree(&p->slabs),
                "the pending blocks' stream references disagree with them");
  uint64_t u = tp__pool_used(p);
  CHECK_OR_FAIL(!check_used || u == used,
                "used is %llu but live allocations ask %llu",
                (unsigned long long)u, (unsigned long long)used);
  return 0;
}

int tp__pool_verify(tp_pool_t pool, char *why, size_t why_len) {
  tp__pool *p;
  if (tp__pool_get(pool, &p) != TP_SUCCESS)
    return fail(why, why_len, "not a live pool");
  tp__mutex_lock(&p->lock);
  int r = tp__pool_walk(p, true, why, why_len);
  tp__mutex_unlock(&p->lock);
  return r;
}

#ifdef TP_DEBUG
void tp__pool_debug_check(tp__pool *p) {
  char why[256];
  if (tp__pool_walk(p, false, why, sizeof why)) {
    fprintf(stderr, "tidepool: pool %p is inconsistent: %s\n", (void *)p, why);
    abort();
  }
}
#endif

size_t tp__pool_tables(tp_pool_t pool) {
  tp__pool *p;
  if (tp__pool_get(pool, &p) != TP_SUCCESS || p->imported)
    return 0;
  tp__mutex_lock(&p->lock);
  size_t n = p->space.ntables;
  tp__mutex_unlock(&p->lock);
  return n;
}

void tp__pool_breakdown(tp_pool_t pool, uint64_t out[8]) {
  tp__pool *p;
  memset(out, 0, 8 * sizeof *out);
  if (tp__pool_get(pool, &p) != TP_SUCCESS || p->imported)
    return;
  tp__space *sp = &p->space;
  tp__mutex_lock(&p->lock);
  for (size_t c = tp__space_segment_next(sp, 0); c < sp->nchunks;
       c = tp__space_segment_next(sp, c + 1)) {
    for (const tp__block *b = p->heap.segs[c].first; b; b = b->next) {
      switch (state_of(b)) {
      case TP_BLOCK_FREE: out[b->tag.stream ? 1 : 0] += b->size; break;
      case TP_BLOCK_CACHED: out[2] += b->size; break;
      case TP_BLOCK_USED: out[3] += b->size - atomic_load(&b->req); break;
      case TP_BLOCK_SLAB: {
        const tp__slab *s = b->slab;
        out[4] += b->size;
        for (uint32_t i = 0; i < s->nblocks; i++) {
          uint32_t req = atomic_load(&s->req[i]);
          if (req)
            out[5] += s->bsize - req;
          else if ((s->free[i / 64] >> (i % 64)) & 1)
            out[6] += s->bsize;
          else
            out[7] += s->bsize;
        }
        break;
      }
      default: break;
      }
    }
  }
  tp__mutex_unlock(&p->lock);
}
