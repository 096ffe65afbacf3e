/* A pool's address space (space.h): the virtual range, the chunk slots and
 * their mapped bits, creating, mapping, unmapping and releasing chunks with
 * the reserved-byte accounting, access, and the granule entries. */
#include "pool/space.h"

#include <string.h>

#include "common/guard.h"

#define TP_VA_MIN (UINT64_C(1) << 30)

static void free_table(void *t) {
  free(t);
}

/* ---- granule tables ---------------------------------------------------------
 * A chunk slot gets its table of granule entries when its first block is
 * made, and a slot that no mapping uses any more holds no live allocation,
 * so its table is all zeros. Chunks that move climb to slots never used
 * before (a training loop's segment moved nine chunks up a step), so an
 * emptied slot keeps its table only while few emptied slots hold one
 * (SPARE_MAX): beyond that the table goes, through the guard (a racing bad
 * free may still be reading it), to a stock of zeroed tables that the next
 * slot to be mapped takes. A move then costs no 32 KiB calloc, with its
 * page faults (about 20 us on the H200's host), and the tables stay about
 * as many as the mapped chunks that hold blocks. (The bound was once the
 * mapped chunks plus 64, which a pool that moves never reached: a GPT run
 * made 16 tables a step.) The
 * stock is the process's, for tables of the usual 2 MiB chunk; a table of
 * another size is freed. */
#define STOCK_GRAN (UINT64_C(2) << 20)
#define STOCK_MAX 256

static struct {
  tp__mutex lock;
  size_t n;
  void *v[STOCK_MAX];
} stock = {TP_MUTEX_INIT(TP_RANK_TABLES), 0, {0}};

static _Atomic size_t tables_made;

size_t tp__space_tables_made(void) {
  return atomic_load_explicit(&tables_made, memory_order_relaxed);
}

static void stock_put(void *t) {
  tp__mutex_lock(&stock.lock);
  bool kept = stock.n < STOCK_MAX;
  if (kept)
    stock.v[stock.n++] = t;
  tp__mutex_unlock(&stock.lock);
  if (!kept)
    free(t);
}

static _Atomic uintptr_t *table_new(const tp__space *sp) {
  void *t = NULL;
  if (sp->gran == STOCK_GRAN) {
    tp__mutex_lock(&stock.lock);
    if (stock.n)
      t = stock.v[--stock.n];
    tp__mutex_unlock(&stock.lock);
  }
  if (t)
    return t;
  atomic_fetch_add_explicit(&tables_made, 1, memory_order_relaxed);
  return calloc(sp->gran >> TP_GRANULE_SHIFT, sizeof(uintptr_t));
}

/* A slot left unmapped keeps its table while few slots do (SPARE_MAX),
 * since a chunk may come back to it; beyond that the table goes to the
 * stock, for the next slot to be mapped. */
#define SPARE_MAX 64

static void drop_table(tp__space *sp, size_t c) {
  _Atomic uintptr_t *t =
      atomic_load_explicit(&sp->gtab[c], memory_order_relaxed);
  if (!t)
    return;
  if (sp->nspare < SPARE_MAX) {
    sp->nspare++;
    return;
  }
#ifdef TP_DEBUG
  for (size_t i = 0; i < (sp->gran >> TP_GRANULE_SHIFT); i++)
    TP_CHECK(atomic_load_explicit(&t[i], memory_order_relaxed) == 0);
#endif
  atomic_store_explicit(&sp->gtab[c], NULL, memory_order_release);
  sp->ntables--;
  tp__guard_retire((void *)t, sp->gran == STOCK_GRAN ? stock_put : free_table);
}

