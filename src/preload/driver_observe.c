/* Driver calls that go to the driver and are also told to tidepool, as
 * observe.c does for the runtime's: synchronizations (frees complete,
 * memory falls to the release threshold), event records and waits (stream
 * order across streams; the pairs of events are the ones observe.c keeps,
 * since a cudaEvent_t is a CUevent), and event destruction. With
 * TIDEPOOL_PRELOAD=host, streams and host functions are tidepool's own. */
#include "api/api.h"
#include "common/hot.h"
#include "common/seen.h"
#include "driver.h"

static _Atomic(tp__pl_fn) r_stream_sync, r_stream_sync_ptsz, r_ctx_sync,
    r_ctx_sync_v2, r_event_sync, r_record, r_record_ptsz, r_record_flags,
    r_record_flags_ptsz, r_wait, r_wait_ptsz, r_event_destroy, r_stream_create,
    r_stream_create_prio, r_stream_destroy, r_host_func, r_host_func_ptsz,
    r_stream_destroy_v1, r_ctx_destroy, r_ctx_destroy_v1, r_primary_reset,
    r_primary_reset_v1, r_primary_release, r_primary_release_v1;

typedef PFN_cuStreamSynchronize_v2000 stream_fn;
typedef PFN_cuEventRecord_v2000 record_fn;
typedef PFN_cuEventRecordWithFlags_v11010 record_flags_fn;
typedef PFN_cuStreamWaitEvent_v3020 wait_fn;
typedef PFN_cuLaunchHostFunc_v10000 host_func_fn;

/* Whether tidepool is to be told of a call that only observes. */
static bool observing(void) {
  CUresult ignored = CUDA_SUCCESS;
  return tp__pl_drv_enter(false, &ignored) == TP_PL_DRV_OURS;
}

/* ---- synchronizations -----------------------------------------------------
 * The application's synchronize is tidepool's wait (tp__device_synchronize_by,
 * tp__stream_synchronize_by): the work is waited for once, and no second
 * synchronize costs a capture another thread began in between its
 * validity. `call` is the application's: made once, unless tidepool failed
 * first. */

typedef struct app_sync {
  CUresult (*call)(struct app_sync *a);
  CUstream stream;
  CUcontext ctx;
  CUevent event;
  CUresult r;
  bool made;
} app_sync;

_Static_assert((int)CUDA_SUCCESS == (int)cudaSuccess &&
                   (int)CUDA_ERROR_ILLEGAL_ADDRESS ==
                       (int)cudaErrorIllegalAddress,
               "tp__pl_sync_answer reads the driver's codes as the runtime's");

static tp_error_t app_wait(void *arg) {
  app_sync *a = arg;
  a->r = a->call(a);
  a->made = true;
  return tp__pl_sync_answer((int)a->r);
}

/* The application's answer, the call made through tidepool's wait where
 * tidepool observes it, else directly. */
static CUresult synchronized(app_sync *a, bool made) {
  if (!made || !a->made)
    return a->call(a);
  if (a->r == CUDA_SUCCESS)
    tp__pl_drv_count(TP_PL_COUNT_SYNC);
  return a->r;
}

/* With TIDEPOOL_PRELOAD=host the streams are tidepool's own, which the
 * driver's call does not wait for: the driver answers first, and tidepool
 * then waits for its own work. */
static CUresult host_mode_sync(app_sync *a, tp_stream_t stream, bool device) {
  CUresult r = a->call(a);
  if (r != CUDA_SUCCESS || !observing())
    return r;
  (void)(device ? tp_device_synchronize() : tp_stream_synchronize(stream));
  tp__pl_drv_count(TP_PL_COUNT_SYNC);
  return r;
}

static CUresult stream_synchronize(app_sync *a, bool per_thread) {
  if (tp__pl_host_requested())
    return host_mode_sync(a, tp__pl_stream(a->stream, per_thread), false);
  bool made = observing();
  if (made)
    (void)tp__stream_synchronize_by(tp__pl_stream(a->stream, per_thread),
                                    app_wait, a);
  return synchronized(a, made);
}

static CUresult call_stream_sync(app_sync *a) {
  return TP_PL_DRV_CALL(r_stream_sync, stream_fn, (a->stream));
}

