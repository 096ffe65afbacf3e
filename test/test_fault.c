/* test_fault: fault injection on the host platform. For each kind of
 * platform operation, makes the 1st, 2nd, 3rd... one fail during a fixed
 * scenario and checks that every step fails cleanly, pools stay consistent
 * and nothing leaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "platform/host/host_testing.h"
#include "pool/pool_verify.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* The scenario runs some tens of operations of each kind (54 memory and 17
 * stream ones when this was written); a fault still firing this far in
 * means that failures make the scenario loop or grow without end. */
#define MAX_N 400

static const size_t sizes[] = {100, 40 * KiB, 3 * MiB, 9 * MiB, 64 * MiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static tp_pool_t default_pool;
/* TP_FAULT_VERBOSE set: one line per iteration, naming the step that
 * returned the injected error, for reading a failure in context. */
static int verbose;

/* What one run of the scenario met. */
typedef struct outcome {
  int errors;           /* steps that returned an allowed error */
  tp_error_t first;     /* the first such error */
  const char *first_at; /* and the step that returned it */
} outcome;

/* A step that failed must leave every pool it touched consistent; the
 * walker takes the pool's lock and compares free lists, chunk map and
 * accounting. */
static void verify(tp_pool_t pool, const char *when) {
  char why[256] = "";
  if (pool && tp__pool_verify(pool, why, sizeof why) != 0)
    CHECK_FAIL("pool inconsistent %s: %s", when, why);
}

/* Judges a step's answer: success (returns 1), a clean error that a fault
 * may cause (returns 0, counted, and `pool` verified), or anything else,
 * which fails the test (returns 0). */
static int step_(outcome *o, tp_error_t err, const char *what, int line,
                 tp_pool_t pool) {
  if (err == TP_SUCCESS)
    return 1;
  if (err == TP_ERROR_OUT_OF_MEMORY || err == TP_ERROR_PLATFORM) {
    if (o->errors++ == 0) {
      o->first = err;
      o->first_at = what;
    }
    char when[192];
    snprintf(when, sizeof when, "after %s failed", what);
    verify(pool, when);
    return 0;
  }
  check_fail_(__FILE__, line,
              "%s returned %s; only success, "
              "TP_ERROR_OUT_OF_MEMORY or TP_ERROR_PLATFORM are allowed",
              what, tp_error_name(err));
  return 0;
}
#define STEP(o, expr, pool) step_((o), (expr), #expr, __LINE__, (pool))

/* Frees `*ptr` on the stream. A free that failed must have changed nothing
 * (tidepool.h: "a rejected free changes nothing"), and the fault fires only
 * once, so the retry must succeed: otherwise the block would leak. */
static void free_block(outcome *o, void **ptr, tp_stream_t stream,
                       tp_pool_t pool) {
  if (!*ptr)
    return;
  if (!STEP(o, tp_free_async(*ptr, stream), pool))
    CHECK_OK(tp_free_async(*ptr, stream));
  *ptr = NULL;
}

/* Allocates every size from the pool on the stream and fills what it got.
 * An allocation that fails leaves its slot NULL; the others go on, since
 * they do not depend on it. */
static void alloc_all(outcome *o, void *ptrs[NSIZES], tp_pool_t pool,
                      tp_stream_t stream) {
  for (size_t i = 0; i < NSIZES; i++) {
    ptrs[i] = NULL;
    if (!STEP(o, tp_malloc_from_pool_async(&ptrs[i], sizes[i], pool, stream),
              pool)) {
      ptrs[i] = NULL;
      continue;
    }
    if (CHECK(ptrs[i] != NULL))
      STEP(o, tp_memset_async(ptrs[i], (int)(0x40 + i), sizes[i], stream),
           pool);
  }
}

static void free_all(outcome *o, void *ptrs[NSIZES], tp_pool_t pool,
                     tp_stream_t stream) {
  for (size_t i = 0; i < NSIZES; i++)
    free_block(o, &ptrs[i], stream, pool);
}

/* A pool of device 0 that keeps its memory across synchronizes (release
 * threshold max); false, counted, when making it failed. */
static bool pool_keeping(outcome *o, tp_pool_t *pool) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location.type = TP_LOCATION_DEVICE;
  props.location.id = 0;
  *pool = NULL;
  if (!STEP(o, tp_pool_create(pool, &props), NULL))
    return false;
  uint64_t keep = UINT64_MAX;
  CHECK_OK(tp_pool_set_attribute(*pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &keep));
  return true;
}

/* A chunk mapped twice (src/pool/grow.c's shared edge chunks) in a pool of
 * its own: A's freed start of the segment lends its chunk to C's last one,
 * and the sharing ends when B goes and the pool is trimmed. Without a fault,
 * C takes 6 MiB, not 8. */
