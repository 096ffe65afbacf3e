/* Graph memory's addresses and mapping: arenas and their chunk caches,
 * graphs' segments and the plan of their granules and slots, what is
 * mapped, and the accounts. Callers hold graph_mem.c's lock ("the lock"). */
#include <string.h>

#include "graph/graph_internal.h"

#define SEG_MIN ((size_t)32 << 20)
#define ARENA_STEP ((size_t)1 << 30)
#define MAX_ARENAS 64

typedef struct range {
  size_t off, size;
} range;

/* A virtual reservation of one device in which segments are carved. Its
 * chunks can move between its segments, so unmapped ones wait in `cache`
 * for the next segment that needs one. */
struct arena {
  int device;
  tp__pres *res;
  uintptr_t base;
  size_t size, gran;
  range *free; /* unused address ranges, sorted by offset */
  uint32_t nfree, capfree;
  tp__phys *cache;
  uint32_t ncache, capcache;
  struct arena *next;
};

/* What is counted per device. */
typedef struct gdev {
  arena *arenas;
  uint64_t used, used_high, reserved, reserved_high;
} gdev;

/* A granule of a segment's addresses. Addresses are never reused within a
 * graph: what a graph reuses is physical memory. Each granule that an
 * allocation has touched is given a slot (a physical chunk to be), either
 * a new one or one whose granule died (all its allocations freed at
 * positions that the new allocation's follows), and both granules then
 * map the slot's chunk, which the graph's order keeps them from using at
 * once. */
struct granule {
  uint32_t slot; /* index + 1 in the graph's slots; 0: not used yet */
  bool mapped;
  uint32_t *occ; /* the allocations that overlap it */
  uint32_t nocc, capocc;
};

struct slot {
  tp__phys phys; /* 0 while no granule maps it */
  uint32_t maps;
  segment *seg; /* the granule that holds it now */
  size_t g;
  bool handed; /* it came from a granule that died */
};

/* Under graph_mem.c's lock, but for the arenas' ranges. */
static gdev devs[TP__GMEM_MAX_DEVICES];
static segment **segreg; /* every segment, sorted by base */
static uint32_t nsegreg, capsegreg;
/* The address ranges of the arenas, append-only, for a lock-free "is this
 * graph memory at all" before a free takes the lock. */
static _Atomic uintptr_t arena_lo[MAX_ARENAS], arena_hi[MAX_ARENAS];
static _Atomic uint32_t narenas;

/* ---- accounts -------------------------------------------------------------
 * Under the lock. */

static void count_used(int d, size_t bytes, bool add) {
  gdev *g = &devs[d];
  g->used = add ? g->used + bytes : g->used - bytes;
  g->used_high = tp__max_u64(g->used_high, g->used);
}

static void count_reserved(int d, size_t bytes, bool add) {
  gdev *g = &devs[d];
  g->reserved = add ? g->reserved + bytes : g->reserved - bytes;
  g->reserved_high = tp__max_u64(g->reserved_high, g->reserved);
}

/* ---- arenas ---------------------------------------------------------------
 */

bool tp__gspace_in_arenas(uintptr_t addr) {
  uint32_t n = atomic_load_explicit(&narenas, memory_order_acquire);
  if (n >= MAX_ARENAS)
    return true;
  for (uint32_t i = 0; i < n; i++)
    if (addr >= atomic_load_explicit(&arena_lo[i], memory_order_relaxed) &&
        addr < atomic_load_explicit(&arena_hi[i], memory_order_relaxed))
      return true;
  return false;
}

static tp__mem_kind device_kind(int device) {
  return (tp__mem_kind){.location = {TP_LOCATION_DEVICE, device, 0},
                        .type = TP_ALLOCATION_PINNED};
}

/* A new arena of the device with room for a segment of `need` bytes: twice
 * the device's memory, so that one arena serves every graph of a process
 * that fits on the device. */
