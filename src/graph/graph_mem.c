/* Graphs' lifetimes in graph memory (see graph_mem.h): captures, frees,
 * the liveness of allocations that outlive launches, instantiation,
 * launches and the lock; graph_space.c owns addresses and mapping. */
#include <pthread.h>

#include "common/seen.h"
#include "graph/graph_internal.h"

#define ALIGN ((size_t)512) /* allocation step and alignment, as the pools' */

/* An allocation of another graph that this graph frees at each launch. */
struct foreign {
  tp__gmem *owner;
  uint32_t alloc;
};

/* What a platform release callback hands back: a graph gone (with its
 * execs), or one exec gone. Allocated beforehand so that the callback only
 * links it. */
struct token {
  struct token *next;
  tp__gmem *gm;
  bool graph;
};

/* The lock guards all of graph memory: this file's globals and
 * graph_space.c's (see graph_internal.h), but `released`, onto which the
 * platform's release callbacks push without it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static tp__gmem *gmems; /* every graph's memory not yet freed */
static tp__gmem *last_capture;
static _Atomic(token *) released;

/* ---- graphs' memory -------------------------------------------------------
 */

static void set_live(tp__gmem *gm, allocation *al, bool live);

static void on_release(void *arg) {
  token *t = arg;
  token *head = atomic_load_explicit(&released, memory_order_relaxed);
  do {
    t->next = head;
  } while (!atomic_compare_exchange_weak_explicit(
      &released, &head, t, memory_order_release, memory_order_relaxed));
}

static bool gmem_idle(const tp__gmem *gm) {
  return !gm->attached && gm->holds == 0 && gm->refs == 0 && gm->nlive == 0 &&
         gm->npending == 0;
}

static void gmem_free(tp__gmem *gm) {
  tp__gspace_release(gm);
  for (uint32_t i = 0; i < gm->nforeign; i++)
    gm->foreign[i].owner->refs--;
  if (gm->prev)
    gm->prev->next_gm = gm->next_gm;
  else
    gmems = gm->next_gm;
  if (gm->next_gm)
    gm->next_gm->prev = gm->prev;
  if (last_capture == gm)
    last_capture = NULL;
  free(gm->segs);
  free(gm->slots);
  free(gm->allocs);
  free(gm->foreign);
  free(gm);
}

/* Drops the event of a free outside the graph once it has been waited for
 * or has completed. */
static void drop_free_ev(tp__gmem *gm, allocation *al) {
  (void)tp__platform->event_destroy(al->free_ev);
  al->free_ev = NULL;
  gm->npending--;
}

/* Frees the memory of graphs that are gone and unmaps what no graph needs
 * any more. Under the lock. */
static void sweep(void) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (tp__gmem *gm = gmems, *next; gm; gm = next) {
      next = gm->next_gm;
      if (gmem_idle(gm)) {
        gmem_free(gm);
        changed = true;
      } else if (gm->holds == 0) {
        tp__gspace_unmap(gm, false);
      }
    }
  }
}

/* A self-held graph goes, as its tie's release would have said, once its
 * handle is destroyed and no exec of it lives or runs. Under the lock. */
static void self_release(tp__gmem *gm) {
  if (!gm->self_held || !gm->attached || !gm->graph_gone || gm->execs ||
      gm->running)
    return;
  gm->attached = false;
  gm->holds--;
  sweep();
}

/* A graph tidepool did not see launched is gone: each allocation it did
 * not free may have been made by a launch and be in use, as CUDA lets an
 * allocation outlive its graph, so it stays mapped until its one free
 * (one never made, its graph never launched, is kept for the process's
 * life: tidepool cannot tell). Under the lock. */
static void keep_outputs(tp__gmem *gm) {
  for (uint32_t i = 0; i < gm->nallocs; i++) {
    allocation *al = &gm->allocs[i];
    if (al->freed_in_graph || al->freed_unseen || al->live)
      continue;
    al->freed_unseen = true;
    set_live(gm, al, true);
  }
}

/* Applies what the platform released, unmaps what no graph needs any more
 * and frees the memory of graphs that are gone; with `poll`, asks first
 * whether pending frees outside graphs have completed (not during a
 * capture, where an application's capture mode might object to the
 * question). Under the lock. */
