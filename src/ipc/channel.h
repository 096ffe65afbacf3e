/* The importing side's state and the channel to its exporter, private to
 * src/ipc/: requests and their replies, releases sent in order and never
 * waited for, a late reply read when it comes, the list of imported pools
 * and the mender thread that sends what waited where no call comes.
 * import.c builds the imported pool on it.
 *
 * Locking: tp__ipc_import.talk_mu serialises requests and replies on the
 * channel (and changes of access, which a mapping in a conversation reads);
 * mu guards the chunk table, the imported pointers and the mappings, and is
 * let go while a conversation waits for the exporter, so that a free of an
 * imported pointer never waits for another thread's import; rel_mu guards
 * the releases in flight (`done`, `pending`) and orders every send on the
 * channel, and is never held across a wait; the list of importers has a
 * lock of its own, and the mender thread's state another. Order: talk_mu,
 * importers, mu, rel_mu, mender; mu before the pool's lock. Host functions
 * on streams take rel_mu only, for moments. */
#ifndef TP_IPC_CHANNEL_H
#define TP_IPC_CHANNEL_H

#include "ipc/ipc.h"
#include "ipc/wire.h"

typedef struct imported {
  uint64_t offset, size;
  uint32_t count; /* imports of it not yet freed */
} imported;

typedef struct span {
  uint64_t offset, size;
} span;

/* What this process keeps of one chunk of the exporter's range. Slots come
 * in pages, allocated when a chunk of the page is first mapped, so that the
 * table costs what is mapped, not what the exporter's range could hold. */
typedef struct slot {
  tp__phys phys; /* mapped here, or 0 */
  uint32_t refs; /* imports not yet released that lie in the chunk */
} slot;
#define SLOT_PAGE_SHIFT 9
#define SLOT_PAGE ((size_t)1 << SLOT_PAGE_SHIFT)

struct tp__ipc_import {
  int fd; /* the private channel; shut down once the exporter is gone */
  /* Set once a request went unanswered in time (channel_mute): no request
   * is sent any more. */
  _Atomic bool muted;
  uint64_t pid, serial, gran, va_size;
  tp__pres *res;
  uintptr_t base;
  size_t nchunks;
  bool host_pool;  /* host memory: the host's access comes with it */
  bool registered; /* in the registry, so that frees find the pool */
  /* The pool was destroyed: every call that still finds the state (it
   * reached the pool just before) refuses; under mu. The state itself goes
   * once no thread can reach the pool (import_fini). */
  bool dead;
  /* One conversation (a request and its reply) at a time. */
  pthread_mutex_t talk_mu;
  /* The tables below and the mappings. Taken before the pool lock. */
  pthread_mutex_t mu;
  slot **pages; /* nchunks / SLOT_PAGE of them, rounded up; NULL: none mapped */
  size_t npages;
  size_t nheld;  /* chunks with a count */
  size_t *stale; /* chunks whose count fell to 0, to unmap; room for nheld */
  size_t nstale, capstale;
  imported *ptrs; /* sorted by offset */
  uint32_t nptrs, capptrs;
  /* Frees in flight: a host function queued on the freeing stream reports
   * each here when the stream reaches it. Held only for moments, never
   * across a driver call, since those functions run on the platform's own
   * threads. */
  pthread_mutex_t rel_mu;
  pthread_cond_t rel_cv;
  span *done; /* released, not yet taken out of the chunks' counts; room
                 for every pending one is made when its free is issued */
  uint32_t ndone, capdone;
  uint32_t pending; /* host functions queued and not yet run */
  /* Releases the exporter had no room for (it stopped reading): sent in
   * order, before anything else, once it reads again; it keeps the holds
   * meanwhile. Under rel_mu. */
  uint64_t *unsent;
  uint32_t nunsent, capunsent;
  /* A reply that did not come in time may still come; one of an import
   * then tells of a hold that no pointer of this process stands for, to be
   * given back (drain_late). Under mu. */
  bool reply_owed;
};

/* ---- the channel (mu or rel_mu as each says) ---------------------------- */

/* The exporter is gone (the channel closed or failed): every later send
 * and receive fails at once. */
void tp__chan_break(tp__ipc_import *m);
/* The exporter did not answer in time or answered out of step: no request
 * is sent any more; releases still go. */
void tp__chan_mute(tp__ipc_import *m);
/* Sends the releases that had to wait, in order, as far as the channel has
 * room now; rel_mu held. */
void tp__chan_flush(tp__ipc_import *m);
/* Gives the exporter back one hold, after those still waiting, without
 * waiting for room; rel_mu held. */
void tp__chan_release(tp__ipc_import *m, uint64_t offset);
/* Sends a request after the releases issued before it, calling `with`
 * (if any) in the same stretch of rel_mu as the send. talk_mu and mu held;
 * waits for room with neither mu nor rel_mu held. */
tp_error_t tp__chan_request(tp__ipc_import *m, const tp__wire *q,
                            void (*with)(tp__ipc_import *m));
/* Waits for the reply `op` to a request; talk_mu and mu held, mu let go
 * while it waits. */
tp_error_t tp__chan_reply(tp__ipc_import *m, uint16_t op, tp__wire *a, int *fd);
/* Reads a reply that did not come in time, if it has come now; mu held. */
void tp__chan_drain_late(tp__ipc_import *m);

/* ---- the imported pools ---------------------------------------------------
 */

tp_error_t tp__importers_add(tp__pool *p);
void tp__importers_remove(tp__pool *p);
/* Calls `settle` with mu held for each imported pool whose mu is free now
 * (one busy with an import settles at its next call instead). */
void tp__importers_settle(void (*settle)(tp__pool *p));

#endif /* TP_IPC_CHANNEL_H */
