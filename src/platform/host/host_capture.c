/* Stream capture on the emulated device, above streams: captures and the
 * streams that take part in them, the graphs of nodes they record, execs,
 * and launches, which replay a graph's nodes in order as a job on the
 * launching stream's worker. One mutex guards every capture, member and
 * captured event; a graph is immutable once its capture has ended, and an
 * exec changes only its last launch, under its own mutex. */
#include <pthread.h>
#include <string.h>

#include "platform/host/host_internal.h"

/* A set of node ids (index + 1): a stream's position in its capture, or
 * where an event was recorded. */
typedef struct nodeset {
  uint32_t *v;
  uint32_t n, cap;
} nodeset;

typedef struct node {
  tp__host_node work;
  nodeset deps;
} node;

typedef struct release_fn {
  void (*fn)(void *);
  void *arg;
} release_fn;

struct tp__pgraph {
  _Atomic uint32_t refs; /* the capture or the user's handle, and each exec */
  node *nodes;
  uint32_t n, cap;
  release_fn *releases;
  uint32_t nreleases, capreleases;
};

struct tp__pexec {
  _Atomic uint32_t refs; /* the handle and each launch queued */
  tp__pgraph *graph;
  release_fn release;
  pthread_mutex_t mu; /* guards the last launch */
  tp__pstream *last;
  uint64_t last_pos;
};

typedef struct capture capture;

/* A stream's part in a capture; the stream keeps a pointer to it. */
typedef struct tp__host_member tp__host_member;
struct tp__host_member {
  capture *c;
  tp__pstream *ps;
  nodeset deps;
  int device;
  bool blocking;
  tp__host_member *next;
};

/* Where an event was recorded in a capture; the event keeps a pointer to
 * it. */
typedef struct tp__host_capevent tp__host_capevent;
struct tp__host_capevent {
  capture *c;
  nodeset deps;
};

