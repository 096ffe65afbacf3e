/* The driver-level layer's machinery: the driver functions it calls itself,
 * where a driver call goes (tidepool or the driver) from the calling
 * thread's context, devices by ordinal, and CUresult codes. The wrapped
 * entry points are in driver_alloc.c and driver_observe.c, and are handed
 * out by hook.c. */
#include <pthread.h>
#include <string.h>

#include "driver.h"

/* ---- the driver's functions ------------------------------------------------
 * Every one the layer calls for itself, at the ABI version of its PFN
 * type. */
#define DRV_HELPERS(X)                                                         \
  X(cuDeviceGet, 2000)                                                         \
  X(cuDeviceGetCount, 2000)                                                    \
  X(cuCtxGetCurrent, 4000)                                                     \
  X(cuCtxSetCurrent, 4000)                                                     \
  X(cuCtxGetDevice, 2000)                                                      \
  X(cuDevicePrimaryCtxGetState, 7000)                                          \
  X(cuDevicePrimaryCtxRetain, 7000)                                            \
  X(cuStreamIsCapturing, 10000)

static struct {
#define DRV_FIELD(name, version) PFN_##name##_v##version name;
  DRV_HELPERS(DRV_FIELD)
#undef DRV_FIELD
  PFN_cuStreamIsCapturing_v10000_ptsz cuStreamIsCapturing_ptsz;
  /* Optional (a stand-in driver may lack it): without it, a call on
   * tidepool's object with a stream, made without a primary context
   * current, goes to the driver. */
  PFN_cuStreamGetCtx_v9020 cuStreamGetCtx;
  /* Optional too: without it, a capture begun through the interposer stays
   * counted for good (seen.h), and allocations ask the driver again. */
  PFN_cuStreamGetCaptureInfo_v12030 cuStreamGetCaptureInfo;
} drv;
static _Atomic int drv_state; /* 0 not loaded, 1 loaded, -1 incomplete */
static pthread_mutex_t drv_lock = PTHREAD_MUTEX_INITIALIZER;

tp__pl_fn tp__pl_drv_fetch(PFN_cuGetProcAddress_v12000 get_proc,
                           const char *name, int version, bool per_thread) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  if (get_proc(name, &fn, version, flags, &found) != CUDA_SUCCESS ||
      found != CU_GET_PROC_ADDRESS_SUCCESS)
    return NULL;
  tp__pl_fn out = NULL;
  memcpy(&out, &fn, sizeof out);
  return out;
}

/* Copies a fetched function into its typed field; false when missing. */
#define DRV_SET(field, fn) (memcpy(&(field), &(fn), sizeof(field)), fn != NULL)

static int context_device(void);

