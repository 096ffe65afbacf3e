/* What the driver's questions about a stream cost, the ones tidepool asks on
 * its allocation and free paths (cuStreamIsCapturing on every call,
 * cuStreamGetId for a stream it did not make) and the ones it avoids there
 * (queries and event records): nanoseconds per call, a million calls each,
 * on an idle non-blocking stream, two rounds. Needs a GPU. */
#include <cuda.h>
#include <stdio.h>

#include "bench_clock.h"
#include "dl_table.h"

static struct {
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*get)(CUcontext *);
  CUresult (*stream_create)(CUstream *, unsigned);
  CUresult (*sync)(CUstream);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*get_id)(CUstream, unsigned long long *);
  CUresult (*get_flags)(CUstream, unsigned *);
  CUresult (*get_ctx)(CUstream, CUcontext *);
  CUresult (*capture_info)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                           CUgraph *, const CUgraphNode **, size_t *);
  CUresult (*exchange_mode)(CUstreamCaptureMode *);
  CUresult (*query)(CUstream);
  CUresult (*event_create)(CUevent *, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_query)(CUevent);
} cu;

#define CALLS 1000000
#define TIME(name, call)                                                       \
  do {                                                                         \
    double t0 = bench_now_ns();                                                \
    for (int i = 0; i < CALLS; i++)                                            \
      (void)(call);                                                            \
    printf("  %-40s %8.1f ns\n", name, (bench_now_ns() - t0) / CALLS);         \
  } while (0)

int main(void) {
  const dl_sym syms[] = {
      {&cu.init, "cuInit"},
      {&cu.retain, "cuDevicePrimaryCtxRetain"},
      {&cu.set, "cuCtxSetCurrent"},
      {&cu.get, "cuCtxGetCurrent"},
      {&cu.stream_create, "cuStreamCreate"},
      {&cu.sync, "cuStreamSynchronize"},
      {&cu.is_capturing, "cuStreamIsCapturing"},
      {&cu.get_id, "cuStreamGetId"},
      {&cu.get_flags, "cuStreamGetFlags"},
      {&cu.get_ctx, "cuStreamGetCtx"},
      {&cu.capture_info, "cuStreamGetCaptureInfo_v2"},
      {&cu.exchange_mode, "cuThreadExchangeStreamCaptureMode"},
      {&cu.query, "cuStreamQuery"},
      {&cu.event_create, "cuEventCreate"},
      {&cu.event_record, "cuEventRecord"},
      {&cu.event_query, "cuEventQuery"}};
  CUcontext ctx;
  if (dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ||
      cu.init(0) != CUDA_SUCCESS || cu.retain(&ctx, 0) != CUDA_SUCCESS ||
      cu.set(ctx) != CUDA_SUCCESS) {
    printf("cu_call_cost: no CUDA driver here; nothing measured\n");
    return 0;
  }
  CUstream s, b;
  CUevent ev;
  if (cu.stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      cu.stream_create(&b, CU_STREAM_DEFAULT) != CUDA_SUCCESS ||
      cu.event_create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      cu.event_record(ev, s) != CUDA_SUCCESS || cu.sync(s) != CUDA_SUCCESS) {
    printf("cu_call_cost: could not make a stream and an event\n");
    return 1;
  }
  CUstreamCaptureStatus st;
  unsigned long long id;
  unsigned flags;
  CUcontext c;
  cuuint64_t cid;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  for (int round = 1; round <= 2; round++) {
    printf("round %d\n", round);
    TIME("cuStreamIsCapturing", cu.is_capturing(s, &st));
    /* PyTorch allocates on the legacy default stream, whose answer covers
     * the context's blocking streams. */
    TIME("cuStreamIsCapturing (CU_STREAM_LEGACY)",
         cu.is_capturing(CU_STREAM_LEGACY, &st));
    TIME("cuStreamIsCapturing (NULL)", cu.is_capturing(NULL, &st));
    TIME("cuStreamIsCapturing (blocking stream)", cu.is_capturing(b, &st));
    TIME("cuStreamGetId", cu.get_id(s, &id));
    TIME("cuStreamGetFlags", cu.get_flags(s, &flags));
    TIME("cuStreamGetCtx", cu.get_ctx(s, &c));
    TIME("cuCtxGetCurrent", cu.get(&c));
    TIME("cuStreamGetCaptureInfo",
         cu.capture_info(s, &st, &cid, NULL, NULL, NULL));
    TIME("cuThreadExchangeStreamCaptureMode x2",
         (cu.exchange_mode(&mode), cu.exchange_mode(&mode)));
    TIME("cuStreamQuery (idle stream)", cu.query(s));
    TIME("cuEventQuery (completed event)", cu.event_query(ev));
    TIME("cuEventRecord", cu.event_record(ev, s));
    (void)cu.sync(s);
  }
  return 0;
}
