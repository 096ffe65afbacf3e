/* Internal helpers shared by every layer: error-path macros, locks, debug
 * assertions and small utilities. Nothing here knows about pools or
 * platforms. */
#ifndef TP_COMMON_H
#define TP_COMMON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tidepool.h"

/* Error paths, one readable line each. */
#define TP_RETURN_IF(cond, err)                                                \
  do {                                                                         \
    if (cond)                                                                  \
      return (err);                                                            \
  } while (0)

#define TP_FORWARD(expr)                                                       \
  do {                                                                         \
    tp_error_t tp_fwd_err_ = (expr);                                           \
    if (tp_fwd_err_ != TP_SUCCESS)                                             \
      return tp_fwd_err_;                                                      \
  } while (0)

#define TP_LIKELY(x) __builtin_expect(!!(x), 1)

/* Thread-local data that the allocation fast path reads. The initial-exec
 * model makes each access one load off the thread pointer, where the
 * default model of a shared library calls __tls_get_addr (14 calls, a fifth
 * of a same-stream pair's instructions, before). The price is static TLS,
 * which a library loaded by dlopen takes from glibc's small surplus: keep
 * the library's whole TLS well under 512 bytes (mimalloc and jemalloc do the
 * same). */
#define TP_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* For the allocation fast path (pool/alloc.h, api/alloc.c), which must be
 * inlined whole whatever the optimisation level's size heuristics say: at
 * -O2 they left four calls in a pair. */
#define TP_ALWAYS_INLINE inline __attribute__((always_inline))
#define TP_NOINLINE __attribute__((noinline))

/* Invariant checks: active in debug builds (TP_DEBUG), free otherwise. A
 * failed check prints where and aborts, so that a bug stops where it is. */
#ifdef TP_DEBUG
#define TP_CHECK(cond)                                                         \
  do {                                                                         \
    if (TP_UNLIKELY(!(cond)))                                                  \
      tp__check_failed(#cond, __FILE__, __LINE__);                             \
  } while (0)
#else
#define TP_CHECK(cond) ((void)0)
#endif
_Noreturn void tp__check_failed(const char *what, const char *file, int line);

static inline size_t tp__align_up(size_t v, size_t a) {
  return (v + a - 1) & ~(a - 1);
}
static inline uint64_t tp__max_u64(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

/* Raises *high to v if v is larger (a watermark, a completed epoch). The
 * raise is a release, so that a reader who acquires the new value also sees
 * what the raiser saw before it: the completion of a free's work, say. */
static inline void tp__atomic_max(_Atomic uint64_t *high, uint64_t v) {
  uint64_t cur = atomic_load_explicit(high, memory_order_relaxed);
  while (v > cur &&
         !atomic_compare_exchange_weak_explicit(
             high, &cur, v, memory_order_release, memory_order_relaxed)) {
  }
}

/* Makes room for one more element in a growable array (doubling); false
 * when memory is short, with the array unchanged. */
bool tp__array_room(void **arr, uint32_t n, uint32_t *cap, size_t elem);
#define TP_ARRAY_ROOM(arr, n, cap)                                             \
  tp__array_room((void **)&(arr), (n), &(cap), sizeof *(arr))

/* Reads an environment variable as an unsigned size with an optional K, M,
 * G or T suffix (powers of 1024). Returns `fallback` when unset; sets *bad
 * when set but unparsable. */
uint64_t tp__env_size(const char *name, uint64_t fallback, bool *bad);
/* Reads an environment variable as a plain decimal count from 0 to `max`.
 * Returns `fallback` when unset; sets *bad (and returns `fallback`) when it
 * does not parse or is above `max`. */
uint64_t tp__env_count(const char *name, uint64_t fallback, uint64_t max,
                       bool *bad);
/* Reports on stderr that variable `name` has a value that does not parse
 * (`expected` says what would) and is ignored. */
void tp__env_warn(const char *name, const char *expected);

#endif /* TP_COMMON_H */
