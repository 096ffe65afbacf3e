/* What the interposer's files share: the real runtime's functions, the mode
 * the process runs in, the way into tidepool (device, streams, errors), the
 * translation of the allocator's structs and enums, the registry of pools
 * and the pairs of events, which the runtime-level layer (alloc.c,
 * observe.c) and the driver-level one (driver*.c) both use. Only tidepool's
 * public header and the CUDA toolkit's runtime headers are used here. */
#ifndef TP_PRELOAD_H
#define TP_PRELOAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/common.h"
#include "tidepool.h"

/* Symbols the interposer exports, as the runtime does; everything else in
 * the library (tidepool included) stays local through the version script. */
#define TP_PL_EXPORT __attribute__((visibility("default")))

/* ---- the real runtime ----------------------------------------------------
 * A generic function pointer: ISO C converts between function pointer types
 * but not from void *, so the lookup copies the address into one of these. */
typedef void (*tp__pl_fn)(void);

/* The next definition of `name` after the interposer (the runtime's own,
 * with the runtime's version node), or NULL when there is none. */
tp__pl_fn tp__pl_lookup(const char *name);

/* Declares next_NAME(), which returns the real NAME of type `type` (a
 * pointer-to-function typedef), looked up once. */
#define TP_PL_NEXT(name, type)                                                 \
  static type next_##name(void) {                                              \
    static _Atomic(tp__pl_fn) fn;                                              \
    tp__pl_fn f = atomic_load_explicit(&fn, memory_order_acquire);             \
    if (!f) {                                                                  \
      f = tp__pl_lookup(#name);                                                \
      atomic_store_explicit(&fn, f, memory_order_release);                     \
    }                                                                          \
    return (type)f;                                                            \
  }

/* What a wrapper answers when the runtime lacks the function it forwards. */
#define TP_PL_NO_RUNTIME cudaErrorSharedObjectSymbolNotFound

/* ---- calls on their way through the runtime --------------------------------
 * A call the runtime-level layer sends on to the real runtime reaches the
 * driver's entry points, which the driver-level layer also wraps: the
 * runtime-level layer has already done for it whatever tidepool had to do
 * (or found it none of tidepool's business), so while the depth is above 0
 * the driver-level layer passes everything straight to the driver. Per
 * thread: the runtime calls the driver on the caller's thread. */
extern TP_TLS int tp__pl_runtime_depth;

static inline void tp__pl_runtime_begin(void) {
  tp__pl_runtime_depth++;
}

static inline cudaError_t tp__pl_runtime_end(cudaError_t r) {
  tp__pl_runtime_depth--;
  return r;
}

/* Calls the real runtime function `fn` (non-NULL) with `args`, marked as on
 * its way through the runtime. */
#define TP_PL_THROUGH_RUNTIME(fn, args)                                        \
  (tp__pl_runtime_begin(), tp__pl_runtime_end((fn)args))

/* ---- the mode ------------------------------------------------------------
 * Decided once, at the first allocator call, from TIDEPOOL_PRELOAD and what
 * the runtime and tidepool find. Until then, and when off, every call goes
 * to the runtime unchanged. */
enum { TP_PL_UNDECIDED = 0, TP_PL_OFF, TP_PL_CUDA, TP_PL_HOST };

/* The mode without deciding it (TP_PL_UNDECIDED before the first allocator
 * call): for the calls that only observe, which have nothing to tell
 * tidepool before it has answered anything. */
int tp__pl_mode(void);

/* Whether tidepool answers, without deciding: for the calls that only
 * concern what tidepool already gave out. */
static inline bool tp__pl_on(void) {
  int m = tp__pl_mode();
  return m == TP_PL_CUDA || m == TP_PL_HOST;
}

/* Decides the mode if needed; true when tidepool answers. */
bool tp__pl_active(void);

/* The same for the driver-level layer, which asks the driver rather than
 * the runtime whether there is a device: `probe` returns 1 when there is one
 * (with the calling thread's device in *device), 0 when there is none (the
 * interposer stays off), and -1 when the driver cannot say yet (not
 * initialised): the mode then stays undecided, for a later call. */
typedef int (*tp__pl_probe_fn)(int *device);
bool tp__pl_active_via(tp__pl_probe_fn probe);

