/* A pool's life: creation, the list of live pools that synchronize visits,
 * release at synchronize and trim, access, the attributes (one table row
 * each), and teardown, which gives the memory back at once and retires the
 * object through the guard. */
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>

#include "common/guard.h"
#include "pool/pool.h"

static _Atomic uint64_t pool_serial;
/* Where every pool's peak_key comes from: each creation and each reset of a
 * high watermark takes the next. */
static _Atomic uint64_t peak_keys;

/* Every live pool, for synchronize and stream destruction to visit. Taken
 * before any pool lock, never while one is held. */
static tp__mutex pools_lock = TP_MUTEX_INIT(TP_RANK_POOLS);
static tp__pool **pools;
static uint32_t npools, cappools;

/* ---- creation ---------------------------------------------------------------
 */

/* A new pool's growth slack: TIDEPOOL_GROWTH_SLACK where set, read once
 * (tidepool-run's programs cannot set the attribute themselves). */
static pthread_once_t slack_once = PTHREAD_ONCE_INIT;
static uint64_t slack_default = TP_GROWTH_SLACK_DEFAULT;

static void slack_read(void) {
  bool bad = false;
  slack_default =
      tp__env_count("TIDEPOOL_GROWTH_SLACK", TP_GROWTH_SLACK_DEFAULT,
                    TP_GROWTH_SLACK_MAX, &bad);
  if (bad)
    tp__env_warn("TIDEPOOL_GROWTH_SLACK",
                 "parts per million from 0 to 1000000");
}

/* A pool and its handle with the settings every pool starts with (CUDA's
 * reuse policies on); NULL when memory runs out. */
static tp__pool *pool_alloc(const tp_pool_props_t *props) {
  /* Aligned as the type asks (calloc's 16 bytes are not enough): its first
   * line and the high watermark's are lines of their own. */
  tp__pool *p = aligned_alloc(_Alignof(tp__pool), sizeof(tp__pool));
  if (p)
    memset(p, 0, sizeof *p);
  tp_pool_t h = p ? tp__handle_new() : NULL;
  if (!h) {
    free(p);
    return NULL;
  }
  p->handle = h;
  p->serial = atomic_fetch_add(&pool_serial, 1) + 1;
  atomic_init(&p->peak_key, atomic_fetch_add(&peak_keys, 1) + 1);
  p->props = *props;
  atomic_init(&p->follow_events, 1);
  atomic_init(&p->opportunistic, 1);
  atomic_init(&p->internal_deps, 1);
  atomic_init(&p->oom_wait, 1);
  pthread_once(&slack_once, slack_read);
  atomic_init(&p->growth_slack, slack_default);
  tp__mutex_init(&p->lock, TP_RANK_POOL);
  p->slabs.heap = &p->heap;
  p->caches.heap = &p->heap;
  p->caches.slabs = &p->slabs;
  return p;
}

/* Frees what is left of a pool no thread can reach any more: descriptors,
 * maps and the object. Its memory went back at teardown. */
static void pool_free(void *arg) {
  tp__pool *p = arg;
  if (p->ops && p->ops->fini)
    p->ops->fini(p);
  tp__heap_fini(&p->heap);
  tp__slabs_fini(&p->slabs);
  tp__space_free(&p->space);
  tp__mutex_destroy(&p->lock);
  free(p);
}

/* The physical limit of a pool: the location's capacity, or max_size
 * rounded down to whole chunks, so that the pool never holds more than it
 * was allowed; INVALID_VALUE when max_size holds no chunk at all. */
static tp_error_t pool_limit(const tp_pool_props_t *props, size_t gran,
                             uint64_t capacity, uint64_t *limit) {
  *limit = capacity / gran * gran;
  if (!props->max_size)
    return TP_SUCCESS;
  TP_RETURN_IF(props->max_size < gran, TP_ERROR_INVALID_VALUE);
  if (props->max_size < *limit)
    *limit = props->max_size / gran * gran;
  return TP_SUCCESS;
}

