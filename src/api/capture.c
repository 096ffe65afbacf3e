/* Stream capture at the API: beginning and ending captures, the hooks
 * through which allocation, free, event record and stream wait reach a
 * capture, and events recorded inside captures. Capture itself is the
 * platform's; the graph a capture ends in is graph.c's, its memory
 * src/graph/'s. */
#include <pthread.h>
#include <string.h>

#include "api/api.h"
#include "api/capture.h"
#include "api/graph.h"
#include "common/guard.h"
#include "common/seen.h"
#include "graph/graph_mem.h"
#include "pool/alloc.h"

/* ---- the captures tidepool began -----------------------------------------
 */

/* The captures tidepool began and has not ended, by id, under begun_lock;
 * the oldest makes room past BEGUN_MAX (a capture the application ended
 * with the driver stays until then). */
#define BEGUN_MAX 256
static pthread_mutex_t begun_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t begun[BEGUN_MAX];
static unsigned nbegun;

static void begun_note(uint64_t id, bool add) {
  pthread_mutex_lock(&begun_lock);
  for (unsigned i = 0; i < nbegun; i++)
    if (begun[i] == id) {
      memmove(&begun[i], &begun[i + 1], (nbegun - i - 1) * sizeof *begun);
      nbegun--;
      break;
    }
  if (add && id) {
    if (nbegun == BEGUN_MAX)
      memmove(&begun[0], &begun[1], --nbegun * sizeof *begun);
    begun[nbegun++] = id;
  }
  pthread_mutex_unlock(&begun_lock);
}

static bool begun_here(uint64_t id) {
  bool found = false;
  pthread_mutex_lock(&begun_lock);
  for (unsigned i = 0; i < nbegun && !found; i++)
    found = begun[i] == id;
  pthread_mutex_unlock(&begun_lock);
  return found;
}

/* ---- events recorded in captures --------------------------------------------
 * An event recorded on a capturing stream is recorded, in its place, into a
 * platform event of the capture code (its shadow): the core's own event
 * keeps only real positions and the clocks that go with them, which a
 * capture must not touch (a stream that joins a capture does not follow its
 * origin's earlier work). */
typedef struct shadow {
  tp_event_t event;
  tp__pevent *pe;
  int device;
  bool captured; /* the event was last recorded in a capture */
} shadow;

static pthread_mutex_t shadows_lock = PTHREAD_MUTEX_INITIALIZER;
static shadow *shadows;
static uint32_t nshadows, capshadows;
static atomic_uint shadows_any;

/* Under shadows_lock. */
static shadow *shadow_find(tp_event_t event) {
  for (uint32_t i = 0; i < nshadows; i++)
    if (shadows[i].event == event)
      return &shadows[i];
  return NULL;
}

/* The shadow of `event` for a stream of `device`; under shadows_lock. */
static tp_error_t shadow_for(tp_event_t event, int device, shadow **out) {
  shadow *sh = shadow_find(event);
  if (!sh) {
    TP_RETURN_IF(!TP_ARRAY_ROOM(shadows, nshadows, capshadows),
                 TP_ERROR_OUT_OF_MEMORY);
    sh = &shadows[nshadows];
    *sh = (shadow){.event = event, .device = -1};
    nshadows++;
    atomic_store(&shadows_any, nshadows);
  }
  if (sh->device != device) {
    tp__pevent *pe = NULL;
    TP_FORWARD(tp__platform->event_create(device, &pe));
    if (sh->pe)
      (void)tp__platform->event_destroy(sh->pe);
    sh->pe = pe;
    sh->device = device;
    sh->captured = false;
  }
  *out = sh;
  return TP_SUCCESS;
}

/* ---- hooks ------------------------------------------------------------------
 */

bool tp__graph_capturing_slow(tp__stream *s) {
  tp_capture_status_t status;
  return tp__platform->capture_status(s->ps, &status, NULL) != TP_SUCCESS ||
         status != TP_CAPTURE_STATUS_NONE;
}

/* What an allocation node takes from its pool: device memory only, as the
 * driver's graph allocations, with the pool's access list. */
static tp_error_t kind_of(tp_pool_t pool, tp__gmem_kind *kind) {
  int type = 0, loc = 0, id = 0;
  TP_FORWARD(tp_pool_get_attribute(pool, TP_POOL_ATTR_ALLOCATION_TYPE, &type));
  TP_FORWARD(tp_pool_get_attribute(pool, TP_POOL_ATTR_LOCATION_TYPE, &loc));
  TP_FORWARD(tp_pool_get_attribute(pool, TP_POOL_ATTR_LOCATION_ID, &id));
  TP_RETURN_IF(type != TP_ALLOCATION_PINNED || loc != TP_LOCATION_DEVICE ||
                   id < 0 || id >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_NOT_SUPPORTED);
  *kind = (tp__gmem_kind){.device = id};
  int count = 0;
  TP_FORWARD(tp_get_device_count(&count));
  for (int d = 0; d < count && d < TP__GMEM_MAX_DEVICES; d++) {
    tp_location_t where = {TP_LOCATION_DEVICE, d, 0};
    TP_FORWARD(tp_pool_get_access(&kind->access[d], pool, &where));
  }
  return TP_SUCCESS;
}

