/* Graphs at the edges a long-running application reaches through the
 * public API: calls that fail part-way, which must leave the graph memory
 * accounts as they were (as CUDA's failed calls do); more graphs and execs
 * made and destroyed than the handle tables hold (a capture per training
 * step), and the handles of destroyed ones, which must be refused once
 * their slots serve new ones, also by threads racing the making. On the
 * host platform, whose fault hooks make the platform's memory operations
 * fail; run also with TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE=1, where graph
 * memory is mapped during capture as on cuda. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "common/slots.h"
#include "platform/host/host_testing.h"

#define MiB ((size_t)1 << 20)

static bool maps_at_capture(void) {
  const char *v = getenv("TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE");
  return v && strcmp(v, "1") == 0;
}

typedef struct accounts {
  uint64_t v[4]; /* by tp_graph_mem_attr_t */
  uint64_t chunks;
} accounts;

static accounts accounts_now(void) {
  accounts a = {{0}, 0};
  for (int i = 0; i < 4; i++)
    CHECK_OK(
        tp_device_get_graph_mem_attribute(0, (tp_graph_mem_attr_t)i, &a.v[i]));
  tp__host_live live;
  tp__host_live_get(&live);
  a.chunks = live.chunks;
  return a;
}

static void expect_accounts(const accounts *before, const accounts *after) {
  static const char *names[4] = {"used", "used high", "reserved",
                                 "reserved high"};
  for (int i = 0; i < 4; i++)
    if (before->v[i] != after->v[i])
      CHECK_FAIL("graph memory %s went from %" PRIu64 " to %" PRIu64, names[i],
                 before->v[i], after->v[i]);
  if (before->chunks != after->chunks)
    CHECK_FAIL("the platform's chunks went from %" PRIu64 " to %" PRIu64,
               before->chunks, after->chunks);
}

static void reset_highs(void) {
  uint64_t zero = 0;
  CHECK_OK(tp_device_set_graph_mem_attribute(0, TP_GRAPH_MEM_ATTR_USED_MEM_HIGH,
                                             &zero));
  CHECK_OK(tp_device_set_graph_mem_attribute(
      0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero));
}

/* Leaves one 2 MiB chunk cached, so that a failing call below can take a
 * kept chunk as well as make new ones. */
static void cache_one_chunk(tp_stream_t s) {
  REQUIRE_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL));
  void *p = NULL;
  CHECK_OK(tp_malloc_async(&p, 2 * MiB, s));
  CHECK_OK(tp_free_async(p, s));
  tp_graph_t g = NULL;
  REQUIRE_OK(tp_stream_end_capture(s, &g));
  tp_graph_exec_t x = NULL;
  REQUIRE_OK(tp_graph_instantiate(&x, g, 0));
  CHECK_OK(tp_graph_exec_destroy(x));
  CHECK_OK(tp_graph_destroy(g));
  CHECK_OK(tp_stream_synchronize(s));
}

/* Captures a graph whose three allocations are live at once (6 MiB, three
 * chunks), failing the nth memory operation of the platform; the first
 * error in *err. A failed allocation leaves the accounts as they were
 * before it. */
static tp_graph_t capture_three(tp_stream_t s, uint64_t nth, tp_error_t *err) {
  *err = tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL);
  if (!CHECK_OK(*err))
    return NULL;
  void *p[3] = {NULL, NULL, NULL};
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, nth);
  for (int i = 0; i < 3 && *err == TP_SUCCESS; i++) {
    accounts before = accounts_now();
    *err = tp_malloc_async(&p[i], 2 * MiB, s);
    if (*err != TP_SUCCESS) {
      accounts after = accounts_now();
      expect_accounts(&before, &after);
    }
  }
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 0);
  for (int i = 0; i < 3; i++)
    if (p[i])
      CHECK_OK(tp_free_async(p[i], s));
  tp_graph_t g = NULL;
  CHECK_OK(tp_stream_end_capture(s, &g));
  return g;
}

/* A failed allocation during capture (where graph memory is mapped at
 * capture) or a failed instantiation (where it is mapped then) leaves the
 * graph memory accounts as they were: no high raised, no chunk kept. */
