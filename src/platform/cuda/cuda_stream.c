/* Streams and events of the cuda platform: creating and adopting streams
 * (including the legacy and per-thread special streams), stream-ordered
 * work, and events recycled through a per-device free list. */
#include "common/hot.h"
#include "platform/cuda/cuda_internal.h"

/* Destroyed events kept per device for reuse: creating one costs more than
 * recording one, and the core makes and drops markers all the time. The
 * cap bounds what an idle process holds. */
#define TP_CU_EVENT_FREE_MAX 256u

tp_error_t tp__cu_stream_create(int device, unsigned flags, tp__pstream **ps,
                                tp_stream_t *handle, uint64_t *uid) {
  TP_RETURN_IF(flags & ~(unsigned)TP_STREAM_NON_BLOCKING,
               TP_ERROR_INVALID_VALUE);
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter(d, &scope));
  CUstream s = NULL;
  CUresult r = tp__cu.cuStreamCreate(&s, flags ? CU_STREAM_NON_BLOCKING
                                               : CU_STREAM_DEFAULT);
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  unsigned long long id = 0;
  r = tp__cu.cuStreamGetId(s, &id);
  if (r != CUDA_SUCCESS) {
    (void)tp__cu.cuStreamDestroy(s);
    return tp__cu_error(r);
  }
  *ps = (tp__pstream *)s;
  *handle = (tp_stream_t)s;
  *uid = id;
  return TP_SUCCESS;
}

tp_error_t tp__cu_stream_destroy(tp__pstream *ps) {
  TP_RETURN_IF((uintptr_t)ps < TP_CU_SPECIAL_LIMIT, TP_ERROR_INVALID_VALUE);
  return tp__cu_error(tp__cu.cuStreamDestroy((CUstream)ps));
}

tp_error_t tp__cu_stream_legacy(int device, tp__stream_desc *desc) {
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  desc->ps = tp__cu_special_ps(device, CU_STREAM_LEGACY);
  desc->uid = d->legacy_uid;
  desc->device = device;
  desc->flags = 0;
  desc->legacy = 1;
  return TP_SUCCESS;
}

/* The device a special stream handle means on this thread: that of the
 * current context, or device 0 (the runtime's initial device) when the
 * thread has none. */
static tp_error_t current_device(int *device) {
  CUcontext cur = NULL;
  CUresult r = tp__cu.cuCtxGetCurrent(&cur);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *device = 0;
  if (!cur)
    return TP_SUCCESS;
  CUdevice dev;
  r = tp__cu.cuCtxGetDevice(&dev);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *device = tp__cu_ordinal(dev);
  return *device < 0 ? TP_ERROR_INVALID_DEVICE : TP_SUCCESS;
}

static tp_error_t adopt_per_thread(tp__stream_desc *desc) {
  int device;
  TP_FORWARD(current_device(&device));
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter(d, &scope));
  unsigned long long id = 0;
  unsigned flags = 0;
  /* As for any stream (below), the driver refuses the id and the flags of
   * a capturing per-thread stream, and invalidates its capture: the stream
   * is then described without them, and the core finds it as the calling
   * thread's. It is a blocking stream. */
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = tp__cu.cuStreamIsCapturing
                   ? tp__cu.cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st)
                   : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE) {
    r = tp__cu.cuStreamGetId(CU_STREAM_PER_THREAD, &id);
    if (r == CUDA_SUCCESS)
      r = tp__cu.cuStreamGetFlags(CU_STREAM_PER_THREAD, &flags);
  }
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  desc->ps = tp__cu_special_ps(device, CU_STREAM_PER_THREAD);
  desc->uid = id;
  desc->device = device;
  desc->flags = (flags & CU_STREAM_NON_BLOCKING) ? TP_STREAM_NON_BLOCKING : 0;
  desc->legacy = 0;
  desc->thread_bound = true;
  return TP_SUCCESS;
}

/* The device of a stream on a driver without cuStreamGetDevice (before
 * 12.8): its context's device, asked with that context current. */
static CUresult stream_device_by_ctx(CUstream s, CUdevice *dev) {
  CUcontext ctx = NULL, cur = NULL;
  CUresult r = tp__cu.cuStreamGetCtx(s, &ctx);
  if (r == CUDA_SUCCESS)
    r = tp__cu.cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS || cur == ctx)
    return r == CUDA_SUCCESS ? tp__cu.cuCtxGetDevice(dev) : r;
  r = tp__cu.cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS)
    return r;
  r = tp__cu.cuCtxGetDevice(dev);
  (void)tp__cu.cuCtxSetCurrent(cur);
  return r;
}

