/* Stream capture on the cuda platform: the driver's own capture, graphs and
 * execs behind the capture ops of platform.h; empty nodes that mark the
 * positions of frees; walks of the driver's
 * graph to tell whether the capture's work follows a position; and user
 * objects that tie tidepool's graph memory to the driver's graph and
 * every exec made from it. Captures the application begins with
 * cuStreamBeginCapture are the same captures to the driver, so all of this
 * works on them too. */
#include <string.h>

#include "common/seen.h"
#include "platform/cuda/cuda_internal.h"

_Static_assert((int)TP_CAPTURE_MODE_GLOBAL ==
                       (int)CU_STREAM_CAPTURE_MODE_GLOBAL &&
                   (int)TP_CAPTURE_MODE_THREAD_LOCAL ==
                       (int)CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                   (int)TP_CAPTURE_MODE_RELAXED ==
                       (int)CU_STREAM_CAPTURE_MODE_RELAXED,
               "capture modes differ from the driver's");
_Static_assert((int)TP_CAPTURE_STATUS_NONE ==
                       (int)CU_STREAM_CAPTURE_STATUS_NONE &&
                   (int)TP_CAPTURE_STATUS_ACTIVE ==
                       (int)CU_STREAM_CAPTURE_STATUS_ACTIVE &&
                   (int)TP_CAPTURE_STATUS_INVALIDATED ==
                       (int)CU_STREAM_CAPTURE_STATUS_INVALIDATED,
               "capture statuses differ from the driver's");
_Static_assert(TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH ==
                   CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
               "instantiate flags differ from the driver's");

#define TP_CU_NEED(fn) TP_RETURN_IF(!tp__cu.fn, TP_ERROR_NOT_SUPPORTED)

/* The driver's graphs are not thread-safe, and in a relaxed capture one
 * thread may end the capture while another allocates or frees in it:
 * tidepool's own reads and changes of a capture's graph (marks, walks,
 * user objects, the end and its stripping of marks), and its begins and
 * questions of a capture's id, hold the capture lock (common/seen.h),
 * which the interposer's begins and ends of the application's captures
 * hold too: none walks a node another is destroying or uses a graph an
 * end frees, and an end never sees a mark added but not yet made the
 * stream's position (which read as a fork left unjoined). Each op asks
 * the capture's state under it, so one that comes after an end finds the
 * stream out of the capture. The driver itself dies of some calls on a
 * stream racing its capture's begin or end (docs/capture.md);
 * cuStreamIsCapturing, asked on every allocation, is not one of them and
 * stays outside. */

/* cuStreamIsCapturing is the cheapest question the driver answers about
 * capture (15 to 20 ns on an H200, against about 80 for the full
 * cuStreamGetCaptureInfo); the legacy stream's answer while a blocking
 * stream captures is an error, which leaves that capture as it was. */
CUresult tp__cu_record_uncaptured(CUevent ev, CUstream s) {
  if (tp__cu.cuStreamIsCapturing) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = tp__cu.cuStreamIsCapturing(s, &status);
    if (r != CUDA_SUCCESS)
      return r;
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return tp__cu.cuEventRecord(ev, s);
}

