/* Runtime calls that go to the runtime and are also told to tidepool, so
 * that it sees what the driver's pool would see: synchronizations (frees
 * complete, memory falls to the release threshold), event records and
 * waits (stream order across streams), and event destruction. With
 * TIDEPOOL_PRELOAD=host, streams and host functions are tidepool's own. */
#include "api/api.h"
#include "common/seen.h"
#include "preload.h"

typedef cudaError_t (*stream_fn)(cudaStream_t);
typedef cudaError_t (*void_fn)(void);
typedef cudaError_t (*event_fn)(cudaEvent_t);
typedef cudaError_t (*record_fn)(cudaEvent_t, cudaStream_t);
typedef cudaError_t (*record_flags_fn)(cudaEvent_t, cudaStream_t, unsigned);
typedef cudaError_t (*wait_fn)(cudaStream_t, cudaEvent_t, unsigned);
typedef cudaError_t (*create_fn)(cudaStream_t *);
typedef cudaError_t (*create_flags_fn)(cudaStream_t *, unsigned);
typedef cudaError_t (*create_priority_fn)(cudaStream_t *, unsigned, int);
typedef cudaError_t (*host_func_fn)(cudaStream_t, cudaHostFn_t, void *);

TP_PL_NEXT(cudaStreamSynchronize, stream_fn)
TP_PL_NEXT(cudaStreamSynchronize_ptsz, stream_fn)
TP_PL_NEXT(cudaDeviceSynchronize, void_fn)
TP_PL_NEXT(cudaEventSynchronize, event_fn)
TP_PL_NEXT(cudaEventRecord, record_fn)
TP_PL_NEXT(cudaEventRecord_ptsz, record_fn)
TP_PL_NEXT(cudaEventRecordWithFlags, record_flags_fn)
TP_PL_NEXT(cudaEventRecordWithFlags_ptsz, record_flags_fn)
TP_PL_NEXT(cudaStreamWaitEvent, wait_fn)
TP_PL_NEXT(cudaStreamWaitEvent_ptsz, wait_fn)
TP_PL_NEXT(cudaEventDestroy, event_fn)
TP_PL_NEXT(cudaStreamCreate, create_fn)
TP_PL_NEXT(cudaStreamCreateWithFlags, create_flags_fn)
TP_PL_NEXT(cudaStreamCreateWithPriority, create_priority_fn)
TP_PL_NEXT(cudaStreamDestroy, stream_fn)
TP_PL_NEXT(cudaLaunchHostFunc, host_func_fn)
TP_PL_NEXT(cudaLaunchHostFunc_ptsz, host_func_fn)

/* The real call's result, or that the runtime lacks it; marked as on its
 * way through the runtime (see preload.h), since this layer tells tidepool
 * itself. */
#define REAL(name, args)                                                       \
  (next_##name() ? TP_PL_THROUGH_RUNTIME(next_##name(), args)                  \
                 : TP_PL_NO_RUNTIME)

/* ---- synchronizations -----------------------------------------------------
 * The runtime's synchronize is the wait, and its answer the application's
 * (with errors of earlier kernels, and its own last error); tidepool takes
 * what it covers before and, once it returned, marks its frees complete and
 * releases memory above the threshold. tidepool's answer adds nothing the
 * runtime's lacks. */

/* In the host mode captures are tidepool's, and the runtime beneath knows
 * none: a synchronize that tidepool refuses for a capture (and whose
 * capture it invalidated, as CUDA does) answers so. Elsewhere the runtime's
 * answer stands. */
static cudaError_t synchronized(cudaError_t r, tp_error_t err) {
  bool capture = err == TP_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
                 err == TP_ERROR_STREAM_CAPTURE_INVALIDATED ||
                 err == TP_ERROR_STREAM_CAPTURE_IMPLICIT;
  tp__pl_count(TP_PL_COUNT_SYNC);
  return capture && tp__pl_host_requested() ? tp__pl_fail(err) : r;
}

/* Outside the host mode, where tidepool answers for its own captures, the
 * application's synchronize is tidepool's wait (tp__device_synchronize_by,
 * tp__stream_synchronize_by): the work is waited for once, and no second
 * synchronize costs another thread's capture begun in between its validity.
 * `call` is the application's: made once, unless tidepool failed first. */
typedef struct app_sync {
  cudaError_t (*call)(struct app_sync *a);
  cudaStream_t stream;
  cudaEvent_t event;
  cudaError_t r;
  bool made;
} app_sync;

static tp_error_t app_wait(void *arg) {
  app_sync *a = arg;
  a->r = a->call(a);
  a->made = true;
  return tp__pl_sync_answer((int)a->r);
}