static void share_round(outcome *o, tp_stream_t stream) {
  tp_pool_t pool;
  if (!pool_keeping(o, &pool))
    return;
  int errors = o->errors;
  void *a = NULL, *b = NULL, *c = NULL;
  if (STEP(o, tp_malloc_from_pool_async(&a, MiB / 2, pool, stream), pool) &&
      STEP(o, tp_malloc_from_pool_async(&b, 7 * MiB / 2, pool, stream), pool)) {
    free_block(o, &a, stream, pool);
    if (STEP(o, tp_stream_synchronize(stream), pool) &&
        STEP(o, tp_malloc_from_pool_async(&c, 9 * MiB / 4, pool, stream),
             pool)) {
      uint64_t reserved = 0;
      CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                     &reserved));
      if (o->errors == errors && reserved != 6 * MiB)
        CHECK_FAIL("the shared chunk: %" PRIu64 " bytes reserved, not 6 MiB",
                   reserved);
      STEP(o, tp_memset_async(c, 0x6c, 9 * MiB / 4, stream), pool);
    }
  }
  free_block(o, &a, stream, pool);
  free_block(o, &b, stream, pool);
  free_block(o, &c, stream, pool);
  STEP(o, tp_stream_synchronize(stream), pool);
  if (STEP(o, tp_pool_trim_to(pool, 0), pool)) {
    uint64_t reserved = UINT64_MAX;
    CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                   &reserved));
    if (reserved != 0)
      CHECK_FAIL("trim returned success, yet %" PRIu64 " bytes stay reserved "
                 "in the shared chunk's pool",
                 reserved);
  }
  verify(pool, "after the shared chunk's round");
  if (!STEP(o, tp_pool_destroy(pool), pool))
    CHECK_OK(tp_pool_destroy(pool));
}

/* A pool destroyed while it still holds mapped chunks (its threshold keeps
 * them): the teardown unmaps and gives back every one, even when one of its
 * platform calls fails once. */
static void destroy_holding(outcome *o, tp_stream_t stream) {
  tp_pool_t pool;
  if (!pool_keeping(o, &pool))
    return;
  void *p = NULL;
  if (STEP(o, tp_malloc_from_pool_async(&p, 5 * MiB, pool, stream), pool))
    free_block(o, &p, stream, pool);
  STEP(o, tp_stream_synchronize(stream), pool);
  if (!STEP(o, tp_pool_destroy(pool), pool))
    CHECK_OK(tp_pool_destroy(pool));
}

/* The fixed scenario: a stream, an event and a pool; two rounds of
 * allocations of every size with an access change between them; a trim and
 * the pool's destruction; an allocation from the default pool. Each step
 * either succeeds or fails cleanly; what depends on a failed step is
 * skipped; whatever was created is destroyed. */
static void scenario(outcome *o) {
  tp_stream_t stream = NULL;
  tp_event_t event = NULL;
  tp_pool_t pool = NULL;
  void *ptrs[NSIZES] = {0};

  int have_stream = STEP(o, tp_stream_create(&stream, TP_STREAM_DEFAULT), NULL);
  int have_event = STEP(o, tp_event_create(&event), NULL);
  /* A pool that keeps its memory across the synchronize below, so that the
   * access change applies to mapped chunks and the second round reuses them
   * rather than mapping everything afresh. */
  int have_pool = pool_keeping(o, &pool);

  if (have_stream && have_pool) {
    alloc_all(o, ptrs, pool, stream);
    if (have_event && STEP(o, tp_event_record(event, stream), pool))
      STEP(o, tp_stream_wait_event(stream, event, 0), pool);
    free_all(o, ptrs, pool, stream);
    STEP(o, tp_stream_synchronize(stream), pool);
  }
  if (have_pool) {
    /* Granting the own device what it has is allowed, and walks every
     * mapped chunk. */
    tp_access_desc_t desc = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
    STEP(o, tp_pool_set_access(pool, &desc, 1), pool);
  }
  if (have_stream && have_pool) {
    /* Whatever the access change did, the own device must still write the
     * pool's memory: a fault of these memsets would surface as
     * TP_ERROR_ILLEGAL_ADDRESS at the synchronize, which is not allowed. */
    alloc_all(o, ptrs, pool, stream);
    free_all(o, ptrs, pool, stream);
    STEP(o, tp_stream_synchronize(stream), pool);
  }
  if (have_pool) {
    if (STEP(o, tp_pool_trim_to(pool, 0), pool)) {
      uint64_t reserved = UINT64_MAX;
      CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                     &reserved));
      if (reserved != 0)
        CHECK_FAIL("tp_pool_trim_to(pool, 0) returned success, yet %" PRIu64
                   " bytes stay reserved with nothing allocated",
                   reserved);
    }
    verify(pool, "before its destruction");
    if (!STEP(o, tp_pool_destroy(pool), pool))
      CHECK_OK(tp_pool_destroy(pool));
  }

  if (have_stream)
    share_round(o, stream);
  if (have_stream)
    destroy_holding(o, stream);

  if (have_stream) {
    void *ptr = NULL;
    if (STEP(o, tp_malloc_async(&ptr, 1 * MiB, stream), default_pool) &&
        CHECK(ptr != NULL)) {
      STEP(o, tp_memset_async(ptr, 0x5a, 1 * MiB, stream), default_pool);
      free_block(o, &ptr, stream, default_pool);
    }
    STEP(o, tp_stream_synchronize(stream), default_pool);
    STEP(o, tp_pool_trim_to(default_pool, 0), default_pool);
  }

  if (have_event && !STEP(o, tp_event_destroy(event), NULL))
    CHECK_OK(tp_event_destroy(event));
  if (have_stream && !STEP(o, tp_stream_destroy(stream), NULL))
    CHECK_OK(tp_stream_destroy(stream));
}

