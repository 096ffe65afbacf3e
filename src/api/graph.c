/* Stream capture and graphs at the API: argument checks, graph and exec
 * handles, the hooks through which allocation, free and events reach a
 * capture, and events recorded inside captures. Capture itself is the
 * platform's; graph memory is src/graph/'s. */
#include <pthread.h>
#include <string.h>

#include "api/api.h"
#include "common/guard.h"
#include "common/slots.h"
#include "graph/graph_mem.h"
#include "pool/alloc.h"

/* ---- handles ----------------------------------------------------------------
 * Graphs and execs live in slots of tables that are never freed
 * (common/slots.h), so that a handle is checked before anything is read
 * through it. A destroyed one's slot goes to a free list and serves the
 * next graph or exec, since a process that captures a graph per step would
 * otherwise run out of slots and hold memory for every graph it ever made.
 * A handle is therefore no address: it names the slot's number and its
 * generation, which the slot's state carries while that graph or exec is
 * alive and every reuse advances, so that a destroyed one's handle is still
 * refused once its slot serves another (until one slot has served 2^41
 * graphs, where pointers have 64 bits). */
#define INDEX_BITS 23 /* the slot's number + 1, 0 in no handle */
#define INDEX_MASK (((uintptr_t)1 << INDEX_BITS) - 1)
#define GEN_MASK ((uint64_t)(UINTPTR_MAX >> INDEX_BITS))
#define SLOTS_IN_ALL ((uint64_t)TP_SLOTS_CHUNK * TP_SLOTS_MAX_CHUNKS)
_Static_assert(SLOTS_IN_ALL < INDEX_MASK, "a slot's number + 1 fits");

typedef struct graph_slot {
  /* gen << 1 | alive, gen being the generation its handle names. */
  _Atomic uint64_t state;
  uint32_t index;
  /* Held around every driver call on the graph or on an exec made from
   * it: instantiation, launches, and the destruction of either. A graph
   * destroyed by another thread meanwhile is then instantiated whole or
   * refused, and so is an exec's launch. The driver's graphs and execs are
   * not synchronized internally, and one exec's destruction racing its
   * graph's took the driver down (an H200, 2026-12-01). Made with the slot
   * and never destroyed: a thread with a stale handle may still lock it,
   * and execs of a destroyed graph keep locking it when the slot serves
   * another graph (which then shares it, costing only some waiting). */
  pthread_mutex_t use;
  tp__pgraph *pg;
  tp__gmem *gm; /* NULL: the capture allocated and freed nothing */
  struct graph_slot *next_free;
} graph_slot;

typedef struct exec_slot {
  _Atomic uint64_t state; /* as a graph's */
  uint32_t index;
  /* Made from; its lock guards this one. Read before that lock is held,
   * when the slot may be serving another exec already. */
  graph_slot *_Atomic graph;
  tp__pexec *pe;
  tp__gmem *gm;
  bool auto_free;
  /* The platform's exec is the application's (tp_graph_exec_adopt): its
   * destruction here leaves the platform's exec alone, and its graph slot
   * (a shell that no handle names) goes with it. */
  bool adopted;
  /* For a self-held gm (see tp__gmem_adopt): where the last launch was
   * queued, so that the graph's memory outlives it. The application
   * serialises calls on one exec, as CUDA asks. */
  bool track;
  tp__tag last;
  struct exec_slot *next_adopted; /* the live adopted execs */
  struct exec_slot *next_free;
} exec_slot;

/* Under handles_lock: the tables, their free lists, the adopted execs. */
static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static tp__slots graph_slots = TP_SLOTS_INIT(graph_slot);
static tp__slots exec_slots = TP_SLOTS_INIT(exec_slot);
static graph_slot *free_graphs;
static exec_slot *free_execs;
static exec_slot *adopted_execs;

static uint64_t gen_of(uint64_t state) {
  return state >> 1;
}

