/* Which driver calls on a stream outlive another thread's captures beginning
 * and ending on that stream: for each call, a child process makes one
 * thread call it on the stream in a loop while the main thread begins a
 * relaxed capture, queues a memset, ends the capture and destroys its graph,
 * N times over. A child that dies by a signal is reported as crashed.
 * Usage: capture_race [captures, default 5000] [rounds, default 3]. Needs a
 * GPU (or the fake driver of test/fake_cuda). */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dl_table.h"

static struct {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*stream_create)(CUstream *, unsigned);
  CUresult (*stream_sync)(CUstream);
  CUresult (*query)(CUstream);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*capture_info)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                           CUgraph *, const CUgraphNode **,
                           const CUgraphEdgeData **, size_t *);
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*graph_create)(CUgraph *, unsigned);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*launch)(CUgraphExec, CUstream);
  CUresult (*event_create)(CUevent *, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*wait_event)(CUstream, CUevent, unsigned);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*memset)(CUdeviceptr, unsigned char, size_t, CUstream);
} cu;

static int load(void) {
  const dl_sym syms[] = {{&cu.init, "cuInit"},
                         {&cu.device_get, "cuDeviceGet"},
                         {&cu.retain, "cuDevicePrimaryCtxRetain"},
                         {&cu.set, "cuCtxSetCurrent"},
                         {&cu.stream_create, "cuStreamCreate"},
                         {&cu.stream_sync, "cuStreamSynchronize"},
                         {&cu.query, "cuStreamQuery"},
                         {&cu.is_capturing, "cuStreamIsCapturing"},
                         {&cu.capture_info, "cuStreamGetCaptureInfo_v3"},
                         {&cu.begin, "cuStreamBeginCapture_v2"},
                         {&cu.end, "cuStreamEndCapture"},
                         {&cu.graph_create, "cuGraphCreate"},
                         {&cu.graph_destroy, "cuGraphDestroy"},
                         {&cu.instantiate, "cuGraphInstantiateWithFlags"},
                         {&cu.launch, "cuGraphLaunch"},
                         {&cu.event_create, "cuEventCreate"},
                         {&cu.event_record, "cuEventRecord"},
                         {&cu.wait_event, "cuStreamWaitEvent"},
                         {&cu.mem_alloc, "cuMemAlloc_v2"},
                         {&cu.memset, "cuMemsetD8Async"}};
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

enum { QUERY, LAUNCH, CAPTURE_INFO, IS_CAPTURING, RECORD, WAIT, NCALLS };
static const char *const call_names[NCALLS] = {
    "cuStreamQuery",          "cuGraphLaunch (empty graph)",
    "cuStreamGetCaptureInfo", "cuStreamIsCapturing",
    "cuEventRecord",          "cuStreamWaitEvent"};

static CUstream stream;
static CUgraphExec empty;
static CUevent event;
static atomic_int stop, started;
static int call;
static long answers[1024]; /* the caller's answers, by CUresult */

static void *caller(void *arg) {
  (void)arg;
  atomic_store(&started, 1);
  while (!atomic_load(&stop)) {
    CUstreamCaptureStatus st;
    cuuint64_t id;
    CUresult r = CUDA_SUCCESS;
    switch (call) {
    case QUERY: r = cu.query(stream); break;
    case LAUNCH: r = cu.launch(empty, stream); break;
    case CAPTURE_INFO:
      r = cu.capture_info(stream, &st, &id, NULL, NULL, NULL, NULL);
      break;
    case IS_CAPTURING: r = cu.is_capturing(stream, &st); break;
    case RECORD: r = cu.event_record(event, stream); break;
    case WAIT: r = cu.wait_event(stream, event, 0); break;
    }
    answers[(unsigned)r < 1024 ? r : 1023]++;
  }
  return NULL;
}

static void print_counts(const char *what, const long *v) {
  printf(" %s:", what);
  for (int k = 0; k < 1024; k++)
    if (v[k])
      printf(" %d x%ld", k, v[k]);
}

/* The child: one round of `n` captures against the caller thread. */
static int round_in_child(int n) {
  CUdevice dev;
  CUcontext ctx;
  CUgraph g;
  CUdeviceptr buf;
  if (cu.init(0) || cu.device_get(&dev, 0) || cu.retain(&ctx, dev) ||
      cu.set(ctx) || cu.stream_create(&stream, CU_STREAM_NON_BLOCKING) ||
      cu.graph_create(&g, 0) || cu.instantiate(&empty, g, 0) ||
      cu.event_create(&event, CU_EVENT_DISABLE_TIMING) ||
      cu.event_record(event, stream) || cu.mem_alloc(&buf, 4096) ||
      cu.stream_sync(stream)) {
    printf("  setup failed\n");
    return 2;
  }
  pthread_t t;
  if (pthread_create(&t, NULL, caller, NULL) != 0)
    return 2;
  static long ends[1024];
  while (!atomic_load(&started))
    sched_yield();
  for (int i = 0; i < n; i++) {
    if (cu.begin(stream, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) {
      ends[1023]++;
      continue;
    }
    (void)cu.memset(buf, 0, 64, stream);
    CUgraph captured = NULL;
    CUresult r = cu.end(stream, &captured);
    ends[(unsigned)r < 1024 ? r : 1023]++;
    if (captured)
      (void)cu.graph_destroy(captured);
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  printf("  %-28s lived;", call_names[call]);
  print_counts("ends", ends);
  print_counts("; its answers", answers);
  printf("\n");
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 5000;
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  if (load() != 0) {
    printf("capture_race: no CUDA driver here\n");
    return 0;
  }
  printf("%d relaxed captures a round on one stream, another thread calling "
         "on it throughout\n",
         n);
  fflush(stdout);
  for (call = 0; call < NCALLS; call++) {
    for (int r = 0; r < rounds; r++) {
      pid_t pid = fork();
      if (pid < 0)
        return 1;
      if (pid == 0) {
        int rc = round_in_child(n);
        fflush(stdout);
        _exit(rc);
      }
      int status = 0;
      if (waitpid(pid, &status, 0) < 0)
        return 1;
      if (WIFSIGNALED(status))
        printf("  %-28s crashed (signal %d) in round %d\n", call_names[call],
               WTERMSIG(status), r + 1);
      fflush(stdout);
    }
  }
  return 0;
}
