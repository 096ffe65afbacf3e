/* The allocator core's internal types and the functions its files share:
 * streams and their clocks, pools, blocks, slabs, stream caches and the
 * address registry. Platform-independent: it reaches the machine only
 * through the ops table of platform/platform.h. */
#ifndef TP_POOL_H
#define TP_POOL_H

#include <pthread.h>

#include "common/common.h"
#include "platform/platform.h"

#define TP_MAX_DEVICES 16
#define TP_GRANULE 512u /* allocation step and minimum alignment */
#define TP_GRANULE_SHIFT 9
#define TP_SMALL_MAX (32u * 1024u) /* largest size served by slabs */
#define TP_NCLASSES 20
#define TP_NBINS 512
#define TP_LARGE_CACHE 4   /* large blocks a stream keeps for itself */
#define TP_SMALL_CACHE 64  /* small blocks a stream keeps per class */
#define TP_GROWTH_SLACK 64 /* grow freely up to peak used + 1/64 */

typedef struct tp__stream tp__stream;
typedef struct tp__pool tp__pool;
typedef struct tp__block tp__block;
typedef struct tp__slab tp__slab;
typedef struct tp__cache tp__cache;
typedef struct tp__ipc_export tp__ipc_export; /* ipc/export.c */
typedef struct tp__ipc_import tp__ipc_import; /* ipc/import.c */

/* ---- dependency clocks --------------------------------------------------
 * A clock maps a stream uid to the newest epoch of that stream a holder is
 * known to follow. Keys with TP_CLOCK_LEGACY set name a device's legacy
 * barrier sequence instead: "follows every free of a blocking stream of that
 * device issued before legacy operation n". */
#define TP_CLOCK_LEGACY (UINT64_C(1) << 63)
typedef struct tp__clock_entry {
  uint64_t key;
  uint64_t value;
} tp__clock_entry;
typedef struct tp__clock {
  tp__clock_entry *v;
  uint32_t n, cap;
} tp__clock;

/* Where a free happened: frees on `stream` with epoch <= the stream's done
 * epoch have completed. lseq is the device's legacy sequence at the free. */
typedef struct tp__tag {
  tp__stream *stream; /* NULL: completed, usable by anyone */
  uint64_t epoch;
  uint64_t lseq;
} tp__tag;

/* ---- streams ----------------------------------------------------------- */
/* A platform event recorded on a stream: when it completes, every free on
 * the stream with epoch <= `epoch` has completed. Host waiters hold a
 * reference so that the event is not re-recorded under them. */
typedef struct tp__marker {
  tp__pevent *ev;
  uint64_t epoch;
  int refs; /* guarded by the stream's lock */
  bool listed;
} tp__marker;

struct tp__stream {
  uint64_t uid;
  int device;
  unsigned flags;
  bool legacy;
  bool owned; /* made by tp_stream_create */
  tp__pstream *ps;
  tp_stream_t handle;
  _Atomic int refs;
  _Atomic bool destroyed;

  tp__spin lock;          /* guards everything below, and the stream's caches */
  _Atomic uint64_t epoch; /* epoch given to frees issued now */
  _Atomic uint64_t done_epoch; /* frees with epoch <= this completed */
  tp__marker **markers;        /* recorded, not yet seen complete */
  uint32_t nmarkers, capmarkers;
  tp__marker **spare; /* recycled markers with their events */
  uint32_t nspare, capspare;
  tp__clock clock;
  tp__cache *caches; /* one per pool this stream allocated or freed in */
  tp__cache *hint;   /* the cache used last */
};

/* ---- blocks and slabs ---------------------------------------------------
 * A block is a range of a pool's mapped memory. Blocks of one contiguous
 * mapped run (a segment) are linked in address order. */
enum {
  TP_BLOCK_FREE = 0,   /* in the bins; may carry a tag */
  TP_BLOCK_USED = 1,   /* handed to the user */
  TP_BLOCK_CACHED = 2, /* held in a stream cache */
  TP_BLOCK_SLAB = 3    /* carved into small blocks */
};