/* ========================================================================
 * Driving the faults
 * ======================================================================== */

static const char *kind_name(tp__host_fault_kind kind) {
  return kind == TP__HOST_FAULT_MEMORY ? "memory" : "stream";
}

/* Compares the live platform objects after an iteration with those before:
 * with every stream synchronized and the default pool trimmed, whatever
 * the scenario created must be gone, fault or not. */
static void expect_no_leak(const tp__host_live *before,
                           const tp__host_live *after) {
  struct {
    const char *what;
    uint64_t before, after;
  } counts[] = {
      {"reservations", before->reservations, after->reservations},
      {"chunks", before->chunks, after->chunks},
      {"mapped chunks", before->mapped_chunks, after->mapped_chunks},
      {"streams", before->streams, after->streams},
      {"events", before->events, after->events},
  };
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    if (counts[i].before != counts[i].after)
      CHECK_FAIL("leak: %" PRIu64 " %s live before the iteration, %" PRIu64
                 " after",
                 counts[i].before, counts[i].what, counts[i].after);
}

/* Brings the library to its steady state before any count is taken: the
 * default pool and the first stream worker are created lazily, and they
 * outlive every iteration. */
static void warm_up(void) {
  tp_stream_t stream;
  REQUIRE_OK(tp_stream_create(&stream, TP_STREAM_DEFAULT));
  void *ptr = NULL;
  CHECK_OK(tp_malloc_async(&ptr, 1 * MiB, stream));
  CHECK_OK(tp_free_async(ptr, stream));
  CHECK_OK(tp_stream_synchronize(stream));
  CHECK_OK(tp_stream_destroy(stream));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_trim_to(default_pool, 0));
}

/* Fails the 1st, 2nd, 3rd... operation of `kind` until an iteration runs
 * without the armed operation being reached. */
static void run_kind(tp__host_fault_kind kind) {
  int injected = 0, surfaced = 0, done = 0;
  char label[64];
  for (uint64_t n = 1; n <= MAX_N; n++) {
    snprintf(label, sizeof label, "%s fault at operation %" PRIu64,
             kind_name(kind), n);
    check_context(label);
    tp__host_live before, after;
    tp__host_live_get(&before);
    uint64_t ops0 = tp__host_fault_ops(kind);
    tp__host_fault_arm(kind, n);
    outcome o = {0};
    scenario(&o);
    uint64_t ops = tp__host_fault_ops(kind) - ops0;
    tp__host_fault_arm(kind, 0);
    /* Disarmed before the cleanup, so that it cannot be what fails. */
    CHECK_OK(tp_device_synchronize());
    CHECK_OK(tp_pool_trim_to(default_pool, 0));
    verify(default_pool, "after the iteration");
    tp__host_live_get(&after);
    expect_no_leak(&before, &after);
    if (ops < n) {
      /* The scenario ran fewer operations than n: nothing failed, so no
       * step may have failed either. */
      if (o.errors)
        CHECK_FAIL("no fault fired, yet %s returned %s", o.first_at,
                   tp_error_name(o.first));
      printf("   %s: %d faults injected (the scenario runs %" PRIu64
             " operations of this kind), %d surfaced as an error\n",
             kind_name(kind), injected, ops, surfaced);
      done = 1;
      break;
    }
    injected++;
    surfaced += o.errors > 0;
    if (verbose)
      printf("   %s fault %" PRIu64 ": %s\n", kind_name(kind), n,
             o.errors ? o.first_at : "absorbed (no step failed)");
    if (verbose && o.errors)
      printf("      returned %s\n", tp_error_name(o.first));
  }
  check_context(NULL);
  if (!done)
    CHECK_FAIL("%s faults still fired at operation %d: the scenario does not "
               "end",
               kind_name(kind), MAX_N);
  if (injected == 0)
    CHECK_FAIL("no %s fault was injected: the scenario runs no operation of "
               "that kind",
               kind_name(kind));
}

static void test_memory_faults(void) {
  run_kind(TP__HOST_FAULT_MEMORY);
}

static void test_stream_faults(void) {
  run_kind(TP__HOST_FAULT_STREAM);
}

int main(void) {
  /* NULL means the library failed to start, which is a failure, not a
   * reason to skip. */
  const char *platform = tp_platform_name();
  REQUIRE_EXIT(platform != NULL);
  if (strcmp(platform, "host") != 0) {
    return check_skip("host platform only");
  }
  REQUIRE_OK_EXIT(tp_device_get_default_mem_pool(&default_pool, 0));
  verbose = getenv("TP_FAULT_VERBOSE") != NULL;
  RUN_TEST(warm_up);
  RUN_TEST(test_memory_faults);
  RUN_TEST(test_stream_faults);
  return check_done();
}
