/* Asymmetric fences: a light side that costs a compiler barrier where the
 * kernel offers membarrier (a full fence otherwise), run often, and a heavy
 * side (the system call) run rarely, which orders the light sides of every
 * running thread. The epoch guard and the stream locks' bias use them. */
#ifndef TP_FENCE_H
#define TP_FENCE_H

#include "common/hot.h"

/* tp__hot.fence_expedited: whether the heavy side is membarrier (so the
 * light side is free); false until tp__fence_init ran, and where the kernel
 * refuses it. */
void tp__fence_init(void);

static inline void tp__fence_light(void) {
  if (TP_LIKELY(tp__hot.fence_expedited))
    atomic_signal_fence(memory_order_seq_cst);
  else
    atomic_thread_fence(memory_order_seq_cst);
}
void tp__fence_heavy(void);

/* A value unique to the calling thread among live threads: the address of
 * a thread-local byte. */
extern TP_TLS char tp__self_mark;
static inline const void *tp__self(void) {
  return &tp__self_mark;
}

#endif /* TP_FENCE_H */