/* A stream of the driver's own making. The driver documents passing an
 * invalid handle to cuStreamGetId as undefined; in practice it answers
 * CUDA_ERROR_INVALID_HANDLE (INVALID_VALUE here) for handles it does not
 * know, and a destroyed stream's handle is not reliably refused. Streams of
 * contexts other than the primary ones are accepted, but the platform's
 * events live in primary contexts and cannot be recorded on them. */
tp_error_t tp__cu_stream_adopt(tp_stream_t handle, tp__stream_desc *desc) {
  CUstream s = (CUstream)handle;
  if (s == NULL || s == CU_STREAM_LEGACY) {
    int device;
    TP_FORWARD(current_device(&device));
    return tp__cu_stream_legacy(device, desc);
  }
  if (s == CU_STREAM_PER_THREAD)
    return adopt_per_thread(desc);
  TP_RETURN_IF((uintptr_t)s < TP_CU_SPECIAL_LIMIT, TP_ERROR_INVALID_VALUE);

  /* The driver refuses cuStreamGetId, cuStreamGetDevice and
   * cuStreamGetFlags on a capturing stream, in any capture mode, and
   * invalidates the capture (an H200, 2026-11-30); cuStreamIsCapturing and
   * cuStreamGetCtx it answers. A capturing stream is described without its
   * id and flags, and the core finds it by its handle. */
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = tp__cu.cuStreamIsCapturing ? tp__cu.cuStreamIsCapturing(s, &st)
                                          : CUDA_SUCCESS;
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  unsigned long long id = 0;
  CUdevice dev = 0;
  unsigned flags = 0;
  if (st == CU_STREAM_CAPTURE_STATUS_NONE) {
    r = tp__cu.cuStreamGetId(s, &id);
    if (r == CUDA_SUCCESS)
      r = tp__cu.cuStreamGetDevice ? tp__cu.cuStreamGetDevice(s, &dev)
                                   : stream_device_by_ctx(s, &dev);
    if (r == CUDA_SUCCESS)
      r = tp__cu.cuStreamGetFlags(s, &flags);
  } else {
    r = stream_device_by_ctx(s, &dev);
  }
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  int device = tp__cu_ordinal(dev);
  TP_RETURN_IF(device < 0, TP_ERROR_INVALID_VALUE);
  desc->ps = (tp__pstream *)s;
  desc->uid = id;
  desc->device = device;
  desc->flags = (flags & CU_STREAM_NON_BLOCKING) ? TP_STREAM_NON_BLOCKING : 0;
  desc->legacy = 0;
  desc->thread_bound = false;
  return TP_SUCCESS;
}

/* The id of the calling thread's per-thread stream in the context where
 * it was last asked, and the stream generation then. While every stream
 * destruction is seen (the interposer: a context's end moves the
 * generation too), the same context and generation name the same stream,
 * but for one end that no call shows: the driver ends a thread's
 * per-thread streams as the thread ends, and a destructor that runs after
 * that (a pthread key's, say) would meet a new stream under the same
 * context. So the id is kept only with a C++-style thread-exit hook of our
 * own registered (glibc's __cxa_thread_atexit_impl), which runs before
 * every pthread key's destructor and before thread-exit hooks registered
 * earlier, the driver's included if it uses them (the stream was made
 * before the first id was kept); from the hook on, the thread asks every
 * time. Without the hook (another libc) it always asks. Through tidepool-
 * run on an H100 a pair on this handle took 283 ns against about 100 on
 * other streams, cuStreamGetId being most of the difference. */
typedef struct per_thread_id {
  CUcontext ctx;
  uint64_t gen;
  unsigned long long id;
  bool hooked, ending;
} per_thread_id;
static TP_TLS per_thread_id per_thread_known;

extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso)
    __attribute__((weak));
extern void *__dso_handle;

static void per_thread_end(void *arg) {
  (void)arg;
  per_thread_known.ctx = NULL;
  per_thread_known.ending = true;
}

/* Whether the calling thread may keep its per-thread stream's id: its
 * exit hook is registered (once a thread) and has not run. */
static bool per_thread_keepable(void) {
  if (per_thread_known.ending)
    return false;
  if (!per_thread_known.hooked)
    per_thread_known.hooked =
        __cxa_thread_atexit_impl &&
        __cxa_thread_atexit_impl(per_thread_end, NULL, &__dso_handle) == 0;
  return per_thread_known.hooked;
}

/* Two driver calls, where adopting takes four: the capture question first,
 * since the id is refused (and the capture invalidated) while the stream
 * captures; one where the caller knows that nothing captures. */
