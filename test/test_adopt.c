/* Execs the application makes itself, adopted (tp_graph_exec_adopt): a
 * capture begun through tidepool but ended and instantiated through the
 * platform's own calls, as an application on cuda ends and instantiates
 * with the driver. On host this needs graph memory handled as on cuda
 * (mapped at capture), which the program asks for before tidepool starts;
 * it runs on cuda as well. The launches and frees are held against the
 * driver's rules: a relaunch while an output is live is refused, each
 * launch's output is freed once, and a thread that destroys the exec while
 * another launches and frees costs neither anything but errors. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "platform/platform.h"
#include "stream/stream.h"

enum { MIB = 1 << 20 };

static tp__pstream *pstream_of(tp_stream_t s) {
  tp__stream *st = NULL;
  return tp__stream_get(s, &st) == TP_SUCCESS ? st->ps : NULL;
}

static uint64_t graph_used(void) {
  uint64_t v = 0;
  CHECK_OK(tp_device_get_graph_mem_attribute(
      0, TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v));
  return v;
}

/* A graph that allocates `size` bytes and does not free them, captured on
 * s and ended and instantiated by the platform: *pg and *pe. */
static bool make_graph(tp_stream_t s, size_t size, unsigned long long flags,
                       void **out, tp__pgraph **pg, tp__pexec **pe) {
  *pg = NULL;
  *pe = NULL;
  tp__pstream *ps = pstream_of(s);
  uint64_t id = 0;
  return CHECK(ps != NULL) &&
         CHECK_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL)) &&
         CHECK_OK(tp_malloc_async(out, size, s)) &&
         CHECK_OK(tp__platform->capture_end(ps, pg, &id)) &&
         CHECK(*pg != NULL) &&
         CHECK_OK(tp__platform->graph_instantiate(*pg, flags, NULL, NULL, pe));
}

static void drop_graph(tp__pgraph *pg, tp__pexec *pe) {
  CHECK_OK(tp__platform->graph_exec_destroy(pe));
  CHECK_OK(tp_graph_forget(pg));
  CHECK_OK(tp__platform->graph_destroy(pg));
}

/* Frees until the graph memory is back at `level` (the platform lets a
 * graph go on its own time: cuda tells from a thread of its own). */
static void expect_graph_used(uint64_t level) {
  double deadline = check_now_s() + 5;
  while (graph_used() > level && check_now_s() < deadline) {
    CHECK_OK(tp_device_graph_mem_trim(0));
    check_sleep_us(1000);
  }
  CHECK_EQ_U64(graph_used(), level);
}

