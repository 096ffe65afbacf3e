/* The hot line: the shared words that every allocation and free reads,
 * gathered in one cache line. Each field belongs to the room named beside
 * it, which alone writes it, and rarely (when the platform is chosen, an
 * object is retired or a stream destroyed). */
#ifndef TP_HOT_H
#define TP_HOT_H

#include "common/common.h"

struct tp__platform_ops;

/* In a busy process the caches hold the application's data between two of
 * its calls into tidepool, and every line a call reads is then a miss;
 * scattered over the data segment, these words took five lines a call
 * (bench/RESULTS.md, "Lines a call reads"). */
typedef struct tp__hot {
  _Alignas(64) _Atomic uint64_t guard_epoch; /* guard.c: the epoch clock */
  _Atomic uint32_t guard_limbo; /* guard.c: retired objects not yet freed */
  bool fence_expedited;         /* fence.c: the light fence is free */
  /* platform/select.c: the chosen platform's ops, and the count of
   * captures under way (NULL where captures may begin unseen) */
  const struct tp__platform_ops *_Atomic platform;
  const _Atomic uint32_t *captures_active;
  /* stream.c: bumped by each destruction of tidepool's streams; and
   * common/seen.c: before and after each destruction of the program's
   * streams that it sees (common/seen.h) */
  _Atomic uint64_t stream_gen;
  /* platform/select.c: whether every such destruction is seen; cleared
   * for good by common/seen.c where one may not be after all */
  _Atomic bool foreign_watched;
} tp__hot_line;
_Static_assert(sizeof(tp__hot_line) == 64, "the hot words fit in one line");

extern tp__hot_line tp__hot;

/* Whether no capture can be under way: where every capture is seen (the
 * platform's count, or seen.h's), the count of those under way, read on
 * every allocation and free before any question is asked. */
static inline bool tp__no_capture(void) {
  const _Atomic uint32_t *n = tp__hot.captures_active;
  return n && !atomic_load_explicit(n, memory_order_acquire);
}

#endif /* TP_HOT_H */