/* The rooms of a new pool; on failure what was made is undone. */
static tp_error_t pool_rooms(tp__pool *p, size_t gran, uint64_t limit) {
  tp__mem_kind kind = {p->props.location, p->props.alloc_type,
                       p->props.handle_types};
  TP_FORWARD(tp__space_init(&p->space, &kind, gran, limit));
  tp__space *sp = &p->space;
  if (kind.location.type == TP_LOCATION_DEVICE)
    sp->access[kind.location.id] = TP_ACCESS_READ_WRITE;
  if (kind.type == TP_ALLOCATION_MANAGED) {
    int n = 0;
    if (tp__platform->device_count(&n) == TP_SUCCESS)
      for (int d = 0; d < n && d < TP_MAX_DEVICES; d++)
        sp->access[d] = TP_ACCESS_READ_WRITE;
  }
  tp_error_t err = tp__heap_init(&p->heap, sp);
  if (err == TP_SUCCESS)
    err = tp__registry_add(sp->base, sp->va_size, p);
  if (err != TP_SUCCESS)
    tp__space_fini(sp);
  return err;
}

tp_error_t tp__pool_new(const tp_pool_props_t *props, bool is_default,
                        tp_pool_t *out) {
  tp__mem_kind kind = {props->location, props->alloc_type, props->handle_types};
  size_t gran = 0;
  uint64_t capacity = 0, limit = 0;
  TP_FORWARD(tp__platform->mem_query(&kind, &gran, &capacity));
  TP_RETURN_IF(gran < TP_GRANULE || (gran & (gran - 1)), TP_ERROR_PLATFORM);
  TP_FORWARD(pool_limit(props, gran, capacity, &limit));
  tp__pool *p = pool_alloc(props);
  TP_RETURN_IF(!p, TP_ERROR_OUT_OF_MEMORY);
  p->is_default = is_default;
  if (props->handle_types && getrandom(&p->export_key, sizeof p->export_key,
                                       0) != (ssize_t)sizeof p->export_key)
    p->export_key = (uint64_t)(uintptr_t)p ^ p->serial * 0x9E3779B97F4A7C15ull;
  tp_error_t err = pool_rooms(p, gran, limit);
  bool rooms = err == TP_SUCCESS;
  tp__mutex_lock(&pools_lock);
  if (err == TP_SUCCESS && !TP_ARRAY_ROOM(pools, npools, cappools))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS)
    pools[npools++] = p;
  tp__mutex_unlock(&pools_lock);
  if (err != TP_SUCCESS) {
    if (rooms) {
      tp__registry_remove(p->space.base, p->space.va_size);
      tp__space_fini(&p->space);
    }
    tp__handle_bury(p->handle);
    pool_free(p);
    return err;
  }
  tp__handle_publish(p->handle, p);
  *out = p->handle;
  return TP_SUCCESS;
}

tp_error_t tp__pool_new_imported(const tp_pool_props_t *props,
                                 const tp__pool_ops *ops, tp__pool **out) {
  tp__pool *p = pool_alloc(props);
  TP_RETURN_IF(!p, TP_ERROR_OUT_OF_MEMORY);
  p->imported = true;
  p->ops = ops;
  tp__handle_publish(p->handle, p);
  *out = p;
  return TP_SUCCESS;
}

/* ---- bytes in use ------------------------------------------------------
 * Counted per stream cache (alloc.c); the total is their sum. */

uint64_t tp__pool_used(tp__pool *p) {
  TP_CHECK_HELD(&p->lock);
  return tp__caches_used(&p->caches);
}

void tp__pool_peak_raise(tp__pool *p) {
  tp__mutex_lock(&p->lock);
  tp__atomic_max(&p->used_high, tp__pool_used(p));
  tp__mutex_unlock(&p->lock);
}

/* ---- release
 * ------------------------------------------------------------------
 */

/* Releases free chunks while more than `keep` bytes stay reserved. As
 * cudaMemPoolTrimTo and the release threshold ask, a pool that holds more
 * than `keep` keeps at least that much: whole chunks, up to one more. */
