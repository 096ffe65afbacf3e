/* Events (stream.h): the table of live events, and the dependency clock
 * each carries from the stream it was last recorded on to whoever waits on
 * it, which is how reuse follows events. */
#include "stream/clock.h"
#include "stream/stream_internal.h"

#include "common/guard.h"
#include "common/ptable.h"

/* ---- events -----------------------------------------------------------------
 * An event carries, besides its platform event, the clock of the stream it
 * was last recorded on: whoever waits on it inherits those dependencies. */
#define TP_EVENT_MAGIC 0x74706576u
struct tp__event {
  uint32_t magic;
  int device;
  tp_event_t handle;
  tp__pevent *pe;
  tp__spin lock;
  tp__clock clock;
  /* Held around each record (its clock made, the platform's record, the
   * clock installed) and each wait's copy and platform wait, so that the
   * clock a waiter takes is that of the record the platform waits for; a
   * synchronize, which cannot hold it through its wait, compares `records`
   * (counted under it) before and after. */
  tp__mutex order;
  uint64_t records;
  /* Recorded outside a capture at least once: a capture may wait on an
   * event never recorded, which orders nothing, as the driver allows. */
  _Atomic bool recorded;
};

static tp__mutex ev_lock = TP_MUTEX_INIT(TP_RANK_EVENT_TABLE);
/* The live events by handle, so that resolving one costs the same with a
 * hundred thousand live events as with ten. Under ev_lock. */
static uint64_t event_key(const void *e) {
  return (uint64_t)(uintptr_t)((const tp__event *)e)->handle;
}
static tp__ptable events = TP_PTABLE_INIT(event_key);

/* An event's handle is a number never given out before, not its address:
 * the next event made after a destruction often gets that address, and the
 * destroyed event's handle must not name it. Its low bits (8) are none that
 * the host platform's stream handles (a number times 16) have, so that a
 * stream's handle passed for an event is refused, not taken for another. */
static _Atomic uint64_t handles_made;

