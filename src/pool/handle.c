/* The public handles of pools: slots of a table that is never freed, so that
 * any value a caller passes can be checked without being dereferenced, and a
 * destroyed pool's handle is still recognised as such. */
#include "pool/handle.h"

#include "common/lock.h"
#include "common/slots.h"

static tp__slots table = TP_SLOTS_INIT(struct tp_pool_opaque);
static tp__mutex lock = TP_MUTEX_INIT(TP_RANK_HANDLES);

/* Once every slot was used, a destroyed pool's is given to a new one: 4M
 * handles later. */
static bool dead(const void *slot) {
  const struct tp_pool_opaque *h = slot;
  return atomic_load_explicit(&h->state, memory_order_acquire) == TP_POOL_DEAD;
}

tp_pool_t tp__handle_new(void) {
  tp__mutex_lock(&lock);
  struct tp_pool_opaque *h = tp__slots_take(&table, dead);
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
  return tp__slots_known(&table, h);
}

tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out) {
  TP_RETURN_IF(!tp__handle_known(handle), TP_ERROR_INVALID_VALUE);
  return tp__pool_get_known(handle, out);
}