tp_error_t tp__cu_capture_begin(tp__pstream *ps, tp_capture_mode_t mode) {
  TP_CU_NEED(cuStreamBeginCapture);
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__seen_capture_lock();
  CUresult r = tp__cu.cuStreamBeginCapture(s, (CUstreamCaptureMode)mode);
  tp__seen_capture_unlock();
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

/* The nodes before (deps) or after a node, in a fresh array; false when
 * they cannot be had. */
static bool neighbours(CUgraphNode v, bool before, CUgraphNode **out,
                       size_t *n) {
  *out = NULL;
  *n = 0;
  CUresult r = before ? tp__cu.cuGraphNodeGetDependencies(v, NULL, NULL, n)
                      : tp__cu.cuGraphNodeGetDependentNodes(v, NULL, NULL, n);
  if (r != CUDA_SUCCESS)
    return false;
  if (*n == 0)
    return true;
  *out = calloc(*n, sizeof **out);
  if (!*out)
    return false;
  r = before ? tp__cu.cuGraphNodeGetDependencies(v, *out, NULL, n)
             : tp__cu.cuGraphNodeGetDependentNodes(v, *out, NULL, n);
  return r == CUDA_SUCCESS;
}

/* Orders `to` after `from`: a new edge, or one that is there already. */
static bool join(CUgraph g, CUgraphNode from, CUgraphNode to) {
  if (tp__cu.cuGraphAddDependencies(g, &from, &to, NULL, 1) == CUDA_SUCCESS)
    return true;
  CUgraphNode *deps = NULL;
  size_t n = 0;
  bool found = false;
  if (neighbours(to, true, &deps, &n))
    for (size_t i = 0; i < n && !found; i++)
      found = deps[i] == from;
  free(deps);
  return found;
}

/* The empty nodes of g, in a fresh array (*n of them); NULL when there
 * are none or they cannot be had. */
static CUgraphNode *empty_nodes(CUgraph g, size_t *n) {
  *n = 0;
  size_t all = 0;
  if (!tp__cu.cuGraphGetNodes || !tp__cu.cuGraphNodeGetType ||
      tp__cu.cuGraphGetNodes(g, NULL, &all) != CUDA_SUCCESS || all == 0)
    return NULL;
  CUgraphNode *nodes = calloc(all, sizeof *nodes);
  if (!nodes || tp__cu.cuGraphGetNodes(g, nodes, &all) != CUDA_SUCCESS) {
    free(nodes);
    return NULL;
  }
  for (size_t i = 0; i < all; i++) {
    CUgraphNodeType type;
    if (tp__cu.cuGraphNodeGetType(nodes[i], &type) == CUDA_SUCCESS &&
        type == CU_GRAPH_NODE_TYPE_EMPTY)
      nodes[(*n)++] = nodes[i];
  }
  if (*n == 0) {
    free(nodes);
    return NULL;
  }
  return nodes;
}

/* Removes each empty node of g, joining every node before it to every node
 * after it: the empty nodes mark the positions of frees while the capture
 * runs, and once it is over they only cost the launches. A node whose
 * neighbours cannot all be joined stays (the joins made meanwhile only
 * repeat what it orders), which changes nothing but that cost. */
static void strip_empty_nodes(CUgraph g) {
  if (!tp__cu.cuGraphNodeGetDependencies ||
      !tp__cu.cuGraphNodeGetDependentNodes || !tp__cu.cuGraphAddDependencies ||
      !tp__cu.cuGraphDestroyNode)
    return;
  size_t n = 0;
  CUgraphNode *empty = empty_nodes(g, &n);
  for (size_t i = 0; i < n; i++) {
    CUgraphNode *from = NULL, *to = NULL;
    size_t nf = 0, nt = 0;
    bool ok = neighbours(empty[i], true, &from, &nf) &&
              neighbours(empty[i], false, &to, &nt);
    for (size_t a = 0; ok && a < nf; a++)
      for (size_t b = 0; ok && b < nt; b++)
        ok = join(g, from[a], to[b]);
    if (ok)
      (void)tp__cu.cuGraphDestroyNode(empty[i]);
    free(from);
    free(to);
  }
  free(empty);
}

static bool unjoined_marks(CUstream s);

/* The driver ends a capture whose forked stream ends in tidepool's empty
 * nodes (it counts only the work it captured itself); those nodes mark
 * allocations and frees, which are work to the application as the driver's
 * own allocation and free nodes are, so such an end is refused as the
 * driver refuses its own nodes left unjoined: the capture ends, with no
 * graph. */
tp_error_t tp__cu_capture_end(tp__pstream *ps, tp__pgraph **graph,
                              uint64_t *id) {
  TP_CU_NEED(cuStreamEndCapture);
  *graph = NULL;
  *id = 0;
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__seen_capture_lock();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  if (tp__cu.cuStreamGetCaptureInfo &&
      tp__cu.cuStreamGetCaptureInfo(s, &st, &cid, NULL, NULL, NULL, NULL) ==
          CUDA_SUCCESS &&
      st != CU_STREAM_CAPTURE_STATUS_NONE)
    *id = cid;
  bool unjoined = unjoined_marks(s);
  CUgraph g = NULL;
  CUresult r = tp__cu.cuStreamEndCapture(s, &g);
  /* The driver answers a fork left unjoined before the wrong thread; both
   * end the capture. */
  if ((r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) &&
      unjoined)
    r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  /* A failed capture's graph, should the driver return one, is of no use
   * to anyone. */
  if (r != CUDA_SUCCESS && g && tp__cu.cuGraphDestroy)
    (void)tp__cu.cuGraphDestroy(g);
  if (r == CUDA_SUCCESS)
    strip_empty_nodes(g);
  tp__seen_capture_unlock();
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *graph = (tp__pgraph *)g;
  return TP_SUCCESS;
}

/* Asked on every allocation and free, since an application may begin a
 * capture on any stream behind tidepool's back: one cuStreamIsCapturing,
 * and the full cuStreamGetCaptureInfo only for the capture's id, which is
 * wanted only while the stream captures. */
tp_error_t tp__cu_capture_status(tp__pstream *ps, tp_capture_status_t *status,
                                 uint64_t *id) {
  *status = TP_CAPTURE_STATUS_NONE;
  if (id)
    *id = 0;
  if (!tp__cu.cuStreamIsCapturing)
    return TP_SUCCESS;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  CUresult r = tp__cu.cuStreamIsCapturing(s, &st);
  if (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE && id &&
      tp__cu.cuStreamGetCaptureInfo) {
    tp__seen_capture_lock();
    r = tp__cu.cuStreamGetCaptureInfo(s, &st, &cid, NULL, NULL, NULL, NULL);
    tp__seen_capture_unlock();
  }
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *status = (tp_capture_status_t)st;
  if (id)
    *id = cid;
  return TP_SUCCESS;
}

/* The driver has no call that invalidates a capture, but it invalidates
 * one whose stream is queried, as CUDA's rules say: tidepool asks that
 * illegal question on purpose, and expects the refusal. For the legacy
 * stream while blocking streams capture (the status answers IMPLICIT),
 * querying it invalidates those captures, as the driver's own allocation
 * there would. */
tp_error_t tp__cu_capture_invalidate(tp__pstream *ps) {
  tp_capture_status_t status;
  tp_error_t err = tp__cu_capture_status(ps, &status, NULL);
  if (err == TP_ERROR_STREAM_CAPTURE_IMPLICIT)
    status = TP_CAPTURE_STATUS_ACTIVE;
  else
    TP_FORWARD(err);
  TP_RETURN_IF(status == TP_CAPTURE_STATUS_NONE, TP_ERROR_ILLEGAL_STATE);
  if (status == TP_CAPTURE_STATUS_INVALIDATED)
    return TP_SUCCESS;
  /* The query's own answer says whether a capture was under way when it
   * was asked: the capture seen above may have ended since. */
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  CUresult r = tp__cu.cuStreamQuery(s);
  tp__cu_scope_leave(&scope);
  return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
                 r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
                 r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
             ? TP_SUCCESS
             : TP_ERROR_ILLEGAL_STATE;
}

/* The graph of the capture `id` (0: whichever) the stream is in, and the
 * stream's dependency set; *deps is the driver's array, good until the
 * next call on the stream. ILLEGAL_STATE where the stream captures no
 * more, or has moved on to another capture. */
static tp_error_t capture_info_of(CUstream s, uint64_t id, CUgraph *graph,
                                  const CUgraphNode **deps, size_t *n) {
  TP_CU_NEED(cuStreamGetCaptureInfo);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUresult r =
      tp__cu.cuStreamGetCaptureInfo(s, &st, &cid, graph, deps, NULL, n);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  TP_RETURN_IF(st == CU_STREAM_CAPTURE_STATUS_NONE, TP_ERROR_ILLEGAL_STATE);
  TP_RETURN_IF(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED,
               TP_ERROR_STREAM_CAPTURE_INVALIDATED);
  TP_RETURN_IF(id && cid != id, TP_ERROR_ILLEGAL_STATE);
  return TP_SUCCESS;
}

static tp_error_t capture_info(CUstream s, CUgraph *graph,
                               const CUgraphNode **deps, size_t *n) {
  return capture_info_of(s, 0, graph, deps, n);
}

static tp_error_t point(CUstream s, uint64_t id, tp__pnode *node) {
  TP_CU_NEED(cuGraphAddEmptyNode);
  TP_CU_NEED(cuStreamUpdateCaptureDependencies);
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t n = 0;
  TP_FORWARD(capture_info_of(s, id, &g, &deps, &n));
  CUgraphNode e = NULL;
  CUresult r = tp__cu.cuGraphAddEmptyNode(&e, g, deps, n);
  if (r == CUDA_SUCCESS)
    r = tp__cu.cuStreamUpdateCaptureDependencies(
        s, &e, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *node = (tp__pnode)e;
  return TP_SUCCESS;
}

tp_error_t tp__cu_capture_point(tp__pstream *ps, uint64_t id, tp__pnode *node) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__seen_capture_lock();
  tp_error_t err = point(s, id, node);
  tp__seen_capture_unlock();
  tp__cu_scope_leave(&scope);
  return err;
}

/* ---- walking the driver's graph ---------------------------------------------
 * A set of nodes by open addressing, and a stack, both growable. */
typedef struct walk {
  CUgraphNode *set;
  size_t setcap, setn;
  CUgraphNode *stack;
  size_t top, stackcap;
} walk;

static size_t slot_of(CUgraphNode n, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)n * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (cap - 1);
}