static void set_slot(tp__space *sp, size_t c, tp__phys phys) {
  bool was = tp__space_mapped(sp, c);
  sp->phys[c] = phys;
  if (phys) {
    sp->mapbits[c / 64] |= UINT64_C(1) << (c % 64);
    if (c / 64 >= sp->mapwords)
      sp->mapwords = c / 64 + 1;
    if (!was && atomic_load_explicit(&sp->gtab[c], memory_order_relaxed))
      sp->nspare--;
  } else {
    sp->mapbits[c / 64] &= ~(UINT64_C(1) << (c % 64));
    while (sp->mapwords && !sp->mapbits[sp->mapwords - 1])
      sp->mapwords--;
    if (was)
      drop_table(sp, c);
  }
}

static void set_ghost(tp__space *sp, size_t c, bool on) {
  if (on)
    sp->ghostbits[c / 64] |= UINT64_C(1) << (c % 64);
  else
    sp->ghostbits[c / 64] &= ~(UINT64_C(1) << (c % 64));
}

static void free_maps(tp__space *sp) {
  free(sp->phys);
  free((void *)sp->gtab);
  free(sp->mapbits);
  free(sp->ghostbits);
  free(sp->ghosts);
  free(sp->lent);
  sp->lent = NULL;
  sp->phys = NULL;
  sp->gtab = NULL;
  sp->mapbits = sp->ghostbits = NULL;
  sp->mapwords = 0;
  sp->ghosts = NULL;
}