static bool waits_for_app(void) {
  return tp__pl_on() && !tp__pl_host_requested() &&
         tp__pl_enter(false) == cudaSuccess;
}

/* The application's answer once tidepool waited through its call; false
 * where the call was not made. */
static bool answered(const app_sync *a, cudaError_t *r) {
  if (!a->made)
    return false;
  if (a->r == cudaSuccess)
    tp__pl_count(TP_PL_COUNT_SYNC);
  *r = a->r;
  return true;
}

static cudaError_t stream_synchronize(app_sync *a, bool per_thread) {
  cudaError_t r;
  if (waits_for_app()) {
    (void)tp__stream_synchronize_by(tp__pl_stream(a->stream, per_thread),
                                    app_wait, a);
    if (answered(a, &r))
      return r;
  }
  r = a->call(a);
  if (r != cudaSuccess || !tp__pl_on() || tp__pl_enter(false) != cudaSuccess)
    return r;
  return synchronized(
      r, tp_stream_synchronize(tp__pl_stream(a->stream, per_thread)));
}

static cudaError_t call_stream_sync(app_sync *a) {
  return REAL(cudaStreamSynchronize, (a->stream));
}

static cudaError_t call_stream_sync_ptsz(app_sync *a) {
  return REAL(cudaStreamSynchronize_ptsz, (a->stream));
}

static cudaError_t call_device_sync(app_sync *a) {
  (void)a;
  return REAL(cudaDeviceSynchronize, ());
}

TP_PL_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  app_sync a = {call_stream_sync, stream, NULL, cudaSuccess, false};
  return stream_synchronize(&a, false);
}

TP_PL_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  app_sync a = {call_stream_sync_ptsz, stream, NULL, cudaSuccess, false};
  return stream_synchronize(&a, true);
}

TP_PL_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  app_sync a = {call_device_sync, NULL, NULL, cudaSuccess, false};
  cudaError_t r;
  if (waits_for_app()) {
    (void)tp__device_synchronize_by(app_wait, &a);
    if (answered(&a, &r))
      return r;
  }
  r = a.call(&a);
  if (r != cudaSuccess || !tp__pl_on() || tp__pl_enter(false) != cudaSuccess)
    return r;
  return synchronized(r, tp_device_synchronize());
}

static cudaError_t call_event_sync(app_sync *a) {
  return REAL(cudaEventSynchronize, (a->event));
}

TP_PL_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  app_sync a = {call_event_sync, NULL, event, cudaSuccess, false};
  tp_event_t ours = tp__pl_on() ? tp__pl_event_find(event) : NULL;
  cudaError_t r;
  if (ours && waits_for_app()) {
    (void)tp__event_synchronize_by(ours, app_wait, &a);
    if (answered(&a, &r))
      return r;
  }
  r = a.call(&a);
  if (r != cudaSuccess || !tp__pl_on())
    return r;
  ours = tp__pl_event_find(event);
  if (ours && tp__pl_enter(false) == cudaSuccess)
    return synchronized(r, tp_event_synchronize(ours));
  return r;
}

/* ---- events ----------------------------------------------------------------
 * tidepool's event is recorded before the runtime's, so that it never
 * covers more of the stream than the runtime's does: whatever tidepool then
 * believes ordered after it (a wait, a synchronize) truly is. A pair is
 * used only while both records of its last recording succeeded; records on
 * a stream being captured are the graph's, and leave the pair unused until
 * the next record outside capture. */

static bool record_before(cudaEvent_t event, cudaStream_t stream,
                          bool per_thread) {
  if (!tp__pl_on() || tp__pl_capturing(stream, per_thread) ||
      tp__pl_enter(false) != cudaSuccess)
    return false;
  tp_event_t ours = tp__pl_event_pair(event);
  if (!ours ||
      tp_event_record(ours, tp__pl_stream(stream, per_thread)) != TP_SUCCESS)
    return false;
  tp__pl_count(TP_PL_COUNT_EVENT);
  return true;
}

static cudaError_t record_after(cudaEvent_t event, bool recorded,
                                cudaError_t r) {
  if (tp__pl_on())
    tp__pl_event_mark(event, recorded && r == cudaSuccess);
  return r;
}

TP_PL_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event,
                                         cudaStream_t stream) {
  bool recorded = record_before(event, stream, false);
  return record_after(event, recorded, REAL(cudaEventRecord, (event, stream)));
}

TP_PL_EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t event,
                                              cudaStream_t stream) {
  bool recorded = record_before(event, stream, true);
  return record_after(event, recorded,
                      REAL(cudaEventRecord_ptsz, (event, stream)));
}