/* Capture work of a call failed with `*err` in capture `id` of the stream.
 * Another thread may end a relaxed capture at any time, and the capture
 * layer then refuses (ILLEGAL_STATE: the stream is no member any more).
 * True when the stream has moved on (it captures no more, or captures
 * anew) and the call should ask again; otherwise `*err` becomes the answer
 * the stream's state gives: its capture invalidated, or the stream gone
 * (INVALID_VALUE, as for a call racing tp_stream_destroy). */
/* Each try that asks again follows another thread's end or begin on the
 * stream: the bound is a safety net, far above what threads that end and
 * begin captures on one stream back to back took (8 ran out on 16 cores). */
#define CAPTURE_TRIES 10000
static bool capture_retry(tp__stream *s, uint64_t id, tp_error_t *err) {
  if (*err != TP_ERROR_ILLEGAL_STATE &&
      *err != TP_ERROR_STREAM_CAPTURE_INVALIDATED)
    return false;
  tp_capture_status_t status;
  uint64_t now = 0;
  if (tp__platform->capture_status(s->ps, &status, &now) != TP_SUCCESS) {
    *err = TP_ERROR_INVALID_VALUE;
    return false;
  }
  if (status == TP_CAPTURE_STATUS_NONE ||
      (status == TP_CAPTURE_STATUS_ACTIVE && now != id))
    return true;
  if (status == TP_CAPTURE_STATUS_INVALIDATED)
    *err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  return false;
}

static tp_error_t graph_malloc(void **ptr, size_t size, tp_pool_t pool,
                               tp__stream *s, uint64_t *id);

tp_error_t tp__graph_malloc(void **ptr, size_t size, tp_pool_t pool,
                            tp__stream *s) {
  for (int tries = 1;; tries++) {
    uint64_t id = 0;
    tp_error_t err = graph_malloc(ptr, size, pool, s, &id);
    if (err == TP_SUCCESS || tries == CAPTURE_TRIES ||
        !capture_retry(s, id, &err))
      return err;
  }
}

static tp_error_t graph_malloc(void **ptr, size_t size, tp_pool_t pool,
                               tp__stream *s, uint64_t *idp) {
  tp_capture_status_t status;
  uint64_t id = 0;
  TP_FORWARD(tp__capture_status_of(s, &status, &id));
  if (status == TP_CAPTURE_STATUS_NONE) {
    /* The capture ended since the question was asked. */
    tp__pool *p;
    TP_FORWARD(tp__pool_get(pool, &p));
    return tp__pool_malloc(p, ptr, size, s);
  }
  TP_RETURN_IF(status == TP_CAPTURE_STATUS_INVALIDATED,
               TP_ERROR_STREAM_CAPTURE_INVALIDATED);
  *idp = id;
  tp__gmem_kind kind;
  TP_FORWARD(kind_of(pool, &kind));
  /* The driver's allocation node is work of its stream: a forked stream
   * that allocates and does not join back fails the end of the capture.
   * Tidepool adds no node of its own for an allocation, so on a stream
   * other than the origin of a capture that tidepool began (and will most
   * likely end) it marks the position with an empty node, which the end
   * checks and strips. The origin's allocations come before its end
   * anyway, and a capture the application began with the runtime is also
   * ended there, where marks would only stay and slow the launches. */
  bool mark =
      atomic_load_explicit(&s->capture_id, memory_order_relaxed) != id &&
      begun_here(id);
  return tp__gmem_malloc(s->ps, id, &kind, size, mark, ptr);
}

/* Where a call on the stream goes now: 1 into capture *id, 0 outside any
 * capture, -1 nowhere (*err says why: the stream's state cannot be read,
 * or its capture was invalidated). */
static int capture_now(tp__stream *s, uint64_t *id, tp_error_t *err) {
  tp_capture_status_t status;
  *id = 0;
  *err = tp__capture_status_of(s, &status, id);
  if (*err == TP_SUCCESS && status == TP_CAPTURE_STATUS_INVALIDATED)
    *err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (*err != TP_SUCCESS)
    return -1;
  return status != TP_CAPTURE_STATUS_NONE;
}