tp_error_t tp__space_init(tp__space *sp, const tp__mem_kind *kind, size_t gran,
                          uint64_t limit) {
  uint64_t va = limit * 4;
  /* Beyond 2^46 (an overflow included) the range is capped: a larger one
   * cannot be reserved in a 47-bit user address space, and a capacity of
   * 24T or more would otherwise fail every pool of its location. */
  if (va < TP_VA_MIN)
    va = TP_VA_MIN;
  else if (va / 4 != limit || va > UINT64_C(1) << 46)
    va = UINT64_C(1) << 46;
  va = tp__align_up(va, TP_VA_MIN);
  /* Chunk sizes are powers of two (CUDA's granularities are), which the
   * granule lookup's shifts rely on. */
  TP_RETURN_IF(gran == 0 || (gran & (gran - 1)) || gran < TP_GRANULE ||
                   (gran >> TP_GRANULE_SHIFT) - 1 > UINT32_MAX,
               TP_ERROR_NOT_SUPPORTED);
  /* A limit in whole chunks keeps every size up to it clear of overflow
   * when rounded to granules, which the allocation fast path relies on. */
  TP_CHECK(limit % gran == 0);
  sp->kind = *kind;
  sp->gran = gran;
  sp->gran_shift = (unsigned)__builtin_ctzll(gran);
  sp->gmask = (uint32_t)((gran >> TP_GRANULE_SHIFT) - 1);
  sp->limit = limit;
  sp->va_size = va;
  sp->nchunks = va / gran;
  sp->phys = calloc(sp->nchunks, sizeof *sp->phys);
  sp->gtab = calloc(sp->nchunks, sizeof *sp->gtab);
  sp->mapbits = calloc((sp->nchunks + 63) / 64, sizeof *sp->mapbits);
  sp->ghostbits = calloc((sp->nchunks + 63) / 64, sizeof *sp->ghostbits);
  sp->mapwords = 0;
  if (!sp->phys || !sp->gtab || !sp->mapbits || !sp->ghostbits) {
    free_maps(sp);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  tp_error_t err =
      tp__platform->reserve(&sp->kind, va, TP_VA_MIN, &sp->res, &sp->base);
  if (err == TP_SUCCESS && sp->base % TP_VA_MIN != 0) {
    (void)tp__platform->unreserve(sp->res);
    err = TP_ERROR_INVALID_VALUE;
  }
  if (err != TP_SUCCESS)
    free_maps(sp);
  return err;
}

_Atomic uintptr_t *tp__space_entry_make(tp__space *sp, uintptr_t addr) {
  size_t c = tp__space_chunk(sp, addr);
  _Atomic uintptr_t *t =
      atomic_load_explicit(&sp->gtab[c], memory_order_acquire);
  if (!t) {
    t = table_new(sp);
    if (!t)
      return NULL;
    sp->ntables++;
    atomic_store_explicit(&sp->gtab[c], t, memory_order_release);
  }
  return &t[((addr - sp->base) & (sp->gran - 1)) >> TP_GRANULE_SHIFT];
}

/* ---- the chunk map ------------------------------------------------------- */

size_t tp__space_segment_next(const tp__space *sp, size_t from) {
  for (size_t w = from / 64; w < sp->mapwords; w++) {
    uint64_t m = sp->mapbits[w];
    uint64_t carry = w > 0 ? sp->mapbits[w - 1] >> 63 : 0;
    uint64_t starts = m & ~((m << 1) | carry);
    if (w == from / 64)
      starts &= ~UINT64_C(0) << (from % 64);
    if (starts)
      return w * 64 + (size_t)__builtin_ctzll(starts);
  }
  return sp->nchunks;
}

size_t tp__space_segment_end(const tp__space *sp, size_t start) {
  size_t c = start;
  while (c < sp->nchunks && tp__space_mapped(sp, c))
    c++;
  return c;
}

bool tp__space_unmapped(const tp__space *sp, size_t c0, size_t n) {
  if (c0 + n > sp->nchunks)
    return false;
  for (size_t c = c0; c < c0 + n; c++)
    if (tp__space_occupied(sp, c))
      return false;
  return true;
}

bool tp__space_first_run(const tp__space *sp, size_t n, size_t *out) {
  size_t run = 0;
  for (size_t c = 0; c < sp->nchunks;) {
    if (c % 64 == 0 &&
        (sp->mapbits[c / 64] | sp->ghostbits[c / 64]) == UINT64_MAX) {
      run = 0;
      c += 64;
      continue;
    }
    if (tp__space_occupied(sp, c)) {
      run = 0;
    } else if (++run == n) {
      *out = c + 1 - n;
      return true;
    }
    c++;
  }
  return false;
}

/* ---- chunks ----------------------------------------------------------------
 */

static void reserved_add(tp__space *sp, int64_t delta) {
  uint64_t r = atomic_fetch_add_explicit(&sp->reserved, (uint64_t)delta,
                                         memory_order_relaxed) +
               (uint64_t)delta;
  if (delta > 0)
    tp__atomic_max(&sp->reserved_high, r);
}

tp_error_t tp__space_create(tp__space *sp, tp__phys *phys) {
  uint64_t reserved = atomic_load_explicit(&sp->reserved, memory_order_relaxed);
  TP_RETURN_IF(reserved + sp->gran > sp->limit, TP_ERROR_OUT_OF_MEMORY);
  TP_FORWARD(tp__platform->chunk_create(sp->res, phys));
  reserved_add(sp, (int64_t)sp->gran);
  return TP_SUCCESS;
}

static tp_error_t apply_access(tp__space *sp, size_t off, size_t size) {
  tp_access_desc_t list[TP_MAX_DEVICES + 1];
  size_t n = 0;
  if (sp->kind.location.type == TP_LOCATION_HOST ||
      sp->kind.location.type == TP_LOCATION_HOST_NUMA)
    list[n++] = (tp_access_desc_t){sp->kind.location, TP_ACCESS_READ_WRITE};
  for (int d = 0; d < TP_MAX_DEVICES; d++)
    if (sp->access[d] != TP_ACCESS_NONE)
      list[n++] = (tp_access_desc_t){{TP_LOCATION_DEVICE, d, 0}, sp->access[d]};
  return n ? tp__platform->set_access(sp->res, off, size, list, n) : TP_SUCCESS;
}

tp_error_t tp__space_map(tp__space *sp, size_t c0, const tp__phys *phys,
                         size_t n) {
  TP_FORWARD(tp__platform->map(sp->res, c0 * sp->gran, phys, n));
  tp_error_t err = apply_access(sp, c0 * sp->gran, n * sp->gran);
  if (err != TP_SUCCESS) {
    (void)tp__platform->unmap(sp->res, c0 * sp->gran, n);
    return err;
  }
  atomic_fetch_add_explicit(&sp->maps, n, memory_order_relaxed);
  for (size_t i = 0; i < n; i++)
    set_slot(sp, c0 + i, phys[i]);
  return TP_SUCCESS;
}

tp_error_t tp__space_unmap(tp__space *sp, size_t c0, size_t c1,
                           tp__phys *phys) {
  TP_FORWARD(tp__platform->unmap(sp->res, c0 * sp->gran, c1 - c0));
  atomic_fetch_add_explicit(&sp->unmaps, c1 - c0, memory_order_relaxed);
  for (size_t c = c0; c < c1; c++) {
    phys[c - c0] = sp->phys[c];
    set_slot(sp, c, 0);
  }
  return TP_SUCCESS;
}

/* The ghost that still maps `phys`, if any. */
static tp__ghost *ghost_of(tp__space *sp, tp__phys phys) {
  for (uint32_t i = 0; i < sp->nghosts; i++)
    if (sp->ghosts[i].phys == phys && !sp->ghosts[i].release)
      return &sp->ghosts[i];
  return NULL;
}

tp_error_t tp__space_release(tp__space *sp, const tp__phys *phys, size_t n) {
  tp_error_t first = TP_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    /* A chunk a ghost still maps stays allocated until the ghost goes, and
     * stays counted until then. */
    tp__ghost *g = sp->nghosts ? ghost_of(sp, phys[i]) : NULL;
    if (g) {
      g->release = true;
      continue;
    }
    tp_error_t err = tp__platform->chunk_release(sp->res, phys[i]);
    if (err == TP_SUCCESS) {
      reserved_add(sp, -(int64_t)sp->gran);
      continue;
    }
    if (first == TP_SUCCESS)
      first = err;
    if (TP_ARRAY_ROOM(sp->orphans, sp->norphans, sp->caporphans))
      sp->orphans[sp->norphans++] = phys[i];
  }
  return first;
}