tp_error_t tp__cu_stream_identify(tp_stream_t handle, bool ask_capture,
                                  uint64_t *uid, tp_capture_status_t *status) {
  CUstream s = (CUstream)handle;
  *uid = 0;
  *status = TP_CAPTURE_STATUS_NONE;
  /* The per-thread stream is asked in the current context, whose stream
   * it means; the legacy stream is never adopted. */
  TP_RETURN_IF((uintptr_t)s < TP_CU_SPECIAL_LIMIT && s != CU_STREAM_PER_THREAD,
               TP_ERROR_NOT_SUPPORTED);
  CUcontext ctx = NULL;
  uint64_t gen = 0;
  bool keep =
      s == CU_STREAM_PER_THREAD && !ask_capture &&
      atomic_load_explicit(&tp__hot.foreign_watched, memory_order_acquire) &&
      tp__cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx;
  if (keep) {
    gen = atomic_load_explicit(&tp__hot.stream_gen, memory_order_acquire);
    if (per_thread_known.ctx == ctx && per_thread_known.gen == gen) {
      *uid = per_thread_known.id;
      return TP_SUCCESS;
    }
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = ask_capture && tp__cu.cuStreamIsCapturing
                   ? tp__cu.cuStreamIsCapturing(s, &st)
                   : CUDA_SUCCESS;
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *status = (tp_capture_status_t)st;
  if (st != CU_STREAM_CAPTURE_STATUS_NONE)
    return TP_SUCCESS;
  unsigned long long id = 0;
  r = tp__cu.cuStreamGetId(s, &id);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *uid = id;
  if (keep && per_thread_keepable()) {
    per_thread_known.ctx = ctx;
    per_thread_known.gen = gen;
    per_thread_known.id = id;
  }
  return TP_SUCCESS;
}

tp_error_t tp__cu_stream_synchronize(tp__pstream *ps) {
  TP_CU_ON_STREAM(ps, tp__cu.cuStreamSynchronize(s_));
}

/* Queries run in relaxed capture mode. tidepool asks about its streams and
 * events while the calling thread may be capturing in global mode, where
 * the driver refuses the question and invalidates that capture (PyTorch's
 * caching allocator relaxes its event queries for the same reason). A
 * query of a capturing stream or a captured event is refused all the same,
 * as the capture rules say. */
tp_error_t tp__cu_stream_query(tp__pstream *ps) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__cu_scope_relax(&scope);
  CUresult r = tp__cu.cuStreamQuery(s);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

/* The capture question right before the query, so that a capture another
 * thread begins in between has as little time as the driver allows. */
tp_error_t tp__cu_stream_poll(tp__pstream *ps) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__cu_scope_relax(&scope);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = tp__cu.cuStreamIsCapturing ? tp__cu.cuStreamIsCapturing(s, &st)
                                          : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
    r = tp__cu.cuStreamQuery(s);
  else if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    r = CUDA_ERROR_NOT_READY;
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

/* The capture question first, as in the poll: the id is refused (and the
 * capture invalidated) while the stream captures. The per-thread stream is
 * asked in its device's context, where it names the calling thread's own:
 * another thread's is not it. An error other than a handle the driver no
 * longer knows leaves the stream taken as itself. */
bool tp__cu_stream_named(tp__pstream *ps, uint64_t uid) {
  CUstream s;
  tp__cu_scope scope;
  if (tp__cu_stream_begin(ps, &s, &scope) != TP_SUCCESS)
    return true;
  tp__cu_scope_relax(&scope);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = tp__cu.cuStreamIsCapturing ? tp__cu.cuStreamIsCapturing(s, &st)
                                          : CUDA_SUCCESS;
  unsigned long long id = uid;
  if (r == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE)
    r = tp__cu.cuStreamGetId(s, &id);
  tp__cu_scope_leave(&scope);
  if (r == CUDA_ERROR_INVALID_HANDLE)
    return false;
  return r != CUDA_SUCCESS || id == uid;
}

static CUresult event_query_relaxed(CUevent ev) {
  tp__cu_scope scope = {0};
  tp__cu_scope_relax(&scope);
  CUresult r = tp__cu.cuEventQuery(ev);
  tp__cu_scope_leave(&scope);
  return r;
}

tp_error_t tp__cu_stream_wait_event(tp__pstream *ps, tp__pevent *ev) {
  TP_CU_ON_STREAM(ps, tp__cu.cuStreamWaitEvent(s_, ev->ev, 0));
}

tp_error_t tp__cu_memset_async(tp__pstream *ps, void *ptr, int value,
                               size_t size) {
  TP_CU_ON_STREAM(ps, tp__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)ptr,
                                             (unsigned char)value, size, s_));
}

