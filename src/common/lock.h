/* The library's locks and the one order in which a thread may take them.
 * Each lock has a rank; a thread holding locks takes only locks of a higher
 * rank, so that no two threads can wait on each other. Debug builds check
 * the order and the owner at every acquisition (TP_CHECK); release builds
 * pay nothing. Platform locks are the platform's own and sit below all of
 * these: core code may call the platform with any lock held. */
#ifndef TP_LOCK_H
#define TP_LOCK_H

#include <pthread.h>

#include "common/common.h"

/* Outermost first. */
typedef enum tp__rank {
  TP_RANK_NONE = 0,     /* not ranked (zeroed memory before its init) */
  TP_RANK_SLOTS,        /* api: the default and current pools */
  TP_RANK_POOLS,        /* the list of live pools */
  TP_RANK_POOL,         /* a pool: its rooms and their lists */
  TP_RANK_LEGACY,       /* a device's legacy-stream sequence */
  TP_RANK_STREAM_TABLE, /* the registry of streams */
  TP_RANK_EVENT_TABLE,  /* the registry of events */
  TP_RANK_STREAM,       /* a stream: epochs, markers, clock, caches */
  TP_RANK_EVENT,        /* an event's clock */
  TP_RANK_HANDLES,      /* the table of pool handles */
  TP_RANK_ADDRESSES,    /* the address-to-pool registry */
  TP_RANK_LIMBO         /* the guard's retired objects */
} tp__rank;

typedef struct tp__mutex {
  pthread_mutex_t m;
  tp__rank rank;
  _Atomic(const void *) owner; /* debug builds: the holding thread's mark */
} tp__mutex;
#define TP_MUTEX_INIT(rank_)                                                   \
  { PTHREAD_MUTEX_INITIALIZER, rank_, NULL }

void tp__mutex_init(tp__mutex *l, tp__rank rank);
void tp__mutex_destroy(tp__mutex *l);

#ifdef TP_DEBUG
/* The calling thread's view of the locks it holds. */
void tp__rank_enter(const void *lock, tp__rank rank);
void tp__rank_leave(const void *lock, tp__rank rank);
const void *tp__thread_mark(void);
#else
#define tp__rank_enter(lock, rank) ((void)0)
#define tp__rank_leave(lock, rank) ((void)0)
#endif

static inline void tp__mutex_lock(tp__mutex *l) {
  tp__rank_enter(l, l->rank);
  pthread_mutex_lock(&l->m);
#ifdef TP_DEBUG
  atomic_store_explicit(&l->owner, tp__thread_mark(), memory_order_relaxed);
#endif
}

static inline void tp__mutex_unlock(tp__mutex *l) {
#ifdef TP_DEBUG
  TP_CHECK(atomic_load_explicit(&l->owner, memory_order_relaxed) ==
           tp__thread_mark());
  atomic_store_explicit(&l->owner, NULL, memory_order_relaxed);
#endif
  pthread_mutex_unlock(&l->m);
  tp__rank_leave(l, l->rank);
}

/* A test-and-test-and-set lock for short critical sections on the fast path
 * (a pthread mutex costs twice as much uncontended). It yields after a short
 * spin so that an oversubscribed machine still makes progress. */
typedef struct tp__spin {
  atomic_int held;
  tp__rank rank;
} tp__spin;
static inline void tp__spin_init(tp__spin *s, tp__rank rank) {
  atomic_init(&s->held, 0);
  s->rank = rank;
}
void tp__spin_lock_slow(tp__spin *s);
static inline void tp__spin_lock(tp__spin *s) {
  tp__rank_enter(s, s->rank);
  if (TP_LIKELY(!atomic_exchange_explicit(&s->held, 1, memory_order_acquire)))
    return;
  tp__spin_lock_slow(s);
}
static inline void tp__spin_unlock(tp__spin *s) {
  atomic_store_explicit(&s->held, 0, memory_order_release);
  tp__rank_leave(s, s->rank);
}

/* Checks, in debug builds, that the calling thread holds `l`. */
#ifdef TP_DEBUG
#define TP_CHECK_HELD(l)                                                       \
  TP_CHECK(atomic_load_explicit(&(l)->owner, memory_order_relaxed) ==          \
           tp__thread_mark())
#else
#define TP_CHECK_HELD(l) ((void)0)
#endif

#endif /* TP_LOCK_H */