tp_error_t tp__space_detach(tp__space *sp, size_t c0, size_t c1, tp__phys *phys,
                            const tp__tag *tag) {
  for (size_t c = c0; c < c1; c++) {
    if (!TP_ARRAY_ROOM(sp->ghosts, sp->nghosts, sp->capghosts)) {
      while (c-- > c0) { /* undo: the chunks stay where they are */
        tp__ghost *g = &sp->ghosts[--sp->nghosts];
        set_ghost(sp, c, false);
        set_slot(sp, c, g->phys);
        tp__tag_clear(&g->tag);
      }
      return TP_ERROR_OUT_OF_MEMORY;
    }
    tp__ghost *g = &sp->ghosts[sp->nghosts++];
    *g = (tp__ghost){c, sp->phys[c], *tag, false};
    tp__stream_ref(tag->stream);
    phys[c - c0] = sp->phys[c];
    set_slot(sp, c, 0);
    set_ghost(sp, c, true);
  }
  return TP_SUCCESS;
}

tp_error_t tp__space_lend_room(tp__space *sp) {
  return TP_ARRAY_ROOM(sp->lent, sp->nlent, sp->caplent)
             ? TP_SUCCESS
             : TP_ERROR_OUT_OF_MEMORY;
}

void tp__space_lend(tp__space *sp, size_t c) {
  sp->lent[sp->nlent++] = c;
}

static bool lent(const tp__space *sp, size_t c) {
  for (uint32_t i = 0; i < sp->nlent; i++)
    if (sp->lent[i] == c)
      return true;
  return false;
}

void tp__space_unlend(tp__space *sp, size_t c) {
  for (uint32_t i = 0; i < sp->nlent; i++)
    if (sp->lent[i] == c) {
      sp->lent[i] = sp->lent[--sp->nlent];
      return;
    }
}

