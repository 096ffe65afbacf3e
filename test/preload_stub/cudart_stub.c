/* A stand-in for the CUDA runtime (built as libcudart.so.13, with the
 * runtime's version node) so that the interposer runs where there is no
 * GPU. Like a real runtime it reaches the driver (here the stand-in
 * libcuda.so.1 of cuda_stub.c) by dlopen, dlsym of cuGetProcAddress_v2 and
 * cuGetProcAddress for each entry point, so that the interposer's
 * driver-level layer sees the calls the runtime-level layer forwards. It
 * keeps the last error per thread, does memset and memcpy on the spot, and
 * counts every call that reaches it, so that a test sees which calls the
 * interposer forwarded. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#define STUB_API __attribute__((visibility("default")))

/* ---- call counts ----------------------------------------------------------
 */

#define MAX_NAMES 64
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *names[MAX_NAMES];
static unsigned long counts[MAX_NAMES];

static void count(const char *name) {
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < MAX_NAMES && names[i] && strcmp(names[i], name) != 0)
    i++;
  if (i < MAX_NAMES) {
    names[i] = name;
    counts[i]++;
  }
  pthread_mutex_unlock(&lock);
}

/* How many times `name` reached the stand-in. */
STUB_API unsigned long cudart_stub_calls(const char *name) {
  unsigned long n = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_NAMES && names[i]; i++)
    if (strcmp(names[i], name) == 0)
      n = counts[i];
  pthread_mutex_unlock(&lock);
  return n;
}

/* What dlsym(RTLD_NEXT, name) answers from inside the runtime: the
 * interposer must keep RTLD_NEXT meaning "after the caller". The answer
 * goes through a volatile so that the call is not a tail call, which would
 * make the caller of this function the one the C library sees. */
STUB_API void *cudart_stub_next(const char *name) {
  void *volatile sym = dlsym(RTLD_NEXT, name);
  return sym;
}

/* ---- the driver -------------------------------------------------------------
 * Every driver function the stand-in calls, fetched at first use with the
 * flags a runtime built for the legacy default stream passes (0), or for
 * the per-thread variants (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */

typedef void (*any_fn)(void);
#define DRIVER(X)                                                              \
  X(cuInit, 2000, 0)                                                           \
  X(cuDeviceGetCount, 2000, 0)                                                 \
  X(cuDeviceGet, 2000, 0)                                                      \
  X(cuDevicePrimaryCtxRetain, 7000, 0)                                         \
  X(cuCtxGetCurrent, 4000, 0)                                                  \
  X(cuCtxSetCurrent, 4000, 0)                                                  \
  X(cuCtxGetDevice, 2000, 0)                                                   \
  X(cuCtxSynchronize, 2000, 0)                                                 \
  X(cuStreamCreate, 2000, 0)                                                   \
  X(cuStreamCreateWithPriority, 5050, 0)                                       \
  X(cuStreamDestroy, 4000, 0)                                                  \
  X(cuStreamSynchronize, 2000, 0)                                              \
  X(cuStreamBeginCapture, 10010, 0)                                            \
  X(cuStreamEndCapture, 10000, 0)                                              \
  X(cuStreamIsCapturing, 10000, 0)                                             \
  X(cuGraphDestroy, 10000, 0)                                                  \
  X(cuGraphInstantiateWithFlags, 11040, 0)                                     \
  X(cuGraphLaunch, 10000, 0)                                                   \
  X(cuGraphExecDestroy, 10000, 0)                                              \
  X(cuEventCreate, 2000, 0)                                                    \
  X(cuEventDestroy, 4000, 0)                                                   \
  X(cuEventRecord, 2000, 0)                                                    \
  X(cuEventRecordWithFlags, 11010, 0)                                          \
  X(cuEventSynchronize, 2000, 0)                                               \
  X(cuStreamWaitEvent, 3020, 0)                                                \
  X(cuLaunchHostFunc, 10000, 0)                                                \
  X(cuMemAlloc, 3020, 0)                                                       \
  X(cuMemFree, 3020, 0)                                                        \
  X(cuMemAllocAsync, 11020, 0)                                                 \
  X(cuMemFreeAsync, 11020, 0)                                                  \
  X(cuMemAllocFromPoolAsync, 11020, 0)                                         \
  X(cuMemPoolCreate, 11020, 0)                                                 \
  X(cuMemPoolDestroy, 11020, 0)                                                \
  X(cuMemPoolGetAttribute, 11020, 0)                                           \
  X(cuMemPoolSetAttribute, 11020, 0)                                           \
  X(cuMemPoolSetAccess, 11020, 0)                                              \
  X(cuMemPoolGetAccess, 11020, 0)                                              \
  X(cuMemPoolTrimTo, 11020, 0)                                                 \
  X(cuMemPoolExportToShareableHandle, 11020, 0)                                \
  X(cuMemPoolImportFromShareableHandle, 11020, 0)                              \
  X(cuMemPoolExportPointer, 11020, 0)                                          \
  X(cuMemPoolImportPointer, 11020, 0)                                          \
  X(cuDeviceGetDefaultMemPool, 11020, 0)                                       \
  X(cuDeviceGetMemPool, 11020, 0)                                              \
  X(cuDeviceSetMemPool, 11020, 0)                                              \
  X(cuMemGetDefaultMemPool, 13000, 0)                                          \
  X(cuMemGetMemPool, 13000, 0)                                                 \
  X(cuMemSetMemPool, 13000, 0)                                                 \
  X(cuStreamSynchronize_ptsz, 7000, 1)                                         \
  X(cuStreamIsCapturing_ptsz, 10000, 1)                                        \
  X(cuEventRecord_ptsz, 7000, 1)                                               \
  X(cuEventRecordWithFlags_ptsz, 11010, 1)                                     \
  X(cuStreamWaitEvent_ptsz, 7000, 1)                                           \
  X(cuLaunchHostFunc_ptsz, 10000, 1)                                           \
  X(cuMemAllocAsync_ptsz, 11020, 1)                                            \
  X(cuMemFreeAsync_ptsz, 11020, 1)                                             \
  X(cuMemAllocFromPoolAsync_ptsz, 11020, 1)

