/* The default and current pools of each location and allocation type
 * (pools.c), as the allocator's entry points (alloc.c) read them: the current
 * pool is one atomic load. Slots: device d pinned (2d) and managed (2d+1),
 * then host, host NUMA node 0, and managed with no location. */
#ifndef TP_API_POOLS_H
#define TP_API_POOLS_H

#include "api/api.h"

enum {
  TP_SLOT_HOST = 2 * TP_MAX_DEVICES,
  TP_SLOT_HOST_NUMA,
  TP_SLOT_MANAGED_NONE,
  TP_POOL_SLOTS
};
extern _Atomic(tp_pool_t) tp__current_pools[TP_POOL_SLOTS];

/* The slot's default pool, made on first use. */
tp_error_t tp__default_pool_of(int slot, tp_pool_t *out);

/* The slot's current pool; NULL until its default pool is made or a pool
 * is made current. */
static inline tp_pool_t tp__current_pool_made(int slot) {
  return atomic_load_explicit(&tp__current_pools[slot], memory_order_acquire);
}

static inline tp_error_t tp__current_pool_of(int slot, tp_pool_t *out) {
  tp_pool_t p = tp__current_pool_made(slot);
  if (TP_LIKELY(p != NULL)) {
    *out = p;
    return TP_SUCCESS;
  }
  /* Made now, the default is current unless a pool was made current
   * meanwhile, which is then the answer. */
  TP_FORWARD(tp__default_pool_of(slot, out));
  p = tp__current_pool_made(slot);
  if (p)
    *out = p;
  return TP_SUCCESS;
}

/* A destroyed pool that was current for its location stops being so. */
void tp__current_pools_forget(tp_pool_t pool);

#endif /* TP_API_POOLS_H */
