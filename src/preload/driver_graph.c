/* The driver's stream capture, graph and graph memory calls, as graph.c
 * does for the runtime's: with TIDEPOOL_PRELOAD=host the streams are
 * tidepool's, so tidepool captures them, and its graphs are handed out as
 * the driver's handles (cuStreamIsCapturing is handed out only then).
 * With a GPU the driver captures, and tidepool's capture path follows it,
 * counting the captures under way;
 * the driver instantiates and launches too, but each exec is adopted as it
 * is made (tp_graph_exec_adopt), so that tidepool books the launches of
 * the graphs it allocated in. */
#include "common/seen.h"
#include "driver.h"
#include "graph/graph_mem.h"

static _Atomic(tp__pl_fn) r_begin, r_begin_ptsz, r_begin_v1, r_begin_v1_ptsz,
    r_begin_to_graph, r_begin_to_graph_ptsz, r_end, r_end_ptsz, r_is_capturing,
    r_is_capturing_ptsz, r_instantiate, r_instantiate_12, r_instantiate_params,
    r_instantiate_params_ptsz, r_launch, r_launch_ptsz, r_exec_destroy,
    r_graph_destroy, r_mem_trim, r_mem_get, r_mem_set;

/* Whether the host mode answers; *err when the call can go nowhere. */
static bool host_answers(CUresult *err) {
  *err = CUDA_SUCCESS;
  return tp__pl_host_requested() &&
         tp__pl_drv_enter(true, err) == TP_PL_DRV_OURS;
}

/* Answers with tidepool's `call` (a tp_error_t expression) in the host
 * mode, else passes the arguments to the driver's function in `slot`. */
#define HOST_OR_DRIVER(call, slot, type, args)                                 \
  do {                                                                         \
    CUresult err_;                                                             \
    if (host_answers(&err_))                                                   \
      return tp__pl_drv_error(call);                                           \
    return err_ != CUDA_SUCCESS ? err_ : TP_PL_DRV_CALL(slot, type, args);     \
  } while (0)

/* ---- capture's begin and end ------------------------------------------------
 * With a GPU the driver captures; every begin and end of the process passes
 * here (the runtime's too, which reaches the driver through
 * cuGetProcAddress), and is counted for tidepool (seen.h) so that its
 * allocations ask the driver nothing about capture while none is under
 * way. The count goes up before the begin reaches the driver, and down once
 * the stream that began a capture is out of it. */

/* After a begin made under the capture lock (BEGIN): its id, asked before
 * any other end or begin can come, then the lock given back. */
static CUresult begun(CUresult r, CUstream stream, bool per_thread) {
  bool capturing = false;
  uint64_t id = r == CUDA_SUCCESS
                    ? tp__pl_drv_capture_id(stream, per_thread, &capturing)
                    : 0;
  tp__seen_capture_unlock();
  tp__seen_began(r == CUDA_SUCCESS, tp__pl_capture_key(stream, per_thread), id,
                 tp__pl_capture_key_one(stream, per_thread));
  return r;
}

/* A begin: tidepool's in the host mode, else the driver's `call`,
 * counted. */
#define BEGIN(host_call, stream, per_thread, call)                             \
  do {                                                                         \
    CUresult err_;                                                             \
    if (host_answers(&err_))                                                   \
      return tp__pl_drv_error(host_call);                                      \
    if (err_ != CUDA_SUCCESS)                                                  \
      return err_;                                                             \
    tp__seen_begin();                                                          \
    tp__seen_capture_lock();                                                   \
    return begun((call), (stream), (per_thread));                              \
  } while (0)

static CUresult begin(CUstream stream, CUstreamCaptureMode mode) {
  BEGIN(
      tp_stream_begin_capture(tp__pl_stream(stream, false),
                              (tp_capture_mode_t)mode),
      stream, false,
      TP_PL_DRV_CALL(r_begin, PFN_cuStreamBeginCapture_v10010, (stream, mode)));
}

static CUresult begin_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  BEGIN(tp_stream_begin_capture(tp__pl_stream(stream, true),
                                (tp_capture_mode_t)mode),
        stream, true,
        TP_PL_DRV_CALL(r_begin_ptsz, PFN_cuStreamBeginCapture_v10010,
                       (stream, mode)));
}

