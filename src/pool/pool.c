/* The pool object: properties, attributes, statistics, lifetime, the stream
 * caches, and the allocate and free paths: each stream's cache first (no
 * lock shared with other streams), then the pool's reuse policies in
 * DESIGN.md's order, then growth, then the host-side wait. */
#include <string.h>
#include <sys/random.h>

#include "ipc/ipc.h"
#include "pool/pool.h"

static _Atomic uint64_t pool_serial;

/* Every live pool, for synchronize and stream destruction to visit. Taken
 * before any pool lock, never while one is held. */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static tp__pool **pools;
static uint32_t npools, cappools;

/* Handles of destroyed pools, kept so that a stale handle is recognised; a
 * few bytes each for the life of the process. */
static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tp_pool_opaque *dead_handles;

static void handle_bury(struct tp_pool_opaque *h) {
  h->pool = NULL;
  pthread_mutex_lock(&dead_lock);
  h->next_dead = dead_handles;
  dead_handles = h;
  pthread_mutex_unlock(&dead_lock);
  atomic_store_explicit(&h->state, TP_POOL_DEAD, memory_order_release);
}

/* ---- bytes in use --------------------------------------------------------
 * "Used" changes on every allocate and free, and one shared counter would be
 * a cache line that every thread's pair bounces. So each stream cache counts
 * its own bytes exactly, and publishes to the pool's total only when its
 * count rises above what it published, or falls more than a slack below it
 * (1 MiB, or the stream's largest allocation up to 1 GiB).
 * A pair on a warm stream then touches nothing shared. The published total
 * never falls below the true one, so a true new peak always makes it pass
 * the high watermark; the peak itself is then taken from the exact sum, so
 * that the watermark is exact whenever one thread uses the pool, and within
 * the operations in flight when several do. */
#define TP_USED_SLACK (INT64_C(1) << 20)
#define TP_USED_SLACK_MAX (INT64_C(1) << 30)

/* Moves a cache's count; stream lock held. Returns the published total when
 * it rose (a possible new peak for used_peak), else 0. */
static uint64_t used_move(tp__pool *p, tp__cache *c, int64_t delta) {
  int64_t u = atomic_load_explicit(&c->used, memory_order_relaxed) + delta;
  atomic_store_explicit(&c->used, u, memory_order_relaxed);
  if (u > c->pub) {
    uint64_t d = (uint64_t)(u - c->pub);
    c->pub = u;
    return atomic_fetch_add_explicit(&p->used_pub, d, memory_order_relaxed) + d;
  }
  /* The slack grows to the largest allocation the stream makes, so that a
   * pair of big blocks does not publish twice either. */
  if (delta > c->slack)
    c->slack = delta < TP_USED_SLACK_MAX ? delta : TP_USED_SLACK_MAX;
  if (c->pub - u > c->slack) {
    atomic_fetch_sub_explicit(&p->used_pub, (uint64_t)(c->pub - u),
                              memory_order_relaxed);
    c->pub = u;
  }
  return 0;
}

/* Bytes counted outside any cache (frees on a stream that has none). */
static uint64_t used_move_base(tp__pool *p, int64_t delta) {
  atomic_fetch_add_explicit(&p->used_base, delta, memory_order_relaxed);
  uint64_t g = atomic_fetch_add_explicit(&p->used_pub, (uint64_t)delta,
                                         memory_order_relaxed);
  return delta > 0 ? g + (uint64_t)delta : 0;
}

uint64_t tp__pool_used(tp__pool *p) {
  int64_t t = atomic_load_explicit(&p->used_base, memory_order_relaxed);
  for (tp__cache *c = p->caches; c; c = c->next_in_pool)
    t += atomic_load_explicit(&c->used, memory_order_relaxed);
  return t > 0 ? (uint64_t)t : 0;
}

/* After a count rose to published total `g`, no lock held. */
static void used_peak(tp__pool *p, uint64_t g) {
  if (TP_LIKELY(g <= atomic_load_explicit(&p->used_high, memory_order_relaxed)))
    return;
  pthread_mutex_lock(&p->lock);
  tp__atomic_max(&p->used_high, tp__pool_used(p));
  pthread_mutex_unlock(&p->lock);
}

/* ---- creation ------------------------------------------------------------ */

/* A pool and its handle with the settings every pool starts with (CUDA's
 * reuse policies on); NULL when memory runs out. */
