/* edge_answers: what the CUDA runtime answers to edge cases of the
 * stream-ordered allocator that test/conformance/driver_answers.txt does not
 * cover (pool handle types, allocator calls during a capture, null and
 * out-of-range handles, what a synchronize releases). One row per call, "label -> error name", as in that
 * file. Run it natively, then under tidepool-run, and compare the two:
 *
 *   nvcc -O2 -cudart shared bench/edge_answers.cu -o edge_answers
 *   ./edge_answers >native.txt
 *   build/tidepool-run ./edge_answers >tidepool.txt
 *   diff native.txt tidepool.txt
 *
 * Each capture case uses streams of its own, so that a case the runtime
 * invalidates leaves the next untouched. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void row(const char *label, cudaError_t err) {
  printf("%-58s -> %s\n", label, cudaGetErrorName(err));
  (void)
      cudaGetLastError(); /* a sticky-free error must not leak into the next */
}

static cudaMemPoolProps device_props(int handles) {
  cudaMemPoolProps p;
  memset(&p, 0, sizeof p);
  p.allocType = cudaMemAllocationTypePinned;
  p.location.type = cudaMemLocationTypeDevice;
  p.location.id = 0;
  p.handleTypes = (cudaMemAllocationHandleType)handles;
  return p;
}

static void pool_create_case(const char *label, int handles) {
  cudaMemPoolProps p = device_props(handles);
  cudaMemPool_t pool = NULL;
  cudaError_t err = cudaMemPoolCreate(&pool, &p);
  row(label, err);
  if (err == cudaSuccess)
    cudaMemPoolDestroy(pool);
}

static const char *status_name(cudaStreamCaptureStatus s) {
  return s == cudaStreamCaptureStatusNone     ? "none"
         : s == cudaStreamCaptureStatusActive ? "active"
                                              : "invalidated";
}

static void status_row(const char *label, cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(s, &st);
  printf("   %s: %s (%s)\n", label, status_name(st), cudaGetErrorName(err));
  (void)cudaGetLastError();
}

/* Ends the capture on `s` (whatever state it is in) and prints the answer;
 * a graph made is destroyed. */
static void end_row(const char *label, cudaStream_t s) {
  cudaGraph_t g = NULL;
  row(label, cudaStreamEndCapture(s, &g));
  printf("   graph %s\n", g ? "made" : "none");
  if (g)
    cudaGraphDestroy(g);
}

/* One call made while a stream of its own captures in `mode`: the call's
 * answer, the capture's state after it, and how the capture ends. */
template <class Call>
static void in_capture(const char *label, cudaStreamCaptureMode mode,
                       Call call) {
  cudaStream_t a;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamBeginCapture(a, mode);
  row(label, call(a));
  status_row("the capture then", a);
  end_row("end of that capture", a);
  cudaStreamDestroy(a);
}

/* A global capture begun on a new stream *a, and a new stream *b forked
 * from it through `e`. */