static CUresult call_stream_sync_ptsz(app_sync *a) {
  return TP_PL_DRV_CALL(r_stream_sync_ptsz, stream_fn, (a->stream));
}

static CUresult stream_sync(CUstream stream) {
  app_sync a = {call_stream_sync, stream, NULL, NULL, CUDA_SUCCESS, false};
  return stream_synchronize(&a, false);
}

static CUresult stream_sync_ptsz(CUstream stream) {
  app_sync a = {call_stream_sync_ptsz, stream, NULL, NULL, CUDA_SUCCESS, false};
  return stream_synchronize(&a, true);
}

static CUresult device_synchronize(app_sync *a) {
  if (tp__pl_host_requested())
    return host_mode_sync(a, NULL, true);
  bool made = observing();
  if (made)
    (void)tp__device_synchronize_by(app_wait, a);
  return synchronized(a, made);
}

static CUresult call_ctx_sync(app_sync *a) {
  (void)a;
  return TP_PL_DRV_CALL(r_ctx_sync, PFN_cuCtxSynchronize_v2000, ());
}

static CUresult call_ctx_sync_v2(app_sync *a) {
  return TP_PL_DRV_CALL(r_ctx_sync_v2, PFN_cuCtxSynchronize_v13000, (a->ctx));
}

static CUresult ctx_sync(void) {
  app_sync a = {call_ctx_sync, NULL, NULL, NULL, CUDA_SUCCESS, false};
  return device_synchronize(&a);
}

/* CUDA 13's form names its context; only the calling thread's current one
 * (or NULL, which means it) is followed, the others are left to the driver
 * and tidepool learns of their work later. */
static CUresult ctx_sync_v2(CUcontext ctx) {
  app_sync a = {call_ctx_sync_v2, NULL, ctx, NULL, CUDA_SUCCESS, false};
  if (ctx && ctx != tp__pl_drv_ctx_save())
    return a.call(&a);
  return device_synchronize(&a);
}

static CUresult call_event_sync(app_sync *a) {
  return TP_PL_DRV_CALL(r_event_sync, PFN_cuEventSynchronize_v2000, (a->event));
}

/* tidepool's twin of the event, recorded just before it, is waited for
 * through the application's wait; in the host mode after it. */
static CUresult event_sync(CUevent event) {
  app_sync a = {call_event_sync, NULL, NULL, event, CUDA_SUCCESS, false};
  tp_event_t ours = tp__pl_event_find((cudaEvent_t)event);
  if (!ours || tp__pl_host_requested()) {
    CUresult r = a.call(&a);
    if (r == CUDA_SUCCESS && ours && observing()) {
      (void)tp_event_synchronize(ours);
      tp__pl_drv_count(TP_PL_COUNT_SYNC);
    }
    return r;
  }
  bool made = observing();
  if (made)
    (void)tp__event_synchronize_by(ours, app_wait, &a);
  return synchronized(&a, made);
}

/* ---- events ----------------------------------------------------------------
 * tidepool's event is recorded before the driver's, so that it never
 * covers more of the stream than the driver's does (see observe.c). */

static bool record_before(CUevent event, CUstream stream, bool per_thread) {
  if (!observing() || tp__pl_drv_capturing(stream, per_thread))
    return false;
  tp_event_t ours = tp__pl_event_pair((cudaEvent_t)event);
  if (!ours ||
      tp_event_record(ours, tp__pl_stream(stream, per_thread)) != TP_SUCCESS)
    return false;
  tp__pl_drv_count(TP_PL_COUNT_EVENT);
  return true;
}

static CUresult record_after(CUevent event, bool recorded, CUresult r) {
  /* A record that came through the runtime-level layer was paired there. */
  if (tp__pl_runtime_depth == 0 && tp__pl_on())
    tp__pl_event_mark((cudaEvent_t)event, recorded && r == CUDA_SUCCESS);
  return r;
}

static CUresult event_record(CUevent event, CUstream stream) {
  bool recorded = record_before(event, stream, false);
  return record_after(event, recorded,
                      TP_PL_DRV_CALL(r_record, record_fn, (event, stream)));
}

static CUresult event_record_ptsz(CUevent event, CUstream stream) {
  bool recorded = record_before(event, stream, true);
  return record_after(
      event, recorded,
      TP_PL_DRV_CALL(r_record_ptsz, record_fn, (event, stream)));
}

