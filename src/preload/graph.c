/* The runtime's stream capture and graph calls: with TIDEPOOL_PRELOAD=host
 * tidepool's own (the host platform's streams are tidepool's, so only it
 * can capture them); otherwise the runtime's, since the driver captures
 * and launches and tidepool's graph memory is tied to the driver's graphs
 * by user objects, but for the execs: each is adopted as it is made
 * (tp_graph_exec_adopt), so that tidepool books the launches of graphs it
 * allocated in. The graph memory attributes and trim answer for both: the
 * driver's graph memory and tidepool's. */
#include "common/seen.h"
#include "preload.h"

typedef cudaError_t (*begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*end_fn)(cudaStream_t, cudaGraph_t *);
typedef cudaError_t (*is_capturing_fn)(cudaStream_t,
                                       enum cudaStreamCaptureStatus *);
typedef cudaError_t (*instantiate_fn)(cudaGraphExec_t *, cudaGraph_t,
                                      unsigned long long);
typedef cudaError_t (*launch_fn)(cudaGraphExec_t, cudaStream_t);
typedef cudaError_t (*exec_destroy_fn)(cudaGraphExec_t);
typedef cudaError_t (*graph_destroy_fn)(cudaGraph_t);
typedef cudaError_t (*trim_fn)(int);
typedef cudaError_t (*mem_attr_fn)(int, enum cudaGraphMemAttributeType, void *);

typedef cudaError_t (*begin_to_graph_fn)(cudaStream_t, cudaGraph_t,
                                         const cudaGraphNode_t *,
                                         const cudaGraphEdgeData *, size_t,
                                         enum cudaStreamCaptureMode);
typedef cudaError_t (*capture_info_fn)(cudaStream_t,
                                       enum cudaStreamCaptureStatus *,
                                       unsigned long long *, cudaGraph_t *,
                                       const cudaGraphNode_t **,
                                       const cudaGraphEdgeData **, size_t *);

TP_PL_NEXT(cudaStreamBeginCapture, begin_fn)
TP_PL_NEXT(cudaStreamBeginCapture_ptsz, begin_fn)
TP_PL_NEXT(cudaStreamBeginCaptureToGraph, begin_to_graph_fn)
TP_PL_NEXT(cudaStreamBeginCaptureToGraph_ptsz, begin_to_graph_fn)
TP_PL_NEXT(cudaStreamGetCaptureInfo, capture_info_fn)
TP_PL_NEXT(cudaStreamEndCapture, end_fn)
TP_PL_NEXT(cudaStreamEndCapture_ptsz, end_fn)
TP_PL_NEXT(cudaStreamIsCapturing, is_capturing_fn)
TP_PL_NEXT(cudaStreamIsCapturing_ptsz, is_capturing_fn)
TP_PL_NEXT(cudaGraphInstantiate, instantiate_fn)
TP_PL_NEXT(cudaGraphInstantiateWithFlags, instantiate_fn)
TP_PL_NEXT(cudaGraphLaunch, launch_fn)
TP_PL_NEXT(cudaGraphLaunch_ptsz, launch_fn)
TP_PL_NEXT(cudaGraphExecDestroy, exec_destroy_fn)
TP_PL_NEXT(cudaGraphDestroy, graph_destroy_fn)
TP_PL_NEXT(cudaDeviceGraphMemTrim, trim_fn)
TP_PL_NEXT(cudaDeviceGetGraphMemAttribute, mem_attr_fn)
TP_PL_NEXT(cudaDeviceSetGraphMemAttribute, mem_attr_fn)

/* The real call's result, or that the runtime lacks it. */
#define REAL(name, args)                                                       \
  (next_##name() ? TP_PL_THROUGH_RUNTIME(next_##name(), args)                  \
                 : TP_PL_NO_RUNTIME)

/* Whether tidepool captures: the host mode, once decided. */
static bool host_captures(void) {
  return tp__pl_host_requested() && tp__pl_active();
}

/* Enters tidepool and answers `call`, a tp_error_t expression. */
#define HOST_ANSWER(call)                                                      \
  do {                                                                         \
    cudaError_t enter_rc_ = tp__pl_enter(true);                                \
    if (enter_rc_ != cudaSuccess)                                              \
      return enter_rc_;                                                        \
    return tp__pl_fail(call);                                                  \
  } while (0)

/* ---- capture ----------------------------------------------------------------
 */