static tp__pool *pool_alloc(const tp_pool_props_t *props) {
  tp__pool *p = calloc(1, sizeof *p);
  struct tp_pool_opaque *h = calloc(1, sizeof *h);
  if (!p || !h) {
    free(p);
    free(h);
    return NULL;
  }
  p->handle = h;
  p->serial = atomic_fetch_add(&pool_serial, 1) + 1;
  p->props = *props;
  atomic_init(&p->follow_events, 1);
  atomic_init(&p->opportunistic, 1);
  atomic_init(&p->internal_deps, 1);
  atomic_init(&p->oom_wait, 1);
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

/* Makes a finished pool's handle answer. */
static tp_pool_t pool_publish(tp__pool *p) {
  struct tp_pool_opaque *h = p->handle;
  h->magic = TP_POOL_MAGIC;
  h->pool = p;
  atomic_store_explicit(&h->state, TP_POOL_LIVE, memory_order_release);
  return h;
}

tp_error_t tp__pool_new(const tp_pool_props_t *props, bool is_default,
                        tp_pool_t *out) {
  tp__mem_kind kind = {props->location, props->alloc_type, props->handle_types};
  size_t gran = 0;
  uint64_t capacity = 0;
  TP_FORWARD(tp__platform->mem_query(&kind, &gran, &capacity));
  TP_RETURN_IF(gran < TP_GRANULE || (gran & (gran - 1)), TP_ERROR_PLATFORM);
  tp__pool *p = pool_alloc(props);
  TP_RETURN_IF(!p, TP_ERROR_OUT_OF_MEMORY);
  struct tp_pool_opaque *h = p->handle;
  p->kind = kind;
  p->is_default = is_default;
  if (props->handle_types && getrandom(&p->export_key, sizeof p->export_key,
                                       0) != (ssize_t)sizeof p->export_key)
    p->export_key = (uint64_t)(uintptr_t)p ^ p->serial * 0x9E3779B97F4A7C15ull;
  p->gran = gran;
  p->limit = capacity / gran * gran;
  if (props->max_size && props->max_size < p->limit)
    p->limit = tp__align_up(props->max_size, gran);
  if (kind.location.type == TP_LOCATION_DEVICE)
    p->access[kind.location.id] = TP_ACCESS_READ_WRITE;
  if (kind.type == TP_ALLOCATION_MANAGED) {
    int n = 0;
    if (tp__platform->device_count(&n) == TP_SUCCESS)
      for (int d = 0; d < n && d < TP_MAX_DEVICES; d++)
        p->access[d] = TP_ACCESS_READ_WRITE;
  }
  tp_error_t err = tp__space_init(p);
  if (err == TP_SUCCESS && props->handle_types)
    err = tp__ipc_export_init(p);
  pthread_mutex_lock(&pools_lock);
  if (err == TP_SUCCESS && !TP_RESERVE(pools, npools, cappools))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS)
    pools[npools++] = p;
  pthread_mutex_unlock(&pools_lock);
  if (err != TP_SUCCESS) {
    tp__ipc_export_free(p);
    tp__space_fini(p);
    pthread_mutex_destroy(&p->lock);
    free(p);
    free(h);
    return err;
  }
  *out = pool_publish(p);
  return TP_SUCCESS;
}

tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out) {
  TP_RETURN_IF(!handle || handle->magic != TP_POOL_MAGIC,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(atomic_load_explicit(&handle->state, memory_order_acquire) !=
                   TP_POOL_LIVE,
               TP_ERROR_INVALID_VALUE);
  *out = handle->pool;
  return TP_SUCCESS;
}

/* ---- stream caches ------------------------------------------------------- */

tp__cache *tp__cache_find(tp__stream *s, tp__pool *p) {
  tp__cache *c = s->hint;
  if (TP_LIKELY(c && c->pool == p))
    return c;
  for (c = s->caches; c && c->pool != p; c = c->next_in_stream) {
  }
  if (c)
    s->hint = c;
  return c;
}

/* The cache of `s` for `p`, made on first use; pool lock held. */
static tp__cache *cache_ensure(tp__pool *p, tp__stream *s) {
  tp__spin_lock(&s->lock);
  tp__cache *c = tp__cache_find(s, p);
  tp__spin_unlock(&s->lock);
  if (c)
    return c;
  c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->slack = TP_USED_SLACK;
  c->pool = p;
  c->stream = s;
  tp__stream_ref(s);
  c->next_in_pool = p->caches;
  if (c->next_in_pool)
    c->next_in_pool->prev_in_pool = c;
  p->caches = c;
  tp__spin_lock(&s->lock);
  c->next_in_stream = s->caches;
  s->caches = c;
  s->hint = c;
  tp__spin_unlock(&s->lock);
  return c;
}

void tp__cache_drain(tp__pool *p, tp__cache *c) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++) {
    for (uint32_t i = 0; i < c->cls[cls].n; i++)
      tp__slab_put(p, cls, &c->cls[cls].v[i], c->stream);
    c->cls[cls].n = 0;
  }
  for (uint32_t i = 0; i < c->nlarge; i++) {
    tp__block *b = c->large[i].owner;
    b->tag = (tp__tag){c->stream, c->large[i].epoch, c->large[i].lseq};
    tp__stream_ref(c->stream);
    tp__block_release(p, b);
  }
  c->nlarge = 0;
}

