/* Stream order as the allocator sees it: streams with an identity that
 * survives handle reuse, the epochs that date each free, markers (platform
 * events recorded lazily) that say when a free completed, the clocks that
 * events carry between streams, and the legacy default stream's implicit
 * order. Knows nothing of pools: the layers above ask it whether work
 * issued now on one stream is ordered after a tagged free. */
#ifndef TP_STREAM_H
#define TP_STREAM_H

#include <pthread.h>

#include "common/common.h"
#include "common/lock.h"
#include "platform/platform.h"

#define TP_MAX_DEVICES 16

typedef struct tp__stream tp__stream;
typedef struct tp__cache tp__cache; /* the pool layer's, kept per stream */

/* ---- dependency clocks --------------------------------------------------
 * A clock maps a stream uid to the newest epoch of that stream a holder is
 * known to follow. Keys with TP_CLOCK_LEGACY set name a device's legacy
 * barrier sequence instead: "follows every free of a blocking stream of that
 * device issued before legacy operation n". */
#define TP_CLOCK_LEGACY (UINT64_C(1) << 63)
typedef struct tp__clock_entry {
  uint64_t key;
  uint64_t value;
} tp__clock_entry;
typedef struct tp__clock {
  tp__clock_entry *v;
  uint32_t n, cap;
} tp__clock;

/* Where a free happened: frees on `stream` with epoch <= the stream's done
 * epoch have completed. lseq is the device's legacy sequence at the free. */
typedef struct tp__tag {
  tp__stream *stream; /* NULL: completed, usable by anyone */
  uint64_t epoch;
  uint64_t lseq;
} tp__tag;

/* A platform event recorded on a stream: when it completes, every free on
 * the stream with epoch <= `epoch` has completed. Host waiters hold a
 * reference so that the event is not re-recorded under them. */
typedef struct tp__marker {
  tp__pevent *ev;
  uint64_t epoch;
  int refs; /* guarded by the stream's lock */
  bool listed;
} tp__marker;

/* Aligned to cache lines, like each stream's caches, so that threads on
 * different streams write no line in common. */
struct tp__stream {
  _Alignas(64) uint64_t uid;
  bool legacy;
  bool owned; /* made by tp_stream_create */
  /* Destroyed and not yet released: still in the registry, so that its
   * handle is refused rather than adopted as a stream made elsewhere.
   * Under the registry's lock. */
  bool retired;
  /* Where the stream is in the registry's list, and when it was registered
   * (a count), which tells the foreign stream met last under a handle that
   * several had. Under the registry's lock. */
  uint32_t reg_at;
  tp_stream_t handle;
  uint64_t reg_seq;
  _Atomic int refs;
  _Atomic bool destroyed;
  /* Its platform stream is destroyed (tp__stream_release): no marker may
   * be recorded on it, nor the stream asked. */
  _Atomic bool released;
  /* The capture tp_stream_begin_capture began here last: the driver names
   * a capture only while it is active, and one that failed must still be
   * found to give back its memory. Read and written by the graph layer. */
  _Atomic uint64_t capture_id;
  /* Device synchronizes begun before the stream was released, when no call
   * that found it before its destruction can still queue work on it: one
   * begun after covers all its work (tp__stream_settles). UINT64_MAX from
   * its destruction until then. */
  _Atomic uint64_t dead_syncs;

  /* One line holds what every allocation and free on the stream reads:
   * the lock, the epoch, the cache used last, and the fields that never
   * change after creation. */
  _Alignas(64) tp__blspin lock; /* guards the mutable fields below, and the
                                   stream's caches */
  _Atomic uint64_t epoch;       /* epoch given to frees issued now */
  /* The legacy stream's latest tag given (tp__stream_legacy_fence); 0 on
   * other streams. */
  _Atomic uint64_t last_tag;
  /* The pool layer's cache used last; under `lock`, never read here. */
  tp__cache *hint;
  tp__pstream *ps;
  bool thread_bound; /* ps names the calling thread's own (platform.h) */
  /* A per-thread stream whose thread ended without a marker on it: the
   * next marker wanted is recorded on its device's legacy stream, which
   * orders after all the stream's work (order.c, fence_record). */
  bool fence_wanted;
  int device;
  unsigned flags;
  _Atomic uint64_t done_epoch; /* frees with epoch <= this completed */
  /* The same as far as anyone has seen, polling included: at least
   * done_epoch. Only the opportunistic policy may act on what polling
   * alone found (tp__stream_poll); the others wait for a synchronization,
   * a query, or a wait of the host (done_epoch). */
  _Atomic uint64_t seen_epoch;
  tp__marker **markers; /* recorded, not yet seen complete */
  uint32_t nmarkers, capmarkers;
  tp__marker **spare; /* recycled markers with their events */
  uint32_t nspare, capspare;
  tp__clock clock;
  /* The pool layer's caches of this stream, one per pool it allocated or
   * freed in; under `lock`, never read here. */
  tp__cache *caches;
};

