/* The epoch-based reclamation of guard.h: one record per thread that says
 * since which epoch it has been inside the library, a list of retired
 * objects with the epoch of their retirement, and the reclaimer that frees
 * those older than every thread inside. */
#include "common/guard.h"

#include "common/fence.h"
#include "common/lock.h"

#include <pthread.h>

typedef tp__guard_rec rec;

typedef struct retired {
  void *obj;
  void (*fn)(void *);
  uint64_t epoch;
  struct retired *next;
} retired;

static _Atomic(rec *) recs;
static tp__mutex limbo_lock = TP_MUTEX_INIT(TP_RANK_LIMBO);
static retired *limbo;
/* How many wait in limbo, and the epoch of the newest: read by every
 * outermost exit, written rarely. */
static _Atomic uint64_t newest_retired;

/* With membarrier, the reclaimer forces a full barrier on every running
 * thread, so that a reader's store of its epoch needs no fence of its own
 * to be seen before the reader's loads of shared pointers. Without it, the
 * reader fences. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t key;

TP_TLS tp__guard_tls tp__guard_me;

/* As the thread ends. The thread forgets the record first: a call from
 * another library's thread-exit destructor that runs after this one takes
 * a record anew (which this destructor then gives back in its next round)
 * rather than publish into one another thread may have taken meanwhile. */
static void release_rec(void *r) {
  if (tp__guard_me.rec == r)
    tp__guard_me.rec = NULL;
  atomic_store_explicit(&((rec *)r)->taken, false, memory_order_release);
}

static void init_once(void) {
  (void)pthread_key_create(&key, release_rec);
  tp__fence_init();
}

/* A record for the calling thread: a free one from a thread that ended, or
 * a new one. Records are never freed, so the reclaimer's walk is safe.
 * Returns NULL only when memory is short. */
static rec *acquire_rec(void) {
  pthread_once(&once, init_once);
  rec *r = atomic_load_explicit(&recs, memory_order_acquire);
  for (; r; r = r->next) {
    bool expect = false;
    if (!atomic_load_explicit(&r->taken, memory_order_relaxed) &&
        atomic_compare_exchange_strong(&r->taken, &expect, true))
      break;
  }
  if (!r) {
    r = aligned_alloc(64, sizeof *r);
    if (!r)
      return NULL;
    atomic_init(&r->epoch, 0);
    atomic_init(&r->taken, true);
    r->next = atomic_load_explicit(&recs, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(
        &recs, &r->next, r, memory_order_release, memory_order_relaxed)) {
    }
  }
  (void)pthread_setspecific(key, r);
  return r;
}

/* Threads without a record (memory was short) count here instead; the
 * reclaimer frees nothing while any is inside. */
static _Atomic uint64_t unrecorded;

/* The outermost entry of a thread without a record yet. */
void tp__guard_enter_slow(tp__guard_tls *g) {
  if (!(g->rec = acquire_rec())) {
    atomic_fetch_add(&unrecorded, 1);
    return;
  }
  tp__guard_publish(g->rec);
}

/* The outermost exit of a thread without a record, or of one while objects
 * wait in limbo: a thread that was inside when an object was retired (the
 * retiring thread among them) may have been what held it back, so leaving
 * is the moment to look again. Threads that entered later need not. */
void tp__guard_exit_slow(tp__guard_tls *g, uint64_t entered) {
  if (!g->rec) {
    atomic_fetch_sub(&unrecorded, 1);
    return;
  }
  if (entered < atomic_load_explicit(&newest_retired, memory_order_relaxed))
    tp__guard_collect();
}

/* The oldest epoch a thread inside the library entered at (UINT64_MAX when
 * none is inside), after every thread's store of its epoch is visible. */
static uint64_t oldest_inside(void) {
  tp__fence_heavy();
  if (atomic_load(&unrecorded))
    return 0;
  uint64_t oldest = UINT64_MAX;
  for (rec *r = atomic_load_explicit(&recs, memory_order_acquire); r;
       r = r->next) {
    uint64_t e = atomic_load_explicit(&r->epoch, memory_order_acquire);
    if (e && e < oldest)
      oldest = e;
  }
  return oldest;
}

void tp__guard_collect(void) {
  tp__mutex_lock(&limbo_lock);
  if (!limbo) {
    tp__mutex_unlock(&limbo_lock);
    return;
  }
  uint64_t oldest = oldest_inside();
  retired *done = NULL;
  for (retired **pp = &limbo; *pp;) {
    retired *t = *pp;
    if (t->epoch > oldest) {
      pp = &t->next;
      continue;
    }
    *pp = t->next;
    t->next = done;
    done = t;
    atomic_fetch_sub_explicit(&tp__hot.guard_limbo, 1, memory_order_relaxed);
  }
  tp__mutex_unlock(&limbo_lock);
  while (done) {
    retired *t = done;
    done = t->next;
    t->fn(t->obj);
    free(t);
  }
}

uint64_t tp__guard_stamp(void) {
  return atomic_fetch_add(&tp__hot.guard_epoch, 1) + 1;
}

bool tp__guard_quiet_since(uint64_t stamp) {
  pthread_once(&once, init_once);
  return oldest_inside() >= stamp;
}

void tp__guard_retire(void *obj, void (*fn)(void *)) {
  pthread_once(&once, init_once);
  retired *t = malloc(sizeof *t);
  /* A thread entering from now on sees the object unpublished; those that
   * entered at an epoch before this one may still hold it. */
  uint64_t e = tp__guard_stamp();
  if (!t) {
    /* No memory to remember the object: it stays allocated, a small leak
     * rather than a use after free. */
    return;
  }
  *t = (retired){obj, fn, e, NULL};
  tp__mutex_lock(&limbo_lock);
  t->next = limbo;
  limbo = t;
  atomic_fetch_add_explicit(&tp__hot.guard_limbo, 1, memory_order_relaxed);
  tp__atomic_max(&newest_retired, e);
  tp__mutex_unlock(&limbo_lock);
  tp__guard_collect();
}