/* Adds n; false when it was there or memory is short (*oom). */
static bool walk_add(walk *w, CUgraphNode n, bool *oom) {
  if (2 * (w->setn + 1) > w->setcap) {
    size_t cap = w->setcap ? 2 * w->setcap : 64;
    CUgraphNode *set = calloc(cap, sizeof *set);
    if (!set) {
      *oom = true;
      return false;
    }
    for (size_t i = 0; i < w->setcap; i++) {
      if (!w->set[i])
        continue;
      size_t j = slot_of(w->set[i], cap);
      while (set[j])
        j = (j + 1) & (cap - 1);
      set[j] = w->set[i];
    }
    free(w->set);
    w->set = set;
    w->setcap = cap;
  }
  size_t j = slot_of(n, w->setcap);
  while (w->set[j]) {
    if (w->set[j] == n)
      return false;
    j = (j + 1) & (w->setcap - 1);
  }
  w->set[j] = n;
  w->setn++;
  if (w->top == w->stackcap) {
    size_t cap = w->stackcap ? 2 * w->stackcap : 64;
    CUgraphNode *stack = realloc(w->stack, cap * sizeof *stack);
    if (!stack) {
      *oom = true;
      return false;
    }
    w->stack = stack;
    w->stackcap = cap;
  }
  w->stack[w->top++] = n;
  return true;
}

