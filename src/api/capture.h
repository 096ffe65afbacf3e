/* Stream capture's hooks (capture.c) in the allocator's entry points
 * (alloc.c) and the event and stream entry points (runtime.c): work on a
 * stream that captures goes to its capture, and graph memory is freed
 * through here. */
#ifndef TP_API_CAPTURE_H
#define TP_API_CAPTURE_H

#include "api/api.h"
#include "common/hot.h"
/* Whether work on s goes to a capture: s captures (or its capture was
 * invalidated), or s is a legacy stream that a capture forbids. */
bool tp__graph_capturing_slow(tp__stream *s);
static inline bool tp__graph_capturing(tp__stream *s) {
  return !tp__no_capture() && tp__graph_capturing_slow(s);
}
/* An allocation on such a stream, from `pool`'s kind of memory. */
tp_error_t tp__graph_malloc(void **ptr, size_t size, tp_pool_t pool,
                            tp__stream *s);
/* A free: true when the capture or graph memory took it, with *err;
 * otherwise *pool is the pool that holds ptr (NULL where none does). */
bool tp__graph_free(void *ptr, tp__stream *s, tp__pool **pool, tp_error_t *err);
/* Event record and stream wait: true when a capture took them. */
bool tp__graph_on_record(tp_event_t event, tp__stream *s, tp_error_t *err);
bool tp__graph_on_wait(tp__stream *s, tp_event_t event, tp__event *e,
                       tp_error_t *err);
/* CAPTURED_EVENT for an event last recorded in a capture. */
tp_error_t tp__graph_event_check(tp_event_t event);
void tp__graph_event_forget(tp_event_t event);
/* A stream being destroyed (already retired): a capture tidepool began on
 * it that has not ended can never end now, and its memory goes as a failed
 * capture's does. */
bool tp__graph_stream_destroyed(tp__stream *s);

#endif /* TP_API_CAPTURE_H */