/* The PFN type of each: the _ptsz ones have the legacy one's. */
typedef PFN_cuStreamSynchronize_v2000 PFN_cuStreamSynchronize_ptsz_v7000;
typedef PFN_cuStreamIsCapturing_v10000 PFN_cuStreamIsCapturing_ptsz_v10000;
typedef PFN_cuEventRecord_v2000 PFN_cuEventRecord_ptsz_v7000;
typedef PFN_cuEventRecordWithFlags_v11010
    PFN_cuEventRecordWithFlags_ptsz_v11010;
typedef PFN_cuStreamWaitEvent_v3020 PFN_cuStreamWaitEvent_ptsz_v7000;
typedef PFN_cuLaunchHostFunc_v10000 PFN_cuLaunchHostFunc_ptsz_v10000;
typedef PFN_cuMemAllocAsync_v11020 PFN_cuMemAllocAsync_ptsz_v11020;
typedef PFN_cuMemFreeAsync_v11020 PFN_cuMemFreeAsync_ptsz_v11020;
typedef PFN_cuMemAllocFromPoolAsync_v11020
    PFN_cuMemAllocFromPoolAsync_ptsz_v11020;

static struct {
#define FIELD(name, version, ptsz) PFN_##name##_v##version name;
  DRIVER(FIELD)
#undef FIELD
} cu;

/* Optional: the stand-in driver of the host mode's tests has none. */
static PFN_cuStreamGetCaptureInfo_v12030 get_capture_info;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

/* Base name of a field: the _ptsz variants are asked for by the legacy
 * name, with the per-thread flag. */
static void base_name(const char *field, char *out, size_t n) {
  strncpy(out, field, n - 1);
  out[n - 1] = '\0';
  char *p = strstr(out, "_ptsz");
  if (p)
    *p = '\0';
}

static void load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return;
  PFN_cuGetProcAddress_v12000 get_proc = NULL;
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  memcpy(&get_proc, &sym, sizeof sym);
  if (!get_proc)
    return;
  /* As a real runtime does: cuGetProcAddress itself through
   * cuGetProcAddress. */
  void *fn = NULL;
  if (get_proc("cuGetProcAddress", &fn, 12000, 0, NULL) != CUDA_SUCCESS || !fn)
    return;
  memcpy(&get_proc, &fn, sizeof fn);
  char name[64];
  int complete = 1;
#define FETCH(field, version, ptsz)                                            \
  base_name(#field, name, sizeof name);                                        \
  fn = NULL;                                                                   \
  if (get_proc(name, &fn, version,                                             \
               ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,       \
               NULL) != CUDA_SUCCESS ||                                        \
      !fn)                                                                     \
    complete = 0;                                                              \
  memcpy(&cu.field, &fn, sizeof fn);
  DRIVER(FETCH)
#undef FETCH
  fn = NULL;
  if (get_proc("cuStreamGetCaptureInfo", &fn, 12030, 0, NULL) == CUDA_SUCCESS)
    memcpy(&get_capture_info, &fn, sizeof fn);
  loaded = complete && cu.cuInit(0) == CUDA_SUCCESS;
}