/* Walks back from the stream's dependencies until every target is found
 * or nothing is left: a target met on the way comes before the stream's
 * next work. */
static tp_error_t follows(CUstream s, const tp__pnode *nodes, size_t n,
                          unsigned char *out) {
  TP_CU_NEED(cuGraphNodeGetDependencies);
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t ndeps = 0;
  TP_FORWARD(capture_info(s, &g, &deps, &ndeps));
  size_t left = 0;
  for (size_t i = 0; i < n; i++) {
    out[i] = nodes[i] == 0;
    left += !out[i];
  }
  walk w = {0};
  bool oom = false;
  for (size_t i = 0; i < ndeps; i++)
    (void)walk_add(&w, deps[i], &oom);
  CUgraphNode *buf = NULL;
  size_t bufcap = 0;
  CUresult r = CUDA_SUCCESS;
  while (left && w.top && !oom && r == CUDA_SUCCESS) {
    CUgraphNode v = w.stack[--w.top];
    for (size_t i = 0; i < n; i++)
      if (!out[i] && nodes[i] == (tp__pnode)v) {
        out[i] = 1;
        left--;
      }
    size_t count = 0;
    r = tp__cu.cuGraphNodeGetDependencies(v, NULL, NULL, &count);
    if (r != CUDA_SUCCESS || count == 0)
      continue;
    if (count > bufcap) {
      CUgraphNode *grown = realloc(buf, count * sizeof *grown);
      if (!grown) {
        oom = true;
        break;
      }
      buf = grown;
      bufcap = count;
    }
    r = tp__cu.cuGraphNodeGetDependencies(v, buf, NULL, &count);
    for (size_t i = 0; r == CUDA_SUCCESS && i < count && !oom; i++)
      (void)walk_add(&w, buf[i], &oom);
  }
  free(buf);
  free(w.set);
  free(w.stack);
  TP_RETURN_IF(oom, TP_ERROR_OUT_OF_MEMORY);
  return tp__cu_error(r);
}

