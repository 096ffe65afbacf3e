/* Sharing pools between processes: what the core (src/pool/) and the API
 * (src/api/ipc.c) call of src/ipc/. The room has three files:
 *   wire.c    the protocol and its transport (wire.h, private to the room);
 *   export.c  the exporting side: which exported blocks importers hold, and
 *             the pool's service thread that answers them;
 *   import.c  the importing side: a range of this process that maps the
 *             exporter's chunks as imported pointers need them, and gives
 *             its holds back in stream order.
 *
 * Locks, in the order they are taken (never the reverse):
 *   exporter:  tp__ipc_export.lock  ->  the pool's lock, a stream's spin lock
 *   importer:  importers_lock  ->  tp__ipc_import.mu  ->  .rel_mu
 *              tp__ipc_import.mu  ->  the pool's lock
 * No driver call is made under rel_mu or a stream's spin lock. */
#ifndef TP_IPC_H
#define TP_IPC_H

#include "pool/pool.h"

/* ---- the exporting side (export.c) ------------------------------------- */

tp_error_t tp__ipc_export_init(tp__pool *p);
/* A new descriptor for importers (the caller owns it). */
tp_error_t tp__ipc_export_handle(tp__pool *p, int *fd);
tp_error_t tp__ipc_export_pointer(tp__pool *p, void *ptr,
                                  tp_pool_ptr_export_data_t *data);
/* The pool was destroyed: no new importers, no new imports. */
void tp__ipc_export_close(tp__pool *p);
/* Teardown: stops serving importers unless one still holds a block (then
 * false: the pool must stay). No lock held. */
bool tp__ipc_export_stop(tp__pool *p);
void tp__ipc_export_free(tp__pool *p);
/* Called by a free of `addr` while p->ipc_watch is set: *kept when an
 * importer holds the allocation, which export.c then frees once released. */
tp_error_t tp__ipc_on_free(tp__pool *p, uintptr_t addr, tp__stream *s,
                           bool *kept);

/* ---- the importing side (import.c) -------------------------------------- */

tp_error_t tp__ipc_import_pool(int fd, tp_pool_t *out);
tp_error_t tp__ipc_import_pointer(tp__pool *p,
                                  const tp_pool_ptr_export_data_t *data,
                                  void **ptr);
tp_error_t tp__ipc_import_free(tp__pool *p, uintptr_t addr, tp__stream *s);
tp_error_t tp__ipc_import_set_access(tp__pool *p, const tp_access_desc_t *list,
                                     size_t n);
/* Unmaps chunks that no imported pointer still uses. */
void tp__ipc_import_trim(tp__pool *p);
void tp__ipc_import_destroy(tp__pool *p);
/* After a synchronize: every imported pool unmaps what it no longer uses. */
void tp__ipc_settle(void);

#endif /* TP_IPC_H */
