/* Graphs at the edges a long-running application reaches through the
 * public API: calls that fail part-way, which must leave the graph memory
 * accounts as they were (as CUDA's failed calls do). On the host platform,
 * whose fault hooks make the platform's memory operations fail; run also
 * with TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE=1, where graph memory is mapped
 * during capture as on cuda. */
#include <stdbool.h>
#include <stdint.h>

#include "check.h"
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

int main(void) {
  const char *platform = tp_platform_name();
  REQUIRE_EXIT(platform != NULL);
  if (strcmp(platform, "host") != 0)
    return check_skip("host platform only");
  RUN_TEST(test_failed_calls_change_no_accounts);
  return check_done();
}