/* The first ABI, without a mode: a global capture. */
typedef CUresult (*begin_v1_fn)(CUstream);

static CUresult begin_v1(CUstream stream) {
  BEGIN(tp_stream_begin_capture(tp__pl_stream(stream, false),
                                TP_CAPTURE_MODE_GLOBAL),
        stream, false, TP_PL_DRV_CALL(r_begin_v1, begin_v1_fn, (stream)));
}

static CUresult begin_v1_ptsz(CUstream stream) {
  BEGIN(tp_stream_begin_capture(tp__pl_stream(stream, true),
                                TP_CAPTURE_MODE_GLOBAL),
        stream, true, TP_PL_DRV_CALL(r_begin_v1_ptsz, begin_v1_fn, (stream)));
}

/* tidepool's host mode has no capture into an existing graph. */
static CUresult begin_to_graph(CUstream stream, CUgraph graph,
                               const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n,
                               CUstreamCaptureMode mode) {
  BEGIN(TP_ERROR_NOT_SUPPORTED, stream, false,
        TP_PL_DRV_CALL(r_begin_to_graph, PFN_cuStreamBeginCaptureToGraph_v12030,
                       (stream, graph, deps, edges, n, mode)));
}

static CUresult begin_to_graph_ptsz(CUstream stream, CUgraph graph,
                                    const CUgraphNode *deps,
                                    const CUgraphEdgeData *edges, size_t n,
                                    CUstreamCaptureMode mode) {
  BEGIN(TP_ERROR_NOT_SUPPORTED, stream, true,
        TP_PL_DRV_CALL(r_begin_to_graph_ptsz,
                       PFN_cuStreamBeginCaptureToGraph_v12030,
                       (stream, graph, deps, edges, n, mode)));
}

static tp_error_t end_capture(CUstream stream, CUgraph *graph,
                              bool per_thread) {
  if (!graph)
    return TP_ERROR_INVALID_VALUE;
  tp_graph_t made = NULL;
  tp_error_t err =
      tp_stream_end_capture(tp__pl_stream(stream, per_thread), &made);
  *graph = (CUgraph)made;
  return err;
}

/* The driver's end, and the count told whether the stream is still in the
 * capture it was in. The legacy stream never captures (its begin fails),
 * and asking about it while another stream captures could cost that
 * capture: it is not asked. */
/* The capture errors have the same numbers in both APIs (an end's result
 * goes to tp__pl_capture_ended as the runtime's). */
_Static_assert((int)CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ==
                       (int)cudaErrorStreamCaptureInvalidated &&
                   (int)CUDA_ERROR_STREAM_CAPTURE_UNJOINED ==
                       (int)cudaErrorStreamCaptureUnjoined &&
                   (int)CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD ==
                       (int)cudaErrorStreamCaptureWrongThread,
               "capture errors differ between the driver and the runtime");

static CUresult end_counted(_Atomic(tp__pl_fn) *slot, CUstream stream,
                            CUgraph *graph, bool per_thread) {
  bool legacy = stream == CU_STREAM_LEGACY || (!per_thread && stream == NULL);
  bool capturing = false;
  tp__seen_capture_lock();
  uint64_t before =
      legacy ? 0 : tp__pl_drv_capture_id(stream, per_thread, &capturing);
  CUresult r =
      TP_PL_DRV_CALL(*slot, PFN_cuStreamEndCapture_v10000, (stream, graph));
  if (!legacy)
    (void)tp__pl_drv_capture_id(stream, per_thread, &capturing);
  tp__seen_capture_unlock();
  if (!legacy) {
    tp__pl_capture_ended(tp__pl_capture_key(stream, per_thread), before,
                         capturing, (cudaError_t)r);
  }
  return r;
}

static CUresult end(CUstream stream, CUgraph *graph) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(end_capture(stream, graph, false));
  return err != CUDA_SUCCESS ? err : end_counted(&r_end, stream, graph, false);
}

