/* A stand-in for the CUDA runtime (built as libcudart.so.13, with the
 * runtime's version node) so that the interposer runs where there is no
 * GPU: devices and the last error per thread, streams and events that do
 * nothing, memset and memcpy done on the spot, stream capture as a flag,
 * cudaMalloc from the heap, and the allocator calls answering "not
 * supported". Every call that reaches it is counted, so that a test sees
 * which calls the interposer forwarded. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- devices and the last error --------------------------------------------
 */

static _Thread_local int device;
static _Thread_local cudaError_t last_error;

static cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess)
    last_error = e;
  return e;
}

static int device_count(void) {
  const char *v = getenv("TIDEPOOL_HOST_DEVICES");
  int n = v ? atoi(v) : 1;
  return n > 0 ? n : 1;
}

STUB_API cudaError_t cudaGetDeviceCount(int *n) {
  count(__func__);
  if (!n)
    return fail(cudaErrorInvalidValue);
  *n = device_count();
  return cudaSuccess;
}

STUB_API cudaError_t cudaGetDevice(int *d) {
  if (!d)
    return fail(cudaErrorInvalidValue);
  *d = device;
  return cudaSuccess;
}

STUB_API cudaError_t cudaSetDevice(int d) {
  count(__func__);
  if (d < 0 || d >= device_count())
    return fail(cudaErrorInvalidDevice);
  device = d;
  return cudaSuccess;
}

STUB_API cudaError_t cudaGetLastError(void) {
  count(__func__);
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

STUB_API cudaError_t cudaPeekAtLastError(void) {
  return last_error;
}

/* ---- streams, events and capture -------------------------------------------
 */

/* Handles are small heap objects; a stream remembers whether it captures. */
typedef struct stub_stream {
  int capturing;
} stub_stream;

STUB_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  count(__func__);
  if (!s)
    return fail(cudaErrorInvalidValue);
  *s = (cudaStream_t)calloc(1, sizeof(stub_stream));
  return *s ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

STUB_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
  (void)f;
  return cudaStreamCreate(s);
}

STUB_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned f,
                                                  int p) {
  (void)p;
  return cudaStreamCreateWithFlags(s, f);
}

STUB_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  count(__func__);
  free(s);
  return cudaSuccess;
}

STUB_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  count(__func__);
  return cudaSuccess;
}

STUB_API cudaError_t cudaDeviceSynchronize(void) {
  count(__func__);
  return cudaSuccess;
}

/* The interposer in host mode makes streams itself, so the stand-in cannot
 * keep its capture flag inside the stream: capture is a table of handles. */
#define MAX_CAPTURES 8
static cudaStream_t captures[MAX_CAPTURES];

STUB_API cudaError_t cudaStreamBeginCapture(cudaStream_t s,
                                            enum cudaStreamCaptureMode m) {
  (void)m;
  count(__func__);
  pthread_mutex_lock(&lock);
  int i = 0;
  while (i < MAX_CAPTURES && captures[i])
    i++;
  if (i < MAX_CAPTURES)
    captures[i] = s;
  pthread_mutex_unlock(&lock);
  return i < MAX_CAPTURES ? cudaSuccess : fail(cudaErrorNotSupported);
}

STUB_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  count(__func__);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CAPTURES; i++)
    if (captures[i] == s)
      captures[i] = NULL;
  pthread_mutex_unlock(&lock);
  if (g)
    *g = (cudaGraph_t)calloc(1, 1);
  return cudaSuccess;
}

STUB_API cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  free(g);
  return cudaSuccess;
}

STUB_API cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                           enum cudaStreamCaptureStatus *st) {
  if (!st)
    return fail(cudaErrorInvalidValue);
  *st = cudaStreamCaptureStatusNone;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CAPTURES; i++)
    if (s && captures[i] == s)
      *st = cudaStreamCaptureStatusActive;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

STUB_API cudaError_t
cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
  return cudaStreamIsCapturing(s, st);
}

STUB_API cudaError_t cudaEventCreate(cudaEvent_t *e) {
  count(__func__);
  if (!e)
    return fail(cudaErrorInvalidValue);
  *e = (cudaEvent_t)calloc(1, 16);
  return *e ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

STUB_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
  (void)f;
  return cudaEventCreate(e);
}

STUB_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  count(__func__);
  free(e);
  return cudaSuccess;
}

STUB_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  count(__func__);
  return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

STUB_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  count(__func__);
  return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

STUB_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                         unsigned f) {
  (void)s;
  (void)f;
  count(__func__);
  return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

/* Runs at once: the stand-in's streams have nothing queued. */
STUB_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn,
                                        void *arg) {
  (void)s;
  count(__func__);
  if (!fn)
    return fail(cudaErrorInvalidValue);
  fn(arg);
  return cudaSuccess;
}

/* ---- memory ----------------------------------------------------------------
 */

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

