/* Graph memory (see graph_mem.h): arenas and their chunk caches, each
 * graph's segments and plan, mapping while a graph is held, the liveness of
 * allocations that outlive launches, and the per-device accounts. */
#include <pthread.h>
#include <string.h>

#include "graph/graph_mem.h"

#define ALIGN ((size_t)512) /* allocation step and alignment, as the pools' */
#define SEG_MIN ((size_t)32 << 20)
#define ARENA_STEP ((size_t)1 << 30)
#define MAX_ARENAS 64

typedef struct range {
  size_t off, size;
} range;

/* A virtual reservation of one device in which segments are carved. Its
 * chunks can move between its segments, so unmapped ones wait in `cache`
 * for the next segment that needs one. */
typedef struct arena {
  int device;
  tp__pres *res;
  uintptr_t base;
  size_t size, gran;
  range *free; /* unused address ranges, sorted by offset */
  uint32_t nfree, capfree;
  tp__phys *cache;
  uint32_t ncache, capcache;
  struct arena *next;
} arena;

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
typedef struct granule {
  uint32_t slot; /* index + 1 in the graph's slots; 0: not used yet */
  bool mapped;
  uint32_t *occ; /* the allocations that overlap it */
  uint32_t nocc, capocc;
} granule;

typedef struct segment {
  tp__gmem *gm;
  arena *a;
  tp__gmem_kind kind;
  uintptr_t base;
  size_t off, size; /* off: in the arena */
  size_t top;       /* bytes handed out, from the start */
  granule *gr;      /* size / the arena's granularity */
} segment;

typedef struct slot {
  tp__phys phys; /* 0 while no granule maps it */
  uint32_t maps;
  segment *seg; /* the granule that holds it now */
  size_t g;
  bool handed; /* it came from a granule that died */
} slot;

typedef struct allocation {
  segment *seg;
  size_t off, size;
  bool freed_in_graph;
  tp__pnode freed_at; /* where, when freed in the graph */
  bool live;          /* outlives launches: live from a launch until its free */
  bool freed_unseen;  /* freed once after launches tidepool did not see */
  /* Where it was last freed outside its graph: the next launch waits for
   * it, and its granules stay mapped until it has completed. */
  tp__pevent *free_ev;
} allocation;

/* An allocation of another graph that this graph frees at each launch. */
typedef struct foreign {
  tp__gmem *owner;
  uint32_t alloc;
} foreign;

/* What a platform release callback hands back: a graph gone (with its
 * execs), or one exec gone. Allocated beforehand so that the callback only
 * links it. */
typedef struct token {
  struct token *next;
  tp__gmem *gm;
  bool graph;
} token;

