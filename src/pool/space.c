/* A pool's address space: the virtual range reserved at creation, the map of
 * physical chunks mapped in it, growth (moving wholly free chunks behind a
 * fresh contiguous range before creating new ones), release, access, and the
 * per-granule entries that record live allocations. Pool lock held
 * throughout, except where an entry is read by a free. */
#include <string.h>

#include "pool/pool.h"

#define TP_VA_MIN (UINT64_C(1) << 30)

static bool mapped(const tp__pool *p, size_t c) {
  return (p->mapbits[c / 64] >> (c % 64)) & 1;
}

static void set_mapped(tp__pool *p, size_t c, tp__phys phys) {
  p->chunks[c].phys = phys;
  if (phys)
    p->mapbits[c / 64] |= UINT64_C(1) << (c % 64);
  else
    p->mapbits[c / 64] &= ~(UINT64_C(1) << (c % 64));
}

/* The chunk map, the granule tables' index and the mapped bits. */
static void free_maps(tp__pool *p) {
  free(p->chunks);
  free((void *)p->gtab);
  free(p->mapbits);
  p->chunks = NULL;
  p->gtab = NULL;
  p->mapbits = NULL;
}

tp_error_t tp__space_init(tp__pool *p) {
  uint64_t va = p->limit * 4;
  if (va < TP_VA_MIN || va / 4 != p->limit)
    va = va < TP_VA_MIN ? TP_VA_MIN : UINT64_C(1) << 46;
  va = tp__align_up(va, TP_VA_MIN);
  p->va_size = va;
  p->nchunks = va / p->gran;
  p->chunks = calloc(p->nchunks, sizeof *p->chunks);
  p->gtab = calloc(p->nchunks, sizeof *p->gtab);
  p->mapbits = calloc((p->nchunks + 63) / 64, sizeof *p->mapbits);
  if (!p->chunks || !p->gtab || !p->mapbits) {
    free_maps(p);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  tp_error_t err =
      tp__platform->reserve(&p->kind, va, TP_VA_MIN, &p->res, &p->base);
  if (err == TP_SUCCESS && (err = tp__registry_add(p)) != TP_SUCCESS)
    (void)tp__platform->unreserve(p->res);
  if (err != TP_SUCCESS)
    free_maps(p);
  return err;
}

_Atomic uintptr_t *tp__space_entry(tp__pool *p, uintptr_t addr, bool create) {
  size_t off = addr - p->base;
  size_t c = off / p->gran;
  _Atomic uintptr_t *t =
      atomic_load_explicit(&p->gtab[c], memory_order_acquire);
  if (!t && create) {
    t = calloc(p->gran >> TP_GRANULE_SHIFT, sizeof *t);
    if (!t)
      return NULL;
    atomic_store_explicit(&p->gtab[c], t, memory_order_release);
  }
  return t ? &t[(off % p->gran) >> TP_GRANULE_SHIFT] : NULL;
}

static tp_error_t apply_access(tp__pool *p, size_t off, size_t size) {
  tp_access_desc_t list[TP_MAX_DEVICES + 1];
  size_t n = 0;
  if (p->kind.location.type == TP_LOCATION_HOST ||
      p->kind.location.type == TP_LOCATION_HOST_NUMA)
    list[n++] = (tp_access_desc_t){p->kind.location, TP_ACCESS_READ_WRITE};
  for (int d = 0; d < TP_MAX_DEVICES; d++)
    if (p->access[d] != TP_ACCESS_NONE)
      list[n++] = (tp_access_desc_t){{TP_LOCATION_DEVICE, d, 0}, p->access[d]};
  return n ? tp__platform->set_access(p->res, off, size, list, n) : TP_SUCCESS;
}

tp_error_t tp__space_set_access(tp__pool *p, const tp_access_desc_t *list,
                                size_t n) {
  for (size_t c = tp__segment_next(p, 0); c < p->nchunks;) {
    size_t e = tp__segment_end(p, c);
    TP_FORWARD(tp__platform->set_access(p->res, c * p->gran, (e - c) * p->gran,
                                        list, n));
    c = tp__segment_next(p, e);
  }
  return TP_SUCCESS;
}

/* Removes whole chunks [c0, c1) from free block b (which must hold them),
 * leaving the pieces on either side free, and unmaps them. The physical
 * handles go to phys[]. */
static tp_error_t carve(tp__pool *p, tp__block *b, size_t c0, size_t c1,
                        tp__phys *phys) {
  uintptr_t lo = b->addr, hi = b->addr + b->size;
  uintptr_t a = p->base + c0 * p->gran, z = p->base + c1 * p->gran;
  tp__block *right = NULL;
  if (z < hi && !(right = tp__block_new(p)))
    return TP_ERROR_OUT_OF_MEMORY;
  tp_error_t err = tp__platform->unmap(p->res, c0 * p->gran, c1 - c0);
  if (err != TP_SUCCESS) {
    if (right)
      tp__block_recycle(p, right);
    return err;
  }
  atomic_fetch_add_explicit(&p->unmaps, c1 - c0, memory_order_relaxed);
  tp__bin_remove(p, b);
  tp__block *prev = b->prev, *next = b->next;
  for (size_t c = c0; c < c1; c++) {
    phys[c - c0] = p->chunks[c].phys;
    p->chunks[c] = (tp__chunk){0};
    set_mapped(p, c, 0);
  }
  if (lo < a) {
    b->size = a - lo;
    b->next = NULL;
    p->chunks[c0 - 1].seg_last = b;
    tp__bin_insert(p, b);
  } else {
    if (prev) {
      prev->next = NULL;
      p->chunks[c0 - 1].seg_last = prev;
    }
    tp__block_recycle(p, b);
  }
  if (right) {
    right->addr = z;
    right->size = hi - z;
    right->next = next;
    if (next)
      next->prev = right;
    else
      p->chunks[(hi - 1 - p->base) / p->gran].seg_last = right;
    p->chunks[c1].seg_first = right;
    tp__bin_insert(p, right);
  } else if (next) {
    next->prev = NULL;
    p->chunks[c1].seg_first = next;
  }
  return TP_SUCCESS;
}

/* The whole chunks inside free block b: [*c0, *c1). */
static bool whole_chunks(const tp__pool *p, const tp__block *b, size_t *c0,
                         size_t *c1) {
  size_t lo = tp__align_up(b->addr - p->base, p->gran);
  size_t hi = (b->addr + b->size - p->base) / p->gran * p->gran;
  if (hi <= lo)
    return false;
  *c0 = lo / p->gran;
  *c1 = hi / p->gran;
  return true;
}

static bool movable(const tp__block *b) {
  return atomic_load_explicit(&b->state, memory_order_relaxed) ==
             TP_BLOCK_FREE &&
         !b->tag.stream;
}

/* Takes up to `want` wholly free, completed chunks out of the bins (largest
 * blocks first, from their high end), unmapping them. `keep` is a block not
 * to touch. Returns how many were taken. */
static size_t gather(tp__pool *p, size_t want, const tp__block *keep,
                     tp__phys *phys, tp_error_t *err) {
  size_t got = 0;
  for (int bin = TP_NBINS - 1; bin >= 0 && got < want; bin--) {
    tp__block *b = p->bins[bin];
    while (b && got < want) {
      tp__block *next = b->fnext;
      size_t c0, c1;
      if (b != keep && movable(b) && whole_chunks(p, b, &c0, &c1)) {
        if (c1 - c0 > want - got)
          c0 = c1 - (want - got);
        *err = carve(p, b, c0, c1, phys + got);
        if (*err != TP_SUCCESS)
          return got;
        got += c1 - c0;
      }
      b = next;
    }
  }
  return got;
}

size_t tp__segment_next(const tp__pool *p, size_t from) {
  size_t words = (p->nchunks + 63) / 64;
  for (size_t w = from / 64; w < words; w++) {
    uint64_t m = p->mapbits[w];
    uint64_t carry = w > 0 ? p->mapbits[w - 1] >> 63 : 0;
    uint64_t starts = m & ~((m << 1) | carry);
    if (w == from / 64)
      starts &= ~UINT64_C(0) << (from % 64);
    if (starts)
      return w * 64 + (size_t)__builtin_ctzll(starts);
  }
  return p->nchunks;
}

size_t tp__segment_end(const tp__pool *p, size_t start) {
  size_t c = start;
  while (c < p->nchunks && mapped(p, c))
    c++;
  return c;
}

static bool run_unmapped(const tp__pool *p, size_t c0, size_t n) {
  if (c0 + n > p->nchunks)
    return false;
  for (size_t c = c0; c < c0 + n; c++)
    if (mapped(p, c))
      return false;
  return true;
}

/* The lowest run of n unmapped chunks, skipping fully mapped words. */
static bool first_run(const tp__pool *p, size_t n, size_t *out) {
  size_t run = 0;
  for (size_t c = 0; c < p->nchunks;) {
    if (c % 64 == 0 && p->mapbits[c / 64] == UINT64_MAX) {
      run = 0;
      c += 64;
      continue;
    }
    if (mapped(p, c)) {
      run = 0;
    } else if (++run == n) {
      *out = c + 1 - n;
      return true;
    }
    c++;
  }
  return false;
}

/* Where new chunks go: extending a completed free block at a segment's end
 * (or start) when the chunks beside it are unmapped, else a fresh run at the
 * lowest address that has room. */
typedef struct placement {
  size_t c0, n;
  tp__block *extend; /* NULL for a fresh run */
} placement;

static bool place(tp__pool *p, size_t size, placement *out) {
  size_t fresh = tp__align_up(size, p->gran) / p->gran;
  out->c0 = 0;
  bool found = first_run(p, fresh, &out->c0);
  out->n = fresh;
  out->extend = NULL;
  for (unsigned bin = 0; bin < TP_NBINS; bin++) {
    for (tp__block *b = p->bins[bin]; b; b = b->fnext) {
      if (!movable(b) || b->size >= size || (b->next && b->prev))
        continue;
      size_t n = tp__align_up(size - b->size, p->gran) / p->gran;
      if (found && n >= out->n)
        continue;
      size_t after = (b->addr + b->size - p->base) / p->gran;
      size_t before = (b->addr - p->base) / p->gran;
      if (!b->next && run_unmapped(p, after, n)) {
        *out = (placement){after, n, b};
        found = true;
      } else if (!b->prev && before >= n && run_unmapped(p, before - n, n)) {
        *out = (placement){before - n, n, b};
        found = true;
      }
    }
  }
  return found;
}

/* Counts the wholly free, completed chunks that gather() could take. */
static size_t count_movable(const tp__pool *p, const tp__block *keep) {
  size_t n = 0;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (tp__block *b = p->bins[bin]; b; b = b->fnext) {
      size_t c0, c1;
      if (b != keep && movable(b) && whole_chunks(p, b, &c0, &c1))
        n += c1 - c0;
    }
  return n;
}

static void reserved_add(tp__pool *p, int64_t delta) {
  uint64_t r = atomic_fetch_add_explicit(&p->reserved, (uint64_t)delta,
                                         memory_order_relaxed) +
               (uint64_t)delta;
  if (delta > 0)
    tp__atomic_max(&p->reserved_high, r);
}

/* Releases chunks that were unmapped and are not needed. One the platform
 * refuses to release stays reserved, kept as an orphan for the next try, so
 * that neither the memory nor the accounting is lost. */
static tp_error_t release_phys(tp__pool *p, const tp__phys *phys, size_t n) {
  tp_error_t first = TP_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    tp_error_t err = tp__platform->chunk_release(p->res, phys[i]);
    if (err == TP_SUCCESS) {
      reserved_add(p, -(int64_t)p->gran);
      continue;
    }
    if (first == TP_SUCCESS)
      first = err;
    if (TP_RESERVE(p->orphans, p->norphans, p->caporphans))
      p->orphans[p->norphans++] = phys[i];
  }
  return first;
}

