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
#include "common/fence.h"

/* Outermost first. */
typedef enum tp__rank {
  TP_RANK_NONE = 0,     /* not ranked (zeroed memory before its init) */
  TP_RANK_SLOTS,        /* api: the default and current pools */
  TP_RANK_POOLS,        /* the list of live pools */
  TP_RANK_POOL,         /* a pool: its rooms and their lists */
  TP_RANK_LEGACY,       /* a device's legacy-stream sequence */
  TP_RANK_STREAM_TABLE, /* the registry of streams */
  TP_RANK_EVENT_TABLE,  /* the registry of events */
  TP_RANK_EVENT_ORDER,  /* an event's records, against its waits */
  TP_RANK_STREAM,       /* a stream: epochs, markers, clock, caches */
  TP_RANK_EVENT,        /* an event's clock */
  TP_RANK_DEAD_DONE,    /* completions of destroyed streams (order.c) */
  TP_RANK_HANDLES,      /* the table of pool handles */
  TP_RANK_ADDRESSES,    /* the address-to-pool registry */
  TP_RANK_LIMBO,        /* the guard's retired objects */
  TP_RANK_TABLES        /* the stock of zeroed granule tables (space.c) */
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

/* A spin lock biased to the first thread that takes it twice: that thread
 * then enters with plain stores and a light fence, no read-modify-write.
 * Another thread that takes the lock revokes the bias for good (one heavy
 * fence) and waits for the owner to be out; from then on it is a plain
 * spin lock. A stream's lock, taken on every allocation and free, is one:
 * most streams are used by one thread at a time, or by one thread
 * only. Without membarrier no bias is given, since the light fence would
 * cost as much as the lock. */
typedef struct tp__blspin {
  tp__spin spin;               /* taken by all but the owner in bias */
  _Atomic(const void *) owner; /* tp__self() of the owner, set once */
  atomic_int busy;             /* the owner is inside without `spin` */
  atomic_int revoked;          /* the bias was given up */
} tp__blspin;
static inline void tp__blspin_init(tp__blspin *b, tp__rank rank) {
  tp__spin_init(&b->spin, rank);
  atomic_init(&b->owner, NULL);
  atomic_init(&b->busy, 0);
  atomic_init(&b->revoked, 0);
}
void tp__blspin_lock_slow(tp__blspin *b);
/* Enters in bias, where the caller owns the lock and the bias stands; false,
 * with nothing changed, otherwise. Left with tp__blspin_leave(b, true).
 * Bias is given only where the light fence is free, and the owner took it
 * itself after seeing so: an owner need not ask again, and fences with the
 * compiler barrier alone. */
static inline bool tp__blspin_try_bias(tp__blspin *b) {
  if (TP_UNLIKELY(atomic_load_explicit(&b->owner, memory_order_relaxed) !=
                  tp__self()))
    return false;
  atomic_store_explicit(&b->busy, 1, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
  if (TP_UNLIKELY(atomic_load_explicit(&b->revoked, memory_order_relaxed))) {
    atomic_store_explicit(&b->busy, 0, memory_order_release);
    return false;
  }
  tp__rank_enter(b, b->spin.rank);
  return true;
}
/* Takes the lock; true when the caller entered in bias, which
 * tp__blspin_leave is told so that it need not find it out again (the
 * allocation fast path's pair). */
static inline bool tp__blspin_enter(tp__blspin *b) {
  if (TP_LIKELY(tp__blspin_try_bias(b)))
    return true;
  tp__blspin_lock_slow(b);
  return false;
}
static inline void tp__blspin_leave(tp__blspin *b, bool biased) {
  if (TP_LIKELY(biased)) {
    tp__rank_leave(b, b->spin.rank);
    atomic_store_explicit(&b->busy, 0, memory_order_release);
    return;
  }
  tp__spin_unlock(&b->spin);
}
static inline void tp__blspin_lock(tp__blspin *b) {
  (void)tp__blspin_enter(b);
}
/* Only the owner ever sets `busy`, and it is set while the owner is inside
 * in bias; any other holder took `spin`. */
static inline void tp__blspin_unlock(tp__blspin *b) {
  tp__blspin_leave(b, atomic_load_explicit(&b->owner, memory_order_relaxed) ==
                              tp__self() &&
                          atomic_load_explicit(&b->busy, memory_order_relaxed));
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