struct tp__gmem {
  uint64_t capture_id;
  bool attached;    /* the graph, or an exec of it, lives */
  void *tie;        /* capture_attach's, for capture_detach */
  token *token;     /* what the tie's release hands back */
  bool seen;        /* tidepool ended the capture: it sees every launch */
  bool self_held;   /* tie detached: tidepool tells when the graph goes */
  bool graph_gone;  /* self-held: its handle was destroyed */
  uint32_t running; /* self-held: destroyed execs whose launches may run */
  bool sealed;      /* instantiated: the capture is over, the plan fixed */
  bool books;       /* sealed with allocations that outlive, or foreign frees */
  uint32_t holds;   /* reasons to keep the plan mapped */
  uint32_t execs;   /* tidepool execs alive */
  uint32_t refs;    /* other graphs' foreign frees of its allocations */
  segment **segs;
  uint32_t nsegs, capsegs;
  slot *slots;
  uint32_t nslots, capslots;
  allocation *allocs;
  uint32_t nallocs, capallocs;
  foreign *foreign;
  uint32_t nforeign, capforeign;
  uint32_t nlive, npending;
  tp__gmem *prev, *next_gm;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static gdev devs[TP__GMEM_MAX_DEVICES];
static tp__gmem *gmems;
static tp__gmem *last_capture;
static segment **segreg; /* every segment, sorted by base */
static uint32_t nsegreg, capsegreg;
/* The address ranges of the arenas, append-only, for a lock-free "is this
 * graph memory at all" before a free takes the lock. */
static _Atomic uintptr_t arena_lo[MAX_ARENAS], arena_hi[MAX_ARENAS];
static _Atomic uint32_t narenas;
static _Atomic(token *) released;

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

static bool in_arenas(uintptr_t addr) {
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

/* Gives a slot a chunk: from the arena's cache, or a new one. */
static tp_error_t slot_fill(arena *a, slot *sl) {
  if (sl->phys)
    return TP_SUCCESS;
  if (a->ncache) {
    sl->phys = a->cache[--a->ncache];
  } else {
    TP_FORWARD(tp__platform->chunk_create(a->res, &sl->phys));
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

static void unmap_granule(segment *sg, size_t g) {
  arena *a = sg->a;
  if (tp__platform->unmap(a->res, sg->off + g * a->gran, 1) != TP_SUCCESS)
    return; /* stays mapped and counted; a later pass tries again */
  sg->gr[g].mapped = false;
  slot *sl = slot_of(sg, g);
  sl->maps--;
  slot_empty(a, sl);
}

/* Unmaps what gm no longer needs mapped: everything but the granules under
 * allocations that are live or whose free has not completed (all of it
 * when `all`). */
static void gmem_unmap(tp__gmem *gm, bool all) {
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

static segment *seg_find(uintptr_t addr) {
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

/* The allocation that starts at addr, or NULL; its index in *index. */
static allocation *alloc_at(uintptr_t addr, uint32_t *index) {
  segment *sg = seg_find(addr);
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

/* Plans an allocation of `need` bytes at ps's position and maps what it
 * needs where the graph is held; on failure nothing changed but room
 * reserved. */
static tp_error_t plan(tp__gmem *gm, tp__pstream *ps, const tp__gmem_kind *kind,
                       size_t need, void **ptr) {
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

/* ---- graphs' memory -------------------------------------------------------
 */

static void set_live(tp__gmem *gm, allocation *al, bool live);

static void on_release(void *arg) {
  token *t = arg;
  token *head = atomic_load_explicit(&released, memory_order_relaxed);
  do {
    t->next = head;
  } while (!atomic_compare_exchange_weak_explicit(
      &released, &head, t, memory_order_release, memory_order_relaxed));
}

static bool gmem_idle(const tp__gmem *gm) {
  return !gm->attached && gm->holds == 0 && gm->refs == 0 && gm->nlive == 0 &&
         gm->npending == 0;
}

static void gmem_free(tp__gmem *gm) {
  gmem_unmap(gm, true);
  for (uint32_t i = 0; i < gm->nsegs; i++)
    seg_free(gm->segs[i]);
  for (uint32_t i = 0; i < gm->nforeign; i++)
    gm->foreign[i].owner->refs--;
  if (gm->prev)
    gm->prev->next_gm = gm->next_gm;
  else
    gmems = gm->next_gm;
  if (gm->next_gm)
    gm->next_gm->prev = gm->prev;
  if (last_capture == gm)
    last_capture = NULL;
  free(gm->segs);
  free(gm->slots);
  free(gm->allocs);
  free(gm->foreign);
  free(gm);
}

/* Drops the event of a free outside the graph once it has been waited for
 * or has completed. */
static void drop_free_ev(tp__gmem *gm, allocation *al) {
  (void)tp__platform->event_destroy(al->free_ev);
  al->free_ev = NULL;
  gm->npending--;
}

/* Frees the memory of graphs that are gone and unmaps what no graph needs
 * any more. Under the lock. */
static void sweep(void) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (tp__gmem *gm = gmems, *next; gm; gm = next) {
      next = gm->next_gm;
      if (gmem_idle(gm)) {
        gmem_free(gm);
        changed = true;
      } else if (gm->holds == 0) {
        gmem_unmap(gm, false);
      }
    }
  }
}

/* A self-held graph goes, as its tie's release would have said, once its
 * handle is destroyed and no exec of it lives or runs. Under the lock. */
static void self_release(tp__gmem *gm) {
  if (!gm->self_held || !gm->attached || !gm->graph_gone || gm->execs ||
      gm->running)
    return;
  gm->attached = false;
  gm->holds--;
  sweep();
}

/* A graph tidepool did not see launched is gone: each allocation it did
 * not free may have been made by a launch and be in use, as CUDA lets an
 * allocation outlive its graph, so it stays mapped until its one free
 * (one never made, its graph never launched, is kept for the process's
 * life: tidepool cannot tell). Under the lock. */
static void keep_outputs(tp__gmem *gm) {
  for (uint32_t i = 0; i < gm->nallocs; i++) {
    allocation *al = &gm->allocs[i];
    if (al->freed_in_graph || al->freed_unseen || al->live)
      continue;
    al->freed_unseen = true;
    set_live(gm, al, true);
  }
}

/* Applies what the platform released, unmaps what no graph needs any more
 * and frees the memory of graphs that are gone; with `poll`, asks first
 * whether pending frees outside graphs have completed (not during a
 * capture, where an application's capture mode might object to the
 * question). Under the lock. */
static void collect(bool poll) {
  token *t = atomic_exchange_explicit(&released, NULL, memory_order_acquire);
  bool changed = t != NULL;
  while (t) {
    token *next = t->next;
    tp__gmem *gm = t->gm;
    if (t->graph) {
      gm->attached = false;
      gm->token = NULL;
      if (!gm->seen && tp__platform->graph_maps_at_capture())
        keep_outputs(gm);
    }
    if (!t->graph || tp__platform->graph_maps_at_capture())
      gm->holds--;
    free(t);
    t = next;
  }
  for (tp__gmem *gm = gmems; poll && gm; gm = gm->next_gm) {
    for (uint32_t i = 0; gm->npending && i < gm->nallocs; i++) {
      allocation *al = &gm->allocs[i];
      if (al->free_ev && tp__platform->event_query(al->free_ev) == TP_SUCCESS) {
        drop_free_ev(gm, al);
        changed = true;
      }
    }
  }
  if (changed)
    sweep();
}

static tp__gmem *gmem_find(uint64_t capture_id) {
  if (last_capture && last_capture->capture_id == capture_id)
    return last_capture;
  for (tp__gmem *gm = gmems; gm; gm = gm->next_gm)
    if (gm->capture_id == capture_id)
      return last_capture = gm;
  return NULL;
}

/* The memory of the graph that capture_id on ps builds, made and tied to
 * that graph on first use. */
static tp_error_t gmem_of(tp__pstream *ps, uint64_t capture_id,
                          tp__gmem **out) {
  tp__gmem *gm = gmem_find(capture_id);
  if (gm) {
    *out = gm;
    return TP_SUCCESS;
  }
  gm = calloc(1, sizeof *gm);
  token *t = calloc(1, sizeof *t);
  if (!gm || !t) {
    free(gm);
    free(t);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *t = (token){.gm = gm, .graph = true};
  tp_error_t err = tp__platform->capture_attach(ps, on_release, t, &gm->tie);
  if (err != TP_SUCCESS) {
    free(gm);
    free(t);
    return err;
  }
  gm->capture_id = capture_id;
  gm->token = t;
  gm->attached = true;
  gm->holds = tp__platform->graph_maps_at_capture() ? 1 : 0;
  gm->next_gm = gmems;
  if (gmems)
    gmems->prev = gm;
  gmems = gm;
  *out = last_capture = gm;
  return TP_SUCCESS;
}

tp_error_t tp__gmem_malloc(tp__pstream *ps, uint64_t capture_id,
                           const tp__gmem_kind *kind, size_t size, void **ptr) {
  TP_RETURN_IF(!ps || !kind || !ptr, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(kind->device < 0 || kind->device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(size > SIZE_MAX / 4, TP_ERROR_OUT_OF_MEMORY);
  size_t need = tp__align_up(size, ALIGN);
  pthread_mutex_lock(&lock);
  collect(false);
  tp__gmem *gm = NULL;
  tp_error_t err = gmem_of(ps, capture_id, &gm);
  if (err == TP_SUCCESS && gm->sealed)
    err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (err == TP_SUCCESS)
    err = plan(gm, ps, kind, need, ptr);
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_free_captured(tp__pstream *ps, uint64_t capture_id,
                                  void *ptr) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!in_arenas((uintptr_t)ptr), TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&lock);
  collect(false);
  uint32_t index = 0;
  allocation *al = alloc_at((uintptr_t)ptr, &index);
  tp__gmem *owner = al ? al->seg->gm : NULL, *gm = NULL;
  tp_error_t err = al ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && owner->capture_id == capture_id && !owner->sealed) {
    /* Its own graph: the bytes are free after this point of the capture. */
    tp__pnode at = 0;
    err = al->freed_in_graph ? TP_ERROR_INVALID_VALUE
                             : tp__platform->capture_point(ps, &at);
    if (err == TP_SUCCESS) {
      al->freed_in_graph = true;
      al->freed_at = at;
    }
  } else if (err == TP_SUCCESS) {
    /* Another graph's allocation: only one that outlives its launches
     * (its capture over, not freed in it), freed once per launch here. */
    if (!owner->sealed || al->freed_in_graph)
      err = TP_ERROR_INVALID_VALUE;
    if (err == TP_SUCCESS)
      err = gmem_of(ps, capture_id, &gm);
    for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
      if (gm->foreign[i].owner == owner && gm->foreign[i].alloc == index)
        err = TP_ERROR_INVALID_VALUE;
    if (err == TP_SUCCESS &&
        !TP_ARRAY_ROOM(gm->foreign, gm->nforeign, gm->capforeign))
      err = TP_ERROR_OUT_OF_MEMORY;
    if (err == TP_SUCCESS) {
      gm->foreign[gm->nforeign++] = (foreign){owner, index};
      owner->refs++;
    }
  }
  pthread_mutex_unlock(&lock);
  return err;
}

static void set_live(tp__gmem *gm, allocation *al, bool live) {
  if (al->live == live)
    return;
  al->live = live;
  if (live)
    gm->nlive++;
  else
    gm->nlive--;
}

tp_error_t tp__gmem_free(tp__pstream *ps, int device, void *ptr,
                         bool *claimed) {
  *claimed = false;
  if (TP_LIKELY(!in_arenas((uintptr_t)ptr)))
    return TP_SUCCESS;
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = TP_SUCCESS;
  uint32_t index = 0;
  allocation *al = NULL;
  tp__gmem *gm = NULL;
  if (seg_find((uintptr_t)ptr)) {
    *claimed = true;
    al = alloc_at((uintptr_t)ptr, &index);
    /* A graph tidepool never instantiated (cuda: the application's own
     * capture, instantiation and launches) is launched where tidepool does
     * not see it: each allocation that outlives those launches may be
     * freed once, as the application frees a graph's outputs. */
    bool unseen = al && !al->live && !al->freed_in_graph &&
                  !al->seg->gm->sealed && !al->seg->gm->seen &&
                  !al->freed_unseen && tp__platform->graph_maps_at_capture();
    if (unseen)
      al->freed_unseen = true;
    if (al && (al->live || unseen)) {
      gm = al->seg->gm;
    } else {
      al = NULL;
      err = TP_ERROR_INVALID_VALUE;
    }
  }
  tp__pevent *ev = NULL;
  if (al)
    err = tp__platform->event_create(device, &ev);
  if (al && err == TP_SUCCESS) {
    err = tp__platform->event_record(ev, ps);
    if (err != TP_SUCCESS)
      (void)tp__platform->event_destroy(ev);
  }
  if (al && err == TP_SUCCESS) {
    if (al->free_ev)
      drop_free_ev(gm, al);
    al->free_ev = ev;
    gm->npending++;
    set_live(gm, al, false);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

tp__gmem *tp__gmem_of_capture(uint64_t capture_id) {
  pthread_mutex_lock(&lock);
  tp__gmem *gm = gmem_find(capture_id);
  pthread_mutex_unlock(&lock);
  return gm;
}

bool tp__gmem_has_allocations(const tp__gmem *gm) {
  return gm && (gm->nallocs > 0 || gm->nforeign > 0);
}

tp_error_t tp__gmem_instantiate(tp__gmem *gm, void (**release)(void *),
                                void **arg) {
  *release = NULL;
  *arg = NULL;
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = (gm->nallocs || gm->nforeign) && gm->execs
                       ? TP_ERROR_INVALID_VALUE
                       : TP_SUCCESS;
  token *t = NULL;
  if (err == TP_SUCCESS && !tp__platform->graph_maps_at_capture()) {
    t = calloc(1, sizeof *t);
    if (!t)
      err = TP_ERROR_OUT_OF_MEMORY;
    for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nsegs; i++)
      err = seg_map(gm->segs[i], 0, granules(gm->segs[i]));
    if (err != TP_SUCCESS && gm->holds == 0)
      gmem_unmap(gm, false);
  }
  if (err == TP_SUCCESS) {
    if (!gm->sealed) {
      gm->sealed = true;
      for (uint32_t i = 0; i < gm->nallocs; i++)
        gm->books |= !gm->allocs[i].freed_in_graph;
      gm->books |= gm->nforeign > 0;
    }
    gm->execs++;
    if (t) {
      *t = (token){.gm = gm, .graph = false};
      gm->holds++;
      *release = on_release;
      *arg = t;
    }
  } else {
    free(t);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

void tp__gmem_instantiate_undo(tp__gmem *gm, void *arg) {
  pthread_mutex_lock(&lock);
  gm->execs--;
  if (arg) {
    free(arg);
    if (--gm->holds == 0)
      gmem_unmap(gm, false);
  }
  pthread_mutex_unlock(&lock);
}

void tp__gmem_exec_destroyed(tp__gmem *gm, bool may_run) {
  pthread_mutex_lock(&lock);
  gm->execs--;
  if (may_run && gm->self_held)
    gm->running++;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

void tp__gmem_exec_finished(tp__gmem *gm) {
  pthread_mutex_lock(&lock);
  gm->running--;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

void tp__gmem_adopt(tp__gmem *gm, tp__pgraph *graph) {
  pthread_mutex_lock(&lock);
  gm->seen = true;
  if (tp__platform->graph_maps_at_capture() && gm->attached && gm->token &&
      tp__platform->capture_detach(graph, gm->tie) == TP_SUCCESS) {
    gm->self_held = true;
    free(gm->token);
    gm->token = NULL;
  }
  pthread_mutex_unlock(&lock);
}

void tp__gmem_capture_failed(uint64_t capture_id) {
  pthread_mutex_lock(&lock);
  tp__gmem *gm = capture_id ? gmem_find(capture_id) : NULL;
  if (gm && !gm->seen) {
    gm->seen = true;
    for (uint32_t i = 0; i < gm->nallocs; i++)
      set_live(gm, &gm->allocs[i], false);
    sweep();
  }
  pthread_mutex_unlock(&lock);
}

bool tp__gmem_self_held(const tp__gmem *gm) {
  return gm && gm->self_held;
}

void tp__gmem_graph_destroyed(tp__gmem *gm) {
  pthread_mutex_lock(&lock);
  gm->graph_gone = true;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

tp_error_t tp__gmem_launch(tp__gmem *gm, tp__pexec *exec, bool auto_free,
                           tp__pstream *ps, int device) {
  if (!gm || !gm->books)
    return tp__platform->graph_launch(exec, ps);
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = TP_SUCCESS;
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nallocs; i++)
    if (gm->allocs[i].live && !auto_free)
      err = TP_ERROR_INVALID_VALUE;
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
    if (!gm->foreign[i].owner->allocs[gm->foreign[i].alloc].live)
      err = TP_ERROR_INVALID_VALUE;
  /* The frees of other graphs' allocations happen with this launch: each
   * gets an event recorded after it, made now so that nothing can fail
   * once the launch is queued. */
  tp__pevent **evs = NULL;
  if (err == TP_SUCCESS && gm->nforeign) {
    evs = calloc(gm->nforeign, sizeof *evs);
    err = evs ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
    for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
      err = tp__platform->event_create(device, &evs[i]);
  }
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nallocs; i++)
    if (gm->allocs[i].free_ev)
      err = tp__platform->stream_wait_event(ps, gm->allocs[i].free_ev);
  if (err == TP_SUCCESS)
    err = tp__platform->graph_launch(exec, ps);
  if (err == TP_SUCCESS) {
    for (uint32_t i = 0; i < gm->nallocs; i++) {
      allocation *al = &gm->allocs[i];
      if (al->free_ev)
        drop_free_ev(gm, al);
      if (!al->freed_in_graph)
        set_live(gm, al, true);
    }
    for (uint32_t i = 0; i < gm->nforeign; i++) {
      tp__gmem *owner = gm->foreign[i].owner;
      allocation *al = &owner->allocs[gm->foreign[i].alloc];
      set_live(owner, al, false);
      if (al->free_ev)
        drop_free_ev(owner, al);
      /* Should the record fail, the owner's next launch is not ordered
       * after this one by tidepool; the stream order still orders them
       * when both run on one stream. */
      if (tp__platform->event_record(evs[i], ps) == TP_SUCCESS) {
        al->free_ev = evs[i];
        owner->npending++;
      } else {
        (void)tp__platform->event_destroy(evs[i]);
      }
      evs[i] = NULL;
    }
  }
  for (uint32_t i = 0; evs && i < gm->nforeign; i++)
    if (evs[i])
      (void)tp__platform->event_destroy(evs[i]);
  free(evs);
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_trim(int device) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_DEVICE);
  tp_error_t first = TP_SUCCESS;
  pthread_mutex_lock(&lock);
  collect(true);
  for (arena *a = devs[device].arenas; a; a = a->next) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < a->ncache; i++) {
      tp_error_t err = tp__platform->chunk_release(a->res, a->cache[i]);
      if (err == TP_SUCCESS) {
        count_reserved(device, a->gran, false);
      } else {
        a->cache[kept++] = a->cache[i];
        if (first == TP_SUCCESS)
          first = err;
      }
    }
    a->ncache = kept;
  }
  pthread_mutex_unlock(&lock);
  return first;
}

tp_error_t tp__gmem_get_attr(int device, tp_graph_mem_attr_t attr,
                             uint64_t *value) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES || !value,
               TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&lock);
  collect(true);
  const gdev *g = &devs[device];
  switch (attr) {
  case TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *value = g->used; break;
  case TP_GRAPH_MEM_ATTR_USED_MEM_HIGH: *value = g->used_high; break;
  case TP_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *value = g->reserved; break;
  case TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *value = g->reserved_high; break;
  default: err = TP_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_reset_high(int device, tp_graph_mem_attr_t attr) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&lock);
  collect(true);
  gdev *g = &devs[device];
  if (attr == TP_GRAPH_MEM_ATTR_USED_MEM_HIGH)
    g->used_high = g->used;
  else if (attr == TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
    g->reserved_high = g->reserved;
  else
    err = TP_ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&lock);
  return err;
}