static CUresult end_ptsz(CUstream stream, CUgraph *graph) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(end_capture(stream, graph, true));
  return err != CUDA_SUCCESS ? err
                             : end_counted(&r_end_ptsz, stream, graph, true);
}

/* The names a library linked against libcuda calls (driver.h's
 * TP_PL_DRV_NAME): a begin that reaches the driver unseen keeps the count
 * above zero for good. */
#define UNSEEN_BEGIN                                                           \
  "a capture began by a driver name before the driver's table was filled"
TP_PL_EXPORT CUresult CUDAAPI
cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  TP_PL_DRV_NAME(r_begin, begin(hStream, mode), tp__seen_unwatch(UNSEEN_BEGIN),
                 PFN_cuStreamBeginCapture_v10010, "cuStreamBeginCapture_v2",
                 (hStream, mode));
}

TP_PL_EXPORT CUresult CUDAAPI
cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
TP_PL_EXPORT CUresult CUDAAPI
cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  TP_PL_DRV_NAME(r_begin_ptsz, begin_ptsz(hStream, mode),
                 tp__seen_unwatch(UNSEEN_BEGIN),
                 PFN_cuStreamBeginCapture_v10010,
                 "cuStreamBeginCapture_v2_ptsz", (hStream, mode));
}

TP_PL_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(
    CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
    const CUgraphEdgeData *dependencyData, size_t numDependencies,
    CUstreamCaptureMode mode) {
  TP_PL_DRV_NAME(
      r_begin_to_graph,
      begin_to_graph(hStream, hGraph, dependencies, dependencyData,
                     numDependencies, mode),
      tp__seen_unwatch(UNSEEN_BEGIN), PFN_cuStreamBeginCaptureToGraph_v12030,
      "cuStreamBeginCaptureToGraph",
      (hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}

TP_PL_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(
    CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
    const CUgraphEdgeData *dependencyData, size_t numDependencies,
    CUstreamCaptureMode mode);
TP_PL_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(
    CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
    const CUgraphEdgeData *dependencyData, size_t numDependencies,
    CUstreamCaptureMode mode) {
  TP_PL_DRV_NAME(
      r_begin_to_graph_ptsz,
      begin_to_graph_ptsz(hStream, hGraph, dependencies, dependencyData,
                          numDependencies, mode),
      tp__seen_unwatch(UNSEEN_BEGIN), PFN_cuStreamBeginCaptureToGraph_v12030,
      "cuStreamBeginCaptureToGraph_ptsz",
      (hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}

TP_PL_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream,
                                                 CUgraph *phGraph) {
  TP_PL_DRV_NAME(r_end, end(hStream, phGraph), (void)0,
                 PFN_cuStreamEndCapture_v10000, "cuStreamEndCapture",
                 (hStream, phGraph));
}

TP_PL_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream,
                                                      CUgraph *phGraph);
TP_PL_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream,
                                                      CUgraph *phGraph) {
  TP_PL_DRV_NAME(r_end_ptsz, end_ptsz(hStream, phGraph), (void)0,
                 PFN_cuStreamEndCapture_v10000, "cuStreamEndCapture_ptsz",
                 (hStream, phGraph));
}

static tp_error_t capture_status(CUstream stream, CUstreamCaptureStatus *status,
                                 bool per_thread) {
  if (!status)
    return TP_ERROR_INVALID_VALUE;
  tp_capture_status_t st = TP_CAPTURE_STATUS_NONE;
  tp_error_t err =
      tp_stream_is_capturing(tp__pl_stream(stream, per_thread), &st);
  if (err == TP_SUCCESS)
    *status = (CUstreamCaptureStatus)st;
  return err;
}

static CUresult is_capturing(CUstream stream, CUstreamCaptureStatus *status) {
  HOST_OR_DRIVER(capture_status(stream, status, false), r_is_capturing,
                 PFN_cuStreamIsCapturing_v10000, (stream, status));
}

static CUresult is_capturing_ptsz(CUstream stream,
                                  CUstreamCaptureStatus *status) {
  HOST_OR_DRIVER(capture_status(stream, status, true), r_is_capturing_ptsz,
                 PFN_cuStreamIsCapturing_v10000, (stream, status));
}

static tp_error_t instantiate_graph(CUgraphExec *exec, CUgraph graph,
                                    unsigned long long flags) {
  if (!exec)
    return TP_ERROR_INVALID_VALUE;
  tp_graph_exec_t made = NULL;
  tp_error_t err = tp_graph_instantiate(&made, (tp_graph_t)graph, flags);
  *exec = (CUgraphExec)made;
  return err;
}

/* With a GPU: the driver's exec of `graph` is adopted after the driver's
 * `r` succeeded (quietly refused for a graph tidepool did not allocate
 * in). A graph whose memory already has an exec gets no second one, as a
 * graph with memory nodes gets none from the driver: the driver's exec
 * goes, and the instantiation fails. Returns what the caller is answered. */
static CUresult adopt(CUresult r, CUgraphExec *exec, CUgraph graph,
                      unsigned long long flags) {
  CUresult err;
  tp_graph_exec_t x = NULL;
  int ours = 0;
  if (r != CUDA_SUCCESS || !exec || !*exec ||
      tp__pl_drv_enter(false, &err) != TP_PL_DRV_OURS)
    return r;
  tp_error_t terr = tp_graph_exec_adopt(&x, *exec, graph, flags);
  if (terr == TP_SUCCESS || tp_graph_adoptable(graph, &ours) != TP_SUCCESS ||
      !ours)
    return r;
  (void)TP_PL_DRV_CALL(r_exec_destroy, PFN_cuGraphExecDestroy_v10000, (*exec));
  *exec = NULL;
  return tp__pl_drv_error(terr);
}

/* The adopted exec of the driver's `exec`, or NULL. */
static tp_graph_exec_t adopted(CUgraphExec exec) {
  tp_graph_exec_t x = NULL;
  if (tp__pl_on())
    (void)tp_graph_exec_find(&x, exec);
  return x;
}

/* cuGraphInstantiateWithFlags, and cuGraphInstantiate from CUDA 12 on
 * (the same function under another name, in its own slot). */
static CUresult instantiate_in(_Atomic(tp__pl_fn) *slot, CUgraphExec *exec,
                               CUgraph graph, unsigned long long flags) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(instantiate_graph(exec, graph, flags));
  if (err != CUDA_SUCCESS)
    return err;
  CUresult r = TP_PL_DRV_CALL(*slot, PFN_cuGraphInstantiateWithFlags_v11040,
                              (exec, graph, flags));
  return adopt(r, exec, graph, flags);
}