/* Unlinks and frees a drained cache; pool lock held. */
static void cache_free(tp__pool *p, tp__cache *c) {
  tp__stream *s = c->stream;
  tp__spin_lock(&s->lock);
  tp__cache **pp = &s->caches;
  while (*pp != c)
    pp = &(*pp)->next_in_stream;
  *pp = c->next_in_stream;
  if (s->hint == c)
    s->hint = NULL;
  int64_t u = atomic_load_explicit(&c->used, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->used_base, u, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->used_pub, (uint64_t)(u - c->pub),
                            memory_order_relaxed);
  tp__spin_unlock(&s->lock);
  if (c->prev_in_pool)
    c->prev_in_pool->next_in_pool = c->next_in_pool;
  else
    p->caches = c->next_in_pool;
  if (c->next_in_pool)
    c->next_in_pool->prev_in_pool = c->prev_in_pool;
  free(c);
  tp__stream_unref(s);
}

void tp__pool_flush_all(tp__pool *p) {
  for (tp__cache *c = p->caches; c; c = c->next_in_pool) {
    tp__spin_lock(&c->stream->lock);
    tp__cache_drain(p, c);
    tp__spin_unlock(&c->stream->lock);
  }
}

/* The cache of `s` in `p`, drained; pool lock held. */
static tp__cache *flush_one(tp__pool *p, tp__stream *s) {
  tp__spin_lock(&s->lock);
  tp__cache *c = tp__cache_find(s, p);
  if (c)
    tp__cache_drain(p, c);
  tp__spin_unlock(&s->lock);
  return c;
}

/* ---- teardown --------------------------------------------------------------
 * A destroyed pool goes when its last allocation is freed and every free
 * has completed; until then it waits among the zombies, which each
 * synchronize visits. */
static bool has_pending(tp__pool *p) {
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++)
    if (p->npending[cls])
      return true;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (tp__block *b = p->bins[bin]; b; b = b->fnext)
      if (b->tag.stream)
        return true;
  return false;
}

static void free_blocks(tp__pool *p) {
  for (size_t c = tp__segment_next(p, 0); c < p->nchunks;
       c = tp__segment_next(p, c + 1)) {
    for (tp__block *b = p->chunks[c].seg_first, *n; b; b = n) {
      n = b->next;
      if (b->tag.stream)
        tp__stream_unref(b->tag.stream);
      free(b);
    }
  }
  while (p->spare_blocks) {
    tp__block *b = p->spare_blocks;
    p->spare_blocks = b->fnext;
    free(b);
  }
}

/* Tries to finish a destroyed pool; pools_lock held, pool lock not. Returns
 * true when the pool is gone. */
static bool teardown(tp__pool *p, bool poll) {
  /* An exporting pool stops serving importers first, with no lock held:
   * its service thread takes the pool lock. A block an importer still
   * holds keeps the pool. */
  if (p->exp && !tp__ipc_export_stop(p))
    return false;
  pthread_mutex_lock(&p->lock);
  if (p->torn_down || tp__pool_used(p) != 0) {
    pthread_mutex_unlock(&p->lock);
    return false;
  }
  while (p->caches) {
    tp__cache *c = p->caches;
    tp__spin_lock(&c->stream->lock);
    tp__cache_drain(p, c);
    tp__spin_unlock(&c->stream->lock);
    cache_free(p, c);
  }
  tp__slab_settle(p, poll, true);
  tp__fit_settle(p, poll);
  if (has_pending(p)) {
    pthread_mutex_unlock(&p->lock);
    return false;
  }
  p->torn_down = true;
  free_blocks(p);
  tp__slab_fini(p);
  tp__space_fini(p);
  pthread_mutex_unlock(&p->lock);
  for (uint32_t i = 0; i < npools; i++)
    if (pools[i] == p)
      pools[i] = pools[--npools];
  handle_bury(p->handle);
  tp__ipc_export_free(p);
  pthread_mutex_destroy(&p->lock);
  free(p);
  return true;
}

/* Finishes destroyed pools whose frees have completed. */
static void reap(bool poll) {
  pthread_mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools;) {
    tp__pool *p = pools[i];
    if (atomic_load(&p->destroyed) && teardown(p, poll))
      continue; /* the array moved; look at index i again */
    i++;
  }
  pthread_mutex_unlock(&pools_lock);
}

tp_error_t tp__pool_destroy(tp__pool *p) {
  TP_RETURN_IF(p->is_default, TP_ERROR_INVALID_VALUE);
  int live = TP_POOL_LIVE;
  TP_RETURN_IF(!atomic_compare_exchange_strong(&p->handle->state, &live,
                                               TP_POOL_DESTROYING),
               TP_ERROR_INVALID_VALUE);
  if (p->imported) {
    tp__ipc_import_destroy(p);
    handle_bury(p->handle);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return TP_SUCCESS;
  }
  if (p->exp)
    tp__ipc_export_close(p);
  atomic_store(&p->destroyed, true);
  reap(true);
  return TP_SUCCESS;
}

