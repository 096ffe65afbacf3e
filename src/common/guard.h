/* Epoch-based reclamation for objects that threads reach without a lock (a
 * pool through its handle, the current-pool slots or the address registry):
 * an object is unpublished, then retired, and freed only once no thread can
 * still be inside a call that reached it before. */
#ifndef TP_GUARD_H
#define TP_GUARD_H

#include "common/common.h"

/* Marks the calling thread as inside the library; calls nest. Cheap: a
 * store to the thread's own record and, where the kernel offers
 * membarrier, no fence (the reclaimer pays for the ordering instead). */
void tp__guard_enter(void);
void tp__guard_exit(void);

/* Frees `obj` with `fn` once every thread inside the library when this is
 * called has left it. The caller has already made `obj` unreachable. */
void tp__guard_retire(void *obj, void (*fn)(void *));

/* Frees what no thread can reach any more. Never waits for a thread. */
void tp__guard_collect(void);

static inline tp_error_t tp__guard_leave(tp_error_t err) {
  tp__guard_exit();
  return err;
}

/* Evaluates a call that returns a tp_error_t inside the guard. */
#define TP_GUARDED(call) (tp__guard_enter(), tp__guard_leave(call))

#endif /* TP_GUARD_H */