static tp_error_t settle_and_release(tp__pool *p, uint64_t keep) {
  uint64_t gran = p->space.gran;
  keep = keep > UINT64_MAX - (gran - 1) ? UINT64_MAX
                                        : (keep + gran - 1) / gran * gran;
  tp__slabs_settle(&p->slabs, false, true);
  tp__heap_settle(&p->heap, false);
  tp_error_t err = tp__heap_release(&p->heap, keep);
  TP_DEBUG_WALK(p);
  return err;
}

static bool reap(bool poll);

void tp__pool_after_sync(tp__stream *s) {
  tp__mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools; i++) {
    tp__pool *p = pools[i];
    tp__mutex_lock(&p->lock);
    if (!p->torn_down) {
      /* Where the pool holds more than its threshold, every stream's cache
       * goes back, so that blocks other streams freed and that are known
       * complete (queried, say) are released too; otherwise only the
       * synchronized stream's, which the other streams may now take. */
      uint64_t threshold = atomic_load(&p->release_threshold);
      if (atomic_load(&p->space.reserved) > threshold)
        tp__caches_drain_all(&p->caches);
      else if (s)
        tp__caches_drain_one(&p->caches, s);
      /* Best effort: what stays reserved is released at a later try. */
      (void)settle_and_release(p, threshold);
    }
    tp__mutex_unlock(&p->lock);
  }
  tp__mutex_unlock(&pools_lock);
  (void)reap(false);
}

tp_error_t tp__pool_trim(tp__pool *p, uint64_t keep) {
  if (p->imported) {
    if (p->ops->trim)
      p->ops->trim(p);
    return TP_SUCCESS;
  }
  tp__mutex_lock(&p->lock);
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  if (!p->torn_down) {
    tp__caches_drain_all(&p->caches);
    err = settle_and_release(p, keep);
  }
  tp__mutex_unlock(&p->lock);
  return err;
}

void tp__pools_drop_stream(tp__stream *s) {
  tp__mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools; i++) {
    tp__pool *p = pools[i];
    tp__mutex_lock(&p->lock);
    tp__blspin_lock(&s->lock);
    tp__cache *c = tp__cache_find(s, &p->caches);
    tp__blspin_unlock(&s->lock);
    if (c)
      tp__cache_free(&p->caches, c);
    tp__mutex_unlock(&p->lock);
  }
  tp__mutex_unlock(&pools_lock);
}

static void unref_stream(void *s) {
  tp__stream_unref(s);
}

void tp__pools_drop_lost(void) {
  tp__guard_enter();
  tp__stream *s;
  while ((s = tp__stream_take_lost()) != NULL) {
    tp__pools_drop_stream(s);
    tp__guard_retire(s, unref_stream);
  }
  tp__guard_exit();
}

/* ---- access
 * -------------------------------------------------------------------
 */

tp_error_t tp__pool_get_access(tp__pool *p, const tp_location_t *loc,
                               tp_access_flags_t *flags) {
  bool host_pool = p->props.location.type == TP_LOCATION_HOST ||
                   p->props.location.type == TP_LOCATION_HOST_NUMA;
  switch (loc->type) {
  case TP_LOCATION_DEVICE:
    tp__mutex_lock(&p->lock);
    *flags = p->space.access[loc->id];
    tp__mutex_unlock(&p->lock);
    return TP_SUCCESS;
  case TP_LOCATION_HOST:
  case TP_LOCATION_HOST_NUMA:
    *flags = host_pool ? TP_ACCESS_READ_WRITE : TP_ACCESS_NONE;
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

tp_error_t tp__pool_set_access(tp__pool *p, const tp_access_desc_t *list,
                               size_t n) {
  if (p->imported) /* its mappings are its ops', under a lock of its own */
    return p->ops->set_access(p, list, n);
  tp__mutex_lock(&p->lock);
  tp_error_t err = p->torn_down ? TP_ERROR_INVALID_VALUE
                                : tp__space_set_access(&p->space, list, n);
  tp__mutex_unlock(&p->lock);
  return err;
}

/* ---- attributes
 * ------------------------------------------------------------------ One row
 * per attribute: its value type, whether it is read-only, read-write or
 * resettable to 0 only, and how to read and write it. */

typedef struct attr_row {
  tp_pool_attr_t attr;
  bool u64; /* uint64_t, else int */
  enum { ATTR_RO, ATTR_RW, ATTR_RESET } mode;
  uint64_t (*get)(tp__pool *p);
  /* ATTR_RW: checks and stores; RESET: resets. */
  tp_error_t (*set)(tp__pool *p, uint64_t v);
} attr_row;

#define ATOMIC_ATTR(name, field)                                               \
  static uint64_t get_##name(tp__pool *p) {                                    \
    return (uint64_t)atomic_load(&p->field);                                   \
  }                                                                            \
  static tp_error_t set_##name(tp__pool *p, uint64_t v) {                      \
    atomic_store(&p->field, v);                                                \
    return TP_SUCCESS;                                                         \
  }
