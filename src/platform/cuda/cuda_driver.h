/* The cuda platform's driver access, owned by cuda_driver.c: the table of
 * driver entry points fetched at run time, the lazily initialised state of
 * each device, the encoding of platform streams and the helpers that make a
 * context current for the length of one driver call. Only
 * src/platform/cuda/ includes it. */
#ifndef TP_CUDA_DRIVER_H
#define TP_CUDA_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "common/common.h"
#include "common/lock.h"
#include "platform/platform.h"

/* Every driver function the platform calls, with the ABI version it is
 * fetched at: the PFN type of that version types the table's field, so a
 * newer driver still hands back the calling convention this code was
 * written for. The third column says whether init fails without it.
 *
 * The field takes the symbol's name, which cuda.h may define as a macro of
 * a versioned name (cuDeviceTotalMem is cuDeviceTotalMem_v2); declaration
 * and use expand alike, and the name given to cuGetProcAddress is the
 * stringified, unexpanded one, which is what that function expects. */
#define TP_CU_ENTRY_POINTS(X)                                                  \
  X(cuGetErrorName, 6000, 1)                                                   \
  X(cuInit, 2000, 1)                                                           \
  X(cuDeviceGet, 2000, 1)                                                      \
  X(cuDeviceGetCount, 2000, 1)                                                 \
  X(cuDeviceGetAttribute, 2000, 1)                                             \
  X(cuDeviceTotalMem, 3020, 1)                                                 \
  X(cuDevicePrimaryCtxRetain, 7000, 1)                                         \
  X(cuCtxGetCurrent, 4000, 1)                                                  \
  X(cuCtxSetCurrent, 4000, 1)                                                  \
  X(cuCtxGetDevice, 2000, 1)                                                   \
  X(cuCtxSynchronize, 2000, 1)                                                 \
  X(cuStreamCreate, 2000, 1)                                                   \
  X(cuStreamDestroy, 4000, 1)                                                  \
  X(cuStreamGetId, 12000, 1)                                                   \
  X(cuStreamGetFlags, 5050, 1)                                                 \
  X(cuStreamGetCtx, 9020, 1)                                                   \
  X(cuStreamGetDevice, 12080, 0)                                               \
  X(cuStreamSynchronize, 2000, 1)                                              \
  X(cuStreamQuery, 2000, 1)                                                    \
  X(cuStreamWaitEvent, 3020, 1)                                                \
  X(cuMemsetD8Async, 3020, 1)                                                  \
  X(cuMemcpyAsync, 4000, 1)                                                    \
  X(cuLaunchHostFunc, 10000, 1)                                                \
  X(cuEventCreate, 2000, 1)                                                    \
  X(cuEventDestroy, 4000, 1)                                                   \
  X(cuEventRecord, 2000, 1)                                                    \
  X(cuEventQuery, 2000, 1)                                                     \
  X(cuEventSynchronize, 2000, 1)                                               \
  X(cuMemGetAllocationGranularity, 10020, 1)                                   \
  X(cuMemAddressReserve, 10020, 1)                                             \
  X(cuMemAddressFree, 10020, 1)                                                \
  X(cuMemCreate, 10020, 1)                                                     \
  X(cuMemRelease, 10020, 1)                                                    \
  X(cuMemMap, 10020, 1)                                                        \
  X(cuMemUnmap, 10020, 1)                                                      \
  X(cuMemSetAccess, 10020, 1)                                                  \
  X(cuMemExportToShareableHandle, 10020, 0)                                    \
  X(cuMemImportFromShareableHandle, 10020, 0)                                  \
  X(cuDeviceGetUuid, 11040, 0)                                                 \
  TP_CU_CAPTURE_ENTRY_POINTS(X)

/* Stream capture and graphs (cuda_capture.c). Optional: a driver without
 * them runs everything but capture, which answers NOT_SUPPORTED. */
#define TP_CU_CAPTURE_ENTRY_POINTS(X)                                          \
  X(cuStreamBeginCapture, 10010, 0)                                            \
  X(cuThreadExchangeStreamCaptureMode, 10010, 0)                               \
  X(cuStreamEndCapture, 10000, 0)                                              \
  X(cuStreamIsCapturing, 10000, 0)                                             \
  X(cuStreamGetCaptureInfo, 12030, 0)                                          \
  X(cuStreamUpdateCaptureDependencies, 12030, 0)                               \
  X(cuGraphAddEmptyNode, 10000, 0)                                             \
  X(cuGraphNodeGetDependencies, 12030, 0)                                      \
  X(cuGraphNodeGetDependentNodes, 12030, 0)                                    \
  X(cuGraphAddDependencies, 12030, 0)                                          \
  X(cuGraphGetNodes, 10000, 0)                                                 \
  X(cuGraphNodeGetType, 10000, 0)                                              \
  X(cuGraphDestroyNode, 10000, 0)                                              \
  X(cuUserObjectCreate, 11030, 0)                                              \
  X(cuUserObjectRelease, 11030, 0)                                             \
  X(cuGraphRetainUserObject, 11030, 0)                                         \
  X(cuGraphReleaseUserObject, 11030, 0)                                        \
  X(cuGraphInstantiateWithFlags, 11040, 0)                                     \
  X(cuGraphLaunch, 10000, 0)                                                   \
  X(cuGraphExecDestroy, 10000, 0)                                              \
  X(cuGraphDestroy, 10000, 0)