/* ---- the last error ---------------------------------------------------------
 */

static _Thread_local cudaError_t last_error;

static cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess)
    last_error = e;
  return e;
}

/* The runtime's code for the driver's: the same number for every code the
 * stand-in meets. */
static cudaError_t result(CUresult r) {
  return fail((cudaError_t)r);
}

/* The driver, loaded at first use, or an error from the caller. */
#define DRIVER_OR_FAIL()                                                       \
  do {                                                                         \
    pthread_once(&load_once, load);                                            \
    if (!loaded)                                                               \
      return fail(cudaErrorInsufficientDriver);                                \
  } while (0)

/* ---- devices ----------------------------------------------------------------
 * The current device is the device of the thread's current context; a thread
 * with none gets device 0's primary context at first use, as with the
 * runtime. */

STUB_API cudaError_t cudaGetDeviceCount(int *n) {
  count(__func__);
  DRIVER_OR_FAIL();
  if (!n)
    return fail(cudaErrorInvalidValue);
  return result(cu.cuDeviceGetCount(n));
}

STUB_API cudaError_t cudaSetDevice(int d) {
  count(__func__);
  DRIVER_OR_FAIL();
  CUdevice dev;
  CUcontext ctx;
  CUresult r = cu.cuDeviceGet(&dev, d);
  if (r == CUDA_SUCCESS)
    r = cu.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS)
    r = cu.cuCtxSetCurrent(ctx);
  return result(r);
}

STUB_API cudaError_t cudaGetDevice(int *d) {
  DRIVER_OR_FAIL();
  if (!d)
    return fail(cudaErrorInvalidValue);
  CUcontext ctx = NULL;
  (void)cu.cuCtxGetCurrent(&ctx);
  if (!ctx) {
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess)
      return e;
  }
  CUdevice dev;
  CUresult r = cu.cuCtxGetDevice(&dev);
  if (r != CUDA_SUCCESS)
    return result(r);
  int n = 0;
  (void)cu.cuDeviceGetCount(&n);
  for (int i = 0; i < n; i++) {
    CUdevice h;
    if (cu.cuDeviceGet(&h, i) == CUDA_SUCCESS && h == dev) {
      *d = i;
      return cudaSuccess;
    }
  }
  return fail(cudaErrorInvalidDevice);
}

/* Device work needs a current context, made as cudaGetDevice makes it. */
#define CONTEXT_OR_FAIL()                                                      \
  do {                                                                         \
    int dev_;                                                                  \
    cudaError_t e_ = cudaGetDevice(&dev_);                                     \
    if (e_ != cudaSuccess)                                                     \
      return e_;                                                               \
  } while (0)

STUB_API cudaError_t cudaGetLastError(void) {
  count(__func__);
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

STUB_API cudaError_t cudaPeekAtLastError(void) {
  return last_error;
}

/* Calls the driver after making sure of a context, and answers in the
 * runtime's terms. */
#define CALL(name, args)                                                       \
  do {                                                                         \
    count(__func__);                                                           \
    CONTEXT_OR_FAIL();                                                         \
    return result(cu.name args);                                               \
  } while (0)

/* ---- streams, events and capture --------------------------------------------
 */

STUB_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  CALL(cuStreamCreate, (s, 0));
}

STUB_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
  CALL(cuStreamCreate, (s, f));
}

STUB_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned f,
                                                  int p) {
  CALL(cuStreamCreateWithPriority, (s, f, p));
}

STUB_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  CALL(cuStreamDestroy, (s));
}

STUB_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  CALL(cuStreamSynchronize, (s));
}

STUB_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  CALL(cuStreamSynchronize_ptsz, (s));
}

STUB_API cudaError_t cudaDeviceSynchronize(void) {
  CALL(cuCtxSynchronize, ());
}

STUB_API cudaError_t cudaStreamBeginCapture(cudaStream_t s,
                                            enum cudaStreamCaptureMode m) {
  CALL(cuStreamBeginCapture, (s, (CUstreamCaptureMode)m));
}

STUB_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  CALL(cuStreamEndCapture, (s, g));
}

STUB_API cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  CALL(cuGraphDestroy, (g));
}

STUB_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g,
                                          unsigned long long flags) {
  CALL(cuGraphInstantiateWithFlags, ((CUgraphExec *)e, g, flags));
}

STUB_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e,
                                                   cudaGraph_t g,
                                                   unsigned long long flags) {
  CALL(cuGraphInstantiateWithFlags, ((CUgraphExec *)e, g, flags));
}