/* Whether TIDEPOOL_PRELOAD=host asked for the host platform (tests). There
 * streams are tidepool's own, since the host platform cannot adopt the
 * runtime's. */
bool tp__pl_host_requested(void);

/* Whether TIDEPOOL_PRELOAD asked for everything to be left alone (0, or a
 * value it does not know). Readable at any time, before the library's
 * constructor too: the driver's entry points are looked up as early as a
 * program likes. */
bool tp__pl_switched_off(void);

/* ---- calling into tidepool -----------------------------------------------
 * Makes tidepool's current device the runtime's current device of the
 * calling thread, which decides what the NULL stream and device-wide calls
 * mean. Returns the runtime's error if it cannot say its device (the
 * runtime has recorded it), or tidepool's, recorded as the last error only
 * when `answering` (a call tidepool answers, not one it only observes). */
cudaError_t tp__pl_enter(bool answering);
/* The driver layer's answer to "which device's primary context is current
 * on this thread" (-1: none, or it cannot tell cheaply), which tp__pl_enter
 * takes for the runtime's device where it has one: the runtime works in the
 * context current on the thread. Set once the driver's table is loaded. */
void tp__pl_set_context_device(int (*fn)(void));

/* After the application's own end of a capture on the stream keyed `key`
 * (tp__pl_capture_key): `before` its capture's id as the end began (0
 * where none or unknown), `capturing` whether the stream still captures,
 * `result` the end's answer (the driver's capture errors have the
 * runtime's numbers). The capture stops counting (seen.h), and graph
 * memory learns its fate where the answer tells it: a graph, or a failure
 * that ended it (another thread's end may have come first). */
void tp__pl_capture_ended(uint64_t key, uint64_t before, bool capturing,
                          cudaError_t result);
/* The stream keyed `key`, in capture `id` (0: one the driver no longer
 * names, invalidated), was destroyed: a capture it began can never end,
 * and goes as a failed one does; one it merely joined goes on. Under the
 * capture lock, graph memory is told by tp__pl_capture_tell once the
 * lock is released (as by any end that follows on this thread). */
void tp__pl_capture_stream_gone(uint64_t key, uint64_t id);
void tp__pl_capture_tell(void);

/* Whether `ptr` lies in a live allocation of one of tidepool's pools: a
 * call tidepool refuses for such a pointer is answered, not passed on to
 * a runtime or driver that knows nothing of the address. */
bool tp__pl_ptr_ours(const void *ptr);

/* The stream tidepool should see for a runtime stream; `per_thread` for the
 * _ptsz entry points, where NULL means the per-thread default stream. */
tp_stream_t tp__pl_stream(cudaStream_t stream, bool per_thread);

/* A stream's key in the count of captures under way (common/seen.h), the
 * same from the runtime's entry points and the driver's (a cudaStream_t is
 * a CUstream): the handle, or for the per-thread default stream (its
 * handle, or NULL to a _ptsz entry point) the calling thread's own. */
uint64_t tp__pl_capture_key(const void *stream, bool per_thread);
/* Whether that key names one stream (not the per-thread stream's, the same
 * in every context of the thread). */
bool tp__pl_capture_key_one(const void *stream, bool per_thread);

/* Whether the runtime captures `stream` (or cannot say), so that an event
 * recorded or waited on there is the driver's graph's business and not
 * tidepool's stream order: always false in the host mode, where tidepool
 * itself captures, and a record or a wait in a capture is its fork or
 * join. Allocations and frees are not routed by it: tidepool's capture
 * path takes them on capturing streams too. */
bool tp__pl_capturing(cudaStream_t stream, bool per_thread);

/* The runtime's code for a tidepool error. */
cudaError_t tp__pl_error(tp_error_t err);
/* What an application's synchronize, made as tidepool's wait, tells
 * tidepool: its work finished (SUCCESS, or ILLEGAL_ADDRESS after a fault),
 * or not known to (PLATFORM). The runtime's and the driver's codes agree. */
static inline tp_error_t tp__pl_sync_answer(int code) {
  return code == cudaSuccess               ? TP_SUCCESS
         : code == cudaErrorIllegalAddress ? TP_ERROR_ILLEGAL_ADDRESS
                                           : TP_ERROR_PLATFORM;
}
/* Whether fork() made this process after the parent called tidepool: its
 * refusals are then CUDA's initialization errors. */
bool tp__pl_forked(void);