static CUresult instantiate(CUgraphExec *exec, CUgraph graph,
                            unsigned long long flags) {
  return instantiate_in(&r_instantiate, exec, graph, flags);
}

static CUresult instantiate_12(CUgraphExec *exec, CUgraph graph,
                               unsigned long long flags) {
  return instantiate_in(&r_instantiate_12, exec, graph, flags);
}

/* The host mode takes the flags; an upload stream is the driver's. */
static CUresult instantiate_params_in(_Atomic(tp__pl_fn) *slot,
                                      CUgraphExec *exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(params
                                ? instantiate_graph(exec, graph, params->flags)
                                : TP_ERROR_INVALID_VALUE);
  if (err != CUDA_SUCCESS)
    return err;
  CUresult r = TP_PL_DRV_CALL(*slot, PFN_cuGraphInstantiateWithParams_v12000,
                              (exec, graph, params));
  CUresult out = adopt(r, exec, graph, params ? params->flags : 0);
  /* A refusal after the driver's success says so in the result too. */
  if (out != CUDA_SUCCESS && r == CUDA_SUCCESS && params)
    params->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
  return out;
}

static CUresult instantiate_params(CUgraphExec *exec, CUgraph graph,
                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  return instantiate_params_in(&r_instantiate_params, exec, graph, params);
}

static CUresult instantiate_params_ptsz(CUgraphExec *exec, CUgraph graph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  return instantiate_params_in(&r_instantiate_params_ptsz, exec, graph, params);
}