ATOMIC_ATTR(follow, follow_events)
ATOMIC_ATTR(opportunistic, opportunistic)
ATOMIC_ATTR(internal, internal_deps)
ATOMIC_ATTR(oom_wait, oom_wait)
ATOMIC_ATTR(threshold, release_threshold)
#undef ATOMIC_ATTR

static uint64_t get_slack(tp__pool *p) {
  return atomic_load(&p->growth_slack);
}
static tp_error_t set_slack(tp__pool *p, uint64_t v) {
  TP_RETURN_IF(v > TP_GROWTH_SLACK_MAX, TP_ERROR_INVALID_VALUE);
  atomic_store(&p->growth_slack, v);
  return TP_SUCCESS;
}

static uint64_t get_reserved(tp__pool *p) {
  return atomic_load(&p->space.reserved);
}
static uint64_t get_reserved_high(tp__pool *p) {
  return atomic_load(&p->space.reserved_high);
}
/* Growth adds to the total and then raises the high, with no lock; a growth
 * whose add falls between the reset's load and its store would be lost, so
 * the reset raises the high again from a second load, taken after its store:
 * either that load sees the growth or the growth's own raise comes after the
 * store. */
static tp_error_t reset_reserved_high(tp__pool *p, uint64_t v) {
  (void)v;
  atomic_store(&p->space.reserved_high, atomic_load(&p->space.reserved));
  tp__atomic_max(&p->space.reserved_high, atomic_load(&p->space.reserved));
  return TP_SUCCESS;
}
static uint64_t get_used(tp__pool *p) {
  tp__mutex_lock(&p->lock);
  uint64_t u = tp__pool_used(p);
  tp__mutex_unlock(&p->lock);
  return u;
}
/* Never below the current total when read. */
static uint64_t get_used_high(tp__pool *p) {
  tp__pool_peak_raise(p);
  return atomic_load(&p->used_high);
}
/* Resets the high to the current total; every thread's mark starts over.
 * The key moves first, and the total is taken after: an allocation that
 * the total misses then finds the new key, which starts its marks over and
 * makes it take the total itself (it waits for this lock). The heavy fence
 * (membarrier, where the kernel has it) orders the allocation's count
 * before its later load of the key, as seen from here: of the total here
 * and that load, one sees the other's side. Without membarrier a window of
 * a few instructions stays open. The total was once taken first, and an
 * allocation finished between the two steps was in neither, a peak lost
 * for good (one thread on one stream, the case the high promises to keep
 * exact). */
