/* A stand-in for the CUDA driver (built as libcuda.so.1) so that the
 * interposer's driver-level layer runs where there is no GPU: both
 * cuGetProcAddress versions, answering a name, a version and flags with the
 * variant a driver would; devices whose handles are not their ordinals;
 * primary and created contexts, current per thread; streams and events that
 * do nothing; stream capture as a table of streams, and graphs and execs
 * that do nothing; memset and memcpy on the spot; cuMemAlloc from the heap;
 * and the stream-ordered allocator answering "not supported" (with heap
 * memory during capture, as graph memory). Every
 * call that reaches it is counted, so that a test sees what the interposer
 * passed on. The stand-in runtime (cudart_stub.c) reaches it as a real
 * runtime does, through dlopen and cuGetProcAddress. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

/* cuda.h names the current cuGetProcAddress by the name of CUDA 11.3's,
 * which the stand-in exports too. */
#undef cuGetProcAddress

#define STUB_API __attribute__((visibility("default")))

/* ---- call counts ------------------------------------------------------------
 */

#define MAX_NAMES 128
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

/* How many times the exported function `name` was called. */
STUB_API unsigned long cuda_stub_calls(const char *name) {
  unsigned long n = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_NAMES && names[i]; i++)
    if (strcmp(names[i], name) == 0)
      n = counts[i];
  pthread_mutex_unlock(&lock);
  return n;
}

/* What dlsym(RTLD_DEFAULT, name) answers from inside the stand-in, which a
 * program opens RTLD_LOCAL: the C library searches the caller's own scope
 * too, which the interposer must keep. Through a volatile, so that the
 * call is not a tail call (whose caller would be this function's). */
STUB_API void *cuda_stub_default(const char *name) {
  void *volatile sym = dlsym(RTLD_DEFAULT, name);
  return sym;
}

/* ---- devices and contexts ---------------------------------------------------
 */

/* Handles are ordinals plus this, so that code confusing the two fails. */
#define DEVICE_BASE 100
#define MAX_DEVICES 8

struct CUctx_st {
  int ordinal;
  int retains; /* of a primary context */
};

static struct CUctx_st primaries[MAX_DEVICES];
static _Thread_local CUcontext current;
static bool initialized;

