/* The cuda platform's link to the driver: loading libcuda at run time and
 * fetching its entry points, the one mapping of CUresult to tidepool
 * errors, per-device state with its primary context, and context switching.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "platform/cuda/cuda_driver.h"
#include "platform/cuda/cuda_internal.h"

tp__cu_api tp__cu;
int tp__cu_device_count;
tp__cu_dev *tp__cu_devs;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static tp_error_t init_result = TP_ERROR_NO_DEVICE;
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

/* Function and object pointers have one representation on every platform
 * with dlsym (POSIX requires it); ISO C only forbids converting them with a
 * cast, so the bytes are copied instead. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must be as wide as object pointers");
#define TP_CU_SET_FN(dst, src) memcpy(&(dst), &(src), sizeof(dst))

/* Init explains its failures only to a user who asked for cuda: a program
 * that merely lets tidepool choose must fall back to host silently. */
static bool cuda_requested(void) {
  const char *want = getenv("TIDEPOOL_PLATFORM");
  return want && strcmp(want, "cuda") == 0;
}

static const char *error_name(CUresult r) {
  const char *name = NULL;
  if (!tp__cu.cuGetErrorName || tp__cu.cuGetErrorName(r, &name) != CUDA_SUCCESS)
    return "CUDA_ERROR_UNKNOWN";
  return name;
}

tp_error_t tp__cu_error(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return TP_SUCCESS;
  case CUDA_ERROR_NOT_READY: return TP_ERROR_NOT_READY;
  case CUDA_ERROR_ILLEGAL_ADDRESS: return TP_ERROR_ILLEGAL_ADDRESS;
  case CUDA_ERROR_OUT_OF_MEMORY: return TP_ERROR_OUT_OF_MEMORY;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE: return TP_ERROR_INVALID_VALUE;
  case CUDA_ERROR_INVALID_DEVICE: return TP_ERROR_INVALID_DEVICE;
  /* Stream capture's errors are the runtime's, value for value. */
  case CUDA_ERROR_ILLEGAL_STATE: return TP_ERROR_ILLEGAL_STATE;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    return TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    return TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  case CUDA_ERROR_STREAM_CAPTURE_MERGE: return TP_ERROR_STREAM_CAPTURE_MERGE;
  case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    return TP_ERROR_STREAM_CAPTURE_UNMATCHED;
  case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    return TP_ERROR_STREAM_CAPTURE_UNJOINED;
  case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
    return TP_ERROR_STREAM_CAPTURE_ISOLATION;
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    return TP_ERROR_STREAM_CAPTURE_IMPLICIT;
  case CUDA_ERROR_CAPTURED_EVENT: return TP_ERROR_CAPTURED_EVENT;
  case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    return TP_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  default: return tp__platform_fail((int)r, error_name(r));
  }
}