/* ---- streams ------------------------------------------------------------- */
tp_error_t tp__streams_init(void);
/* Resolves a user stream handle (NULL: the current device's legacy stream).
 * The stream stays valid until the caller's call returns unless the user
 * destroys it concurrently, which CUDA leaves undefined as well. */
static inline tp_error_t tp__stream_get(tp_stream_t handle, tp__stream **out);
tp_error_t tp__stream_create(unsigned flags, tp_stream_t *handle);
/* Destruction in two steps, so that the pool layer can give back the
 * stream's caches in between: retire marks the stream retired (its handle
 * refused from then on) and records a last marker covering every free
 * issued on it so far; release, once no call that found the stream before
 * can still be inside (the caller retires it through the guard), records
 * one more marker for the frees such calls made after the first, takes the
 * stream out of the registry, destroys the platform stream and drops the
 * registry's reference. */
tp_error_t tp__stream_retire(tp__stream *s);
tp_error_t tp__stream_release(tp__stream *s);
void tp__stream_unref(tp__stream *s);
static inline void tp__stream_ref(tp__stream *s) {
  atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}
/* A lost stream taken out of the registry, with its reference: another's
 * that its owner destroyed, found so (order.c, tp__stream_still_named), or a
 * per-thread default stream whose thread ended (bound_exit); NULL when none
 * waits. The caller drops what the pools keep for it, then unrefs. */
tp__stream *tp__stream_take_lost(void);
/* Every live stream of a device (or all devices when device < 0), with a
 * reference each; the caller unrefs each and frees the array. */
tp_error_t tp__streams_list(int device, tp__stream ***out, size_t *n);

/* ---- the order of frees ----------------------------------------------------
 */
bool tp__stream_done(const tp__tag *t);
/* Queries markers (recording one where none covers the tag); true when the
 * tagged free has completed. What it finds is kept for the opportunistic
 * policy alone (seen_epoch). */
bool tp__stream_poll(const tp__tag *t);
/* Waits on the host for the tagged free. */
tp_error_t tp__stream_wait_host(const tp__tag *t);
/* Makes `waiter` wait for the tagged free, on the device side. */
tp_error_t tp__stream_make_wait(tp__stream *waiter, const tp__tag *t);
/* True when work issued now on `a` is ordered after the tagged free through
 * recorded events or the legacy default stream. */
bool tp__stream_follows(tp__stream *a, const tp__tag *t);
/* The one rule of what a stream may take without a new dependency: a free
 * that completed, that was its own, or, when `follow_events`, one it is
 * ordered after through events or the legacy stream. */
static inline bool tp__stream_may_use(tp__stream *a, const tp__tag *t,
                                      bool follow_events) {
  return !t->stream || t->stream == a || tp__stream_done(t) ||
         (follow_events && tp__stream_follows(a, t));
}
/* The stream's queued work has completed (after a synchronize). */
void tp__stream_mark_done(tp__stream *s, uint64_t epoch);
uint64_t tp__stream_advance(tp__stream *s);
/* As tp__stream_advance, for work that another stream may later have to
 * follow while this one captures (when no marker can be recorded on it):
 * a marker is recorded behind the work now, where the platform allows. */
uint64_t tp__stream_advance_marked(tp__stream *s);
/* Device synchronize bookkeeping: tp_device_synchronize takes a ticket
 * before it waits and reports it once the device's work completed, so that
 * the frees of a stream destroyed before the ticket count as known complete
 * (tp__stream_dead_done). */