static CUresult event_record_flags(CUevent event, CUstream stream,
                                   unsigned flags) {
  bool recorded = record_before(event, stream, false);
  return record_after(
      event, recorded,
      TP_PL_DRV_CALL(r_record_flags, record_flags_fn, (event, stream, flags)));
}

static CUresult event_record_flags_ptsz(CUevent event, CUstream stream,
                                        unsigned flags) {
  bool recorded = record_before(event, stream, true);
  return record_after(event, recorded,
                      TP_PL_DRV_CALL(r_record_flags_ptsz, record_flags_fn,
                                     (event, stream, flags)));
}

static CUresult wait_after(CUstream stream, CUevent event, bool per_thread,
                           CUresult r) {
  if (r != CUDA_SUCCESS)
    return r;
  tp_event_t ours = tp__pl_event_find((cudaEvent_t)event);
  if (!ours || !observing() || tp__pl_drv_capturing(stream, per_thread))
    return r;
  (void)tp_stream_wait_event(tp__pl_stream(stream, per_thread), ours, 0);
  tp__pl_drv_count(TP_PL_COUNT_EVENT);
  return r;
}

static CUresult stream_wait(CUstream stream, CUevent event, unsigned flags) {
  return wait_after(stream, event, false,
                    TP_PL_DRV_CALL(r_wait, wait_fn, (stream, event, flags)));
}

static CUresult stream_wait_ptsz(CUstream stream, CUevent event,
                                 unsigned flags) {
  return wait_after(
      stream, event, true,
      TP_PL_DRV_CALL(r_wait_ptsz, wait_fn, (stream, event, flags)));
}

static CUresult event_destroy(CUevent event) {
  if (tp__pl_runtime_depth == 0 && tp__pl_on())
    tp__pl_event_forget((cudaEvent_t)event);
  return TP_PL_DRV_CALL(r_event_destroy, PFN_cuEventDestroy_v4000, (event));
}

/* ---- streams of the host mode ----------------------------------------------
 * As in observe.c: with TIDEPOOL_PRELOAD=host tidepool makes the streams
 * and runs their host functions. These entries are handed out only then. */

/* Whether the host mode answers a stream call. */
static bool host_answers(CUresult *err) {
  *err = CUDA_SUCCESS;
  return tp__pl_host_requested() &&
         tp__pl_drv_enter(true, err) == TP_PL_DRV_OURS;
}

static CUresult host_stream_create(CUstream *stream, unsigned flags) {
  if (!stream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return tp__pl_drv_error(TP_ERROR_INVALID_VALUE);
  tp_stream_t made = NULL;
  tp_error_t err = tp_stream_create(
      &made, (flags & CU_STREAM_NON_BLOCKING) ? TP_STREAM_NON_BLOCKING : 0);
  if (err == TP_SUCCESS)
    *stream = (CUstream)made;
  return tp__pl_drv_error(err);
}

static CUresult stream_create(CUstream *stream, unsigned flags) {
  CUresult err;
  if (host_answers(&err))
    return host_stream_create(stream, flags);
  return err != CUDA_SUCCESS
             ? err
             : TP_PL_DRV_CALL(r_stream_create, PFN_cuStreamCreate_v2000,
                              (stream, flags));
}

static CUresult stream_create_prio(CUstream *stream, unsigned flags,
                                   int priority) {
  CUresult err;
  if (host_answers(&err))
    return host_stream_create(stream, flags);
  return err != CUDA_SUCCESS
             ? err
             : TP_PL_DRV_CALL(r_stream_create_prio,
                              PFN_cuStreamCreateWithPriority_v5050,
                              (stream, flags, priority));
}

/* With a GPU, a destruction that may end streams is told to tidepool
 * before and after it (common/seen.h): a stream of the program's that
 * tidepool met is then known by its handle until one comes, with no
 * question to the driver. */
#define DESTROYS(call)                                                         \
  do {                                                                         \
    tp__seen_streams_change();                                                 \
    CUresult r_ = (call);                                                      \
    tp__seen_streams_change();                                                 \
    return r_;                                                                 \
  } while (0)

/* The first ABI (cuStreamDestroy) takes the same argument as the current
 * one, as do cuCtxDestroy's and the primary context calls' below. */
static CUresult stream_destroy_in(_Atomic(tp__pl_fn) *slot, CUstream stream) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(tp_stream_destroy((tp_stream_t)stream));
  if (err != CUDA_SUCCESS)
    return err;
  /* A stream destroyed while it captures takes the capture it began with
   * it (asked only while a capture may be under way), under the capture
   * lock: another thread's stream that takes the handle at once and
   * begins a capture on it must come after. */
  bool ask = !tp__no_capture(), capturing = false;
  uint64_t id = 0;
  if (ask) {
    tp__seen_capture_lock();
    id = tp__pl_drv_capture_id(stream, false, &capturing);
  }
  tp__seen_streams_change();
  CUresult r = TP_PL_DRV_CALL(*slot, PFN_cuStreamDestroy_v4000, (stream));
  tp__seen_streams_change();
  if (ask) {
    if (r == CUDA_SUCCESS && capturing)
      tp__pl_capture_stream_gone(tp__pl_capture_key(stream, false), id);
    tp__seen_capture_unlock();
    tp__pl_capture_tell();
  }
  return r;
}