struct tp__block {
  uintptr_t addr;
  size_t size;
  tp__block *prev, *next;   /* address neighbours in the segment */
  tp__block *fprev, *fnext; /* bin list, when free */
  tp__tag tag;              /* when free or cached: where it was freed */
  _Atomic size_t req;       /* bytes asked for, when used */
  tp__slab *slab;           /* when TP_BLOCK_SLAB */
  uint16_t bin;
  _Atomic uint8_t state; /* changes between USED and CACHED without the
                            pool lock; to and from FREE only under it */
};

struct tp__slab {
  tp__block *block;
  uintptr_t base;
  uint64_t inv; /* 2^40 / bsize, rounded up: an index without a division */
  uint32_t cls, bsize, nblocks, nfree; /* nfree: bits set in `free` */
  uint64_t free[2];                    /* bit set: free and completed */
  tp__slab *next, *prev; /* the class's list of slabs with free bits */
  _Atomic uint32_t *req; /* bytes asked for per block; 0 when not used */
  bool listed;
};

/* The index of the block at `addr` in slab `s`, or -1 when `addr` is not
 * the start of one of its blocks. A multiplication by the precomputed
 * inverse stands in for the division: offsets stay below 2^22 and sizes
 * below 2^16, so the product's rounding error (under 2^-18) cannot cross an
 * integer that the true quotient's fraction (a multiple of 1/bsize, at
 * least 2^-15 from it) does not cross. */
static inline int64_t tp__slab_index(const tp__slab *s, uintptr_t addr) {
  uint64_t off = (uint64_t)(addr - s->base);
  if (addr < s->base || off >= (uint64_t)s->nblocks * s->bsize)
    return -1;
  uint64_t i = (off * s->inv) >> 40;
  return i * s->bsize == off ? (int64_t)i : -1;
}

/* A small block that was freed and left a stream cache before completing. */
typedef struct tp__pending {
  tp__slab *slab;
  uint32_t idx;
  tp__tag tag;
} tp__pending;

/* ---- stream caches ------------------------------------------------------
 * What one stream keeps of one pool for itself: small blocks per class and a
 * few large blocks, all freed on that stream (or handed out ready), reusable
 * by it in stream order without any lock shared with other streams. */
typedef struct tp__centry {
  uintptr_t addr;
  void *owner; /* tp__slab* for small blocks, tp__block* for large */
  uint64_t epoch, lseq;
} tp__centry;

struct tp__cache {
  tp__pool *pool;
  tp__stream *stream;
  tp__cache *next_in_stream, *next_in_pool, *prev_in_pool;
  struct {
    tp__centry v[TP_SMALL_CACHE];
    uint32_t n;
  } cls[TP_NCLASSES];
  tp__centry large[TP_LARGE_CACHE];
  uint32_t nlarge;
  /* Bytes asked for by allocations made on this stream, less those freed
   * on it (negative when it frees others' blocks); written under the
   * stream's lock, read by anyone. `pub` is what the pool's published total
   * holds for this cache. */
  _Atomic int64_t used;
  int64_t pub, slack;
};

/* ---- pools ------------------------------------------------------------- */
typedef struct tp__chunk {
  tp__phys phys;        /* 0: not mapped */
  tp__block *seg_first; /* at a segment's first chunk */
  tp__block *seg_last;  /* at a segment's last chunk */
} tp__chunk;

struct tp__pool {
  tp_pool_t handle;
  uint64_t serial;
  tp_pool_props_t props;
  tp__mem_kind kind;
  bool is_default;
  bool imported; /* from another process: cannot allocate */
  /* Sharing between processes (ipc.c): the exporter's state, made at
   * creation for pools with handle types, or the importer's. */
  tp__ipc_export *exp;
  tp__ipc_import *imp;
  uint64_t export_key; /* keys the check word of exported pointers */
  /* Exported allocations not yet freed (or freed but still held by an
   * importer). While non-zero, frees ask ipc.c first; it is raised before
   * export_pointer returns, so a free ordered after an export sees it. */
  _Atomic uint32_t ipc_watch;