/* Whether an empty node of the capture on s does not come before the
 * stream's position; false where that cannot be told (the driver's answer
 * to the end then stands). */
static bool unjoined_marks(CUstream s) {
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t n = 0;
  if (capture_info(s, &g, &deps, &n) != TP_SUCCESS)
    return false;
  CUgraphNode *empty = empty_nodes(g, &n);
  tp__pnode *marks = n ? calloc(n, sizeof *marks) : NULL;
  unsigned char *found = n ? calloc(n, 1) : NULL;
  bool unjoined = false;
  if (marks && found) {
    for (size_t i = 0; i < n; i++)
      marks[i] = (tp__pnode)empty[i];
    if (follows(s, marks, n, found) == TP_SUCCESS)
      for (size_t i = 0; i < n && !unjoined; i++)
        unjoined = !found[i];
  }
  free(empty);
  free(marks);
  free(found);
  return unjoined;
}

tp_error_t tp__cu_capture_follows(tp__pstream *ps, const tp__pnode *nodes,
                                  size_t n, unsigned char *out) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__seen_capture_lock();
  tp_error_t err = follows(s, nodes, n, out);
  tp__seen_capture_unlock();
  tp__cu_scope_leave(&scope);
  return err;
}

/* ---- user objects -----------------------------------------------------------
 * The driver calls the destructor once the graph and every exec made from
 * it are gone and their work is done. It goes through a trampoline, so
 * that an object that could not be attached, or that tidepool detached,
 * dies without calling the release it was made for. */
typedef struct holder {
  void (*release)(void *);
  void *arg;
  atomic_bool armed;
  CUuserObject obj;
} holder;

static void holder_destroy(void *p) {
  holder *h = p;
  if (atomic_load(&h->armed))
    h->release(h->arg);
  free(h);
}

static tp_error_t attach(CUstream s, uint64_t id, void (*release)(void *),
                         void *arg, void **tie, tp__pgraph **graph) {
  TP_CU_NEED(cuUserObjectCreate);
  TP_CU_NEED(cuUserObjectRelease);
  TP_CU_NEED(cuGraphRetainUserObject);
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t n = 0;
  TP_FORWARD(capture_info_of(s, id, &g, &deps, &n));
  holder *h = calloc(1, sizeof *h);
  TP_RETURN_IF(!h, TP_ERROR_OUT_OF_MEMORY);
  h->release = release;
  h->arg = arg;
  atomic_init(&h->armed, true);
  CUuserObject obj = NULL;
  CUresult r = tp__cu.cuUserObjectCreate(&obj, h, holder_destroy, 1,
                                         CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  if (r != CUDA_SUCCESS) {
    free(h);
    return tp__cu_error(r);
  }
  h->obj = obj;
  r = tp__cu.cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE);
  if (r != CUDA_SUCCESS) {
    atomic_store(&h->armed, false);
    (void)tp__cu.cuUserObjectRelease(obj, 1);
    return tp__cu_error(r);
  }
  *tie = h;
  *graph = (tp__pgraph *)g;
  return TP_SUCCESS;
}