static tp_error_t arena_new(int device, size_t need, arena **out) {
  tp__mem_kind kind = device_kind(device);
  size_t gran = 0;
  uint64_t capacity = 0;
  TP_FORWARD(tp__platform->mem_query(&kind, &gran, &capacity));
  uint64_t want = tp__max_u64(capacity * 2, (uint64_t)need * 2);
  TP_RETURN_IF(want > SIZE_MAX - ARENA_STEP || need > SIZE_MAX / 2,
               TP_ERROR_OUT_OF_MEMORY);
  size_t size = tp__align_up((size_t)want, ARENA_STEP);
  arena *a = calloc(1, sizeof *a);
  TP_RETURN_IF(!a, TP_ERROR_OUT_OF_MEMORY);
  a->free = malloc(sizeof *a->free);
  if (!a->free) {
    free(a);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  tp_error_t err =
      tp__platform->reserve(&kind, size, ARENA_STEP, &a->res, &a->base);
  if (err != TP_SUCCESS) {
    free(a->free);
    free(a);
    return err;
  }
  a->device = device;
  a->size = size;
  a->gran = gran;
  a->free[0] = (range){0, size};
  a->nfree = a->capfree = 1;
  a->next = devs[device].arenas;
  devs[device].arenas = a;
  uint32_t i = atomic_load(&narenas);
  if (i < MAX_ARENAS) {
    atomic_store(&arena_lo[i], a->base);
    atomic_store(&arena_hi[i], a->base + size);
  }
  atomic_store_explicit(&narenas, i + 1, memory_order_release);
  *out = a;
  return TP_SUCCESS;
}

static bool va_take(arena *a, size_t size, size_t *off) {
  for (uint32_t i = 0; i < a->nfree; i++) {
    if (a->free[i].size < size)
      continue;
    *off = a->free[i].off;
    a->free[i].off += size;
    a->free[i].size -= size;
    if (a->free[i].size == 0) {
      memmove(&a->free[i], &a->free[i + 1],
              (a->nfree - i - 1) * sizeof *a->free);
      a->nfree--;
    }
    return true;
  }
  return false;
}

/* Gives a range back, merging with its neighbours. Should the list not
 * grow, the range is lost to this arena, which only wastes addresses. */
static void va_give(arena *a, size_t off, size_t size) {
  uint32_t i = 0;
  while (i < a->nfree && a->free[i].off < off)
    i++;
  bool left = i > 0 && a->free[i - 1].off + a->free[i - 1].size == off;
  bool right = i < a->nfree && off + size == a->free[i].off;
  if (left && right) {
    a->free[i - 1].size += size + a->free[i].size;
    memmove(&a->free[i], &a->free[i + 1], (a->nfree - i - 1) * sizeof *a->free);
    a->nfree--;
  } else if (left) {
    a->free[i - 1].size += size;
  } else if (right) {
    a->free[i].off = off;
    a->free[i].size += size;
  } else if (TP_ARRAY_ROOM(a->free, a->nfree, a->capfree)) {
    memmove(&a->free[i + 1], &a->free[i], (a->nfree - i) * sizeof *a->free);
    a->free[i] = (range){off, size};
    a->nfree++;
  }
}

/* ---- mapping --------------------------------------------------------------
 * Under the lock. */

static size_t access_list(const tp__gmem_kind *k, tp_access_desc_t *list) {
  size_t n = 0;
  for (int d = 0; d < TP__GMEM_MAX_DEVICES; d++) {
    tp_access_flags_t f = d == k->device ? TP_ACCESS_READ_WRITE : k->access[d];
    if (f != TP_ACCESS_NONE)
      list[n++] = (tp_access_desc_t){{TP_LOCATION_DEVICE, d, 0}, f};
  }
  return n;
}

static slot *slot_of(const segment *sg, size_t g) {
  return &sg->gm->slots[sg->gr[g].slot - 1];
}

/* Releases the chunks an arena caches; those the platform refuses stay,
 * and the first refusal goes to *first where that is still SUCCESS.
 * Whether any went. */
static bool cache_release(arena *a, tp_error_t *first) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < a->ncache; i++) {
    tp_error_t err = tp__platform->chunk_release(a->res, a->cache[i]);
    if (err == TP_SUCCESS) {
      count_reserved(a->device, a->gran, false);
      continue;
    }
    a->cache[kept++] = a->cache[i];
    if (*first == TP_SUCCESS)
      *first = err;
  }
  bool went = kept < a->ncache;
  a->ncache = kept;
  return went;
}

