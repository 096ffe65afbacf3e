/* Graphs and execs at the API: their handles, instantiation, launch and
 * destruction, the execs the application made with the driver, and the
 * graph memory entry points. Captures are capture.c's; graph memory is
 * src/graph/'s. */
#include <pthread.h>

#include "api/api.h"
#include "api/graph.h"
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
 * refused once its slot serves another (until one slot has served 2^40
 * graphs, where pointers have 64 bits). A bit says which table: a graph's
 * handle passed for an exec (both first slots are number 0) once launched
 * and destroyed the exec. */
#define INDEX_BITS 23 /* the slot's number + 1, 0 in no handle */
#define INDEX_MASK (((uintptr_t)1 << INDEX_BITS) - 1)
#define KIND_EXEC ((uintptr_t)1 << INDEX_BITS)
#define GEN_SHIFT (INDEX_BITS + 1)
#define GEN_MASK ((uint64_t)(UINTPTR_MAX >> GEN_SHIFT))
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
  /* The last launch of its destroyed exec, while its graph memory may
   * still be in use there: the next exec's launches follow it, as the
   * addresses are the graph's and so the same in every exec. */
  tp__tag prior;
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
  /* Written by a second adoption under handles_lock while a launch may
   * read it under the graph's lock: atomic. */
  atomic_bool auto_free;
  /* The platform's exec is the application's (tp_graph_exec_adopt): its
   * destruction here leaves the platform's exec alone, and its graph slot
   * (a shell that no handle names) goes with it. */
  bool adopted;
  /* Where the last launch was queued, for an exec with graph memory: the
   * next exec of its graph follows it, and for a self-held gm (`track`,
   * see tp__gmem_adopt) the graph's memory outlives it. The application
   * serialises calls on one exec, as CUDA asks. */
  bool track;
  tp__tag last;
  /* Taken from its graph's prior at instantiation: what its first launch
   * waits for. */
  tp__tag after;
  /* Its graph's state (alive, in its generation) when it was made: the
   * slot is still its graph's while the state is that. */
  uint64_t graph_state;
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

/* `kind`: 0 for a graph, KIND_EXEC for an exec. */
static uintptr_t handle_of(uintptr_t kind, uint32_t index, uint64_t state) {
  return (uintptr_t)gen_of(state) << GEN_SHIFT | kind | ((uintptr_t)index + 1);
}

/* The slot a handle names, or NULL; *want: the state the slot has while
 * the handle's graph or exec is alive. Reads nothing through the handle. */
static void *slot_named(const tp__slots *t, uintptr_t kind, const void *handle,
                        uint64_t *want) {
  uintptr_t h = (uintptr_t)handle, i = h & INDEX_MASK;
  *want = (uint64_t)(h >> GEN_SHIFT) << 1 | 1;
  return i && (h & KIND_EXEC) == kind ? tp__slots_at(t, i - 1) : NULL;
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
    g = tp__slots_take(&graph_slots);
    if (g) {
      g->index = (uint32_t)(graph_slots.taken - 1);
      pthread_mutex_init(&g->use, NULL);
    }
  }
  pthread_mutex_unlock(&handles_lock);
  if (g) {
    g->pg = NULL;
    g->gm = NULL;
    g->prior = (tp__tag){0};
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
    x = tp__slots_take(&exec_slots);
    if (x)
      x->index = (uint32_t)(exec_slots.taken - 1);
  }
  pthread_mutex_unlock(&handles_lock);
  if (x) {
    atomic_store_explicit(&x->graph, NULL, memory_order_relaxed);
    x->pe = NULL;
    x->gm = NULL;
    atomic_store_explicit(&x->auto_free, false, memory_order_relaxed);
    x->adopted = x->track = false;
    x->last = x->after = (tp__tag){0};
    x->graph_state = 0;
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
  return (tp_graph_t)handle_of(0, g->index, st);
}

static tp_graph_exec_t exec_publish(exec_slot *x) {
  uint64_t st = next_alive(atomic_load(&x->state));
  atomic_store(&x->state, st);
  return (tp_graph_exec_t)handle_of(KIND_EXEC, x->index, st);
}

static tp_graph_exec_t exec_handle(const exec_slot *x) {
  return (tp_graph_exec_t)handle_of(KIND_EXEC, x->index,
                                    atomic_load(&x->state));
}

/* The live graph a handle names, in *out, and the state that says it is
 * still alive in *want. */
