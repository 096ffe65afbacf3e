/* The interposer's machinery: finding the real runtime, deciding once
 * whether tidepool answers, keeping tidepool's current device in step with
 * the runtime's, translating errors, and the registries of pools and event
 * pairs. The CUDA entry points themselves are in alloc.c and observe.c. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "common/seen.h"
#include "graph/graph_mem.h"
#include "preload.h"

#ifndef TP_PL_CUDART_NODE
#error "TP_PL_CUDART_NODE (the runtime's version node) must be defined"
#endif

/* ---- the real runtime ---------------------------------------------------- */

tp__pl_fn tp__pl_lookup(const char *name) {
  /* The versioned lookup first: RTLD_NEXT with a plain dlsym would also do,
   * but the runtime may one day export several versions of a name. */
  void *sym = dlvsym(RTLD_NEXT, name, TP_PL_CUDART_NODE);
  if (!sym)
    sym = dlsym(RTLD_NEXT, name);
  tp__pl_fn fn = NULL;
  memcpy(&fn, &sym, sizeof fn);
  return fn;
}

typedef cudaError_t (*get_device_count_fn)(int *);
typedef cudaError_t (*get_device_fn)(int *);
typedef cudaError_t (*get_error_fn)(void);
typedef cudaError_t (*is_capturing_fn)(cudaStream_t,
                                       enum cudaStreamCaptureStatus *);
TP_PL_NEXT(cudaGetDeviceCount, get_device_count_fn)
TP_PL_NEXT(cudaGetDevice, get_device_fn)
TP_PL_NEXT(cudaGetLastError, get_error_fn)
TP_PL_NEXT(cudaPeekAtLastError, get_error_fn)
TP_PL_NEXT(cudaStreamIsCapturing, is_capturing_fn)
TP_PL_NEXT(cudaStreamIsCapturing_ptsz, is_capturing_fn)

/* ---- counters --------------------------------------------------------------
 * Counted on every call, so kept per thread: one shared line of counters
 * took a locked add per call, a fifth of an allocation and free's time
 * through the interposer on one thread, and every thread's calls queued on
 * that line. A thread's counts go to `retired` as it ends. */

typedef struct thread_counts {
  _Atomic uint64_t v[TP_PL_NCOUNTERS];
  struct thread_counts *next;
} thread_counts;

static TP_TLS thread_counts *mine;
static thread_counts *all_counts;
static uint64_t retired[TP_PL_NCOUNTERS];
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t counts_key;
static pthread_once_t counts_once = PTHREAD_ONCE_INIT;
/* Where a thread's counts could not be kept (no memory, no key): shared. */
static _Atomic uint64_t shared_counts[TP_PL_NCOUNTERS];

/* Runs on the ending thread, which may still call in from a later
 * destructor: it then starts afresh. */
static void counts_retire(void *arg) {
  thread_counts *t = arg;
  if (mine == t)
    mine = NULL;
  pthread_mutex_lock(&counts_lock);
  thread_counts **at = &all_counts;
  while (*at && *at != t)
    at = &(*at)->next;
  if (*at)
    *at = t->next;
  for (int i = 0; i < TP_PL_NCOUNTERS; i++)
    retired[i] += atomic_load_explicit(&t->v[i], memory_order_relaxed);
  pthread_mutex_unlock(&counts_lock);
  free(t);
}

static bool counts_key_ok;

static void counts_key_make(void) {
  counts_key_ok = pthread_key_create(&counts_key, counts_retire) == 0;
}

static thread_counts *counts_join(void) {
  (void)pthread_once(&counts_once, counts_key_make);
  thread_counts *t = counts_key_ok ? calloc(1, sizeof *t) : NULL;
  if (!t)
    return NULL;
  if (pthread_setspecific(counts_key, t) != 0) {
    free(t);
    return NULL;
  }
  pthread_mutex_lock(&counts_lock);
  t->next = all_counts;
  all_counts = t;
  pthread_mutex_unlock(&counts_lock);
  mine = t;
  return t;
}