static bool fetch_one(PFN_cuGetProcAddress_v12000 get_proc, const char *name,
                      int version, void **fn) {
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  *fn = NULL;
  /* The legacy-stream flavour is asked for explicitly: the platform names
   * CU_STREAM_LEGACY and CU_STREAM_PER_THREAD itself and never relies on
   * what a NULL stream would mean. */
  CUresult r =
      get_proc(name, fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
  return r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *fn;
}

static bool missing(const char *name, int version) {
  if (cuda_requested())
    fprintf(stderr, "tidepool: libcuda lacks %s (version %d)\n", name, version);
  return false;
}

/* Fetches every entry point of the table. A required one missing fails the
 * load; an optional one stays NULL. */
static bool fetch_entry_points(PFN_cuGetProcAddress_v12000 get_proc) {
  bool complete = true;
  void *fn;
#define TP_CU_FETCH_(name, version, required)                                  \
  if (fetch_one(get_proc, #name, version, &fn))                                \
    TP_CU_SET_FN(tp__cu.name, fn);                                             \
  else if (required)                                                           \
    complete = missing(#name, version);
  TP_CU_ENTRY_POINTS(TP_CU_FETCH_)
#undef TP_CU_FETCH_
  return complete;
}

static tp_error_t load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  TP_RETURN_IF(!lib, TP_ERROR_NO_DEVICE);
  /* The handle stays open for the life of the process: the driver's
   * threads and the contexts retained below live in it. The versioned
   * cuGetProcAddress came with CUDA 12.0, as did cuStreamGetId, so its
   * presence is the driver version check. */
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  if (!sym) {
    if (cuda_requested())
      fprintf(stderr, "tidepool: libcuda has no cuGetProcAddress_v2; a "
                      "driver for CUDA 12.0 or newer is needed\n");
    (void)dlclose(lib);
    return TP_ERROR_NO_DEVICE;
  }
  PFN_cuGetProcAddress_v12000 get_proc;
  TP_CU_SET_FN(get_proc, sym);
  /* Unusable before cuInit: let go. After it the driver's threads may run
   * in the library, which then stays (the process falls back to host). */
  if (!fetch_entry_points(get_proc)) {
    memset(&tp__cu, 0, sizeof tp__cu);
    (void)dlclose(lib);
    return TP_ERROR_NO_DEVICE;
  }

  CUresult r = tp__cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    if (cuda_requested())
      fprintf(stderr, "tidepool: cuInit failed (%s)\n", error_name(r));
    return TP_ERROR_NO_DEVICE;
  }
  int count = 0;
  r = tp__cu.cuDeviceGetCount(&count);
  TP_RETURN_IF(r != CUDA_SUCCESS || count <= 0, TP_ERROR_NO_DEVICE);
  TP_RETURN_IF(count > TP_CU_MAX_SPECIAL_DEVICE, TP_ERROR_NO_DEVICE);

  tp__cu_dev *devs = calloc((size_t)count, sizeof *devs);
  TP_RETURN_IF(!devs, TP_ERROR_OUT_OF_MEMORY);
  for (int i = 0; i < count; i++) {
    r = tp__cu.cuDeviceGet(&devs[i].dev, i);
    if (r != CUDA_SUCCESS) {
      free(devs);
      return tp__cu_error(r);
    }
  }
  tp__cu_devs = devs;
  tp__cu_device_count = count;
  return TP_SUCCESS;
}

static void init_once_fn(void) {
  init_result = load();
}

tp_error_t tp__cu_init(void) {
  pthread_once(&init_once, init_once_fn);
  return init_result;
}

tp_error_t tp__cu_device_count_op(int *count) {
  *count = tp__cu_device_count;
  return TP_SUCCESS;
}

int tp__cu_ordinal(CUdevice dev) {
  for (int i = 0; i < tp__cu_device_count; i++)
    if (tp__cu_devs[i].dev == dev)
      return i;
  return -1;
}

/* First use of a device: retain its primary context (the one the CUDA
 * runtime uses, so that streams and memory are shared with it) and learn
 * the identity of its legacy stream, which lasts as long as the context. */
static tp_error_t dev_start(tp__cu_dev *d) {
  CUresult r;
  /* A start that failed after the retain keeps the context for the next
   * attempt rather than retaining it once more. */
  if (!d->ctx) {
    r = tp__cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
    TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  }
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter(d, &scope));
  unsigned long long id = 0;
  r = tp__cu.cuStreamGetId(CU_STREAM_LEGACY, &id);
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  d->legacy_uid = id;
  return TP_SUCCESS;
}

tp_error_t tp__cu_dev_get(int device, tp__cu_dev **out) {
  TP_RETURN_IF(device < 0 || device >= tp__cu_device_count,
               TP_ERROR_INVALID_DEVICE);
  tp__cu_dev *d = &tp__cu_devs[device];
  *out = d;
  if (TP_LIKELY(atomic_load_explicit(&d->ready, memory_order_acquire)))
    return TP_SUCCESS;
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&dev_lock);
  if (!atomic_load_explicit(&d->ready, memory_order_relaxed)) {
    err = dev_start(d);
    if (err == TP_SUCCESS)
      atomic_store_explicit(&d->ready, 1, memory_order_release);
  }
  pthread_mutex_unlock(&dev_lock);
  return err;
}

