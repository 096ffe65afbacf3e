/* fuzz_findings: the smallest programs that show what the API fuzzer
 * (fuzz_api.c) found, one test each, so that a fix can be checked without
 * a fuzzing run: "fixed" ones run under CTest as regression tests, "open"
 * ones fail until their finding is fixed. The race findings stay in
 * test_soak.c, whose cases are their reproducers (test_soak --case NAME). */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* A pool of device 0's pinned memory; NULL, with a failed check, when it
 * cannot be made. */
static tp_pool_t device_pool(void) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  tp_pool_t pool = NULL;
  return CHECK_OK(tp_pool_create(&pool, &props)) ? pool : NULL;
}

/* Turns off opportunistic reuse and internal dependencies: another stream
 * then takes a free only once something showed it complete. */
static void reuse_strict(tp_pool_t pool) {
  int off = 0;
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                 &off));
  CHECK_OK(tp_pool_set_attribute(
      pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
}

static uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

/* USED_MEM_HIGH after a reset: a stream that freed a block earlier kept a
 * published count above its true one, so its next allocations did not
 * raise the high mark (fuzz input: allocate, free, reset, allocate). Fixed
 * on main by the per-thread high mark (3a32581); kept as a regression
 * test. */
static void test_used_high_after_reset(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  void *p = NULL;
  uint64_t zero = 0;
  CHECK_OK(tp_malloc_from_pool_async(&p, 100000, pool, s));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero));
  CHECK_OK(tp_malloc_from_pool_async(&p, 140, pool, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 140);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 140);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* A block freed on a stream that is destroyed before the free is known to
 * have completed is never released: neither a synchronize of every device
 * nor tp_pool_trim_to(pool, 0) gives its chunk back, though the header
 * says reserved memory falls to the threshold at a synchronize and the
 * destroyed stream's work has run (fuzz input: allocate on the legacy
 * stream, free on another stream, destroy that stream). */
static void test_free_on_destroyed_stream_released(void) {
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  void *p = NULL;
  tp_stream_t s = NULL;
  tp_event_t e = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 208000, pool, NULL));
  REQUIRE_OK(tp_event_create(&e));
  CHECK_OK(tp_event_record(e, NULL));
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_DEFAULT));
  CHECK_OK(tp_stream_wait_event(s, e, 0));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_event_destroy(e));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A stream waits for work queued after the free it reuses. The allocator
 * learns whether a free completed through a marker recorded on the freeing
 * stream when it first asks, not at the free: recorded behind later work,
 * the marker makes the allocating stream wait for that work too (internal
 * dependency), and on the legacy stream the marker is itself a legacy
 * operation that every blocking stream of the device then waits for. A
 * stream held by a host function (as here) then holds streams that never
 * depended on it, which can deadlock a program; the driver orders the
 * allocation after the free only. (Fuzz input: a free, a gate on the
 * freeing stream or on another blocking stream, an allocation on a third
 * stream, and a synchronize that never returns.) */
static atomic_int late_gate_open;

static void late_gate(void *arg) {
  (void)arg;
  double deadline = check_now_s() + 10.0;
  while (!atomic_load(&late_gate_open) && check_now_s() < deadline)
    check_sleep_us(100);
}

/* A free on a stream destroyed before the free is known complete was taken
 * by another stream with opportunistic reuse off: the allocator polled the
 * destroyed stream's last marker at any settle, and so learned of the
 * completion without a synchronize (fuzz input: a free held by a query
 * that answered NOT_READY, the stream destroyed, an allocation on another
 * device's legacy stream). Only a device synchronize begun after the
 * destroy settles such a free now. */
static atomic_int dead_gate_open;

static void dead_gate(void *arg) {
  (void)arg;
  double deadline = check_now_s() + 10.0;
  while (!atomic_load(&dead_gate_open) && check_now_s() < deadline)
    check_sleep_us(100);
}

