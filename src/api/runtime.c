/* The stream runtime's entry points: streams, events, synchronize and
 * stream-ordered work. Each checks its arguments, keeps the core's view of
 * stream order (epochs, clocks, the legacy stream) and calls the platform,
 * or a capture (capture.h) where the stream captures. */
#include <pthread.h>

#include "api/api.h"
#include "api/capture.h"
#include "common/guard.h"
#include "ipc/ipc.h"
#include "stream/clock.h"

/* ---- streams ----------------------------------------------------------------
 */

static tp_error_t stream_of(tp_stream_t handle, tp__stream **s) {
  TP_FORWARD(tp__api_init());
  return tp__stream_get(handle, s);
}

TP_API tp_error_t tp_stream_create(tp_stream_t *stream, unsigned flags) {
  TP_RETURN_IF(!stream, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(flags & ~TP_STREAM_NON_BLOCKING, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return tp__stream_create(flags, stream);
}

/* Every call that resolves a stream handle runs inside the guard, and a
 * destroyed stream's platform stream and object go only once no call that
 * may have resolved it before its destruction is still inside: a thread
 * that races a destroy gets INVALID_VALUE or finishes its call on the old
 * stream, never a stream freed under it. */
static void release_stream(void *s) {
  (void)tp__stream_release(s); /* owned by tidepool: nothing to report */
}

/* The stream's cached blocks go back to their pools between its two steps
 * of destruction, so that they stay resolvable through its last marker. */
static tp_error_t stream_destroy(tp_stream_t stream) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  tp_error_t err = tp__stream_retire(s);
  if (err == TP_ERROR_INVALID_VALUE)
    return err;
  /* A capture this stream began can never end now; the destroy itself
   * succeeds, as the driver's does (an H100, driver 580, also for the
   * stream that began a capture under way). */
  (void)tp__graph_stream_destroyed(s);
  tp__pools_drop_stream(s);
  tp__guard_retire(s, release_stream);
  return err;
}

TP_API tp_error_t tp_stream_destroy(tp_stream_t stream) {
  TP_RETURN_IF(!stream, TP_ERROR_INVALID_VALUE);
  return TP_GUARDED(stream_destroy(stream));
}

/* Whether the platform's own query or synchronize of s covers everything
 * its frees follow: not for the legacy stream where it covers only its own
 * queue (platform.h), which a marker recorded first then makes cover them
 * (tp__stream_legacy_fence), nor for a blocking stream there, whose frees
 * follow the legacy work queued before them: covered where the legacy
 * stream is idle, or by a marker on s, which waits for that work. */
static bool stream_covered(const tp__stream *s) {
  return (!s->legacy || tp__platform->legacy_covers_blocking) &&
         !tp__stream_misses_legacy(s);
}

/* After the host saw the stream's work up to `epoch` complete: its frees
 * become reusable by all (where that covers what they follow, `covered`),
 * pools fall to their thresholds, and imported pools unmap what they no
 * longer use. */
static void completed(tp__stream *s, uint64_t epoch, bool covered) {
  if (covered)
    tp__stream_mark_done(s, epoch);
  tp__pool_after_sync(s);
  tp__ipc_settle();
}

/* The streams a completion covered (from tp__event_synchronize or
 * tp__stream_settle_followed) settle as after a synchronize of each. */
static void settle_listed(tp__stream **v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    tp__pool_after_sync(v[i]);
    if (v[i])
      tp__stream_unref(v[i]);
  }
  free(v);
  if (n)
    tp__ipc_settle();
}

static tp_error_t stream_synchronize(tp_stream_t stream,
                                     tp_error_t (*wait)(void *arg), void *arg) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  uint64_t epoch = tp__stream_advance(s);
  /* What the stream waited for so far, taken before the synchronize: a wait
   * that another thread queues meanwhile is not covered by it. */
  tp__clock followed;
  (void)tp__stream_followed(s, &followed);
  bool covered =
      stream_covered(s) ||
      (tp__stream_misses_legacy(s) && tp__stream_legacy_idle(s->device)) ||
      tp__stream_legacy_fence(s, epoch);
  tp_error_t err = wait ? wait(arg) : tp__platform->stream_synchronize(s->ps);
  if (err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS) {
    completed(s, epoch, covered);
    /* The work the stream waited for completed too: the frees it covers on
     * other streams are reusable by all, as CUDA's synchronize makes every
     * free it guarantees complete. */
    tp__stream **v = NULL;
    size_t n = 0;
    if (followed.n && tp__clock_settle(&followed, &v, &n) == TP_SUCCESS)
      settle_listed(v, n);
  }
  tp__clock_free(&followed);
  tp__pools_drop_lost();
  return err;
}