tp_error_t tp__pool_new_imported(const tp_pool_props_t *props, tp_pool_t *out) {
  tp__pool *p = pool_alloc(props);
  TP_RETURN_IF(!p, TP_ERROR_OUT_OF_MEMORY);
  p->imported = true;
  *out = pool_publish(p);
  return TP_SUCCESS;
}

/* ---- the large path --------------------------------------------------------
 * Pool lock held. Each step is tried only when the ones before found
 * nothing, so the cheapest reuse wins. */

/* Waits on the host for every pending free of the pool: the last resort
 * before out-of-memory. Drops the pool lock while it waits, so that stream
 * work that calls into tidepool can still finish. */
static void wait_pending(tp__pool *p) {
  tp__tag *tags = NULL;
  uint32_t n = 0, cap = 0;
  for (unsigned bin = 0; bin < TP_NBINS; bin++)
    for (tp__block *b = p->bins[bin]; b; b = b->fnext)
      if (b->tag.stream && TP_RESERVE(tags, n, cap)) {
        tags[n++] = b->tag;
        tp__stream_ref(b->tag.stream);
      }
  for (unsigned cls = 0; cls < TP_NCLASSES; cls++)
    for (uint32_t i = 0; i < p->npending[cls]; i++)
      if (TP_RESERVE(tags, n, cap)) {
        tags[n++] = p->pending[cls][i].tag;
        tp__stream_ref(p->pending[cls][i].tag.stream);
      }
  pthread_mutex_unlock(&p->lock);
  for (uint32_t i = 0; i < n; i++) {
    (void)tp__stream_wait_host(&tags[i]);
    tp__stream_unref(tags[i].stream);
  }
  free(tags);
  pthread_mutex_lock(&p->lock);
  tp__slab_settle(p, false, true);
  tp__fit_settle(p, false);
}

tp_error_t tp__large_get(tp__pool *p, tp__stream *a, size_t size, bool grow,
                         tp__block **out) {
  bool opportunistic =
      atomic_load_explicit(&p->opportunistic, memory_order_relaxed);
  tp__block *b = tp__fit_take(p, a, size, false);
  if (!b && opportunistic) {
    tp__fit_settle(p, true);
    b = tp__fit_take(p, a, size, false);
  }
  if (!b)
    b = tp__fit_take_run(p, a, size, false);
  if (!b) {
    tp__pool_flush_all(p);
    tp__slab_settle(p, opportunistic, true);
    tp__fit_settle(p, opportunistic);
    b = tp__fit_take(p, a, size, false);
  }
  if (!b && atomic_load_explicit(&p->internal_deps, memory_order_relaxed)) {
    b = tp__fit_take(p, a, size, true);
    if (!b)
      b = tp__fit_take_run(p, a, size, true);
  }
  tp_error_t err = TP_SUCCESS;
  for (int attempt = 0; !b && grow && attempt < 2; attempt++) {
    tp__block *grown = NULL;
    err = tp__space_grow(p, size, &grown);
    if (err == TP_SUCCESS) {
      b = tp__fit_take(p, a, size, false);
      TP_CHECK(b != NULL);
      break;
    }
    if (err != TP_ERROR_OUT_OF_MEMORY || attempt > 0 ||
        !atomic_load_explicit(&p->oom_wait, memory_order_relaxed))
      break;
    wait_pending(p);
    b = tp__fit_take(p, a, size, false);
  }
  TP_RETURN_IF(!b, err != TP_SUCCESS ? err : TP_ERROR_OUT_OF_MEMORY);
  *out = b;
  return TP_SUCCESS;
}

/* ---- allocation ------------------------------------------------------------
 */

static size_t large_slack(size_t r) {
  return r / 64;
}

static tp_error_t finish_small(tp__pool *p, const tp__centry *e, size_t size,
                               void **ptr) {
  tp__slab *s = e->owner;
  (void)p;
  atomic_store_explicit(&s->req[tp__slab_index(s, e->addr)], (uint32_t)size,
                        memory_order_release);
  *ptr = (void *)e->addr;
  return TP_SUCCESS;
}

/* The entry goes in before the state says USED, so that a walker that sees
 * a used block sees its entry. */
static tp_error_t finish_large(tp__pool *p, tp__block *b, size_t size,
                               void **ptr) {
  atomic_store_explicit(&b->req, size, memory_order_relaxed);
  _Atomic uintptr_t *e = tp__space_entry(p, b->addr, false);
  atomic_store_explicit(e, (uintptr_t)b, memory_order_release);
  atomic_store_explicit(&b->state, TP_BLOCK_USED, memory_order_release);
  *ptr = (void *)b->addr;
  return TP_SUCCESS;
}

