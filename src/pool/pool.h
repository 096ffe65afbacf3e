/* The pool object: its handle, properties and attributes, its rooms (space,
 * blocks, slabs, stream caches), its statistics and lifetime, and the
 * allocate and free paths that the API layer calls. The layers below it,
 * lowest first: stream/ (stream order), space, blocks, slabs, caches,
 * reuse; ipc/ sits above it, and reaches the core through tp__pool_ops. */
#ifndef TP_POOL_H
#define TP_POOL_H

#include "pool/handle.h"
#include "pool/reuse.h"

typedef struct tp__ipc_export tp__ipc_export; /* ipc/export.c */
typedef struct tp__ipc_import tp__ipc_import; /* ipc/channel.h */

/* What a pool shared between processes does beyond an ordinary one. The
 * room that shares it (src/ipc/) sets the table when it makes a pool
 * exportable or imports one, and the core calls through it where a pool of
 * this process alone would act by itself; it knows nothing of sharing. A
 * NULL entry does nothing. */
typedef struct tp__pool_ops {
  /* A free of `addr` in the pool, before the core's own: *kept when the
   * free was consumed (an importer gives its hold back; an exporter keeps
   * a block an importer still holds and frees it once released). Called
   * for every free of an imported pool, and for an exported one while
   * `watched` is nonzero. */
  tp_error_t (*free)(tp__pool *p, uintptr_t addr, tp__stream *s, bool *kept);
  /* An imported pool's trim and access, which are its own mappings'. */
  void (*trim)(tp__pool *p);
  tp_error_t (*set_access)(tp__pool *p, const tp_access_desc_t *list, size_t n);
  /* The pool was destroyed: an imported pool releases everything; an
   * exported one takes no new importers. */
  void (*destroy)(tp__pool *p);
  /* Teardown of an exported pool, no lock held: false while an importer
   * still holds a block (the pool must stay); then its state goes. */
  bool (*stop)(tp__pool *p);
  /* Frees the sharing state, once no thread can reach the pool any more
   * (the epoch guard's retire): a call that found the pool just before it
   * was destroyed may still be reading that state (the soak test's
   * pool_handle_destroyed and ipc_races_destroy). */
  void (*fini)(tp__pool *p);
} tp__pool_ops;

struct tp__pool {
  /* The first line holds what every allocation and free reads here: the
   * fields up to `space` and the space's first ones (space.h), so that a
   * call in a busy process misses on one line of the pool, not five. */
  _Alignas(64) uint64_t serial;
  /* Names the pool and the period since its used high watermark was last
   * reset, never the same twice in the process: a thread's or a cache's
   * mark kept under another key is forgotten (see alloc.c). */
  _Atomic uint64_t peak_key;
  /* Allocations whose free ops->free must see first (exported ones not
   * yet freed, or freed but still held by an importer). It is raised
   * before the export returns, so a free ordered after it sees it. */
  _Atomic uint32_t watched;
  bool imported; /* from another process: cannot allocate */
  _Atomic bool destroyed;
  tp__space space;

  tp_pool_t handle;
  tp_pool_props_t props;
  bool is_default;
  bool torn_down;
  /* Allocations waiting on the host for pending frees, the pool lock
   * dropped (reuse.c's wait_pending): each holds its stream's cache, which
   * a teardown must leave alone. Pool lock. */
  uint32_t oom_waiters;
  const tp__pool_ops *ops; /* NULL for a pool no other process shares */
  tp__ipc_export *exp;
  tp__ipc_import *imp;
  uint64_t export_key; /* keys the check word of exported pointers */

  _Atomic int follow_events, opportunistic, internal_deps, oom_wait;
  _Atomic uint64_t release_threshold;
  _Atomic uint64_t growth_slack; /* parts per million (reuse.h) */
  /* The exact peak of bytes in use, on a line of its own, away from the
   * fields every call reads. */
  _Alignas(64) _Atomic uint64_t used_high;

  tp__mutex lock; /* the slow path: the rooms below and their lists */
  tp__heap heap;
  tp__slabs slabs;
  tp__caches caches;
};
_Static_assert(offsetof(tp__pool, space.gmask) + sizeof(uint32_t) <= 64,
               "a free's reads of the pool stay on its first line");

/* ---- registry.c ---------------------------------------------------------
 * The pool whose virtual range holds an address, read without a lock by
 * every free. Ranges are 1 GiB-aligned. */