void tp__pl_count(int which) {
  thread_counts *t = mine ? mine : counts_join();
  if (!t) {
    atomic_fetch_add_explicit(&shared_counts[which], 1, memory_order_relaxed);
    return;
  }
  /* Only this thread writes its counts: no locked add. */
  uint64_t v = atomic_load_explicit(&t->v[which], memory_order_relaxed);
  atomic_store_explicit(&t->v[which], v + 1, memory_order_relaxed);
}

unsigned long long tp__pl_counter(int which) {
  if (which < 0 || which >= TP_PL_NCOUNTERS)
    return 0;
  pthread_mutex_lock(&counts_lock);
  uint64_t n = retired[which] + atomic_load_explicit(&shared_counts[which],
                                                     memory_order_relaxed);
  for (const thread_counts *t = all_counts; t; t = t->next)
    n += atomic_load_explicit(&t->v[which], memory_order_relaxed);
  pthread_mutex_unlock(&counts_lock);
  return n;
}

TP_TLS int tp__pl_runtime_depth;

/* ---- the mode ------------------------------------------------------------ */

/* From TIDEPOOL_PRELOAD: TP_PL_UNDECIDED until read. Read at the first
 * question, which may come before the library's constructor (a program's
 * own constructor looking up the driver); reading twice gives the same. */
static _Atomic int requested = TP_PL_UNDECIDED;
static bool report_at_exit; /* TIDEPOOL_PRELOAD_REPORT=1 */
static _Atomic int mode = TP_PL_UNDECIDED;
static pthread_mutex_t decide_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *mode_name(int m) {
  switch (m) {
  case TP_PL_OFF: return "off";
  case TP_PL_CUDA: return "cuda";
  case TP_PL_HOST: return "host";
  default: return "undecided";
  }
}

static void report(void) {
  fprintf(stderr,
          "tidepool-preload: mode %s; answered %llu allocations, %llu frees, "
          "%llu pool calls (%llu failed); forwarded %llu allocator calls; "
          "saw %llu synchronizations, %llu event records and waits; %llu "
          "through the driver's entry points\n",
          mode_name(tp__pl_mode()), tp__pl_counter(TP_PL_COUNT_MALLOC),
          tp__pl_counter(TP_PL_COUNT_FREE), tp__pl_counter(TP_PL_COUNT_POOL),
          tp__pl_counter(TP_PL_COUNT_FAILED),
          tp__pl_counter(TP_PL_COUNT_FORWARDED),
          tp__pl_counter(TP_PL_COUNT_SYNC), tp__pl_counter(TP_PL_COUNT_EVENT),
          tp__pl_counter(TP_PL_COUNT_DRIVER));
  /* Whether allocations asked the driver about captures and stream ids,
   * and why: what a pair costs depends on it. */
  if (tp__pl_mode() != TP_PL_CUDA)
    return; /* nothing was counted or asked of the driver */
  bool counted = false, streams_seen = false;
  const char *why = NULL;
  tp__seen_state(&counted, &streams_seen, &why);
  fprintf(stderr, "tidepool-preload: captures %s, stream destructions %s%s%s\n",
          counted ? "counted" : "asked on every call",
          streams_seen ? "seen" : "unseen (ids asked)", why ? ": " : "",
          why ? why : "");
}

static int read_request(void) {
  int r = atomic_load_explicit(&requested, memory_order_acquire);
  if (r != TP_PL_UNDECIDED)
    return r;
  const char *v = getenv("TIDEPOOL_PRELOAD");
  if (!v || !*v || strcmp(v, "1") == 0 || strcmp(v, "cuda") == 0)
    r = TP_PL_CUDA;
  else if (strcmp(v, "0") == 0)
    r = TP_PL_OFF;
  else if (strcmp(v, "host") == 0)
    r = TP_PL_HOST;
  else
    r = -1; /* unknown: off, said once by the constructor */
  atomic_store_explicit(&requested, r, memory_order_release);
  return r;
}

