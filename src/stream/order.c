/* Stream order: when a free issued on a stream has completed, and what
 * another stream's work follows. Epochs, lazily recorded markers, the legacy
 * default stream's implicit ordering, device synchronize tickets and the
 * completions of streams gone since (stream.h). Below the registry
 * (stream.c), which it never calls. */
#include <string.h>

#include "stream/clock.h"
#include "stream/stream_internal.h"

/* ---- the legacy default stream ------------------------------------------
 * Work queued on a device's NULL stream waits for all earlier work of the
 * device's blocking streams, and their later work waits for it. Each such
 * operation takes the next number of the device's legacy sequence as it
 * begins, under a lock held across the queueing, so that a free that read
 * n-1 was issued before operation n. Only an operation the platform took
 * counts as having ordered anything: one it refused (an event of another
 * device, a bad pointer) queued nothing, and leaves `done` and `op_epoch`
 * as they were (the fuzzer's legacy-op-refused). */
static struct {
  tp__mutex lock;
  _Atomic uint64_t done; /* the number of the last operation queued */
  /* The legacy stream's epoch when its last operation was queued: its
   * frees up to this epoch were issued before an operation, which waits
   * for the blocking streams' work they may have needed. A free is no
   * operation, so the blocking streams' later work follows only these. */
  _Atomic uint64_t op_epoch;
  uint64_t begun_epoch; /* under the lock: the epoch the operation took */
} legacy_seqs[TP_MAX_DEVICES];
/* Operations begun, per device: what a free's tag notes (stream.h). */
tp__legacy_word tp__legacy_seqs[TP_MAX_DEVICES];
_Atomic(tp__stream *) tp__legacy_streams[TP_MAX_DEVICES];

void tp__legacy_begin(int device) {
  tp__mutex_lock(&legacy_seqs[device].lock);
  atomic_fetch_add_explicit(&tp__legacy_seqs[device].seq, 1,
                            memory_order_release);
  tp__stream *l =
      atomic_load_explicit(&tp__legacy_streams[device], memory_order_acquire);
  legacy_seqs[device].begun_epoch =
      l ? tp__stream_advance(l)
        : atomic_load_explicit(&legacy_seqs[device].op_epoch,
                               memory_order_relaxed);
}

void tp__legacy_end(int device, bool queued) {
  if (queued) {
    atomic_store_explicit(&legacy_seqs[device].done,
                          atomic_load_explicit(&tp__legacy_seqs[device].seq,
                                               memory_order_relaxed),
                          memory_order_release);
    atomic_store_explicit(&legacy_seqs[device].op_epoch,
                          legacy_seqs[device].begun_epoch,
                          memory_order_release);
  }
  tp__mutex_unlock(&legacy_seqs[device].lock);
}

/* A field of a device's legacy bookkeeping once no operation is being
 * queued: the number of the last operation queued, or op_epoch. */
uint64_t tp__legacy_settled(int device, bool op_epoch) {
  tp__mutex_lock(&legacy_seqs[device].lock);
  uint64_t v = atomic_load_explicit(op_epoch ? &legacy_seqs[device].op_epoch
                                             : &legacy_seqs[device].done,
                                    memory_order_relaxed);
  tp__mutex_unlock(&legacy_seqs[device].lock);
  return v;
}

tp_error_t tp__streams_init(void) {
  for (int i = 0; i < TP_MAX_DEVICES; i++)
    tp__mutex_init(&legacy_seqs[i].lock, TP_RANK_LEGACY);
  return TP_SUCCESS;
}

static void marker_discard(tp__marker *m) {
  if (m->ev)
    (void)tp__platform->event_destroy(m->ev);
  free(m);
}

void tp__stream_markers_free(tp__stream *s) {
  for (uint32_t i = 0; i < s->nmarkers; i++)
    marker_discard(s->markers[i]);
  for (uint32_t i = 0; i < s->nspare; i++)
    marker_discard(s->spare[i]);
  free(s->markers);
  free(s->spare);
}

/* tp_device_synchronize's tickets per device: taken, and reported done. */
static _Atomic uint64_t syncs_begun[TP_MAX_DEVICES];
static _Atomic uint64_t syncs_done[TP_MAX_DEVICES];

/* Nothing more is asked of s or recorded on it: its frees complete with
 * its markers, or at a device synchronize begun from now on
 * (tp__stream_dead_done). Stream lock held. */
void tp__stream_lose(tp__stream *s) {
  atomic_store_explicit(
      &s->dead_syncs,
      atomic_load_explicit(&syncs_begun[s->device], memory_order_acquire),
      memory_order_relaxed);
  atomic_store_explicit(&s->released, true, memory_order_relaxed);
  atomic_store_explicit(&s->destroyed, true, memory_order_release);
}