static void collect(bool poll) {
  token *t = atomic_exchange_explicit(&released, NULL, memory_order_acquire);
  bool changed = t != NULL;
  while (t) {
    token *next = t->next;
    tp__gmem *gm = t->gm;
    if (t->graph) {
      gm->attached = false;
      gm->token = NULL;
      if (!gm->seen && !gm->sealed && tp__platform->graph_maps_at_capture())
        keep_outputs(gm);
    }
    if (!t->graph || tp__platform->graph_maps_at_capture())
      gm->holds--;
    free(t);
    t = next;
  }
  for (tp__gmem *gm = gmems; poll && gm; gm = gm->next_gm) {
    for (uint32_t i = 0; gm->npending && i < gm->nallocs; i++) {
      allocation *al = &gm->allocs[i];
      if (al->free_ev &&
          tp__pevent_finished(tp__platform->event_query(al->free_ev))) {
        drop_free_ev(gm, al);
        changed = true;
      }
    }
  }
  if (changed)
    sweep();
}

static tp__gmem *gmem_find(uint64_t capture_id) {
  if (last_capture && last_capture->capture_id == capture_id)
    return last_capture;
  for (tp__gmem *gm = gmems; gm; gm = gm->next_gm)
    if (gm->capture_id == capture_id)
      return last_capture = gm;
  return NULL;
}

/* The memory of the graph that capture_id on ps builds, made and tied to
 * that graph on first use. */