bool tp__pl_switched_off(void) {
  int r = read_request();
  return r == TP_PL_OFF || r < 0;
}

/* Reads the switches while the process is still single-threaded. For the
 * host mode it also picks tidepool's platform, which tidepool reads from
 * the environment at its first call; nothing else is changed. */
/* Whether this process is a child that fork() made after the parent's
 * first call: tidepool then refuses every call (NOT_PERMITTED), where
 * CUDA's runtime answers an initialization error, and the driver
 * CUDA_ERROR_NOT_INITIALIZED (tp__pl_forked_error). */
static atomic_bool forked;

static void note_fork(void) {
  atomic_store_explicit(&forked, true, memory_order_relaxed);
}

bool tp__pl_forked(void) {
  return atomic_load_explicit(&forked, memory_order_relaxed);
}

__attribute__((constructor)) static void read_switches(void) {
  (void)pthread_atfork(NULL, NULL, note_fork);
  int r = read_request();
  if (r == TP_PL_HOST)
    setenv("TIDEPOOL_PLATFORM", "host", 1);
  /* Every capture then begins, and every stream is destroyed, through the
   * driver entries that hook.c hands out or the driver names this library
   * defines (driver_exports.txt), which tell tidepool (seen.h). */
  if (r == TP_PL_CUDA) {
    tp__seen_watch();
    tp__seen_watch_streams();
  }
  if (r < 0)
    fprintf(stderr,
            "tidepool-preload: TIDEPOOL_PRELOAD=%s is not 0, 1, cuda or host; "
            "the interposer stays off\n",
            getenv("TIDEPOOL_PRELOAD"));
  const char *rep = getenv("TIDEPOOL_PRELOAD_REPORT");
  report_at_exit = rep && strcmp(rep, "1") == 0;
  /* From the start, so that a program whose calls never reach the
   * interposer says so too. */
  if (report_at_exit)
    atexit(report);
}

/* The runtime's answer to the mode decision (see tp__pl_probe_fn): whether
 * it sees a device, and the calling thread's. Asking must not leave an
 * error behind for the program to find: a failed cudaGetDeviceCount
 * records one, which is taken back unless an earlier one was waiting. */
static int runtime_probe(int *device) {
  get_device_count_fn count = next_cudaGetDeviceCount();
  get_error_fn peek = next_cudaPeekAtLastError();
  get_error_fn get = next_cudaGetLastError();
  get_device_fn get_device = next_cudaGetDevice();
  if (!count || !peek || !get || !get_device)
    return 0;
  cudaError_t before = peek();
  int n = 0;
  cudaError_t r = count(&n);
  if (r != cudaSuccess && before == cudaSuccess)
    (void)get();
  if (r != cudaSuccess || n <= 0)
    return 0;
  return get_device(device) == cudaSuccess;
}

/* Decides the mode unless the probe cannot say yet. Starting tidepool makes
 * device 0's context current on this thread; the probe's device is read
 * before and made tidepool's after. */
static void decide(tp__pl_probe_fn probe) {
  int m = read_request();
  if (m < 0)
    m = TP_PL_OFF;
  int device = 0;
  if (m != TP_PL_OFF) {
    int found = probe(&device);
    if (found < 0)
      return;
    if (found == 0)
      m = TP_PL_OFF;
  }
  if (m != TP_PL_OFF) {
    const char *want = m == TP_PL_HOST ? "host" : "cuda";
    const char *got = tp_platform_name();
    if (!got || strcmp(got, want) != 0) {
      fprintf(stderr,
              "tidepool-preload: tidepool runs on the %s platform here, not "
              "%s; the interposer stays off\n",
              got ? got : "(none)", want);
      m = TP_PL_OFF;
    } else if (tp_set_device(device) != TP_SUCCESS) {
      fprintf(stderr,
              "tidepool-preload: tidepool cannot use device %d of the "
              "program; the interposer stays off\n",
              device);
      m = TP_PL_OFF;
    }
  }
  atomic_store_explicit(&mode, m, memory_order_release);
  if (report_at_exit)
    fprintf(stderr, "tidepool-preload: mode %s\n", mode_name(m));
}