bool tp__graph_free(void *ptr, tp__stream *s, tp__pool **pool,
                    tp_error_t *err) {
  /* A capture ended by another thread meanwhile leaves the free to the
   * stream as it is now: outside capture, or in the capture another
   * thread began since, as the driver would take its own free there (an
   * allocation of the ended capture is then freed by the new graph, once
   * launched); and a capture begun between the question and a free
   * outside capture (whose event record it refuses) takes the free. */
  for (int tries = 1;; tries++) {
    uint64_t id = 0;
    int now = capture_now(s, &id, err);
    if (now < 0)
      return true;
    if (now > 0) {
      *err = tp__gmem_free_captured(s->ps, id, ptr);
      if (*err == TP_SUCCESS || tries == CAPTURE_TRIES ||
          !capture_retry(s, id, err))
        return true;
      continue;
    }
    /* Not capturing: the graph's only where no pool holds the address. */
    *err = TP_SUCCESS;
    if ((*pool = tp__registry_find((uintptr_t)ptr)) != NULL)
      return false;
    tp__graph_settle_running();
    bool claimed = false;
    *err = tp__gmem_free(s->ps, s->device, ptr, &claimed);
    if (!claimed || *err != TP_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
        tries == CAPTURE_TRIES)
      return claimed;
  }
}

bool tp__graph_on_record(tp_event_t event, tp__stream *s, tp_error_t *err) {
  for (int tries = 1;; tries++) {
    uint64_t id = 0;
    int now = capture_now(s, &id, err);
    if (now < 0)
      return true;
    if (now == 0)
      break;
    pthread_mutex_lock(&shadows_lock);
    shadow *sh = NULL;
    *err = shadow_for(event, s->device, &sh);
    if (*err == TP_SUCCESS)
      *err = tp__platform->capture_event_record(sh->pe, s->ps);
    if (*err == TP_SUCCESS)
      sh->captured = true;
    pthread_mutex_unlock(&shadows_lock);
    if (*err == TP_SUCCESS || tries == CAPTURE_TRIES ||
        !capture_retry(s, id, err))
      return true;
  }
  /* Recorded outside any capture again: the core's event holds it. */
  if (atomic_load(&shadows_any)) {
    pthread_mutex_lock(&shadows_lock);
    shadow *sh = shadow_find(event);
    if (sh)
      sh->captured = false;
    pthread_mutex_unlock(&shadows_lock);
  }
  return false;
}