/* An adopted exec is launched by tidepool, which launches the driver's. */
static CUresult launch_in(_Atomic(tp__pl_fn) *slot, CUgraphExec exec,
                          CUstream stream, bool per_thread) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(tp_graph_launch((tp_graph_exec_t)exec,
                                            tp__pl_stream(stream, per_thread)));
  if (err != CUDA_SUCCESS)
    return err;
  tp_graph_exec_t x = adopted(exec);
  if (x && tp__pl_drv_enter(false, &err) == TP_PL_DRV_OURS)
    return tp__pl_drv_error(
        tp_graph_launch(x, tp__pl_stream(stream, per_thread)));
  return TP_PL_DRV_CALL(*slot, PFN_cuGraphLaunch_v10000, (exec, stream));
}

static CUresult launch(CUgraphExec exec, CUstream stream) {
  return launch_in(&r_launch, exec, stream, false);
}

static CUresult launch_ptsz(CUgraphExec exec, CUstream stream) {
  return launch_in(&r_launch_ptsz, exec, stream, true);
}

static CUresult exec_destroy(CUgraphExec exec) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(tp_graph_exec_destroy((tp_graph_exec_t)exec));
  if (err != CUDA_SUCCESS)
    return err;
  tp_graph_exec_t x = adopted(exec);
  if (x)
    (void)tp_graph_exec_destroy(x);
  return TP_PL_DRV_CALL(r_exec_destroy, PFN_cuGraphExecDestroy_v10000, (exec));
}

static CUresult graph_destroy(CUgraph graph) {
  CUresult err;
  if (host_answers(&err))
    return tp__pl_drv_error(tp_graph_destroy((tp_graph_t)graph));
  if (err != CUDA_SUCCESS)
    return err;
  if (graph && tp__pl_on())
    (void)tp_graph_forget(graph);
  return TP_PL_DRV_CALL(r_graph_destroy, PFN_cuGraphDestroy_v10000, (graph));
}

/* ---- graph memory -----------------------------------------------------------
 * As graph.c's runtime names: a device's graph memory is the driver's and
 * tidepool's, the attributes their sums, and trim and resets act on both;
 * in the host mode tidepool's alone. A program built with the static
 * runtime reaches these only here. */

/* The device's ordinal where tidepool answers for it, else -1. */
static int graph_mem_device(CUdevice device) {
  CUresult err;
  if (!tp__pl_on() || tp__pl_drv_enter(false, &err) != TP_PL_DRV_OURS)
    return -1;
  return tp__pl_drv_ordinal(device);
}

static CUresult graph_mem_trim(CUdevice device) {
  CUresult r = tp__pl_host_requested()
                   ? CUDA_SUCCESS
                   : TP_PL_DRV_CALL(r_mem_trim, PFN_cuDeviceGraphMemTrim_v11040,
                                    (device));
  int ordinal = graph_mem_device(device);
  if (r != CUDA_SUCCESS || ordinal < 0)
    return r;
  return tp__pl_drv_error(tp_device_graph_mem_trim(ordinal));
}

static CUresult graph_mem_get(CUdevice device, CUgraphMem_attribute attr,
                              void *value) {
  /* The driver answers a NULL value itself, also where tidepool stays out:
   * the sum below needs a place of its own. */
  if (!value)
    return tp__pl_host_requested()
               ? CUDA_ERROR_INVALID_VALUE
               : TP_PL_DRV_CALL(r_mem_get,
                                PFN_cuDeviceGetGraphMemAttribute_v11040,
                                (device, attr, NULL));
  uint64_t theirs = 0;
  CUresult r =
      tp__pl_host_requested()
          ? CUDA_SUCCESS
          : TP_PL_DRV_CALL(r_mem_get, PFN_cuDeviceGetGraphMemAttribute_v11040,
                           (device, attr, &theirs));
  int ordinal = graph_mem_device(device);
  if (r == CUDA_SUCCESS && ordinal < 0)
    *(uint64_t *)value = theirs;
  if (r != CUDA_SUCCESS || ordinal < 0)
    return r;
  uint64_t ours = 0;
  tp_error_t err = tp_device_get_graph_mem_attribute(
      ordinal, (tp_graph_mem_attr_t)attr, &ours);
  if (err == TP_SUCCESS)
    *(uint64_t *)value = theirs + ours;
  return tp__pl_drv_error(err);
}