/* Releases the chunks cached by the device's arenas other than `but` (a
 * chunk is made in its arena's reservation, and serves only there);
 * whether any went. */
static bool release_other_caches(const arena *but) {
  bool went = false;
  tp_error_t ignored = TP_SUCCESS;
  for (arena *a = devs[but->device].arenas; a; a = a->next)
    if (a != but)
      went |= cache_release(a, &ignored);
  return went;
}

/* Gives a slot a chunk: from the arena's cache, or a new one. Where the
 * device is full, the chunks other arenas cache make room first: they
 * stayed there once the graphs that used them were gone, and a graph of
 * another arena then failed out of memory with nothing in use (until a
 * trim). */
static tp_error_t slot_fill(arena *a, slot *sl) {
  if (sl->phys)
    return TP_SUCCESS;
  if (a->ncache) {
    sl->phys = a->cache[--a->ncache];
  } else {
    tp_error_t err = tp__platform->chunk_create(a->res, &sl->phys);
    if (err == TP_ERROR_OUT_OF_MEMORY && release_other_caches(a))
      err = tp__platform->chunk_create(a->res, &sl->phys);
    TP_FORWARD(err);
    count_reserved(a->device, a->gran, true);
  }
  count_used(a->device, a->gran, true);
  return TP_SUCCESS;
}

/* A slot that no granule maps gives its chunk up: to the cache, or back to
 * the platform when the cache cannot grow (failing that, it keeps it). */
static void slot_empty(arena *a, slot *sl) {
  if (sl->maps || !sl->phys)
    return;
  if (TP_ARRAY_ROOM(a->cache, a->ncache, a->capcache))
    a->cache[a->ncache++] = sl->phys;
  else if (tp__platform->chunk_release(a->res, sl->phys) == TP_SUCCESS)
    count_reserved(a->device, a->gran, false);
  else
    return;
  sl->phys = 0;
  count_used(a->device, a->gran, false);
}

/* Maps granules [first, first + n) of sg, all unmapped, each on its slot's
 * chunk. All or nothing. */
static tp_error_t map_run(segment *sg, size_t first, size_t n) {
  arena *a = sg->a;
  tp__phys *phys = calloc(n, sizeof *phys);
  TP_RETURN_IF(!phys, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t err = TP_SUCCESS;
  size_t filled = 0;
  for (; filled < n && err == TP_SUCCESS; filled++) {
    slot *sl = slot_of(sg, first + filled);
    err = slot_fill(a, sl);
    phys[filled] = sl->phys;
  }
  size_t off = sg->off + first * a->gran;
  if (err == TP_SUCCESS)
    err = tp__platform->map(a->res, off, phys, n);
  if (err == TP_SUCCESS) {
    tp_access_desc_t list[TP__GMEM_MAX_DEVICES];
    size_t count = access_list(&sg->kind, list);
    err = tp__platform->set_access(a->res, off, n * a->gran, list, count);
    if (err != TP_SUCCESS)
      (void)tp__platform->unmap(a->res, off, n);
  }
  for (size_t i = 0; i < filled; i++) {
    slot *sl = slot_of(sg, first + i);
    if (err == TP_SUCCESS) {
      sg->gr[first + i].mapped = true;
      sl->maps++;
    } else {
      slot_empty(a, sl);
    }
  }
  free(phys);
  return err;
}

/* Maps every granule of sg in [from, to) that has a slot and is not
 * mapped. */
static tp_error_t seg_map(segment *sg, size_t from, size_t to) {
  for (size_t i = from; i < to;) {
    if (sg->gr[i].mapped || !sg->gr[i].slot) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < to && !sg->gr[j].mapped && sg->gr[j].slot)
      j++;
    TP_FORWARD(map_run(sg, i, j - i));
    i = j;
  }
  return TP_SUCCESS;
}