static cudaError_t begin(cudaStream_t stream, enum cudaStreamCaptureMode mode,
                         bool per_thread) {
  HOST_ANSWER(tp_stream_begin_capture(tp__pl_stream(stream, per_thread),
                                      (tp_capture_mode_t)mode));
}

/* With a GPU the runtime's begins and ends are counted here for tidepool
 * (common/seen.h) as well as at the driver's entry points they reach
 * (driver_graph.c): a runtime that reached the driver otherwise is counted
 * all the same, and one counted twice is taken out twice. The id of the
 * capture `stream` is in, 0 where none or unknown; *capturing whether it
 * captures, true where the runtime cannot say; false where the question
 * failed (a bad handle: the runtime's last error is the call's own). */
static bool capture_id(cudaStream_t stream, bool per_thread, bool *capturing,
                       unsigned long long *id) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  *id = 0;
  *capturing = true;
  if (stream == cudaStreamLegacy || (!per_thread && stream == NULL))
    return false; /* never captures, and asking could cost another's */
  if (per_thread && stream == NULL)
    stream = cudaStreamPerThread;
  cudaError_t r = REAL(cudaStreamGetCaptureInfo,
                       (stream, &status, id, NULL, NULL, NULL, NULL));
  *capturing = r != cudaSuccess || status != cudaStreamCaptureStatusNone;
  if (r != cudaSuccess || status == cudaStreamCaptureStatusNone)
    *id = 0;
  return r == cudaSuccess;
}

/* After a begin made under the capture lock: its id, asked before any
 * other end or begin can come, then the lock given back. */
static cudaError_t begun(cudaError_t r, cudaStream_t stream, bool per_thread) {
  bool capturing;
  unsigned long long id = 0;
  if (r == cudaSuccess)
    (void)capture_id(stream, per_thread, &capturing, &id);
  tp__seen_capture_unlock();
  tp__seen_began(r == cudaSuccess, tp__pl_capture_key(stream, per_thread), id,
                 tp__pl_capture_key_one(stream, per_thread));
  return r;
}

TP_PL_EXPORT cudaError_t
cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (host_captures())
    return begin(stream, mode, false);
  tp__seen_begin();
  tp__seen_capture_lock();
  return begun(REAL(cudaStreamBeginCapture, (stream, mode)), stream, false);
}

TP_PL_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(
    cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (host_captures())
    return begin(stream, mode, true);
  tp__seen_begin();
  tp__seen_capture_lock();
  return begun(REAL(cudaStreamBeginCapture_ptsz, (stream, mode)), stream, true);
}

/* tidepool's host mode has no capture into an existing graph. */
static cudaError_t begin_to_graph(cudaStream_t stream, cudaGraph_t graph,
                                  const cudaGraphNode_t *deps,
                                  const cudaGraphEdgeData *edges, size_t n,
                                  enum cudaStreamCaptureMode mode,
                                  bool per_thread) {
  if (host_captures())
    return tp__pl_fail(TP_ERROR_NOT_SUPPORTED);
  tp__seen_begin();
  tp__seen_capture_lock();
  cudaError_t r = per_thread ? REAL(cudaStreamBeginCaptureToGraph_ptsz,
                                    (stream, graph, deps, edges, n, mode))
                             : REAL(cudaStreamBeginCaptureToGraph,
                                    (stream, graph, deps, edges, n, mode));
  return begun(r, stream, per_thread);
}

TP_PL_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *deps,
    const cudaGraphEdgeData *edges, size_t n, enum cudaStreamCaptureMode mode) {
  return begin_to_graph(stream, graph, deps, edges, n, mode, false);
}

TP_PL_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(
    cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *deps,
    const cudaGraphEdgeData *edges, size_t n, enum cudaStreamCaptureMode mode) {
  return begin_to_graph(stream, graph, deps, edges, n, mode, true);
}

/* The runtime's end, and the count told whether the stream is still in the
 * capture it was in (asked only of a stream the runtime could answer
 * about before). */
static cudaError_t end_counted(cudaStream_t stream, cudaGraph_t *graph,
                               bool per_thread) {
  bool capturing;
  unsigned long long before = 0, after = 0;
  tp__seen_capture_lock();
  bool asked = capture_id(stream, per_thread, &capturing, &before);
  cudaError_t r = per_thread ? REAL(cudaStreamEndCapture_ptsz, (stream, graph))
                             : REAL(cudaStreamEndCapture, (stream, graph));
  /* The driver tells no id of an invalidated capture, before or after. */
  bool tell = asked || r == cudaErrorStreamCaptureInvalidated;
  if (tell)
    (void)capture_id(stream, per_thread, &capturing, &after);
  tp__seen_capture_unlock();
  /* Called also with nothing to tell of its own (a stream still counted
   * as capturing), for what the driver's end inside this one kept. */
  tp__pl_capture_ended(tp__pl_capture_key(stream, per_thread), before,
                       tell ? capturing : true, r);
  return r;
}