/* Makes the context of stream `s` current in `scope`, where another is. */
static CUresult enter_stream_ctx(CUstream s, tp__cu_scope *scope) {
  CUcontext ctx = NULL, cur = NULL;
  CUresult r = tp__cu.cuStreamGetCtx(s, &ctx);
  if (r == CUDA_SUCCESS)
    r = tp__cu.cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS || cur == ctx)
    return r;
  r = tp__cu.cuCtxSetCurrent(ctx);
  if (r == CUDA_SUCCESS) {
    scope->prev = cur;
    scope->switched = 1;
  }
  return r;
}

/* With unified addressing the driver infers the direction from the
 * pointers, host memory included. It checks that the pointers may be
 * accessed against the thread's current context, though, not the stream's:
 * a stream of device 1 copying out of device 0's pool (device 1 granted
 * access) into device 1's own pool is refused with CUDA_ERROR_INVALID_VALUE
 * while device 0's context is current, device 0 having no access to the
 * destination. So the copy runs with the stream's context current, as the
 * special streams' already does. (A memset is checked against the stream's
 * context and needs no switch.) */
tp_error_t tp__cu_memcpy_async(tp__pstream *ps, void *dst, const void *src,
                               size_t size) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  CUresult r = CUDA_SUCCESS;
  if ((uintptr_t)ps >= TP_CU_SPECIAL_LIMIT)
    r = enter_stream_ctx(s, &scope);
  if (r == CUDA_SUCCESS)
    r = tp__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                             (CUdeviceptr)(uintptr_t)src, size, s);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

tp_error_t tp__cu_launch_host_func(tp__pstream *ps, void (*fn)(void *),
                                   void *arg) {
  TP_CU_ON_STREAM(ps, tp__cu.cuLaunchHostFunc(s_, fn, arg));
}

tp_error_t tp__cu_device_synchronize(int device) {
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter(d, &scope));
  CUresult r = tp__cu.cuCtxSynchronize();
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

/* ---- events ------------------------------------------------------------ */

static tp_error_t new_cu_event(tp__cu_dev *d, CUevent *ev) {
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter(d, &scope));
  tp__cu_scope_relax(&scope);
  CUresult r = tp__cu.cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

tp_error_t tp__cu_event_create(int device, tp__pevent **out) {
  tp__cu_dev *d;
  TP_FORWARD(tp__cu_dev_get(device, &d));
  tp__spin_lock(&d->ev_lock);
  tp__pevent *ev = d->ev_free;
  if (ev) {
    d->ev_free = ev->next;
    d->ev_free_count--;
  }
  tp__spin_unlock(&d->ev_lock);
  if (!ev) {
    ev = calloc(1, sizeof *ev);
    TP_RETURN_IF(!ev, TP_ERROR_OUT_OF_MEMORY);
    ev->device = device;
  }
  if (!ev->ev) {
    tp_error_t err = new_cu_event(d, &ev->ev);
    if (err != TP_SUCCESS) {
      free(ev);
      return err;
    }
  }
  *out = ev;
  return TP_SUCCESS;
}

tp_error_t tp__cu_event_destroy(tp__pevent *ev) {
  tp__cu_dev *d = &tp__cu_devs[ev->device];
  /* Only a completed event may be handed out again, since a new event
   * must read as completed until it is recorded. A pending one goes back
   * to the driver, which frees it once its work is done, and only its
   * shell is kept. */
  CUresult r = CUDA_SUCCESS;
  if (ev->captured || event_query_relaxed(ev->ev) != CUDA_SUCCESS) {
    r = tp__cu.cuEventDestroy(ev->ev);
    ev->ev = NULL;
    ev->captured = false;
  }
  tp__spin_lock(&d->ev_lock);
  bool keep = d->ev_free_count < TP_CU_EVENT_FREE_MAX;
  if (keep) {
    ev->next = d->ev_free;
    d->ev_free = ev;
    d->ev_free_count++;
  }
  tp__spin_unlock(&d->ev_lock);
  if (!keep) {
    if (ev->ev)
      r = tp__cu.cuEventDestroy(ev->ev);
    free(ev);
  }
  return tp__cu_error(r);
}

tp_error_t tp__cu_event_record(tp__pevent *ev, tp__pstream *ps) {
  TP_CU_ON_STREAM(ps, tp__cu_record_uncaptured(ev->ev, s_));
}

tp_error_t tp__cu_event_query(tp__pevent *ev) {
  return tp__cu_error(event_query_relaxed(ev->ev));
}

tp_error_t tp__cu_event_synchronize(tp__pevent *ev) {
  return tp__cu_error(tp__cu.cuEventSynchronize(ev->ev));
}

tp_error_t tp__cu_event_wait(tp__pevent *ev) {
  tp__cu_scope scope = {0};
  tp__cu_scope_relax(&scope);
  CUresult r = tp__cu.cuEventSynchronize(ev->ev);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}