static tp_error_t graph_get(tp_graph_t handle, graph_slot **out,
                            uint64_t *want) {
  graph_slot *g = slot_named(&graph_slots, 0, handle, want);
  TP_RETURN_IF(!g || atomic_load(&g->state) != *want, TP_ERROR_INVALID_VALUE);
  *out = g;
  return TP_SUCCESS;
}

static tp_error_t exec_get(tp_graph_exec_t handle, exec_slot **out,
                           uint64_t *want) {
  exec_slot *x = slot_named(&exec_slots, KIND_EXEC, handle, want);
  TP_RETURN_IF(!x || atomic_load(&x->state) != *want, TP_ERROR_INVALID_VALUE);
  *out = x;
  return TP_SUCCESS;
}

/* Ends the life that `want` names; false when it already ended. */
static bool kill(_Atomic uint64_t *state, uint64_t want) {
  return atomic_compare_exchange_strong(state, &want, want & ~(uint64_t)1);
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

void tp__graph_settle_running(void) {
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
  tp__graph_settle_running();
}

/* ---- graphs and execs -------------------------------------------------------
 */

tp_error_t tp__graph_made(tp__pgraph *pg, uint64_t capture_id,
                          tp_graph_t *graph) {
  graph_slot *g = graph_new();
  if (!g) {
    if (capture_id)
      tp__gmem_capture_failed(capture_id);
    (void)tp__platform->graph_destroy(pg);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  g->pg = pg;
  g->gm = capture_id ? tp__gmem_of_capture(capture_id) : NULL;
  if (g->gm)
    tp__gmem_adopt(g->gm, pg);
  *graph = graph_publish(g);
  return TP_SUCCESS;
}

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
  atomic_store_explicit(&x->auto_free,
                        flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH,
                        memory_order_relaxed);
  x->track = tp__gmem_self_held(graph->gm);
  x->graph_state = atomic_load(&graph->state);
  if (graph->prior.stream) {
    x->after = graph->prior;
    graph->prior = (tp__tag){0};
  }
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
   * into another graph would escape. The driver refuses every graph launch
   * into a capture, valid or invalidated, and invalidates a valid one (an
   * H100, driver 580): so does tidepool, before the driver sees it. */
  if (tp__gmem_has_allocations(exec->gm)) {
    tp_capture_status_t status;
    TP_FORWARD(tp__capture_status_of(s, &status, NULL));
    /* The refusal stands only where the invalidation met a capture: one
     * that ended meanwhile answered its end as valid, and the launch then
     * follows it, where the platform's own launch refuses any capture
     * begun since, in one step (a helper's race of launches against a
     * capture's end on the fake driver). */
    if (status != TP_CAPTURE_STATUS_NONE &&
        tp__platform->capture_invalidate(s->ps) == TP_SUCCESS)
      return TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  /* Where the stream cannot be made to wait (the launch's stream is gone,
   * say), the host waits instead: never a launch over the other's. */
  if (exec->after.stream && !tp__stream_settles(&exec->after, true) &&
      tp__stream_make_wait(s, &exec->after) != TP_SUCCESS)
    TP_FORWARD(tp__stream_wait_host(&exec->after));
  tp__work_begin(s);
  tp_error_t err = tp__gmem_launch(
      exec->gm, exec->pe,
      atomic_load_explicit(&exec->auto_free, memory_order_relaxed), s->ps,
      s->device);
  tp__work_end(s, err);
  if (err == TP_SUCCESS && exec->gm) {
    /* Work queued on s from now on follows the launch: the epoch moves
     * under the stream's lock, so no marker recorded before the launch can
     * count as one after it. A marker goes behind the launch at once: the
     * next exec of the graph must follow it, and s may by then capture, when
     * nothing can be recorded on it (nor on the legacy stream while a
     * blocking stream captures). */
    if (exec->last.stream != s) {
      tp__stream_ref(s);
      tp__tag_clear(&exec->last);
      exec->last.stream = s;
    }
    exec->last.epoch = tp__stream_advance_marked(s);
  }
  if (err == TP_SUCCESS)
    tp__tag_clear(&exec->after);
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

/* Adopted execs of one driver graph each have a shell graph of their own:
 * the launch the next one must follow is kept by graph memory instead,
 * until an adoption takes it or it is found done. */
typedef struct adopted_prior {
  uint64_t capture; /* the graph memory's (tp__gmem_capture_id) */
  tp__tag tag;
} adopted_prior;
static pthread_mutex_t priors_lock = PTHREAD_MUTEX_INITIALIZER;
static adopted_prior *priors;
static uint32_t npriors, cappriors;

/* Takes out the entry of the graph memory of `capture` (into *out, or
 * nothing), dropping entries found done on the way; priors_lock held. */
static void priors_take(uint64_t capture, tp__tag *out) {
  for (uint32_t i = 0; i < npriors;) {
    bool match = priors[i].capture == capture;
    if (!match && !tp__stream_settles(&priors[i].tag, false)) {
      i++;
      continue;
    }
    if (match && out)
      *out = priors[i].tag;
    else
      tp__tag_clear(&priors[i].tag);
    priors[i] = priors[--npriors];
  }
}

/* Keeps `t` (and its stream reference) as gm's; should the list not grow,
 * the host waits for it instead, so that the next exec cannot overtake. */
static void priors_put(const tp__gmem *gm, tp__tag t) {
  uint64_t capture = tp__gmem_capture_id(gm);
  pthread_mutex_lock(&priors_lock);
  priors_take(capture, NULL);
  bool kept = TP_ARRAY_ROOM(priors, npriors, cappriors);
  if (kept)
    priors[npriors++] = (adopted_prior){capture, t};
  pthread_mutex_unlock(&priors_lock);
  if (!kept) {
    (void)tp__stream_wait_host(&t);
    tp__tag_clear(&t);
  }
}

/* An exec of g is being destroyed, under g's lock: the launch its graph's
 * next exec must follow is its last launch where it was launched (which
 * followed what it had to), else what it had to follow. It goes to g while
 * g is still the exec's graph and alive (a slot whose graph was destroyed
 * may serve another by now, which its state tells; its other fields are
 * the new graph's to write), or for an adopted exec to its graph memory's
 * entry. */
static void hand_on(exec_slot *x, graph_slot *g, bool may_run) {
  tp__tag t = {0};
  if (may_run) {
    tp__stream_ref(x->last.stream);
    t = x->last;
  } else {
    t = x->after;
    x->after = (tp__tag){0};
  }
  tp__tag_clear(&x->after);
  bool mine = !x->adopted && x->gm && atomic_load(&g->state) == x->graph_state;
  if (t.stream && mine) {
    tp__tag_clear(&g->prior);
    g->prior = t;
  } else if (t.stream && x->adopted && x->gm) {
    priors_put(x->gm, t);
  } else {
    tp__tag_clear(&t);
  }
}

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
  hand_on(x, g, x->last.stream != NULL);
  bool may_run = x->track && x->last.stream;
  if (!may_run)
    tp__tag_clear(&x->last);
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
    tp__graph_settle_running();
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
  tp__tag_clear(&g->prior);
  tp_error_t err = tp__platform->graph_destroy(g->pg);
  pthread_mutex_unlock(&g->use);
  graph_free(g);
  tp__graph_settle_running();
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
    atomic_store_explicit(&known->auto_free,
                          flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH,
                          memory_order_relaxed);
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
  atomic_store_explicit(&x->auto_free,
                        flags & TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH,
                        memory_order_relaxed);
  x->adopted = true;
  pthread_mutex_lock(&priors_lock);
  priors_take(tp__gmem_capture_id(gm), &x->after);
  pthread_mutex_unlock(&priors_lock);
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
  /* Other flags (upload, device launch, priorities) are the platform's.
   * One adoption at a time, find to publish: of two threads adopting one
   * exec at once, the second found nothing yet, and the graph memory's
   * one-exec rule then refused it instead of answering the same exec. */
  static pthread_mutex_t adopt_lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&adopt_lock);
  tp_error_t err = adopt(exec, platform_exec, platform_graph, flags);
  pthread_mutex_unlock(&adopt_lock);
  return err;
}

TP_API tp_error_t tp_graph_adoptable(const void *platform_graph,
                                     int *adoptable) {
  TP_RETURN_IF(!adoptable, TP_ERROR_INVALID_VALUE);
  *adoptable = 0;
  TP_RETURN_IF(!platform_graph, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_RETURN_IF(!tp__platform->graph_maps_at_capture(), TP_ERROR_NOT_SUPPORTED);
  *adoptable = tp__gmem_of_graph(platform_graph) != NULL;
  return TP_SUCCESS;
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
  tp__graph_settle_running();
  return tp__gmem_trim(device);
}

TP_API tp_error_t tp_device_get_graph_mem_attribute(int device,
                                                    tp_graph_mem_attr_t attr,
                                                    void *value) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  tp__graph_settle_running();
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