static tp_error_t release_orphans(tp__pool *p) {
  uint32_t n = p->norphans;
  p->norphans = 0;
  tp__phys *v = p->orphans;
  p->orphans = NULL;
  p->caporphans = 0;
  tp_error_t err = release_phys(p, v, n);
  free(v);
  return err;
}

tp_error_t tp__space_grow(tp__pool *p, size_t size, tp__block **out) {
  placement pl;
  TP_RETURN_IF(!place(p, size, &pl), TP_ERROR_OUT_OF_MEMORY);
  /* Moving a chunk costs as much as making one (tens of microseconds on a
   * GPU), so chunks move only once the pool would otherwise hold more than
   * a sliver above the peak of what its users asked for. */
  uint64_t reserved = atomic_load_explicit(&p->reserved, memory_order_relaxed);
  uint64_t peak =
      tp__max_u64(atomic_load(&p->used_high), tp__pool_used(p) + size);
  uint64_t budget = peak + peak / TP_GROWTH_SLACK;
  size_t create =
      budget > reserved ? (size_t)((budget - reserved) / p->gran) : 0;
  if (create > pl.n)
    create = pl.n;
  size_t have = count_movable(p, pl.extend);
  if (pl.n - create > have)
    create = pl.n - have;
  TP_RETURN_IF(reserved + (uint64_t)create * p->gran > p->limit,
               TP_ERROR_OUT_OF_MEMORY);
  tp__phys *phys = calloc(pl.n, sizeof *phys);
  TP_RETURN_IF(!phys, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t err = TP_SUCCESS;
  size_t moved = gather(p, pl.n - create, pl.extend, phys, &err);
  size_t made = moved;
  while (err == TP_SUCCESS && made < pl.n) {
    err = tp__platform->chunk_create(p->res, &phys[made]);
    if (err == TP_SUCCESS) {
      made++;
      reserved_add(p, (int64_t)p->gran);
    }
  }
  /* The placement stays valid: gathering only unmaps chunks outside it,
   * and the block it extends was kept out of the gathering. */
  if (err == TP_SUCCESS)
    err = tp__platform->map(p->res, pl.c0 * p->gran, phys, pl.n);
  if (err == TP_SUCCESS &&
      (err = apply_access(p, pl.c0 * p->gran, pl.n * p->gran)) != TP_SUCCESS)
    (void)tp__platform->unmap(p->res, pl.c0 * p->gran, pl.n);
  tp__block *b = NULL;
  if (err == TP_SUCCESS && !pl.extend && !(b = tp__block_new(p))) {
    (void)tp__platform->unmap(p->res, pl.c0 * p->gran, pl.n);
    err = TP_ERROR_OUT_OF_MEMORY;
  }
  if (err != TP_SUCCESS) {
    (void)release_phys(p, phys, made); /* the first failure is the answer */
    free(phys);
    return err;
  }
  atomic_fetch_add_explicit(&p->maps, pl.n, memory_order_relaxed);
  for (size_t i = 0; i < pl.n; i++)
    set_mapped(p, pl.c0 + i, phys[i]);
  free(phys);
  uintptr_t a = p->base + pl.c0 * p->gran;
  size_t bytes = pl.n * p->gran;
  if (pl.extend) {
    b = pl.extend;
    tp__bin_remove(p, b);
    if (b->addr > a) { /* growing the segment's first block downwards */
      b->addr = a;
      b->size += bytes;
      tp__block *prev = pl.c0 > 0 && p->chunks[pl.c0 - 1].phys
                            ? p->chunks[pl.c0 - 1].seg_last
                            : NULL;
      b->prev = prev;
      if (prev)
        prev->next = b;
      else
        p->chunks[pl.c0].seg_first = b;
    } else {
      b->size += bytes;
      size_t c1 = pl.c0 + pl.n;
      tp__block *next = c1 < p->nchunks && p->chunks[c1].phys
                            ? p->chunks[c1].seg_first
                            : NULL;
      b->next = next;
      if (next)
        next->prev = b;
      else
        p->chunks[c1 - 1].seg_last = b;
    }
  } else {
    b->addr = a;
    b->size = bytes;
    tp__segment_link(p, b);
  }
  *out = tp__block_release(p, b);
  return TP_SUCCESS;
}

tp_error_t tp__space_release(tp__pool *p, uint64_t keep) {
  tp_error_t err = p->norphans ? release_orphans(p) : TP_SUCCESS;
  uint64_t reserved = atomic_load_explicit(&p->reserved, memory_order_relaxed);
  if (reserved <= keep)
    return err;
  size_t want = (size_t)((reserved - keep + p->gran - 1) / p->gran);
  tp__phys *phys = calloc(want, sizeof *phys);
  TP_RETURN_IF(!phys, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t gerr = TP_SUCCESS;
  size_t got = gather(p, want, NULL, phys, &gerr);
  tp_error_t rerr = release_phys(p, phys, got);
  free(phys);
  return err != TP_SUCCESS ? err : gerr != TP_SUCCESS ? gerr : rerr;
}

void tp__space_fini(tp__pool *p) {
  if (!p->chunks)
    return;
  for (size_t c = tp__segment_next(p, 0); c < p->nchunks;) {
    size_t e = tp__segment_end(p, c);
    for (size_t i = c; i < e; i++) {
      (void)tp__platform->unmap(p->res, i * p->gran, 1);
      if (tp__platform->chunk_release(p->res, p->chunks[i].phys) == TP_SUCCESS)
        reserved_add(p, -(int64_t)p->gran);
    }
    c = tp__segment_next(p, e);
  }
  (void)release_orphans(p);
  tp__registry_remove(p);
  (void)tp__platform->unreserve(p->res);
}

void tp__space_free(tp__pool *p) {
  if (!p->chunks)
    return;
  for (size_t c = 0; c < p->nchunks; c++)
    free((void *)atomic_load_explicit(&p->gtab[c], memory_order_relaxed));
  free_maps(p);
}