STUB_API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  CALL(cuGraphLaunch, ((CUgraphExec)e, s));
}

STUB_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  CALL(cuGraphExecDestroy, ((CUgraphExec)e));
}

/* The stand-in driver has no graph memory: every figure is 0, and a NULL
 * value is refused, as CUDA documents. */
STUB_API cudaError_t cudaDeviceGetGraphMemAttribute(
    int device, enum cudaGraphMemAttributeType attr, void *value) {
  count(__func__);
  (void)device;
  (void)attr;
  if (!value)
    return fail(cudaErrorInvalidValue);
  *(uint64_t *)value = 0;
  return cudaSuccess;
}

STUB_API cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                           enum cudaStreamCaptureStatus *st) {
  CONTEXT_OR_FAIL();
  return result(cu.cuStreamIsCapturing(s, (CUstreamCaptureStatus *)st));
}

STUB_API cudaError_t cudaStreamGetCaptureInfo(
    cudaStream_t s, enum cudaStreamCaptureStatus *st, unsigned long long *id,
    cudaGraph_t *g, const cudaGraphNode_t **deps,
    const cudaGraphEdgeData **edges, size_t *n) {
  count(__func__);
  CONTEXT_OR_FAIL();
  if (!get_capture_info)
    return fail(cudaErrorNotSupported);
  return result(get_capture_info(s, (CUstreamCaptureStatus *)st,
                                 (cuuint64_t *)id, g, deps,
                                 (const CUgraphEdgeData **)edges, n));
}

STUB_API cudaError_t
cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  CONTEXT_OR_FAIL();
  return result(cu.cuStreamIsCapturing_ptsz(s, (CUstreamCaptureStatus *)st));
}

STUB_API cudaError_t cudaEventCreate(cudaEvent_t *e) {
  CALL(cuEventCreate, (e, 0));
}

STUB_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
  CALL(cuEventCreate, (e, f));
}

STUB_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  CALL(cuEventDestroy, (e));
}

STUB_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  CALL(cuEventRecord, (e, s));
}

STUB_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  CALL(cuEventRecord_ptsz, (e, s));
}

STUB_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s,
                                              unsigned f) {
  CALL(cuEventRecordWithFlags, (e, s, f));
}

STUB_API cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e,
                                                   cudaStream_t s, unsigned f) {
  CALL(cuEventRecordWithFlags_ptsz, (e, s, f));
}

STUB_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  CALL(cuEventSynchronize, (e));
}

STUB_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                         unsigned f) {
  CALL(cuStreamWaitEvent, (s, e, f));
}

STUB_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e,
                                              unsigned f) {
  CALL(cuStreamWaitEvent_ptsz, (s, e, f));
}

STUB_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn,
                                        void *arg) {
  CALL(cuLaunchHostFunc, (s, fn, arg));
}

STUB_API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn,
                                             void *arg) {
  CALL(cuLaunchHostFunc_ptsz, (s, fn, arg));
}

/* ---- memory ----------------------------------------------------------------
 * memset and memcpy on the spot; allocations through the driver. */

STUB_API cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)s;
  if (!p && n)
    return fail(cudaErrorInvalidValue);
  if (n)
    memset(p, v, n);
  return cudaSuccess;
}

STUB_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                     enum cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  (void)s;
  if ((!dst || !src) && n)
    return fail(cudaErrorInvalidValue);
  if (n)
    memcpy(dst, src, n);
  return cudaSuccess;
}

STUB_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                                enum cudaMemcpyKind k) {
  return cudaMemcpyAsync(dst, src, n, k, NULL);
}

static CUdeviceptr dptr(const void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

STUB_API cudaError_t cudaMalloc(void **p, size_t n) {
  CALL(cuMemAlloc, ((CUdeviceptr *)p, n));
}

STUB_API cudaError_t cudaFree(void *p) {
  CALL(cuMemFree, (dptr(p)));
}

STUB_API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  CALL(cuMemAllocAsync, ((CUdeviceptr *)p, n, s));
}

STUB_API cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s) {
  CALL(cuMemAllocAsync_ptsz, ((CUdeviceptr *)p, n, s));
}

STUB_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  CALL(cuMemFreeAsync, (dptr(p), s));
}

STUB_API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) {
  CALL(cuMemFreeAsync_ptsz, (dptr(p), s));
}

STUB_API cudaError_t cudaMallocFromPoolAsync(void **p, size_t n,
                                             cudaMemPool_t pool,
                                             cudaStream_t s) {
  CALL(cuMemAllocFromPoolAsync, ((CUdeviceptr *)p, n, pool, s));
}

