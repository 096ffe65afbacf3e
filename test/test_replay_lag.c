/* Tests of the replay's model of a device that runs behind the host: work
 * queued on a stream completes only once N further operations have been
 * issued, seen through events as the pool sees it; a stream with nothing
 * queued completes at the next operation; the same trace replays to the
 * same figures every run, on one stream and on several (where the pool
 * inserts waits between streams); and nothing is left running. With both
 * kinds of gates: host functions, and cuda's memory operations, emulated
 * here with host functions; and with both models: the precise one of the
 * host platform and the conservative one of cuda, which must agree on one
 * stream and on the bundled multi-stream trace. */
#include <pthread.h>
#include <unistd.h>

#include "check.h"
#include "gates.h"
#include "lag.h"
#include "platform/host/host_internal.h"
#include "replay.h"
#include "trace.h"

/* cuStreamWriteValue32 and cuStreamWaitValue32 as host functions: a wait
 * sleeps on one condition variable that every write and every change the
 * host makes wakes. */
static pthread_mutex_t emu_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t emu_cv = PTHREAD_COND_INITIALIZER;

typedef struct emu_op {
  _Atomic uint32_t *word;
  uint32_t value;
} emu_op;

static void emu_write_fn(void *arg) {
  emu_op *o = arg;
  pthread_mutex_lock(&emu_mu);
  atomic_store_explicit(o->word, o->value, memory_order_release);
  pthread_cond_broadcast(&emu_cv);
  pthread_mutex_unlock(&emu_mu);
  free(o);
}

static void emu_wait_fn(void *arg) {
  emu_op *o = arg;
  pthread_mutex_lock(&emu_mu);
  while ((int32_t)(atomic_load_explicit(o->word, memory_order_acquire) -
                   o->value) < 0)
    pthread_cond_wait(&emu_cv, &emu_mu);
  pthread_mutex_unlock(&emu_mu);
  free(o);
}

static int emu_queue(tp_stream_t s, void (*fn)(void *), _Atomic uint32_t *word,
                     uint32_t value, char *err, size_t len) {
  emu_op *o = malloc(sizeof *o);
  if (!o) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  *o = (emu_op){word, value};
  tp_error_t e = tp_launch_host_func(s, fn, o);
  if (e == TP_SUCCESS)
    return 0;
  free(o);
  snprintf(err, len, "tp_launch_host_func: %s", tp_error_name(e));
  return -1;
}

static int emu_write(void *ctx, tp_stream_t s, _Atomic uint32_t *word,
                     uint32_t value, char *err, size_t len) {
  (void)ctx;
  return emu_queue(s, emu_write_fn, word, value, err, len);
}

static int emu_wait(void *ctx, tp_stream_t s, _Atomic uint32_t *word,
                    uint32_t value, char *err, size_t len) {
  (void)ctx;
  return emu_queue(s, emu_wait_fn, word, value, err, len);
}

static int emu_alloc(void **ctx, _Atomic uint32_t **words, size_t n, char *err,
                     size_t len) {
  *ctx = NULL;
  *words = calloc(n, sizeof **words);
  if (!*words)
    snprintf(err, len, "out of memory");
  return *words ? 0 : -1;
}

static void emu_release(void *ctx, _Atomic uint32_t *words) {
  (void)ctx;
  free((void *)words);
}

static void emu_changed(void *ctx) {
  (void)ctx;
  pthread_mutex_lock(&emu_mu);
  pthread_cond_broadcast(&emu_cv);
  pthread_mutex_unlock(&emu_mu);
}

static const gate_memops emulated = {.name = "emulated",
                                     .alloc = emu_alloc,
                                     .release = emu_release,
                                     .write = emu_write,
                                     .wait = emu_wait,
                                     .changed = emu_changed};

/* The kinds of gates each test runs with: NULL for host functions. */
static const gate_memops *const kinds[] = {NULL, &emulated};
static const char *const kind_names[] = {"host functions", "memory operations"};
#define NKINDS 2

/* A gate holds its stream until opened, tells when the stream has reached
 * it, and reports a stream held by an earlier gate as stalled. */