static void begin_fork(cudaStream_t *a, cudaStream_t *b, cudaEvent_t e) {
  cudaStreamCreateWithFlags(a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(b, cudaStreamNonBlocking);
  cudaStreamBeginCapture(*a, cudaStreamCaptureModeGlobal);
  cudaEventRecord(e, *a);
  cudaStreamWaitEvent(*b, e, 0);
}

static void capture_cases(void) {
  cudaStream_t a, b;
  cudaEvent_t e;
  void *p = NULL, *q = NULL;
  const cudaStreamCaptureMode global = cudaStreamCaptureModeGlobal,
                              relaxed = cudaStreamCaptureModeRelaxed;

  /* Synchronous allocator calls during a capture. */
  cudaMalloc(&q, 1 << 20);
  in_capture("cudaFree during a global capture", global,
             [&](cudaStream_t) { return cudaFree(q); });
  row("cudaFree of it after the capture", cudaFree(q));
  in_capture("cudaFree(NULL) during a global capture", global,
             [](cudaStream_t) { return cudaFree(NULL); });
  q = NULL;
  in_capture("cudaMalloc during a global capture", global,
             [&](cudaStream_t) { return cudaMalloc(&q, 1 << 20); });
  if (q)
    cudaFree(q);
  cudaMalloc(&q, 1 << 20);
  in_capture("cudaFree during a relaxed capture", relaxed,
             [&](cudaStream_t) { return cudaFree(q); });

  /* A fork that only allocates, and does not join back. */
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  begin_fork(&a, &b, e);
  row("mallocAsync on an unjoined fork", cudaMallocAsync(&p, 1 << 20, b));
  end_row("end with the fork unjoined (alloc only)", a);
  status_row("the fork then", b);
  cudaStreamDestroy(b);
  cudaStreamDestroy(a);

  /* The same fork, allocating and freeing. */
  begin_fork(&a, &b, e);
  cudaMallocAsync(&p, 1 << 20, b);
  row("freeAsync on an unjoined fork", cudaFreeAsync(p, b));
  end_row("end with the fork unjoined (alloc and free)", a);
  cudaStreamDestroy(b);
  cudaStreamDestroy(a);

  /* Calls that wait, on a capturing stream. */
  in_capture("cudaStreamQuery of a capturing stream", relaxed,
             [](cudaStream_t s) { return cudaStreamQuery(s); });
  in_capture("cudaStreamSynchronize of a capturing stream", relaxed,
             [](cudaStream_t s) { return cudaStreamSynchronize(s); });
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed);
  cudaEventRecord(e, a);
  row("cudaEventQuery of an event recorded in a capture", cudaEventQuery(e));
  row("cudaEventSynchronize of that event", cudaEventSynchronize(e));
  status_row("the capture then", a);
  end_row("end of that capture", a);
  cudaStreamDestroy(a);

  /* Pool calls during a global capture. */
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
  row("cudaMemPoolTrimTo during a global capture", cudaMemPoolTrimTo(pool, 0));
  uint64_t v = 0;
  row("get ReservedMemCurrent during a global capture",
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
  p = (void *)1;
  row("mallocAsync size 0 in a capture", cudaMallocAsync(&p, 0, a));
  printf("   ptr after size 0 = %s\n", p ? "not NULL" : "(nil)");
  row("cudaDeviceSynchronize during a global capture", cudaDeviceSynchronize());
  status_row("the capture then", a);
  end_row("end of that capture", a);
  cudaStreamDestroy(a);

  /* A capturing stream destroyed. */
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed);
  cudaMallocAsync(&p, 1 << 20, a);
  row("cudaStreamDestroy of a capturing stream", cudaStreamDestroy(a));
  cudaEventDestroy(e);
  row("cudaDeviceSynchronize after it", cudaDeviceSynchronize());
}