void tp__space_settle_ghosts(tp__space *sp, bool poll) {
  for (uint32_t i = 0; i < sp->nghosts;) {
    tp__ghost *g = &sp->ghosts[i];
    if (!tp__stream_settles(&g->tag, poll)) {
      i++;
      continue;
    }
    /* An unmap the platform refuses leaves the ghost for the next try. */
    if (tp__platform->unmap(sp->res, g->chunk * sp->gran, 1) != TP_SUCCESS) {
      i++;
      continue;
    }
    atomic_fetch_add_explicit(&sp->unmaps, 1, memory_order_relaxed);
    set_ghost(sp, g->chunk, false);
    if (g->release)
      (void)tp__space_release(sp, &g->phys, 1);
    tp__tag_clear(&g->tag);
    *g = sp->ghosts[--sp->nghosts];
  }
}

tp_error_t tp__space_release_orphans(tp__space *sp) {
  if (!sp->norphans)
    return TP_SUCCESS;
  uint32_t n = sp->norphans;
  tp__phys *v = sp->orphans;
  sp->orphans = NULL;
  sp->norphans = sp->caporphans = 0;
  tp_error_t err = tp__space_release(sp, v, n);
  free(v);
  return err;
}

tp_error_t tp__space_set_access(tp__space *sp, const tp_access_desc_t *list,
                                size_t n) {
  for (size_t c = tp__space_segment_next(sp, 0); c < sp->nchunks;) {
    size_t e = tp__space_segment_end(sp, c);
    TP_FORWARD(tp__platform->set_access(sp->res, c * sp->gran,
                                        (e - c) * sp->gran, list, n));
    c = tp__space_segment_next(sp, e);
  }
  for (size_t i = 0; i < n; i++)
    sp->access[list[i].location.id] = list[i].flags;
  return TP_SUCCESS;
}

/* A teardown has no caller to report to and nothing to try later: a call
 * the platform refuses is asked again a few times before the chunk or range
 * is given up (a transient failure would otherwise leak it). */
#define TP_FINI_TRIES 3

static void fini_unmap(tp__space *sp, size_t c) {
  for (int t = 0; t < TP_FINI_TRIES; t++)
    if (tp__platform->unmap(sp->res, c * sp->gran, 1) == TP_SUCCESS)
      return;
}

static void fini_release(tp__space *sp, tp__phys phys) {
  for (int t = 0; t < TP_FINI_TRIES; t++)
    if (tp__platform->chunk_release(sp->res, phys) == TP_SUCCESS) {
      reserved_add(sp, -(int64_t)sp->gran);
      return;
    }
}

void tp__space_fini(tp__space *sp) {
  if (!sp->phys)
    return;
  for (size_t c = tp__space_segment_next(sp, 0); c < sp->nchunks;) {
    size_t e = tp__space_segment_end(sp, c);
    for (size_t i = c; i < e; i++) {
      fini_unmap(sp, i);
      if (!lent(sp, i))
        fini_release(sp, sp->phys[i]);
    }
    c = tp__space_segment_next(sp, e);
  }
  for (uint32_t i = 0; i < sp->nghosts; i++) {
    tp__ghost *g = &sp->ghosts[i];
    fini_unmap(sp, g->chunk);
    if (g->release)
      fini_release(sp, g->phys);
    tp__tag_clear(&g->tag);
  }
  sp->nghosts = 0;
  for (int t = 0; t < TP_FINI_TRIES && sp->norphans; t++)
    (void)tp__space_release_orphans(sp);
  for (int t = 0; t < TP_FINI_TRIES; t++)
    if (tp__platform->unreserve(sp->res) == TP_SUCCESS)
      break;
}

void tp__space_free(tp__space *sp) {
  if (!sp->phys)
    return;
  for (size_t c = 0; c < sp->nchunks; c++)
    free((void *)atomic_load_explicit(&sp->gtab[c], memory_order_relaxed));
  free_maps(sp);
}