static tp_error_t gmem_of(tp__pstream *ps, uint64_t capture_id,
                          tp__gmem **out) {
  tp__gmem *gm = gmem_find(capture_id);
  if (gm) {
    *out = gm;
    return TP_SUCCESS;
  }
  gm = calloc(1, sizeof *gm);
  token *t = calloc(1, sizeof *t);
  if (!gm || !t) {
    free(gm);
    free(t);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *t = (token){.gm = gm, .graph = true};
  tp_error_t err = tp__platform->capture_attach(ps, capture_id, on_release, t,
                                                &gm->tie, &gm->pg);
  if (err != TP_SUCCESS) {
    free(gm);
    free(t);
    return err;
  }
  gm->capture_id = capture_id;
  gm->token = t;
  gm->attached = true;
  gm->holds = tp__platform->graph_maps_at_capture() ? 1 : 0;
  gm->next_gm = gmems;
  if (gmems)
    gmems->prev = gm;
  gmems = gm;
  *out = last_capture = gm;
  return TP_SUCCESS;
}

tp_error_t tp__gmem_malloc(tp__pstream *ps, uint64_t capture_id,
                           const tp__gmem_kind *kind, size_t size, bool mark,
                           void **ptr) {
  TP_RETURN_IF(!ps || !kind || !ptr, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(kind->device < 0 || kind->device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(size > SIZE_MAX / 4, TP_ERROR_OUT_OF_MEMORY);
  size_t need = tp__align_up(size, ALIGN);
  pthread_mutex_lock(&lock);
  collect(false);
  tp__gmem *gm = NULL;
  tp_error_t err = gmem_of(ps, capture_id, &gm);
  if (err == TP_SUCCESS && gm->sealed)
    err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
  tp__pnode at = 0;
  if (err == TP_SUCCESS && mark)
    err = tp__platform->capture_point(ps, capture_id, &at);
  if (err == TP_SUCCESS) {
    tp__gspace_marks marks;
    tp__gspace_mark(&marks);
    err = tp__gspace_plan(gm, ps, kind, need, ptr);
    if (err != TP_SUCCESS)
      tp__gspace_rollback(&marks);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_free_captured(tp__pstream *ps, uint64_t capture_id,
                                  void *ptr) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!tp__gspace_in_arenas((uintptr_t)ptr), TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&lock);
  collect(false);
  uint32_t index = 0;
  allocation *al = tp__gspace_alloc_at((uintptr_t)ptr, &index);
  tp__gmem *owner = al ? al->seg->gm : NULL, *gm = NULL;
  tp_error_t err = al ? TP_SUCCESS : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && owner->capture_id == capture_id && !owner->sealed) {
    /* Its own graph: the bytes are free after this point of the capture. */
    tp__pnode at = 0;
    err = al->freed_in_graph ? TP_ERROR_INVALID_VALUE
                             : tp__platform->capture_point(ps, capture_id, &at);
    if (err == TP_SUCCESS) {
      al->freed_in_graph = true;
      al->freed_at = at;
    }
  } else if (err == TP_SUCCESS) {
    /* Another graph's allocation: only one that outlives its launches
     * (its capture over, not freed in it), freed once per launch here.
     * The capture is over once instantiated, or once tidepool ended it
     * well (or an interposer saw the application end it well): the free
     * need not wait for the owner's instantiation, which
     * CUDA does not ask either (a producer and a consumer captured first,
     * instantiated after). */
    bool over =
        owner->sealed || ((owner->seen || owner->ended) && !owner->failed);
    if (!over || al->freed_in_graph)
      err = TP_ERROR_INVALID_VALUE;
    if (err == TP_SUCCESS)
      err = gmem_of(ps, capture_id, &gm);
    /* The capture the caller found may have ended and been instantiated
     * meanwhile, its plan fixed (the owner itself, so that a free booked
     * there would hold its own graph for good): the caller asks again. */
    if (err == TP_SUCCESS && (gm->sealed || gm == owner))
      err = TP_ERROR_STREAM_CAPTURE_INVALIDATED;
    for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
      if (gm->foreign[i].owner == owner && gm->foreign[i].alloc == index)
        err = TP_ERROR_INVALID_VALUE;
    if (err == TP_SUCCESS &&
        !TP_ARRAY_ROOM(gm->foreign, gm->nforeign, gm->capforeign))
      err = TP_ERROR_OUT_OF_MEMORY;
    if (err == TP_SUCCESS) {
      gm->foreign[gm->nforeign++] = (foreign){owner, index};
      owner->refs++;
    }
  }
  pthread_mutex_unlock(&lock);
  return err;
}

static void set_live(tp__gmem *gm, allocation *al, bool live) {
  if (al->live == live)
    return;
  al->live = live;
  if (live)
    gm->nlive++;
  else
    gm->nlive--;
}

tp_error_t tp__gmem_free(tp__pstream *ps, int device, void *ptr,
                         bool *claimed) {
  *claimed = false;
  if (TP_LIKELY(!tp__gspace_in_arenas((uintptr_t)ptr)))
    return TP_SUCCESS;
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = TP_SUCCESS;
  uint32_t index = 0;
  allocation *al = NULL;
  tp__gmem *gm = NULL;
  if (tp__gspace_seg_find((uintptr_t)ptr)) {
    *claimed = true;
    al = tp__gspace_alloc_at((uintptr_t)ptr, &index);
    /* A graph tidepool never instantiated (cuda: the application's own
     * capture, instantiation and launches) is launched where tidepool does
     * not see it: each allocation that outlives those launches may be
     * freed once, as the application frees a graph's outputs. */
    bool unseen = al && !al->live && !al->freed_in_graph &&
                  !al->seg->gm->sealed && !al->seg->gm->seen &&
                  !al->freed_unseen && tp__platform->graph_maps_at_capture();
    if (al && (al->live || unseen)) {
      gm = al->seg->gm;
    } else {
      al = NULL;
      err = TP_ERROR_INVALID_VALUE;
    }
  }
  tp__pevent *ev = NULL;
  if (al)
    err = tp__platform->event_create(device, &ev);
  if (al && err == TP_SUCCESS) {
    /* Under the capture lock, which begins hold: a capture begun on ps
     * between the platform's question and its record would take the
     * event, which then never completes. A capture under way refuses the
     * record, and the caller tries again, in that capture. */
    tp__seen_capture_lock();
    err = tp__platform->event_record(ev, ps);
    tp__seen_capture_unlock();
    if (err != TP_SUCCESS)
      (void)tp__platform->event_destroy(ev);
  }
  /* Booked only once the event is recorded: a record the stream refuses
   * (a capture began on it meanwhile) changes nothing. */
  if (al && err == TP_SUCCESS) {
    if (!al->live)
      al->freed_unseen = true;
    if (al->free_ev)
      drop_free_ev(gm, al);
    al->free_ev = ev;
    gm->npending++;
    set_live(gm, al, false);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

tp__gmem *tp__gmem_of_capture(uint64_t capture_id) {
  pthread_mutex_lock(&lock);
  tp__gmem *gm = gmem_find(capture_id);
  pthread_mutex_unlock(&lock);
  return gm;
}

tp__gmem *tp__gmem_of_graph(const tp__pgraph *pg) {
  pthread_mutex_lock(&lock);
  collect(false);
  tp__gmem *gm = gmems;
  while (gm && !(gm->pg == pg && gm->attached && !gm->failed && !gm->seen))
    gm = gm->next_gm;
  pthread_mutex_unlock(&lock);
  return gm;
}

void tp__gmem_forget_graph(const tp__pgraph *pg) {
  pthread_mutex_lock(&lock);
  for (tp__gmem *gm = gmems; gm; gm = gm->next_gm)
    if (gm->pg == pg && !gm->seen)
      gm->pg = NULL;
  pthread_mutex_unlock(&lock);
}

bool tp__gmem_has_allocations(const tp__gmem *gm) {
  return gm && (gm->nallocs > 0 || gm->nforeign > 0);
}

uint64_t tp__gmem_capture_id(const tp__gmem *gm) {
  return gm->capture_id;
}

tp_error_t tp__gmem_instantiate(tp__gmem *gm, void (**release)(void *),
                                void **arg) {
  *release = NULL;
  *arg = NULL;
  pthread_mutex_lock(&lock);
  collect(true);
  /* NOT_SUPPORTED, as the driver answers a second exec of a graph with
   * memory nodes (H100, driver 580, bench/RESULTS.md). */
  tp_error_t err = (gm->nallocs || gm->nforeign) && gm->execs
                       ? TP_ERROR_NOT_SUPPORTED
                       : TP_SUCCESS;
  token *t = NULL;
  if (err == TP_SUCCESS && !tp__platform->graph_maps_at_capture()) {
    tp__gspace_marks marks;
    tp__gspace_mark(&marks);
    t = calloc(1, sizeof *t);
    if (!t)
      err = TP_ERROR_OUT_OF_MEMORY;
    if (err == TP_SUCCESS)
      err = tp__gspace_map(gm);
    if (err != TP_SUCCESS && gm->holds == 0)
      tp__gspace_unmap(gm, false);
    if (err != TP_SUCCESS)
      tp__gspace_rollback(&marks);
  }
  if (err == TP_SUCCESS) {
    if (!gm->sealed) {
      gm->sealed = true;
      for (uint32_t i = 0; i < gm->nallocs; i++)
        gm->books |= !gm->allocs[i].freed_in_graph;
      gm->books |= gm->nforeign > 0;
    }
    gm->execs++;
    if (t) {
      *t = (token){.gm = gm, .graph = false};
      gm->holds++;
      *release = on_release;
      *arg = t;
    }
  } else {
    free(t);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

void tp__gmem_instantiate_undo(tp__gmem *gm, void *arg) {
  pthread_mutex_lock(&lock);
  gm->execs--;
  if (arg) {
    free(arg);
    if (--gm->holds == 0)
      tp__gspace_unmap(gm, false);
  }
  pthread_mutex_unlock(&lock);
}

void tp__gmem_exec_destroyed(tp__gmem *gm, bool may_run) {
  pthread_mutex_lock(&lock);
  gm->execs--;
  if (may_run && gm->self_held)
    gm->running++;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

void tp__gmem_exec_finished(tp__gmem *gm) {
  pthread_mutex_lock(&lock);
  gm->running--;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

void tp__gmem_adopt(tp__gmem *gm, tp__pgraph *graph) {
  pthread_mutex_lock(&lock);
  gm->seen = true;
  if (tp__platform->graph_maps_at_capture() && gm->attached && gm->token &&
      tp__platform->capture_detach(graph, gm->tie) == TP_SUCCESS) {
    gm->self_held = true;
    free(gm->token);
    gm->token = NULL;
  }
  pthread_mutex_unlock(&lock);
}

void tp__gmem_capture_failed(uint64_t capture_id) {
  pthread_mutex_lock(&lock);
  tp__gmem *gm = capture_id ? gmem_find(capture_id) : NULL;
  if (gm && !gm->seen) {
    gm->seen = true;
    gm->failed = true;
    for (uint32_t i = 0; i < gm->nallocs; i++)
      set_live(gm, &gm->allocs[i], false);
    sweep();
  }
  pthread_mutex_unlock(&lock);
}

void tp__gmem_capture_ended(uint64_t capture_id, bool ok) {
  if (!ok) {
    tp__gmem_capture_failed(capture_id);
    return;
  }
  pthread_mutex_lock(&lock);
  tp__gmem *gm = capture_id ? gmem_find(capture_id) : NULL;
  if (gm)
    gm->ended = true;
  pthread_mutex_unlock(&lock);
}

bool tp__gmem_self_held(const tp__gmem *gm) {
  return gm && gm->self_held;
}

void tp__gmem_graph_destroyed(tp__gmem *gm) {
  pthread_mutex_lock(&lock);
  gm->graph_gone = true;
  self_release(gm);
  pthread_mutex_unlock(&lock);
}

tp_error_t tp__gmem_launch(tp__gmem *gm, tp__pexec *exec, bool auto_free,
                           tp__pstream *ps, int device) {
  if (!gm || !gm->books)
    return tp__platform->graph_launch(exec, ps);
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = TP_SUCCESS;
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nallocs; i++)
    if (gm->allocs[i].live && !auto_free)
      err = TP_ERROR_INVALID_VALUE;
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
    if (!gm->foreign[i].owner->allocs[gm->foreign[i].alloc].live)
      err = TP_ERROR_INVALID_VALUE;
  /* The frees of other graphs' allocations happen with this launch: each
   * gets an event recorded after it, made now so that nothing can fail
   * once the launch is queued. */
  tp__pevent **evs = NULL;
  if (err == TP_SUCCESS && gm->nforeign) {
    evs = calloc(gm->nforeign, sizeof *evs);
    err = evs ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
    for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nforeign; i++)
      err = tp__platform->event_create(device, &evs[i]);
  }
  for (uint32_t i = 0; err == TP_SUCCESS && i < gm->nallocs; i++)
    if (gm->allocs[i].free_ev)
      err = tp__platform->stream_wait_event(ps, gm->allocs[i].free_ev);
  if (err == TP_SUCCESS)
    err = tp__platform->graph_launch(exec, ps);
  if (err == TP_SUCCESS) {
    for (uint32_t i = 0; i < gm->nallocs; i++) {
      allocation *al = &gm->allocs[i];
      if (al->free_ev)
        drop_free_ev(gm, al);
      if (!al->freed_in_graph)
        set_live(gm, al, true);
    }
    for (uint32_t i = 0; i < gm->nforeign; i++) {
      tp__gmem *owner = gm->foreign[i].owner;
      allocation *al = &owner->allocs[gm->foreign[i].alloc];
      set_live(owner, al, false);
      if (al->free_ev)
        drop_free_ev(owner, al);
      /* Should the record fail, the owner's next launch is not ordered
       * after this one by tidepool; the stream order still orders them
       * when both run on one stream. */
      if (tp__platform->event_record(evs[i], ps) == TP_SUCCESS) {
        al->free_ev = evs[i];
        owner->npending++;
      } else {
        (void)tp__platform->event_destroy(evs[i]);
      }
      evs[i] = NULL;
    }
  }
  for (uint32_t i = 0; evs && i < gm->nforeign; i++)
    if (evs[i])
      (void)tp__platform->event_destroy(evs[i]);
  free(evs);
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_trim(int device) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_DEVICE);
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = tp__gspace_trim(device);
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_get_attr(int device, tp_graph_mem_attr_t attr,
                             uint64_t *value) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES || !value,
               TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = tp__gspace_get_attr(device, attr, value);
  pthread_mutex_unlock(&lock);
  return err;
}

tp_error_t tp__gmem_reset_high(int device, tp_graph_mem_attr_t attr) {
  TP_RETURN_IF(device < 0 || device >= TP__GMEM_MAX_DEVICES,
               TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&lock);
  collect(true);
  tp_error_t err = tp__gspace_reset_high(device, attr);
  pthread_mutex_unlock(&lock);
  return err;
}