static void handle_cases(void) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMemPool_t pool = NULL, got = NULL;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  void *p = NULL;
  uint64_t v = 0;
  row("mallocFromPoolAsync NULL pool",
      cudaMallocFromPoolAsync(&p, 64, (cudaMemPool_t)NULL, s));
  row("set ReleaseThreshold on a NULL pool",
      cudaMemPoolSetAttribute(NULL, cudaMemPoolAttrReleaseThreshold, &v));
  row("get ReleaseThreshold of a NULL pool",
      cudaMemPoolGetAttribute(NULL, cudaMemPoolAttrReleaseThreshold, &v));
  row("trimTo NULL pool", cudaMemPoolTrimTo(NULL, 0));
  row("destroy NULL pool", cudaMemPoolDestroy(NULL));
  row("getMemPool device 99", cudaDeviceGetMemPool(&got, 99));
  row("getMemPool device -1", cudaDeviceGetMemPool(&got, -1));
  row("getDefaultMemPool device 99", cudaDeviceGetDefaultMemPool(&got, 99));
  row("setMemPool device 99", cudaDeviceSetMemPool(99, pool));
  row("setMemPool NULL pool", cudaDeviceSetMemPool(0, NULL));
  row("getMemPool NULL out", cudaDeviceGetMemPool(NULL, 0));
  cudaMemLocation loc = {cudaMemLocationTypeDevice, 99};
  cudaMemAccessFlags flags;
  row("getAccess device 99", cudaMemPoolGetAccess(&flags, pool, &loc));
  loc.id = 0;
  /* The driver faults on a NULL flags or location here, and on a NULL
   * list for setAccess (H200, driver 580): no rows for them. */
  cudaMemAccessDesc d;
  d.location = loc;
  d.flags = cudaMemAccessFlagsProtReadWrite;
  row("setAccess count 0", cudaMemPoolSetAccess(pool, &d, 0));
  d.flags = (cudaMemAccessFlags)7;
  row("setAccess flags 7", cudaMemPoolSetAccess(pool, &d, 1));
  d.flags = cudaMemAccessFlagsProtRead;
  row("setAccess own device read-only", cudaMemPoolSetAccess(pool, &d, 1));
  cudaMemPoolPtrExportData data;
  memset(&data, 0, sizeof data);
  row("exportPointer NULL", cudaMemPoolExportPointer(&data, NULL));
  row("importPointer NULL pool", cudaMemPoolImportPointer(&p, NULL, &data));

  cudaMemPoolProps props = device_props(cudaMemHandleTypePosixFileDescriptor);
  cudaMemPool_t ipc = NULL;
  if (cudaMemPoolCreate(&ipc, &props) == cudaSuccess) {
    int fd = -1;
    row("export handle type none",
        cudaMemPoolExportToShareableHandle(&fd, ipc, cudaMemHandleTypeNone, 0));
    row("export handle type win32", cudaMemPoolExportToShareableHandle(
                                        &fd, ipc, cudaMemHandleTypeWin32, 0));
    row("export NULL handle out",
        cudaMemPoolExportToShareableHandle(
            NULL, ipc, cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemPool_t imp = NULL;
    row("import fd -1", cudaMemPoolImportFromShareableHandle(
                            &imp, (void *)(intptr_t)-1,
                            cudaMemHandleTypePosixFileDescriptor, 0));
    row("import fd 0 (stdin)", cudaMemPoolImportFromShareableHandle(
                                   &imp, (void *)(intptr_t)0,
                                   cudaMemHandleTypePosixFileDescriptor, 0));
    void *a = NULL;
    cudaMallocFromPoolAsync(&a, 4096, ipc, s);
    row("exportPointer interior",
        cudaMemPoolExportPointer(&data, (char *)a + 512));
    row("exportPointer NULL out", cudaMemPoolExportPointer(NULL, a));
    cudaFreeAsync(a, s);
    cudaStreamSynchronize(s);
    row("exportPointer after its free", cudaMemPoolExportPointer(&data, a));
    cudaMemPoolDestroy(ipc);
  }

  props = device_props(0);
  props.location.type = (cudaMemLocationType)99;
  cudaMemPool_t bad = NULL;
  row("pool create location type 99", cudaMemPoolCreate(&bad, &props));
  props = device_props(0);
  props.location.id = -1;
  row("pool create device -1", cudaMemPoolCreate(&bad, &props));
  row("pool create NULL out", cudaMemPoolCreate(NULL, &props));
  cudaStreamDestroy(s);
}

static void CUDART_CB set_flag(void *arg) {
  __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

/* Whether a synchronize releases a free that nothing synchronized: a pool
 * with threshold 0 frees a block on `a`, the host learns that `a` ran past
 * the free only through a host function's flag, and then synchronizes
 * `what` (a stream that never ran anything, an event of it, or the
 * device). Prints the reserved bytes before and after. */
static void release_case(const char *label, size_t size, int what) {
  cudaMemPoolProps p = device_props(0);
  cudaMemPool_t pool = NULL;
  cudaStream_t a = NULL, b = NULL;
  cudaEvent_t e = NULL;
  void *ptr = NULL;
  volatile int flag = 0;
  if (cudaMemPoolCreate(&pool, &p) != cudaSuccess ||
      cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreate(&e) != cudaSuccess ||
      cudaMallocFromPoolAsync(&ptr, size, pool, a) != cudaSuccess ||
      cudaFreeAsync(ptr, a) != cudaSuccess ||
      cudaLaunchHostFunc(a, set_flag, (void *)&flag) != cudaSuccess) {
    printf("   %s: setup failed\n", label);
    (void)cudaGetLastError();
    return;
  }
  while (!__atomic_load_n(&flag, __ATOMIC_ACQUIRE))
    ;
  uint64_t before = 0, after = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &before);
  cudaError_t err = what == 0   ? cudaStreamSynchronize(b)
                    : what == 1 ? (cudaEventRecord(e, b), cudaEventSynchronize(e))
                                : cudaDeviceSynchronize();
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &after);
  printf("   %s: %s, reserved %llu -> %llu\n", label, cudaGetErrorName(err),
         (unsigned long long)before, (unsigned long long)after);
  (void)cudaGetLastError();
  cudaStreamSynchronize(a);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaMemPoolDestroy(pool);
}

static void release_cases(void) {
  release_case("256 B freed on a, sync of idle stream b", 256, 0);
  release_case("4 MiB freed on a, sync of idle stream b", 4 << 20, 0);
  release_case("4 MiB freed on a, sync of an event on b", 4 << 20, 1);
  release_case("4 MiB freed on a, device sync", 4 << 20, 2);
}

int main(void) {
  if (cudaSetDevice(0) != cudaSuccess) {
    printf("no device\n");
    return 77;
  }
  cudaFree(NULL);
  pool_create_case("pool create handleTypes 0x10 (unknown)", 0x10);
  pool_create_case("pool create handleTypes posix|0x10", 0x11);
  pool_create_case("pool create handleTypes win32", cudaMemHandleTypeWin32);
  pool_create_case("pool create handleTypes win32 kmt",
                   cudaMemHandleTypeWin32Kmt);
  pool_create_case("pool create handleTypes fabric", cudaMemHandleTypeFabric);
  pool_create_case("pool create handleTypes posix|fabric",
                   cudaMemHandleTypePosixFileDescriptor |
                       cudaMemHandleTypeFabric);
  handle_cases();
  capture_cases();
  release_cases();
  printf("DONE\n");
  return 0;
}