static cudaError_t end(cudaStream_t stream, cudaGraph_t *graph,
                       bool per_thread) {
  tp_graph_t made = NULL;
  if (!graph)
    return tp__pl_fail(TP_ERROR_INVALID_VALUE);
  cudaError_t r = tp__pl_enter(true);
  if (r != cudaSuccess)
    return r;
  tp_error_t err =
      tp_stream_end_capture(tp__pl_stream(stream, per_thread), &made);
  *graph = (cudaGraph_t)made;
  return tp__pl_fail(err);
}

TP_PL_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream,
                                              cudaGraph_t *graph) {
  if (host_captures())
    return end(stream, graph, false);
  return end_counted(stream, graph, false);
}

TP_PL_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream,
                                                   cudaGraph_t *graph) {
  if (host_captures())
    return end(stream, graph, true);
  return end_counted(stream, graph, true);
}

static cudaError_t is_capturing(cudaStream_t stream,
                                enum cudaStreamCaptureStatus *status,
                                bool per_thread) {
  tp_capture_status_t st = TP_CAPTURE_STATUS_NONE;
  if (!status)
    return tp__pl_fail(TP_ERROR_INVALID_VALUE);
  cudaError_t r = tp__pl_enter(true);
  if (r != cudaSuccess)
    return r;
  tp_error_t err =
      tp_stream_is_capturing(tp__pl_stream(stream, per_thread), &st);
  if (err == TP_SUCCESS)
    *status = (enum cudaStreamCaptureStatus)st;
  return tp__pl_fail(err);
}

TP_PL_EXPORT cudaError_t cudaStreamIsCapturing(
    cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  if (host_captures())
    return is_capturing(stream, status, false);
  return REAL(cudaStreamIsCapturing, (stream, status));
}

TP_PL_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(
    cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  if (host_captures())
    return is_capturing(stream, status, true);
  return REAL(cudaStreamIsCapturing_ptsz, (stream, status));
}

/* ---- graphs and execs -------------------------------------------------------
 */

/* With a GPU: tidepool adopts the exec the runtime made of `graph`, which
 * it refuses quietly for a graph it did not allocate in. A graph whose
 * memory already has an exec gets no second one, as a graph with memory
 * nodes gets none from CUDA: the runtime's exec goes, and the
 * instantiation fails. Returns what the application is answered. */
static cudaError_t adopt(cudaGraphExec_t *exec, cudaGraph_t graph,
                         unsigned long long flags) {
  tp_graph_exec_t x = NULL;
  int ours = 0;
  if (!*exec || !tp__pl_active() || tp__pl_enter(false) != cudaSuccess)
    return cudaSuccess;
  tp_error_t err = tp_graph_exec_adopt(&x, *exec, graph, flags);
  if (err == TP_SUCCESS || tp_graph_adoptable(graph, &ours) != TP_SUCCESS ||
      !ours)
    return cudaSuccess;
  (void)REAL(cudaGraphExecDestroy, (*exec));
  *exec = NULL;
  return tp__pl_fail(err);
}

/* The adopted exec of the runtime's `exec`, or NULL. */
static tp_graph_exec_t adopted(cudaGraphExec_t exec) {
  tp_graph_exec_t x = NULL;
  if (tp__pl_on())
    (void)tp_graph_exec_find(&x, exec);
  return x;
}

static cudaError_t instantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                               unsigned long long flags) {
  tp_graph_exec_t made = NULL;
  if (!exec)
    return tp__pl_fail(TP_ERROR_INVALID_VALUE);
  cudaError_t r = tp__pl_enter(true);
  if (r != cudaSuccess)
    return r;
  tp_error_t err = tp_graph_instantiate(&made, (tp_graph_t)graph, flags);
  *exec = (cudaGraphExec_t)made;
  return tp__pl_fail(err);
}

TP_PL_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec,
                                              cudaGraph_t graph,
                                              unsigned long long flags) {
  if (host_captures())
    return instantiate(exec, graph, flags);
  cudaError_t r = REAL(cudaGraphInstantiate, (exec, graph, flags));
  return r == cudaSuccess ? adopt(exec, graph, flags) : r;
}

