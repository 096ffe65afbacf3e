/* What the API layer's files share (api.c): one-time initialisation, the
 * device check that several entry points make, legacy-stream ordering, the
 * capture question, and what torch.c shares with torch_trace.c and the
 * tests. The capture hooks are capture.h's, the pool slots pools.h's. */
#ifndef TP_API_H
#define TP_API_H

#include "pool/pool.h"

/* Initialises the platform and the core once; every entry point calls it.
 * After a thread's first call it is one thread-local load. */
extern TP_TLS bool tp__api_ready;
/* Ready, the light fence a compiler barrier (fence.h), and the thread's
 * guard record made (guard.h): the allocator's quick entries, which take
 * it as their condition, then fence with compiler barriers alone. The
 * light fence never stops being free once it is; the record goes as the
 * thread ends, which the guard's quick entry checks. */
extern TP_TLS bool tp__api_quick;
tp_error_t tp__api_init_slow(void);
static inline tp_error_t tp__api_init(void) {
  return TP_LIKELY(tp__api_ready) ? TP_SUCCESS : tp__api_init_slow();
}

/* INVALID_DEVICE unless 0 <= device < count. */
tp_error_t tp__check_device(int device);

/* Legacy-stream ordering around work queued on stream `s`. */
static inline void tp__work_begin(tp__stream *s) {
  if (s->legacy)
    tp__legacy_begin(s->device);
}
static inline void tp__work_end(tp__stream *s, tp_error_t err) {
  if (s->legacy)
    tp__legacy_end(s->device, err == TP_SUCCESS);
}

/* The capture status of s, in *status (and its id, where id is not NULL).
 * Legacy-stream work while a blocking stream captures is refused, and
 * costs that capture its validity, as in CUDA. */
static inline tp_error_t tp__capture_status_of(tp__stream *s,
                                               tp_capture_status_t *status,
                                               uint64_t *id) {
  tp_error_t err = tp__platform->capture_status(s->ps, status, id);
  if (err == TP_ERROR_STREAM_CAPTURE_IMPLICIT)
    (void)tp__platform->capture_invalidate(s->ps);
  return err;
}

/* tp_malloc_async and tp_free_async; `uncaptured`: the caller knows that no
 * stream of the process captures now, so that the capture question (a
 * driver call on cuda) is not asked (torch.c while PyTorch, which announces
 * its captures, has none under way). */
tp_error_t tp__malloc_async_as(void **ptr, size_t size, tp_stream_t stream,
                               bool uncaptured);
tp_error_t tp__free_async_as(void *ptr, tp_stream_t stream, bool uncaptured);

/* tp_device_synchronize with `wait` (where not NULL) as the wait for the
 * calling thread's device, called exactly once unless the call fails before
 * it (init, memory): the interposer passes the application's own
 * synchronize, so that the device is waited for once. A second
 * cuCtxSynchronize right after the application's would invalidate every
 * capture another thread began in between, in any mode (H100, driver 580).
 * `wait` answers SUCCESS or ILLEGAL_ADDRESS where the work completed. */
tp_error_t tp__device_synchronize_by(tp_error_t (*wait)(void *arg), void *arg);
/* tp_stream_synchronize likewise, with the application's synchronize of the
 * same stream as `wait` (a second one would invalidate a capture begun on
 * the stream in between, or, from a thread in global mode, any global
 * capture of another thread). */
tp_error_t tp__stream_synchronize_by(tp_stream_t stream,
                                     tp_error_t (*wait)(void *arg), void *arg);
/* tp_event_synchronize likewise, `event` tidepool's twin of the
 * application's event, recorded just before it (so that the application's
 * wait covers its work). */
tp_error_t tp__event_synchronize_by(tp_event_t event,
                                    tp_error_t (*wait)(void *arg), void *arg);

/* torch.c's configuration from the TIDEPOOL_TORCH_* variables (see the
 * header's PyTorch section). The entry points read it once; it is exposed
 * so that a test can read it again after changing the environment. */
typedef struct tp__torch_config {
  uint64_t release_threshold;
  uint64_t growth_slack; /* parts per million; UINT64_MAX: the pool's */
  int reuse[3]; /* follow events, opportunistic, internal deps; -1: unset */
} tp__torch_config;
void tp__torch_read_config(tp__torch_config *cfg);
/* The PyTorch pool's growth slack where no variable sets one (ppm). */
#define TP_TORCH_GROWTH_SLACK 25000u

/* ---- torch_trace.c: TIDEPOOL_TORCH_TRACE ----------------------------------
 */

/* Opens the recording where the variable asks for one; called once. */
void tp__torch_trace_open(void);
/* Writes one line: `action` ("alloc", "free_requested", ...) of `ptr` on
 * `stream`, whose NULL is the current device's legacy stream. */
void tp__torch_trace(const char *action, void *ptr, ssize_t size, void *stream);
/* Writes out what has been recorded so far (a no-op when nothing is):
 * before a failure is reported, which may end the program. */
void tp__torch_trace_flush(void);
extern atomic_bool tp__torch_trace_on;
/* Whether a recording is open; read without a lock on every call. */
static inline bool tp__torch_tracing(void) {
  return atomic_load_explicit(&tp__torch_trace_on, memory_order_relaxed);
}

#endif /* TP_API_H */