  _Atomic int follow_events, opportunistic, internal_deps, oom_wait;
  _Atomic uint64_t release_threshold;
  _Atomic uint64_t reserved, reserved_high;
  /* Bytes in use are counted per stream cache (see pool.c); these are the
   * published total, never below the true one, and the exact peak. They sit
   * on a line of their own, away from the fields every call reads. */
  _Alignas(64) _Atomic uint64_t used_pub;
  _Atomic uint64_t used_high;
  _Atomic int64_t used_base; /* bytes counted outside any cache */
  _Atomic uint64_t maps, unmaps;

  pthread_mutex_t lock; /* the slow path: everything below */
  tp_access_flags_t access[TP_MAX_DEVICES];
  tp__pres *res;
  uintptr_t base;
  size_t va_size, gran;
  uint64_t limit; /* physical bytes the pool may hold */
  size_t nchunks;
  tp__chunk *chunks;
  tp__phys *orphans; /* unmapped chunks the platform would not release yet */
  uint32_t norphans, caporphans;
  uint64_t *mapbits;                  /* a bit per chunk: mapped */
  _Atomic(_Atomic uintptr_t *) *gtab; /* per chunk: granule entries */

  tp__block *bins[TP_NBINS];
  uint64_t binmap[TP_NBINS / 64];
  tp__block *spare_blocks; /* recycled descriptors (type-stable memory) */
  tp__slab *partial[TP_NCLASSES]; /* slabs with free bits */
  tp__slab *spare_slabs;
  tp__pending *pending[TP_NCLASSES];
  uint32_t npending[TP_NCLASSES], cappending[TP_NCLASSES];
  tp__cache *caches;
  _Atomic bool destroyed;
  bool torn_down;
};

/* The public handle outlives the pool's memory so that a destroyed handle is
 * recognised: its header stays, marked dead, for the life of the process. */
#define TP_POOL_MAGIC 0x7470706cu
enum { TP_POOL_LIVE = 1, TP_POOL_DESTROYING = 2, TP_POOL_DEAD = 3 };
struct tp_pool_opaque {
  uint32_t magic;
  _Atomic int state;
  tp__pool *pool;
  struct tp_pool_opaque *next_dead; /* the list of tombstones */
};

/* ---- streams.c ----------------------------------------------------------- */
tp_error_t tp__streams_init(void);
/* Resolves a user stream handle (NULL: the current device's legacy stream).
 * The stream stays valid until the caller's call returns unless the user
 * destroys it concurrently, which CUDA leaves undefined as well. */
tp_error_t tp__stream_get(tp_stream_t handle, tp__stream **out);
tp_error_t tp__stream_create(unsigned flags, tp_stream_t *handle);
tp_error_t tp__stream_destroy(tp__stream *s);
void tp__stream_unref(tp__stream *s);
static inline void tp__stream_ref(tp__stream *s) {
  atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}
/* Every live stream of a device (or all devices when device < 0), with a
 * reference each; the caller unrefs each and frees the array. */
tp_error_t tp__streams_list(int device, tp__stream ***out, size_t *n);

bool tp__stream_done(const tp__tag *t);
/* Queries markers (recording one where none covers the tag); true when the
 * tagged free has completed. */
bool tp__stream_poll(const tp__tag *t);
/* Waits on the host for the tagged free. */
tp_error_t tp__stream_wait_host(const tp__tag *t);
/* Makes `waiter` wait for the tagged free, on the device side. */
tp_error_t tp__stream_make_wait(tp__stream *waiter, const tp__tag *t);
/* True when work issued now on `a` is ordered after the tagged free through
 * recorded events or the legacy default stream. */
bool tp__stream_follows(tp__stream *a, const tp__tag *t);
/* The stream's queued work has completed (after a synchronize). */
void tp__stream_mark_done(tp__stream *s, uint64_t epoch);
uint64_t tp__stream_advance(tp__stream *s);

/* The calling thread's current device (tp_set_device). */
int tp__current_device(void);
void tp__set_current_device(int device);

/* Legacy-stream bookkeeping around work queued on a device's NULL stream. */
void tp__legacy_begin(int device);
void tp__legacy_end(int device);
uint64_t tp__legacy_seq(int device);

