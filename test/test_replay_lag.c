/* Tests of the replay's model of a device that runs behind the host: work
 * queued on a stream completes only once N further operations have been
 * issued, seen through events as the pool sees it; a stream with nothing
 * queued completes at the next operation; the same trace replays to the
 * same figures every run, on one stream and on several (where the pool
 * inserts waits between streams); and nothing is left running. */
#include <unistd.h>

#include "check.h"
#include "lag.h"
#include "platform/host/host_internal.h"
#include "replay.h"
#include "trace.h"

/* An event recorded on stream 0 after operation 0 covers that operation's
 * work; the replay then issues operations on stream 1 only. The event must
 * stay pending through operation N and be complete before operation N + 1,
 * as the model promises, for several N. */
static void test_completes_after_n(void) {
  tp_stream_t streams[2] = {NULL, NULL};
  REQUIRE_OK_EXIT(tp_stream_create(&streams[1], TP_STREAM_NON_BLOCKING));
  tp_event_t ev;
  REQUIRE_OK_EXIT(tp_event_create(&ev));
  static const unsigned lags[] = {1, 2, 5, 17};
  for (size_t li = 0; li < sizeof lags / sizeof lags[0]; li++) {
    unsigned n = lags[li];
    char err[300], label[32];
    snprintf(label, sizeof label, "lag %u", n);
    check_context(label);
    lag_model *m;
    REQUIRE_EXIT(lag_start(&m, n, streams, 2, true, err, sizeof err) == 0);
    REQUIRE_EXIT(lag_before(m, 0, err, sizeof err) == 0);
    REQUIRE_EXIT(lag_after(m, 0, 0, true, err, sizeof err) == 0);
    CHECK_OK(tp_event_record(ev, streams[0]));
    for (uint64_t k = 1; k <= n + 3; k++) {
      REQUIRE_EXIT(lag_before(m, k, err, sizeof err) == 0);
      tp_error_t want = k < n + 1 ? TP_ERROR_NOT_READY : TP_SUCCESS;
      if (!CHECK_ERR(tp_event_query(ev), want))
        printf("   before operation %llu\n", (unsigned long long)k);
      REQUIRE_EXIT(lag_after(m, k, 1, false, err, sizeof err) == 0);
    }
    CHECK_EQ_INT(lag_stop(m, err, sizeof err), 0);
  }
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(streams[1]));
}

/* Work recorded on a stream whose operations have all completed (an idle
 * stream) is complete before the next operation, whatever the lag. */
static void test_idle_stream(void) {
  tp_stream_t streams[2] = {NULL, NULL};
  REQUIRE_OK_EXIT(tp_stream_create(&streams[1], TP_STREAM_NON_BLOCKING));
  tp_event_t ev;
  REQUIRE_OK_EXIT(tp_event_create(&ev));
  char err[300];
  lag_model *m;
  REQUIRE_EXIT(lag_start(&m, 8, streams, 2, true, err, sizeof err) == 0);
  for (uint64_t k = 0; k < 40; k++) {
    REQUIRE_EXIT(lag_before(m, k, err, sizeof err) == 0);
    if (k == 20) {
      /* Stream 1 has had no operation: what is recorded now waits for
       * nothing but the next step of the replay. */
      CHECK_OK(tp_event_record(ev, streams[1]));
      CHECK_ERR(tp_event_query(ev), TP_ERROR_NOT_READY);
    }
    if (k == 21)
      CHECK_OK(tp_event_query(ev));
    REQUIRE_EXIT(lag_after(m, k, 0, false, err, sizeof err) == 0);
  }
  CHECK_EQ_INT(lag_stop(m, err, sizeof err), 0);
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(streams[1]));
}

static char dir[] = "/tmp/tp_lag_test.XXXXXX";

/* A seeded random trace of `nstreams` streams, written as CSV. */
static void random_trace(const char *path, int nstreams, uint64_t seed) {
  FILE *f = fopen(path, "w");
  REQUIRE_EXIT(f != NULL);
  fprintf(f, "action,addr,size,stream\n");
  check_rng rng = {seed};
  uint64_t live[96] = {0};
  int where[96] = {0};
  for (int i = 0; i < 6000; i++) {
    int k = (int)rng_below(&rng, 96);
    int s = (int)rng_below(&rng, (uint64_t)nstreams);
    if (live[k]) {
      /* Mostly freed where allocated, sometimes elsewhere. */
      int fs = rng_chance(&rng, 80) ? where[k] : s;
      fprintf(f, "free_requested,%d,%llu,%d\n", k, (unsigned long long)live[k],
              fs);
      live[k] = 0;
    } else {
      live[k] = rng_range(&rng, 1, rng_chance(&rng, 25) ? 24u << 20 : 90000);
      where[k] = s;
      fprintf(f, "alloc,%d,%llu,%d\n", k, (unsigned long long)live[k], s);
    }
  }
  fclose(f);
}

static void replay_file(const char *path, unsigned lag, replay_result *r) {
  trace t;
  char err[600];
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  replay_options o = {.threshold = UINT64_MAX, .lag = lag};
  if (replay_trace(&o, &t, r, err, sizeof err) != 0)
    CHECK_FAIL("replay with lag %u: %s", lag, err);
  trace_free(&t);
}

/* The same trace, the same figures, every run; and a lag changes them from
 * the ideal device's (else the model would hold nothing back). */
static void test_deterministic(void) {
  static const int streams[] = {1, 3};
  for (size_t si = 0; si < 2; si++) {
    char path[256], label[40];
    snprintf(path, sizeof path, "%s/random%d.csv", dir, streams[si]);
    snprintf(label, sizeof label, "%d stream(s)", streams[si]);
    check_context(label);
    random_trace(path, streams[si], 7 + si);
    replay_result ideal, first, again;
    replay_file(path, 0, &ideal);
    replay_file(path, 6, &first);
    for (int run = 0; run < 3; run++) {
      replay_file(path, 6, &again);
      CHECK_EQ_U64(again.peak_reserved, first.peak_reserved);
      CHECK_EQ_U64(again.peak_used, first.peak_used);
      CHECK_EQ_U64(again.maps, first.maps);
      CHECK_EQ_U64(again.unmaps, first.unmaps);
    }
    CHECK_EQ_U64(first.peak_used, ideal.peak_used);
    CHECK(first.peak_reserved != ideal.peak_reserved ||
          first.maps != ideal.maps || first.unmaps != ideal.unmaps);
  }
  check_context(NULL);
}

/* Every gate is opened and left, and every replay stream destroyed. */
static void test_nothing_left(void) {
  tp__host_quiesce();
  tp__host_live live;
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.streams, 0);
}

int main(void) {
  if (!check_on_host()) {
    printf("SKIP: the lag model's tests run on the host platform\n");
    return 77; /* CTest's SKIP_RETURN_CODE for the replay's tests */
  }
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  RUN_TEST(test_completes_after_n);
  RUN_TEST(test_idle_stream);
  RUN_TEST(test_deterministic);
  RUN_TEST(test_nothing_left);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