/* Whether s may still be asked, or recorded on, through its platform
 * stream. A stream of another's that its owner destroyed has left its
 * handle to no stream or to a new one, which would answer for it (the fake
 * driver's test_foreign_streams: a free still queued behind a held host
 * function was taken as done because the handle's new, idle stream was
 * asked). Found so, it is lost, as a destroyed stream of tidepool's is
 * once released: nothing is asked of it or recorded on it again, and the
 * frees it queued complete with its markers, or else at a device
 * synchronize begun from now on (tp__stream_dead_done). Stream lock held. */
bool tp__stream_still_named(tp__stream *s) {
  if (atomic_load_explicit(&s->released, memory_order_relaxed))
    return false;
  /* A per-thread stream is asked only from its own thread, where its
   * handle names it; from another it names that thread's (test_capture's
   * per-thread streams: a free pending on one thread's was taken as done
   * because another thread's, idle, answered). It lives as long as its
   * thread, and is lost as the thread ends (bound_exit). */
  if (s->thread_bound)
    return tp__platform->stream_named &&
           tp__platform->stream_named(s->ps, s->uid);
  if (s->owned || s->legacy || !s->uid || (s->uid & TP_STREAM_UNNAMED) ||
      !tp__platform->stream_named || tp__platform->stream_named(s->ps, s->uid))
    return true;
  tp__stream_lose(s);
  return false;
}

/* Records a marker covering everything issued on stream s so far, on the
 * platform stream `on` (s's own, or its device's legacy stream for a fence);
 * stream lock held. NULL when the platform failed. */
static tp__marker *marker_record_on(tp__stream *s, tp__pstream *on, bool own) {
  tp__marker *m = s->nspare ? s->spare[--s->nspare] : calloc(1, sizeof *m);
  if (!m)
    return NULL;
  if (!m->ev && tp__platform->event_create(s->device, &m->ev) != TP_SUCCESS) {
    free(m);
    return NULL;
  }
  /* The platform refuses to record on a capturing stream; a capture that
   * another thread began between that check and the record took the record
   * into its graph, and a stream that waited on such a marker would join
   * the capture: asked again after the record, such a marker goes. */
  /* A stream of another's may have been destroyed, and its handle given to
   * a new stream, since the caller found it named: the record then went to
   * the new stream, and the question asked again after it says so (the
   * handle names the stream's id after the record only where it did
   * throughout, ids not being reused). */
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  if (!TP_ARRAY_ROOM(s->markers, s->nmarkers, s->capmarkers) ||
      tp__platform->event_record(m->ev, on) != TP_SUCCESS ||
      tp__platform->capture_status(on, &status, NULL) != TP_SUCCESS ||
      status != TP_CAPTURE_STATUS_NONE || (own && !tp__stream_still_named(s))) {
    marker_discard(m);
    return NULL;
  }
  m->epoch = atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  m->refs = 0;
  m->listed = true;
  s->markers[s->nmarkers++] = m;
  return m;
}

tp__marker *tp__stream_marker_record(tp__stream *s) {
  return marker_record_on(s, s->ps, true);
}

/* A per-thread stream's work is ordered before later work of its device's
 * legacy stream, even once its thread has ended and the platform destroyed
 * it: a marker recorded there covers every free the thread issued (on an
 * H200, driver 580, an event recorded on the legacy stream by another
 * thread after the exit stayed NOT_READY while a host function the ended
 * thread had queued held its stream). Stream lock held. */
static tp__marker *fence_record(tp__stream *s) {
  tp__stream_desc d;
  if (!s->thread_bound ||
      tp__platform->stream_legacy(s->device, &d) != TP_SUCCESS)
    return NULL;
  tp__marker *m = marker_record_on(s, d.ps, false);
  if (m)
    s->fence_wanted = false;
  return m;
}

tp__marker *tp__stream_exit_marker(tp__stream *s) {
  tp__marker *m = tp__stream_marker_record(s);
  if (!m)
    m = fence_record(s);
  s->fence_wanted = m == NULL;
  return m;
}

/* Puts a marker that is done with back for reuse; stream lock held. */
static void marker_retire(tp__stream *s, tp__marker *m) {
  m->listed = false;
  if (m->refs > 0)
    return;
  if (!TP_ARRAY_ROOM(s->spare, s->nspare, s->capspare)) {
    marker_discard(m);
    return;
  }
  s->spare[s->nspare++] = m;
}