static tp_error_t reset_used_high(tp__pool *p, uint64_t v) {
  (void)v;
  tp__mutex_lock(&p->lock);
  atomic_store(&p->peak_key, atomic_fetch_add(&peak_keys, 1) + 1);
  tp__fence_heavy();
  atomic_store(&p->used_high, tp__pool_used(p));
  tp__mutex_unlock(&p->lock);
  return TP_SUCCESS;
}
static uint64_t get_alloc_type(tp__pool *p) {
  return (uint64_t)p->props.alloc_type;
}
static uint64_t get_handle_types(tp__pool *p) {
  return p->props.handle_types;
}
static uint64_t get_location_id(tp__pool *p) {
  return (uint64_t)(int64_t)p->props.location.id;
}
static uint64_t get_location_type(tp__pool *p) {
  return (uint64_t)p->props.location.type;
}
static uint64_t get_domain(tp__pool *p) {
  return (uint64_t)(int64_t)p->props.location.locality_domain_id;
}
static uint64_t get_max_size(tp__pool *p) {
  return p->props.max_size;
}
static uint64_t get_zero(tp__pool *p) {
  (void)p;
  return 0;
}
static uint64_t get_maps(tp__pool *p) {
  return atomic_load(&p->space.maps);
}
static uint64_t get_unmaps(tp__pool *p) {
  return atomic_load(&p->space.unmaps);
}
static uint64_t get_chunk(tp__pool *p) {
  return p->space.gran;
}

static const attr_row attrs[] = {
    {TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, false, ATTR_RW, get_follow,
     set_follow},
    {TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, false, ATTR_RW, get_opportunistic,
     set_opportunistic},
    {TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, false, ATTR_RW,
     get_internal, set_internal},
    {TP_POOL_ATTR_RELEASE_THRESHOLD, true, ATTR_RW, get_threshold,
     set_threshold},
    {TP_POOL_ATTR_RESERVED_MEM_CURRENT, true, ATTR_RO, get_reserved, NULL},
    {TP_POOL_ATTR_RESERVED_MEM_HIGH, true, ATTR_RESET, get_reserved_high,
     reset_reserved_high},
    {TP_POOL_ATTR_USED_MEM_CURRENT, true, ATTR_RO, get_used, NULL},
    {TP_POOL_ATTR_USED_MEM_HIGH, true, ATTR_RESET, get_used_high,
     reset_used_high},
    {TP_POOL_ATTR_ALLOCATION_TYPE, false, ATTR_RO, get_alloc_type, NULL},
    {TP_POOL_ATTR_EXPORT_HANDLE_TYPES, false, ATTR_RO, get_handle_types, NULL},
    {TP_POOL_ATTR_LOCATION_ID, false, ATTR_RO, get_location_id, NULL},
    {TP_POOL_ATTR_LOCATION_TYPE, false, ATTR_RO, get_location_type, NULL},
    {TP_POOL_ATTR_LOCALITY_DOMAIN_ID, false, ATTR_RO, get_domain, NULL},
    {TP_POOL_ATTR_MAX_POOL_SIZE, true, ATTR_RO, get_max_size, NULL},
    {TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, false, ATTR_RO, get_zero, NULL},
    {TP_POOL_ATTR_OOM_WAIT, false, ATTR_RW, get_oom_wait, set_oom_wait},
    {TP_POOL_ATTR_CHUNK_MAPS, true, ATTR_RO, get_maps, NULL},
    {TP_POOL_ATTR_CHUNK_UNMAPS, true, ATTR_RO, get_unmaps, NULL},
    {TP_POOL_ATTR_CHUNK_SIZE, true, ATTR_RO, get_chunk, NULL},
    {TP_POOL_ATTR_GROWTH_SLACK, true, ATTR_RW, get_slack, set_slack},
};

static const attr_row *attr_find(tp_pool_attr_t attr) {
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
    if (attrs[i].attr == attr)
      return &attrs[i];
  return NULL;
}

tp_error_t tp__pool_get_attr(tp__pool *p, tp_pool_attr_t attr, void *value) {
  const attr_row *row = attr_find(attr);
  TP_RETURN_IF(!row, TP_ERROR_INVALID_VALUE);
  uint64_t v = row->get(p);
  if (row->u64) {
    memcpy(value, &v, sizeof v);
  } else {
    int i = (int)(int64_t)v;
    memcpy(value, &i, sizeof i);
  }
  return TP_SUCCESS;
}