uint64_t tp__device_sync_begin(int device);
void tp__device_sync_done(int device, uint64_t ticket);
/* Whether the free of tag `t`, on a destroyed stream, is known complete: a
 * device synchronize begun after the destroy has returned, or an event
 * synchronize covered it (tp__stream_note_dead_done). Marks the stream done
 * as far as that shows. */
bool tp__stream_dead_done(const tp__tag *t);
/* An event synchronize showed frees up to `epoch` of the stream `uid`
 * complete, but found no live stream of that uid: kept for the tags of
 * the destroyed stream. */
void tp__stream_note_dead_done(uint64_t uid, uint64_t epoch);
/* Whether the tagged free is known complete: done, or found so by polling
 * its stream's markers where `poll` (the opportunistic policy, which may
 * take what completed unseen). A destroyed stream is no longer asked by any
 * synchronize, so a device synchronize after its destroy settles it (the
 * fuzzer's destroyed-stream findings: never released, and released early
 * with opportunistic reuse off). */
static inline bool tp__stream_settles(const tp__tag *t, bool poll) {
  return tp__stream_done(t) || (poll && tp__stream_poll(t)) ||
         (atomic_load_explicit(&t->stream->destroyed, memory_order_acquire) &&
          tp__stream_dead_done(t));
}
/* Drops a tag and the reference it holds on its stream. */
static inline void tp__tag_clear(tp__tag *t) {
  if (t->stream)
    tp__stream_unref(t->stream);
  *t = (tp__tag){0};
}

/* The calling thread's current device (tp_set_device). */
int tp__current_device(void);
void tp__set_current_device(int device);

/* Legacy-stream bookkeeping around work queued on a device's NULL stream;
 * `queued`: the platform took the work. */
void tp__legacy_begin(int device);
void tp__legacy_end(int device, bool queued);
/* A device's count of legacy operations begun (tp__legacy_begin), which
 * every free on a blocking stream reads: on a line of its own. */
typedef struct tp__legacy_word {
  _Alignas(64) _Atomic uint64_t seq;
} tp__legacy_word;
extern tp__legacy_word tp__legacy_seqs[TP_MAX_DEVICES];
static inline uint64_t tp__legacy_seq(int device) {
  return atomic_load_explicit(&tp__legacy_seqs[device].seq,
                              memory_order_acquire);
}

/* The tag of a free issued now on `s`. Frees on the legacy stream and on
 * blocking streams note the legacy sequence: a legacy operation issued after
 * the free orders it before the later work of every blocking stream. */
static inline tp__tag tp__stream_tag(tp__stream *s) {
  tp__tag t = {s, atomic_load_explicit(&s->epoch, memory_order_relaxed), 0};
  if (!(s->flags & TP_STREAM_NON_BLOCKING)) {
    t.lseq = tp__legacy_seq(s->device);
    if (TP_UNLIKELY(s->legacy))
      tp__atomic_max(&s->last_tag, t.epoch);
  }
  return t;
}
/* Before a query or synchronize of the legacy stream whose answer covers
 * only its own queue (platform.h): the tags given on it since, which
 * follow its device's blocking streams' earlier work, get a marker there
 * (an action, which waits for that work, as the driver's own free on the
 * stream would have been), so that the answer covers them: one that covers
 * the latest tag already is used again. Recorded at the question rather
 * than at each free (a driver call on every free of a PyTorch program,
 * whose default stream this is), it also follows what the blocking streams
 * queued after the frees, which the answer then waits for. On a blocking
 * stream whose answer misses the legacy work its frees follow
 * (tp__stream_misses_legacy) a marker is recorded all the same. False
 * where one was needed and could not be recorded. */
bool tp__stream_legacy_fence(tp__stream *s, uint64_t epoch);
/* Whether s is a blocking stream whose own answer (query, poll,
 * synchronize) does not cover the legacy work queued before its frees,
 * which they follow as an action there would (platform.h: cuda). Its frees
 * are known complete only once the device's legacy stream is also seen
 * idle (tp__stream_legacy_idle) or a marker on s, which waits for that
 * work, has completed. */
bool tp__stream_misses_legacy(const tp__stream *s);
/* Whether the device's legacy stream has run everything queued on it. */
bool tp__stream_legacy_idle(int device);

/* ---- events ----------------------------------------------------------------
 */