/* Drops the markers that the seen epoch covers; stream lock held. */
static void markers_trim(tp__stream *s) {
  uint64_t done = atomic_load_explicit(&s->seen_epoch, memory_order_relaxed);
  uint32_t k = 0;
  while (k < s->nmarkers && s->markers[k]->epoch <= done)
    marker_retire(s, s->markers[k++]);
  if (k) {
    memmove(s->markers, s->markers + k, (s->nmarkers - k) * sizeof(void *));
    s->nmarkers -= k;
  }
}

/* Lets markers go, oldest first, while more than `keep` are listed and the
 * oldest is found complete (one stream completes in order: the first not
 * done ends the scan); what is found is seen, not done. Stream lock held. */
static void markers_drop_finished(tp__stream *s, uint32_t keep) {
  while (s->nmarkers > keep &&
         tp__pevent_finished(tp__platform->event_query(s->markers[0]->ev))) {
    tp__atomic_max(&s->seen_epoch, s->markers[0]->epoch);
    markers_trim(s);
  }
}

/* What the host learned by synchronizing: complete for every policy. */
static void done_to(tp__stream *s, uint64_t epoch) {
  tp__atomic_max(&s->seen_epoch, epoch);
  tp__atomic_max(&s->done_epoch, epoch);
}

void tp__stream_mark_done(tp__stream *s, uint64_t epoch) {
  done_to(s, epoch);
  tp__blspin_lock(&s->lock);
  markers_trim(s);
  tp__blspin_unlock(&s->lock);
}

uint64_t tp__stream_advance(tp__stream *s) {
  tp__blspin_lock(&s->lock);
  uint64_t e = atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  tp__blspin_unlock(&s->lock);
  return e;
}

/* Markers kept before the oldest is asked whether it has completed. */
#define TP_MARKED_KEEP 16

uint64_t tp__stream_advance_marked(tp__stream *s) {
  tp__blspin_lock(&s->lock);
  /* Recorded at every such launch, a marker each: the oldest are let go as
   * they complete, so that a loop of launches with nothing polling the
   * stream keeps no more than the work still queued. */
  markers_drop_finished(s, TP_MARKED_KEEP - 1);
  tp__marker *m = tp__stream_marker_record(s);
  uint64_t e =
      m ? m->epoch
        : atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  tp__blspin_unlock(&s->lock);
  return e;
}

bool tp__stream_done(const tp__tag *t) {
  return !t->stream || atomic_load_explicit(&t->stream->done_epoch,
                                            memory_order_acquire) >= t->epoch;
}

/* The first marker that covers `epoch`, recording one when none does;
 * stream lock held. */
static tp__marker *marker_covering(tp__stream *s, uint64_t epoch) {
  for (uint32_t i = 0; i < s->nmarkers; i++)
    if (s->markers[i]->epoch >= epoch)
      return s->markers[i];
  /* Recorded when first needed, behind whatever the stream queued since the
   * free: a stream made to wait for the free waits for that work too, and on
   * the legacy stream the marker is itself legacy work that the device's
   * blocking streams then wait for (docs/design.md, "Streams and markers").
   * Recording one at every free would put a driver call on the free path. */
  if (!tp__stream_still_named(s))
    return s->fence_wanted ? fence_record(s) : NULL;
  return tp__stream_marker_record(s);
}

/* Whether a recorded marker covers `epoch`; stream lock held. */
static bool covered(const tp__stream *s, uint64_t epoch) {
  return s->nmarkers && s->markers[s->nmarkers - 1]->epoch >= epoch;
}

/* With no marker to ask, the stream itself answers: an idle stream has run
 * every free issued on it before the question, so none needs a marker (a
 * marker recorded now would only complete later). The epoch moves first, so
 * that frees issued meanwhile are not counted. A capturing stream must not
 * be queried, since the query would end its capture, and another thread may
 * begin a capture at any moment: the question is the platform's poll, which
 * answers NOT_READY for a capturing stream rather than invalidate
 * (test_capture_chaos with several threads saw a capture invalidated by a
 * query that came just after its begin). Stream lock held. */
static void ask_stream(tp__stream *s) {
  if (!tp__stream_still_named(s) ||
      (s->legacy && !tp__platform->legacy_covers_blocking))
    return;
  uint64_t epoch =
      atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  /* Asked again after the poll: the owner may have destroyed the stream
   * and made a new one on its handle in between, which answered for it
   * (test_capture's test_foreign_stream_replaced). */
  if (tp__platform->stream_poll(s->ps) == TP_SUCCESS &&
      tp__stream_still_named(s) &&
      (!tp__stream_misses_legacy(s) || tp__stream_legacy_idle(s->device))) {
    tp__atomic_max(&s->seen_epoch, epoch);
    markers_trim(s);
  }
}