static void test_gates_hold(void) {
  tp_stream_t streams[2] = {NULL, NULL};
  REQUIRE_OK_EXIT(tp_stream_create(&streams[1], TP_STREAM_NON_BLOCKING));
  tp_event_t ev;
  REQUIRE_OK_EXIT(tp_event_create(&ev));
  for (int kind = 0; kind < NKINDS; kind++) {
    check_context(kind_names[kind]);
    char err[300];
    gates *g;
    REQUIRE_EXIT(gates_start(&g, streams, 2, kinds[kind], err, sizeof err) ==
                 0);
    for (uint16_t s = 0; s < 2; s++) {
      uint64_t seq[3];
      for (int i = 0; i < 3; i++) {
        REQUIRE_EXIT(gates_push(g, s, &seq[i], err, sizeof err) == 0);
        CHECK_EQ_U64(seq[i], (uint64_t)i + 1);
        if (i == 0)
          CHECK_OK(tp_event_record(ev, streams[s]));
      }
      CHECK_EQ_INT(gates_reached(g, s, 1, 10), 0);
      check_sleep_ms(20);
      CHECK_ERR(tp_event_query(ev), TP_ERROR_NOT_READY);
      CHECK_EQ_INT(gates_reached(g, s, 2, 0), GATES_STALLED);
      gates_open(g, s, 1);
      CHECK_EQ_INT(gates_reached(g, s, 2, 10), 0);
      CHECK_OK(tp_event_query(ev));
      CHECK_EQ_INT(gates_reached(g, s, 3, 0), GATES_STALLED);
    }
    uint16_t stuck = 99;
    CHECK_EQ_INT(gates_stop(g, 10, &stuck, err, sizeof err), 0);
  }
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(streams[1]));
}

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
  const size_t nlags = sizeof lags / sizeof lags[0];
  for (size_t li = 0; li < NKINDS * nlags; li++) {
    unsigned n = lags[li % nlags];
    int kind = (int)(li / nlags);
    lag_testing(kinds[kind], kind > 0);
    char err[300], label[64];
    snprintf(label, sizeof label, "%s, lag %u", kind_names[kind], n);
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
  lag_testing(NULL, false);
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
  for (int kind = 0; kind < NKINDS; kind++) {
    check_context(kind_names[kind]);
    lag_testing(kinds[kind], kind > 0);
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
  }
  lag_testing(NULL, false);
  check_context(NULL);
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

static bool same_figures(const replay_result *a, const replay_result *b) {
  return CHECK_EQ_U64(a->peak_reserved, b->peak_reserved) &&
         CHECK_EQ_U64(a->peak_used, b->peak_used) &&
         CHECK_EQ_U64(a->maps, b->maps) && CHECK_EQ_U64(a->unmaps, b->unmaps);
}

/* The replays of a trace under the models to compare. */
enum { PRECISE, CONSERVATIVE, CONSERVATIVE_MEMOPS, MODELS };

static void replay_models(const char *path, unsigned lag,
                          replay_result r[MODELS]) {
  replay_file(path, lag, &r[PRECISE]);
  lag_testing(NULL, true);
  replay_file(path, lag, &r[CONSERVATIVE]);
  lag_testing(&emulated, true);
  replay_file(path, lag, &r[CONSERVATIVE_MEMOPS]);
  lag_testing(NULL, false);
}

/* The same trace, the same figures, every run, with either model and
 * either kind of gates; and a lag changes them from the ideal device's
 * (else the model would hold nothing back). Both kinds of gates give the
 * same figures under one model. The conservative model (cuda's) gives the
 * precise one's figures on one stream; on several streams, where the pool
 * inserts waits between streams, it must never leave a stream blocked. */
static void test_deterministic(void) {
  static const int streams[] = {1, 3};
  static const unsigned lags[] = {1, 6, 16};
  for (size_t si = 0; si < 2; si++) {
    char path[256], label[64];
    snprintf(path, sizeof path, "%s/random%d.csv", dir, streams[si]);
    random_trace(path, streams[si], 7 + si);
    for (size_t li = 0; li < sizeof lags / sizeof lags[0]; li++) {
      snprintf(label, sizeof label, "%d stream(s), lag %u", streams[si],
               lags[li]);
      check_context(label);
      replay_result ideal, first[MODELS], again[MODELS];
      replay_file(path, 0, &ideal);
      replay_models(path, lags[li], first);
      replay_models(path, lags[li], again);
      for (int i = 0; i < MODELS; i++)
        same_figures(&again[i], &first[i]);
      same_figures(&first[CONSERVATIVE_MEMOPS], &first[CONSERVATIVE]);
      if (streams[si] == 1)
        same_figures(&first[CONSERVATIVE], &first[PRECISE]);
      CHECK_EQ_U64(first[PRECISE].peak_used, ideal.peak_used);
      CHECK(first[PRECISE].peak_reserved != ideal.peak_reserved ||
            first[PRECISE].maps != ideal.maps ||
            first[PRECISE].unmaps != ideal.unmaps);
    }
  }
  check_context(NULL);
}

/* On the bundled multi-stream trace the GPU's replay (the conservative
 * model) gives the figures of the host's, which CI keeps, at the default
 * lag and below. At lag 64 the two schedules complete frees at different
 * points, and since a range pending on a stream joins a later free of that
 * stream only during that stream's own calls (src/pool/blocks.c,
 * tags_join), the pools end up laid out differently: the same peak in use,
 * a peak reserved within 2% (636 against 630 MiB when this was written). */
static void test_bundled_multistream(void) {
  const char *path = TP_TEST_DATA "/../../traces/multistream_train.csv.gz";
  if (access(path, R_OK) != 0) {
    printf("   no %s: skipped\n", path);
    return;
  }
  static const unsigned lags[] = {4, 16, 64};
  for (size_t li = 0; li < sizeof lags / sizeof lags[0]; li++) {
    char label[64];
    snprintf(label, sizeof label, "multistream_train, lag %u", lags[li]);
    check_context(label);
    replay_result r[MODELS];
    replay_models(path, lags[li], r);
    same_figures(&r[CONSERVATIVE_MEMOPS], &r[CONSERVATIVE]);
    if (lags[li] <= 16) {
      same_figures(&r[CONSERVATIVE], &r[PRECISE]);
      continue;
    }
    CHECK_EQ_U64(r[CONSERVATIVE].peak_used, r[PRECISE].peak_used);
    double a = (double)r[CONSERVATIVE].peak_reserved,
           b = (double)r[PRECISE].peak_reserved;
    CHECK(a <= 1.02 * b && b <= 1.02 * a);
  }
  check_context(NULL);
}

/* A 300-step training run must not creep far above its peak: the pool
 * once split its segments a little more at each growth that moved chunks,
 * and this trace replayed at 1.0207, against 1.0101 over its first 20
 * steps (docs/design.md, "Memory layout": which chunks move). */
static void test_long_run(void) {
  const char *path = TP_TEST_DATA "/../../traces/gpt_train_long.csv.gz";
  if (access(path, R_OK) != 0) {
    printf("   no %s: skipped\n", path);
    return;
  }
  replay_result r;
  replay_file(path, 16, &r);
  printf("   gpt_train_long at lag 16: %.4f, %llu chunk unmaps\n", r.ratio,
         (unsigned long long)r.unmaps);
  CHECK(r.ratio <= 1.018);
}

/* Every gate is opened and left, and every replay stream destroyed. */
static void test_nothing_left(void) {
  tp__host_quiesce();
  tp__host_live live;
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.streams, 0);
}

int main(void) {
  /* Room for the long run's 7 GiB, as tidepool-replay gives its device. */
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "16G", 0);
  if (!check_on_host()) {
    printf("SKIP: the lag model's tests run on the host platform\n");
    return 77; /* CTest's SKIP_RETURN_CODE for the replay's tests */
  }
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  RUN_TEST(test_gates_hold);
  RUN_TEST(test_completes_after_n);
  RUN_TEST(test_idle_stream);
  RUN_TEST(test_deterministic);
  RUN_TEST(test_bundled_multistream);
  RUN_TEST(test_long_run);
  RUN_TEST(test_nothing_left);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