static CUresult stream_destroy(CUstream stream) {
  return stream_destroy_in(&r_stream_destroy, stream);
}

static CUresult stream_destroy_v1(CUstream stream) {
  return stream_destroy_in(&r_stream_destroy_v1, stream);
}

/* A context's destruction or reset ends its streams. */
static CUresult ctx_destroy(CUcontext ctx) {
  DESTROYS(TP_PL_DRV_CALL(r_ctx_destroy, PFN_cuCtxDestroy_v4000, (ctx)));
}

static CUresult ctx_destroy_v1(CUcontext ctx) {
  DESTROYS(TP_PL_DRV_CALL(r_ctx_destroy_v1, PFN_cuCtxDestroy_v4000, (ctx)));
}

static CUresult primary_reset(CUdevice dev) {
  DESTROYS(TP_PL_DRV_CALL(r_primary_reset, PFN_cuDevicePrimaryCtxReset_v11000,
                          (dev)));
}

static CUresult primary_reset_v1(CUdevice dev) {
  DESTROYS(TP_PL_DRV_CALL(r_primary_reset_v1,
                          PFN_cuDevicePrimaryCtxReset_v11000, (dev)));
}

static CUresult primary_release(CUdevice dev) {
  DESTROYS(TP_PL_DRV_CALL(r_primary_release,
                          PFN_cuDevicePrimaryCtxRelease_v11000, (dev)));
}

static CUresult primary_release_v1(CUdevice dev) {
  DESTROYS(TP_PL_DRV_CALL(r_primary_release_v1,
                          PFN_cuDevicePrimaryCtxRelease_v11000, (dev)));
}

/* The names a library linked against libcuda calls (driver.h's
 * TP_PL_DRV_NAME); a destruction that reaches the driver unseen is told
 * all the same, before and after. */
#define DESTROY_NAME(slot, call, type, symbol, args)                           \
  do {                                                                         \
    if (!tp__pl_switched_off() && tp__pl_drv_fill_loaded() &&                  \
        tp__pl_drv_real(&(slot)))                                              \
      return call;                                                             \
    tp__pl_fn own_ = tp__pl_drv_by_name(symbol);                               \
    DESTROYS(own_ ? ((type)own_)args : CUDA_ERROR_NOT_INITIALIZED);            \
  } while (0)

TP_PL_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  DESTROY_NAME(r_stream_destroy, stream_destroy(hStream),
               PFN_cuStreamDestroy_v4000, "cuStreamDestroy_v2", (hStream));
}

TP_PL_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  DESTROY_NAME(r_ctx_destroy, ctx_destroy(ctx), PFN_cuCtxDestroy_v4000,
               "cuCtxDestroy_v2", (ctx));
}

TP_PL_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  DESTROY_NAME(r_primary_reset, primary_reset(dev),
               PFN_cuDevicePrimaryCtxReset_v11000, "cuDevicePrimaryCtxReset_v2",
               (dev));
}

TP_PL_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  DESTROY_NAME(r_primary_release, primary_release(dev),
               PFN_cuDevicePrimaryCtxRelease_v11000,
               "cuDevicePrimaryCtxRelease_v2", (dev));
}