STUB_API cudaError_t cudaMalloc(void **p, size_t n) {
  count(__func__);
  if (!p)
    return fail(cudaErrorInvalidValue);
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

STUB_API cudaError_t cudaFree(void *p) {
  count(__func__);
  free(p);
  return cudaSuccess;
}

/* During capture the allocator calls answer with a graph allocation of the
 * stand-in's (a heap block); otherwise "not supported": with the
 * interposer on, none of them should get here. */
static int stream_captures(cudaStream_t s) {
  enum cudaStreamCaptureStatus st;
  return cudaStreamIsCapturing(s, &st) == cudaSuccess &&
         st == cudaStreamCaptureStatusActive;
}

STUB_API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  count(__func__);
  if (!p)
    return fail(cudaErrorInvalidValue);
  if (!stream_captures(s))
    return fail(cudaErrorNotSupported);
  *p = malloc(n ? n : 1);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

STUB_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  count(__func__);
  if (!stream_captures(s))
    return fail(cudaErrorInvalidValue);
  free(p);
  return cudaSuccess;
}

/* The rest of the allocator answers "not supported"; the stand-in is built
 * without the unused-parameter warning for these one-liners. */
#define UNSUPPORTED(name, ...)                                                 \
  STUB_API cudaError_t name(__VA_ARGS__) {                                     \
    count(#name);                                                              \
    return fail(cudaErrorNotSupported);                                        \
  }

UNSUPPORTED(cudaMallocFromPoolAsync, void **p, size_t n, cudaMemPool_t pool,
            cudaStream_t s)
UNSUPPORTED(cudaMallocFromPoolAsync_ptsz, void **p, size_t n,
            cudaMemPool_t pool, cudaStream_t s)
UNSUPPORTED(cudaMallocAsync_ptsz, void **p, size_t n, cudaStream_t s)
UNSUPPORTED(cudaFreeAsync_ptsz, void *p, cudaStream_t s)
UNSUPPORTED(cudaMemPoolCreate, cudaMemPool_t *pool,
            const struct cudaMemPoolProps *props)
UNSUPPORTED(cudaMemPoolDestroy, cudaMemPool_t pool)
UNSUPPORTED(cudaMemPoolGetAttribute, cudaMemPool_t pool, enum cudaMemPoolAttr a,
            void *v)
UNSUPPORTED(cudaMemPoolSetAttribute, cudaMemPool_t pool, enum cudaMemPoolAttr a,
            void *v)
UNSUPPORTED(cudaMemPoolSetAccess, cudaMemPool_t pool,
            const struct cudaMemAccessDesc *d, size_t n)
UNSUPPORTED(cudaMemPoolGetAccess, enum cudaMemAccessFlags *f,
            cudaMemPool_t pool, struct cudaMemLocation *l)
UNSUPPORTED(cudaMemPoolTrimTo, cudaMemPool_t pool, size_t keep)
UNSUPPORTED(cudaMemPoolExportToShareableHandle, void *h, cudaMemPool_t pool,
            enum cudaMemAllocationHandleType t, unsigned int f)
UNSUPPORTED(cudaMemPoolImportFromShareableHandle, cudaMemPool_t *pool, void *h,
            enum cudaMemAllocationHandleType t, unsigned int f)
UNSUPPORTED(cudaMemPoolExportPointer, struct cudaMemPoolPtrExportData *d,
            void *p)
UNSUPPORTED(cudaMemPoolImportPointer, void **p, cudaMemPool_t pool,
            struct cudaMemPoolPtrExportData *d)
UNSUPPORTED(cudaDeviceGetDefaultMemPool, cudaMemPool_t *pool, int d)
UNSUPPORTED(cudaDeviceGetMemPool, cudaMemPool_t *pool, int d)
UNSUPPORTED(cudaDeviceSetMemPool, int d, cudaMemPool_t pool)
UNSUPPORTED(cudaMemGetDefaultMemPool, cudaMemPool_t *pool,
            struct cudaMemLocation *l, enum cudaMemAllocationType t)
UNSUPPORTED(cudaMemGetMemPool, cudaMemPool_t *pool, struct cudaMemLocation *l,
            enum cudaMemAllocationType t)
UNSUPPORTED(cudaMemSetMemPool, struct cudaMemLocation *l,
            enum cudaMemAllocationType t, cudaMemPool_t pool)
UNSUPPORTED(cudaPointerGetAttributes, struct cudaPointerAttributes *a,
            const void *p)
UNSUPPORTED(cudaStreamSynchronize_ptsz, cudaStream_t s)
UNSUPPORTED(cudaEventRecord_ptsz, cudaEvent_t e, cudaStream_t s)
UNSUPPORTED(cudaEventRecordWithFlags, cudaEvent_t e, cudaStream_t s,
            unsigned int f)
UNSUPPORTED(cudaEventRecordWithFlags_ptsz, cudaEvent_t e, cudaStream_t s,
            unsigned int f)
UNSUPPORTED(cudaStreamWaitEvent_ptsz, cudaStream_t s, cudaEvent_t e,
            unsigned int f)
UNSUPPORTED(cudaLaunchHostFunc_ptsz, cudaStream_t s, cudaHostFn_t fn, void *arg)
