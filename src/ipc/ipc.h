/* Sharing pools between processes: what the core (src/pool/) and the API
 * (src/api/ipc.c) call of src/ipc/. The room has four files:
 *   wire.c    the protocol and its transport (wire.h, private to the room);
 *   export.c  the exporting side: which exported blocks importers hold, and
 *             the pool's service thread that answers them;
 *   channel.c the importing side's channel to its exporter (channel.h,
 *             private to the room): requests, replies and releases, the
 *             list of imported pools and the mender thread;
 *   import.c  the importing side: a range of this process that maps the
 *             exporter's chunks as imported pointers need them, and gives
 *             its holds back in stream order.
 *
 * Locks, in the order they are taken (never the reverse):
 *   exporter:  tp__ipc_export.lock  ->  the pool's lock, a stream's spin lock
 *   importer:  the importers' list  ->  tp__ipc_import.mu  ->  .rel_mu
 *              ->  the mender's state
 *              tp__ipc_import.mu  ->  the pool's lock
 * No driver call is made under rel_mu or a stream's spin lock. */
#ifndef TP_IPC_H
#define TP_IPC_H

#include "pool/pool.h"

/* ---- the exporting side (export.c) ------------------------------------- */

/* Makes a pool created with handle types exportable: its state, and the
 * ops through which the core asks it about frees and teardown. */
tp_error_t tp__ipc_export_init(tp__pool *p);
/* A new descriptor for importers (the caller owns it). */
tp_error_t tp__ipc_export_handle(tp__pool *p, int *fd);
tp_error_t tp__ipc_export_pointer(tp__pool *p, void *ptr,
                                  tp_pool_ptr_export_data_t *data);
/* Whether the allocation at `addr` was freed by this process and stays
 * mapped only for the importers that still hold it. */
bool tp__ipc_export_freed(tp__pool *p, uintptr_t addr);

/* ---- the importing side (import.c) -------------------------------------- */

/* A pool of the exporter at the other end of `fd`, with the ops through
 * which the core hands it frees, trims, access and destruction. */
tp_error_t tp__ipc_import_pool(int fd, tp_pool_t *out);
tp_error_t tp__ipc_import_pointer(tp__pool *p,
                                  const tp_pool_ptr_export_data_t *data,
                                  void **ptr);
/* After a synchronize: every imported pool unmaps what it no longer uses. */
void tp__ipc_settle(void);

#endif /* TP_IPC_H */
