/* Epoch-based reclamation for objects that threads reach without a lock (a
 * pool through its handle, the current-pool slots or the address registry):
 * an object is unpublished, then retired, and freed only once no thread can
 * still be inside a call that reached it before. */
#ifndef TP_GUARD_H
#define TP_GUARD_H

#include "common/fence.h"

/* A thread's record, on a cache line of its own: only its thread writes
 * it, so that entering the guard touches nothing another thread writes. */
typedef struct tp__guard_rec {
  _Alignas(64) _Atomic uint64_t epoch; /* 0: outside the library */
  _Atomic bool taken;
  struct tp__guard_rec *next;
} tp__guard_rec;

/* The calling thread's view: its record (NULL until its first entry, or
 * when memory was short) and how deep it is inside. */
typedef struct tp__guard_tls {
  tp__guard_rec *rec;
  unsigned depth;
} tp__guard_tls;
extern TP_TLS tp__guard_tls tp__guard_me;
void tp__guard_enter_slow(tp__guard_tls *g);

/* Publishes the epoch the thread entered at, ordered before its loads of
 * shared pointers (see tp__guard_enter). */
static inline void tp__guard_publish(tp__guard_rec *rec) {
  atomic_store_explicit(
      &rec->epoch,
      atomic_load_explicit(&tp__hot.guard_epoch, memory_order_acquire),
      memory_order_relaxed);
  tp__fence_light();
}
void tp__guard_exit_slow(tp__guard_tls *g, uint64_t entered);

/* Marks the calling thread as inside the library; calls nest. Cheap: a
 * store to the thread's own record and, where the kernel offers
 * membarrier, no fence (the reclaimer pays for the ordering instead). */
static inline void tp__guard_enter(void) {
  tp__guard_tls *g = &tp__guard_me;
  if (g->depth++ > 0)
    return;
  if (TP_UNLIKELY(!g->rec)) {
    tp__guard_enter_slow(g);
    return;
  }
  tp__guard_publish(g->rec);
}

/* Enters where that is the common case, a thread outside the library;
 * false, with nothing changed, otherwise (the caller then enters with
 * tp__guard_enter). The allocator's fast entry points use it so that they
 * hold no call they must come back from. Only where the light fence is
 * known free (tp__hot.fence_expedited, which stays so once set): the fence
 * is then the compiler barrier alone, with no load to ask (api.h,
 * tp__api_quick). */
static inline bool tp__guard_try_enter(void) {
  tp__guard_tls *g = &tp__guard_me;
  /* No record: the thread gave it back as it ended (guard.c), and a call
   * from a later thread-exit destructor must take one anew. */
  if (TP_UNLIKELY(g->depth != 0 || !g->rec))
    return false;
  g->depth = 1;
  atomic_store_explicit(
      &g->rec->epoch,
      atomic_load_explicit(&tp__hot.guard_epoch, memory_order_acquire),
      memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
  return true;
}

static inline void tp__guard_exit(void) {
  tp__guard_tls *g = &tp__guard_me;
  if (--g->depth > 0)
    return;
  if (TP_UNLIKELY(!g->rec)) {
    tp__guard_exit_slow(g, 0);
    return;
  }
  uint64_t entered = atomic_load_explicit(&g->rec->epoch, memory_order_relaxed);
  atomic_store_explicit(&g->rec->epoch, 0, memory_order_release);
  if (TP_UNLIKELY(
          atomic_load_explicit(&tp__hot.guard_limbo, memory_order_relaxed)))
    tp__guard_exit_slow(g, entered);
}

/* Leaves an entry by tp__guard_try_enter, whose depth is back at one (what
 * the call entered inside since, it left). Retired objects waiting are
 * looked for before the record is cleared rather than after: relaxed, the
 * load was free to pass the store already, and the epoch entered at is
 * then read only where the slow exit wants it. */
static inline void tp__guard_exit_quick(void) {
  tp__guard_tls *g = &tp__guard_me;
  tp__guard_rec *rec = g->rec;
  g->depth = 0;
  if (TP_UNLIKELY(
          atomic_load_explicit(&tp__hot.guard_limbo, memory_order_relaxed))) {
    uint64_t entered = atomic_load_explicit(&rec->epoch, memory_order_relaxed);
    atomic_store_explicit(&rec->epoch, 0, memory_order_release);
    tp__guard_exit_slow(g, entered);
    return;
  }
  atomic_store_explicit(&rec->epoch, 0, memory_order_release);
}

/* Frees `obj` with `fn` once every thread inside the library when this is
 * called has left it. The caller has already made `obj` unreachable. */
void tp__guard_retire(void *obj, void (*fn)(void *));

/* For an object its owner made unreachable and keeps for reuse rather than
 * retiring it: the epoch to remember, and whether every thread inside the
 * library now entered at or after it (no thread still holds the object
 * from before). The second asks every thread (a heavy fence). */
uint64_t tp__guard_stamp(void);
bool tp__guard_quiet_since(uint64_t stamp);

/* Frees what no thread can reach any more. Never waits for a thread. */
void tp__guard_collect(void);

static inline tp_error_t tp__guard_leave(tp_error_t err) {
  tp__guard_exit();
  return err;
}

/* Evaluates a call that returns a tp_error_t inside the guard. */
#define TP_GUARDED(call) (tp__guard_enter(), tp__guard_leave(call))

#endif /* TP_GUARD_H */