static void test_rules(void) {
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  uint64_t used0 = graph_used();
  void *p = NULL;
  tp__pgraph *pg;
  tp__pexec *pe;
  REQUIRE(make_graph(s, MIB, 0, &p, &pg, &pe));
  tp_graph_exec_t e = NULL, again = NULL, found = NULL;
  int adoptable = 0;
  CHECK_OK(tp_graph_adoptable(pg, &adoptable));
  CHECK_EQ_INT(adoptable, 1);
  REQUIRE_OK(tp_graph_exec_adopt(&e, pe, pg, 0));
  CHECK_OK(tp_graph_exec_adopt(&again, pe, pg, 0));
  CHECK_EQ_PTR(again, e);
  CHECK_OK(tp_graph_exec_find(&found, pe));
  CHECK_EQ_PTR(found, e);
  /* A second exec of a graph with an allocation: refused, as in CUDA. */
  tp__pexec *second = NULL;
  tp_graph_exec_t e2 = NULL;
  REQUIRE_OK(tp__platform->graph_instantiate(pg, 0, NULL, NULL, &second));
  CHECK_EQ_INT(tp_graph_exec_adopt(&e2, second, pg, 0), TP_ERROR_NOT_SUPPORTED);
  CHECK(e2 == NULL);
  /* ... a refusal an interposer passes on, since the graph is tidepool's. */
  CHECK_OK(tp_graph_adoptable(pg, &adoptable));
  CHECK_EQ_INT(adoptable, 1);
  CHECK_OK(tp__platform->graph_exec_destroy(second));

  CHECK_EQ_INT(tp_free_async(p, s), TP_ERROR_INVALID_VALUE);
  for (int i = 0; i < 3; i++) {
    CHECK_OK(tp_graph_launch(e, s));
    CHECK_EQ_INT(tp_graph_launch(e, s), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_memset_async(p, i, MIB, s));
    CHECK_OK(tp_free_async(p, s));
    CHECK_EQ_INT(tp_free_async(p, s), TP_ERROR_INVALID_VALUE);
  }
  CHECK_OK(tp_graph_launch(e, s));
  CHECK_OK(tp_graph_exec_destroy(e));
  CHECK_EQ_INT(tp_graph_exec_find(&found, pe), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_launch(e, s), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_destroy(e), TP_ERROR_INVALID_VALUE);
  drop_graph(pg, pe);
  /* The last launch's output outlives its graph until freed. */
  CHECK_OK(tp_memset_async(p, 7, MIB, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(graph_used() > used0);
  CHECK_OK(tp_free_async(p, s));
  CHECK_EQ_INT(tp_free_async(p, s), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  expect_graph_used(used0);

  /* AUTO_FREE_ON_LAUNCH: relaunching a live output is allowed. */
  REQUIRE(make_graph(s, MIB, TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH, &p, &pg,
                     &pe));
  REQUIRE_OK(tp_graph_exec_adopt(&e, pe, pg,
                                 TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH));
  CHECK_OK(tp_graph_launch(e, s));
  CHECK_OK(tp_graph_launch(e, s));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_graph_exec_destroy(e));
  drop_graph(pg, pe);
  CHECK_OK(tp_stream_synchronize(s));
  expect_graph_used(used0);
  CHECK_OK(tp_stream_destroy(s));
}

/* A forgotten graph's handle names nothing, even while its memory lives on
 * with an exec; and a graph tidepool allocated nothing in is not adopted. */
static void test_forget(void) {
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *p = NULL;
  tp__pgraph *pg;
  tp__pexec *pe;
  REQUIRE(make_graph(s, 4096, 0, &p, &pg, &pe));
  CHECK_OK(tp_graph_forget(pg));
  tp_graph_exec_t e = NULL;
  int adoptable = 1;
  CHECK_OK(tp_graph_adoptable(pg, &adoptable));
  CHECK_EQ_INT(adoptable, 0);
  CHECK_EQ_INT(tp_graph_exec_adopt(&e, pe, pg, 0), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp__platform->graph_exec_destroy(pe));
  CHECK_OK(tp__platform->graph_destroy(pg));
  /* Never launched, its allocation was never made: one free of it is
   * still taken, as the graph's launches were not seen. */
  CHECK_OK(tp_free_async(p, s));

  tp__pstream *ps = pstream_of(s);
  REQUIRE(ps != NULL);
  REQUIRE_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL));
  uint64_t id = 0;
  REQUIRE_OK(tp__platform->capture_end(ps, &pg, &id));
  REQUIRE_OK(tp__platform->graph_instantiate(pg, 0, NULL, NULL, &pe));
  adoptable = 1;
  CHECK_OK(tp_graph_adoptable(pg, &adoptable));
  CHECK_EQ_INT(adoptable, 0);
  CHECK_EQ_INT(tp_graph_exec_adopt(&e, pe, pg, 0), TP_ERROR_INVALID_VALUE);
  drop_graph(pg, pe);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

static void test_bad_input(void) {
  int dummy;
  tp_graph_exec_t e = (tp_graph_exec_t)&dummy;
  CHECK_EQ_INT(tp_graph_exec_adopt(NULL, &dummy, &dummy, 0),
               TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_adopt(&e, NULL, &dummy, 0),
               TP_ERROR_INVALID_VALUE);
  CHECK(e == NULL);
  CHECK_EQ_INT(tp_graph_exec_adopt(&e, &dummy, NULL, 0),
               TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_adopt(&e, &dummy, &dummy, 0),
               TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_find(NULL, &dummy), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_find(&e, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_exec_find(&e, &dummy), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(tp_graph_forget(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_graph_forget(&dummy));
  int adoptable = 1;
  CHECK_EQ_INT(tp_graph_adoptable(NULL, &adoptable), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(adoptable, 0);
  CHECK_EQ_INT(tp_graph_adoptable(&dummy, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_graph_adoptable(&dummy, &adoptable));
  CHECK_EQ_INT(adoptable, 0);
}

/* One thread launches and frees an adopted exec in a loop while another
 * finds it and destroys it: each launch is whole or refused, and nothing
 * is freed twice or lost. */
typedef struct race {
  tp_stream_t s;
  tp__pexec *pe;
  void *p;
  atomic_int go, stop;
  int launches;
} race_t;

static void *launcher(void *arg) {
  race_t *r = arg;
  while (!atomic_load(&r->go))
    sched_yield();
  while (!atomic_load(&r->stop)) {
    tp_graph_exec_t e = NULL;
    if (tp_graph_exec_find(&e, r->pe) != TP_SUCCESS)
      break;
    tp_error_t err = tp_graph_launch(e, r->s);
    if (err != TP_SUCCESS) {
      CHECK_EQ_INT(err, TP_ERROR_INVALID_VALUE);
      break;
    }
    r->launches++;
    CHECK_OK(tp_free_async(r->p, r->s));
  }
  return NULL;
}

static void test_race_destroy(void) {
  for (int round = 0; round < 50; round++) {
    race_t r = {0};
    REQUIRE_OK(tp_stream_create(&r.s, TP_STREAM_NON_BLOCKING));
    tp__pgraph *pg;
    REQUIRE(make_graph(r.s, 4096, 0, &r.p, &pg, &r.pe));
    tp_graph_exec_t e = NULL;
    REQUIRE_OK(tp_graph_exec_adopt(&e, r.pe, pg, 0));
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, launcher, &r) == 0);
    atomic_store(&r.go, 1);
    check_sleep_us(50 * (round % 7));
    CHECK_OK(tp_graph_exec_destroy(e));
    atomic_store(&r.stop, 1);
    pthread_join(t, NULL);
    CHECK_EQ_INT(tp_graph_launch(e, r.s), TP_ERROR_INVALID_VALUE);
    drop_graph(pg, r.pe);
    CHECK_OK(tp_stream_synchronize(r.s));
    CHECK_OK(tp_stream_destroy(r.s));
  }
}

/* Two threads adopting one exec at once get the same exec, both of them:
 * the second once found nothing adopted yet and was refused (1 round in
 * a few hundred, on the fake driver). */
typedef struct twin_t {
  pthread_barrier_t bar;
  tp__pexec *pe;
  tp__pgraph *pg;
  tp_graph_exec_t got[2];
  tp_error_t err[2];
} twin_t;

static twin_t twin;

static void *twin_adopter(void *arg) {
  int i = (int)(intptr_t)arg;
  pthread_barrier_wait(&twin.bar);
  twin.err[i] = tp_graph_exec_adopt(&twin.got[i], twin.pe, twin.pg, 0);
  return NULL;
}

static void test_adopt_twice_at_once(void) {
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE(pthread_barrier_init(&twin.bar, NULL, 2) == 0);
  int refused = 0, different = 0;
  for (int round = 0; round < 1500 && !check_failure_count(); round++) {
    void *p = NULL;
    if (!make_graph(s, 4096, 0, &p, &twin.pg, &twin.pe))
      break;
    pthread_t t[2];
    for (intptr_t i = 0; i < 2; i++)
      REQUIRE(pthread_create(&t[i], NULL, twin_adopter, (void *)i) == 0);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], NULL);
    refused += twin.err[0] != TP_SUCCESS || twin.err[1] != TP_SUCCESS;
    different += !twin.err[0] && !twin.err[1] && twin.got[0] != twin.got[1];
    tp_graph_exec_t x = twin.err[0] ? twin.got[1] : twin.got[0];
    if (x && CHECK_OK(tp_graph_launch(x, s)))
      CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    if (x)
      CHECK_OK(tp_graph_exec_destroy(x));
    drop_graph(twin.pg, twin.pe);
  }
  pthread_barrier_destroy(&twin.bar);
  CHECK_EQ_INT(refused, 0);
  CHECK_EQ_INT(different, 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

int main(void) {
  /* Graph memory as on cuda: before tidepool starts, where it is read. */
  setenv("TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE", "1", 1);
  const char *platform = tp_platform_name();
  if (!platform) {
    printf("no platform could start\n");
    return 1;
  }
  printf("platform %s\n", platform);
  RUN_TEST(test_bad_input);
  RUN_TEST(test_rules);
  RUN_TEST(test_forget);
  RUN_TEST(test_race_destroy);
  RUN_TEST(test_adopt_twice_at_once);
  return check_done();
}