int tp__pl_mode(void) {
  return atomic_load_explicit(&mode, memory_order_acquire);
}

bool tp__pl_active_via(tp__pl_probe_fn probe) {
  int m = atomic_load_explicit(&mode, memory_order_acquire);
  if (TP_PL_UNDECIDED == m) {
    pthread_mutex_lock(&decide_lock);
    if (atomic_load_explicit(&mode, memory_order_relaxed) == TP_PL_UNDECIDED)
      decide(probe);
    pthread_mutex_unlock(&decide_lock);
    m = atomic_load_explicit(&mode, memory_order_acquire);
  }
  return m == TP_PL_CUDA || m == TP_PL_HOST;
}

bool tp__pl_active(void) {
  return tp__pl_active_via(runtime_probe);
}

bool tp__pl_host_requested(void) {
  return read_request() == TP_PL_HOST;
}

/* ---- calling into tidepool ----------------------------------------------- */

static _Atomic(int (*)(void)) context_device;

void tp__pl_set_context_device(int (*fn)(void)) {
  atomic_store_explicit(&context_device, fn, memory_order_release);
}

cudaError_t tp__pl_enter(bool answering) {
  get_device_fn get_device = next_cudaGetDevice();
  if (!get_device)
    return TP_PL_NO_RUNTIME;
  /* Where a primary context is current, the runtime's device is its
   * device, which the driver layer tells from one cuCtxGetCurrent: 8-11 ns
   * against cudaGetDevice's 45-58 (an H100, bench/preload_pair.c), twice a
   * pair. Otherwise the runtime is asked, before tidepool is touched: a
   * thread's first call into tidepool makes device 0's context current,
   * which would change the runtime's answer. */
  int (*from_context)(void) =
      tp__pl_mode() == TP_PL_CUDA
          ? atomic_load_explicit(&context_device, memory_order_acquire)
          : NULL;
  int device = from_context ? from_context() : -1;
  if (device < 0) {
    device = 0;
    cudaError_t r = get_device(&device);
    if (r != cudaSuccess)
      return r;
  }
  int ours = -1;
  tp_error_t err = tp_get_device(&ours);
  if (err == TP_SUCCESS && ours != device)
    err = tp_set_device(device);
  if (err == TP_SUCCESS)
    return cudaSuccess;
  return answering ? tp__pl_fail(err) : tp__pl_error(err);
}

/* What an end inside another of this thread's learned for graph memory,
 * told by the outer one once it has released the capture lock (graph
 * memory's lock is taken before the capture lock). */
static TP_TLS uint64_t deferred_id;
static TP_TLS bool deferred_ok;

/* Tells graph memory that capture `id` (0: none) ended, `ok` or in
 * failure; inside an outer begin or end of this thread, keeps it for that
 * one, and outside, also tells what such an inner one kept. */
static void tell_graph_memory(uint64_t id, bool ok) {
  if (tp__seen_capture_held()) {
    if (id) {
      deferred_id = id;
      deferred_ok = ok;
    }
    return;
  }
  if (id)
    tp__gmem_capture_ended(id, ok);
  if (deferred_id && deferred_id != id)
    tp__gmem_capture_ended(deferred_id, deferred_ok);
  deferred_id = 0;
}

void tp__pl_capture_ended(uint64_t key, uint64_t before, bool capturing,
                          cudaError_t result) {
  /* The driver tells no id of an invalidated capture, before or after. */
  bool invalidated = result == cudaErrorStreamCaptureInvalidated;
  uint64_t ended = tp__seen_ended(key, before, capturing, invalidated);
  bool failed = invalidated || result == cudaErrorStreamCaptureUnjoined ||
                result == cudaErrorStreamCaptureWrongThread;
  bool told = !capturing && (result == cudaSuccess || failed);
  tell_graph_memory(told ? (before ? before : ended) : 0,
                    result == cudaSuccess);
}