TP_PL_EXPORT cudaError_t cudaGraphInstantiateWithFlags(
    cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  if (host_captures())
    return instantiate(exec, graph, flags);
  cudaError_t r = REAL(cudaGraphInstantiateWithFlags, (exec, graph, flags));
  return r == cudaSuccess ? adopt(exec, graph, flags) : r;
}

TP_PL_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec,
                                         cudaStream_t stream) {
  if (host_captures())
    HOST_ANSWER(
        tp_graph_launch((tp_graph_exec_t)exec, tp__pl_stream(stream, false)));
  tp_graph_exec_t x = adopted(exec);
  if (x)
    HOST_ANSWER(tp_graph_launch(x, tp__pl_stream(stream, false)));
  return REAL(cudaGraphLaunch, (exec, stream));
}

TP_PL_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t exec,
                                              cudaStream_t stream) {
  if (host_captures())
    HOST_ANSWER(
        tp_graph_launch((tp_graph_exec_t)exec, tp__pl_stream(stream, true)));
  tp_graph_exec_t x = adopted(exec);
  if (x)
    HOST_ANSWER(tp_graph_launch(x, tp__pl_stream(stream, true)));
  return REAL(cudaGraphLaunch_ptsz, (exec, stream));
}

TP_PL_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (host_captures())
    HOST_ANSWER(tp_graph_exec_destroy((tp_graph_exec_t)exec));
  tp_graph_exec_t x = adopted(exec);
  if (x)
    (void)tp_graph_exec_destroy(x);
  return REAL(cudaGraphExecDestroy, (exec));
}

TP_PL_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (host_captures())
    HOST_ANSWER(tp_graph_destroy((tp_graph_t)graph));
  if (graph && tp__pl_on())
    (void)tp_graph_forget(graph);
  return REAL(cudaGraphDestroy, (graph));
}

/* ---- graph memory -----------------------------------------------------------
 * While tidepool answers, a device's graph memory is the driver's (graphs
 * of pools tidepool did not make) and tidepool's: the attributes are the
 * sums of both (a high, the sum of the two highs), and trim and resets act
 * on both. The runtime answers first; in the host mode, where it has no
 * graph memory to speak of, tidepool alone. */

static bool graph_mem_ours(void) {
  return tp__pl_on() && tp__pl_enter(false) == cudaSuccess;
}

TP_PL_EXPORT cudaError_t cudaDeviceGraphMemTrim(int device) {
  cudaError_t r = tp__pl_host_requested()
                      ? cudaSuccess
                      : REAL(cudaDeviceGraphMemTrim, (device));
  if (r != cudaSuccess || !graph_mem_ours())
    return r;
  return tp__pl_fail(tp_device_graph_mem_trim(device));
}

TP_PL_EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(
    int device, enum cudaGraphMemAttributeType attr, void *value) {
  /* The runtime answers a NULL value itself (CUDA's INVALID_VALUE), also
   * when tidepool stays out: the sum below needs a place of its own. */
  if (!value)
    return tp__pl_host_requested()
               ? tp__pl_fail(TP_ERROR_INVALID_VALUE)
               : REAL(cudaDeviceGetGraphMemAttribute, (device, attr, NULL));
  uint64_t theirs = 0;
  cudaError_t r = tp__pl_host_requested() ? cudaSuccess
                                          : REAL(cudaDeviceGetGraphMemAttribute,
                                                 (device, attr, &theirs));
  if (r != cudaSuccess || !graph_mem_ours()) {
    if (r == cudaSuccess)
      *(uint64_t *)value = theirs;
    return r;
  }
  uint64_t ours = 0;
  tp_error_t err = tp_device_get_graph_mem_attribute(
      device, (tp_graph_mem_attr_t)attr, &ours);
  if (err == TP_SUCCESS)
    *(uint64_t *)value = theirs + ours;
  return tp__pl_fail(err);
}

TP_PL_EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(
    int device, enum cudaGraphMemAttributeType attr, void *value) {
  cudaError_t r = tp__pl_host_requested() ? cudaSuccess
                                          : REAL(cudaDeviceSetGraphMemAttribute,
                                                 (device, attr, value));
  if (r != cudaSuccess || !graph_mem_ours())
    return r;
  return tp__pl_fail(tp_device_set_graph_mem_attribute(
      device, (tp_graph_mem_attr_t)attr, value));
}