tp_error_t tp__event_create(tp_event_t *out) {
  tp__event *e = calloc(1, sizeof *e);
  TP_RETURN_IF(!e, TP_ERROR_OUT_OF_MEMORY);
  tp__spin_init(&e->lock, TP_RANK_EVENT);
  tp__mutex_init(&e->order, TP_RANK_EVENT_ORDER);
  e->magic = TP_EVENT_MAGIC;
  e->device = tp__current_device();
  e->handle =
      (tp_event_t)(uintptr_t)(((atomic_fetch_add(&handles_made, 1) + 1) << 4) |
                              8);
  tp_error_t err = tp__platform->event_create(e->device, &e->pe);
  if (err != TP_SUCCESS) {
    tp__mutex_destroy(&e->order);
    free(e);
    return err;
  }
  tp__mutex_lock(&ev_lock);
  bool ok = tp__ptable_room(&events);
  if (ok)
    tp__ptable_put(&events, e);
  tp__mutex_unlock(&ev_lock);
  if (!ok) {
    (void)tp__platform->event_destroy(e->pe);
    tp__mutex_destroy(&e->order);
    free(e);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  *out = e->handle;
  return TP_SUCCESS;
}

tp_error_t tp__event_get(tp_event_t handle, tp__event **out) {
  TP_RETURN_IF(!handle, TP_ERROR_INVALID_VALUE);
  tp__mutex_lock(&ev_lock);
  size_t at = SIZE_MAX;
  tp__event *e = tp__ptable_next(&events, (uint64_t)(uintptr_t)handle, &at);
  tp__mutex_unlock(&ev_lock);
  TP_RETURN_IF(!e, TP_ERROR_INVALID_VALUE);
  *out = e;
  return TP_SUCCESS;
}

/* Frees an event no thread can reach any more. */
static void event_free(void *arg) {
  tp__event *e = arg;
  (void)tp__platform->event_destroy(e->pe);
  tp__clock_free(&e->clock);
  tp__mutex_destroy(&e->order);
  free(e);
}

/* The event stops answering at once; its memory and platform event go once
 * no thread is inside a call that found it before (common/guard.h). */
tp_error_t tp__event_destroy(tp__event *e) {
  tp__mutex_lock(&ev_lock);
  bool found = tp__ptable_drop(&events, e);
  tp__mutex_unlock(&ev_lock);
  TP_RETURN_IF(!found, TP_ERROR_INVALID_VALUE);
  tp__guard_retire(e, event_free);
  return TP_SUCCESS;
}

tp_error_t tp__event_record(tp__event *e, tp__stream *s) {
  TP_RETURN_IF(s->device != e->device, TP_ERROR_INVALID_VALUE);
  tp__clock c = {0};
  bool ok = true;
  /* A blocking stream's work follows the legacy stream's earlier work, and
   * through it the earlier work of every blocking stream of the device; of
   * the legacy stream's frees, those issued before its last operation (the
   * fuzzer's legacy-free-event). */
  if (!s->legacy && !(s->flags & TP_STREAM_NON_BLOCKING)) {
    tp__stream *l = NULL;
    if (tp__legacy_get(s->device, &l) == TP_SUCCESS)
      ok = tp__clock_raise(&c, l->uid, tp__legacy_settled(s->device, true));
    ok = ok && tp__clock_raise(&c, TP_CLOCK_LEGACY | (uint64_t)s->device,
                               tp__legacy_settled(s->device, false));
  } else if (s->legacy) {
    /* The record is itself legacy operation n, which follows the frees of
     * blocking streams issued before it began: those with lseq < n (one
     * more claimed a free issued just after, the fuzzer's
     * legacy-event-clock). */
    ok = tp__clock_raise(&c, TP_CLOCK_LEGACY | (uint64_t)s->device,
                         tp__legacy_seq(s->device));
  }
  tp__mutex_lock(&e->order);
  e->records++;
  tp__blspin_lock(&s->lock);
  uint64_t epoch =
      atomic_fetch_add_explicit(&s->epoch, 1, memory_order_relaxed);
  ok = ok && tp__clock_merge(&c, &s->clock) &&
       tp__clock_raise(&c, s->uid, epoch);
  tp__blspin_unlock(&s->lock);
  tp_error_t err =
      ok ? tp__platform->event_record(e->pe, s->ps) : TP_ERROR_OUT_OF_MEMORY;
  tp__clock old = c;
  if (err == TP_SUCCESS) {
    tp__spin_lock(&e->lock);
    old = e->clock;
    e->clock = c;
    tp__spin_unlock(&e->lock);
    atomic_store_explicit(&e->recorded, true, memory_order_release);
  }
  tp__mutex_unlock(&e->order);
  tp__clock_free(&old);
  return err;
}

bool tp__event_recorded(const tp__event *e) {
  return atomic_load_explicit(&e->recorded, memory_order_acquire);
}

static bool event_clock_copy(tp__event *e, tp__clock *out) {
  tp__spin_lock(&e->lock);
  bool ok = tp__clock_merge(out, &e->clock);
  tp__spin_unlock(&e->lock);
  return ok;
}

tp_error_t tp__event_wait(tp__stream *s, tp__event *e) {
  tp__clock c = {0};
  tp__mutex_lock(&e->order);
  bool copied = event_clock_copy(e, &c);
  tp_error_t err = copied ? tp__platform->stream_wait_event(s->ps, e->pe)
                          : TP_ERROR_OUT_OF_MEMORY;
  tp__mutex_unlock(&e->order);
  if (err == TP_SUCCESS) {
    tp__blspin_lock(&s->lock);
    (void)tp__clock_merge(&s->clock, &c);
    tp__blspin_unlock(&s->lock);
  }
  tp__clock_free(&c);
  return err;
}

tp_error_t tp__event_query(tp__event *e) {
  return tp__platform->event_query(e->pe);
}

/* Once an event or a stream's work completed, every free its clock `c`
 * covers has completed. A stream destroyed since is noted by uid, for its
 * frees' tags; where no live stream is listed, one NULL stands for them
 * all, so that the pools still settle and release (each listed stream
 * makes them settle). Frees `c`. */
tp_error_t tp__clock_settle(tp__clock *c, tp__stream ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  tp__stream **v = malloc((c->n ? c->n : 1) * sizeof *v);
  bool dead = false;
  for (uint32_t i = 0; v && i < c->n; i++) {
    if (c->v[i].key & TP_CLOCK_LEGACY)
      continue;
    tp__stream *s = tp__stream_find_uid(c->v[i].key);
    if (s) {
      tp__stream_mark_done(s, c->v[i].value);
      v[(*n)++] = s;
    } else {
      tp__stream_note_dead_done(c->v[i].key, c->v[i].value);
      dead = true;
    }
  }
  if (v && dead && !*n)
    v[(*n)++] = NULL;
  tp__clock_free(c);
  TP_RETURN_IF(!v, TP_ERROR_OUT_OF_MEMORY);
  *out = v;
  return TP_SUCCESS;
}

bool tp__stream_followed(tp__stream *s, tp__clock *out) {
  *out = (tp__clock){0};
  tp__blspin_lock(&s->lock);
  bool ok = tp__clock_merge(out, &s->clock);
  tp__blspin_unlock(&s->lock);
  for (uint32_t i = 0; ok && i < out->n; i++)
    if (out->v[i].key == s->uid) {
      out->v[i] = out->v[--out->n];
      break;
    }
  if (!ok)
    tp__clock_free(out);
  return ok;
}

tp_error_t tp__event_synchronize(tp__event *e, tp_error_t (*wait)(void *arg),
                                 void *arg, tp__stream ***done, size_t *n) {
  /* The clock is taken before the wait, and kept only where no record came
   * meanwhile: a record by another thread would claim work that the wait
   * did not cover, and one between the copy and the wait would be what the
   * platform waits for instead. */
  tp__clock c = {0};
  tp__mutex_lock(&e->order);
  bool copied = event_clock_copy(e, &c);
  uint64_t records = e->records;
  tp__mutex_unlock(&e->order);
  *done = NULL;
  *n = 0;
  tp_error_t err = wait ? wait(arg) : tp__platform->event_synchronize(e->pe);
  /* The caller's wait may not cover all of the event: where two threads
   * record the application's event and its twin on two streams at once,
   * the two may follow different streams. What it left is waited for. */
  if (wait && err == TP_SUCCESS &&
      tp__platform->event_query(e->pe) == TP_ERROR_NOT_READY)
    err = tp__platform->event_synchronize(e->pe);
  tp__mutex_lock(&e->order);
  copied = copied && e->records == records;
  tp__mutex_unlock(&e->order);
  if (!tp__pevent_finished(err) || !copied) {
    tp__clock_free(&c);
    return err;
  }
  /* The work finished (a fault is still reported); a list that could not be
   * made only means the completion is learnt later, by polling. */
  (void)tp__clock_settle(&c, done, n);
  return err;
}
