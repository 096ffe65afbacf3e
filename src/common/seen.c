/* The count of captures under way that tidepool saw begin (seen.h): a list
 * of their ids and streams, short since captures are few at a time, under
 * one lock taken only by begins and ends. A miscount must only ever be too
 * high (the allocation then asks, as it would unwatched): every doubt
 * leaves a capture counted. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hot.h"
#include "common/seen.h"

typedef struct {
  uint64_t key, id;
} seen_capture;

static _Atomic bool watched;
static _Atomic uint32_t under_way;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static seen_capture *list;
static size_t n, cap;

void tp__seen_watch(void) {
  atomic_store_explicit(&watched, true, memory_order_release);
}

static _Atomic(const char *) unwatched_why;
static _Atomic bool streams_watched;

/* The streams' trust goes too, and the generation moves once more, so that
 * no stream vouched for before stays in a thread's caches. */
void tp__seen_unwatch(const char *why) {
  static atomic_flag once = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&once))
    return;
  atomic_store_explicit(&unwatched_why, why, memory_order_release);
  /* Cleared for a platform chosen after this too (select.c reads it). */
  atomic_store_explicit(&streams_watched, false, memory_order_release);
  atomic_fetch_add(&under_way, 1);
  atomic_store_explicit(&tp__hot.foreign_watched, false, memory_order_release);
  atomic_fetch_add(&tp__hot.stream_gen, 1);
}

/* TIDEPOOL_CAPTURES=ask: every call asks, whatever is watched. */
static bool asked_always(void) {
  const char *want = getenv("TIDEPOOL_CAPTURES");
  return want && strcmp(want, "ask") == 0;
}

const _Atomic uint32_t *tp__seen_counter(void) {
  if (asked_always())
    return NULL;
  const char *want = getenv("TIDEPOOL_CAPTURES");
  if (want && strcmp(want, "tidepool") == 0)
    tp__seen_watch();
  else if (want && *want)
    fprintf(stderr,
            "tidepool: TIDEPOOL_CAPTURES=%s is neither tidepool nor ask; "
            "ignored\n",
            want);
  return atomic_load_explicit(&watched, memory_order_acquire) ? &under_way
                                                              : NULL;
}

void tp__seen_state(bool *counted, bool *streams_seen, const char **why) {
  *why = atomic_load_explicit(&unwatched_why, memory_order_acquire);
  /* What the platform took when it was chosen (select.c), not what the
   * environment says now. */
  *counted = tp__hot.captures_active == &under_way && !*why;
  *streams_seen =
      atomic_load_explicit(&tp__hot.foreign_watched, memory_order_acquire);
}

static pthread_mutex_t capture_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static TP_TLS unsigned capture_depth;

void tp__seen_capture_lock(void) {
  pthread_mutex_lock(&capture_lock);
  capture_depth++;
}

void tp__seen_capture_unlock(void) {
  capture_depth--;
  pthread_mutex_unlock(&capture_lock);
}

bool tp__seen_capture_held(void) {
  return capture_depth > 0;
}

void tp__seen_begin(void) {
  atomic_fetch_add(&under_way, 1);
}

/* A capture that finds no room in the list is never taken out: it stays
 * counted. */
void tp__seen_began(bool ok, uint64_t key, uint64_t id, bool one_stream) {
  if (!ok) {
    atomic_fetch_sub(&under_way, 1);
    return;
  }
  pthread_mutex_lock(&lock);
  /* Ends that could not tell which capture they ended (an invalidated one
   * whose id was never known, or two listed under one key) leave stale
   * entries; a new capture of the same stream proves them over. */
  for (size_t i = 0; one_stream && i < n;) {
    if (list[i].key != key) {
      i++;
      continue;
    }
    list[i] = list[--n];
    atomic_fetch_sub(&under_way, 1);
  }
  if (n == cap) {
    size_t want = cap ? cap * 2 : 8;
    seen_capture *grown = realloc(list, want * sizeof *grown);
    if (grown) {
      list = grown;
      cap = want;
    }
  }
  if (n < cap)
    list[n++] = (seen_capture){key, id};
  pthread_mutex_unlock(&lock);
}

/* Only a capture known by its id goes: an end that found its stream in no
 * capture, or in one whose id the driver did not tell, takes nothing out
 * (the key alone is no proof: the per-thread stream's key is the same in
 * every context of a thread, and a later thread may get it again), but
 * for an end that ended an invalidated capture, which its stream began:
 * then the one capture listed under the key is that one. */
uint64_t tp__seen_ended(uint64_t key, uint64_t before, bool after,
                        bool invalidated) {
  if (after || (!before && !invalidated))
    return 0;
  pthread_mutex_lock(&lock);
  /* A capture may be listed more than once (one begin seen at two of the
   * interposer's entries, as over the fake driver's per-thread variants):
   * one entry goes per end, and entries of one capture are no ambiguity. */
  size_t at = n;
  bool ambiguous = false;
  for (size_t i = 0; i < n; i++) {
    if (list[i].key != key || (before && list[i].id != before))
      continue;
    if (at == n)
      at = i;
    else if (list[i].id != list[at].id)
      ambiguous = true;
  }
  uint64_t id = 0;
  if (at < n && !ambiguous) {
    id = list[at].id;
    list[at] = list[--n];
    atomic_fetch_sub(&under_way, 1);
  }
  pthread_mutex_unlock(&lock);
  return id;
}

/* ---- streams of others ------------------------------------------------ */

void tp__seen_watch_streams(void) {
  atomic_store_explicit(&streams_watched, true, memory_order_release);
}

bool tp__seen_streams_watched(void) {
  return !asked_always() &&
         atomic_load_explicit(&streams_watched, memory_order_acquire);
}

void tp__seen_streams_change(void) {
  atomic_fetch_add(&tp__hot.stream_gen, 1);
}