static int device_count(void) {
  const char *v = getenv("TIDEPOOL_HOST_DEVICES");
  int n = v ? atoi(v) : 1;
  return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static int ordinal_of(CUdevice dev) {
  int o = dev - DEVICE_BASE;
  return o >= 0 && o < device_count() ? o : -1;
}

STUB_API CUresult cuInit(unsigned flags) {
  count(__func__);
  if (flags)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  initialized = true;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDriverGetVersion(int *v) {
  if (!v)
    return CUDA_ERROR_INVALID_VALUE;
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDeviceGetCount(int *n) {
  count(__func__);
  pthread_mutex_lock(&lock);
  bool ready = initialized;
  pthread_mutex_unlock(&lock);
  if (!ready)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!n)
    return CUDA_ERROR_INVALID_VALUE;
  *n = device_count();
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= device_count())
    return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal + DEVICE_BASE;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  int o = ordinal_of(dev);
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (o < 0)
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  primaries[o].ordinal = o;
  primaries[o].retains++;
  pthread_mutex_unlock(&lock);
  *ctx = &primaries[o];
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  int o = ordinal_of(dev);
  if (o < 0)
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  if (primaries[o].retains > 0)
    primaries[o].retains--;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned *flags,
                                             int *active) {
  int o = ordinal_of(dev);
  if (!flags || !active)
    return CUDA_ERROR_INVALID_VALUE;
  if (o < 0)
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  *active = primaries[o].retains > 0;
  pthread_mutex_unlock(&lock);
  *flags = 0;
  return CUDA_SUCCESS;
}

/* A context of the program's own, made current. */
STUB_API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev) {
  (void)flags;
  int o = ordinal_of(dev);
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (o < 0)
    return CUDA_ERROR_INVALID_DEVICE;
  CUcontext c = calloc(1, sizeof *c);
  if (!c)
    return CUDA_ERROR_OUT_OF_MEMORY;
  c->ordinal = o;
  *ctx = current = c;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (!ctx || (ctx >= primaries && ctx < primaries + MAX_DEVICES))
    return CUDA_ERROR_INVALID_VALUE;
  if (current == ctx)
    current = NULL;
  free(ctx);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuCtxGetCurrent(CUcontext *ctx) {
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  *ctx = current;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  current = ctx;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuCtxGetDevice(CUdevice *dev) {
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current->ordinal + DEVICE_BASE;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuCtxSynchronize(void) {
  count(__func__);
  return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

STUB_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  count(__func__);
  return ctx || current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- streams, capture and events --------------------------------------------
 */

/* Streams and events are small heap objects. With TIDEPOOL_PRELOAD=host the
 * interposer makes the streams itself, so capture is a table of handles
 * rather than a flag inside the stream. */
STUB_API CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  (void)flags;
  count(__func__);
  if (!s)
    return CUDA_ERROR_INVALID_VALUE;
  /* A stream keeps the context it was made in, in its first word. */
  CUcontext *made = calloc(1, 16);
  if (made)
    *made = current;
  *s = (CUstream)made;
  return made ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_API CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx) {
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
    *ctx = current;
    return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  *ctx = *(CUcontext *)(void *)s;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags,
                                             int priority) {
  (void)priority;
  return cuStreamCreate(s, flags);
}

STUB_API CUresult cuStreamDestroy_v2(CUstream s) {
  count(__func__);
  free(s);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuStreamSynchronize(CUstream s) {
  (void)s;
  count(__func__);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuStreamSynchronize_ptsz(CUstream s) {
  (void)s;
  count(__func__);
  return CUDA_SUCCESS;
}

#define MAX_CAPTURES 8
static CUstream captures[MAX_CAPTURES];

static bool stream_captures(CUstream s) {
  bool found = false;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CAPTURES; i++)
    if (s && captures[i] == s)
      found = true;
  pthread_mutex_unlock(&lock);
  return found;
}

STUB_API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) {
  (void)m;
  count(__func__);
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < MAX_CAPTURES && captures[i])
    i++;
  if (i < MAX_CAPTURES)
    captures[i] = s;
  pthread_mutex_unlock(&lock);
  return i < MAX_CAPTURES ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

STUB_API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
  count(__func__);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CAPTURES; i++)
    if (captures[i] == s)
      captures[i] = NULL;
  pthread_mutex_unlock(&lock);
  if (g)
    *g = calloc(1, 16);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuGraphDestroy(CUgraph g) {
  free(g);
  return CUDA_SUCCESS;
}

/* Graphs that do nothing: an exec is a heap block too. */
STUB_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g,
                                              unsigned long long flags) {
  (void)g;
  (void)flags;
  count(__func__);
  if (!e)
    return CUDA_ERROR_INVALID_VALUE;
  *e = calloc(1, 16);
  return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_API CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  (void)e;
  (void)s;
  count(__func__);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return cuGraphLaunch(e, s);
}

STUB_API CUresult cuGraphExecDestroy(CUgraphExec e) {
  free(e);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s,
                                               CUstreamCaptureMode m) {
  return cuStreamBeginCapture_v2(s, m);
}

STUB_API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
  return cuStreamEndCapture(s, g);
}