static uintptr_t handle_of(uint32_t index, uint64_t state) {
  return (uintptr_t)gen_of(state) << INDEX_BITS | ((uintptr_t)index + 1);
}

/* The slot a handle names, or NULL; *want: the state the slot has while
 * the handle's graph or exec is alive. Reads nothing through the handle. */
static void *slot_named(const tp__slots *t, const void *handle,
                        uint64_t *want) {
  uintptr_t h = (uintptr_t)handle, i = h & INDEX_MASK;
  *want = (uint64_t)(h >> INDEX_BITS) << 1 | 1;
  return i ? tp__slots_at(t, i - 1) : NULL;
}

/* The state that makes a free slot alive, in a new generation. */
static uint64_t next_alive(uint64_t state) {
  return ((gen_of(state) + 1) & GEN_MASK) << 1 | 1;
}

/* A slot for a new graph, not alive yet; NULL when memory runs out. */
static graph_slot *graph_new(void) {
  pthread_mutex_lock(&handles_lock);
  graph_slot *g = free_graphs;
  if (g) {
    free_graphs = g->next_free;
  } else {
    g = tp__slots_take(&graph_slots, NULL);
    if (g) {
      g->index = (uint32_t)(graph_slots.taken - 1);
      pthread_mutex_init(&g->use, NULL);
    }
  }
  pthread_mutex_unlock(&handles_lock);
  if (g) {
    g->pg = NULL;
    g->gm = NULL;
    g->next_free = NULL;
  }
  return g;
}

/* The slot of a graph no longer alive (or never made alive) serves the
 * next one; nothing may be read through it after. */
static void graph_free(graph_slot *g) {
  pthread_mutex_lock(&handles_lock);
  g->next_free = free_graphs;
  free_graphs = g;
  pthread_mutex_unlock(&handles_lock);
}

static exec_slot *exec_new(void) {
  pthread_mutex_lock(&handles_lock);
  exec_slot *x = free_execs;
  if (x) {
    free_execs = x->next_free;
  } else {
    x = tp__slots_take(&exec_slots, NULL);
    if (x)
      x->index = (uint32_t)(exec_slots.taken - 1);
  }
  pthread_mutex_unlock(&handles_lock);
  if (x) {
    atomic_store_explicit(&x->graph, NULL, memory_order_relaxed);
    x->pe = NULL;
    x->gm = NULL;
    x->auto_free = x->adopted = x->track = false;
    x->last = (tp__tag){0};
    x->next_adopted = x->next_free = NULL;
  }
  return x;
}

static void exec_free(exec_slot *x) {
  pthread_mutex_lock(&handles_lock);
  x->next_free = free_execs;
  free_execs = x;
  pthread_mutex_unlock(&handles_lock);
}

/* Makes a filled slot alive; its handle from now on. */
static tp_graph_t graph_publish(graph_slot *g) {
  uint64_t st = next_alive(atomic_load(&g->state));
  atomic_store(&g->state, st);
  return (tp_graph_t)handle_of(g->index, st);
}

static tp_graph_exec_t exec_publish(exec_slot *x) {
  uint64_t st = next_alive(atomic_load(&x->state));
  atomic_store(&x->state, st);
  return (tp_graph_exec_t)handle_of(x->index, st);
}

static tp_graph_exec_t exec_handle(const exec_slot *x) {
  return (tp_graph_exec_t)handle_of(x->index, atomic_load(&x->state));
}

/* The live graph a handle names, in *out, and the state that says it is
 * still alive in *want. */
static tp_error_t graph_get(tp_graph_t handle, graph_slot **out,
                            uint64_t *want) {
  graph_slot *g = slot_named(&graph_slots, handle, want);
  TP_RETURN_IF(!g || atomic_load(&g->state) != *want, TP_ERROR_INVALID_VALUE);
  *out = g;
  return TP_SUCCESS;
}

