/* The public handles of pools: slots of a table that is never freed, so that
 * any value a caller passes can be checked without being dereferenced, and a
 * destroyed pool's handle is still recognised as such. */
#include "pool/handle.h"

#include "common/lock.h"

/* 4096 slots a chunk, chunks made as needed: 4M handles before a slot of a
 * destroyed pool is given to a new one. */
#define CHUNK_SLOTS 4096u
#define MAX_CHUNKS 1024u

static struct tp_pool_opaque *_Atomic chunks[MAX_CHUNKS];
static _Atomic uint32_t nchunks;
static tp__mutex lock = TP_MUTEX_INIT(TP_RANK_HANDLES);
static uint64_t next_slot; /* under lock: slots handed out so far */

static struct tp_pool_opaque *slot_at(uint64_t i) {
  return &atomic_load_explicit(&chunks[i / CHUNK_SLOTS],
                               memory_order_relaxed)[i % CHUNK_SLOTS];
}

/* A slot never used, else (once all were) the oldest dead one; lock held. */
static struct tp_pool_opaque *slot_take(void) {
  uint64_t total = (uint64_t)MAX_CHUNKS * CHUNK_SLOTS;
  if (next_slot < total) {
    uint32_t c = (uint32_t)(next_slot / CHUNK_SLOTS);
    if (c == atomic_load_explicit(&nchunks, memory_order_relaxed)) {
      struct tp_pool_opaque *v = calloc(CHUNK_SLOTS, sizeof *v);
      if (!v)
        return NULL;
      atomic_store_explicit(&chunks[c], v, memory_order_relaxed);
      atomic_store_explicit(&nchunks, c + 1, memory_order_release);
    }
    return slot_at(next_slot++);
  }
  for (uint64_t k = 0; k < total; k++, next_slot++) {
    struct tp_pool_opaque *h = slot_at(next_slot % total);
    if (atomic_load_explicit(&h->state, memory_order_acquire) == TP_POOL_DEAD) {
      next_slot++;
      return h;
    }
  }
  return NULL;
}

tp_pool_t tp__handle_new(void) {
  tp__mutex_lock(&lock);
  struct tp_pool_opaque *h = slot_take();
  if (h) {
    atomic_store_explicit(&h->pool, NULL, memory_order_relaxed);
    atomic_store_explicit(&h->state, TP_POOL_MADE, memory_order_relaxed);
  }
  tp__mutex_unlock(&lock);
  return h;
}

void tp__handle_publish(tp_pool_t h, tp__pool *p) {
  atomic_store_explicit(&h->pool, p, memory_order_relaxed);
  atomic_store_explicit(&h->state, TP_POOL_LIVE, memory_order_release);
}

void tp__handle_bury(tp_pool_t h) {
  atomic_store_explicit(&h->pool, NULL, memory_order_relaxed);
  atomic_store_explicit(&h->state, TP_POOL_DEAD, memory_order_release);
}

bool tp__handle_known(tp_pool_t h) {
  uint32_t n = atomic_load_explicit(&nchunks, memory_order_acquire);
  uintptr_t a = (uintptr_t)h;
  for (uint32_t i = 0; i < n; i++) {
    uintptr_t c =
        (uintptr_t)atomic_load_explicit(&chunks[i], memory_order_relaxed);
    if (a >= c && a - c < CHUNK_SLOTS * sizeof *h && (a - c) % sizeof *h == 0)
      return true;
  }
  return false;
}

tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out) {
  TP_RETURN_IF(!tp__handle_known(handle), TP_ERROR_INVALID_VALUE);
  return tp__pool_get_known(handle, out);
}