STUB_API CUresult cuStreamIsCapturing(CUstream s,
                                      CUstreamCaptureStatus *status) {
  if (!status)
    return CUDA_ERROR_INVALID_VALUE;
  *status = stream_captures(s) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                               : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuStreamIsCapturing_ptsz(CUstream s,
                                           CUstreamCaptureStatus *status) {
  return cuStreamIsCapturing(s, status);
}

STUB_API CUresult cuEventCreate(CUevent *e, unsigned flags) {
  (void)flags;
  count(__func__);
  if (!e)
    return CUDA_ERROR_INVALID_VALUE;
  *e = calloc(1, 16);
  return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_API CUresult cuEventDestroy_v2(CUevent e) {
  count(__func__);
  free(e);
  return CUDA_SUCCESS;
}

#define EVENT_CALL(name, ...)                                                  \
  STUB_API CUresult name(CUevent e, __VA_ARGS__) {                             \
    count(#name);                                                              \
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;                       \
  }
EVENT_CALL(cuEventRecord, CUstream s)
EVENT_CALL(cuEventRecord_ptsz, CUstream s)
EVENT_CALL(cuEventRecordWithFlags, CUstream s, unsigned flags)
EVENT_CALL(cuEventRecordWithFlags_ptsz, CUstream s, unsigned flags)

STUB_API CUresult cuEventSynchronize(CUevent e) {
  count(__func__);
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STUB_API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  (void)s;
  (void)flags;
  count(__func__);
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STUB_API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e,
                                         unsigned flags) {
  (void)s;
  (void)flags;
  count(__func__);
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Runs at once: the stand-in's streams have nothing queued. */
STUB_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *arg) {
  (void)s;
  count(__func__);
  if (!fn)
    return CUDA_ERROR_INVALID_VALUE;
  fn(arg);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *arg) {
  return cuLaunchHostFunc(s, fn, arg);
}

/* ---- memory -----------------------------------------------------------------
 * The stand-in's own allocations are remembered, so that a free of memory it
 * did not give out is refused, as the driver refuses it. */

#define MAX_BLOCKS 64
static void *blocks[MAX_BLOCKS];

static CUresult block_new(CUdeviceptr *p, size_t n) {
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  void *b = malloc(n ? n : 1);
  if (!b)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < MAX_BLOCKS && blocks[i])
    i++;
  if (i < MAX_BLOCKS)
    blocks[i] = b;
  pthread_mutex_unlock(&lock);
  if (i == MAX_BLOCKS) {
    free(b);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)(uintptr_t)b;
  return CUDA_SUCCESS;
}

static CUresult block_free(CUdeviceptr p) {
  void *b = (void *)(uintptr_t)p;
  int i = 0;
  pthread_mutex_lock(&lock);
  while (i < MAX_BLOCKS && (!b || blocks[i] != b))
    i++;
  if (i < MAX_BLOCKS)
    blocks[i] = NULL;
  pthread_mutex_unlock(&lock);
  if (i == MAX_BLOCKS)
    return CUDA_ERROR_INVALID_VALUE;
  free(b);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  count(__func__);
  return block_new(p, n);
}

STUB_API CUresult cuMemFree_v2(CUdeviceptr p) {
  count(__func__);
  return block_free(p);
}

STUB_API CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n,
                                  CUstream s) {
  (void)s;
  if (!p && n)
    return CUDA_ERROR_INVALID_VALUE;
  if (n)
    memset((void *)(uintptr_t)p, v, n);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n,
                                       CUstream s) {
  return cuMemsetD8Async(p, v, n, s);
}

STUB_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n,
                                       CUstream s) {
  (void)s;
  if ((!dst || !src) && n)
    return CUDA_ERROR_INVALID_VALUE;
  if (n)
    memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

STUB_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src,
                                            size_t n, CUstream s) {
  return cuMemcpyDtoHAsync_v2(dst, src, n, s);
}

/* During capture the allocator answers with graph memory (a heap block);
 * otherwise "not supported": with the interposer on, none of these calls
 * should get here. */
static CUresult alloc_async(const char *name, CUdeviceptr *p, size_t n,
                            CUstream s) {
  count(name);
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  return stream_captures(s) ? block_new(p, n) : CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult free_async(const char *name, CUdeviceptr p, CUstream s) {
  count(name);
  return stream_captures(s) ? block_free(p) : CUDA_ERROR_INVALID_VALUE;
}

STUB_API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  return alloc_async(__func__, p, n, s);
}

STUB_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
  return alloc_async(__func__, p, n, s);
}

STUB_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  return free_async(__func__, p, s);
}

STUB_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return free_async(__func__, p, s);
}