/* Event clocks. */
typedef struct tp__event tp__event;
tp_error_t tp__event_create(tp_event_t *out);
tp_error_t tp__event_get(tp_event_t handle, tp__event **out);
tp_error_t tp__event_destroy(tp__event *e);
tp_error_t tp__event_record(tp__event *e, tp__stream *s);
tp_error_t tp__event_wait(tp__stream *s, tp__event *e);
tp_error_t tp__event_query(tp__event *e);
tp_error_t tp__event_synchronize(tp__event *e);

static inline tp__tag tp__stream_tag(tp__stream *s) {
  tp__tag t = {s, atomic_load_explicit(&s->epoch, memory_order_relaxed), 0};
  if (!s->legacy && !(s->flags & TP_STREAM_NON_BLOCKING))
    t.lseq = tp__legacy_seq(s->device);
  return t;
}

/* ---- registry.c -------------------------------------------------------- */
#define TP_REGISTRY_SHIFT 30 /* pools are reserved in 1 GiB-aligned steps */
tp_error_t tp__registry_add(tp__pool *p);
void tp__registry_remove(tp__pool *p);
tp__pool *tp__registry_find(uintptr_t addr);

/* ---- fit.c --------------------------------------------------------------- */
tp__block *tp__block_new(tp__pool *p);
void tp__block_recycle(tp__pool *p, tp__block *b);
void tp__bin_insert(tp__pool *p, tp__block *b);
void tp__bin_remove(tp__pool *p, tp__block *b);
unsigned tp__bin_of(size_t size);
/* Splits `b` so that it keeps `size` bytes; the rest becomes a new block
 * with b's state and tag, which is returned (NULL when nothing is left). */
tp__block *tp__block_split(tp__pool *p, tp__block *b, size_t size);
/* Frees `b` into the bins with its tag, merging with free neighbours of
 * the same tag (or, untagged, with untagged ones). Returns the result. */
tp__block *tp__block_release(tp__pool *p, tp__block *b);
/* A run of adjacent free blocks that together hold `size` though none does
 * alone, taken as one block: blocks `a` may use now, or with `deps` any,
 * `a` waiting for each pending one. */
tp__block *tp__fit_take_run(tp__pool *p, tp__stream *a, size_t size, bool deps);
/* Drops a tag and the reference it holds on its stream. */
void tp__tag_clear(tp__tag *t);
/* Best fit among free blocks that `a` may use now without a new dependency
 * (or with one, when `deps` is set). Takes the block out of the bins and
 * shapes it to `size`. */
tp__block *tp__fit_take(tp__pool *p, tp__stream *a, size_t size, bool deps);
/* Drops tags of completed frees in free blocks and merges what then may. */
void tp__fit_settle(tp__pool *p, bool poll);

/* ---- space.c ------------------------------------------------------------- */
tp_error_t tp__space_init(tp__pool *p);
void tp__space_fini(tp__pool *p);
/* Maps memory for a free block of at least `size` bytes (remapping wholly
 * free chunks first, then creating new ones) and returns it, taken out of
 * the bins. */
tp_error_t tp__space_grow(tp__pool *p, size_t size, tp__block **out);
/* Unmaps wholly free, completed chunks until reserved <= keep. Returns the
 * first platform failure; what could not be released stays reserved. */
tp_error_t tp__space_release(tp__pool *p, uint64_t keep);
tp_error_t tp__space_set_access(tp__pool *p, const tp_access_desc_t *list,
                                size_t n);
/* Granule entries: the registry of live allocations. */
_Atomic uintptr_t *tp__space_entry(tp__pool *p, uintptr_t addr, bool create);
/* The first chunk at or after `from` that starts a segment (a maximal run
 * of mapped chunks), or nchunks; and the end of the segment at `start`. */
size_t tp__segment_next(const tp__pool *p, size_t from);
size_t tp__segment_end(const tp__pool *p, size_t start);
/* Links a new block covering [addr, addr + size) into the segment lists. */
void tp__segment_link(tp__pool *p, tp__block *b);

/* ---- slab.c -------------------------------------------------------------- */
unsigned tp__class_of(size_t rounded);
uint32_t tp__class_size(unsigned cls);
/* Takes up to `want` free small blocks of class `cls` usable by `a` into
 * out[] (growing a slab when none has room). Returns how many, or an error
 * through *err when none could be had. */
uint32_t tp__slab_take(tp__pool *p, tp__stream *a, unsigned cls,
                       tp__centry *out, uint32_t want, tp_error_t *err);