TP_API tp_error_t tp_stream_synchronize(tp_stream_t stream) {
  return TP_GUARDED(stream_synchronize(stream, NULL, NULL));
}

tp_error_t tp__stream_synchronize_by(tp_stream_t stream,
                                     tp_error_t (*wait)(void *arg), void *arg) {
  return TP_GUARDED(stream_synchronize(stream, wait, arg));
}

static tp_error_t stream_query(tp_stream_t stream) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  uint64_t epoch = tp__stream_advance(s);
  /* A blocking stream gets no marker here, which a caller's polling loop
   * would otherwise add to at every question while the legacy stream is
   * busy: its frees count as done once that stream is seen idle. */
  bool covered = stream_covered(s) || (tp__stream_misses_legacy(s)
                                           ? tp__stream_legacy_idle(s->device)
                                           : tp__stream_legacy_fence(s, epoch));
  tp_error_t err = tp__platform->stream_query(s->ps);
  if (err == TP_SUCCESS && covered)
    tp__stream_mark_done(s, epoch);
  return err;
}

TP_API tp_error_t tp_stream_query(tp_stream_t stream) {
  return TP_GUARDED(stream_query(stream));
}

static tp_error_t stream_wait_event(tp_stream_t stream, tp_event_t event) {
  tp__stream *s;
  tp__event *e;
  TP_FORWARD(stream_of(stream, &s));
  TP_FORWARD(tp__event_get(event, &e));
  tp_error_t err;
  if (tp__graph_on_wait(s, event, e, &err))
    return err;
  /* Not counted as work of the legacy stream: a wait for an event that
   * already completed queues nothing, and so orders no blocking stream's
   * work (the fuzzer's legacy-wait-counts). */
  return tp__event_wait(s, e);
}

TP_API tp_error_t tp_stream_wait_event(tp_stream_t stream, tp_event_t event,
                                       unsigned flags) {
  TP_RETURN_IF(flags != 0, TP_ERROR_INVALID_VALUE);
  return TP_GUARDED(stream_wait_event(stream, event));
}