static void test_destroyed_stream_free_needs_sync(void) {
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  reuse_strict(pool);
  uint64_t keep = UINT64_MAX;
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &keep));
  tp_stream_t s = NULL, t = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&t, TP_STREAM_NON_BLOCKING));
  void *p = NULL, *q = NULL;
  atomic_store(&dead_gate_open, 0);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 3 * MiB, pool, s));
  CHECK_OK(tp_launch_host_func(s, dead_gate, NULL));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_destroy(s));
  atomic_store(&dead_gate_open, 1);
  /* The free's work runs now, but nothing has shown it complete. */
  check_sleep_us(20000);
  CHECK_OK(tp_malloc_from_pool_async(&q, 3 * MiB, pool, t));
  CHECK(q != p);
  CHECK_OK(tp_free_async(q, t));
  CHECK_OK(tp_device_synchronize());
  /* After a device synchronize both blocks are free for every stream. */
  uint64_t reserved = attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  void *r = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&q, 3 * MiB, pool, t));
  CHECK_OK(tp_malloc_from_pool_async(&r, 3 * MiB, pool, t));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), reserved);
  CHECK_OK(tp_free_async(q, t));
  CHECK_OK(tp_free_async(r, t));
  CHECK_OK(tp_stream_synchronize(t));
  CHECK_OK(tp_stream_destroy(t));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A stream's cache served a request of 2 MiB - 512 bytes with a freed block
 * of 2 MiB + 512 (within its 64th of spare), whose last 512 bytes lie in a
 * second chunk: the live block then held that chunk, and neither a
 * synchronize nor a trim gave it back (fuzz input: reserved 4 MiB at
 * threshold 0 with live blocks needing one chunk). */
static void test_cached_block_pins_no_chunk(void) {
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *a = NULL, *b = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 2 * MiB + 1, pool, s));
  CHECK_OK(tp_free_async(a, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 2 * MiB - 512, pool, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 2 * MiB);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_pool_destroy(pool));
}

/* Whether `s` finishes its work within a second. */
static bool completes_soon(tp_stream_t s) {
  return check_poll_stream(s, 1000) == TP_SUCCESS;
}

static void test_reuse_waits_for_later_work(void) {
  tp_stream_t x = NULL, y = NULL;
  REQUIRE_OK(tp_stream_create(&x, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&y, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  void *p = NULL, *q = NULL;
  atomic_store(&late_gate_open, 0);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 3 * MiB, pool, x));
  CHECK_OK(tp_free_async(p, x));
  /* Work queued on x after the free: y's reuse must not wait for it. */
  CHECK_OK(tp_launch_host_func(x, late_gate, NULL));
  CHECK_OK(tp_malloc_from_pool_async(&q, 3 * MiB, pool, y));
  CHECK_OK(tp_memset_async(q, 1, 3 * MiB, y));
  CHECK(completes_soon(y));
  atomic_store(&late_gate_open, 1);
  CHECK_OK(tp_free_async(q, y));
  CHECK_OK(tp_stream_synchronize(x));
  CHECK_OK(tp_stream_synchronize(y));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(y));
}

static void test_legacy_marker_serialises(void) {
  tp_stream_t a = NULL, b = NULL;
  REQUIRE_OK(tp_stream_create(&a, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_stream_create(&b, TP_STREAM_DEFAULT));
  void *p = NULL, *q = NULL;
  atomic_store(&late_gate_open, 0);
  REQUIRE_OK(tp_malloc_async(&p, 3 * MiB, NULL));
  CHECK_OK(tp_free_async(p, NULL));
  /* b is held; a, another blocking stream, depends on b in no way. */
  CHECK_OK(tp_launch_host_func(b, late_gate, NULL));
  CHECK_OK(tp_malloc_async(&q, 3 * MiB, a));
  CHECK_OK(tp_memset_async(q, 1, 3 * MiB, a));
  CHECK(completes_soon(a));
  atomic_store(&late_gate_open, 1);
  CHECK_OK(tp_free_async(q, a));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_destroy(a));
  CHECK_OK(tp_stream_destroy(b));
}

/* Memory reused before its free's work has run. An event recorded on the
 * legacy stream carries "follows the frees of blocking streams issued
 * before legacy operation n + 1" where the record itself is operation n,
 * so a blocking stream that waits for that event takes for ordered a free
 * that another blocking stream issues after it, and reuses its memory at
 * once: the freeing stream's earlier work (held here by a gate) then
 * writes into the new block. (Found by TSan replaying the corpus: a race
 * between two streams' memsets; then reproduced with a gate.) */
