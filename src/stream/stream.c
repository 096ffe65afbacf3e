/* The stream registry: streams by handle, identity that survives handle
 * reuse, streams lost when their owner destroys them or their thread ends,
 * creation and destruction (stream.h). When their frees complete is
 * order.c's. */
#include <pthread.h>
#include <string.h>

#include "stream/clock.h"
#include "stream/stream_internal.h"

#include "common/guard.h"
#include "common/ptable.h"

/* ---- the stream registry --------------------------------------------------
 * Streams made by tp_stream_create are found by handle value, which the
 * platform keeps unique among live streams; others (cuda's foreign streams)
 * are adopted by uid on every call, since their handle values get reused.
 * A per-thread cache skips the lock for the handles used last; it is
 * invalidated by a generation count that every destruction bumps. */
static tp__mutex reg_lock = TP_MUTEX_INIT(TP_RANK_STREAM_TABLE);
static tp__stream **reg;
static uint32_t nreg, capreg;
/* Registrations so far, which date each stream (reg_seq). */
static uint64_t registrations;
TP_TLS tp__stream_last tp__stream_last_used;

/* The registered streams by handle and by uid, so that resolving a handle
 * costs the same with ten thousand live streams as with ten, where a scan
 * of the list cost microseconds a call (4 us at ten thousand streams). A
 * key may have several streams (a foreign stream's handle that a new
 * stream took, the legacy streams' NULL handle). Under reg_lock. */
static uint64_t handle_key(const void *s) {
  return (uint64_t)(uintptr_t)((const tp__stream *)s)->handle;
}
static uint64_t uid_key(const void *s) {
  return ((const tp__stream *)s)->uid;
}
static tp__ptable by_handle = TP_PTABLE_INIT(handle_key);
static tp__ptable by_uid = TP_PTABLE_INIT(uid_key);

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
static TP_TLS struct {
  tp_stream_t handle[TLS_WAYS];
  uint64_t uid[TLS_WAYS];
  tp__stream *stream[TLS_WAYS];
  /* tp__hot.stream_gen when last found so: its low half per way, and the
   * high half one for all (a way of another high half is stale), which
   * keeps the whole library's thread-locals small (common.h's TP_TLS). */
  uint32_t gone[TLS_WAYS];
  uint32_t gone_high;
  unsigned next;
} foreign_cache;

static bool foreign_gone_same(unsigned way, uint64_t gone) {
  return foreign_cache.gone[way] == (uint32_t)gone &&
         foreign_cache.gone_high == (uint32_t)(gone >> 32);
}

static void foreign_gone_set(unsigned way, uint64_t gone) {
  if (foreign_cache.gone_high != (uint32_t)(gone >> 32)) {
    foreign_cache.gone_high = (uint32_t)(gone >> 32);
    for (unsigned w = 0; w < TLS_WAYS; w++)
      foreign_cache.gone[w] = (uint32_t)gone - 1; /* stale */
  }
  foreign_cache.gone[way] = (uint32_t)gone;
}