tp_error_t tp__cu_capture_attach(tp__pstream *ps, uint64_t id,
                                 void (*release)(void *), void *arg, void **tie,
                                 tp__pgraph **graph) {
  CUstream s;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_stream_begin(ps, &s, &scope));
  tp__seen_capture_lock();
  tp_error_t err = attach(s, id, release, arg, tie, graph);
  tp__seen_capture_unlock();
  tp__cu_scope_leave(&scope);
  return err;
}

/* The graph holds the object's only reference: releasing it runs the
 * destructor (now, or once the driver is done with the graph), disarmed, so
 * that the holder is freed and the release never called. */
tp_error_t tp__cu_capture_detach(tp__pgraph *graph, void *tie) {
  TP_CU_NEED(cuGraphReleaseUserObject);
  TP_RETURN_IF(!graph || !tie, TP_ERROR_INVALID_VALUE);
  holder *h = tie;
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter_any(&scope));
  atomic_store(&h->armed, false);
  CUresult r = tp__cu.cuGraphReleaseUserObject((CUgraph)graph, h->obj, 1);
  if (r != CUDA_SUCCESS)
    atomic_store(&h->armed, true);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

tp_error_t tp__cu_capture_event_record(tp__pevent *ev, tp__pstream *ps) {
  /* Marked before the record, which may have reached the capture even
   * where it failed: such an event is only ever handed back to the driver. */
  ev->captured = true;
  TP_CU_ON_STREAM(ps, tp__cu.cuEventRecord(ev->ev, s_));
}

tp_error_t tp__cu_capture_event_wait(tp__pstream *ps, tp__pevent *ev) {
  TP_CU_ON_STREAM(ps, tp__cu.cuStreamWaitEvent(s_, ev->ev, 0));
}

/* ---- graphs and execs ------------------------------------------------------
 * Graph memory is held through the graph's user object, which its execs
 * share, so an exec carries no release of its own. */

tp_error_t tp__cu_graph_instantiate(tp__pgraph *graph, unsigned long long flags,
                                    void (*release)(void *), void *arg,
                                    tp__pexec **exec) {
  (void)arg;
  TP_CU_NEED(cuGraphInstantiateWithFlags);
  TP_RETURN_IF(release, TP_ERROR_NOT_SUPPORTED);
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter_any(&scope));
  CUgraphExec e = NULL;
  CUresult r = tp__cu.cuGraphInstantiateWithFlags(&e, (CUgraph)graph, flags);
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *exec = (tp__pexec *)e;
  return TP_SUCCESS;
}

tp_error_t tp__cu_graph_launch(tp__pexec *exec, tp__pstream *ps) {
  TP_CU_NEED(cuGraphLaunch);
  TP_CU_ON_STREAM(ps, tp__cu.cuGraphLaunch((CUgraphExec)exec, s_));
}

tp_error_t tp__cu_graph_exec_destroy(tp__pexec *exec) {
  TP_CU_NEED(cuGraphExecDestroy);
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter_any(&scope));
  CUresult r = tp__cu.cuGraphExecDestroy((CUgraphExec)exec);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

tp_error_t tp__cu_graph_destroy(tp__pgraph *graph) {
  TP_CU_NEED(cuGraphDestroy);
  tp__cu_scope scope;
  TP_FORWARD(tp__cu_scope_enter_any(&scope));
  CUresult r = tp__cu.cuGraphDestroy((CUgraph)graph);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}