/* Gives back a small block from a cache: completed ones go to their slab,
 * others to the class's pending list. */
void tp__slab_put(tp__pool *p, unsigned cls, const tp__centry *e,
                  tp__stream *s);
/* Moves completed pending blocks to their slabs and frees empty slabs. */
void tp__slab_settle(tp__pool *p, bool poll, bool release_empty);
void tp__slab_fini(tp__pool *p);

/* ---- pool.c -------------------------------------------------------------- */
tp_error_t tp__pool_new(const tp_pool_props_t *props, bool is_default,
                        tp_pool_t *out);
tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out);
/* A large block of at least `size` bytes for stream `a`, through every step
 * of the reuse order (growth only when `grow`); pool lock held. The block's
 * tag says when other streams may use its bytes: none, or after the work
 * `a` has queued so far (when it came from a free still pending). */
tp_error_t tp__large_get(tp__pool *p, tp__stream *a, size_t size, bool grow,
                         tp__block **out);
tp_error_t tp__pool_destroy(tp__pool *p);
tp_error_t tp__pool_malloc(tp__pool *p, void **ptr, size_t size, tp__stream *s);
tp_error_t tp__pool_free(void *ptr, tp__stream *s);
tp_error_t tp__pool_get_attr(tp__pool *p, tp_pool_attr_t attr, void *value);
tp_error_t tp__pool_set_attr(tp__pool *p, tp_pool_attr_t attr, void *value);
tp_error_t tp__pool_trim(tp__pool *p, uint64_t keep);
tp_error_t tp__pool_get_access(tp__pool *p, const tp_location_t *loc,
                               tp_access_flags_t *flags);
/* Applies checked descriptors to the pool's memory, now and later. */
tp_error_t tp__pool_set_access(tp__pool *p, const tp_access_desc_t *list,
                               size_t n);
/* The exact bytes in use (asked for by live allocations); pool lock held. */
uint64_t tp__pool_used(tp__pool *p);
/* The bytes asked for by the live allocation at `ptr` (not an interior
 * pointer); INVALID_VALUE when there is none. */
tp_error_t tp__pool_live_size(tp__pool *p, void *ptr, size_t *size);
/* A pool object that stands for another process's pool, with the
 * properties its importer reports; ipc.c fills in the rest. */
tp_error_t tp__pool_new_imported(const tp_pool_props_t *props, tp_pool_t *out);
/* Frees the allocation at `ptr` as a free with tag `tag` would have: the
 * exporter's free of a block that importers held until now (ipc.c). The
 * block goes to the pool's free lists, never to a stream cache, since its
 * stream may be gone; the tag's stream reference is consumed. */
tp_error_t tp__pool_free_tagged(tp__pool *p, void *ptr, tp__tag tag);

/* ---- verify.c ------------------------------------------------------------
 * The invariant walker: free lists, accounting and the chunk map. Returns 0
 * when consistent, else nonzero with a reason. `used` is compared only when
 * asked, since allocations in flight on other threads move it. */
int tp__pool_walk(tp__pool *p, bool check_used, char *why, size_t len);
#ifdef TP_DEBUG
void tp__pool_debug_check(tp__pool *p);
#define TP_DEBUG_WALK(p) tp__pool_debug_check(p)
#else
#define TP_DEBUG_WALK(p) ((void)0)
#endif
/* After `s` (or every stream of a device) synchronised: its frees become
 * reusable by all and each pool it touched falls to its threshold. */
void tp__pool_after_sync(tp__stream *s);
/* Gives every cached block of the stream back to its pool (stream
 * destruction, synchronize). Takes the pool lock of each cache's pool. */
void tp__stream_flush_caches(tp__stream *s, bool drop);
/* Flushes all caches of a pool; pool lock held. */
void tp__pool_flush_all(tp__pool *p);
/* The cache of `s` for `p`, created on first use; s->lock held. */
tp__cache *tp__cache_find(tp__stream *s, tp__pool *p);
/* Gives the cache's blocks back; pool lock and stream lock held. */
void tp__cache_drain(tp__pool *p, tp__cache *c);

#endif /* TP_POOL_H */
