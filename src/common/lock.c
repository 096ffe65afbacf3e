/* The slow half of the spin lock, and the debug half of lock.h: each
 * thread's stack of held locks, checked against the rank order at every
 * acquisition. */
#include "common/lock.h"

#include <sched.h>

void tp__spin_lock_slow(tp__spin *s) {
  for (unsigned spins = 0;; spins++) {
    if (!atomic_load_explicit(&s->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&s->held, 1, memory_order_acquire))
      return;
    if (spins >= 64)
      sched_yield();
#if defined(__x86_64__) || defined(__i386__)
    else
      __builtin_ia32_pause();
#endif
  }
}

void tp__mutex_init(tp__mutex *l, tp__rank rank) {
  pthread_mutex_init(&l->m, NULL);
  l->rank = rank;
  atomic_init(&l->owner, NULL);
}

void tp__mutex_destroy(tp__mutex *l) {
  pthread_mutex_destroy(&l->m);
}

#ifdef TP_DEBUG
#define HELD_MAX 16

static _Thread_local struct {
  const void *lock[HELD_MAX];
  tp__rank rank[HELD_MAX];
  int n;
} held;

static _Thread_local char mark;

const void *tp__thread_mark(void) {
  return &mark;
}

void tp__rank_enter(const void *lock, tp__rank rank) {
  if (rank == TP_RANK_NONE)
    return;
  for (int i = 0; i < held.n; i++) {
    /* Taking a lock of a rank not above every held one can deadlock. */
    TP_CHECK(held.lock[i] != lock);
    TP_CHECK(held.rank[i] < rank);
  }
  TP_CHECK(held.n < HELD_MAX);
  held.lock[held.n] = lock;
  held.rank[held.n] = rank;
  held.n++;
}

void tp__rank_leave(const void *lock, tp__rank rank) {
  if (rank == TP_RANK_NONE)
    return;
  for (int i = held.n - 1; i >= 0; i--) {
    if (held.lock[i] != lock)
      continue;
    for (int j = i; j + 1 < held.n; j++) {
      held.lock[j] = held.lock[j + 1];
      held.rank[j] = held.rank[j + 1];
    }
    held.n--;
    return;
  }
  TP_CHECK(!"a lock released by a thread that does not hold it");
}
#endif