TP_PL_EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t event,
                                                  cudaStream_t stream,
                                                  unsigned int flags) {
  bool recorded = record_before(event, stream, false);
  return record_after(event, recorded,
                      REAL(cudaEventRecordWithFlags, (event, stream, flags)));
}

TP_PL_EXPORT cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event,
                                                       cudaStream_t stream,
                                                       unsigned int flags) {
  bool recorded = record_before(event, stream, true);
  return record_after(
      event, recorded,
      REAL(cudaEventRecordWithFlags_ptsz, (event, stream, flags)));
}

/* After the runtime's wait has been queued, tidepool's: the stream now
 * follows the event's work, and tidepool may reuse memory freed before it. */
static cudaError_t wait_after(cudaStream_t stream, cudaEvent_t event,
                              bool per_thread, cudaError_t r) {
  if (r != cudaSuccess || !tp__pl_on())
    return r;
  tp_event_t ours = tp__pl_event_find(event);
  if (!ours || tp__pl_capturing(stream, per_thread) ||
      tp__pl_enter(false) != cudaSuccess)
    return r;
  (void)tp_stream_wait_event(tp__pl_stream(stream, per_thread), ours, 0);
  tp__pl_count(TP_PL_COUNT_EVENT);
  return r;
}

TP_PL_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream,
                                             cudaEvent_t event,
                                             unsigned int flags) {
  return wait_after(stream, event, false,
                    REAL(cudaStreamWaitEvent, (stream, event, flags)));
}

TP_PL_EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream,
                                                  cudaEvent_t event,
                                                  unsigned int flags) {
  return wait_after(stream, event, true,
                    REAL(cudaStreamWaitEvent_ptsz, (stream, event, flags)));
}

TP_PL_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (tp__pl_on())
    tp__pl_event_forget(event);
  return REAL(cudaEventDestroy, (event));
}

/* ---- streams of the host mode ----------------------------------------------
 * The host platform cannot adopt the runtime's streams, so with
 * TIDEPOOL_PRELOAD=host tidepool makes them, and runs their host functions.
 * With a GPU these calls are the runtime's, untouched. */

static cudaError_t host_stream_create(cudaStream_t *stream, unsigned flags) {
  tp_stream_t made = NULL;
  unsigned tp_flags =
      (flags & cudaStreamNonBlocking) ? TP_STREAM_NON_BLOCKING : 0;
  if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking))
    return tp__pl_fail(TP_ERROR_INVALID_VALUE);
  cudaError_t r = tp__pl_enter(true);
  if (r != cudaSuccess)
    return r;
  tp_error_t err = tp_stream_create(&made, tp_flags);
  if (err == TP_SUCCESS)
    *stream = (cudaStream_t)made;
  return tp__pl_fail(err);
}

TP_PL_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  if (tp__pl_host_requested() && tp__pl_active())
    return host_stream_create(stream, 0);
  return REAL(cudaStreamCreate, (stream));
}

TP_PL_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream,
                                                   unsigned int flags) {
  if (tp__pl_host_requested() && tp__pl_active())
    return host_stream_create(stream, flags);
  return REAL(cudaStreamCreateWithFlags, (stream, flags));
}

TP_PL_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream,
                                                      unsigned int flags,
                                                      int priority) {
  if (tp__pl_host_requested() && tp__pl_active())
    return host_stream_create(stream, flags);
  return REAL(cudaStreamCreateWithPriority, (stream, flags, priority));
}

/* With a GPU, told to tidepool before and after, as the driver's
 * (driver_observe.c), which a runtime may reach otherwise. */
TP_PL_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (tp__pl_host_requested() && tp__pl_on())
    return tp__pl_fail(tp_stream_destroy((tp_stream_t)stream));
  tp__seen_streams_change();
  cudaError_t r = REAL(cudaStreamDestroy, (stream));
  tp__seen_streams_change();
  return r;
}

static cudaError_t host_launch(cudaStream_t stream, cudaHostFn_t fn, void *arg,
                               bool per_thread) {
  cudaError_t r = tp__pl_enter(true);
  if (r != cudaSuccess)
    return r;
  return tp__pl_fail(
      tp_launch_host_func(tp__pl_stream(stream, per_thread), fn, arg));
}

TP_PL_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream,
                                            cudaHostFn_t fn, void *arg) {
  if (tp__pl_host_requested() && tp__pl_active())
    return host_launch(stream, fn, arg, false);
  return REAL(cudaLaunchHostFunc, (stream, fn, arg));
}

TP_PL_EXPORT cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream,
                                                 cudaHostFn_t fn, void *arg) {
  if (tp__pl_host_requested() && tp__pl_active())
    return host_launch(stream, fn, arg, true);
  return REAL(cudaLaunchHostFunc_ptsz, (stream, fn, arg));
}