static void test_legacy_event_clock(void) {
  tp_stream_t x = NULL, y = NULL;
  tp_event_t e = NULL;
  REQUIRE_OK(tp_stream_create(&x, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_stream_create(&y, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_event_create(&e));
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  const size_t big = 2031616, small = 17424;
  void *p = NULL, *q = NULL;
  atomic_store(&late_gate_open, 0);
  CHECK_OK(tp_event_record(e, NULL)); /* a legacy operation */
  CHECK_OK(tp_stream_wait_event(y, e, 0));
  REQUIRE_OK(tp_malloc_from_pool_async(&p, big, pool, x));
  CHECK_OK(tp_launch_host_func(x, late_gate, NULL));
  CHECK_OK(tp_memset_async(p, 9, big, x)); /* x's last use of p, held */
  CHECK_OK(tp_free_async(p, x));           /* after the legacy operation */
  REQUIRE_OK(tp_malloc_from_pool_async(&q, small, pool, y));
  CHECK_OK(tp_memset_async(q, 10, small, y));
  atomic_store(&late_gate_open, 1);
  CHECK_OK(tp_device_synchronize());
  if (check_on_host()) {
    const unsigned char *b = q;
    CHECK_EQ_INT(b[0], 10);
    CHECK_EQ_INT(b[small - 1], 10);
  }
  CHECK_OK(tp_free_async(q, y));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_event_destroy(e));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(y));
}

/* Memory reused before its free's work ran, again through the legacy
 * stream: tp_stream_wait_event on the legacy stream for an event that has
 * completed (or was never recorded) queues nothing on the platform, yet
 * counts as a legacy operation, so the allocator takes a blocking
 * stream's earlier free as ordered before every other blocking stream's
 * later work, which does not wait for it. */
static void test_legacy_wait_counts(void) {
  tp_stream_t x = NULL, y = NULL;
  tp_event_t e = NULL;
  REQUIRE_OK(tp_stream_create(&x, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_stream_create(&y, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_event_create(&e)); /* never recorded: complete */
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  const size_t big = 2031616, small = 17424;
  void *p = NULL, *q = NULL;
  atomic_store(&late_gate_open, 0);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, big, pool, x));
  CHECK_OK(tp_launch_host_func(x, late_gate, NULL));
  CHECK_OK(tp_memset_async(p, 9, big, x)); /* x's last use of p, held */
  CHECK_OK(tp_free_async(p, x));
  CHECK_OK(tp_stream_wait_event(NULL, e, 0));
  REQUIRE_OK(tp_malloc_from_pool_async(&q, small, pool, y));
  CHECK_OK(tp_memset_async(q, 10, small, y));
  /* Give y's work the time to run before x's, as it may. */
  (void)check_poll_stream(y, 200);
  atomic_store(&late_gate_open, 1);
  CHECK_OK(tp_device_synchronize());
  if (check_on_host()) {
    const unsigned char *b = q;
    CHECK_EQ_INT(b[0], 10);
    CHECK_EQ_INT(b[small - 1], 10);
  }
  CHECK_OK(tp_free_async(q, y));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_event_destroy(e));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(y));
}

/* A block used on one blocking stream and freed on the legacy stream (which
 * CUDA makes wait for that use) went to another blocking stream at once:
 * that stream's later work waits for the legacy stream's last operation,
 * and a free is none, so its work could run beside the first stream's (fuzz
 * input: a gate on a blocking stream, legacy work behind it, frees on the
 * legacy stream, an allocation on a second blocking stream). The taker now
 * gets it only once a legacy operation (a marker, recorded then) covers the
 * free. The same through an event recorded on a blocking stream, which
 * claimed every legacy free issued so far: it now claims those issued
 * before the legacy stream's last operation. */
static atomic_int legacy_gate_open, taker_ran;

static void legacy_gate(void *arg) {
  (void)arg;
  double deadline = check_now_s() + 10.0;
  while (!atomic_load(&legacy_gate_open) && check_now_s() < deadline)
    check_sleep_us(100);
}

static void taker_runs(void *arg) {
  (void)arg;
  atomic_store(&taker_ran, 1);
}

/* A block used on gated blocking stream x, then freed on the legacy stream;
 * a taker (blocking, or non-blocking after an event recorded on another
 * blocking stream) allocates its size: if it got that block, its work must
 * wait for x's. */
