/* The host platform's ops table, the top of its layers: initialisation in
 * layer order, and the entry points of the stream ops that a capture can
 * take over, which send the work to host_capture.c or to the stream in
 * host_stream.c, so that streams never call up into the capture code. */
#include <pthread.h>

#include "platform/host/host_internal.h"

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static bool initialised;

/* Idempotent, and retried after a failure, so that a test can check the
 * answer to bad settings and then start with good ones. */
static tp_error_t host_init(void) {
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&init_mu);
  if (!initialised) {
    err = tp__host_configure();
    if (err == TP_SUCCESS)
      err = tp__host_streams_init();
    initialised = err == TP_SUCCESS;
  }
  pthread_mutex_unlock(&init_mu);
  return err;
}

/* ---- stream ops that a capture can take over ------------------------------
 * Each checks its arguments, and counts for fault injection, before a
 * capture sees it, exactly as when it goes to the stream. */

/* Work on a stream that captures, or on the legacy stream while a blocking
 * stream of its device captures, goes to the capture code; true when it
 * took the work (or refused it, with *err). */
static bool captured(tp__pstream *ps, const tp__host_node *work,
                     tp_error_t *err) {
  if (TP_LIKELY(!tp__host_stream_capture_involved(ps)))
    return false;
  bool taken = false;
  *err = tp__host_capture_node(ps, work, &taken);
  return taken;
}

static tp_error_t host_memset_async(tp__pstream *ps, void *ptr, int value,
                                    size_t size) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ps || (!ptr && size), TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(size > UINTPTR_MAX - (uintptr_t)ptr, TP_ERROR_INVALID_VALUE);
  tp_error_t err;
  if (TP_UNLIKELY(captured(ps,
                           &(tp__host_node){.kind = TP__HOST_NODE_MEMSET,
                                            .u.mem = {ptr, NULL, value, size}},
                           &err)))
    return err;
  return tp__host_stream_mem(ps, ptr, NULL, value, size);
}

static tp_error_t host_memcpy_async(tp__pstream *ps, void *dst, const void *src,
                                    size_t size) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ps || ((!dst || !src) && size), TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(size > UINTPTR_MAX - (uintptr_t)dst ||
                   size > UINTPTR_MAX - (uintptr_t)src,
               TP_ERROR_INVALID_VALUE);
  tp_error_t err;
  if (TP_UNLIKELY(captured(ps,
                           &(tp__host_node){.kind = TP__HOST_NODE_MEMCPY,
                                            .u.mem = {dst, src, 0, size}},
                           &err)))
    return err;
  return tp__host_stream_mem(ps, dst, src, 0, size);
}

static tp_error_t host_launch_host_func(tp__pstream *ps, void (*fn)(void *),
                                        void *arg) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ps || !fn, TP_ERROR_INVALID_VALUE);
  tp_error_t err;
  if (TP_UNLIKELY(captured(ps,
                           &(tp__host_node){.kind = TP__HOST_NODE_HOST_FUNC,
                                            .u.host = {fn, arg}},
                           &err)))
    return err;
  return tp__host_stream_host_func(ps, fn, arg);
}

/* A synchronize or query of a stream that a capture involves gets the error
 * CUDA gives, which invalidates the capture; it goes on to the stream only
 * when the capture ended meanwhile. */
static tp_error_t refused(tp__pstream *ps) {
  if (TP_LIKELY(!tp__host_stream_capture_involved(ps)))
    return TP_SUCCESS;
  return tp__host_capture_refuse(ps);
}

/* A synchronize, of a stream, an event or a device, is one of the calls
 * that the modes of the captures in progress may forbid, as the driver's
 * do; tidepool's own waits (event_wait) are not. */
static tp_error_t host_stream_synchronize(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(refused(ps));
  TP_FORWARD(tp__host_capture_check_sync());
  return tp__host_stream_synchronize(ps);
}

static tp_error_t host_event_synchronize(tp__pevent *ev) {
  TP_RETURN_IF(!ev, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__host_capture_check_sync());
  return tp__host_event_synchronize(ev);
}

static tp_error_t host_stream_query(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(refused(ps));
  return tp__host_stream_query(ps);
}

/* A device that does not exist is answered first, invalidating none. */
static tp_error_t host_device_synchronize(int device) {
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  TP_FORWARD(tp__host_capture_check_device_sync(device));
  return tp__host_device_synchronize(device);
}

/* A stream destroyed in the middle of a capture leaves it first. The legacy
 * stream, which destroy refuses, never takes part in a capture. */
static tp_error_t host_stream_destroy(tp__pstream *ps) {
  if (ps && tp__host_stream_member(ps))
    tp__host_capture_stream_gone(ps);
  return tp__host_stream_destroy(ps);
}

/* An event recorded in a capture leaves its place there first. */
static tp_error_t host_event_destroy(tp__pevent *ev) {
  if (ev && tp__host_event_capture(ev))
    tp__host_capture_event_forget(ev);
  return tp__host_event_destroy(ev);
}

const tp__platform_ops tp__host_platform = {
    .name = "host",
    .init = host_init,
    .device_count = tp__host_device_count,
    .device_attribute = tp__host_device_attribute,
    .set_device = tp__host_set_device,
    .mem_query = tp__host_mem_query,
    .stream_create = tp__host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_legacy = tp__host_stream_legacy,
    .stream_adopt = tp__host_stream_adopt,
    .stream_synchronize = host_stream_synchronize,
    .stream_query = host_stream_query,
    .stream_poll = tp__host_stream_poll,
    .stream_wait_event = tp__host_stream_wait_event,
    .memset_async = host_memset_async,
    .memcpy_async = host_memcpy_async,
    .launch_host_func = host_launch_host_func,
    .device_synchronize = host_device_synchronize,
    .event_create = tp__host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = tp__host_event_record,
    .event_query = tp__host_event_query,
    .event_synchronize = host_event_synchronize,
    .event_wait = tp__host_event_synchronize,
    .reserve = tp__host_reserve,
    .unreserve = tp__host_unreserve,
    .chunk_create = tp__host_chunk_create,
    .chunk_release = tp__host_chunk_release,
    .map = tp__host_map,
    .unmap = tp__host_unmap,
    .set_access = tp__host_set_access,
    .share_reservation = tp__host_share_reservation,
    .share_chunk = tp__host_share_chunk,
    .reserve_imported = tp__host_reserve_imported,
    .chunk_import = tp__host_chunk_import,
    .device_uuid = tp__host_device_uuid,
    .graph_maps_at_capture = tp__host_graph_maps_at_capture,
    .captures_active = &tp__host_captures_active,
    .legacy_covers_blocking = true,
    .capture_begin = tp__host_capture_begin,
    .capture_end = tp__host_capture_end,
    .capture_status = tp__host_capture_status,
    .capture_invalidate = tp__host_capture_invalidate,
    .capture_point = tp__host_capture_point,
    .capture_follows = tp__host_capture_follows,
    .capture_attach = tp__host_capture_attach,
    .capture_detach = tp__host_capture_detach,
    .capture_event_record = tp__host_capture_event_record,
    .capture_event_wait = tp__host_capture_event_wait,
    .graph_instantiate = tp__host_graph_instantiate,
    .graph_launch = tp__host_graph_launch,
    .graph_exec_destroy = tp__host_graph_exec_destroy,
    .graph_destroy = tp__host_graph_destroy,
};