tp_error_t tp__cu_scope_enter(const tp__cu_dev *d, tp__cu_scope *scope) {
  scope->switched = 0;
  scope->relaxed = 0;
  CUcontext cur = NULL;
  CUresult r = tp__cu.cuCtxGetCurrent(&cur);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  if (cur == d->ctx)
    return TP_SUCCESS;
  r = tp__cu.cuCtxSetCurrent(d->ctx);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  scope->prev = cur;
  scope->switched = 1;
  return TP_SUCCESS;
}

tp_error_t tp__cu_scope_enter_any(tp__cu_scope *scope) {
  scope->switched = 0;
  scope->relaxed = 0;
  CUcontext cur = NULL;
  CUresult r = tp__cu.cuCtxGetCurrent(&cur);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  if (cur)
    return TP_SUCCESS;
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(0, &d));
  return tp__cu_scope_enter(d, scope);
}

void tp__cu_scope_relax(tp__cu_scope *scope) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (!scope->relaxed && tp__cu.cuThreadExchangeStreamCaptureMode &&
      tp__cu.cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
    scope->mode = mode;
    scope->relaxed = 1;
  }
}

void tp__cu_scope_leave(tp__cu_scope *scope) {
  /* Putting the old context back cannot fail for a context that was
   * current a moment ago; should it, the thread keeps ours, which is
   * still a valid context. The capture mode likewise. */
  if (scope->relaxed)
    (void)tp__cu.cuThreadExchangeStreamCaptureMode(&scope->mode);
  if (scope->switched)
    (void)tp__cu.cuCtxSetCurrent(scope->prev);
}

/* The thread's current context is asked for rather than remembered in a
 * thread-local: cudaSetDevice and cuCtxSetCurrent in the user's code change
 * it without telling us, and a stale memory would run device work in the
 * wrong context. The question costs about 9 ns. */
tp_error_t tp__cu_set_device(int device) {
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  CUcontext cur = NULL;
  CUresult r = tp__cu.cuCtxGetCurrent(&cur);
  if (r == CUDA_SUCCESS && cur != d->ctx)
    r = tp__cu.cuCtxSetCurrent(d->ctx);
  return tp__cu_error(r);
}

static tp_error_t attribute(int *value, CUdevice_attribute attr,
                            const tp__cu_dev *d) {
  return tp__cu_error(tp__cu.cuDeviceGetAttribute(value, attr, d->dev));
}

tp_error_t tp__cu_device_attribute(int *value, tp_device_attr_t attr,
                                   int device) {
  TP_RETURN_IF(device < 0 || device >= tp__cu_device_count,
               TP_ERROR_INVALID_DEVICE);
  const tp__cu_dev *d = &tp__cu_devs[device];
  int v = 0;
  switch (attr) {
  case TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED:
    /* tidepool's pools stand on the virtual memory management calls. */
    TP_FORWARD(attribute(
        &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d));
    *value = v != 0;
    return TP_SUCCESS;
  case TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES: {
    int fd = 0, fabric = 0;
    TP_FORWARD(attribute(
        &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        d));
    TP_FORWARD(attribute(&fabric,
                         CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, d));
    *value = (fd ? TP_HANDLE_POSIX_FD : 0) | (fabric ? TP_HANDLE_FABRIC : 0);
    return TP_SUCCESS;
  }
  case TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT:
    /* The CUDA 13.0 driver knows no locality domains below a device, so
     * each device is one domain. */
    *value = 1;
    return TP_SUCCESS;
  case TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS:
    TP_FORWARD(attribute(&v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, d));
    *value = v;
    return TP_SUCCESS;
  }
  return TP_ERROR_INVALID_VALUE;
}