static tp_error_t small_slow(tp__pool *p, tp__stream *s, unsigned cls,
                             size_t size, void **ptr) {
  tp__centry got[16];
  tp_error_t err = TP_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&p->lock);
  tp__cache *c = cache_ensure(p, s);
  uint32_t n = c ? tp__slab_take(p, s, cls, got, 16, &err) : 0;
  uint64_t g = 0;
  if (n > 0) {
    tp__spin_lock(&s->lock);
    for (uint32_t i = 1; i < n; i++) {
      if (c->cls[cls].n < TP_SMALL_CACHE)
        c->cls[cls].v[c->cls[cls].n++] = got[i];
      else
        tp__slab_put(p, cls, &got[i], s);
    }
    g = used_move(p, c, (int64_t)size);
    tp__spin_unlock(&s->lock);
  }
  TP_DEBUG_WALK(p);
  pthread_mutex_unlock(&p->lock);
  TP_RETURN_IF(n == 0, err);
  finish_small(p, &got[0], size, ptr);
  used_peak(p, g);
  return TP_SUCCESS;
}

static tp_error_t large_slow(tp__pool *p, tp__stream *s, size_t r, size_t size,
                             void **ptr) {
  pthread_mutex_lock(&p->lock);
  tp__block *b = NULL;
  tp_error_t err = TP_ERROR_OUT_OF_MEMORY;
  /* The stream's own cached blocks go back first, so that they merge with
   * their neighbours before the search. */
  if (flush_one(p, s) || cache_ensure(p, s))
    err = tp__large_get(p, s, r, true, &b);
  if (err == TP_SUCCESS && !tp__space_entry(p, b->addr, true)) {
    atomic_store_explicit(&b->state, TP_BLOCK_FREE, memory_order_relaxed);
    tp__block_release(p, b);
    err = TP_ERROR_OUT_OF_MEMORY;
  }
  uint64_t g = 0;
  if (err == TP_SUCCESS) {
    tp__tag_clear(&b->tag); /* the user's now, in stream order on `s` */
    finish_large(p, b, size, ptr);
    tp__spin_lock(&s->lock);
    g = used_move(p, tp__cache_find(s, p), (int64_t)size);
    tp__spin_unlock(&s->lock);
  }
  TP_DEBUG_WALK(p);
  pthread_mutex_unlock(&p->lock);
  used_peak(p, g);
  return err;
}

tp_error_t tp__pool_malloc(tp__pool *p, void **ptr, size_t size,
                           tp__stream *s) {
  TP_RETURN_IF(size > p->limit || size > SIZE_MAX - TP_GRANULE,
               TP_ERROR_OUT_OF_MEMORY);
  size_t r = tp__align_up(size, TP_GRANULE);
  if (r <= TP_SMALL_MAX) {
    unsigned cls = tp__class_of(r);
    tp__spin_lock(&s->lock);
    tp__cache *c = tp__cache_find(s, p);
    if (TP_LIKELY(c && c->cls[cls].n)) {
      tp__centry e = c->cls[cls].v[--c->cls[cls].n];
      uint64_t g = used_move(p, c, (int64_t)size);
      tp__spin_unlock(&s->lock);
      finish_small(p, &e, size, ptr);
      used_peak(p, g);
      return TP_SUCCESS;
    }
    tp__spin_unlock(&s->lock);
    return small_slow(p, s, cls, size, ptr);
  }
  tp__spin_lock(&s->lock);
  tp__cache *c = tp__cache_find(s, p);
  int best = -1;
  for (uint32_t i = 0; c && i < c->nlarge; i++) {
    tp__block *b = c->large[i].owner;
    if (b->size >= r && b->size - r <= large_slack(r) &&
        (best < 0 || b->size < ((tp__block *)c->large[best].owner)->size))
      best = (int)i;
  }
  if (best >= 0) {
    tp__block *b = c->large[best].owner;
    c->large[best] = c->large[--c->nlarge];
    uint64_t g = used_move(p, c, (int64_t)size);
    tp__spin_unlock(&s->lock);
    finish_large(p, b, size, ptr);
    used_peak(p, g);
    return TP_SUCCESS;
  }
  tp__spin_unlock(&s->lock);
  return large_slow(p, s, r, size, ptr);
}

/* ---- free ---------------------------------------------------------------- */

/* Gives back entries a cache could not keep; no lock held. */
static void spill(tp__pool *p, tp__stream *s, unsigned cls, const tp__centry *v,
                  uint32_t n, bool large) {
  pthread_mutex_lock(&p->lock);
  for (uint32_t i = 0; i < n; i++) {
    if (!large) {
      tp__slab_put(p, cls, &v[i], s);
      continue;
    }
    tp__block *b = v[i].owner;
    b->tag = (tp__tag){s, v[i].epoch, v[i].lseq};
    tp__stream_ref(s);
    tp__block_release(p, b);
  }
  TP_DEBUG_WALK(p);
  pthread_mutex_unlock(&p->lock);
}