int tp__current_device(void) {
  return current_device;
}
void tp__set_current_device(int device) {
  if (device == current_device)
    return;
  current_device = device;
  tp__legacy_here =
      atomic_load_explicit(&tp__legacy_streams[device], memory_order_acquire);
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

static void stream_free(tp__stream *s) {
  tp__stream_markers_free(s);
  tp__clock_free(&s->clock);
  free(s);
}

void tp__stream_unref(tp__stream *s) {
  if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
    stream_free(s);
}

/* Registers s in the list and both indexes; false, nothing registered,
 * where memory runs out. Under reg_lock. */
static bool reg_put(tp__stream *s) {
  if (!TP_ARRAY_ROOM(reg, nreg, capreg) || !tp__ptable_room(&by_handle) ||
      !tp__ptable_room(&by_uid))
    return false;
  s->reg_at = nreg;
  s->reg_seq = ++registrations;
  reg[nreg++] = s;
  tp__ptable_put(&by_handle, s);
  tp__ptable_put(&by_uid, s);
  return true;
}

static bool reg_add(tp__stream *s) {
  tp__mutex_lock(&reg_lock);
  bool ok = reg_put(s);
  tp__mutex_unlock(&reg_lock);
  return ok;
}

/* Whether s is registered; under reg_lock. A stream that left keeps a
 * stale reg_at, where another stream or none is now. */
static bool reg_has(const tp__stream *s) {
  return s->reg_at < nreg && reg[s->reg_at] == s;
}

/* Takes s out of the registry, where it is; under reg_lock. */
static bool reg_drop(const tp__stream *s) {
  if (!reg_has(s))
    return false;
  tp__stream *moved = reg[--nreg];
  reg[s->reg_at] = moved;
  moved->reg_at = s->reg_at;
  (void)tp__ptable_drop(&by_handle, s);
  (void)tp__ptable_drop(&by_uid, s);
  return true;
}

static tp__stream *reg_find_handle(tp_stream_t handle) {
  size_t at = SIZE_MAX;
  tp__stream *s;
  while ((s = tp__ptable_next(&by_handle, (uintptr_t)handle, &at)) != NULL)
    if (s->owned)
      return s;
  return NULL;
}

/* A stream the platform made outside tidepool, by its handle: the one met
 * last, since a handle may name a new stream once its stream is gone. */
static tp__stream *reg_find_foreign(tp_stream_t handle) {
  size_t at = SIZE_MAX;
  tp__stream *s, *last = NULL;
  while ((s = tp__ptable_next(&by_handle, (uintptr_t)handle, &at)) != NULL)
    if (!s->owned && (!last || s->reg_seq > last->reg_seq))
      last = s;
  return last;
}

static _Atomic uint64_t unnamed = 1;

static tp__stream *reg_find_uid(uint64_t uid) {
  size_t at = SIZE_MAX;
  return tp__ptable_next(&by_uid, uid, &at);
}

tp_error_t tp__legacy_get(int device, tp__stream **out) {
  tp__stream *s =
      atomic_load_explicit(&tp__legacy_streams[device], memory_order_acquire);
  if (TP_LIKELY(s != NULL)) {
    if (device == current_device)
      tp__legacy_here = s;
    *out = s;
    return TP_SUCCESS;
  }
  tp__stream_desc d = {0};
  TP_FORWARD(tp__platform->stream_legacy(device, &d));
  tp__mutex_lock(&reg_lock);
  s = atomic_load_explicit(&tp__legacy_streams[device], memory_order_relaxed);
  tp_error_t err = TP_SUCCESS;
  if (!s) {
    d.legacy = 1;
    d.device = device;
    s = stream_alloc(&d);
    if (!s || !reg_put(s)) {
      free(s);
      s = NULL;
      err = TP_ERROR_OUT_OF_MEMORY;
    } else {
      atomic_store_explicit(&tp__legacy_streams[device], s,
                            memory_order_release);
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

/* `gone`: tp__hot.stream_gen, read before anything is asked. *vouched:
 * found without a question, by that generation alone. */
static bool foreign_cached(tp_stream_t handle, uint64_t gone, bool uncaptured,
                           tp__stream **out, bool *idle, bool *vouched) {
  unsigned way = foreign_way(handle);
  if (way == TLS_WAYS || !foreign_cache.stream[way] ||
      !tp__platform->stream_identify)
    return false;
  /* Where every destruction is seen and none came since the stream was
   * last found here, the handle still names it: no driver call, unless a
   * capture may be under way. Not so the per-thread stream's handle, which
   * names another stream in each context of the thread. */
  if (atomic_load_explicit(&tp__hot.foreign_watched, memory_order_acquire) &&
      foreign_gone_same(way, gone) &&
      !foreign_cache.stream[way]->thread_bound &&
      (uncaptured || tp__no_capture())) {
    *out = foreign_cache.stream[way];
    if (idle)
      *idle = true;
    *vouched = true;
    return true;
  }
  uint64_t uid;
  tp_capture_status_t status;
  /* Any doubt (an error, a capture, another uid) takes the full way, which
   * gives the definitive answer. */
  tp_error_t err = tp__platform->stream_identify(
      handle, !(uncaptured || tp__no_capture()), &uid, &status);
  if (err != TP_SUCCESS || status != TP_CAPTURE_STATUS_NONE ||
      uid != foreign_cache.uid[way])
    return false;
  foreign_gone_set(way, gone);
  *out = foreign_cache.stream[way];
  if (idle)
    *idle = true;
  return true;
}

static void foreign_remember(tp_stream_t handle, tp__stream *s, uint64_t gone) {
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
  foreign_gone_set(way, gone);
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
  if (TP_ARRAY_ROOM(lost, nlost, caplost) && reg_drop(s)) {
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
  size_t at = SIZE_MAX;
  tp__stream *met;
  tp__mutex_lock(&reg_lock);
  while (n < LOST_BATCH &&
         (met = tp__ptable_next(&by_handle, (uintptr_t)handle, &at)) != NULL) {
    if (met != now && !met->owned && !met->legacy && !met->thread_bound) {
      tp__stream_ref(met);
      seen[n++] = met;
    }
  }
  tp__mutex_unlock(&reg_lock);
  for (uint32_t k = 0; k < n; k++) {
    tp__stream *o = seen[k];
    tp__blspin_lock(&o->lock);
    bool gone = !tp__stream_still_named(o) &&
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
 * marker covers every free it issued (tp__stream_exit_marker), and it is
 * lost. The driver may have ended the thread's own state first (on an
 * H200, driver 580, a key made after cuInit found no current context), so
 * the marker goes on the stream where the platform still answers there,
 * else on the device's legacy stream, now or when next wanted. */
static pthread_key_t bound_key;
static pthread_once_t bound_once = PTHREAD_ONCE_INIT;
static bool bound_key_made;

/* A thread-bound stream leaves: a last marker covers every free it issued
 * (where it still may be recorded), and it is lost. */
static void bound_lose(tp__stream *s) {
  tp__blspin_lock(&s->lock);
  if (!atomic_load_explicit(&s->released, memory_order_relaxed)) {
    (void)tp__stream_exit_marker(s);
    tp__stream_lose(s);
  }
  tp__blspin_unlock(&s->lock);
  lost_push(s);
}

/* `arg`: the thread's streams, one per device (held by the key rather than
 * in static TLS, which a library loaded by dlopen must keep small). */
/* The ending thread's own cache forgets them too: a call it still makes
 * from a later key destructor must not find a stream that another thread's
 * first call may free meanwhile (tp__stream_take_lost). */
static void bound_exit(void *arg) {
  tp__stream **here = arg;
  for (int d = 0; d < TP_MAX_DEVICES; d++) {
    if (!here[d])
      continue;
    for (unsigned way = 0; way < TLS_WAYS; way++)
      if (foreign_cache.stream[way] == here[d]) {
        foreign_cache.handle[way] = NULL;
        foreign_cache.stream[way] = NULL;
      }
    bound_lose(here[d]);
  }
  free(here);
}

static void bound_key_make(void) {
  bound_key_made = pthread_key_create(&bound_key, bound_exit) == 0;
}

/* Where the key or its array cannot be made, such streams stay until a
 * device synchronize, as before. A stream the thread first met while it
 * captured, and so without its name (see bound_mine), goes once the
 * stream is met under its name. */
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
  tp__stream *old = here[s->device];
  here[s->device] = s;
  if (old && old != s && (old->uid & TP_STREAM_UNNAMED))
    bound_lose(old);
}

/* The calling thread's per-thread stream of d's device as met before,
 * where the platform described it without a name: while it captures, the
 * platform cannot ask the stream's id without ending the capture. Under
 * reg_lock. */
static tp__stream *bound_mine(const tp__stream_desc *d) {
  pthread_once(&bound_once, bound_key_make);
  tp__stream **here = bound_key_made ? pthread_getspecific(bound_key) : NULL;
  tp__stream *s = here ? here[d->device] : NULL;
  return s && reg_find_uid(s->uid) == s ? s : NULL;
}

/* A stream tidepool did not make: described by the platform, then found by
 * uid (or, while it captures, by handle, or as the calling thread's own
 * per-thread stream) or registered. */
static tp_error_t adopt(tp_stream_t handle, tp__stream **out) {
  tp__stream_desc d = {0};
  uint64_t gone =
      atomic_load_explicit(&tp__hot.stream_gen, memory_order_acquire);
  TP_FORWARD(tp__platform->stream_adopt(handle, &d));
  if (d.legacy)
    return tp__legacy_get(d.device, out);
  tp__mutex_lock(&reg_lock);
  tp__stream *s = d.uid            ? reg_find_uid(d.uid)
                  : d.thread_bound ? bound_mine(&d)
                                   : reg_find_foreign(handle);
  if (!s && (s = stream_alloc(&d)) != NULL) {
    s->handle = handle;
    /* A stream met first where the platform could not name it keeps a
     * name of its own, outside the platform's (uid 0 is no name). */
    if (!d.uid)
      s->uid = TP_STREAM_UNNAMED | atomic_fetch_add(&unnamed, 1);
    if (!reg_put(s)) {
      free(s);
      s = NULL;
    }
  }
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(!s, TP_ERROR_OUT_OF_MEMORY);
  if (d.uid) {
    foreign_remember(handle, s, gone);
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
  /* A stream of the program's that the generation vouches for is one of
   * the thread's last two as well, until a destruction moves it. */
  bool vouched = false;
  if (foreign_cached(handle, gen, uncaptured, out, idle, &vouched)) {
    if (vouched)
      last_note(handle, *out, gen);
    return TP_SUCCESS;
  }
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

/* ---- destruction and listing ----------------------------------------------
 */

tp_error_t tp__stream_retire(tp__stream *s) {
  TP_RETURN_IF(!s->owned, TP_ERROR_INVALID_VALUE);
  tp__mutex_lock(&reg_lock);
  bool found = !s->retired && reg_has(s);
  if (found) {
    s->retired = true;
    atomic_fetch_add_explicit(&tp__hot.stream_gen, 1, memory_order_release);
  }
  tp__mutex_unlock(&reg_lock);
  TP_RETURN_IF(!found, TP_ERROR_INVALID_VALUE);
  /* The last marker covers every free issued on the stream, so that blocks
   * it cached stay resolvable once the platform stream is gone. */
  tp__blspin_lock(&s->lock);
  tp__marker *m = tp__stream_marker_record(s);
  atomic_store_explicit(&s->dead_syncs, UINT64_MAX, memory_order_relaxed);
  atomic_store_explicit(&s->destroyed, true, memory_order_release);
  tp__blspin_unlock(&s->lock);
  if (m)
    return TP_SUCCESS;
  /* A stream in a capture is not waited for, which would cost the capture
   * its validity (a stream that joined one may go in the middle of it):
   * the frees it made before are left to the next device synchronize, as
   * release's are where no marker can be recorded. */
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  if (tp__platform->capture_status(s->ps, &status, NULL) != TP_SUCCESS ||
      status != TP_CAPTURE_STATUS_NONE)
    return TP_SUCCESS;
  tp_error_t err = tp__platform->stream_synchronize(s->ps);
  tp__stream_mark_done(s, atomic_load(&s->epoch));
  return err == TP_ERROR_ILLEGAL_ADDRESS ? TP_SUCCESS : err;
}

tp_error_t tp__stream_release(tp__stream *s) {
  /* A call that raced the destroy may have freed after retire's marker: a
   * marker recorded now covers those frees too, and should recording fail,
   * the next device synchronize does. */
  tp__blspin_lock(&s->lock);
  (void)tp__stream_marker_record(s);
  tp__stream_lose(s);
  tp__blspin_unlock(&s->lock);
  tp__mutex_lock(&reg_lock);
  (void)reg_drop(s);
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