/* Returns the runtime's code for `err` and, for a failure, records it as
 * the calling thread's last error (see cudaGetLastError in observe.c). */
cudaError_t tp__pl_fail(tp_error_t err);
/* The same for an error already in the runtime's terms. */
cudaError_t tp__pl_fail_code(cudaError_t code);

/* ---- translation ----------------------------------------------------------
 * The runtime's enums have the driver's values (checked in translate.c), so
 * both layers translate the same integers. Each returns false for a value
 * the enum does not have, which the caller answers as invalid. */
bool tp__pl_location_in(int type, int id, tp_location_t *out);
bool tp__pl_alloc_type_in(int type, tp_allocation_type_t *out);
/* Handle type bits of a pool's properties; Windows handles have no meaning
 * here. */
bool tp__pl_handle_types_in(unsigned bits, unsigned *out);
/* One handle type of an export or import; TP_HANDLE_NONE for others, which
 * tidepool refuses. */
tp_handle_type_t tp__pl_handle_type_in(int type);
/* Whether a pool import's handle is the runtime's or the driver's to
 * answer: a POSIX descriptor that is open but no SOCK_SEQPACKET socket
 * cannot be the rendezvous that tidepool's export hands out (it may be a
 * pool that the driver exported in a process where tidepool does not
 * answer). Never in the host mode, where the runtime has no pools. */
bool tp__pl_import_foreign(const void *handle, int type);
bool tp__pl_access_in(int flags, tp_access_flags_t *out);
int tp__pl_access_out(tp_access_flags_t flags);
/* The pool attributes both APIs have: the first eight, with the same value
 * types (int for the reuse policies, uint64 for the rest). */
bool tp__pl_attr_in(int attr, tp_pool_attr_t *out);

/* ---- pools ---------------------------------------------------------------
 * Every pool handle tidepool gave out through the interposer, at either
 * level: the runtime's cudaMemPool_t is the driver's CUmemoryPool, so one
 * set serves both, and a handle is never translated, only looked up. Others
 * (made with the driver API, say) are the runtime's, and calls on them go
 * there: tidepool must never be handed a handle it did not make. Handles are
 * never forgotten; tidepool keeps destroyed ones as tombstones, so their
 * addresses are not reused. */
void tp__pl_pool_remember(tp_pool_t pool);
bool tp__pl_pool_known(tp_pool_t pool);

/* ---- events --------------------------------------------------------------
 * A runtime event recorded while tidepool answers gets a tidepool event
 * recorded just before it on the same stream, so that tidepool learns the
 * stream order that events carry (reuse across streams, release at
 * cudaEventSynchronize). Returns NULL where there is none, or where the
 * runtime's last record of the event failed. */
tp_event_t tp__pl_event_find(cudaEvent_t event);
/* The pair of `event`, made if needed (with the calling thread's device). */
tp_event_t tp__pl_event_pair(cudaEvent_t event);
/* Marks the pair usable (both records succeeded) or not. */
void tp__pl_event_mark(cudaEvent_t event, bool valid);
/* Forgets the pair and destroys tidepool's event. */
void tp__pl_event_forget(cudaEvent_t event);

/* ---- counters ------------------------------------------------------------
 * What the interposer did, for tidepool_preload_counter() and the report at
 * exit (TIDEPOOL_PRELOAD_REPORT=1). */
enum {
  TP_PL_COUNT_MALLOC,    /* allocations tidepool answered */
  TP_PL_COUNT_FREE,      /* frees tidepool answered (cudaFree included) */
  TP_PL_COUNT_POOL,      /* pool and current-pool calls tidepool answered */
  TP_PL_COUNT_FORWARDED, /* allocator calls sent on: foreign pool or
                            pointer, stream capture */
  TP_PL_COUNT_SYNC,      /* synchronizations passed on to tidepool */
  TP_PL_COUNT_EVENT,     /* event records and waits passed on to tidepool */
  TP_PL_COUNT_FAILED,    /* calls tidepool answered with an error */
  TP_PL_COUNT_DRIVER,    /* of the calls above, those that reached tidepool
                            through the driver's entry points (a runtime
                            linked statically, or the driver API) */
  TP_PL_NCOUNTERS
};
void tp__pl_count(int which);
unsigned long long tp__pl_counter(int which);

#endif /* TP_PRELOAD_H */