#define TP_REGISTRY_SHIFT 30
tp_error_t tp__registry_add(uintptr_t base, size_t size, tp__pool *p);
void tp__registry_remove(uintptr_t base, size_t size);
#define TP_REGISTRY_BITS 19 /* 2^(30 + 19) = 512 TiB of addresses */
/* One slot per gigabyte, in one flat table: a free's lookup is one load
 * rather than two dependent ones, on the chain of loads that leads to its
 * exchange. Zero pages until written: a page of slots covers 512 GiB of
 * addresses, and the table's 4 MiB are virtual. */
extern _Atomic(tp__pool *) tp__registry[1u << TP_REGISTRY_BITS];
static inline tp__pool *tp__registry_find(uintptr_t addr) {
  uint64_t g = (uint64_t)addr >> TP_REGISTRY_SHIFT;
  if (g >> TP_REGISTRY_BITS)
    return NULL;
  return atomic_load_explicit(&tp__registry[g], memory_order_acquire);
}

/* ---- alloc.c: allocation and free -----------------------------------------
 */
/* The fast path is alloc.h's (tp__pool_malloc, tp__pool_free_put) and
 * claim.h's (tp__pool_claim). */
/* The bytes asked for by the live allocation at `ptr` (not an interior
 * pointer); INVALID_VALUE when there is none. */
tp_error_t tp__pool_live_size(tp__pool *p, void *ptr, size_t *size);
/* The live allocation that holds `addr` (its start, or any byte up to the
 * size it asked for): its start and that size; INVALID_VALUE when there is
 * none. Takes the pool lock. */
tp_error_t tp__pool_live_range(tp__pool *p, uintptr_t addr, uintptr_t *start,
                               size_t *size);
/* Frees the allocation at `ptr` as a free with tag `tag` would have: the
 * exporter's free of a block that importers held until now (ipc). The block
 * goes to the pool's free lists, never to a stream cache, since its stream
 * may be gone; the tag's stream reference is consumed. */
tp_error_t tp__pool_free_tagged(tp__pool *p, void *ptr, tp__tag tag);

/* ---- pool.c: creation, lifetime, synchronize, attributes, statistics ---- */
/* The exact bytes in use; pool lock held. */
uint64_t tp__pool_used(tp__pool *p);
tp_error_t tp__pool_new(const tp_pool_props_t *props, bool is_default,
                        tp_pool_t *out);
/* A pool object that stands for another process's pool, with the
 * properties its importer reports and the importer's ops; the importer
 * fills in the rest. */
tp_error_t tp__pool_new_imported(const tp_pool_props_t *props,
                                 const tp__pool_ops *ops, tp__pool **out);
tp_error_t tp__pool_destroy(tp__pool *p);
/* Finishes destroyed pools whose last allocation was freed (every free
 * asks, see alloc.h). */
void tp__pools_reap(void);
/* Finishes destroyed pools whose frees are found complete, asking their
 * streams (an allocation that found the device full calls it, since such a
 * pool's memory counts against the device until then); true when one went.
 * No pool lock held. */
bool tp__pools_reap_polling(void);
tp_error_t tp__pool_get_attr(tp__pool *p, tp_pool_attr_t attr, void *value);
tp_error_t tp__pool_set_attr(tp__pool *p, tp_pool_attr_t attr, void *value);
tp_error_t tp__pool_trim(tp__pool *p, uint64_t keep);
tp_error_t tp__pool_get_access(tp__pool *p, const tp_location_t *loc,
                               tp_access_flags_t *flags);
/* Applies checked descriptors to the pool's memory, now and later. */
tp_error_t tp__pool_set_access(tp__pool *p, const tp_access_desc_t *list,
                               size_t n);
/* After `s` synchronised: its frees become reusable by all and each pool
 * falls to its release threshold. NULL: a synchronize that covered no
 * live stream (a device's, with only destroyed ones behind it). */
void tp__pool_after_sync(tp__stream *s);
/* Gives every cached block of the stream back to its pool, and frees the
 * stream's caches (before the stream goes). */
void tp__pools_drop_stream(tp__stream *s);
/* Streams lost (stream.h): another's found destroyed by its owner, or a
 * per-thread default stream whose thread ended. The pools let go of their
 * caches, whose blocks complete with the stream's markers or at a device
 * synchronize, and the stream goes once no call that reached it is inside.
 * Called at each synchronize and at a thread's first call, so that a
 * program whose threads come and go without a synchronize that tidepool
 * sees (PyTorch's do not) does not keep every ended thread's stream. */
void tp__pools_drop_lost(void);
/* Raises the used high watermark to the exact total; no lock held. */
void tp__pool_peak_raise(tp__pool *p);

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

#endif /* TP_POOL_H */