void tp__pl_capture_stream_gone(uint64_t key, uint64_t id) {
  /* Only a capture listed under the stream's own key is the one it began. */
  tell_graph_memory(tp__seen_ended(key, id, false, id == 0), false);
}

void tp__pl_capture_tell(void) {
  tell_graph_memory(0, false);
}

bool tp__pl_ptr_ours(const void *ptr) {
  tp_pool_t owner = NULL;
  return ptr && tp_pointer_get_attribute(&owner, TP_POINTER_ATTR_MEMPOOL_HANDLE,
                                         ptr) == TP_SUCCESS;
}

tp_stream_t tp__pl_stream(cudaStream_t stream, bool per_thread) {
  if (per_thread && stream == NULL)
    stream = cudaStreamPerThread;
  /* NULL names the legacy stream of tidepool's current device, which the
   * caller made the runtime's (tp__pl_enter) or the current context's
   * (tp__pl_drv_enter): the stream cudaStreamLegacy names there, found
   * without a call, where the handle itself would be adopted anew at each
   * call (on cuda; the host platform knows the legacy stream only as
   * NULL). */
  if (stream == cudaStreamLegacy)
    stream = NULL;
  return (tp_stream_t)stream;
}

static TP_TLS char thread_mark;

uint64_t tp__pl_capture_key(const void *stream, bool per_thread) {
  return tp__pl_capture_key_one(stream, per_thread)
             ? (uint64_t)(uintptr_t)stream
             : (uint64_t)(uintptr_t)&thread_mark;
}

bool tp__pl_capture_key_one(const void *stream, bool per_thread) {
  return !(stream == (const void *)cudaStreamPerThread ||
           (per_thread && stream == NULL));
}

bool tp__pl_capturing(cudaStream_t stream, bool per_thread) {
  if (tp__pl_host_requested())
    return false;
  is_capturing_fn is_capturing = per_thread ? next_cudaStreamIsCapturing_ptsz()
                                            : next_cudaStreamIsCapturing();
  if (!is_capturing)
    return false;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  /* An error (the legacy stream while another stream captures, say) sends
   * the call to the runtime, which gives the error the program expects. */
  cudaError_t r = is_capturing(stream, &status);
  return r != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

/* ---- errors --------------------------------------------------------------
 * tidepool's errors are the driver's, so each has one runtime code. For a
 * platform error the driver's own code is translated where the runtime has
 * the same error; the rest become cudaErrorUnknown. */

static const struct {
  int driver;
  cudaError_t runtime;
} driver_codes[] = {
    {CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue},
    {CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation},
    {CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError},
    {CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading},
    {CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice},
    {CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice},
    {CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized},
    {CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle},
    {CUDA_ERROR_NOT_READY, cudaErrorNotReady},
    {CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress},
    {CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure},
    {CUDA_ERROR_LAUNCH_TIMEOUT, cudaErrorLaunchTimeout},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, cudaErrorHardwareStackError},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, cudaErrorIllegalInstruction},
    {CUDA_ERROR_MISALIGNED_ADDRESS, cudaErrorMisalignedAddress},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, cudaErrorInvalidAddressSpace},
    {CUDA_ERROR_INVALID_PC, cudaErrorInvalidPc},
    {CUDA_ERROR_ECC_UNCORRECTABLE, cudaErrorECCUncorrectable},
    {CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted},
    {CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported},
    {CUDA_ERROR_SYSTEM_NOT_READY, cudaErrorSystemNotReady},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cudaErrorStreamCaptureUnsupported},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cudaErrorStreamCaptureInvalidated},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cudaErrorStreamCaptureImplicit},
};

static cudaError_t platform_error(void) {
  int code = 0;
  (void)tp_get_last_platform_error(&code, NULL);
  /* On the host platform the code is an errno, which has no runtime twin. */
  if (tp__pl_mode() != TP_PL_CUDA)
    return cudaErrorUnknown;
  for (size_t i = 0; i < sizeof driver_codes / sizeof driver_codes[0]; i++)
    if (driver_codes[i].driver == code)
      return driver_codes[i].runtime;
  return cudaErrorUnknown;
}