static void legacy_free_case(bool through_event) {
  tp_pool_t pool = device_pool();
  REQUIRE(pool != NULL);
  reuse_strict(pool);
  tp_stream_t x = NULL, taker = NULL, z = NULL;
  REQUIRE_OK(tp_stream_create(&x, 0));
  REQUIRE_OK(
      tp_stream_create(&taker, through_event ? TP_STREAM_NON_BLOCKING : 0));
  REQUIRE_OK(tp_stream_create(&z, 0));
  tp_event_t ev = NULL;
  REQUIRE_OK(tp_event_create(&ev));
  void *p = NULL, *q = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 3 * MiB, pool, NULL));
  CHECK_OK(tp_stream_synchronize(NULL));
  atomic_store(&legacy_gate_open, 0);
  atomic_store(&taker_ran, 0);
  CHECK_OK(tp_launch_host_func(x, legacy_gate, NULL));
  CHECK_OK(tp_free_async(p, NULL));
  if (through_event) {
    CHECK_OK(tp_event_record(ev, z));
    CHECK_OK(tp_stream_wait_event(taker, ev, 0));
  }
  CHECK_OK(tp_malloc_from_pool_async(&q, 3 * MiB, pool, taker));
  CHECK_OK(tp_launch_host_func(taker, taker_runs, NULL));
  check_sleep_us(20000);
  if (q == p)
    CHECK_EQ_INT(atomic_load(&taker_ran), 0);
  atomic_store(&legacy_gate_open, 1);
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_INT(atomic_load(&taker_ran), 1);
  CHECK_OK(tp_free_async(q, taker));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(taker));
  CHECK_OK(tp_stream_destroy(z));
  CHECK_OK(tp_pool_destroy(pool));
}

static void test_legacy_free_blocking_taker(void) {
  legacy_free_case(false);
}

static void test_legacy_free_event(void) {
  legacy_free_case(true);
}

/* With opportunistic reuse off, a pool took a free that no synchronization
 * had shown complete: another pool, with the policy on, had polled the
 * freeing stream and found it idle, and the stream's completed epoch was
 * shared by every pool (fuzz input: two pools, frees on one stream, an
 * allocation on another stream in each pool). What polling finds is now
 * seen, not done, and only the opportunistic policy acts on it. */
static void test_polled_completion_stays_opportunistic(void) {
  tp_pool_t opp = device_pool(), strict = device_pool();
  REQUIRE(opp != NULL && strict != NULL);
  reuse_strict(strict);
  tp_stream_t x = NULL, y = NULL;
  REQUIRE_OK(tp_stream_create(&x, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&y, TP_STREAM_NON_BLOCKING));
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 3 * MiB, opp, x));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 3 * MiB, strict, x));
  CHECK_OK(tp_free_async(a, x));
  CHECK_OK(tp_free_async(b, x));
  /* x has nothing queued: polling it, the opportunistic pool finds its
   * free complete and may hand it to y. */
  CHECK_OK(tp_malloc_from_pool_async(&c, 3 * MiB, opp, y));
  /* The strict pool has been told nothing. */
  CHECK_OK(tp_malloc_from_pool_async(&d, 3 * MiB, strict, y));
  CHECK(d != b);
  CHECK_OK(tp_free_async(c, y));
  CHECK_OK(tp_free_async(d, y));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(y));
  CHECK_OK(tp_pool_destroy(opp));
  CHECK_OK(tp_pool_destroy(strict));
}

/* Fixed findings run as regression tests; open ones fail until fixed. */
static const struct {
  const char *name;
  void (*fn)(void);
  bool open;
} findings[] = {
    {"test_used_high_after_reset", test_used_high_after_reset, false},
    {"test_free_on_destroyed_stream_released",
     test_free_on_destroyed_stream_released, false},
    {"test_destroyed_stream_free_needs_sync",
     test_destroyed_stream_free_needs_sync, false},
    {"test_cached_block_pins_no_chunk", test_cached_block_pins_no_chunk, false},
    {"test_legacy_event_clock", test_legacy_event_clock, false},
    {"test_legacy_wait_counts", test_legacy_wait_counts, false},
    {"test_legacy_free_blocking_taker", test_legacy_free_blocking_taker, false},
    {"test_legacy_free_event", test_legacy_free_event, false},
    {"test_polled_completion_stays_opportunistic",
     test_polled_completion_stays_opportunistic, false},
    {"test_reuse_waits_for_later_work", test_reuse_waits_for_later_work, true},
    {"test_legacy_marker_serialises", test_legacy_marker_serialises, true},
};

/* Usage: fuzz_findings [fixed|open]; without an argument, all. */
int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "all";
  bool all = strcmp(which, "all") == 0, open = strcmp(which, "open") == 0;
  if (!all && !open && strcmp(which, "fixed") != 0) {
    printf("usage: %s [fixed|open]\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < sizeof findings / sizeof findings[0]; i++)
    if (all || findings[i].open == open)
      check_run_(findings[i].name, findings[i].fn);
  return check_done();
}
