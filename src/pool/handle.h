/* The public handles of pools (handle.c): slots of a table that outlives
 * the pools, so that a destroyed pool's handle is recognised and a wild one
 * refused, and the lock-free lookup from a handle to its live pool. */
#ifndef TP_HANDLE_H
#define TP_HANDLE_H

#include "common/common.h"

typedef struct tp__pool tp__pool;

enum {
  TP_POOL_UNUSED = 0,
  TP_POOL_MADE = 1, /* handed out, its pool not finished yet */
  TP_POOL_LIVE = 2,
  TP_POOL_DESTROYING = 3, /* destroyed, waiting for its last frees */
  TP_POOL_DEAD = 4
};
struct tp_pool_opaque {
  _Atomic int state;
  _Atomic(tp__pool *) pool;
  struct tp_pool_opaque *next_dead; /* handle.c's queue */
};

/* A fresh handle in state MADE; NULL when memory or slots run out. */
tp_pool_t tp__handle_new(void);
void tp__handle_publish(tp_pool_t h, tp__pool *p);
/* The handle answers INVALID_VALUE from now on. */
void tp__handle_bury(tp_pool_t h);
/* Slots of the table used so far (fresh ones handed out); for tests. */
uint64_t tp__handles_taken(void);
/* Whether `h` is a slot of the table, whatever its state. */
bool tp__handle_known(tp_pool_t h);
/* The live pool of a handle; INVALID_VALUE for anything else. The pool
 * stays readable while the caller is inside the guard (common/guard.h). */
tp_error_t tp__pool_get(tp_pool_t handle, tp__pool **out);
/* The same for a handle known to be a slot of the table (one the library
 * stored itself, such as a current pool): the state alone decides. */
static inline tp_error_t tp__pool_get_known(tp_pool_t handle, tp__pool **out) {
  tp__pool *p = NULL;
  if (TP_LIKELY(atomic_load_explicit(&handle->state, memory_order_acquire) ==
                TP_POOL_LIVE))
    p = atomic_load_explicit(&handle->pool, memory_order_relaxed);
  *out = p;
  return p ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
}

#endif /* TP_HANDLE_H */