static void test_failed_calls_change_no_accounts(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  int failures = 0;
  bool succeeded = false;
  char label[64];
  for (uint64_t n = 1; n <= 64 && !succeeded; n++) {
    snprintf(label, sizeof label, "memory fault at operation %" PRIu64, n);
    check_context(label);
    CHECK_OK(tp_device_graph_mem_trim(0));
    cache_one_chunk(s);
    reset_highs();
    accounts before = accounts_now();
    tp_error_t err = TP_SUCCESS;
    tp_graph_t g = NULL;
    tp_graph_exec_t x = NULL;
    if (maps_at_capture()) {
      g = capture_three(s, n, &err);
      succeeded = err == TP_SUCCESS;
      failures += !succeeded;
    } else {
      g = capture_three(s, 0, &err);
      CHECK_OK(err);
      tp__host_fault_arm(TP__HOST_FAULT_MEMORY, n);
      err = tp_graph_instantiate(&x, g, 0);
      tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 0);
      if (err == TP_SUCCESS) {
        succeeded = true;
        CHECK_OK(tp_graph_exec_destroy(x));
      } else {
        failures++;
        CHECK(x == NULL);
        accounts after = accounts_now();
        expect_accounts(&before, &after);
      }
    }
    if (g)
      CHECK_OK(tp_graph_destroy(g));
    CHECK_OK(tp_stream_synchronize(s));
  }
  check_context(NULL);
  CHECK(succeeded);
  CHECK(failures >= 3); /* a chunk taken from the cache, then new ones */
  CHECK_OK(tp_device_graph_mem_trim(0));
  CHECK_OK(tp_stream_destroy(s));
}

/* An empty graph of a relaxed capture on s. */
static tp_graph_t empty_graph(tp_stream_t s) {
  tp_graph_t g = NULL;
  if (CHECK_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_RELAXED)))
    CHECK_OK(tp_stream_end_capture(s, &g));
  return g;
}

/* More graphs and execs made and destroyed, one at a time, than the tables
 * have slots: each one's slot serves the next. The first handles are
 * refused at the end, their slots having served millions since. Some 3 s
 * in a debug build (where the slots were never reused, the tables ran out
 * after 7 s, holding 300 MB). */
static void test_more_graphs_than_slots(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  const uint64_t slots = (uint64_t)TP_SLOTS_MAX_CHUNKS * TP_SLOTS_CHUNK;
  tp_graph_t first_g = NULL;
  tp_graph_exec_t first_x = NULL;
  double start = check_now_s();
  uint64_t made = 0;
  for (; made <= slots; made++) {
    tp_graph_t g = NULL;
    tp_graph_exec_t x = NULL;
    tp_error_t err = tp_stream_begin_capture(s, TP_CAPTURE_MODE_RELAXED);
    if (err == TP_SUCCESS)
      err = tp_stream_end_capture(s, &g);
    if (err == TP_SUCCESS)
      err = tp_graph_instantiate(&x, g, 0);
    if (err != TP_SUCCESS) {
      CHECK_FAIL("graph or exec %" PRIu64 " was refused: %s", made,
                 tp_error_name(err));
      if (g)
        CHECK_OK(tp_graph_destroy(g));
      break;
    }
    if (made == 0) {
      first_g = g;
      first_x = x;
    }
    if (!CHECK_OK(tp_graph_exec_destroy(x)) || !CHECK_OK(tp_graph_destroy(g)))
      break;
  }
  printf("   %" PRIu64 " graphs and execs made and destroyed in %.2f s "
         "(%" PRIu64 " slots a table)\n",
         made, check_now_s() - start, slots);
  tp_graph_exec_t x = NULL;
  CHECK_EQ_INT(tp_graph_instantiate(&x, first_g, 0), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_destroy(first_g), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_launch(first_x, s), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_destroy(first_x), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_destroy(s));
}