static CUresult graph_mem_set(CUdevice device, CUgraphMem_attribute attr,
                              void *value) {
  CUresult r =
      tp__pl_host_requested()
          ? CUDA_SUCCESS
          : TP_PL_DRV_CALL(r_mem_set, PFN_cuDeviceSetGraphMemAttribute_v11040,
                           (device, attr, value));
  int ordinal = graph_mem_device(device);
  if (r != CUDA_SUCCESS || ordinal < 0)
    return r;
  return tp__pl_drv_error(tp_device_set_graph_mem_attribute(
      ordinal, (tp_graph_mem_attr_t)attr, value));
}

/* ---- the entries -------------------------------------------------------- */

#define FN(f) ((tp__pl_fn)(f))

const tp__pl_drv_entry tp__pl_drv_graph_entries[] = {
    /* Handed out with a GPU too: every begin and end is counted. */
    {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", 10010, false, false,
     FN(begin), &r_begin},
    {"cuStreamBeginCapture", "cuStreamBeginCapture_v2_ptsz", 10010, true, false,
     FN(begin_ptsz), &r_begin_ptsz},
    {"cuStreamBeginCapture", "cuStreamBeginCapture", 10000, false, false,
     FN(begin_v1), &r_begin_v1},
    {"cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", 10000, true, false,
     FN(begin_v1_ptsz), &r_begin_v1_ptsz},
    {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph", 12030, false,
     false, FN(begin_to_graph), &r_begin_to_graph},
    {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz", 12030,
     true, false, FN(begin_to_graph_ptsz), &r_begin_to_graph_ptsz},
    {"cuStreamEndCapture", "cuStreamEndCapture", 10000, false, false, FN(end),
     &r_end},
    {"cuStreamEndCapture", "cuStreamEndCapture_ptsz", 10000, true, false,
     FN(end_ptsz), &r_end_ptsz},
    {"cuStreamIsCapturing", "cuStreamIsCapturing", 10000, false, true,
     FN(is_capturing), &r_is_capturing},
    {"cuStreamIsCapturing", "cuStreamIsCapturing_ptsz", 10000, true, true,
     FN(is_capturing_ptsz), &r_is_capturing_ptsz},
    {"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 11040, false,
     false, FN(instantiate), &r_instantiate},
    /* The name, at 12000, is cuGraphInstantiateWithFlags (cuda.h); the
     * symbol cuGraphInstantiate is the old call, which is left alone. */
    {"cuGraphInstantiate", "cuGraphInstantiateWithFlags", 12000, false, false,
     FN(instantiate_12), &r_instantiate_12},
    {"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams", 12000,
     false, false, FN(instantiate_params), &r_instantiate_params},
    {"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz", 12000,
     true, false, FN(instantiate_params_ptsz), &r_instantiate_params_ptsz},
    {"cuGraphLaunch", "cuGraphLaunch", 10000, false, false, FN(launch),
     &r_launch},
    {"cuGraphLaunch", "cuGraphLaunch_ptsz", 10000, true, false, FN(launch_ptsz),
     &r_launch_ptsz},
    {"cuGraphExecDestroy", "cuGraphExecDestroy", 10000, false, false,
     FN(exec_destroy), &r_exec_destroy},
    {"cuGraphDestroy", "cuGraphDestroy", 10000, false, false, FN(graph_destroy),
     &r_graph_destroy},
    {"cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim", 11040, false, false,
     FN(graph_mem_trim), &r_mem_trim},
    {"cuDeviceGetGraphMemAttribute", "cuDeviceGetGraphMemAttribute", 11040,
     false, false, FN(graph_mem_get), &r_mem_get},
    {"cuDeviceSetGraphMemAttribute", "cuDeviceSetGraphMemAttribute", 11040,
     false, false, FN(graph_mem_set), &r_mem_set},
};
const size_t tp__pl_drv_graph_count =
    sizeof tp__pl_drv_graph_entries / sizeof tp__pl_drv_graph_entries[0];