bool tp__pl_drv_load(PFN_cuGetProcAddress_v12000 get_proc) {
  int state = atomic_load_explicit(&drv_state, memory_order_acquire);
  if (state != 0)
    return state > 0;
  pthread_mutex_lock(&drv_lock);
  if (atomic_load_explicit(&drv_state, memory_order_relaxed) == 0) {
    bool complete = true;
    tp__pl_fn fn;
#define DRV_LOAD(name, version)                                                \
  fn = tp__pl_drv_fetch(get_proc, #name, version, false);                      \
  complete = DRV_SET(drv.name, fn) && complete;
    DRV_HELPERS(DRV_LOAD)
#undef DRV_LOAD
    fn = tp__pl_drv_fetch(get_proc, "cuStreamIsCapturing", 10000, true);
    complete = DRV_SET(drv.cuStreamIsCapturing_ptsz, fn) && complete;
    fn = tp__pl_drv_fetch(get_proc, "cuStreamGetCtx", 9020, false);
    (void)DRV_SET(drv.cuStreamGetCtx, fn);
    fn = tp__pl_drv_fetch(get_proc, "cuStreamGetCaptureInfo", 12030, false);
    (void)DRV_SET(drv.cuStreamGetCaptureInfo, fn);
    atomic_store_explicit(&drv_state, complete ? 1 : -1, memory_order_release);
    if (complete)
      tp__pl_set_context_device(context_device);
  }
  pthread_mutex_unlock(&drv_lock);
  return atomic_load_explicit(&drv_state, memory_order_acquire) > 0;
}

bool tp__pl_drv_loaded(void) {
  return atomic_load_explicit(&drv_state, memory_order_acquire) > 0;
}

/* ---- devices ---------------------------------------------------------------
 * The driver's CUdevice is a handle of its own, which the allocator's
 * calls take (cuDeviceGetDefaultMemPool) and tidepool's ordinals are not:
 * the pairs are learned once, from cuDeviceGet. */

#define DRV_MAX_DEVICES 256
static CUdevice handles[DRV_MAX_DEVICES];
static int handle_count;
static _Atomic int handles_ready; /* 0 not yet, 1 ready */
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;

static bool learn_handles(void) {
  if (atomic_load_explicit(&handles_ready, memory_order_acquire))
    return true;
  pthread_mutex_lock(&handles_lock);
  if (!atomic_load_explicit(&handles_ready, memory_order_relaxed)) {
    int n = 0;
    bool ok = drv.cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0;
    if (n > DRV_MAX_DEVICES)
      n = DRV_MAX_DEVICES;
    for (int i = 0; ok && i < n; i++)
      ok = drv.cuDeviceGet(&handles[i], i) == CUDA_SUCCESS;
    if (ok) {
      handle_count = n;
      atomic_store_explicit(&handles_ready, 1, memory_order_release);
    }
  }
  pthread_mutex_unlock(&handles_lock);
  return atomic_load_explicit(&handles_ready, memory_order_acquire);
}

int tp__pl_drv_ordinal(CUdevice dev) {
  if (!tp__pl_drv_loaded() || !learn_handles())
    return -1;
  for (int i = 0; i < handle_count; i++)
    if (handles[i] == dev)
      return i;
  return -1;
}

bool tp__pl_drv_device(int ordinal, CUdevice *dev) {
  if (!tp__pl_drv_loaded() || !learn_handles() || ordinal < 0 ||
      ordinal >= handle_count)
    return false;
  *dev = handles[ordinal];
  return true;
}

/* The primary context of each device, once the driver says it is active.
 * It stays retained: tidepool retains it too, for the life of the process.
 * A device whose primary context is not active cannot have it current, and
 * asking does not create it (creating one costs memory on the device). */
static _Atomic(CUcontext) primaries[DRV_MAX_DEVICES];

static bool is_primary(int ordinal, CUcontext ctx) {
  CUcontext p = atomic_load_explicit(&primaries[ordinal], memory_order_acquire);
  if (p)
    return p == ctx;
  unsigned flags = 0;
  int active = 0;
  CUdevice dev = handles[ordinal];
  if (drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
      !active || drv.cuDevicePrimaryCtxRetain(&p, dev) != CUDA_SUCCESS)
    return false;
  CUcontext none = NULL;
  /* A thread that lost the race gives its retain back to nobody: the
   * context is retained for good either way. */
  (void)atomic_compare_exchange_strong_explicit(&primaries[ordinal], &none, p,
                                                memory_order_acq_rel,
                                                memory_order_acquire);
  return p == ctx;
}

/* ---- the mode, asked of the driver ------------------------------------------
 */

static int driver_probe(int *device) {
  int n = 0;
  CUresult r = drv.cuDeviceGetCount(&n);
  /* Before cuInit the driver answers nothing: a later call decides. */
  if (r == CUDA_ERROR_NOT_INITIALIZED)
    return -1;
  if (r != CUDA_SUCCESS || n <= 0)
    return 0;
  CUdevice dev = 0;
  int ordinal = -1;
  if (drv.cuCtxGetDevice(&dev) == CUDA_SUCCESS)
    ordinal = tp__pl_drv_ordinal(dev);
  *device = ordinal >= 0 ? ordinal : 0;
  return 1;
}

CUcontext tp__pl_drv_ctx_save(void) {
  CUcontext ctx = NULL;
  if (tp__pl_drv_loaded() && drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
    ctx = NULL;
  return ctx;
}

void tp__pl_drv_ctx_restore(CUcontext ctx) {
  CUcontext now = NULL;
  if (tp__pl_drv_loaded() && drv.cuCtxGetCurrent(&now) == CUDA_SUCCESS &&
      now != ctx)
    (void)drv.cuCtxSetCurrent(ctx);
}

/* ---- where a call goes ------------------------------------------------------
 */

/* The primary context the thread last found current, and its device: a
 * primary context stays retained for the life of the process (see
 * is_primary), so its handle names it for good, and a call that finds it
 * current again needs no cuCtxGetDevice. */
static TP_TLS CUcontext last_primary;
static TP_TLS int last_ordinal;

static int primary_known(CUcontext ctx) {
  return ctx == last_primary ? last_ordinal : -1;
}

static void primary_note(CUcontext ctx, int ordinal) {
  last_primary = ctx;
  last_ordinal = ordinal;
}

/* The ordinal of the device whose primary context is current on the
 * calling thread (the context in *ctx); -1 where no context is, or another
 * one. One cuCtxGetCurrent where the thread found the same context before. */
static int current_primary(CUcontext *out) {
  CUcontext ctx = NULL;
  if (drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
    return -1;
  *out = ctx;
  int ordinal = primary_known(ctx);
  if (ordinal >= 0)
    return ordinal;
  CUdevice dev = 0;
  if (drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
    return -1;
  ordinal = tp__pl_drv_ordinal(dev);
  if (ordinal < 0 || !is_primary(ordinal, ctx))
    return -1;
  primary_note(ctx, ordinal);
  return ordinal;
}

/* For the runtime's entry points (tp__pl_set_context_device). */
static int context_device(void) {
  CUcontext ctx = NULL;
  return current_primary(&ctx);
}

int tp__pl_drv_enter(bool decide, CUresult *err) {
  if (tp__pl_runtime_depth > 0 || !tp__pl_drv_loaded())
    return TP_PL_DRV_PASS;
  if (tp__pl_mode() == TP_PL_UNDECIDED) {
    if (!decide)
      return TP_PL_DRV_PASS;
    CUcontext saved = tp__pl_drv_ctx_save();
    bool on = tp__pl_active_via(driver_probe);
    tp__pl_drv_ctx_restore(saved);
    if (!on)
      return TP_PL_DRV_PASS;
  } else if (!tp__pl_on()) {
    return TP_PL_DRV_PASS;
  }
  CUcontext ctx = NULL;
  int ordinal = current_primary(&ctx);
  if (ordinal < 0)
    return TP_PL_DRV_OTHER;
  /* tidepool's first call on a thread makes the context of its device 0
   * current, and setting its device makes that device's primary context
   * current: the context current now, as checked above. */
  int ours = -1;
  tp_error_t e = tp_get_device(&ours);
  if (e == TP_SUCCESS && ours != ordinal)
    e = tp_set_device(ordinal);
  if (e != TP_SUCCESS) {
    tp__pl_drv_ctx_restore(ctx);
    *err = tp__pl_drv_error(e);
    return TP_PL_DRV_FAILED;
  }
  return TP_PL_DRV_OURS;
}

/* The ordinal of the device whose primary context `ctx` is, made current
 * to ask; -1 where it is no primary context. */
static int primary_ordinal(CUcontext ctx) {
  CUdevice dev = 0;
  if (!ctx || drv.cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
    return -1;
  int ordinal = tp__pl_drv_ordinal(dev);
  return ordinal >= 0 && is_primary(ordinal, ctx) ? ordinal : -1;
}

int tp__pl_drv_own(bool has_stream, CUstream stream, CUcontext *saved,
                   CUresult *err) {
  *saved = tp__pl_drv_ctx_save();
  int ordinal = -1;
  if (has_stream &&
      (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD))
    return TP_PL_DRV_OTHER;
  /* With TIDEPOOL_PRELOAD=host the streams are tidepool's, of no context. */
  if (has_stream && !tp__pl_host_requested()) {
    CUcontext of = NULL;
    if (!drv.cuStreamGetCtx || drv.cuStreamGetCtx(stream, &of) != CUDA_SUCCESS)
      return TP_PL_DRV_OTHER;
    ordinal = primary_ordinal(of);
    if (ordinal < 0) {
      tp__pl_drv_ctx_restore(*saved);
      return TP_PL_DRV_OTHER;
    }
  } else if (tp_get_device(&ordinal) != TP_SUCCESS) {
    ordinal = 0;
  }
  tp_error_t e = tp_set_device(ordinal);
  if (e != TP_SUCCESS) {
    tp__pl_drv_ctx_restore(*saved);
    *err = tp__pl_drv_error(e);
    return TP_PL_DRV_FAILED;
  }
  return TP_PL_DRV_OURS;
}

bool tp__pl_drv_capturing(CUstream stream, bool per_thread) {
  if (tp__pl_host_requested())
    return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = per_thread ? drv.cuStreamIsCapturing_ptsz(stream, &status)
                          : drv.cuStreamIsCapturing(stream, &status);
  return r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

uint64_t tp__pl_drv_capture_id(CUstream stream, bool per_thread,
                               bool *capturing) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t id = 0;
  /* A per-thread variant's NULL is the per-thread stream, which its own
   * handle names to any variant. */
  if (per_thread && stream == NULL)
    stream = CU_STREAM_PER_THREAD;
  CUresult r = drv.cuStreamGetCaptureInfo
                   ? drv.cuStreamGetCaptureInfo(stream, &status, &id, NULL,
                                                NULL, NULL, NULL)
                   : TP_PL_DRV_NO_DRIVER;
  *capturing = r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
  return r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE ? id : 0;
}

/* ---- errors -----------------------------------------------------------------
 * tidepool's errors are the driver's; a platform error on the cuda platform
 * is the driver's own code, passed on. */

CUresult tp__pl_drv_error(tp_error_t err) {
  switch (err) {
  case TP_SUCCESS: return CUDA_SUCCESS;
  case TP_ERROR_INVALID_VALUE: return CUDA_ERROR_INVALID_VALUE;
  case TP_ERROR_OUT_OF_MEMORY: return CUDA_ERROR_OUT_OF_MEMORY;
  case TP_ERROR_NOT_SUPPORTED: return CUDA_ERROR_NOT_SUPPORTED;
  case TP_ERROR_INVALID_DEVICE: return CUDA_ERROR_INVALID_DEVICE;
  case TP_ERROR_NOT_PERMITTED:
    return tp__pl_forked() ? CUDA_ERROR_NOT_INITIALIZED
                           : CUDA_ERROR_NOT_PERMITTED;
  case TP_ERROR_NOT_READY: return CUDA_ERROR_NOT_READY;
  case TP_ERROR_NO_DEVICE: return CUDA_ERROR_NO_DEVICE;
  case TP_ERROR_ILLEGAL_ADDRESS: return CUDA_ERROR_ILLEGAL_ADDRESS;
  case TP_ERROR_PLATFORM: {
    int code = 0;
    (void)tp_get_last_platform_error(&code, NULL);
    /* On the host platform the code is an errno, not a CUresult. */
    if (tp__pl_mode() == TP_PL_CUDA && code != CUDA_SUCCESS)
      return (CUresult)code;
    return CUDA_ERROR_UNKNOWN;
  }
  /* tidepool's capture errors carry the driver's own values. */
  case TP_ERROR_ILLEGAL_STATE:
  case TP_ERROR_STREAM_CAPTURE_UNSUPPORTED:
  case TP_ERROR_STREAM_CAPTURE_INVALIDATED:
  case TP_ERROR_STREAM_CAPTURE_MERGE:
  case TP_ERROR_STREAM_CAPTURE_UNMATCHED:
  case TP_ERROR_STREAM_CAPTURE_UNJOINED:
  case TP_ERROR_STREAM_CAPTURE_ISOLATION:
  case TP_ERROR_STREAM_CAPTURE_IMPLICIT:
  case TP_ERROR_CAPTURED_EVENT:
  case TP_ERROR_STREAM_CAPTURE_WRONG_THREAD: return (CUresult)err;
  }
  return CUDA_ERROR_UNKNOWN;
}

void tp__pl_drv_count(int counter) {
  tp__pl_count(counter);
  tp__pl_count(TP_PL_COUNT_DRIVER);
}

CUresult tp__pl_drv_answer(tp_error_t err, int counter) {
  tp__pl_drv_count(counter);
  if (err != TP_SUCCESS)
    tp__pl_count(TP_PL_COUNT_FAILED);
  return tp__pl_drv_error(err);
}
