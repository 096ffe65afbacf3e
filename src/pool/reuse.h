/* The reuse policy: which free memory a stream may take, in which order,
 * when the pool grows, and when it waits on the host before giving up. The
 * one place that decides it, for small and large blocks alike; blocks.c and
 * slabs.c only carry it out. Called with the pool lock held. */
#ifndef TP_REUSE_H
#define TP_REUSE_H

#include "pool/caches.h"

/* What a decision needs of the pool: its rooms, its policy attributes as
 * read for this call, and what growth is weighed against. */
typedef struct tp__reuse {
  tp__heap *heap;
  tp__slabs *slabs;
  tp__caches *caches;
  tp__mutex *lock;   /* the pool lock, dropped while waiting on the host */
  const bool *gone;  /* the pool was torn down meanwhile */
  uint32_t *waiters; /* counts the allocations in wait_pending */
  const _Atomic uint64_t *used_high;
  bool follow_events, opportunistic, internal_deps, oom_wait;
  uint64_t growth_slack; /* parts per million */
} tp__reuse;

/* Chunks move (tens of microseconds each on a GPU, as much as making one)
 * only once the pool would otherwise hold more than its growth slack above
 * the peak of what its users asked for (TP_POOL_ATTR_GROWTH_SLACK, parts per
 * million): 1/256 by default. At 1/64 the bundled traces replayed 0.1-0.8%
 * higher (t5_train 1.0156 against 1.0038, llama_train 1.0059 against
 * 1.0050, above expandable_segments' live 1.0053) for about four fewer
 * chunk moves a step; a GPT training loop stops moving at 1/40. */
#define TP_GROWTH_SLACK_DEFAULT 3906u /* 1/256 */
#define TP_GROWTH_SLACK_MAX 1000000u

/* A large block of at least `size` bytes for stream `a`, out of the bins,
 * through every step of the order (growth only when `grow`). Its tag says
 * when other streams may use its bytes (blocks.h). OUT_OF_MEMORY, PLATFORM,
 * or INVALID_VALUE when the pool was torn down during a host wait. */
tp_error_t tp__reuse_large(const tp__reuse *r, tp__stream *a, size_t size,
                           bool grow, tp__block **out);
/* Up to `want` small blocks of class `cls` for `a` into out[]; returns how
 * many, or 0 with the reason in *err. */
uint32_t tp__reuse_small(const tp__reuse *r, tp__stream *a, unsigned cls,
                         tp__centry *out, uint32_t want, tp_error_t *err);

#endif /* TP_REUSE_H */