/* A destroyed pool may go once its last allocation is freed. */
static void maybe_reap(tp__pool *p) {
  if (atomic_load_explicit(&p->destroyed, memory_order_acquire))
    reap(false);
}

static tp_error_t free_small(tp__pool *p, tp__slab *slab, uintptr_t addr,
                             tp__stream *s) {
  int64_t idx = tp__slab_index(slab, addr);
  TP_RETURN_IF(idx < 0, TP_ERROR_INVALID_VALUE);
  uint32_t req =
      atomic_exchange_explicit(&slab->req[idx], 0, memory_order_acq_rel);
  TP_RETURN_IF(req == 0, TP_ERROR_INVALID_VALUE);
  unsigned cls = slab->cls;
  tp__centry spilled[TP_SMALL_CACHE / 2];
  uint32_t nspill = 0;
  tp__spin_lock(&s->lock);
  tp__tag t = tp__stream_tag(s);
  tp__centry e = {addr, slab, t.epoch, t.lseq};
  tp__cache *c = tp__cache_find(s, p);
  if (c && c->cls[cls].n == TP_SMALL_CACHE) {
    /* The oldest half leaves: the newest are the likeliest to be reused. */
    nspill = TP_SMALL_CACHE / 2;
    memcpy(spilled, c->cls[cls].v, sizeof spilled);
    memmove(c->cls[cls].v, c->cls[cls].v + nspill,
            (TP_SMALL_CACHE - nspill) * sizeof(tp__centry));
    c->cls[cls].n -= nspill;
  }
  if (c) {
    c->cls[cls].v[c->cls[cls].n++] = e;
    used_move(p, c, -(int64_t)req);
  }
  tp__spin_unlock(&s->lock);
  if (!c) {
    pthread_mutex_lock(&p->lock);
    c = cache_ensure(p, s);
    bool kept = false;
    if (c) {
      tp__spin_lock(&s->lock);
      if (c->cls[cls].n < TP_SMALL_CACHE) {
        c->cls[cls].v[c->cls[cls].n++] = e;
        kept = true;
      }
      used_move(p, c, -(int64_t)req);
      tp__spin_unlock(&s->lock);
    } else {
      used_move_base(p, -(int64_t)req);
    }
    if (!kept)
      tp__slab_put(p, cls, &e, s);
    pthread_mutex_unlock(&p->lock);
  }
  if (nspill)
    spill(p, s, cls, spilled, nspill, false);
  maybe_reap(p);
  return TP_SUCCESS;
}

static tp_error_t free_large(tp__pool *p, tp__block *b,
                             _Atomic uintptr_t *entry, tp__stream *s) {
  uintptr_t expect = (uintptr_t)b;
  TP_RETURN_IF(!atomic_compare_exchange_strong_explicit(entry, &expect, 0,
                                                        memory_order_acq_rel,
                                                        memory_order_relaxed),
               TP_ERROR_INVALID_VALUE);
  size_t req = atomic_load_explicit(&b->req, memory_order_relaxed);
  tp__centry evicted = {0};
  bool evict = false;
  atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
  tp__spin_lock(&s->lock);
  tp__tag t = tp__stream_tag(s);
  tp__centry e = {b->addr, b, t.epoch, t.lseq};
  tp__cache *c = tp__cache_find(s, p);
  if (c && c->nlarge == TP_LARGE_CACHE) {
    evicted = c->large[0];
    memmove(c->large, c->large + 1, (TP_LARGE_CACHE - 1) * sizeof(tp__centry));
    c->nlarge--;
    evict = true;
  }
  if (c) {
    c->large[c->nlarge++] = e;
    used_move(p, c, -(int64_t)req);
  }
  tp__spin_unlock(&s->lock);
  if (!c) {
    used_move_base(p, -(int64_t)req);
    spill(p, s, 0, &e, 1, true);
  }
  if (evict)
    spill(p, s, 0, &evicted, 1, true);
  maybe_reap(p);
  return TP_SUCCESS;
}