tp_error_t tp__device_synchronize_by(tp_error_t (*wait)(void *arg), void *arg) {
  TP_FORWARD(tp__api_init());
  int device = tp__current_device();
  tp__stream **v;
  size_t n;
  TP_FORWARD(tp__streams_list(device, &v, &n));
  uint64_t *epochs = malloc((n ? n : 1) * sizeof *epochs);
  if (!epochs) {
    for (size_t i = 0; i < n; i++)
      tp__stream_unref(v[i]);
    free(v);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  uint64_t ticket = tp__device_sync_begin(device);
  for (size_t i = 0; i < n; i++)
    epochs[i] = tp__stream_advance(v[i]);
  tp_error_t err = wait ? wait(arg) : tp__platform->device_synchronize(device);
  if (err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS)
    tp__device_sync_done(device, ticket);
  for (size_t i = 0; i < n; i++) {
    if (err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS)
      completed(v[i], epochs[i], true);
    tp__stream_unref(v[i]);
  }
  /* With no live stream listed, frees of destroyed streams (now known done
   * through the ticket) must still be released. */
  if (!n && (err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS)) {
    tp__pool_after_sync(NULL);
    tp__ipc_settle();
  }
  free(epochs);
  free(v);
  tp__pools_drop_lost();
  return err;
}

TP_API tp_error_t tp_device_synchronize(void) {
  return tp__device_synchronize_by(NULL, NULL);
}

/* ---- events -------------------------------------------------------------- */

TP_API tp_error_t tp_event_create(tp_event_t *event) {
  TP_RETURN_IF(!event, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return tp__event_create(event);
}

/* Waits for the event; the streams its clock covers then settle as after a
 * synchronize. */
static tp_error_t event_synchronize(tp__event *e, tp_error_t (*wait)(void *),
                                    void *arg) {
  tp__stream **v = NULL;
  size_t n = 0;
  tp_error_t err = tp__event_synchronize(e, wait, arg, &v, &n);
  settle_listed(v, n);
  return err;
}

/* The calls below find the event inside the guard, so that one destroyed
 * by another thread meanwhile stays readable until they return. `wait`
 * and its argument are a synchronize's (see tp__event_synchronize). */
enum event_op { EV_DESTROY, EV_QUERY, EV_SYNCHRONIZE };

static tp_error_t event_call(tp_event_t event, enum event_op op,
                             tp_error_t (*wait)(void *), void *arg) {
  TP_FORWARD(tp__api_init());
  tp__event *e;
  TP_FORWARD(tp__event_get(event, &e));
  switch (op) {
  case EV_DESTROY: tp__graph_event_forget(event); return tp__event_destroy(e);
  case EV_QUERY:
    TP_FORWARD(tp__graph_event_check(event));
    return tp__event_query(e);
  default:
    TP_FORWARD(tp__graph_event_check(event));
    return event_synchronize(e, wait, arg);
  }
}

TP_API tp_error_t tp_event_destroy(tp_event_t event) {
  return TP_GUARDED(event_call(event, EV_DESTROY, NULL, NULL));
}

static tp_error_t event_record(tp_event_t event, tp_stream_t stream) {
  tp__stream *s;
  tp__event *e;
  TP_FORWARD(stream_of(stream, &s));
  TP_FORWARD(tp__event_get(event, &e));
  tp_error_t err;
  if (tp__graph_on_record(event, s, &err))
    return err;
  tp__work_begin(s);
  err = tp__event_record(e, s);
  tp__work_end(s, err);
  return err;
}

TP_API tp_error_t tp_event_record(tp_event_t event, tp_stream_t stream) {
  return TP_GUARDED(event_record(event, stream));
}

TP_API tp_error_t tp_event_query(tp_event_t event) {
  return TP_GUARDED(event_call(event, EV_QUERY, NULL, NULL));
}

TP_API tp_error_t tp_event_synchronize(tp_event_t event) {
  return TP_GUARDED(event_call(event, EV_SYNCHRONIZE, NULL, NULL));
}

tp_error_t tp__event_synchronize_by(tp_event_t event,
                                    tp_error_t (*wait)(void *arg), void *arg) {
  return TP_GUARDED(event_call(event, EV_SYNCHRONIZE, wait, arg));
}

/* ---- stream-ordered work ------------------------------------------------- */

static tp_error_t memset_async(void *ptr, int value, size_t size,
                               tp_stream_t stream) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  if (!size)
    return TP_SUCCESS;
  tp__work_begin(s);
  tp_error_t err = tp__platform->memset_async(s->ps, ptr, value, size);
  tp__work_end(s, err);
  return err;
}

/* A range that wraps around the end of the address space is refused here,
 * on every platform: on cuda the driver would take such an address for host
 * memory and copy into it. */
static bool wraps(const void *p, size_t size) {
  return size > UINTPTR_MAX - (uintptr_t)p;
}

TP_API tp_error_t tp_memset_async(void *ptr, int value, size_t size,
                                  tp_stream_t stream) {
  TP_RETURN_IF((!ptr && size) || wraps(ptr, size), TP_ERROR_INVALID_VALUE);
  return TP_GUARDED(memset_async(ptr, value, size, stream));
}

static tp_error_t memcpy_async(void *dst, const void *src, size_t size,
                               tp_stream_t stream) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  if (!size)
    return TP_SUCCESS;
  tp__work_begin(s);
  tp_error_t err = tp__platform->memcpy_async(s->ps, dst, src, size);
  tp__work_end(s, err);
  return err;
}

TP_API tp_error_t tp_memcpy_async(void *dst, const void *src, size_t size,
                                  tp_stream_t stream) {
  TP_RETURN_IF(((!dst || !src) && size) || wraps(dst, size) || wraps(src, size),
               TP_ERROR_INVALID_VALUE);
  return TP_GUARDED(memcpy_async(dst, src, size, stream));
}

static tp_error_t launch_host_func(tp_stream_t stream, void (*fn)(void *),
                                   void *arg) {
  tp__stream *s;
  TP_FORWARD(stream_of(stream, &s));
  tp__work_begin(s);
  tp_error_t err = tp__platform->launch_host_func(s->ps, fn, arg);
  tp__work_end(s, err);
  return err;
}

TP_API tp_error_t tp_launch_host_func(tp_stream_t stream, void (*fn)(void *),
                                      void *arg) {
  TP_RETURN_IF(!fn, TP_ERROR_INVALID_VALUE);
  return TP_GUARDED(launch_host_func(stream, fn, arg));
}
