/* check.h: what tidepool's plain-C test programs share: assertion macros
 * that count failures and carry on, a seeded PRNG for stress tests, and
 * "gates" that hold a stream so that a test decides when its work completes.
 * Header-only: every test program is one translation unit that includes it. */
#ifndef TP_TEST_CHECK_H
#define TP_TEST_CHECK_H

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tidepool.h"

/* ========================================================================
 * Failure reporting
 * ======================================================================== */

/* Failures are counted, not fatal, so that one run shows all of them. The
 * counter is atomic because stress tests and stream host functions check
 * from several threads. */
static atomic_int check_failures_;

/* A label printed with every failure of the calling thread, such as the row
 * of conformance/driver_answers.txt being checked; NULL for none. */
static _Thread_local const char *check_context_;

static inline void check_context(const char *label) {
  check_context_ = label;
}

static inline int check_failure_count(void) {
  return atomic_load(&check_failures_);
}

static inline void check_fail_(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void check_fail_(const char *file, int line, const char *fmt,
                               ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  atomic_fetch_add(&check_failures_, 1);
  /* One printf per failure keeps lines whole when threads fail together. */
  printf("FAIL %s:%d: %s%s%s%s\n", file, line, check_context_ ? "[" : "",
         check_context_ ? check_context_ : "", check_context_ ? "] " : "", msg);
  fflush(stdout);
}

/* The check functions return 1 when the check held, so that the REQUIRE
 * forms and tests can branch on them. */
static inline int check_true_(const char *file, int line, const char *text,
                              int ok) {
  if (!ok)
    check_fail_(file, line, "CHECK(%s)", text);
  return ok;
}

static inline int check_eq_int_(const char *file, int line, const char *ta,
                                const char *tb, long long a, long long b) {
  if (a == b)
    return 1;
  check_fail_(file, line, "%s == %s: %lld != %lld", ta, tb, a, b);
  return 0;
}

static inline int check_eq_u64_(const char *file, int line, const char *ta,
                                const char *tb, uint64_t a, uint64_t b) {
  if (a == b)
    return 1;
  check_fail_(file, line,
              "%s == %s: %" PRIu64 " (0x%" PRIx64 ") != %" PRIu64 " (0x%" PRIx64
              ")",
              ta, tb, a, a, b, b);
  return 0;
}

static inline int check_eq_ptr_(const char *file, int line, const char *ta,
                                const char *tb, const void *a, const void *b) {
  if (a == b)
    return 1;
  check_fail_(file, line, "%s == %s: %p != %p", ta, tb, a, b);
  return 0;
}

static inline int check_err_(const char *file, int line, const char *text,
                             tp_error_t got, tp_error_t want) {
  if (got == want)
    return 1;
  check_fail_(file, line, "%s returned %s (%d), expected %s (%d)", text,
              tp_error_name(got), (int)got, tp_error_name(want), (int)want);
  return 0;
}

#define CHECK(cond) check_true_(__FILE__, __LINE__, #cond, (cond) ? 1 : 0)
#define CHECK_EQ_INT(a, b)                                                     \
  check_eq_int_(__FILE__, __LINE__, #a, #b, (long long)(a), (long long)(b))
#define CHECK_EQ_U64(a, b)                                                     \
  check_eq_u64_(__FILE__, __LINE__, #a, #b, (uint64_t)(a), (uint64_t)(b))
#define CHECK_EQ_PTR(a, b)                                                     \
  check_eq_ptr_(__FILE__, __LINE__, #a, #b, (const void *)(a),                 \
                (const void *)(b))
#define CHECK_OK(expr) check_err_(__FILE__, __LINE__, #expr, (expr), TP_SUCCESS)
#define CHECK_ERR(expr, want)                                                  \
  check_err_(__FILE__, __LINE__, #expr, (expr), (want))
/* A failure with a message of the test's own making. */
#define CHECK_FAIL(...) check_fail_(__FILE__, __LINE__, __VA_ARGS__)

/* ========================================================================
 * Gates: holding a stream
 *
 * hold_stream() queues a host function on the stream that blocks until the
 * test calls release(): everything queued behind it stays pending, so a
 * free queued there has not completed, for as long as the test wants.
 * The state lives in static slots rather than in the caller's gate_t,
 * because a test that gives up early returns while the stream's thread may
 * still be reading the gate; a slot is recycled only once the host function
 * has left it.
 * ======================================================================== */

#define CHECK_GATE_SLOTS 64
/* A held stream opens by itself after this long, with a failure, so that a
 * broken test or a library that blocks where it must not fails instead of
 * hanging the whole suite. */
#define CHECK_GATE_TIMEOUT_S 30.0

typedef struct check_gate_slot_ {
  atomic_int in_use;  /* taken by a hold whose host function has not left */
  atomic_int open;    /* set by release() */
  atomic_int entered; /* the held stream has reached the gate */
} check_gate_slot_;

static check_gate_slot_ check_gate_slots_[CHECK_GATE_SLOTS];

typedef struct gate {
  int slot; /* index into check_gate_slots_, -1 when not holding */
} gate_t;

static inline double check_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void check_sleep_us(long us) {
  struct timespec ts;
  ts.tv_sec = us / 1000000;
  ts.tv_nsec = (us % 1000000) * 1000;
  nanosleep(&ts, NULL);
}

static inline void check_sleep_ms(long ms) {
  check_sleep_us(ms * 1000);
}

static inline void check_gate_fn_(void *arg) {
  check_gate_slot_ *s = (check_gate_slot_ *)arg;
  atomic_store(&s->entered, 1);
  double deadline = check_now_s() + CHECK_GATE_TIMEOUT_S;
  while (!atomic_load(&s->open)) {
    if (check_now_s() > deadline) {
      check_fail_(__FILE__, __LINE__,
                  "a held stream was never released; opened after %.0f s",
                  CHECK_GATE_TIMEOUT_S);
      break;
    }
    check_sleep_us(100);
  }
  atomic_store(&s->in_use, 0);
}

/* Holds `stream` until release(gate). Returns what tp_launch_host_func
 * returned; on failure the gate holds nothing. */
static inline tp_error_t hold_stream(tp_stream_t stream, gate_t *gate) {
  gate->slot = -1;
  for (int i = 0; i < CHECK_GATE_SLOTS; i++) {
    int expect = 0;
    check_gate_slot_ *s = &check_gate_slots_[i];
    if (!atomic_compare_exchange_strong(&s->in_use, &expect, 1))
      continue;
    atomic_store(&s->open, 0);
    atomic_store(&s->entered, 0);
    tp_error_t err = tp_launch_host_func(stream, check_gate_fn_, s);
    if (err != TP_SUCCESS) {
      atomic_store(&s->in_use, 0);
      return err;
    }
    gate->slot = i;
    return TP_SUCCESS;
  }
  check_fail_(__FILE__, __LINE__, "all %d gate slots are in use",
              CHECK_GATE_SLOTS);
  return TP_ERROR_NOT_READY;
}

/* Lets the held stream go on. Releasing a gate that holds nothing is a
 * no-op, so cleanup paths may call it unconditionally. */
static inline void release(gate_t *gate) {
  if (gate->slot >= 0)
    atomic_store(&check_gate_slots_[gate->slot].open, 1);
  gate->slot = -1;
}

/* Whether the held stream has reached the gate (all work queued before the
 * hold has completed). */
static inline int gate_entered(const gate_t *gate) {
  return gate->slot >= 0 && atomic_load(&check_gate_slots_[gate->slot].entered);
}

/* A gate opened from a thread of its own after `ms` milliseconds, so that
 * a call that should return at once while the stream is held cannot hang
 * the test if it blocks instead: the test measures how long the call took.
 * The opener releases its own copy of the gate; the test may release its
 * copy as well (releasing twice is harmless). */
typedef struct gate_opener {
  pthread_t thread;
  gate_t gate;
  long ms;
} gate_opener_t;

static inline void *gate_opener_main_(void *arg) {
  gate_opener_t *o = (gate_opener_t *)arg;
  check_sleep_ms(o->ms);
  release(&o->gate);
  return NULL;
}

/* Starts the opener; 0 where no thread could be made (nothing held is
 * then opened by it). */
static inline int gate_open_after(gate_opener_t *o, gate_t gate, long ms) {
  o->gate = gate;
  o->ms = ms;
  return pthread_create(&o->thread, NULL, gate_opener_main_, o) == 0;
}

static inline void gate_opener_join(gate_opener_t *o) {
  pthread_join(o->thread, NULL);
}

/* A host function that raises the atomic_int flag it is given. */
static inline void check_set_flag(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

/* Opens every gate, for tests that give up early: a stream left held would
 * block every later synchronize until the gate timeout. */
static inline void release_all_gates(void) {
  for (int i = 0; i < CHECK_GATE_SLOTS; i++)
    if (atomic_load(&check_gate_slots_[i].in_use))
      atomic_store(&check_gate_slots_[i].open, 1);
}

/* ========================================================================
 * REQUIRE: checks after which going on would dereference NULL or test
 * nothing. The plain forms return from the calling void function (after
 * opening every gate); the _EXIT forms end the program.
 * ======================================================================== */

#define REQUIRE_BODY_(ok)                                                      \
  do {                                                                         \
    if (!(ok)) {                                                               \
      release_all_gates();                                                     \
      return;                                                                  \
    }                                                                          \
  } while (0)
#define REQUIRE(cond) REQUIRE_BODY_(CHECK(cond))
#define REQUIRE_OK(expr) REQUIRE_BODY_(CHECK_OK(expr))
#define REQUIRE_ERR(expr, want) REQUIRE_BODY_(CHECK_ERR(expr, want))
#define REQUIRE_EQ_INT(a, b) REQUIRE_BODY_(CHECK_EQ_INT(a, b))
#define REQUIRE_EQ_U64(a, b) REQUIRE_BODY_(CHECK_EQ_U64(a, b))
#define REQUIRE_EQ_PTR(a, b) REQUIRE_BODY_(CHECK_EQ_PTR(a, b))

#define REQUIRE_EXIT_BODY_(ok)                                                 \
  do {                                                                         \
    if (!(ok)) {                                                               \
      printf("stopping: a required check failed\n");                           \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)
#define REQUIRE_EXIT(cond) REQUIRE_EXIT_BODY_(CHECK(cond))
#define REQUIRE_OK_EXIT(expr) REQUIRE_EXIT_BODY_(CHECK_OK(expr))

/* ========================================================================
 * Running tests
 * ======================================================================== */

/* Runs one test function, printing its name before and its verdict after.
 * A test that left a gate closed gets it opened, so that one broken test
 * does not stall the next. */
#define RUN_TEST(fn) check_run_(#fn, fn)

/* Whether `name` is in the comma-separated list `list`. */
static inline int check_listed_(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n == len && strncmp(p, name, n) == 0)
      return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

/* Whether TP_TEST_ONLY (a comma-separated list of test function names, for
 * running a few under a slow tool such as compute-sanitizer) lets `name`
 * run; unset or empty lets every test run. TP_TEST_SKIP, a list of the
 * same kind, leaves tests out (a known failure on one platform). */
static inline int check_selected_(const char *name) {
  const char *only = getenv("TP_TEST_ONLY");
  const char *skip = getenv("TP_TEST_SKIP");
  if (skip && *skip && check_listed_(skip, name))
    return 0;
  return !only || !*only || check_listed_(only, name);
}

static inline void check_run_(const char *name, void (*fn)(void)) {
  if (!check_selected_(name))
    return;
  int before = check_failure_count();
  printf("== %s\n", name);
  fflush(stdout);
  check_context(NULL);
  fn();
  check_context(NULL);
  release_all_gates();
  int failed = check_failure_count() - before;
  if (failed)
    printf("   %s: FAILED (%d)\n", name, failed);
  else
    printf("   %s: ok\n", name);
  fflush(stdout);
}

/* The exit code of a test program that did not run here (no GPU, one
 * device, another platform): CMakeLists.txt gives it to CTest as every
 * test's SKIP_RETURN_CODE, so that a skip is reported as a skip, never as a
 * pass. 77 is the code automake's harness uses for the same. */
#define CHECK_SKIP_CODE 77

/* Prints why the program does not run here; returns the skip code, for
 * main to return. */
static inline int check_skip(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static inline int check_skip(const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("skipped: %s\n", msg);
  fflush(stdout);
  return CHECK_SKIP_CODE;
}

/* Prints the summary; returns the process's exit code. */
static inline int check_done(void) {
  int failed = check_failure_count();
  if (failed)
    printf("%d check(s) FAILED\n", failed);
  else
    printf("all checks passed\n");
  fflush(stdout);
  return failed ? 1 : 0;
}

/* ========================================================================
 * Seeded randomness (splitmix64): small, fast and identical on every
 * platform, so that a printed seed reproduces a run's choices.
 * ======================================================================== */

typedef struct check_rng {
  uint64_t state;
} check_rng;

static inline uint64_t rng_next(check_rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [0, n); n > 0. The modulo bias is below 2^-40 for the small n
 * that tests use. */
static inline uint64_t rng_below(check_rng *r, uint64_t n) {
  return rng_next(r) % n;
}

/* Uniform in [lo, hi], inclusive. */
static inline uint64_t rng_range(check_rng *r, uint64_t lo, uint64_t hi) {
  return lo + rng_below(r, hi - lo + 1);
}

/* True with the given percentage. */
static inline int rng_chance(check_rng *r, unsigned percent) {
  return rng_below(r, 100) < percent;
}

/* A seed from argv[argi] when given, else from the environment variable
 * `env`, else from the clock (printed by the caller, so still reproducible). */
static inline uint64_t check_seed(int argc, char **argv, int argi,
                                  const char *env) {
  const char *s = argi < argc ? argv[argi] : getenv(env);
  if (s && *s)
    return strtoull(s, NULL, 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
}

/* ========================================================================
 * Small helpers
 * ======================================================================== */

/* Whether pool memory may be dereferenced directly by the test: only on the
 * host platform, where device memory is host memory. */
static inline int check_on_host(void) {
  const char *name = tp_platform_name();
  return name && strcmp(name, "host") == 0;
}

/* Polls an event until it completes or `timeout_ms` passes; returns the last
 * answer of tp_event_query. */
static inline tp_error_t check_poll_event(tp_event_t ev, long timeout_ms) {
  double deadline = check_now_s() + (double)timeout_ms / 1000.0;
  for (;;) {
    tp_error_t err = tp_event_query(ev);
    if (err != TP_ERROR_NOT_READY || check_now_s() > deadline)
      return err;
    check_sleep_us(200);
  }
}

/* As check_poll_event, for a stream. */
static inline tp_error_t check_poll_stream(tp_stream_t s, long timeout_ms) {
  double deadline = check_now_s() + (double)timeout_ms / 1000.0;
  for (;;) {
    tp_error_t err = tp_stream_query(s);
    if (err != TP_ERROR_NOT_READY || check_now_s() > deadline)
      return err;
    check_sleep_us(200);
  }
}

/* Ends the capture on `s` from a thread of its own, as an application might
 * end a capture that another thread began; *graph as tp_stream_end_capture
 * leaves it. */
typedef struct check_ender_ {
  tp_stream_t s;
  tp_graph_t graph;
  tp_error_t err;
} check_ender_;

static inline void *check_ender_main_(void *arg) {
  check_ender_ *e = arg;
  e->err = tp_stream_end_capture(e->s, &e->graph);
  return NULL;
}

static inline tp_error_t check_end_capture_elsewhere(tp_stream_t s,
                                                     tp_graph_t *graph) {
  check_ender_ e = {s, (tp_graph_t)&e, (tp_error_t)-1};
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, check_ender_main_, &e) == 0))
    return (tp_error_t)-1;
  pthread_join(t, NULL);
  *graph = e.graph;
  return e.err;
}

#endif /* TP_TEST_CHECK_H */