static void bump(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

/* A destroyed graph's or exec's handle is refused once its slot serves a
 * new one, and using it leaves the new one alone; an exec outlives its
 * graph, also once the graph's slot serves another graph. */
static void test_stale_handles(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  atomic_int runs = 0;
  REQUIRE_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL));
  CHECK_OK(tp_launch_host_func(s, bump, &runs));
  tp_graph_t g1 = NULL;
  REQUIRE_OK(tp_stream_end_capture(s, &g1));
  tp_graph_exec_t x1 = NULL;
  REQUIRE_OK(tp_graph_instantiate(&x1, g1, 0));
  CHECK_OK(tp_graph_destroy(g1));
  CHECK_EQ_INT(tp_graph_destroy(g1), TP_ERROR_INVALID_VALUE);

  /* g1's slot serves g2, most likely; g1's handle is refused and g2 stays
   * whole whatever is done with g1's. */
  tp_graph_t g2 = empty_graph(s);
  REQUIRE(g2 != NULL);
  CHECK(g2 != g1);
  tp_graph_exec_t x = NULL;
  CHECK_EQ_INT(tp_graph_instantiate(&x, g1, 0), TP_ERROR_INVALID_VALUE);
  CHECK(x == NULL);
  CHECK_EQ_INT(tp_graph_destroy(g1), TP_ERROR_INVALID_VALUE);
  /* x1 outlives g1 and runs beside g2. */
  CHECK_OK(tp_graph_launch(x1, s));
  tp_graph_exec_t x2 = NULL;
  REQUIRE_OK(tp_graph_instantiate(&x2, g2, 0));
  CHECK_OK(tp_graph_launch(x2, s));
  CHECK_OK(tp_graph_launch(x1, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_INT(atomic_load(&runs), 2);

  /* x1's slot serves x3: x1's handle is refused, x3 launches. */
  CHECK_OK(tp_graph_exec_destroy(x1));
  tp_graph_exec_t x3 = NULL;
  REQUIRE_OK(tp_graph_instantiate(&x3, g2, 0));
  CHECK(x3 != x1);
  CHECK_EQ_INT(tp_graph_launch(x1, s), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_destroy(x1), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_graph_launch(x3, s));
  CHECK_OK(tp_graph_exec_destroy(x3));
  CHECK_EQ_INT(tp_graph_exec_destroy(x3), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_graph_exec_destroy(x2));
  CHECK_OK(tp_graph_destroy(g2));
  CHECK_EQ_INT(tp_graph_destroy(g2), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_INT(atomic_load(&runs), 2);
  CHECK_OK(tp_stream_destroy(s));
}

/* Handles of destroyed graphs and execs, used by threads while the maker
 * keeps making new ones in their slots: every use is refused, and none
 * reaches a new graph or exec (the maker's own calls all succeed). */
#define STALE 64
static _Atomic(tp_graph_t) stale_g[STALE];
static _Atomic(tp_graph_exec_t) stale_x[STALE];
static atomic_bool stale_stop;
static atomic_long stale_wrong;

static void *stale_user(void *arg) {
  check_rng rng = {(uint64_t)(uintptr_t)arg};
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  while (!atomic_load(&stale_stop)) {
    unsigned i = (unsigned)rng_below(&rng, STALE);
    tp_graph_t g = atomic_load(&stale_g[i]);
    tp_graph_exec_t x = atomic_load(&stale_x[i]);
    tp_graph_exec_t made = NULL;
    tp_error_t err = TP_ERROR_INVALID_VALUE;
    switch (rng_below(&rng, 4)) {
    case 0: err = g ? tp_graph_instantiate(&made, g, 0) : err; break;
    case 1: err = g ? tp_graph_destroy(g) : err; break;
    case 2: err = x ? tp_graph_launch(x, s) : err; break;
    default: err = x ? tp_graph_exec_destroy(x) : err; break;
    }
    if (err != TP_ERROR_INVALID_VALUE)
      atomic_fetch_add(&stale_wrong, 1);
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_stale_handles_race(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  atomic_store(&stale_stop, false);
  atomic_store(&stale_wrong, 0);
  pthread_t users[2];
  for (int i = 0; i < 2; i++)
    REQUIRE(pthread_create(&users[i], NULL, stale_user,
                           (void *)(uintptr_t)(0x5eed + (unsigned)i)) == 0);
  long rounds = 0, failed = 0;
  double end = check_now_s() + 0.5;
  while (check_now_s() < end) {
    tp_graph_t g = empty_graph(s);
    tp_graph_exec_t x = NULL;
    failed += !g || tp_graph_instantiate(&x, g, 0) != TP_SUCCESS ||
              tp_graph_launch(x, s) != TP_SUCCESS ||
              tp_graph_exec_destroy(x) != TP_SUCCESS ||
              tp_graph_destroy(g) != TP_SUCCESS;
    unsigned i = (unsigned)(rounds % STALE);
    atomic_store(&stale_g[i], g);
    atomic_store(&stale_x[i], x);
    rounds++;
  }
  atomic_store(&stale_stop, true);
  for (int i = 0; i < 2; i++)
    pthread_join(users[i], NULL);
  printf("   %ld rounds\n", rounds);
  CHECK_EQ_INT(failed, 0);
  CHECK_EQ_INT(atomic_load(&stale_wrong), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

/* A graph's handle passed where an exec's is asked for, and the other way
 * round, is refused and leaves both alone: the first graph and the first
 * exec once had the same handle value, and the graph's handle launched and
 * destroyed the exec. Runs first, while both tables are unused. */
static void test_handles_of_the_other_kind(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  atomic_int runs = 0;
  REQUIRE_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL));
  CHECK_OK(tp_launch_host_func(s, bump, &runs));
  tp_graph_t g = NULL;
  REQUIRE_OK(tp_stream_end_capture(s, &g));
  tp_graph_exec_t x = NULL;
  REQUIRE_OK(tp_graph_instantiate(&x, g, 0));
  CHECK_EQ_INT(tp_graph_launch((tp_graph_exec_t)(void *)g, s),
               TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_destroy((tp_graph_exec_t)(void *)g),
               TP_ERROR_INVALID_VALUE);
  tp_graph_exec_t x2 = NULL;
  CHECK_EQ_INT(tp_graph_instantiate(&x2, (tp_graph_t)(void *)x, 0),
               TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_destroy((tp_graph_t)(void *)x), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_INT(atomic_load(&runs), 0);
  CHECK_OK(tp_graph_launch(x, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_INT(atomic_load(&runs), 1);
  CHECK_OK(tp_graph_exec_destroy(x));
  CHECK_OK(tp_graph_destroy(g));
  CHECK_OK(tp_stream_destroy(s));
}

/* A graph whose allocation lands in the newest arena of addresses, on a
 * device whose memory the chunks cached by older arenas fill: those chunks
 * make room. They stayed cached once the graphs that used them were gone,
 * and the instantiation failed out of memory with no graph memory in use,
 * until a trim (a black-box finding). 300 graphs of 2 MiB, alive at once,
 * take segments of two arenas on the default 4 GiB device. */
static tp_graph_t graph_allocating(tp_stream_t s, size_t size) {
  tp_graph_t g = NULL;
  void *q = NULL;
  if (!CHECK_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL)))
    return NULL;
  CHECK_OK(tp_malloc_async(&q, size, s));
  CHECK_OK(tp_memset_async(q, 1, size, s));
  CHECK_OK(tp_free_async(q, s));
  CHECK_OK(tp_stream_end_capture(s, &g));
  return g;
}

static void test_graph_memory_cached_in_older_arenas(void) {
  if (getenv("TIDEPOOL_HOST_DEVICE_MEMORY")) {
    printf("   (needs the default 4 GiB device)\n");
    return;
  }
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  enum { K = 300 };
  static tp_graph_t g[K];
  static tp_graph_exec_t x[K];
  int made = 0;
  for (; made < K; made++) {
    g[made] = graph_allocating(s, (size_t)2 << 20);
    if (!g[made] || !CHECK_OK(tp_graph_instantiate(&x[made], g[made], 0))) {
      if (g[made])
        CHECK_OK(tp_graph_destroy(g[made]));
      break;
    }
  }
  for (int i = 0; i < made; i++) {
    CHECK_OK(tp_graph_exec_destroy(x[i]));
    CHECK_OK(tp_graph_destroy(g[i]));
  }
  CHECK_OK(tp_device_synchronize());
  uint64_t used = 1;
  CHECK_OK(tp_device_get_graph_mem_attribute(
      0, TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
  CHECK_EQ_U64(used, 0);
  tp_graph_t big = graph_allocating(s, (size_t)3800 << 20);
  tp_graph_exec_t bx = NULL;
  if (big && CHECK_OK(tp_graph_instantiate(&bx, big, 0)))
    CHECK_OK(tp_graph_exec_destroy(bx));
  if (big)
    CHECK_OK(tp_graph_destroy(big));
  CHECK_OK(tp_device_graph_mem_trim(0));
  CHECK_OK(tp_stream_destroy(s));
}

int main(void) {
  const char *platform = tp_platform_name();
  REQUIRE_EXIT(platform != NULL);
  if (strcmp(platform, "host") != 0)
    return check_skip("host platform only");
  RUN_TEST(test_handles_of_the_other_kind);
  RUN_TEST(test_failed_calls_change_no_accounts);
  RUN_TEST(test_stale_handles);
  RUN_TEST(test_stale_handles_race);
  RUN_TEST(test_more_graphs_than_slots);
  RUN_TEST(test_graph_memory_cached_in_older_arenas);
  return check_done();
}