static CUresult host_launch(_Atomic(tp__pl_fn) *slot, CUstream stream,
                            CUhostFn fn, void *arg, bool per_thread) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(
        tp_launch_host_func(tp__pl_stream(stream, per_thread), fn, arg));
  return err != CUDA_SUCCESS
             ? err
             : TP_PL_DRV_CALL(*slot, host_func_fn, (stream, fn, arg));
}

static CUresult launch_host_func(CUstream stream, CUhostFn fn, void *arg) {
  return host_launch(&r_host_func, stream, fn, arg, false);
}

static CUresult launch_host_func_ptsz(CUstream stream, CUhostFn fn, void *arg) {
  return host_launch(&r_host_func_ptsz, stream, fn, arg, true);
}

/* ---- the entries -------------------------------------------------------- */

#define FN(f) ((tp__pl_fn)(f))

const tp__pl_drv_entry tp__pl_drv_observe_entries[] = {
    {"cuStreamSynchronize", "cuStreamSynchronize", 2000, false, false,
     FN(stream_sync), &r_stream_sync},
    {"cuStreamSynchronize", "cuStreamSynchronize_ptsz", 7000, true, false,
     FN(stream_sync_ptsz), &r_stream_sync_ptsz},
    {"cuCtxSynchronize", "cuCtxSynchronize", 2000, false, false, FN(ctx_sync),
     &r_ctx_sync},
    {"cuCtxSynchronize", "cuCtxSynchronize_v2", 13000, false, false,
     FN(ctx_sync_v2), &r_ctx_sync_v2},
    {"cuEventSynchronize", "cuEventSynchronize", 2000, false, false,
     FN(event_sync), &r_event_sync},
    {"cuEventRecord", "cuEventRecord", 2000, false, false, FN(event_record),
     &r_record},
    {"cuEventRecord", "cuEventRecord_ptsz", 7000, true, false,
     FN(event_record_ptsz), &r_record_ptsz},
    {"cuEventRecordWithFlags", "cuEventRecordWithFlags", 11010, false, false,
     FN(event_record_flags), &r_record_flags},
    {"cuEventRecordWithFlags", "cuEventRecordWithFlags_ptsz", 11010, true,
     false, FN(event_record_flags_ptsz), &r_record_flags_ptsz},
    {"cuStreamWaitEvent", "cuStreamWaitEvent", 3020, false, false,
     FN(stream_wait), &r_wait},
    {"cuStreamWaitEvent", "cuStreamWaitEvent_ptsz", 7000, true, false,
     FN(stream_wait_ptsz), &r_wait_ptsz},
    {"cuEventDestroy", "cuEventDestroy_v2", 4000, false, false,
     FN(event_destroy), &r_event_destroy},
    {"cuStreamCreate", "cuStreamCreate", 2000, false, true, FN(stream_create),
     &r_stream_create},
    {"cuStreamCreateWithPriority", "cuStreamCreateWithPriority", 5050, false,
     true, FN(stream_create_prio), &r_stream_create_prio},
    /* Handed out with a GPU too: destructions are told to tidepool. */
    {"cuStreamDestroy", "cuStreamDestroy_v2", 4000, false, false,
     FN(stream_destroy), &r_stream_destroy},
    {"cuStreamDestroy", "cuStreamDestroy", 2000, false, false,
     FN(stream_destroy_v1), &r_stream_destroy_v1},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000, false, false, FN(ctx_destroy),
     &r_ctx_destroy},
    {"cuCtxDestroy", "cuCtxDestroy", 2000, false, false, FN(ctx_destroy_v1),
     &r_ctx_destroy_v1},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000, false,
     false, FN(primary_reset), &r_primary_reset},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset", 7000, false, false,
     FN(primary_reset_v1), &r_primary_reset_v1},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000, false,
     false, FN(primary_release), &r_primary_release},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease", 7000, false,
     false, FN(primary_release_v1), &r_primary_release_v1},
    {"cuLaunchHostFunc", "cuLaunchHostFunc", 10000, false, true,
     FN(launch_host_func), &r_host_func},
    {"cuLaunchHostFunc", "cuLaunchHostFunc_ptsz", 10000, true, true,
     FN(launch_host_func_ptsz), &r_host_func_ptsz},
};
const size_t tp__pl_drv_observe_count =
    sizeof tp__pl_drv_observe_entries / sizeof tp__pl_drv_observe_entries[0];