static bool seen_done(const tp__tag *t) {
  return !t->stream || atomic_load_explicit(&t->stream->seen_epoch,
                                            memory_order_acquire) >= t->epoch;
}

bool tp__stream_misses_legacy(const tp__stream *s) {
  return !tp__platform->legacy_covers_blocking && !s->legacy &&
         !(s->flags & TP_STREAM_NON_BLOCKING);
}

/* The legacy stream answers for its own queue only, but that is enough
 * here: when it is idle, every legacy operation queued before the question
 * has run, and with it the legacy work a free issued before followed. */
bool tp__stream_legacy_idle(int device) {
  tp__stream_desc d;
  return tp__platform->stream_legacy(device, &d) == TP_SUCCESS &&
         tp__platform->stream_poll(d.ps) == TP_SUCCESS;
}

bool tp__stream_legacy_fence(tp__stream *s, uint64_t epoch) {
  tp__blspin_lock(&s->lock);
  /* On the legacy stream, which counts its tags, a marker that covers the
   * latest is enough (a new one at each question would pile up while the
   * caller polls); a blocking stream gets one whenever its legacy stream
   * was found busy. */
  uint64_t last = atomic_load_explicit(&s->last_tag, memory_order_relaxed);
  bool ok = s->legacy ? last <= atomic_load_explicit(&s->done_epoch,
                                                     memory_order_relaxed) ||
                            marker_covering(s, last) != NULL
                      : marker_covering(s, epoch) != NULL;
  tp__blspin_unlock(&s->lock);
  return ok;
}

/* What polling finds is seen, not done: with opportunistic reuse off, one
 * pool's polling must not let another take a free that no synchronization
 * showed complete (the fuzzer's polled-by-another-pool). */
bool tp__stream_poll(const tp__tag *t) {
  if (seen_done(t))
    return true;
  tp__stream *s = t->stream;
  tp__blspin_lock(&s->lock);
  markers_drop_finished(s, 0);
  if (!seen_done(t) && !covered(s, t->epoch))
    ask_stream(s);
  if (!seen_done(t))
    (void)marker_covering(s, t->epoch);
  tp__blspin_unlock(&s->lock);
  return seen_done(t);
}

tp_error_t tp__stream_wait_host(const tp__tag *t) {
  if (tp__stream_done(t))
    return TP_SUCCESS;
  tp__stream *s = t->stream;
  tp__blspin_lock(&s->lock);
  tp__marker *m = marker_covering(s, t->epoch);
  /* Another running thread's per-thread stream cannot be recorded on from
   * here, but its device's legacy stream orders after it: a wait of the
   * host, a last resort, may wait for the device's other blocking work too
   * (test_oom_wait_for_per_thread_stream). */
  if (!m && s->thread_bound)
    m = fence_record(s);
  if (m)
    m->refs++;
  tp__blspin_unlock(&s->lock);
  TP_RETURN_IF(!m, tp__stream_done(t) ? TP_SUCCESS : TP_ERROR_PLATFORM);
  /* A fault is the stream's synchronize's to report: the free's work has
   * finished all the same. */
  tp_error_t err = tp__platform->event_wait(m->ev);
  if (tp__pevent_finished(err))
    err = TP_SUCCESS;
  tp__blspin_lock(&s->lock);
  if (err == TP_SUCCESS)
    done_to(s, m->epoch);
  m->refs--;
  if (!m->listed)
    marker_retire(s, m);
  markers_trim(s);
  tp__blspin_unlock(&s->lock);
  return err;
}

tp_error_t tp__stream_make_wait(tp__stream *waiter, const tp__tag *t) {
  if (tp__stream_done(t) || t->stream == waiter)
    return TP_SUCCESS;
  tp__stream *s = t->stream;
  tp__blspin_lock(&s->lock);
  /* On the legacy stream a marker recorded now, not an older one that
   * covers the free: it is the operation that waits for every blocking
   * stream's work so far, so that the waiter follows exactly the frees of
   * that stream issued until now (which its clock then says). */
  tp__marker *m =
      s->legacy && !atomic_load_explicit(&s->released, memory_order_relaxed)
          ? tp__stream_marker_record(s)
          : NULL;
  /* Where none can be recorded now (the legacy stream while a blocking
   * stream captures), one recorded before that covers the tag will do. */
  if (!m)
    m = marker_covering(s, t->epoch);
  tp_error_t err = m ? tp__platform->stream_wait_event(waiter->ps, m->ev)
                     : TP_ERROR_PLATFORM;
  uint64_t covered = m ? m->epoch : 0;
  tp__blspin_unlock(&s->lock);
  TP_FORWARD(err);
  tp__blspin_lock(&waiter->lock);
  bool ok = tp__clock_raise(&waiter->clock, s->uid, covered);
  tp__blspin_unlock(&waiter->lock);
  (void)ok; /* a clock that could not grow only forgets a dependency */
  return TP_SUCCESS;
}