typedef struct tp__cu_api {
#define TP_CU_FIELD_(name, version, required) PFN_##name##_v##version name;
  TP_CU_ENTRY_POINTS(TP_CU_FIELD_)
#undef TP_CU_FIELD_
} tp__cu_api;

/* Filled once by init and read-only afterwards; an optional entry point the
 * driver lacks stays NULL. */
extern tp__cu_api tp__cu;

/* An event of the platform. Destroyed events go to their device's free
 * list and are handed out again, keeping their CUevent when it had
 * completed (see tp__cu_event_destroy). */
struct tp__pevent {
  CUevent ev; /* NULL only in a shell on the free list */
  int device;
  /* Last recorded in a capture: never asked about, since the question
   * invalidates that capture (an H100, driver 580). */
  bool captured;
  struct tp__pevent *next;
};

/* What the platform knows of one device. `dev` is set by init; `ctx` and
 * `legacy_uid` are set once, under the platform's lock, before `ready` is
 * released, so that readers who acquire `ready` may use them unlocked. */
typedef struct tp__cu_dev {
  CUdevice dev;
  atomic_int ready;
  CUcontext ctx;       /* the retained primary context, never released */
  uint64_t legacy_uid; /* cuStreamGetId of CU_STREAM_LEGACY in ctx */
  tp__spin ev_lock;    /* guards the two fields below */
  struct tp__pevent *ev_free;
  unsigned ev_free_count;
  atomic_int managed; /* probe of managed VMM chunks: 0 unknown, 1, -1 */
} tp__cu_dev;

extern int tp__cu_device_count;
extern tp__cu_dev *tp__cu_devs;

/* The one mapping from driver results to tidepool errors. */
tp_error_t tp__cu_error(CUresult r);

/* Device state with its primary context retained, or INVALID_DEVICE. */
tp_error_t tp__cu_dev_get(int device, tp__cu_dev **out);

/* The ordinal of a CUdevice, or -1. */
int tp__cu_ordinal(CUdevice dev);

/* A context made current for the length of a few driver calls, after which
 * the thread's previous one is put back: tidepool must not move a thread
 * that also uses the CUDA runtime to another device behind its back. */
typedef struct tp__cu_scope {
  CUcontext prev;
  int switched;
  int relaxed; /* the thread's capture mode is to be put back */
  CUstreamCaptureMode mode;
} tp__cu_scope;

tp_error_t tp__cu_scope_enter(const tp__cu_dev *d, tp__cu_scope *scope);
/* As above for work that needs some context but no particular one: the
 * thread's current context if it has one, else device 0's. */
tp_error_t tp__cu_scope_enter_any(tp__cu_scope *scope);
void tp__cu_scope_leave(tp__cu_scope *scope);
/* Within a scope, runs the calls in relaxed capture mode until the scope
 * is left: memory and event calls touch no stream, yet during a capture in
 * global or thread-local mode the driver would refuse them as potentially
 * unsafe and invalidate the capture (PyTorch runs cudaMalloc so during
 * capture, for the same reason). */
void tp__cu_scope_relax(tp__cu_scope *scope);

/* Platform streams. A stream the driver made (by stream_create or by the
 * user) is its CUstream cast to tp__pstream *. The special streams
 * CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean different streams in
 * different contexts, so their tp__pstream * also names the device:
 * ((device + 1) << 2) | kind, with kind the special handle's own value (1
 * or 2). Such values stay below 64 KiB, which Linux keeps unmapped
 * (vm.mmap_min_addr), so no CUstream, a pointer to a driver object, can
 * take one. The per-thread kind means the per-thread stream of whichever
 * thread makes the call. */
#define TP_CU_SPECIAL_LIMIT ((uintptr_t)1 << 16)
#define TP_CU_MAX_SPECIAL_DEVICE ((int)(TP_CU_SPECIAL_LIMIT >> 2) - 2)

static inline tp__pstream *tp__cu_special_ps(int device, CUstream kind) {
  return (tp__pstream *)((((uintptr_t)device + 1) << 2) | (uintptr_t)kind);
}

/* Resolves a platform stream to the CUstream to pass to the driver, and,
 * for the special streams, makes their device's context current in
 * `scope` (which the caller leaves after the driver call). */
static inline tp_error_t tp__cu_stream_begin(tp__pstream *ps, CUstream *s,
                                             tp__cu_scope *scope) {
  uintptr_t v = (uintptr_t)ps;
  scope->switched = 0;
  scope->relaxed = 0;
  if (TP_LIKELY(v >= TP_CU_SPECIAL_LIMIT)) {
    *s = (CUstream)ps;
    return TP_SUCCESS;
  }
  TP_RETURN_IF(v == 0, TP_ERROR_INVALID_VALUE);
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get((int)(v >> 2) - 1, &d));
  *s = (CUstream)(v & 3u);
  return tp__cu_scope_enter(d, scope);
}

/* Calls the driver on a platform stream: `call` is an expression of type
 * CUresult in which `s_` is the CUstream. */
#define TP_CU_ON_STREAM(ps, call)                                              \
  do {                                                                         \
    CUstream s_;                                                               \
    tp__cu_scope scope_;                                                       \
    TP_FORWARD(tp__cu_stream_begin((ps), &s_, &scope_));                       \
    CUresult r_ = (call);                                                      \
    tp__cu_scope_leave(&scope_);                                               \
    return tp__cu_error(r_);                                                   \
  } while (0)

#endif /* TP_CUDA_DRIVER_H */