static tp_error_t exec_get(tp_graph_exec_t handle, exec_slot **out,
                           uint64_t *want) {
  exec_slot *x = slot_named(&exec_slots, handle, want);
  TP_RETURN_IF(!x || atomic_load(&x->state) != *want, TP_ERROR_INVALID_VALUE);
  *out = x;
  return TP_SUCCESS;
}

/* Ends the life that `want` names; false when it already ended. */
static bool kill(_Atomic uint64_t *state, uint64_t want) {
  return atomic_compare_exchange_strong(state, &want, want & ~(uint64_t)1);
}

/* The captures tidepool began and has not ended, by id, under handles_lock;
 * the oldest makes room past BEGUN_MAX (a capture the application ended
 * with the driver stays until then). */
#define BEGUN_MAX 256
static uint64_t begun[BEGUN_MAX];
static unsigned nbegun;

static void begun_note(uint64_t id, bool add) {
  pthread_mutex_lock(&handles_lock);
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
  pthread_mutex_unlock(&handles_lock);
}

static bool begun_here(uint64_t id) {
  bool found = false;
  pthread_mutex_lock(&handles_lock);
  for (unsigned i = 0; i < nbegun && !found; i++)
    found = begun[i] == id;
  pthread_mutex_unlock(&handles_lock);
  return found;
}

/* ---- destroyed execs whose launches may still run ---------------------------
 * For a self-held graph memory, the last launch of each destroyed exec is
 * watched through the stream order the core keeps (a tag, polled with the
 * core's markers); graph memory hears when it completed. Polled by the
 * graph entry points and by frees of graph memory while any is waiting. */
typedef struct running_exec {
  tp__tag last;
  tp__gmem *gm;
} running_exec;

static pthread_mutex_t running_lock = PTHREAD_MUTEX_INITIALIZER;
static running_exec *running;
static uint32_t nrunning, caprunning;
static atomic_uint running_any;

static void settle_running(void) {
  if (TP_LIKELY(!atomic_load_explicit(&running_any, memory_order_acquire)))
    return;
  pthread_mutex_lock(&running_lock);
  for (uint32_t i = 0; i < nrunning;) {
    if (!tp__stream_poll(&running[i].last)) {
      i++;
      continue;
    }
    tp__gmem_exec_finished(running[i].gm);
    tp__tag_clear(&running[i].last);
    running[i] = running[--nrunning];
  }
  atomic_store_explicit(&running_any, nrunning, memory_order_release);
  pthread_mutex_unlock(&running_lock);
}

/* Hands the exec's last launch to the watch; should the list not grow, the
 * launch is waited for here. */
static void watch_last_launch(exec_slot *x) {
  pthread_mutex_lock(&running_lock);
  bool kept = TP_ARRAY_ROOM(running, nrunning, caprunning);
  if (kept) {
    running[nrunning++] = (running_exec){x->last, x->gm};
    atomic_store_explicit(&running_any, nrunning, memory_order_release);
  }
  pthread_mutex_unlock(&running_lock);
  if (!kept) {
    (void)tp__stream_wait_host(&x->last);
    tp__gmem_exec_finished(x->gm);
    tp__tag_clear(&x->last);
  }
  x->last = (tp__tag){0};
  settle_running();
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

static tp_error_t status_of(tp__stream *s, tp_capture_status_t *status,
                            uint64_t *id) {
  tp_error_t err = tp__platform->capture_status(s->ps, status, id);
  /* Legacy-stream work while a blocking stream captures is refused, and
   * costs that capture its validity, as in CUDA. */
  if (err == TP_ERROR_STREAM_CAPTURE_IMPLICIT)
    (void)tp__platform->capture_invalidate(s->ps);
  return err;
}

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
#define CAPTURE_TRIES 8
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
  TP_FORWARD(status_of(s, &status, &id));
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
  *err = status_of(s, &status, id);
  if (*err == TP_SUCCESS && status == TP_CAPTURE_STATUS_INVALIDATED)
    *err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (*err != TP_SUCCESS)
    return -1;
  return status != TP_CAPTURE_STATUS_NONE;
}