static size_t granules(const segment *sg) {
  return sg->size / sg->a->gran;
}

tp_error_t tp__gspace_map(tp__gmem *gm) {
  for (uint32_t i = 0; i < gm->nsegs; i++)
    TP_FORWARD(seg_map(gm->segs[i], 0, granules(gm->segs[i])));
  return TP_SUCCESS;
}

static void unmap_granule(segment *sg, size_t g) {
  arena *a = sg->a;
  if (tp__platform->unmap(a->res, sg->off + g * a->gran, 1) != TP_SUCCESS)
    return; /* stays mapped and counted; a later pass tries again */
  sg->gr[g].mapped = false;
  slot *sl = slot_of(sg, g);
  sl->maps--;
  slot_empty(a, sl);
}

void tp__gspace_unmap(tp__gmem *gm, bool all) {
  for (uint32_t k = 0; k < gm->nsegs; k++) {
    segment *sg = gm->segs[k];
    size_t n = granules(sg);
    unsigned char *pin = all ? NULL : calloc(n, 1);
    if (!all && !pin)
      continue; /* memory is short: try again at the next pass */
    for (uint32_t i = 0; pin && i < gm->nallocs; i++) {
      const allocation *al = &gm->allocs[i];
      if (al->seg != sg || (!al->live && !al->free_ev))
        continue;
      size_t lo = al->off / sg->a->gran;
      size_t hi = (al->off + al->size - 1) / sg->a->gran;
      memset(&pin[lo], 1, hi - lo + 1);
    }
    for (size_t i = 0; i < n; i++)
      if (sg->gr[i].mapped && !(pin && pin[i]))
        unmap_granule(sg, i);
    free(pin);
  }
}

/* ---- segments and the plan ------------------------------------------------
 * Under the lock. */

