/* What the two files of graph memory share, and nothing outside src/graph
 * includes: graph_space.c owns addresses and mapping (arenas, segments, the
 * plan of granules and slots, the accounts); graph_mem.c owns graphs'
 * lifetimes (captures, frees, liveness, instantiation, launches) and calls
 * down into graph_space.c, which never calls graph_mem.c.
 *
 * Locking: graph_mem.c's mutex guards every structure here and every
 * global of both files but two atomic ones: the arenas' ranges, which
 * tp__gspace_in_arenas reads without it, and the list the platform's
 * release callbacks push onto. graph_mem.c takes it; every other
 * tp__gspace_ function expects it held. */
#ifndef TP_GRAPH_INTERNAL_H
#define TP_GRAPH_INTERNAL_H

#include "graph/graph_mem.h"

/* Defined where they are used: the first three in graph_space.c, the last
 * two in graph_mem.c. */
typedef struct arena arena;
typedef struct granule granule;
typedef struct slot slot;
typedef struct foreign foreign;
typedef struct token token;

/* A range of one arena's addresses that one graph's allocations of one kind
 * are carved from, bottom up. */
typedef struct segment {
  tp__gmem *gm;
  arena *a;
  tp__gmem_kind kind;
  uintptr_t base;
  size_t off, size; /* off: in the arena */
  size_t top;       /* bytes handed out, from the start */
  granule *gr;      /* size / the arena's granularity */
} segment;

/* An allocation in a graph's plan, and what its frees and launches left. */
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

struct tp__gmem {
  uint64_t capture_id;
  bool attached;    /* the graph, or an exec of it, lives */
  void *tie;        /* capture_attach's, for capture_detach */
  tp__pgraph *pg;   /* the graph captured (the platform's handle) */
  token *token;     /* what the tie's release hands back */
  bool seen;        /* tidepool ended the capture: it sees every launch */
  bool failed;      /* the capture ended in failure: no graph holds it */
  bool ended;       /* an interposer saw the capture end well */
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

/* Whether addr lies in an arena of graph memory; a few loads, no lock. It
 * says true for every address once the arenas outnumber the ranges kept. */
bool tp__gspace_in_arenas(uintptr_t addr);

/* The segment that holds addr, or NULL. */
segment *tp__gspace_seg_find(uintptr_t addr);

/* The allocation that starts at addr, or NULL; its index in *index. */
allocation *tp__gspace_alloc_at(uintptr_t addr, uint32_t *index);

/* Plans an allocation of `need` bytes at ps's position and maps what it
 * needs where the graph is held; on failure nothing changed but room
 * reserved. */
tp_error_t tp__gspace_plan(tp__gmem *gm, tp__pstream *ps,
                           const tp__gmem_kind *kind, size_t need, void **ptr);

/* Maps every granule of gm's plan that is not mapped yet; at an error it
 * stops, what it mapped staying mapped. */
tp_error_t tp__gspace_map(tp__gmem *gm);

/* Unmaps what gm no longer needs mapped: everything but the granules under
 * allocations that are live or whose free has not completed (all of it
 * when `all`). */
void tp__gspace_unmap(tp__gmem *gm, bool all);

/* Unmaps all of gm and gives its segments' addresses back to their arenas;
 * gm's arrays stay for the caller to free. */
void tp__gspace_release(tp__gmem *gm);

/* Releases the cached chunks of the device's arenas (a valid device); the
 * first error, the chunks that failed kept. */
tp_error_t tp__gspace_trim(int device);

/* The accounts of every device, taken before a call that may map and fail,
 * so that a failed call leaves them as they were (as CUDA's calls do): the
 * chunks it made are released again, and the highs it raised are lowered
 * back. */
typedef struct tp__gspace_marks {
  uint64_t used_high[TP__GMEM_MAX_DEVICES];
  uint64_t reserved[TP__GMEM_MAX_DEVICES];
  uint64_t reserved_high[TP__GMEM_MAX_DEVICES];
} tp__gspace_marks;
void tp__gspace_mark(tp__gspace_marks *m);
/* After the failed call has unmapped what it mapped: releases cached chunks
 * until each device reserves no more than at the mark (a chunk the platform
 * will not release stays cached and counted), and lowers each high to the
 * mark's or the current value, whichever is larger. */
void tp__gspace_rollback(const tp__gspace_marks *m);

/* The four TP_GRAPH_MEM_ATTR_* accounts of a valid device. */
tp_error_t tp__gspace_get_attr(int device, tp_graph_mem_attr_t attr,
                               uint64_t *value);
tp_error_t tp__gspace_reset_high(int device, tp_graph_mem_attr_t attr);

#endif /* TP_GRAPH_INTERNAL_H */