tp_error_t tp__pool_set_attr(tp__pool *p, tp_pool_attr_t attr, void *value) {
  const attr_row *row = attr_find(attr);
  TP_RETURN_IF(!row || row->mode == ATTR_RO, TP_ERROR_INVALID_VALUE);
  uint64_t v = 0;
  int i = 0;
  if (row->u64) {
    memcpy(&v, value, sizeof v);
  } else {
    memcpy(&i, value, sizeof i);
    v = i != 0; /* the int attributes that can be set are switches */
  }
  TP_RETURN_IF(row->mode == ATTR_RESET && v != 0, TP_ERROR_INVALID_VALUE);
  return row->set(p, v);
}

/* ---- teardown
 * --------------------------------------------------------------------- A
 * destroyed pool goes when its last allocation is freed and every free has
 * completed; until then it waits among the live pools, which each synchronize
 * visits. */

/* Tries to finish a destroyed pool; pools_lock held, pool lock not. Returns
 * true when the pool is gone. */
static bool teardown(tp__pool *p, bool poll) {
  /* A pool shared with other processes stops serving them first, with no
   * lock held (its server takes the pool lock). A block another process
   * still holds keeps the pool. */
  if (p->ops && p->ops->stop && !p->ops->stop(p))
    return false;
  tp__mutex_lock(&p->lock);
  bool gone = !p->torn_down;
  /* Draining first means an allocation racing in from a cache is either
   * counted below or finds the cache empty and then waits for this lock. */
  /* An allocation that raced the destroy and waits, the pool lock dropped,
   * for a pending free (OOM_WAIT) holds its stream's cache: the pool stays
   * until it is back, and a later free or synchronize finishes it. */
  if (gone) {
    tp__caches_drain_all(&p->caches);
    gone = tp__pool_used(p) == 0 && p->oom_waiters == 0;
  }
  /* The caches go before the last look for pending frees: a free that came
   * in through its stream's cache after the drain is then in the pool. */
  if (gone) {
    while (p->caches.list)
      tp__cache_free(&p->caches, p->caches.list);
    tp__slabs_settle(&p->slabs, poll, true);
    tp__heap_settle(&p->heap, poll);
    gone = !tp__slabs_pending(&p->slabs) && !tp__heap_pending(&p->heap);
  }
  if (gone) {
    p->torn_down = true;
    tp__registry_remove(p->space.base, p->space.va_size);
    tp__space_fini(&p->space);
  }
  tp__mutex_unlock(&p->lock);
  if (!gone)
    return false;
  for (uint32_t i = 0; i < npools; i++)
    if (pools[i] == p)
      pools[i] = pools[--npools];
  tp__handle_bury(p->handle);
  tp__guard_retire(p, pool_free);
  return true;
}

/* Finishes destroyed pools whose frees have completed. */
static bool reap(bool poll) {
  bool went = false;
  tp__mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools;) {
    tp__pool *p = pools[i];
    if (atomic_load(&p->destroyed) && teardown(p, poll)) {
      went = true;
      continue; /* the array moved; look at index i again */
    }
    i++;
  }
  tp__mutex_unlock(&pools_lock);
  return went;
}

bool tp__pools_reap_polling(void) {
  return reap(true);
}

void tp__pools_reap(void) {
  (void)reap(false);
}

tp_error_t tp__pool_destroy(tp__pool *p) {
  TP_RETURN_IF(p->is_default, TP_ERROR_INVALID_VALUE);
  int live = TP_POOL_LIVE;
  TP_RETURN_IF(!atomic_compare_exchange_strong(&p->handle->state, &live,
                                               TP_POOL_DESTROYING),
               TP_ERROR_INVALID_VALUE);
  if (p->ops && p->ops->destroy)
    p->ops->destroy(p);
  if (p->imported) {
    tp__handle_bury(p->handle);
    tp__guard_retire(p, pool_free);
    return TP_SUCCESS;
  }
  /* Nothing can allocate from the pool any more: its free memory goes now,
   * and what its pending frees give back goes at the synchronize that
   * shows them complete, rather than waiting for its last allocation. */
  atomic_store(&p->release_threshold, 0);
  (void)tp__pool_trim(p, 0);
  atomic_store(&p->destroyed, true);
  (void)reap(true);
  return TP_SUCCESS;
}