bool tp__stream_follows(tp__stream *a, const tp__tag *t) {
  tp__stream *s = t->stream;
  if (!s || s == a)
    return true;
  tp__blspin_lock(&a->lock);
  uint64_t seen = tp__clock_get(&a->clock, s->uid);
  uint64_t legacy_seen =
      tp__clock_get(&a->clock, TP_CLOCK_LEGACY | (uint64_t)s->device);
  tp__blspin_unlock(&a->lock);
  if (seen >= t->epoch)
    return true;
  bool a_blocking = !a->legacy && !(a->flags & TP_STREAM_NON_BLOCKING);
  bool s_blocking = !s->legacy && !(s->flags & TP_STREAM_NON_BLOCKING);
  if (s->device == a->device) {
    if (a->legacy && s_blocking)
      return true;
    if (s_blocking && a_blocking &&
        t->lseq < tp__legacy_settled(a->device, false))
      return true;
    /* A free is no operation: later work of a blocking stream waits for
     * the legacy stream's last operation, which need not cover the other
     * blocking streams' work that a legacy free would have waited for (a
     * block used on one blocking stream and freed on the legacy stream; the
     * fuzzer's legacy-free-blocking-taker). So the taker waits for a marker
     * on the legacy stream that covers the free (recorded now where none
     * does; the driver's free would itself have been such an operation): a
     * wait of its own, which its queries show. */
    if (s->legacy && a_blocking && tp__stream_make_wait(a, t) == TP_SUCCESS)
      return true;
  }
  return s_blocking && t->lseq < legacy_seen;
}

uint64_t tp__device_sync_begin(int device) {
  return atomic_fetch_add_explicit(&syncs_begun[device], 1,
                                   memory_order_acq_rel) +
         1;
}

void tp__device_sync_done(int device, uint64_t ticket) {
  tp__atomic_max(&syncs_done[device], ticket);
}

/* Completions that event synchronizes showed for streams destroyed since,
 * by uid. A small ring: an entry overwritten only means that those frees
 * are learnt complete later, at a device synchronize. Under dead_lock. */
#define DEAD_DONE 64
static tp__spin dead_lock = {0, TP_RANK_DEAD_DONE};
static struct { uint64_t uid, epoch; } dead_done[DEAD_DONE];
static uint32_t dead_next;
static _Atomic uint32_t dead_noted; /* 0: the ring is empty */

void tp__stream_note_dead_done(uint64_t uid, uint64_t epoch) {
  tp__spin_lock(&dead_lock);
  uint32_t i = 0;
  while (i < DEAD_DONE && dead_done[i].uid != uid)
    i++;
  if (i == DEAD_DONE) {
    i = dead_next;
    dead_next = (dead_next + 1) % DEAD_DONE;
    dead_done[i].uid = uid;
    dead_done[i].epoch = 0;
  }
  if (dead_done[i].epoch < epoch)
    dead_done[i].epoch = epoch;
  atomic_store_explicit(&dead_noted, 1, memory_order_release);
  tp__spin_unlock(&dead_lock);
}

static uint64_t dead_done_of(uint64_t uid) {
  if (!atomic_load_explicit(&dead_noted, memory_order_acquire))
    return 0;
  uint64_t epoch = 0;
  tp__spin_lock(&dead_lock);
  for (uint32_t i = 0; i < DEAD_DONE; i++)
    if (dead_done[i].uid == uid)
      epoch = dead_done[i].epoch;
  tp__spin_unlock(&dead_lock);
  return epoch;
}

bool tp__stream_dead_done(const tp__tag *t) {
  tp__stream *s = t->stream;
  if (atomic_load_explicit(&syncs_done[s->device], memory_order_acquire) >
      atomic_load_explicit(&s->dead_syncs, memory_order_acquire)) {
    tp__stream_mark_done(s, atomic_load(&s->epoch));
    return true;
  }
  uint64_t epoch = dead_done_of(s->uid);
  if (epoch)
    tp__stream_mark_done(s, epoch);
  return tp__stream_done(t);
}