typedef struct tp__event tp__event;
tp_error_t tp__event_create(tp_event_t *out);
tp_error_t tp__event_get(tp_event_t handle, tp__event **out);
tp_error_t tp__event_destroy(tp__event *e);
tp_error_t tp__event_record(tp__event *e, tp__stream *s);
tp_error_t tp__event_wait(tp__stream *s, tp__event *e);
tp_error_t tp__event_query(tp__event *e);
/* Whether the event was ever recorded outside a capture. */
bool tp__event_recorded(const tp__event *e);
/* Waits for the event (through `wait` where it is not NULL: a wait that
 * should cover the event's work, answering SUCCESS or ILLEGAL_ADDRESS once
 * it finished; the event is then asked, and waited for where it has not
 * completed), then marks done the work its clock covers on each stream;
 * those streams are returned with a reference each (the caller unrefs them
 * and frees the array), so that the layers above can settle what
 * completed; one NULL, where no live stream is listed, stands for streams
 * destroyed since. */
tp_error_t tp__event_synchronize(tp__event *e, tp_error_t (*wait)(void *arg),
                                 void *arg, tp__stream ***done, size_t *n);
/* What s's work waits for on other streams so far (its clock, without its
 * own entry), copied into *out; false, with *out empty, for want of memory.
 * Taken before a synchronize of s, it is what the synchronize covers. */
bool tp__stream_followed(tp__stream *s, tp__clock *out);
/* The work a completed clock covers is done: marks each stream in it done,
 * returned as tp__event_synchronize returns them. Frees *c. */
tp_error_t tp__clock_settle(tp__clock *c, tp__stream ***done, size_t *n);

/* The fast path of tp__stream_get: the two handles the thread resolved
 * last ([0] the latest), while no stream was destroyed since (a generation
 * count that every destruction bumps); two, so that a thread alternating
 * between two streams finds both. Only the core's own streams take it:
 * another's handle may name a new stream at any time. */
typedef struct tp__stream_last {
  tp_stream_t handle[2];
  tp__stream *stream[2];
  uint64_t gen; /* tp__hot.stream_gen then */
} tp__stream_last;
extern TP_TLS tp__stream_last tp__stream_last_used;
/* The legacy stream of the thread's current device, once it was made (NULL
 * before): what a NULL handle names, read without a call. Legacy streams
 * live as long as the process. */
extern TP_TLS tp__stream *tp__legacy_here;
/* The stream `handle` names where the thread can tell it without a call
 * (the legacy stream for NULL, or one of its last two, where no stream
 * was destroyed since: tidepool's own, or one of the program's whose
 * destruction the interposer saw); NULL otherwise. */
static inline tp__stream *tp__stream_quick(tp_stream_t handle) {
  tp__stream_last *l = &tp__stream_last_used;
  if (handle == NULL)
    return tp__legacy_here;
  if (TP_UNLIKELY(l->gen != atomic_load_explicit(&tp__hot.stream_gen,
                                                 memory_order_acquire)))
    return NULL;
  if (TP_LIKELY(l->handle[0] == handle))
    return l->stream[0];
  return l->handle[1] == handle ? l->stream[1] : NULL;
}
/* `idle`, where not NULL, is set when resolving the stream showed that it
 * does not capture, so that the caller need not ask again. `uncaptured`:
 * the caller knows that nothing captures, and no capture question is
 * asked (a stream met before is still told from a new one by its uid). */
tp_error_t tp__stream_get_slow(tp_stream_t handle, bool uncaptured,
                               tp__stream **out, bool *idle);
/* Resolves a handle as tp__stream_get does, with the rest as above. */
static inline tp_error_t tp__stream_resolve(tp_stream_t handle, bool uncaptured,
                                            tp__stream **out, bool *idle) {
  *idle = false;
  tp__stream *s = tp__stream_quick(handle);
  if (TP_LIKELY(s != NULL)) {
    *out = s;
    return TP_SUCCESS;
  }
  return tp__stream_get_slow(handle, uncaptured, out, idle);
}
static inline tp_error_t tp__stream_get(tp_stream_t handle, tp__stream **out) {
  bool idle;
  return tp__stream_resolve(handle, false, out, &idle);
}

#endif /* TP_STREAM_H */