tp_error_t tp__pool_live_size(tp__pool *p, void *ptr, size_t *size) {
  uintptr_t addr = (uintptr_t)ptr;
  TP_RETURN_IF(addr % TP_GRANULE, TP_ERROR_INVALID_VALUE);
  _Atomic uintptr_t *entry = tp__space_entry(p, addr, false);
  uintptr_t v = entry ? atomic_load_explicit(entry, memory_order_acquire) : 0;
  TP_RETURN_IF(!v, TP_ERROR_INVALID_VALUE);
  if (!(v & 1u)) {
    *size = atomic_load(&((tp__block *)v)->req);
    return TP_SUCCESS;
  }
  tp__slab *slab = (tp__slab *)(v & ~(uintptr_t)1);
  int64_t idx = tp__slab_index(slab, addr);
  TP_RETURN_IF(idx < 0, TP_ERROR_INVALID_VALUE);
  *size = atomic_load(&slab->req[idx]);
  TP_RETURN_IF(*size == 0, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

tp_error_t tp__pool_free(void *ptr, tp__stream *s) {
  uintptr_t addr = (uintptr_t)ptr;
  tp__pool *p = tp__registry_find(addr);
  TP_RETURN_IF(!p || addr % TP_GRANULE, TP_ERROR_INVALID_VALUE);
  /* Another process's memory: the importer only gives up its hold. */
  if (TP_UNLIKELY(p->imported))
    return tp__ipc_import_free(p, addr, s);
  /* An exported allocation that an importer still holds stays out of
   * reuse; ipc.c frees it with this free's tag once the importer lets go. */
  if (TP_UNLIKELY(atomic_load_explicit(&p->ipc_watch, memory_order_relaxed))) {
    bool kept = false;
    TP_FORWARD(tp__ipc_on_free(p, addr, s, &kept));
    if (kept)
      return TP_SUCCESS;
  }
  _Atomic uintptr_t *entry = tp__space_entry(p, addr, false);
  TP_RETURN_IF(!entry, TP_ERROR_INVALID_VALUE);
  uintptr_t v = atomic_load_explicit(entry, memory_order_acquire);
  TP_RETURN_IF(!v, TP_ERROR_INVALID_VALUE);
  if (v & 1u)
    return free_small(p, (tp__slab *)(v & ~(uintptr_t)1), addr, s);
  return free_large(p, (tp__block *)v, entry, s);
}

tp_error_t tp__pool_free_tagged(tp__pool *p, void *ptr, tp__tag tag) {
  uintptr_t addr = (uintptr_t)ptr;
  _Atomic uintptr_t *entry = tp__space_entry(p, addr, false);
  uintptr_t v = entry ? atomic_load_explicit(entry, memory_order_acquire) : 0;
  tp_error_t err = TP_ERROR_INVALID_VALUE;
  tp__centry e = {addr, NULL, tag.epoch, tag.lseq};
  if (v & 1u) {
    tp__slab *slab = (tp__slab *)(v & ~(uintptr_t)1);
    int64_t idx = tp__slab_index(slab, addr);
    uint32_t req = idx < 0 ? 0
                           : atomic_exchange_explicit(&slab->req[idx], 0,
                                                      memory_order_acq_rel);
    if (req) {
      used_move_base(p, -(int64_t)req);
      e.owner = slab;
      spill(p, tag.stream, slab->cls, &e, 1, false);
      err = TP_SUCCESS;
    }
  } else if (v &&
             atomic_compare_exchange_strong_explicit(
                 entry, &v, 0, memory_order_acq_rel, memory_order_relaxed)) {
    tp__block *b = (tp__block *)v;
    used_move_base(p, -(int64_t)atomic_load(&b->req));
    atomic_store_explicit(&b->state, TP_BLOCK_CACHED, memory_order_relaxed);
    e.owner = b;
    spill(p, tag.stream, 0, &e, 1, true);
    err = TP_SUCCESS;
  }
  tp__stream_unref(tag.stream);
  return err;
}

/* ---- synchronize, trim ----------------------------------------------------
 */

static tp_error_t settle_and_release(tp__pool *p, uint64_t keep) {
  tp__slab_settle(p, false, true);
  tp__fit_settle(p, false);
  tp_error_t err = tp__space_release(p, keep);
  TP_DEBUG_WALK(p);
  return err;
}

void tp__pool_after_sync(tp__stream *s) {
  pthread_mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools; i++) {
    tp__pool *p = pools[i];
    pthread_mutex_lock(&p->lock);
    if (!p->torn_down) {
      flush_one(p, s);
      /* Best effort: what stays reserved is released at a later try. */
      (void)settle_and_release(p, atomic_load(&p->release_threshold));
    }
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&pools_lock);
  reap(false);
  tp__ipc_settle();
}

tp_error_t tp__pool_trim(tp__pool *p, uint64_t keep) {
  if (p->imported) {
    tp__ipc_import_trim(p);
    return TP_SUCCESS;
  }
  pthread_mutex_lock(&p->lock);
  tp__pool_flush_all(p);
  tp_error_t err = settle_and_release(p, keep);
  pthread_mutex_unlock(&p->lock);
  return err;
}

void tp__stream_flush_caches(tp__stream *s, bool drop) {
  pthread_mutex_lock(&pools_lock);
  for (uint32_t i = 0; i < npools; i++) {
    tp__pool *p = pools[i];
    pthread_mutex_lock(&p->lock);
    tp__cache *c = flush_one(p, s);
    if (c && drop)
      cache_free(p, c);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&pools_lock);
}

/* ---- access -----------------------------------------------------------------
 */

tp_error_t tp__pool_get_access(tp__pool *p, const tp_location_t *loc,
                               tp_access_flags_t *flags) {
  bool host_pool = p->props.location.type == TP_LOCATION_HOST ||
                   p->props.location.type == TP_LOCATION_HOST_NUMA;
  switch (loc->type) {
  case TP_LOCATION_DEVICE:
    pthread_mutex_lock(&p->lock);
    *flags = p->access[loc->id];
    pthread_mutex_unlock(&p->lock);
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
  if (p->imported) /* its mappings are ipc.c's, under a lock of its own */
    return tp__ipc_import_set_access(p, list, n);
  pthread_mutex_lock(&p->lock);
  tp_error_t err = p->torn_down ? TP_SUCCESS : tp__space_set_access(p, list, n);
  for (size_t i = 0; err == TP_SUCCESS && i < n; i++)
    p->access[list[i].location.id] = list[i].flags;
  pthread_mutex_unlock(&p->lock);
  return err;
}

/* ---- attributes ---------------------------------------------------------- */

static _Atomic int *int_attr(tp__pool *p, tp_pool_attr_t attr) {
  switch (attr) {
  case TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: return &p->follow_events;
  case TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: return &p->opportunistic;
  case TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return &p->internal_deps;
  case TP_POOL_ATTR_OOM_WAIT: return &p->oom_wait;
  default: return NULL;
  }
}

tp_error_t tp__pool_get_attr(tp__pool *p, tp_pool_attr_t attr, void *value) {
  uint64_t *u = value;
  int *i = value;
  switch (attr) {
  case TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
  case TP_POOL_ATTR_OOM_WAIT: *i = atomic_load(int_attr(p, attr)); break;
  case TP_POOL_ATTR_RELEASE_THRESHOLD:
    *u = atomic_load(&p->release_threshold);
    break;
  case TP_POOL_ATTR_RESERVED_MEM_CURRENT: *u = atomic_load(&p->reserved); break;
  case TP_POOL_ATTR_RESERVED_MEM_HIGH:
    *u = atomic_load(&p->reserved_high);
    break;
  case TP_POOL_ATTR_USED_MEM_CURRENT:
    pthread_mutex_lock(&p->lock);
    *u = tp__pool_used(p);
    pthread_mutex_unlock(&p->lock);
    break;
  case TP_POOL_ATTR_USED_MEM_HIGH: *u = atomic_load(&p->used_high); break;
  case TP_POOL_ATTR_ALLOCATION_TYPE: *i = (int)p->props.alloc_type; break;
  case TP_POOL_ATTR_EXPORT_HANDLE_TYPES: *i = (int)p->props.handle_types; break;
  case TP_POOL_ATTR_LOCATION_ID: *i = p->props.location.id; break;
  case TP_POOL_ATTR_LOCATION_TYPE: *i = (int)p->props.location.type; break;
  case TP_POOL_ATTR_LOCALITY_DOMAIN_ID:
    *i = p->props.location.locality_domain_id;
    break;
  case TP_POOL_ATTR_MAX_POOL_SIZE: *u = p->props.max_size; break;
  case TP_POOL_ATTR_HW_DECOMPRESS_ENABLED: *i = 0; break;
  case TP_POOL_ATTR_CHUNK_MAPS: *u = atomic_load(&p->maps); break;
  case TP_POOL_ATTR_CHUNK_UNMAPS: *u = atomic_load(&p->unmaps); break;
  case TP_POOL_ATTR_CHUNK_SIZE: *u = p->gran; break;
  default: return TP_ERROR_INVALID_VALUE;
  }
  return TP_SUCCESS;
}

tp_error_t tp__pool_set_attr(tp__pool *p, tp_pool_attr_t attr, void *value) {
  uint64_t u = 0;
  switch (attr) {
  case TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
  case TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
  case TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
  case TP_POOL_ATTR_OOM_WAIT:
    atomic_store(int_attr(p, attr), *(int *)value != 0);
    return TP_SUCCESS;
  case TP_POOL_ATTR_RELEASE_THRESHOLD:
    atomic_store(&p->release_threshold, *(uint64_t *)value);
    return TP_SUCCESS;
  case TP_POOL_ATTR_RESERVED_MEM_HIGH:
    memcpy(&u, value, sizeof u);
    TP_RETURN_IF(u != 0, TP_ERROR_INVALID_VALUE);
    atomic_store(&p->reserved_high, atomic_load(&p->reserved));
    return TP_SUCCESS;
  case TP_POOL_ATTR_USED_MEM_HIGH:
    memcpy(&u, value, sizeof u);
    TP_RETURN_IF(u != 0, TP_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->used_high, tp__pool_used(p));
    pthread_mutex_unlock(&p->lock);
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}