cudaError_t tp__pl_error(tp_error_t err) {
  switch (err) {
  case TP_SUCCESS: return cudaSuccess;
  case TP_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
  case TP_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case TP_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
  case TP_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
  case TP_ERROR_NOT_PERMITTED:
    return tp__pl_forked() ? cudaErrorInitializationError
                           : cudaErrorNotPermitted;
  case TP_ERROR_NOT_READY: return cudaErrorNotReady;
  case TP_ERROR_NO_DEVICE: return cudaErrorNoDevice;
  case TP_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
  case TP_ERROR_PLATFORM: return platform_error();
  case TP_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
  case TP_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    return cudaErrorStreamCaptureUnsupported;
  case TP_ERROR_STREAM_CAPTURE_INVALIDATED:
    return cudaErrorStreamCaptureInvalidated;
  case TP_ERROR_STREAM_CAPTURE_MERGE: return cudaErrorStreamCaptureMerge;
  case TP_ERROR_STREAM_CAPTURE_UNMATCHED:
    return cudaErrorStreamCaptureUnmatched;
  case TP_ERROR_STREAM_CAPTURE_UNJOINED: return cudaErrorStreamCaptureUnjoined;
  case TP_ERROR_STREAM_CAPTURE_ISOLATION:
    return cudaErrorStreamCaptureIsolation;
  case TP_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
  case TP_ERROR_CAPTURED_EVENT: return cudaErrorCapturedEvent;
  case TP_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    return cudaErrorStreamCaptureWrongThread;
  }
  return cudaErrorUnknown;
}

/* ---- the last error --------------------------------------------------------
 * The runtime keeps a last error per thread, which every failed runtime call
 * sets and cudaGetLastError reads and clears. A call tidepool answered
 * never reached the runtime, so its failure is kept here, with the
 * runtime's own last error at that moment: if the runtime's has changed by
 * the time the program asks, a runtime call failed later, and its error is
 * the last one. (A later runtime failure with the very same code as the
 * earlier one is not told apart: tidepool's error is reported then.) */

static TP_TLS cudaError_t pending;
static TP_TLS cudaError_t pending_snapshot;

cudaError_t tp__pl_fail_code(cudaError_t code) {
  if (code != cudaSuccess) {
    get_error_fn peek = next_cudaPeekAtLastError();
    pending_snapshot = peek ? peek() : cudaSuccess;
    pending = code;
    tp__pl_count(TP_PL_COUNT_FAILED);
  }
  return code;
}

cudaError_t tp__pl_fail(tp_error_t err) {
  return tp__pl_fail_code(tp__pl_error(err));
}

TP_PL_EXPORT cudaError_t cudaGetLastError(void) {
  get_error_fn get = next_cudaGetLastError();
  cudaError_t runtime = get ? get() : TP_PL_NO_RUNTIME;
  if (cudaSuccess == pending)
    return runtime;
  cudaError_t ours = pending;
  pending = cudaSuccess;
  return runtime == pending_snapshot ? ours : runtime;
}

TP_PL_EXPORT cudaError_t cudaPeekAtLastError(void) {
  get_error_fn peek = next_cudaPeekAtLastError();
  cudaError_t runtime = peek ? peek() : TP_PL_NO_RUNTIME;
  if (cudaSuccess == pending)
    return runtime;
  if (runtime != pending_snapshot) {
    pending = cudaSuccess; /* a later runtime error replaced ours */
    return runtime;
  }
  return pending;
}

/* ---- pools ----------------------------------------------------------------
 * An open-addressing set of pointers, grown under a lock; pools are few and
 * are looked up on pool calls, not on every allocation. */

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static tp_pool_t *pools;
static size_t pools_cap, pools_n;

