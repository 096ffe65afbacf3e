/* The public handles of pools: slots of a table that is never freed, so that
 * any value a caller passes can be checked without being dereferenced, and a
 * destroyed pool's handle is still recognised as such. */
#include "pool/handle.h"

#include "common/lock.h"
#include "common/slots.h"

static tp__slots table = TP_SLOTS_INIT(struct tp_pool_opaque);
static tp__mutex lock = TP_MUTEX_INIT(TP_RANK_HANDLES);

/* Buried handles, oldest first. Once every slot was used, a new pool takes
 * the slot of the pool destroyed longest ago, so that a destroyed pool's
 * handle is recognised for as long as the table allows (the header's
 * promise). Under `lock`. */
static struct tp_pool_opaque *dead_first, *dead_last;

tp_pool_t tp__handle_new(void) {
  tp__mutex_lock(&lock);
  struct tp_pool_opaque *h = tp__slots_take(&table);
  /* Where a new chunk of slots could not be allocated, the pool is not
   * made: a dead slot taken then would come back before the table's
   * promise allows. */
  if (!h && dead_first && tp__slots_full(&table)) {
    h = dead_first;
    dead_first = h->next_dead;
    if (!dead_first)
      dead_last = NULL;
  }
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
  int was =
      atomic_exchange_explicit(&h->state, TP_POOL_DEAD, memory_order_release);
  TP_CHECK(was != TP_POOL_DEAD);
  if (was == TP_POOL_DEAD)
    return;
  tp__mutex_lock(&lock);
  h->next_dead = NULL;
  if (dead_last)
    dead_last->next_dead = h;
  else
    dead_first = h;
  dead_last = h;
  tp__mutex_unlock(&lock);
}

uint64_t tp__handles_taken(void) {
  tp__mutex_lock(&lock);
  uint64_t n = table.taken;
  tp__mutex_unlock(&lock);
  return n;
}

bool tp__handle_known(tp_pool_t h) {
  return tp__slots_known(&table, h);
}

tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out) {
  TP_RETURN_IF(!tp__handle_known(handle), TP_ERROR_INVALID_VALUE);
  return tp__pool_get_known(handle, out);
}