bool tp__graph_on_wait(tp__stream *s, tp_event_t event, tp__event *e,
                       tp_error_t *err) {
  tp_capture_status_t status;
  *err = tp__capture_status_of(s, &status, NULL);
  if (*err != TP_SUCCESS)
    return true;
  if (atomic_load(&shadows_any)) {
    pthread_mutex_lock(&shadows_lock);
    shadow *sh = shadow_find(event);
    bool captured = sh && sh->captured;
    /* The stream joins the capture here (a fork): under its lock, as in
     * begin_capture, so that no poll falls between its question and its
     * query. */
    if (captured) {
      tp__blspin_lock(&s->lock);
      *err = tp__platform->capture_event_wait(s->ps, sh->pe);
      tp__blspin_unlock(&s->lock);
    }
    pthread_mutex_unlock(&shadows_lock);
    if (captured)
      return true;
  }
  if (status == TP_CAPTURE_STATUS_NONE)
    return false;
  if (status == TP_CAPTURE_STATUS_INVALIDATED) {
    *err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  /* An event never recorded has nothing to wait for: the driver lets the
   * capture go on, and so does tidepool. */
  if (!tp__event_recorded(e)) {
    *err = TP_SUCCESS;
    return true;
  }
  /* A capture may depend on outside work only through its stream's own
   * order: waiting on an event not recorded in a capture is CUDA's
   * isolation error, whether or not its work is done (the driver does not
   * look, and asking would be illegal under a global capture), and costs
   * the capture its validity. */
  (void)tp__platform->capture_invalidate(s->ps);
  *err = TP_ERROR_STREAM_CAPTURE_ISOLATION;
  return true;
}

tp_error_t tp__graph_event_check(tp_event_t event) {
  if (TP_LIKELY(!atomic_load(&shadows_any)))
    return TP_SUCCESS;
  pthread_mutex_lock(&shadows_lock);
  shadow *sh = shadow_find(event);
  bool captured = sh && sh->captured;
  pthread_mutex_unlock(&shadows_lock);
  return captured ? TP_ERROR_CAPTURED_EVENT : TP_SUCCESS;
}

void tp__graph_event_forget(tp_event_t event) {
  if (TP_LIKELY(!atomic_load(&shadows_any)))
    return;
  pthread_mutex_lock(&shadows_lock);
  shadow *sh = shadow_find(event);
  if (sh) {
    if (sh->pe)
      (void)tp__platform->event_destroy(sh->pe);
    *sh = shadows[--nshadows];
    atomic_store(&shadows_any, nshadows);
  }
  pthread_mutex_unlock(&shadows_lock);
}

/* ---- capture ----------------------------------------------------------------
 */

bool tp__graph_stream_destroyed(tp__stream *s) {
  uint64_t id = atomic_load_explicit(&s->capture_id, memory_order_relaxed);
  if (!id || !begun_here(id))
    return false;
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  uint64_t now = 0;
  if (tp__platform->capture_status(s->ps, &status, &now) != TP_SUCCESS ||
      status == TP_CAPTURE_STATUS_NONE)
    return false; /* ended by the application through the driver */
  begun_note(id, false);
  tp__gmem_capture_failed(id);
  return true;
}

/* The calls that resolve a stream run inside the guard, as every such call
 * does (see tp_stream_destroy). */
static tp_error_t begin_capture(tp_stream_t stream, tp_capture_mode_t mode) {
  tp__stream *s;
  TP_FORWARD(tp__stream_get(stream, &s));
  TP_RETURN_IF(mode != TP_CAPTURE_MODE_GLOBAL &&
                   mode != TP_CAPTURE_MODE_THREAD_LOCAL &&
                   mode != TP_CAPTURE_MODE_RELAXED,
               TP_ERROR_INVALID_VALUE);
  /* Begun under the stream's lock, which a poll of the stream holds from
   * its capture question to its query (order.c, ask_stream): a capture
   * begun between the two would be invalidated by the query. A capture the
   * application begins through the driver itself can still fall there. */
  tp__seen_begin();
  tp__blspin_lock(&s->lock);
  tp_error_t err = tp__platform->capture_begin(s->ps, mode);
  tp__blspin_unlock(&s->lock);
  tp_capture_status_t status;
  uint64_t id = 0;
  if (err == TP_SUCCESS &&
      tp__platform->capture_status(s->ps, &status, &id) != TP_SUCCESS)
    id = 0;
  tp__seen_began(err == TP_SUCCESS, (uintptr_t)s, id, true);
  TP_FORWARD(err);
  atomic_store_explicit(&s->capture_id, id, memory_order_relaxed);
  begun_note(id, true);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_stream_begin_capture(tp_stream_t stream,
                                          tp_capture_mode_t mode) {
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(begin_capture(stream, mode));
}

/* Whether an end's answer ended its capture in failure, with no graph
 * (ILLEGAL_STATE, say, means another thread's end came first, which may
 * have had its graph). */
static bool end_failed(tp_error_t err) {
  return err == TP_ERROR_STREAM_CAPTURE_INVALIDATED ||
         err == TP_ERROR_STREAM_CAPTURE_UNJOINED ||
         err == TP_ERROR_STREAM_CAPTURE_WRONG_THREAD;
}

static tp_error_t end_capture(tp_stream_t stream, tp_graph_t *graph) {
  tp__stream *s;
  TP_FORWARD(tp__stream_get(stream, &s));
  /* The capture this stream began last, read before the end: no capture
   * can begin on it while the one to end is under way. */
  uint64_t began = atomic_load_explicit(&s->capture_id, memory_order_relaxed);
  tp__pgraph *pg = NULL;
  uint64_t id = 0;
  tp_error_t err = tp__platform->capture_end(s->ps, &pg, &id);
  /* An invalidated capture has no id the driver will tell; the one this
   * stream began last is then the failed one (an older one, already
   * ended, is found seen and left as it is). */
  if (!id && err == TP_ERROR_STREAM_CAPTURE_INVALIDATED)
    id = began;
  tp_capture_status_t after = TP_CAPTURE_STATUS_ACTIVE;
  if (tp__platform->capture_status(s->ps, &after, NULL) != TP_SUCCESS)
    after = TP_CAPTURE_STATUS_ACTIVE;
  (void)tp__seen_ended((uintptr_t)s, id, after != TP_CAPTURE_STATUS_NONE,
                       err == TP_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* An end on a stream that only joined the capture (UNMATCHED) leaves it
   * under way, invalidated, for its origin to end. */
  if (id && (err == TP_SUCCESS || end_failed(err)))
    begun_note(id, false);
  if (id && end_failed(err))
    tp__gmem_capture_failed(id);
  TP_FORWARD(err);
  return tp__graph_made(pg, id, graph);
}

TP_API tp_error_t tp_stream_end_capture(tp_stream_t stream, tp_graph_t *graph) {
  TP_RETURN_IF(!graph, TP_ERROR_INVALID_VALUE);
  *graph = NULL;
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(end_capture(stream, graph));
}

static tp_error_t is_capturing(tp_stream_t stream,
                               tp_capture_status_t *status) {
  tp__stream *s;
  TP_FORWARD(tp__stream_get(stream, &s));
  return tp__platform->capture_status(s->ps, status, NULL);
}

TP_API tp_error_t tp_stream_is_capturing(tp_stream_t stream,
                                         tp_capture_status_t *status) {
  TP_RETURN_IF(!status, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(is_capturing(stream, status));
}
