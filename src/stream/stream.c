/* Streams as the allocator sees them: identity that survives handle reuse,
 * streams lost when their owner destroys them or their thread ends, free
 * epochs, lazily recorded markers, dependency clocks carried by events, and
 * the legacy default stream's implicit ordering (stream.h). */
#include <pthread.h>
#include <string.h>

#include "stream/clock.h"
#include "stream/stream_internal.h"

#include "common/guard.h"

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
static _Atomic(tp__stream *) legacy_streams[TP_MAX_DEVICES];

void tp__legacy_begin(int device) {
  tp__mutex_lock(&legacy_seqs[device].lock);
  atomic_fetch_add_explicit(&tp__legacy_seqs[device].seq, 1,
                            memory_order_release);
  tp__stream *l =
      atomic_load_explicit(&legacy_streams[device], memory_order_acquire);
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

/* ---- the stream registry --------------------------------------------------
 * Streams made by tp_stream_create are found by handle value, which the
 * platform keeps unique among live streams; others (cuda's foreign streams)
 * are adopted by uid on every call, since their handle values get reused.
 * A per-thread cache skips the lock for the handles used last; it is
 * invalidated by a generation count that every destruction bumps. */
static tp__mutex reg_lock = TP_MUTEX_INIT(TP_RANK_STREAM_TABLE);
static tp__stream **reg;
static uint32_t nreg, capreg;
TP_TLS tp__stream_last tp__stream_last_used;

#define TLS_WAYS 4
static TP_TLS struct {
  tp_stream_t handle[TLS_WAYS];
  tp__stream *stream[TLS_WAYS];
  uint64_t gen;
  unsigned next;
} tls_cache;

static TP_TLS int current_device;
/* The legacy stream of current_device once made (stream.h). */
TP_TLS tp__stream *tp__legacy_here;

/* Streams of others, by handle and the uid they had (see foreign_cached).
 * Never invalidated: such streams stay registered, and the uid decides. */
static _Thread_local struct {
  tp_stream_t handle[TLS_WAYS];
  uint64_t uid[TLS_WAYS];
  tp__stream *stream[TLS_WAYS];
  unsigned next;
} foreign_cache;

int tp__current_device(void) {
  return current_device;
}
void tp__set_current_device(int device) {
  if (device == current_device)
    return;
  current_device = device;
  tp__legacy_here =
      atomic_load_explicit(&legacy_streams[device], memory_order_acquire);
}

tp_error_t tp__streams_init(void) {
  for (int i = 0; i < TP_MAX_DEVICES; i++)
    tp__mutex_init(&legacy_seqs[i].lock, TP_RANK_LEGACY);
  return TP_SUCCESS;
}

static tp__stream *stream_alloc(const tp__stream_desc *d) {
  tp__stream *s = aligned_alloc(_Alignof(tp__stream), sizeof *s);
  if (!s)
    return NULL;
  memset(s, 0, sizeof *s);
  tp__blspin_init(&s->lock, TP_RANK_STREAM);
  s->uid = d->uid;
  s->device = d->device;
  s->flags = d->flags;
  s->legacy = d->legacy;
  s->ps = d->ps;
  s->thread_bound = d->thread_bound;
  atomic_init(&s->refs, 1);
  atomic_init(&s->epoch, 1);
  atomic_init(&s->done_epoch, 0);
  atomic_init(&s->seen_epoch, 0);
  return s;
}

static void marker_discard(tp__marker *m) {
  if (m->ev)
    (void)tp__platform->event_destroy(m->ev);
  free(m);
}

static void stream_free(tp__stream *s) {
  for (uint32_t i = 0; i < s->nmarkers; i++)
    marker_discard(s->markers[i]);
  for (uint32_t i = 0; i < s->nspare; i++)
    marker_discard(s->spare[i]);
  free(s->markers);
  free(s->spare);
  tp__clock_free(&s->clock);
  free(s);
}

void tp__stream_unref(tp__stream *s) {
  if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
    stream_free(s);
}

static bool reg_add(tp__stream *s) {
  tp__mutex_lock(&reg_lock);
  bool ok = TP_ARRAY_ROOM(reg, nreg, capreg);
  if (ok)
    reg[nreg++] = s;
  tp__mutex_unlock(&reg_lock);
  return ok;
}

/* Where s is in the registry; nreg when it is not. */
static uint32_t reg_index(const tp__stream *s) {
  uint32_t i = 0;
  while (i < nreg && reg[i] != s)
    i++;
  return i;
}

static tp__stream *reg_find_handle(tp_stream_t handle) {
  for (uint32_t i = 0; i < nreg; i++)
    if (reg[i]->owned && reg[i]->handle == handle)
      return reg[i];
  return NULL;
}

/* A stream the platform made outside tidepool, by its handle: the one met
 * last, since a handle may name a new stream once its stream is gone. */
static tp__stream *reg_find_foreign(tp_stream_t handle) {
  for (uint32_t i = nreg; i-- > 0;)
    if (!reg[i]->owned && reg[i]->handle == handle)
      return reg[i];
  return NULL;
}

/* tp_device_synchronize's tickets per device: taken, and reported done. */
static _Atomic uint64_t syncs_begun[TP_MAX_DEVICES];
static _Atomic uint64_t syncs_done[TP_MAX_DEVICES];

#define TP_STREAM_UNNAMED (UINT64_C(1) << 62)
static _Atomic uint64_t unnamed = 1;

/* Nothing more is asked of s or recorded on it: its frees complete with
 * its markers, or at a device synchronize begun from now on
 * (tp__stream_dead_done). Stream lock held. */
static void lose(tp__stream *s) {
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
static bool still_named(tp__stream *s) {
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
  lose(s);
  return false;
}

static tp__stream *reg_find_uid(uint64_t uid) {
  for (uint32_t i = 0; i < nreg; i++)
    if (reg[i]->uid == uid)
      return reg[i];
  return NULL;
}

tp_error_t tp__legacy_get(int device, tp__stream **out) {
  tp__stream *s =
      atomic_load_explicit(&legacy_streams[device], memory_order_acquire);
  if (TP_LIKELY(s != NULL)) {
    if (device == current_device)
      tp__legacy_here = s;
    *out = s;
    return TP_SUCCESS;
  }
  tp__stream_desc d = {0};
  TP_FORWARD(tp__platform->stream_legacy(device, &d));
  tp__mutex_lock(&reg_lock);
  s = atomic_load_explicit(&legacy_streams[device], memory_order_relaxed);
  tp_error_t err = TP_SUCCESS;
  if (!s) {
    d.legacy = 1;
    d.device = device;
    s = stream_alloc(&d);
    if (!s || !TP_ARRAY_ROOM(reg, nreg, capreg)) {
      free(s);
      s = NULL;
      err = TP_ERROR_OUT_OF_MEMORY;
    } else {
      reg[nreg++] = s;
      atomic_store_explicit(&legacy_streams[device], s, memory_order_release);
    }
  }
  tp__mutex_unlock(&reg_lock);
  *out = s;
  return err;
}

/* Another's stream met before on this thread: its handle and the uid it had
 * then. A hit costs the platform's identify (two driver calls on cuda) and
 * no lock; the uid tells the stream from a new one that took the handle of
 * a destroyed one, which tidepool is never told about. */
/* The way that holds `handle`, or TLS_WAYS. */
static unsigned foreign_way(tp_stream_t handle) {
  unsigned way = 0;
  while (way < TLS_WAYS && foreign_cache.handle[way] != handle)
    way++;
  return way;
}

static bool foreign_cached(tp_stream_t handle, bool uncaptured,
                           tp__stream **out, bool *idle) {
  unsigned way = foreign_way(handle);
  if (way == TLS_WAYS || !tp__platform->stream_identify)
    return false;
  uint64_t uid;
  tp_capture_status_t status;
  /* Any doubt (an error, a capture, another uid) takes the full way, which
   * gives the definitive answer. */
  tp_error_t err =
      tp__platform->stream_identify(handle, !uncaptured, &uid, &status);
  if (err != TP_SUCCESS || status != TP_CAPTURE_STATUS_NONE ||
      uid != foreign_cache.uid[way])
    return false;
  *out = foreign_cache.stream[way];
  if (idle)
    *idle = true;
  return true;
}

static void foreign_remember(tp_stream_t handle, tp__stream *s) {
  if (!s->uid || (s->uid & TP_STREAM_UNNAMED))
    return;
  /* A handle met again (on a new stream) takes its old way, which would
   * otherwise shadow the new entry and miss on every call. */
  unsigned way = foreign_way(handle);
  if (way == TLS_WAYS)
    way = foreign_cache.next++ % TLS_WAYS;
  foreign_cache.handle[way] = handle;
  foreign_cache.uid[way] = s->uid;
  foreign_cache.stream[way] = s;
}

/* Streams of another's that were found lost (still_named) and left the
 * registry, each with the reference the registry held: the API gives back
 * what the pools keep for them (tp__stream_take_lost). Under reg_lock. */
static tp__stream **lost;
static uint32_t nlost, caplost;
static _Atomic uint32_t lost_count;

/* Moves a lost stream from the registry to the list, with the registry's
 * reference; where the list cannot grow, it stays registered. */
static void lost_push(tp__stream *s) {
  tp__mutex_lock(&reg_lock);
  uint32_t i = reg_index(s);
  if (i < nreg && TP_ARRAY_ROOM(lost, nlost, caplost)) {
    reg[i] = reg[--nreg];
    lost[nlost++] = s;
    atomic_store_explicit(&lost_count, nlost, memory_order_release);
  }
  tp__mutex_unlock(&reg_lock);
}

/* Streams of another's met before under `handle`, which names `now` since:
 * each that the platform confirms gone is lost and leaves the registry,
 * which would otherwise keep every stream the application ever made (and
 * the pools a cache for each). A few at a time; the rest at later calls. */
#define LOST_BATCH 8
static void forget_lost(tp_stream_t handle, const tp__stream *now) {
  tp__stream *seen[LOST_BATCH];
  uint32_t n = 0;
  tp__mutex_lock(&reg_lock);
  for (uint32_t i = 0; i < nreg && n < LOST_BATCH; i++) {
    tp__stream *o = reg[i];
    if (o != now && !o->owned && !o->legacy && !o->thread_bound &&
        o->handle == handle) {
      tp__stream_ref(o);
      seen[n++] = o;
    }
  }
  tp__mutex_unlock(&reg_lock);
  for (uint32_t k = 0; k < n; k++) {
    tp__stream *o = seen[k];
    tp__blspin_lock(&o->lock);
    bool gone = !still_named(o) &&
                atomic_load_explicit(&o->released, memory_order_relaxed);
    tp__blspin_unlock(&o->lock);
    if (gone)
      lost_push(o);
    tp__stream_unref(o);
  }
}

tp__stream *tp__stream_take_lost(void) {
  if (!atomic_load_explicit(&lost_count, memory_order_acquire))
    return NULL;
  tp__mutex_lock(&reg_lock);
  tp__stream *s = nlost ? lost[--nlost] : NULL;
  atomic_store_explicit(&lost_count, nlost, memory_order_release);
  tp__mutex_unlock(&reg_lock);
  return s;
}

/* ---- per-thread streams at their thread's exit
 * A thread's per-thread default stream is asked only from that thread
 * (still_named): once the thread has ended, nothing but a device
 * synchronize would show its frees complete, and the registry would keep
 * it, with a cache in each pool, for good. So as the thread ends, a last
 * marker is recorded on it (the handle still names it there), which covers
 * every free it issued, and it is lost. */
static pthread_key_t bound_key;
static pthread_once_t bound_once = PTHREAD_ONCE_INIT;
static bool bound_key_made;

static tp__marker *marker_record(tp__stream *s);

/* `arg`: the thread's streams, one per device (held by the key rather than
 * in static TLS, which a library loaded by dlopen must keep small). */
static void bound_exit(void *arg) {
  tp__stream **here = arg;
  for (int d = 0; d < TP_MAX_DEVICES; d++) {
    tp__stream *s = here[d];
    if (!s)
      continue;
    tp__blspin_lock(&s->lock);
    if (!atomic_load_explicit(&s->released, memory_order_relaxed)) {
      (void)marker_record(s);
      lose(s);
    }
    tp__blspin_unlock(&s->lock);
    lost_push(s);
  }
  free(here);
}

static void bound_key_make(void) {
  bound_key_made = pthread_key_create(&bound_key, bound_exit) == 0;
}

/* Where the key or its array cannot be made, such streams stay until a
 * device synchronize, as before. */
static void bound_note(tp__stream *s) {
  pthread_once(&bound_once, bound_key_make);
  if (!bound_key_made)
    return;
  tp__stream **here = pthread_getspecific(bound_key);
  if (!here) {
    here = calloc(TP_MAX_DEVICES, sizeof *here);
    if (!here || pthread_setspecific(bound_key, here) != 0) {
      free(here);
      return;
    }
  }
  here[s->device] = s;
}

/* A stream tidepool did not make: described by the platform, then found by
 * uid (or, while it captures, by handle) or registered. */
static tp_error_t adopt(tp_stream_t handle, tp__stream **out) {
  tp__stream_desc d = {0};
  TP_FORWARD(tp__platform->stream_adopt(handle, &d));
  if (d.legacy)
    return tp__legacy_get(d.device, out);
  tp__mutex_lock(&reg_lock);
  tp__stream *s = d.uid ? reg_find_uid(d.uid) : reg_find_foreign(handle);
  if (!s && (s = stream_alloc(&d)) != NULL) {
    s->handle = handle;
    /* A stream met first where the platform could not name it keeps a
     * name of its own, outside the platform's (uid 0 is no name). */
    if (!d.uid)
      s->uid = TP_STREAM_UNNAMED | atomic_fetch_add(&unnamed, 1);
    if (!TP_ARRAY_ROOM(reg, nreg, capreg)) {
      free(s);
      s = NULL;
    } else {
      reg[nreg++] = s;
    }
  }
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(!s, TP_ERROR_OUT_OF_MEMORY);
  if (d.uid) {
    foreign_remember(handle, s);
    forget_lost(handle, s);
  }
  if (s->thread_bound)
    bound_note(s);
  *out = s;
  return TP_SUCCESS;
}

/* The handle becomes the thread's latest in tp__stream_last_used. */
static void last_note(tp_stream_t handle, tp__stream *s, uint64_t gen) {
  tp__stream_last *l = &tp__stream_last_used;
  if (l->gen != gen)
    *l = (tp__stream_last){{handle, NULL}, {s, NULL}, gen};
  else
    *l = (tp__stream_last){{handle, l->handle[0]}, {s, l->stream[0]}, gen};
}

tp_error_t tp__stream_get_slow(tp_stream_t handle, bool uncaptured,
                               tp__stream **out, bool *idle) {
  if (handle == NULL)
    return tp__legacy_get(current_device, out);
  uint64_t gen =
      atomic_load_explicit(&tp__hot.stream_gen, memory_order_acquire);
  if (TP_LIKELY(tls_cache.gen == gen)) {
    for (unsigned i = 0; i < TLS_WAYS; i++) {
      if (tls_cache.handle[i] == handle) {
        last_note(handle, tls_cache.stream[i], gen);
        *out = tls_cache.stream[i];
        return TP_SUCCESS;
      }
    }
  } else {
    memset(&tls_cache, 0, sizeof tls_cache);
    tls_cache.gen = gen;
  }
  if (foreign_cached(handle, uncaptured, out, idle))
    return TP_SUCCESS;
  tp__mutex_lock(&reg_lock);
  tp__stream *s = reg_find_handle(handle);
  bool retired = s && s->retired;
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(retired, TP_ERROR_INVALID_VALUE);
  if (!s)
    return adopt(handle, out);
  unsigned way = tls_cache.next++ % TLS_WAYS;
  tls_cache.handle[way] = handle;
  tls_cache.stream[way] = s;
  last_note(handle, s, gen);
  *out = s;
  return TP_SUCCESS;
}

tp_error_t tp__stream_create(unsigned flags, tp_stream_t *handle) {
  tp__stream_desc d = {.device = current_device, .flags = flags};
  tp_stream_t h = NULL;
  TP_FORWARD(tp__platform->stream_create(d.device, flags, &d.ps, &h, &d.uid));
  tp__stream *s = stream_alloc(&d);
  if (s) {
    s->owned = true;
    s->handle = h;
  }
  if (!s || !reg_add(s)) {
    free(s);
    (void)tp__platform->stream_destroy(d.ps);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *handle = h;
  return TP_SUCCESS;
}

/* Records a marker covering everything issued on the stream so far; stream
 * lock held. Returns NULL when the platform failed. */
static tp__marker *marker_record(tp__stream *s) {
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
      tp__platform->event_record(m->ev, s->ps) != TP_SUCCESS ||
      tp__platform->capture_status(s->ps, &status, NULL) != TP_SUCCESS ||
      status != TP_CAPTURE_STATUS_NONE || !still_named(s)) {
    marker_discard(m);
    return NULL;
  }
  m->epoch = atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  m->refs = 0;
  m->listed = true;
  s->markers[s->nmarkers++] = m;
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
  if (!still_named(s))
    return NULL;
  return marker_record(s);
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
  if (!still_named(s) || (s->legacy && !tp__platform->legacy_covers_blocking))
    return;
  uint64_t epoch =
      atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  /* Asked again after the poll: the owner may have destroyed the stream
   * and made a new one on its handle in between, which answered for it
   * (test_capture's test_foreign_stream_replaced). */
  if (tp__platform->stream_poll(s->ps) == TP_SUCCESS && still_named(s) &&
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
  /* One stream completes in order: the first marker not done ends the scan. */
  while (s->nmarkers &&
         tp__pevent_finished(tp__platform->event_query(s->markers[0]->ev))) {
    tp__atomic_max(&s->seen_epoch, s->markers[0]->epoch);
    markers_trim(s);
  }
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
  if (m)
    m->refs++;
  tp__blspin_unlock(&s->lock);
  TP_RETURN_IF(!m, tp__stream_done(t) ? TP_SUCCESS : TP_ERROR_PLATFORM);
  /* A fault is the stream's synchronize's to report: the free's work has
   * finished all the same. */
  tp_error_t err = tp__platform->event_synchronize(m->ev);
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
          ? marker_record(s)
          : marker_covering(s, t->epoch);
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

/* ---- destruction and listing ----------------------------------------------
 */

tp_error_t tp__stream_retire(tp__stream *s) {
  TP_RETURN_IF(!s->owned, TP_ERROR_INVALID_VALUE);
  tp__mutex_lock(&reg_lock);
  bool found = !s->retired && reg_index(s) < nreg;
  if (found) {
    s->retired = true;
    atomic_fetch_add_explicit(&tp__hot.stream_gen, 1, memory_order_release);
  }
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(!found, TP_ERROR_INVALID_VALUE);
  /* The last marker covers every free issued on the stream, so that blocks
   * it cached stay resolvable once the platform stream is gone. */
  tp__blspin_lock(&s->lock);
  tp__marker *m = marker_record(s);
  atomic_store_explicit(&s->dead_syncs, UINT64_MAX, memory_order_relaxed);
  atomic_store_explicit(&s->destroyed, true, memory_order_release);
  tp__blspin_unlock(&s->lock);
  if (m)
    return TP_SUCCESS;
  tp_error_t err = tp__platform->stream_synchronize(s->ps);
  tp__stream_mark_done(s, atomic_load(&s->epoch));
  return err == TP_ERROR_ILLEGAL_ADDRESS ? TP_SUCCESS : err;
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

tp_error_t tp__stream_release(tp__stream *s) {
  /* A call that raced the destroy may have freed after retire's marker: a
   * marker recorded now covers those frees too, and should recording fail,
   * the next device synchronize does. */
  tp__blspin_lock(&s->lock);
  (void)marker_record(s);
  atomic_store_explicit(&s->released, true, memory_order_relaxed);
  atomic_store_explicit(
      &s->dead_syncs,
      atomic_load_explicit(&syncs_begun[s->device], memory_order_acquire),
      memory_order_release);
  tp__blspin_unlock(&s->lock);
  tp__mutex_lock(&reg_lock);
  uint32_t i = reg_index(s);
  if (i < nreg)
    reg[i] = reg[--nreg];
  tp__mutex_unlock(&reg_lock);
  tp_error_t err = tp__platform->stream_destroy(s->ps);
  tp__stream_unref(s);
  return err;
}

tp_error_t tp__streams_list(int device, tp__stream ***out, size_t *n) {
  tp__mutex_lock(&reg_lock);
  tp__stream **v = malloc((nreg ? nreg : 1) * sizeof *v);
  size_t k = 0;
  for (uint32_t i = 0; v && i < nreg; i++) {
    if (device >= 0 && reg[i]->device != device)
      continue;
    tp__stream_ref(reg[i]);
    v[k++] = reg[i];
  }
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(!v, TP_ERROR_OUT_OF_MEMORY);
  *out = v;
  *n = k;
  return TP_SUCCESS;
}

tp__stream *tp__stream_find_uid(uint64_t uid) {
  tp__mutex_lock(&reg_lock);
  tp__stream *s = reg_find_uid(uid);
  if (s)
    tp__stream_ref(s);
  tp__mutex_unlock(&reg_lock);
  return s;
}