segment *tp__gspace_seg_find(uintptr_t addr) {
  uint32_t lo = 0, hi = nsegreg;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (segreg[mid]->base + segreg[mid]->size <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < nsegreg && segreg[lo]->base <= addr ? segreg[lo] : NULL;
}

static void seg_unregister(segment *sg) {
  uint32_t i = 0;
  while (i < nsegreg && segreg[i] != sg)
    i++;
  if (i < nsegreg) {
    memmove(&segreg[i], &segreg[i + 1], (nsegreg - i - 1) * sizeof *segreg);
    nsegreg--;
  }
}

static bool same_kind(const tp__gmem_kind *a, const tp__gmem_kind *b) {
  return a->device == b->device &&
         memcmp(a->access, b->access, sizeof a->access) == 0;
}

/* A new segment of gm for allocations of `kind`: at least `need` bytes,
 * and twice the largest of its kind so far, so that a graph needs few. */
static tp_error_t seg_new(tp__gmem *gm, const tp__gmem_kind *kind, size_t need,
                          segment **out) {
  size_t size = SEG_MIN;
  for (uint32_t i = 0; i < gm->nsegs; i++)
    if (same_kind(&gm->segs[i]->kind, kind) &&
        gm->segs[i]->size <= SIZE_MAX / 4)
      size = size > 2 * gm->segs[i]->size ? size : 2 * gm->segs[i]->size;
  size = need > size ? need : size;
  arena *a = devs[kind->device].arenas;
  size_t off = 0;
  for (; a; a = a->next)
    if (va_take(a, tp__align_up(size, a->gran), &off))
      break;
  if (!a) {
    TP_FORWARD(arena_new(kind->device, size, &a));
    TP_RETURN_IF(!va_take(a, tp__align_up(size, a->gran), &off),
                 TP_ERROR_OUT_OF_MEMORY);
  }
  size = tp__align_up(size, a->gran);
  segment *sg = calloc(1, sizeof *sg);
  granule *gr = calloc(size / a->gran, sizeof *gr);
  bool ok = sg && gr && TP_ARRAY_ROOM(gm->segs, gm->nsegs, gm->capsegs) &&
            TP_ARRAY_ROOM(segreg, nsegreg, capsegreg);
  if (!ok) {
    free(gr);
    free(sg);
    va_give(a, off, size);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *sg = (segment){.gm = gm,
                  .a = a,
                  .kind = *kind,
                  .base = a->base + off,
                  .off = off,
                  .size = size,
                  .gr = gr};
  gm->segs[gm->nsegs++] = sg;
  uint32_t i = 0;
  while (i < nsegreg && segreg[i]->base < sg->base)
    i++;
  memmove(&segreg[i + 1], &segreg[i], (nsegreg - i) * sizeof *segreg);
  segreg[i] = sg;
  nsegreg++;
  *out = sg;
  return TP_SUCCESS;
}

static void seg_free(segment *sg) {
  seg_unregister(sg);
  va_give(sg->a, sg->off, sg->size);
  for (size_t i = 0; i < granules(sg); i++)
    free(sg->gr[i].occ);
  free(sg->gr);
  free(sg);
}

void tp__gspace_release(tp__gmem *gm) {
  tp__gspace_unmap(gm, true);
  for (uint32_t i = 0; i < gm->nsegs; i++)
    seg_free(gm->segs[i]);
}

allocation *tp__gspace_alloc_at(uintptr_t addr, uint32_t *index) {
  segment *sg = tp__gspace_seg_find(addr);
  if (!sg)
    return NULL;
  size_t off = addr - sg->base;
  const granule *g = &sg->gr[off / sg->a->gran];
  for (uint32_t i = 0; i < g->nocc; i++) {
    allocation *al = &sg->gm->allocs[g->occ[i]];
    if (al->seg == sg && al->off == off) {
      *index = g->occ[i];
      return al;
    }
  }
  return NULL;
}

/* The granule at sg's top when top is inside it: later allocations may
 * still join it, so it can neither die nor give its slot away. */
static bool open_granule(const segment *sg, size_t g) {
  return sg->top % sg->a->gran && g == sg->top / sg->a->gran;
}

static bool add_node(tp__pnode **nodes, uint32_t *n, uint32_t *cap,
                     tp__pnode v) {
  for (uint32_t i = 0; i < *n; i++)
    if ((*nodes)[i] == v)
      return true;
  if (!TP_ARRAY_ROOM(*nodes, *n, *cap))
    return false;
  (*nodes)[(*n)++] = v;
  return true;
}

static bool node_followed(const tp__pnode *nodes, const unsigned char *follows,
                          uint32_t n, tp__pnode v) {
  for (uint32_t i = 0; i < n; i++)
    if (nodes[i] == v)
      return follows[i];
  return false;
}

/* Sets ok[i] for each slot of the arena that work captured on ps from now
 * on may take over: the granule holding it died, every allocation in it
 * freed at a position that ps's work follows. */
static tp_error_t find_donors(tp__gmem *gm, tp__pstream *ps, const arena *a,
                              unsigned char *ok) {
  tp__pnode *nodes = NULL;
  uint32_t n = 0, cap = 0;
  tp_error_t err = TP_SUCCESS;
  for (uint32_t i = 0; i < gm->nslots && err == TP_SUCCESS; i++) {
    const slot *sl = &gm->slots[i];
    ok[i] = 0;
    if (sl->seg->a != a || open_granule(sl->seg, sl->g))
      continue;
    const granule *h = &sl->seg->gr[sl->g];
    bool dead = true;
    for (uint32_t k = 0; k < h->nocc && dead; k++)
      dead = gm->allocs[h->occ[k]].freed_in_graph;
    for (uint32_t k = 0; k < h->nocc && dead && err == TP_SUCCESS; k++)
      if (!add_node(&nodes, &n, &cap, gm->allocs[h->occ[k]].freed_at))
        err = TP_ERROR_OUT_OF_MEMORY;
    ok[i] = dead;
  }
  unsigned char *follows = n ? malloc(n) : NULL;
  if (err == TP_SUCCESS && n && !follows)
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS && n)
    err = tp__platform->capture_follows(ps, nodes, n, follows);
  for (uint32_t i = 0; i < gm->nslots; i++) {
    const slot *sl = &gm->slots[i];
    const granule *h = ok[i] && err == TP_SUCCESS ? &sl->seg->gr[sl->g] : NULL;
    for (uint32_t k = 0; h && k < h->nocc && ok[i]; k++)
      ok[i] = node_followed(nodes, follows, n, gm->allocs[h->occ[k]].freed_at);
    if (err != TP_SUCCESS)
      ok[i] = 0;
  }
  free(nodes);
  free(follows);
  return err;
}

/* Where `need` bytes of `kind` go: the first segment with room above its
 * top. An allocation of a granule or more starts on a granule of its own,
 * so that it spans no more granules than it must (each of which needs a
 * chunk); small ones share one. None joins an open granule whose slot came
 * from another granule, since it might not follow that granule's frees. */
static tp_error_t plan_place(tp__gmem *gm, const tp__gmem_kind *kind,
                             size_t need, segment **out, size_t *start) {
  for (uint32_t k = 0; k < gm->nsegs; k++) {
    segment *sg = gm->segs[k];
    if (!same_kind(&sg->kind, kind))
      continue;
    size_t at = sg->top;
    size_t g = at / sg->a->gran;
    if (need >= sg->a->gran || (open_granule(sg, g) && slot_of(sg, g)->handed))
      at = tp__align_up(at, sg->a->gran);
    if (at <= sg->size && need <= sg->size - at) {
      *out = sg;
      *start = at;
      return TP_SUCCESS;
    }
  }
  *start = 0;
  return seg_new(gm, kind, need, out);
}

tp_error_t tp__gspace_plan(tp__gmem *gm, tp__pstream *ps,
                           const tp__gmem_kind *kind, size_t need, void **ptr) {
  segment *sg = NULL;
  size_t start = 0;
  TP_FORWARD(plan_place(gm, kind, need, &sg, &start));
  size_t gran = sg->a->gran;
  size_t first = start / gran, last = (start + need - 1) / gran;
  size_t fresh = first + (sg->gr[first].slot != 0); /* first new granule */
  size_t nfresh = last + 1 - fresh;
  TP_RETURN_IF(!TP_ARRAY_ROOM(gm->allocs, gm->nallocs, gm->capallocs),
               TP_ERROR_OUT_OF_MEMORY);
  for (size_t g = first; g <= last; g++)
    TP_RETURN_IF(
        !TP_ARRAY_ROOM(sg->gr[g].occ, sg->gr[g].nocc, sg->gr[g].capocc),
        TP_ERROR_OUT_OF_MEMORY);
  for (size_t i = 0; i < nfresh; i++)
    TP_RETURN_IF(
        !TP_ARRAY_ROOM(gm->slots, gm->nslots + (uint32_t)i, gm->capslots),
        TP_ERROR_OUT_OF_MEMORY);
  unsigned char *ok = gm->nslots ? calloc(gm->nslots, 1) : NULL;
  TP_RETURN_IF(gm->nslots && !ok, TP_ERROR_OUT_OF_MEMORY);
  slot *saved = nfresh ? calloc(nfresh, sizeof *saved) : NULL;
  uint32_t *taken = nfresh ? calloc(nfresh, sizeof *taken) : NULL;
  tp_error_t err =
      nfresh && (!saved || !taken) ? TP_ERROR_OUT_OF_MEMORY : TP_SUCCESS;
  if (err == TP_SUCCESS && nfresh && gm->nslots)
    err = find_donors(gm, ps, sg->a, ok);
  /* Each new granule takes a dead granule's slot, or a new slot. */
  uint32_t old_nslots = gm->nslots, next_donor = 0;
  for (size_t i = 0; err == TP_SUCCESS && i < nfresh; i++) {
    while (next_donor < old_nslots && !ok[next_donor])
      next_donor++;
    uint32_t idx;
    if (next_donor < old_nslots) {
      idx = next_donor++;
      saved[i] = gm->slots[idx];
      gm->slots[idx].handed = true;
    } else {
      idx = gm->nslots++;
      gm->slots[idx] = (slot){0};
    }
    gm->slots[idx].seg = sg;
    gm->slots[idx].g = fresh + i;
    sg->gr[fresh + i].slot = idx + 1;
    taken[i] = idx;
  }
  if (err == TP_SUCCESS && gm->holds)
    err = seg_map(sg, fresh, last + 1);
  if (err != TP_SUCCESS) {
    /* Back to how it was: the donors to their granules, new slots gone. */
    for (size_t i = 0; taken && i < nfresh; i++) {
      if (!sg->gr[fresh + i].slot)
        break;
      if (taken[i] < old_nslots)
        gm->slots[taken[i]] = saved[i];
      sg->gr[fresh + i].slot = 0;
    }
    gm->nslots = old_nslots;
  } else {
    uint32_t index = gm->nallocs++;
    gm->allocs[index] = (allocation){.seg = sg, .off = start, .size = need};
    for (size_t g = first; g <= last; g++)
      sg->gr[g].occ[sg->gr[g].nocc++] = index;
    sg->top = start + need;
    *ptr = (void *)(sg->base + start);
  }
  free(ok);
  free(saved);
  free(taken);
  return err;
}

/* ---- trim and the accounts ------------------------------------------------
 * Under the lock. */

tp_error_t tp__gspace_trim(int device) {
  tp_error_t first = TP_SUCCESS;
  for (arena *a = devs[device].arenas; a; a = a->next)
    (void)cache_release(a, &first);
  return first;
}

void tp__gspace_mark(tp__gspace_marks *m) {
  for (int d = 0; d < TP__GMEM_MAX_DEVICES; d++) {
    m->used_high[d] = devs[d].used_high;
    m->reserved[d] = devs[d].reserved;
    m->reserved_high[d] = devs[d].reserved_high;
  }
}

void tp__gspace_rollback(const tp__gspace_marks *m) {
  for (int d = 0; d < TP__GMEM_MAX_DEVICES; d++) {
    gdev *g = &devs[d];
    /* Any cached chunk will do: the cache holds the chunks the failed call
     * made and those it took and gave back alike. */
    for (arena *a = g->arenas; a && g->reserved > m->reserved[d]; a = a->next)
      while (a->ncache && g->reserved > m->reserved[d] &&
             tp__platform->chunk_release(a->res, a->cache[a->ncache - 1]) ==
                 TP_SUCCESS) {
        a->ncache--;
        count_reserved(d, a->gran, false);
      }
    g->used_high = tp__max_u64(m->used_high[d], g->used);
    g->reserved_high = tp__max_u64(m->reserved_high[d], g->reserved);
  }
}

tp_error_t tp__gspace_get_attr(int device, tp_graph_mem_attr_t attr,
                               uint64_t *value) {
  const gdev *g = &devs[device];
  switch (attr) {
  case TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *value = g->used; break;
  case TP_GRAPH_MEM_ATTR_USED_MEM_HIGH: *value = g->used_high; break;
  case TP_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *value = g->reserved; break;
  case TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *value = g->reserved_high; break;
  default: return TP_ERROR_INVALID_VALUE;
  }
  return TP_SUCCESS;
}

tp_error_t tp__gspace_reset_high(int device, tp_graph_mem_attr_t attr) {
  gdev *g = &devs[device];
  if (attr == TP_GRAPH_MEM_ATTR_USED_MEM_HIGH)
    g->used_high = g->used;
  else if (attr == TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
    g->reserved_high = g->reserved;
  else
    return TP_ERROR_INVALID_VALUE;
  return TP_SUCCESS;
}