struct capture {
  uint64_t id;
  tp_capture_mode_t mode;
  pthread_t thread;
  tp__pstream *origin;
  bool invalidated, ended;
  tp__pgraph *graph; /* NULL once ended */
  tp__host_member *members;
  uint32_t refs;        /* one while active, one per event recorded in it */
  capture *prev, *next; /* the active captures */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static capture *active;
_Atomic uint32_t tp__host_captures_active;
static _Atomic uint64_t next_id = 1;

/* ---- node sets ------------------------------------------------------------
 */

static bool set_put(nodeset *s, uint32_t id) {
  for (uint32_t i = 0; i < s->n; i++)
    if (s->v[i] == id)
      return true;
  if (!TP_ARRAY_ROOM(s->v, s->n, s->cap))
    return false;
  s->v[s->n++] = id;
  return true;
}

static bool set_merge(nodeset *dst, const nodeset *src) {
  for (uint32_t i = 0; i < src->n; i++)
    if (!set_put(dst, src->v[i]))
      return false;
  return true;
}

static void set_free(nodeset *s) {
  free(s->v);
  *s = (nodeset){0};
}

/* ---- graphs ---------------------------------------------------------------
 */

static tp__pgraph *graph_new(void) {
  tp__pgraph *g = calloc(1, sizeof *g);
  if (g)
    atomic_init(&g->refs, 1);
  return g;
}

static void graph_unref(tp__pgraph *g) {
  if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
    return;
  for (uint32_t i = 0; i < g->nreleases; i++)
    g->releases[i].fn(g->releases[i].arg);
  for (uint32_t i = 0; i < g->n; i++)
    set_free(&g->nodes[i].deps);
  free(g->releases);
  free(g->nodes);
  free(g);
}

/* Adds a node after the nodes of `after`; returns its id, 0 when memory is
 * short. Under mu. */
static uint32_t graph_add(tp__pgraph *g, const tp__host_node *work,
                          const nodeset *after) {
  if (g->n == UINT32_MAX - 1 || !TP_ARRAY_ROOM(g->nodes, g->n, g->cap))
    return 0;
  node *n = &g->nodes[g->n];
  *n = (node){.work = *work};
  if (!set_merge(&n->deps, after)) {
    set_free(&n->deps);
    return 0;
  }
  return ++g->n;
}

/* Marks in seen[] (n + 1 entries) every node that `from` depends on,
 * itself included. */
static void mark_before(const tp__pgraph *g, const nodeset *from,
                        unsigned char *seen, uint32_t *stack) {
  uint32_t top = 0;
  for (uint32_t i = 0; i < from->n; i++)
    if (!seen[from->v[i]]) {
      seen[from->v[i]] = 1;
      stack[top++] = from->v[i];
    }
  while (top) {
    const nodeset *d = &g->nodes[stack[--top] - 1].deps;
    for (uint32_t i = 0; i < d->n; i++)
      if (!seen[d->v[i]]) {
        seen[d->v[i]] = 1;
        stack[top++] = d->v[i];
      }
  }
}

/* ---- captures and their members ---------------------------------------------
 * Everything here runs under mu. */

static tp__host_member *member_of(tp__pstream *ps) {
  return tp__host_stream_member(ps);
}

static tp_error_t member_join(capture *c, tp__pstream *ps,
                              const nodeset *deps) {
  tp__host_member *m = calloc(1, sizeof *m);
  TP_RETURN_IF(!m, TP_ERROR_OUT_OF_MEMORY);
  if (deps && !set_merge(&m->deps, deps)) {
    set_free(&m->deps);
    free(m);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  bool legacy;
  tp__host_stream_describe(ps, &m->device, &legacy, &m->blocking);
  m->c = c;
  m->ps = ps;
  m->next = c->members;
  c->members = m;
  tp__host_stream_join(ps, m);
  return TP_SUCCESS;
}

static void member_leave(tp__host_member *m) {
  tp__host_stream_leave(m->ps);
  set_free(&m->deps);
  free(m);
}

static void capture_unref(capture *c) {
  if (--c->refs == 0)
    free(c);
}

/* Ends capture c: every member stops capturing. Returns the graph, which
 * the caller keeps or drops once mu is released (dropping may run release
 * functions). */
static tp__pgraph *capture_finish(capture *c) {
  while (c->members) {
    tp__host_member *m = c->members;
    c->members = m->next;
    member_leave(m);
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    active = c->next;
  if (c->next)
    c->next->prev = c->prev;
  atomic_fetch_sub(&tp__host_captures_active, 1);
  c->ended = true;
  tp__pgraph *g = c->graph;
  c->graph = NULL;
  capture_unref(c);
  return g;
}

/* Legacy-stream work of `device` was refused: every capture with a
 * blocking stream of that device is invalidated, as in CUDA. */
static void invalidate_blocking(int device) {
  for (capture *c = active; c; c = c->next)
    for (tp__host_member *m = c->members; m; m = m->next)
      if (m->blocking && m->device == device)
        c->invalidated = true;
}

/* The answer to legacy-stream work on `ps` when it does not capture. */
static tp_error_t legacy_refusal(tp__pstream *ps) {
  int device;
  bool legacy, blocking;
  tp__host_stream_describe(ps, &device, &legacy, &blocking);
  if (!legacy || !tp__host_stream_blocking_captures(device))
    return TP_SUCCESS;
  invalidate_blocking(device);
  return TP_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* Whether every node of c's graph comes before the origin's position: a
 * fork that did not join back leaves a node that does not. */
static tp_error_t check_joined(const capture *c, const nodeset *origin) {
  const tp__pgraph *g = c->graph;
  unsigned char *seen = calloc((size_t)g->n + 1, 1);
  uint32_t *stack = calloc((size_t)g->n + 1, sizeof *stack);
  tp_error_t err = seen && stack ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    mark_before(g, origin, seen, stack);
    for (uint32_t i = 1; i <= g->n && err == TP_SUCCESS; i++)
      if (!seen[i])
        err = TP_ERROR_STREAM_CAPTURE_UNJOINED;
  }
  free(seen);
  free(stack);
  return err;
}

/* ---- the ops --------------------------------------------------------------
 */

tp_error_t tp__host_capture_begin(tp__pstream *ps, tp_capture_mode_t mode) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(mode != TP_CAPTURE_MODE_GLOBAL &&
                   mode != TP_CAPTURE_MODE_THREAD_LOCAL &&
                   mode != TP_CAPTURE_MODE_RELAXED,
               TP_ERROR_INVALID_VALUE);
  int device;
  bool legacy, blocking;
  tp__host_stream_describe(ps, &device, &legacy, &blocking);
  TP_RETURN_IF(legacy, TP_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  capture *c = calloc(1, sizeof *c);
  tp__pgraph *g = graph_new();
  if (!c || !g) {
    free(c);
    free(g);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *c = (capture){.id = atomic_fetch_add(&next_id, 1),
                 .mode = mode,
                 .thread = pthread_self(),
                 .origin = ps,
                 .graph = g,
                 .refs = 1};
  pthread_mutex_lock(&mu);
  tp_error_t err = member_of(ps) ? TP_ERROR_ILLEGAL_STATE : TP_SUCCESS;
  if (err == TP_SUCCESS)
    err = member_join(c, ps, NULL);
  if (err == TP_SUCCESS) {
    c->next = active;
    if (active)
      active->prev = c;
    active = c;
    atomic_fetch_add(&tp__host_captures_active, 1);
  }
  pthread_mutex_unlock(&mu);
  if (err != TP_SUCCESS) {
    free(c);
    graph_unref(g);
  }
  return err;
}

tp_error_t tp__host_capture_end(tp__pstream *ps, tp__pgraph **graph,
                                uint64_t *id) {
  TP_RETURN_IF(!ps || !graph || !id, TP_ERROR_INVALID_VALUE);
  *graph = NULL;
  *id = 0;
  tp__pgraph *g = NULL;
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  capture *c = m ? m->c : NULL;
  if (c)
    *id = c->id;
  /* As the driver does: ending on a stream that joined the capture costs
   * the capture its validity, and ending from the wrong thread ends it
   * without a graph; a fork left unjoined is the answer then, since the
   * driver looks for one first (H200, test_capture_chaos). */
  if (!c) {
    err = TP_ERROR_ILLEGAL_STATE;
  } else if (c->origin != ps) {
    c->invalidated = true;
    err = TP_ERROR_STREAM_CAPTURE_UNMATCHED;
  } else if (c->mode != TP_CAPTURE_MODE_RELAXED &&
             !pthread_equal(c->thread, pthread_self())) {
    err = !c->invalidated &&
                  check_joined(c, &m->deps) == TP_ERROR_STREAM_CAPTURE_UNJOINED
              ? TP_ERROR_STREAM_CAPTURE_UNJOINED
              : TP_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    g = capture_finish(c);
  } else {
    err = c->invalidated ? TP_ERROR_STREAM_CAPTURE_INVALIDATED
                         : check_joined(c, &m->deps);
    g = capture_finish(c);
  }
  pthread_mutex_unlock(&mu);
  if (g && err != TP_SUCCESS)
    graph_unref(g);
  else
    *graph = g;
  return err;
}

tp_error_t tp__host_capture_status(tp__pstream *ps, tp_capture_status_t *status,
                                   uint64_t *id) {
  TP_RETURN_IF(!ps || !status, TP_ERROR_INVALID_VALUE);
  *status = TP_CAPTURE_STATUS_NONE;
  if (id)
    *id = 0;
  /* Asked on every allocation and free: with no capture anywhere, nothing
   * else needs looking at. */
  if (TP_LIKELY(!atomic_load_explicit(&tp__host_captures_active,
                                      memory_order_acquire)))
    return TP_SUCCESS;
  if (TP_LIKELY(!member_of(ps))) {
    int device;
    bool legacy, blocking;
    tp__host_stream_describe(ps, &device, &legacy, &blocking);
    return legacy && tp__host_stream_blocking_captures(device)
               ? TP_ERROR_STREAM_CAPTURE_IMPLICIT
               : TP_SUCCESS;
  }
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  if (m) {
    *status = m->c->invalidated ? TP_CAPTURE_STATUS_INVALIDATED
                                : TP_CAPTURE_STATUS_ACTIVE;
    if (id)
      *id = m->c->id;
  }
  pthread_mutex_unlock(&mu);
  return TP_SUCCESS;
}

tp_error_t tp__host_capture_invalidate(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  tp_error_t err = TP_SUCCESS;
  if (m)
    m->c->invalidated = true;
  else if (legacy_refusal(ps) == TP_SUCCESS)
    err = TP_ERROR_ILLEGAL_STATE;
  pthread_mutex_unlock(&mu);
  return err;
}

tp_error_t tp__host_capture_node(tp__pstream *ps, const tp__host_node *work,
                                 bool *captured) {
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  if (!m) {
    err = legacy_refusal(ps);
    *captured = err != TP_SUCCESS;
  } else {
    *captured = true;
    uint32_t id = 0;
    if (m->c->invalidated)
      err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
    tp__host_node w = *work;
    w.device = m->device;
    if (err == TP_SUCCESS && (id = graph_add(m->c->graph, &w, &m->deps)) == 0)
      err = TP_ERROR_OUT_OF_MEMORY;
    if (id) {
      m->deps.n = 0;
      (void)set_put(&m->deps, id); /* never grows: the set had room */
    }
  }
  pthread_mutex_unlock(&mu);
  return err;
}

tp_error_t tp__host_capture_refuse(tp__pstream *ps) {
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  tp_error_t err;
  if (m) {
    m->c->invalidated = true;
    err = TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  } else {
    err = legacy_refusal(ps);
  }
  pthread_mutex_unlock(&mu);
  return err;
}

/* CUDA's modes: a capture in global mode forbids unsafe calls on every
 * thread, one in thread-local mode on its own thread, a relaxed one none. */
tp_error_t tp__host_capture_check_sync(void) {
  if (TP_LIKELY(!atomic_load_explicit(&tp__host_captures_active,
                                      memory_order_acquire)))
    return TP_SUCCESS;
  bool refused = false;
  pthread_t self = pthread_self();
  pthread_mutex_lock(&mu);
  for (capture *c = active; c; c = c->next) {
    if (c->mode == TP_CAPTURE_MODE_GLOBAL ||
        (c->mode == TP_CAPTURE_MODE_THREAD_LOCAL &&
         pthread_equal(c->thread, self))) {
      c->invalidated = true;
      refused = true;
    }
  }
  pthread_mutex_unlock(&mu);
  return refused ? TP_ERROR_STREAM_CAPTURE_UNSUPPORTED : TP_SUCCESS;
}

/* A device synchronize is refused, and every capture with a stream on the
 * device invalidated, whatever the captures' modes and the calling
 * thread's: what the driver answered on an H100 (driver 580, 2026-12-06),
 * where a thread's relaxed mode changed nothing either. */
tp_error_t tp__host_capture_check_device_sync(int device) {
  if (TP_LIKELY(!atomic_load_explicit(&tp__host_captures_active,
                                      memory_order_acquire)))
    return TP_SUCCESS;
  bool refused = false;
  pthread_mutex_lock(&mu);
  for (capture *c = active; c; c = c->next) {
    for (tp__host_member *m = c->members; m; m = m->next) {
      if (m->device == device) {
        c->invalidated = true;
        refused = true;
        break;
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return refused ? TP_ERROR_STREAM_CAPTURE_UNSUPPORTED : TP_SUCCESS;
}

/* The origin leaving in the middle of a capture invalidates it, and since
 * such a capture can never be ended, it ends here; a stream that joined it
 * leaves quietly, its nodes staying in the graph (one it did not join back
 * is found at the end). */
void tp__host_capture_stream_gone(tp__pstream *ps) {
  tp__pgraph *g = NULL;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  if (m) {
    capture *c = m->c;
    if (c->origin == ps) {
      c->invalidated = true;
      g = capture_finish(c);
    } else {
      tp__host_member **at = &c->members;
      while (*at != m)
        at = &(*at)->next;
      *at = m->next;
      member_leave(m);
    }
  }
  pthread_mutex_unlock(&mu);
  if (g)
    graph_unref(g);
}

static void capevent_free(tp__host_capevent *ce) {
  capture_unref(ce->c);
  set_free(&ce->deps);
  free(ce);
}

void tp__host_capture_event_forget(tp__pevent *ev) {
  pthread_mutex_lock(&mu);
  tp__host_capevent *ce = tp__host_event_capture(ev);
  tp__host_event_set_capture(ev, NULL);
  if (ce)
    capevent_free(ce);
  pthread_mutex_unlock(&mu);
}

tp_error_t tp__host_capture_point(tp__pstream *ps, uint64_t cid,
                                  tp__pnode *out) {
  TP_RETURN_IF(!ps || !out, TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  if (!m || m->c->id != cid)
    err = TP_ERROR_ILLEGAL_STATE;
  else if (m->c->invalidated)
    err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  else {
    static const tp__host_node empty = {.kind = TP__HOST_NODE_EMPTY};
    uint32_t id = graph_add(m->c->graph, &empty, &m->deps);
    if (id) {
      m->deps.n = 0;
      (void)set_put(&m->deps, id);
      *out = id;
    } else {
      err = TP_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_unlock(&mu);
  return err;
}

tp_error_t tp__host_capture_follows(tp__pstream *ps, const tp__pnode *nodes,
                                    size_t n, unsigned char *out) {
  TP_RETURN_IF(!ps || (n && (!nodes || !out)), TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  const tp__pgraph *g = m ? m->c->graph : NULL;
  unsigned char *seen = g ? calloc((size_t)g->n + 1, 1) : NULL;
  uint32_t *stack = g ? calloc((size_t)g->n + 1, sizeof *stack) : NULL;
  if (!m)
    err = TP_ERROR_ILLEGAL_STATE;
  else if (!seen || !stack)
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    mark_before(g, &m->deps, seen, stack);
    for (size_t i = 0; i < n; i++)
      out[i] = nodes[i] == 0 || (nodes[i] <= g->n && seen[nodes[i]]);
  }
  pthread_mutex_unlock(&mu);
  free(seen);
  free(stack);
  return err;
}

tp_error_t tp__host_capture_attach(tp__pstream *ps, uint64_t id,
                                   void (*release)(void *), void *arg,
                                   void **tie, tp__pgraph **graph) {
  TP_RETURN_IF(!ps || !release || !tie || !graph, TP_ERROR_INVALID_VALUE);
  *tie = arg;
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  tp__pgraph *g = m && m->c->id == id ? m->c->graph : NULL;
  if (!g)
    err = TP_ERROR_ILLEGAL_STATE;
  else if (!TP_ARRAY_ROOM(g->releases, g->nreleases, g->capreleases))
    err = TP_ERROR_OUT_OF_MEMORY;
  else
    g->releases[g->nreleases++] = (release_fn){release, arg};
  *graph = g;
  pthread_mutex_unlock(&mu);
  return err;
}

/* The tie is the release's argument; the graph is immutable once its
 * capture ended but for this list, which only its owner touches. */
tp_error_t tp__host_capture_detach(tp__pgraph *g, void *tie) {
  TP_RETURN_IF(!g, TP_ERROR_INVALID_VALUE);
  for (uint32_t i = 0; i < g->nreleases; i++)
    if (g->releases[i].arg == tie) {
      g->releases[i] = g->releases[--g->nreleases];
      return TP_SUCCESS;
    }
  return TP_ERROR_INVALID_VALUE;
}

tp_error_t tp__host_capture_event_record(tp__pevent *ev, tp__pstream *ps) {
  TP_RETURN_IF(!ev || !ps, TP_ERROR_INVALID_VALUE);
  tp__host_capevent *ce = calloc(1, sizeof *ce);
  TP_RETURN_IF(!ce, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_member *m = member_of(ps);
  if (!m)
    err = TP_ERROR_ILLEGAL_STATE;
  else if (m->c->invalidated)
    err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  else if (!set_merge(&ce->deps, &m->deps))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    ce->c = m->c;
    m->c->refs++;
    tp__host_capevent *old = tp__host_event_capture(ev);
    if (old)
      capevent_free(old);
    tp__host_event_set_capture(ev, ce);
  } else {
    set_free(&ce->deps);
    free(ce);
  }
  pthread_mutex_unlock(&mu);
  return err;
}

tp_error_t tp__host_capture_event_wait(tp__pstream *ps, tp__pevent *ev) {
  TP_RETURN_IF(!ps || !ev, TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&mu);
  tp__host_capevent *ce = tp__host_event_capture(ev);
  tp__host_member *m = member_of(ps);
  if (!ce) {
    err = TP_ERROR_INVALID_VALUE;
  } else if (ce->c->ended) {
    /* The driver answers a wait on an event of a finished capture as a bad
     * argument. */
    err = TP_ERROR_INVALID_VALUE;
  } else if (m && m->c != ce->c) {
    m->c->invalidated = ce->c->invalidated = true;
    err = TP_ERROR_STREAM_CAPTURE_MERGE;
  } else if (ce->c->invalidated) {
    /* A stream outside any capture cannot join an invalidated one: the
     * driver answers that as a bad argument. */
    err = m ? TP_ERROR_STREAM_CAPTURE_INVALIDATED : TP_ERROR_INVALID_VALUE;
  } else if (m) {
    if (!set_merge(&m->deps, &ce->deps))
      err = TP_ERROR_OUT_OF_MEMORY;
  } else {
    int device;
    bool legacy, blocking;
    tp__host_stream_describe(ps, &device, &legacy, &blocking);
    /* The legacy stream cannot be captured. */
    if (legacy) {
      ce->c->invalidated = true;
      err = TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else {
      err = member_join(ce->c, ps, &ce->deps);
    }
  }
  pthread_mutex_unlock(&mu);
  return err;
}

/* ---- graphs and execs -----------------------------------------------------
 */

tp_error_t tp__host_graph_instantiate(tp__pgraph *graph,
                                      unsigned long long flags,
                                      void (*release)(void *), void *arg,
                                      tp__pexec **exec) {
  TP_RETURN_IF(!graph || !exec, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(flags & ~TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH,
               TP_ERROR_INVALID_VALUE);
  tp__pexec *e = calloc(1, sizeof *e);
  TP_RETURN_IF(!e, TP_ERROR_OUT_OF_MEMORY);
  int rc = pthread_mutex_init(&e->mu, NULL);
  if (rc) {
    free(e);
    return tp__platform_fail(rc, "pthread_mutex_init");
  }
  atomic_init(&e->refs, 1);
  atomic_fetch_add(&graph->refs, 1);
  e->graph = graph;
  e->release = (release_fn){release, arg};
  *exec = e;
  return TP_SUCCESS;
}

static void exec_unref(tp__pexec *e) {
  if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (e->release.fn)
    e->release.fn(e->release.arg);
  graph_unref(e->graph);
  if (e->last)
    tp__host_stream_unref(e->last);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

/* A launch, as the stream's worker runs it: each node with the access of the
 * device it was captured on, whichever stream launched it. False when
 * memory work faulted. */
static bool launch_run(void *arg) {
  const tp__pgraph *g = ((tp__pexec *)arg)->graph;
  bool ok = true;
  for (uint32_t i = 0; i < g->n; i++) {
    const tp__host_node *w = &g->nodes[i].work;
    switch (w->kind) {
    case TP__HOST_NODE_EMPTY: break;
    case TP__HOST_NODE_HOST_FUNC: w->u.host.fn(w->u.host.arg); break;
    case TP__HOST_NODE_MEMSET:
    case TP__HOST_NODE_MEMCPY:
      ok &= tp__host_mem_run(w->device, w->u.mem.dst, w->u.mem.src,
                             w->u.mem.value, w->u.mem.size);
      break;
    }
  }
  return ok;
}

/* A launch holds a reference on its exec until the worker is done with it. */
static void launch_drop(void *arg) {
  exec_unref(arg);
}

/* A launch into a capture, valid or invalidated, is refused with
 * STREAM_CAPTURE_UNSUPPORTED and invalidates a valid one, as the driver's
 * is (an H100, driver 580). */
tp_error_t tp__host_graph_launch(tp__pexec *e, tp__pstream *ps) {
  TP_RETURN_IF(!e || !ps, TP_ERROR_INVALID_VALUE);
  if (TP_UNLIKELY(tp__host_stream_capture_involved(ps))) {
    pthread_mutex_lock(&mu);
    tp__host_member *m = member_of(ps);
    tp_error_t err = TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (m)
      m->c->invalidated = true;
    else
      err = legacy_refusal(ps);
    pthread_mutex_unlock(&mu);
    TP_FORWARD(err);
  }
  pthread_mutex_lock(&e->mu);
  atomic_fetch_add(&e->refs, 1);
  uint64_t pos = 0;
  tp__host_job job = {launch_run, launch_drop, e};
  tp_error_t err = tp__host_stream_job(ps, &job, e->last, e->last_pos, &pos);
  if (err == TP_SUCCESS) {
    if (e->last != ps) {
      tp__host_stream_ref(ps);
      if (e->last)
        tp__host_stream_unref(e->last);
      e->last = ps;
    }
    e->last_pos = pos;
  }
  pthread_mutex_unlock(&e->mu);
  return err;
}

tp_error_t tp__host_graph_exec_destroy(tp__pexec *e) {
  TP_RETURN_IF(!e, TP_ERROR_INVALID_VALUE);
  exec_unref(e);
  return TP_SUCCESS;
}

tp_error_t tp__host_graph_destroy(tp__pgraph *g) {
  TP_RETURN_IF(!g, TP_ERROR_INVALID_VALUE);
  graph_unref(g);
  return TP_SUCCESS;
}
