/* The slow half of the spin lock, and the debug half of lock.h: each
 * thread's stack of held locks, checked against the rank order at every
 * acquisition. */
#include "common/lock.h"

#include <sched.h>

/* One round of waiting for a flag another thread clears: a pause, and a
 * yield after a while, so that an oversubscribed machine makes progress. */
static void backoff(unsigned spins) {
  if (spins >= 64)
    sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  else
    __builtin_ia32_pause();
#endif
}

void tp__spin_lock_slow(tp__spin *s) {
  for (unsigned spins = 0;; spins++) {
    if (!atomic_load_explicit(&s->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&s->held, 1, memory_order_acquire))
      return;
    backoff(spins);
  }
}

/* Takes the spin lock; then claims the bias when nobody has it (it serves
 * from the next acquisition on), or revokes another thread's and waits
 * until that thread is out. The wait is also needed after a revocation:
 * an owner that read the bias before it was revoked sets `busy` for a
 * moment before it sees `revoked` and backs off. */
void tp__blspin_lock_slow(tp__blspin *b) {
  tp__spin_lock(&b->spin);
  const void *owner = atomic_load_explicit(&b->owner, memory_order_relaxed);
  if (owner == tp__self())
    return;
  if (!owner) {
    tp__fence_init();
    if (tp__hot.fence_expedited &&
        !atomic_load_explicit(&b->revoked, memory_order_relaxed))
      atomic_store_explicit(&b->owner, tp__self(), memory_order_relaxed);
    return;
  }
  if (!atomic_load_explicit(&b->revoked, memory_order_relaxed)) {
    atomic_store_explicit(&b->revoked, 1, memory_order_relaxed);
    tp__fence_heavy();
  }
  for (unsigned spins = 0; atomic_load_explicit(&b->busy, memory_order_acquire);
       spins++)
    backoff(spins);
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
/* The locks the thread holds, one per rank at most (ranks only rise), kept
 * small since it is static TLS (see TP_TLS): each lock by the low half of
 * its address, which tells a lock left at a rank from the one taken there
 * all but certainly. */
#define NRANKS (TP_RANK_TABLES + 1)
static _Thread_local struct {
  uint32_t lock[NRANKS];
  uint16_t mask; /* the ranks held */
} held;

static uint32_t lock_tag(const void *lock) {
  return (uint32_t)((uintptr_t)lock >> 3);
}

const void *tp__thread_mark(void) {
  return tp__self();
}

void tp__rank_enter(const void *lock, tp__rank rank) {
  if (rank == TP_RANK_NONE)
    return;
  /* Taking a lock of a rank not above every held one can deadlock. */
  TP_CHECK(rank < NRANKS);
  TP_CHECK((held.mask >> rank) == 0);
  held.lock[rank] = lock_tag(lock);
  held.mask |= (uint16_t)(1u << rank);
}

void tp__rank_leave(const void *lock, tp__rank rank) {
  if (rank == TP_RANK_NONE)
    return;
  TP_CHECK(((held.mask >> rank) & 1) && held.lock[rank] == lock_tag(lock));
  held.lock[rank] = 0;
  held.mask &= (uint16_t) ~(1u << rank);
}
#endif