STUB_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t n,
                                                  cudaMemPool_t pool,
                                                  cudaStream_t s) {
  CALL(cuMemAllocFromPoolAsync_ptsz, ((CUdeviceptr *)p, n, pool, s));
}

/* The runtime's structs of the allocator are the driver's, field for
 * field. */
STUB_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool,
                                       const struct cudaMemPoolProps *props) {
  CALL(cuMemPoolCreate, (pool, (const CUmemPoolProps *)props));
}

STUB_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  CALL(cuMemPoolDestroy, (pool));
}

STUB_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool,
                                             enum cudaMemPoolAttr a, void *v) {
  CALL(cuMemPoolGetAttribute, (pool, (CUmemPool_attribute)a, v));
}

STUB_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool,
                                             enum cudaMemPoolAttr a, void *v) {
  CALL(cuMemPoolSetAttribute, (pool, (CUmemPool_attribute)a, v));
}

STUB_API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool,
                                          const struct cudaMemAccessDesc *d,
                                          size_t n) {
  CALL(cuMemPoolSetAccess, (pool, (const CUmemAccessDesc *)d, n));
}

STUB_API cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *f,
                                          cudaMemPool_t pool,
                                          struct cudaMemLocation *l) {
  CALL(cuMemPoolGetAccess, ((CUmemAccess_flags *)f, pool, (CUmemLocation *)l));
}

STUB_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  CALL(cuMemPoolTrimTo, (pool, keep));
}

STUB_API cudaError_t cudaMemPoolExportToShareableHandle(
    void *h, cudaMemPool_t pool, enum cudaMemAllocationHandleType t,
    unsigned int f) {
  CALL(cuMemPoolExportToShareableHandle,
       (h, pool, (CUmemAllocationHandleType)t, f));
}

STUB_API cudaError_t cudaMemPoolImportFromShareableHandle(
    cudaMemPool_t *pool, void *h, enum cudaMemAllocationHandleType t,
    unsigned int f) {
  CALL(cuMemPoolImportFromShareableHandle,
       (pool, h, (CUmemAllocationHandleType)t, f));
}

STUB_API cudaError_t
cudaMemPoolExportPointer(struct cudaMemPoolPtrExportData *d, void *p) {
  CALL(cuMemPoolExportPointer, ((CUmemPoolPtrExportData *)d, dptr(p)));
}

STUB_API cudaError_t cudaMemPoolImportPointer(
    void **p, cudaMemPool_t pool, struct cudaMemPoolPtrExportData *d) {
  CALL(cuMemPoolImportPointer,
       ((CUdeviceptr *)p, pool, (CUmemPoolPtrExportData *)d));
}

/* The driver takes device handles, the runtime ordinals. */
static CUresult handle(int d, CUdevice *dev) {
  return cu.cuDeviceGet(dev, d);
}

STUB_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int d) {
  count(__func__);
  CONTEXT_OR_FAIL();
  CUdevice dev;
  CUresult r = handle(d, &dev);
  return result(r ? r : cu.cuDeviceGetDefaultMemPool(pool, dev));
}

STUB_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int d) {
  count(__func__);
  CONTEXT_OR_FAIL();
  CUdevice dev;
  CUresult r = handle(d, &dev);
  return result(r ? r : cu.cuDeviceGetMemPool(pool, dev));
}

STUB_API cudaError_t cudaDeviceSetMemPool(int d, cudaMemPool_t pool) {
  count(__func__);
  CONTEXT_OR_FAIL();
  CUdevice dev;
  CUresult r = handle(d, &dev);
  return result(r ? r : cu.cuDeviceSetMemPool(dev, pool));
}

STUB_API cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t *pool,
                                              struct cudaMemLocation *l,
                                              enum cudaMemAllocationType t) {
  CALL(cuMemGetDefaultMemPool,
       (pool, (CUmemLocation *)l, (CUmemAllocationType)t));
}

STUB_API cudaError_t cudaMemGetMemPool(cudaMemPool_t *pool,
                                       struct cudaMemLocation *l,
                                       enum cudaMemAllocationType t) {
  CALL(cuMemGetMemPool, (pool, (CUmemLocation *)l, (CUmemAllocationType)t));
}

STUB_API cudaError_t cudaMemSetMemPool(struct cudaMemLocation *l,
                                       enum cudaMemAllocationType t,
                                       cudaMemPool_t pool) {
  CALL(cuMemSetMemPool, ((CUmemLocation *)l, (CUmemAllocationType)t, pool));
}

STUB_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a,
                                              const void *p) {
  (void)a;
  (void)p;
  count(__func__);
  return fail(cudaErrorNotSupported);
}