static size_t slot_of(const void *p, size_t cap) {
  uintptr_t h = (uintptr_t)p;
  h ^= h >> 17;
  h *= 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 7) & (cap - 1);
}

static bool pools_insert(tp_pool_t *set, size_t cap, tp_pool_t pool) {
  size_t i = slot_of(pool, cap);
  while (set[i] && set[i] != pool)
    i = (i + 1) & (cap - 1);
  bool added = set[i] == NULL;
  set[i] = pool;
  return added;
}

void tp__pl_pool_remember(tp_pool_t pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pools_lock);
  if ((pools_n + 1) * 2 > pools_cap) {
    size_t cap = pools_cap ? pools_cap * 2 : 64;
    tp_pool_t *grown = calloc(cap, sizeof *grown);
    if (grown) {
      for (size_t i = 0; i < pools_cap; i++)
        if (pools[i])
          (void)pools_insert(grown, cap, pools[i]);
      free(pools);
      pools = grown;
      pools_cap = cap;
    }
  }
  /* Without room the pool is not remembered, and later calls on it go to
   * the runtime, which refuses the handle: an error, never a crash. */
  if ((pools_n + 1) * 2 <= pools_cap && pools_insert(pools, pools_cap, pool))
    pools_n++;
  pthread_mutex_unlock(&pools_lock);
}

bool tp__pl_pool_known(tp_pool_t pool) {
  if (!pool)
    return false;
  pthread_mutex_lock(&pools_lock);
  bool found = false;
  if (pools_cap) {
    size_t i = slot_of(pool, pools_cap);
    while (pools[i] && pools[i] != pool)
      i = (i + 1) & (pools_cap - 1);
    found = pools[i] == pool;
  }
  pthread_mutex_unlock(&pools_lock);
  return found;
}

/* ---- event pairs -----------------------------------------------------------
 * A chained hash map from the runtime's event to tidepool's. Events come
 * and go (PyTorch makes one per multi-stream free), so entries are removed
 * at cudaEventDestroy. */

typedef struct pair {
  cudaEvent_t event;
  tp_event_t ours;
  bool valid;
  struct pair *next;
} pair;

#define PAIR_BUCKETS 256
static pthread_mutex_t pairs_lock = PTHREAD_MUTEX_INITIALIZER;
static pair *pairs[PAIR_BUCKETS];

static pair **pair_slot(cudaEvent_t event) {
  pair **p = &pairs[slot_of(event, PAIR_BUCKETS)];
  while (*p && (*p)->event != event)
    p = &(*p)->next;
  return p;
}

tp_event_t tp__pl_event_find(cudaEvent_t event) {
  pthread_mutex_lock(&pairs_lock);
  pair *p = *pair_slot(event);
  tp_event_t ours = p && p->valid ? p->ours : NULL;
  pthread_mutex_unlock(&pairs_lock);
  return ours;
}

tp_event_t tp__pl_event_pair(cudaEvent_t event) {
  pthread_mutex_lock(&pairs_lock);
  pair **slot = pair_slot(event);
  if (!*slot) {
    pair *p = calloc(1, sizeof *p);
    if (p && tp_event_create(&p->ours) == TP_SUCCESS) {
      p->event = event;
      *slot = p;
    } else {
      free(p);
    }
  }
  tp_event_t ours = *slot ? (*slot)->ours : NULL;
  pthread_mutex_unlock(&pairs_lock);
  return ours;
}

void tp__pl_event_mark(cudaEvent_t event, bool valid) {
  pthread_mutex_lock(&pairs_lock);
  pair *p = *pair_slot(event);
  if (p)
    p->valid = valid;
  pthread_mutex_unlock(&pairs_lock);
}

void tp__pl_event_forget(cudaEvent_t event) {
  pthread_mutex_lock(&pairs_lock);
  pair **slot = pair_slot(event);
  pair *p = *slot;
  if (p)
    *slot = p->next;
  pthread_mutex_unlock(&pairs_lock);
  if (p) {
    (void)tp_event_destroy(p->ours);
    free(p);
  }
}