/* The rest of the allocator answers "not supported". */
#define UNSUPPORTED(name, ...)                                                 \
  STUB_API CUresult name(__VA_ARGS__) {                                        \
    count(#name);                                                              \
    return CUDA_ERROR_NOT_SUPPORTED;                                           \
  }

UNSUPPORTED(cuMemAllocFromPoolAsync, CUdeviceptr *p, size_t n,
            CUmemoryPool pool, CUstream s)
UNSUPPORTED(cuMemAllocFromPoolAsync_ptsz, CUdeviceptr *p, size_t n,
            CUmemoryPool pool, CUstream s)
UNSUPPORTED(cuMemPoolCreate, CUmemoryPool *pool, const CUmemPoolProps *props)
UNSUPPORTED(cuMemPoolDestroy, CUmemoryPool pool)
UNSUPPORTED(cuMemPoolGetAttribute, CUmemoryPool pool, CUmemPool_attribute a,
            void *v)
UNSUPPORTED(cuMemPoolSetAttribute, CUmemoryPool pool, CUmemPool_attribute a,
            void *v)
UNSUPPORTED(cuMemPoolSetAccess, CUmemoryPool pool, const CUmemAccessDesc *d,
            size_t n)
UNSUPPORTED(cuMemPoolGetAccess, CUmemAccess_flags *f, CUmemoryPool pool,
            CUmemLocation *l)
UNSUPPORTED(cuMemPoolTrimTo, CUmemoryPool pool, size_t keep)
UNSUPPORTED(cuMemPoolExportToShareableHandle, void *h, CUmemoryPool pool,
            CUmemAllocationHandleType t, unsigned long long f)
UNSUPPORTED(cuMemPoolImportFromShareableHandle, CUmemoryPool *pool, void *h,
            CUmemAllocationHandleType t, unsigned long long f)
UNSUPPORTED(cuMemPoolExportPointer, CUmemPoolPtrExportData *d, CUdeviceptr p)
UNSUPPORTED(cuMemPoolImportPointer, CUdeviceptr *p, CUmemoryPool pool,
            CUmemPoolPtrExportData *d)
UNSUPPORTED(cuDeviceGetDefaultMemPool, CUmemoryPool *pool, CUdevice d)
UNSUPPORTED(cuDeviceGetMemPool, CUmemoryPool *pool, CUdevice d)
UNSUPPORTED(cuDeviceSetMemPool, CUdevice d, CUmemoryPool pool)
UNSUPPORTED(cuMemGetDefaultMemPool, CUmemoryPool *pool, CUmemLocation *l,
            CUmemAllocationType t)
UNSUPPORTED(cuMemGetMemPool, CUmemoryPool *pool, CUmemLocation *l,
            CUmemAllocationType t)
UNSUPPORTED(cuMemSetMemPool, CUmemLocation *l, CUmemAllocationType t,
            CUmemoryPool pool)

/* ---- cuGetProcAddress -------------------------------------------------------
 * Each variant by the name cuGetProcAddress takes, the version that
 * introduced it, and whether it is the per-thread (_ptsz) one. */

typedef void (*any_fn)(void);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                          cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

static const struct variant {
  const char *name;
  int version;
  bool per_thread;
  any_fn fn;
} variants[] = {
#define V(name, version, per_thread, fn)                                       \
  { name, version, per_thread, (any_fn)fn }
    V("cuGetProcAddress", 11030, false, cuGetProcAddress),
    V("cuGetProcAddress", 12000, false, cuGetProcAddress_v2),
    V("cuInit", 2000, false, cuInit),
    V("cuDriverGetVersion", 2020, false, cuDriverGetVersion),
    V("cuDeviceGet", 2000, false, cuDeviceGet),
    V("cuDeviceGetCount", 2000, false, cuDeviceGetCount),
    V("cuDevicePrimaryCtxRetain", 7000, false, cuDevicePrimaryCtxRetain),
    V("cuDevicePrimaryCtxRelease", 11000, false, cuDevicePrimaryCtxRelease_v2),
    V("cuDevicePrimaryCtxGetState", 7000, false, cuDevicePrimaryCtxGetState),
    V("cuCtxCreate", 3020, false, cuCtxCreate_v2),
    V("cuCtxDestroy", 4000, false, cuCtxDestroy_v2),
    V("cuCtxGetCurrent", 4000, false, cuCtxGetCurrent),
    V("cuCtxSetCurrent", 4000, false, cuCtxSetCurrent),
    V("cuCtxGetDevice", 2000, false, cuCtxGetDevice),
    V("cuCtxSynchronize", 2000, false, cuCtxSynchronize),
    V("cuCtxSynchronize", 13000, false, cuCtxSynchronize_v2),
    V("cuStreamCreate", 2000, false, cuStreamCreate),
    V("cuStreamCreateWithPriority", 5050, false, cuStreamCreateWithPriority),
    V("cuStreamDestroy", 4000, false, cuStreamDestroy_v2),
    V("cuStreamGetCtx", 9020, false, cuStreamGetCtx),
    V("cuStreamSynchronize", 2000, false, cuStreamSynchronize),
    V("cuStreamSynchronize", 7000, true, cuStreamSynchronize_ptsz),
    V("cuStreamBeginCapture", 10010, false, cuStreamBeginCapture_v2),
    V("cuStreamEndCapture", 10000, false, cuStreamEndCapture),
    V("cuStreamIsCapturing", 10000, false, cuStreamIsCapturing),
    V("cuStreamIsCapturing", 10000, true, cuStreamIsCapturing_ptsz),
    V("cuStreamBeginCapture", 10010, true, cuStreamBeginCapture_v2_ptsz),
    V("cuStreamEndCapture", 10000, true, cuStreamEndCapture_ptsz),
    V("cuGraphDestroy", 10000, false, cuGraphDestroy),
    V("cuGraphInstantiateWithFlags", 11040, false, cuGraphInstantiateWithFlags),
    V("cuGraphLaunch", 10000, false, cuGraphLaunch),
    V("cuGraphLaunch", 10000, true, cuGraphLaunch_ptsz),
    V("cuGraphExecDestroy", 10000, false, cuGraphExecDestroy),
    V("cuEventCreate", 2000, false, cuEventCreate),
    V("cuEventDestroy", 4000, false, cuEventDestroy_v2),
    V("cuEventRecord", 2000, false, cuEventRecord),
    V("cuEventRecord", 7000, true, cuEventRecord_ptsz),
    V("cuEventRecordWithFlags", 11010, false, cuEventRecordWithFlags),
    V("cuEventRecordWithFlags", 11010, true, cuEventRecordWithFlags_ptsz),
    V("cuEventSynchronize", 2000, false, cuEventSynchronize),
    V("cuStreamWaitEvent", 3020, false, cuStreamWaitEvent),
    V("cuStreamWaitEvent", 7000, true, cuStreamWaitEvent_ptsz),
    V("cuLaunchHostFunc", 10000, false, cuLaunchHostFunc),
    V("cuLaunchHostFunc", 10000, true, cuLaunchHostFunc_ptsz),
    V("cuMemAlloc", 3020, false, cuMemAlloc_v2),
    V("cuMemFree", 3020, false, cuMemFree_v2),
    V("cuMemsetD8Async", 3020, false, cuMemsetD8Async),
    V("cuMemsetD8Async", 7000, true, cuMemsetD8Async_ptsz),
    V("cuMemcpyDtoHAsync", 3020, false, cuMemcpyDtoHAsync_v2),
    V("cuMemcpyDtoHAsync", 7000, true, cuMemcpyDtoHAsync_v2_ptsz),
    V("cuMemAllocAsync", 11020, false, cuMemAllocAsync),
    V("cuMemAllocAsync", 11020, true, cuMemAllocAsync_ptsz),
    V("cuMemFreeAsync", 11020, false, cuMemFreeAsync),
    V("cuMemFreeAsync", 11020, true, cuMemFreeAsync_ptsz),
    V("cuMemAllocFromPoolAsync", 11020, false, cuMemAllocFromPoolAsync),
    V("cuMemAllocFromPoolAsync", 11020, true, cuMemAllocFromPoolAsync_ptsz),
    V("cuMemPoolCreate", 11020, false, cuMemPoolCreate),
    V("cuMemPoolDestroy", 11020, false, cuMemPoolDestroy),
    V("cuMemPoolGetAttribute", 11020, false, cuMemPoolGetAttribute),
    V("cuMemPoolSetAttribute", 11020, false, cuMemPoolSetAttribute),
    V("cuMemPoolSetAccess", 11020, false, cuMemPoolSetAccess),
    V("cuMemPoolGetAccess", 11020, false, cuMemPoolGetAccess),
    V("cuMemPoolTrimTo", 11020, false, cuMemPoolTrimTo),
    V("cuMemPoolExportToShareableHandle", 11020, false,
      cuMemPoolExportToShareableHandle),
    V("cuMemPoolImportFromShareableHandle", 11020, false,
      cuMemPoolImportFromShareableHandle),
    V("cuMemPoolExportPointer", 11020, false, cuMemPoolExportPointer),
    V("cuMemPoolImportPointer", 11020, false, cuMemPoolImportPointer),
    V("cuDeviceGetDefaultMemPool", 11020, false, cuDeviceGetDefaultMemPool),
    V("cuDeviceGetMemPool", 11020, false, cuDeviceGetMemPool),
    V("cuDeviceSetMemPool", 11020, false, cuDeviceSetMemPool),
    V("cuMemGetDefaultMemPool", 13000, false, cuMemGetDefaultMemPool),
    V("cuMemGetMemPool", 13000, false, cuMemGetMemPool),
    V("cuMemSetMemPool", 13000, false, cuMemSetMemPool),
#undef V
};

/* The newest variant of `name` not newer than `version`, of the stream
 * kind asked for; the legacy one where a per-thread one does not exist. */
static const struct variant *find(const char *name, int version,
                                  bool per_thread, bool *known) {
  const struct variant *best = NULL;
  *known = false;
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    const struct variant *v = &variants[i];
    if (strcmp(v->name, name) != 0)
      continue;
    *known = true;
    if (v->version <= version && v->per_thread == per_thread &&
        (!best || v->version > best->version))
      best = v;
  }
  if (!best && per_thread)
    return find(name, version, false, known);
  return best;
}

STUB_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                      int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status) {
  count(__func__);
  if (!symbol || !pfn || version > CUDA_VERSION)
    return CUDA_ERROR_INVALID_VALUE;
  bool known = false;
  const struct variant *v = find(
      symbol, version,
      (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &known);
  *pfn = NULL;
  if (v)
    memcpy(pfn, &v->fn, sizeof *pfn);
  if (status)
    *status = v       ? CU_GET_PROC_ADDRESS_SUCCESS
              : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

STUB_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                   cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