bool tp__graph_free(void *ptr, tp__stream *s, tp_error_t *err) {
  uint64_t id = 0;
  int now = capture_now(s, &id, err);
  if (now < 0)
    return true;
  /* A capture ended by another thread meanwhile leaves the free to the
   * stream outside capture, even where it captures anew: booked in a new
   * capture, the free of the old one's allocation would keep that
   * allocation until the new graph launched, which it may never do. */
  if (now > 0) {
    *err = tp__gmem_free_captured(s->ps, id, ptr);
    if (*err == TP_SUCCESS || !capture_retry(s, id, err))
      return true;
  }
  /* Not capturing: the graph's only where no pool holds the address. */
  *err = TP_SUCCESS;
  if (tp__registry_find((uintptr_t)ptr))
    return false;
  settle_running();
  bool claimed = false;
  *err = tp__gmem_free(s->ps, s->device, ptr, &claimed);
  return claimed;
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
  *err = status_of(s, &status, NULL);
  if (*err != TP_SUCCESS)
    return true;
  if (atomic_load(&shadows_any)) {
    pthread_mutex_lock(&shadows_lock);
    shadow *sh = shadow_find(event);
    bool captured = sh && sh->captured;
    if (captured)
      *err = tp__platform->capture_event_wait(s->ps, sh->pe);
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

void tp__graph_stream_destroyed(tp__stream *s) {
  uint64_t id = atomic_load_explicit(&s->capture_id, memory_order_relaxed);
  if (!id || !begun_here(id))
    return;
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  uint64_t now = 0;
  if (tp__platform->capture_status(s->ps, &status, &now) != TP_SUCCESS ||
      status == TP_CAPTURE_STATUS_NONE)
    return; /* ended by the application through the driver */
  begun_note(id, false);
  tp__gmem_capture_failed(id);
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
  TP_FORWARD(tp__platform->capture_begin(s->ps, mode));
  tp_capture_status_t status;
  uint64_t id = 0;
  if (tp__platform->capture_status(s->ps, &status, &id) != TP_SUCCESS)
    id = 0;
  atomic_store_explicit(&s->capture_id, id, memory_order_relaxed);
  begun_note(id, true);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_stream_begin_capture(tp_stream_t stream,
                                          tp_capture_mode_t mode) {
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(begin_capture(stream, mode));
}

static tp_error_t end_capture(tp_stream_t stream, tp_graph_t *graph) {
  tp__stream *s;
  TP_FORWARD(tp__stream_get(stream, &s));
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  uint64_t id = 0;
  if (tp__platform->capture_status(s->ps, &status, &id) != TP_SUCCESS)
    id = 0;
  tp__pgraph *pg = NULL;
  tp_error_t err = tp__platform->capture_end(s->ps, &pg);
  if (status != TP_CAPTURE_STATUS_NONE)
    begun_note(id ? id
                  : atomic_load_explicit(&s->capture_id, memory_order_relaxed),
               false);
  /* An invalidated capture has no id the driver will tell; the one this
   * stream began last is the failed one (one that already ended is found
   * seen and left as it is). */
  if (err != TP_SUCCESS && status != TP_CAPTURE_STATUS_NONE)
    tp__gmem_capture_failed(
        id ? id : atomic_load_explicit(&s->capture_id, memory_order_relaxed));
  TP_FORWARD(err);
  graph_slot *g = graph_new();
  if (!g) {
    if (id)
      tp__gmem_capture_failed(id);
    (void)tp__platform->graph_destroy(pg);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  g->pg = pg;
  g->gm = id ? tp__gmem_of_capture(id) : NULL;
  if (g->gm)
    tp__gmem_adopt(g->gm, pg);
  *graph = graph_publish(g);
  return TP_SUCCESS;
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

/* ---- graphs and execs -------------------------------------------------------
 */

/* Under the graph's lock, the graph alive. */
static tp_error_t instantiate(tp_graph_exec_t *exec, graph_slot *graph,
                              unsigned long long flags) {
  exec_slot *x = exec_new();
  TP_RETURN_IF(!x, TP_ERROR_OUT_OF_MEMORY);
  void (*release)(void *) = NULL;
  void *arg = NULL;
  tp_error_t err =
      graph->gm ? tp__gmem_instantiate(graph->gm, &release, &arg) : TP_SUCCESS;
  if (err == TP_SUCCESS) {
    err =
        tp__platform->graph_instantiate(graph->pg, flags, release, arg, &x->pe);
    if (err != TP_SUCCESS && graph->gm)
      tp__gmem_instantiate_undo(graph->gm, arg);
  }
  if (err != TP_SUCCESS) {
    exec_free(x); /* never alive, answering no handle */
    return err;
  }
  atomic_store(&x->graph, graph);
  x->gm = graph->gm;
  x->auto_free = flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH;
  x->track = tp__gmem_self_held(graph->gm);
  *exec = exec_publish(x);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_graph_instantiate(tp_graph_exec_t *exec, tp_graph_t graph,
                                       unsigned long long flags) {
  TP_RETURN_IF(!exec, TP_ERROR_INVALID_VALUE);
  *exec = NULL;
  TP_FORWARD(tp__api_init());
  graph_slot *g;
  uint64_t want;
  TP_FORWARD(graph_get(graph, &g, &want));
  TP_RETURN_IF(flags & ~TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH,
               TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&g->use);
  tp_error_t err =
      atomic_load(&g->state) == want ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = instantiate(exec, g, flags);
  pthread_mutex_unlock(&g->use);
  return err;
}

/* Under the lock of the exec's graph, the exec alive. */
static tp_error_t launch(exec_slot *exec, tp_stream_t stream) {
  tp__stream *s;
  TP_FORWARD(tp__stream_get(stream, &s));
  /* Graph memory is booked per launch of its exec, which a launch captured
   * into another graph would escape. */
  if (tp__gmem_has_allocations(exec->gm)) {
    tp_capture_status_t status;
    TP_FORWARD(status_of(s, &status, NULL));
    TP_RETURN_IF(status != TP_CAPTURE_STATUS_NONE, TP_ERROR_NOT_SUPPORTED);
  }
  tp__work_begin(s);
  tp_error_t err =
      tp__gmem_launch(exec->gm, exec->pe, exec->auto_free, s->ps, s->device);
  tp__work_end(s, err);
  if (err == TP_SUCCESS && exec->track) {
    /* Work queued on s from now on follows the launch: the epoch moves
     * under the stream's lock, so no marker recorded before the launch can
     * count as one after it. */
    if (exec->last.stream != s) {
      tp__stream_ref(s);
      tp__tag_clear(&exec->last);
      exec->last.stream = s;
    }
    exec->last.epoch = tp__stream_advance(s);
  }
  return err;
}

/* Locks the graph of a live exec, in *g: the one read before the lock is
 * held, which is the exec's own whenever the exec is still alive under it
 * (a slot reused meanwhile is found at the check that follows). */
static tp_error_t exec_lock(tp_graph_exec_t handle, exec_slot **x,
                            graph_slot **g, uint64_t *want) {
  TP_FORWARD(exec_get(handle, x, want));
  *g = atomic_load(&(*x)->graph);
  if (!*g)
    return TP_ERROR_INVALID_VALUE; /* reused, and not filled yet */
  pthread_mutex_lock(&(*g)->use);
  if (atomic_load(&(*x)->state) != *want) {
    pthread_mutex_unlock(&(*g)->use);
    return TP_ERROR_INVALID_VALUE;
  }
  return TP_SUCCESS;
}

TP_API tp_error_t tp_graph_launch(tp_graph_exec_t exec, tp_stream_t stream) {
  TP_FORWARD(tp__api_init());
  exec_slot *x;
  graph_slot *g;
  uint64_t want;
  TP_FORWARD(exec_lock(exec, &x, &g, &want));
  tp_error_t err = TP_GUARDED(launch(x, stream));
  pthread_mutex_unlock(&g->use);
  return err;
}

static void adopted_forget(exec_slot *x);

TP_API tp_error_t tp_graph_exec_destroy(tp_graph_exec_t exec) {
  TP_FORWARD(tp__api_init());
  exec_slot *x;
  graph_slot *g;
  uint64_t want;
  TP_FORWARD(exec_lock(exec, &x, &g, &want));
  if (!kill(&x->state, want)) {
    pthread_mutex_unlock(&g->use);
    return TP_ERROR_INVALID_VALUE;
  }
  bool may_run = x->last.stream != NULL;
  if (x->gm)
    tp__gmem_exec_destroyed(x->gm, may_run);
  tp_error_t err =
      x->adopted ? TP_SUCCESS : tp__platform->graph_exec_destroy(x->pe);
  pthread_mutex_unlock(&g->use);
  if (x->adopted) {
    /* The shell graph, never alive, goes with its one exec. */
    adopted_forget(x);
    graph_free(g);
  }
  /* The last launch is watched outside the lock: watching may wait for it,
   * and its work may call into tidepool. */
  if (may_run)
    watch_last_launch(x);
  else
    settle_running();
  exec_free(x);
  return err;
}

TP_API tp_error_t tp_graph_destroy(tp_graph_t graph) {
  TP_FORWARD(tp__api_init());
  graph_slot *g;
  uint64_t want;
  TP_FORWARD(graph_get(graph, &g, &want));
  pthread_mutex_lock(&g->use);
  if (!kill(&g->state, want)) {
    pthread_mutex_unlock(&g->use);
    return TP_ERROR_INVALID_VALUE;
  }
  if (g->gm)
    tp__gmem_graph_destroyed(g->gm);
  tp_error_t err = tp__platform->graph_destroy(g->pg);
  pthread_mutex_unlock(&g->use);
  graph_free(g);
  settle_running();
  return err;
}

/* ---- execs the application made ---------------------------------------------
 * On cuda the application may end a capture in which tidepool allocated,
 * and instantiate and launch its graph, with the driver. An exec adopted
 * here is booked as tidepool's own: its graph slot is a shell around the
 * driver's graph, which tidepool neither owns nor destroys. */

static atomic_uint adopted_any;

/* The live adopted exec of platform_exec; under handles_lock. */
static exec_slot *adopted_find(const void *platform_exec) {
  exec_slot *x = adopted_execs;
  while (x && !(x->pe == platform_exec && (atomic_load(&x->state) & 1)))
    x = x->next_adopted;
  return x;
}

static void adopted_forget(exec_slot *x) {
  pthread_mutex_lock(&handles_lock);
  exec_slot **at = &adopted_execs;
  while (*at && *at != x)
    at = &(*at)->next_adopted;
  if (*at)
    *at = x->next_adopted;
  pthread_mutex_unlock(&handles_lock);
}

static tp_error_t adopt(tp_graph_exec_t *exec, void *platform_exec,
                        void *platform_graph, unsigned long long flags) {
  tp__gmem *gm = tp__gmem_of_graph(platform_graph);
  TP_RETURN_IF(!gm, TP_ERROR_INVALID_VALUE);
  /* Adopting again is answered with the same exec (the interposer may see
   * one instantiation at the runtime's level and at the driver's). The
   * platform hands a destroyed exec's handle to a new one: an adopted exec
   * with that handle and another graph is one whose destruction tidepool
   * did not see. */
  pthread_mutex_lock(&handles_lock);
  exec_slot *known = adopted_find(platform_exec);
  tp_graph_exec_t known_handle = known ? exec_handle(known) : NULL;
  if (known && known->gm == gm) {
    known->auto_free = flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH;
    *exec = known_handle;
  }
  pthread_mutex_unlock(&handles_lock);
  if (*exec)
    return TP_SUCCESS;
  if (known)
    (void)tp_graph_exec_destroy(known_handle);
  graph_slot *g = graph_new();
  exec_slot *x = exec_new();
  void (*release)(void *) = NULL;
  void *arg = NULL;
  tp_error_t err = g && x ? tp__gmem_instantiate(gm, &release, &arg)
                          : TP_ERROR_OUT_OF_MEMORY;
  if (err != TP_SUCCESS) {
    /* Never alive, answering no handle. */
    if (g)
      graph_free(g);
    if (x)
      exec_free(x);
    return err;
  }
  /* The shell is never made alive: no handle may name it, lest
   * tp_graph_destroy reach the application's graph. Its lock is all that
   * is used of it. */
  g->pg = platform_graph;
  g->gm = gm;
  atomic_store(&x->graph, g);
  x->pe = platform_exec;
  x->gm = gm;
  x->auto_free = flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH;
  x->adopted = true;
  pthread_mutex_lock(&handles_lock);
  *exec = exec_publish(x);
  x->next_adopted = adopted_execs;
  adopted_execs = x;
  atomic_store(&adopted_any, 1);
  pthread_mutex_unlock(&handles_lock);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_graph_exec_adopt(tp_graph_exec_t *exec,
                                      void *platform_exec, void *platform_graph,
                                      unsigned long long flags) {
  TP_RETURN_IF(!exec, TP_ERROR_INVALID_VALUE);
  *exec = NULL;
  TP_RETURN_IF(!platform_exec || !platform_graph, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  /* Where tidepool maps at instantiation (host), it makes every exec. */
  TP_RETURN_IF(!tp__platform->graph_maps_at_capture(), TP_ERROR_NOT_SUPPORTED);
  /* Other flags (upload, device launch, priorities) are the platform's. */
  return adopt(exec, platform_exec, platform_graph, flags);
}

TP_API tp_error_t tp_graph_exec_find(tp_graph_exec_t *exec,
                                     const void *platform_exec) {
  TP_RETURN_IF(!exec, TP_ERROR_INVALID_VALUE);
  *exec = NULL;
  TP_RETURN_IF(!platform_exec, TP_ERROR_INVALID_VALUE);
  if (TP_LIKELY(!atomic_load_explicit(&adopted_any, memory_order_acquire)))
    return TP_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&handles_lock);
  exec_slot *x = adopted_find(platform_exec);
  *exec = x ? exec_handle(x) : NULL;
  pthread_mutex_unlock(&handles_lock);
  return *exec ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
}

TP_API tp_error_t tp_graph_forget(void *platform_graph) {
  TP_RETURN_IF(!platform_graph, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  tp__gmem_forget_graph(platform_graph);
  return TP_SUCCESS;
}

/* ---- graph memory -----------------------------------------------------------
 */

TP_API tp_error_t tp_device_graph_mem_trim(int device) {
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  settle_running();
  return tp__gmem_trim(device);
}

TP_API tp_error_t tp_device_get_graph_mem_attribute(int device,
                                                    tp_graph_mem_attr_t attr,
                                                    void *value) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  settle_running();
  return tp__gmem_get_attr(device, attr, value);
}

TP_API tp_error_t tp_device_set_graph_mem_attribute(int device,
                                                    tp_graph_mem_attr_t attr,
                                                    void *value) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  TP_RETURN_IF(*(const uint64_t *)value != 0, TP_ERROR_INVALID_VALUE);
  return tp__gmem_reset_high(device, attr);
}
