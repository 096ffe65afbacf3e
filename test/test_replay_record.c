/* Tests of the recording's completion column (TIDEPOOL_TORCH_TRACE with
 * TIDEPOOL_TORCH_TRACE_COMPLETION=1): with a stream held by a gate, the
 * column stays where the stream's completed work stands; once the stream
 * has run, the next operation's column catches up; each stream has its own;
 * and the replay reads the file and measures its lag. */
#include <unistd.h>

#include "check.h"
#include "replay.h"
#include "trace.h"

/* From src/api/api.h: writes out what has been recorded. */
void tp__torch_trace_flush(void);

static char path[64];

static void test_column(void) {
  tp_stream_t s;
  REQUIRE_OK_EXIT(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *a = tp_torch_alloc(100, 0, s); /* 0: nothing known: -1 */
  void *b = tp_torch_alloc(200, 0, s); /* 1: 0 complete */
  gate_t g;
  REQUIRE_OK_EXIT(hold_stream(s, &g));
  void *c = tp_torch_alloc(300, 0, s); /* 2: 1 complete */
  tp_torch_free(a, 100, 0, s);         /* 3: held: still 1 */
  tp_torch_free(b, 200, 0, s);         /* 4: still 1 */
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));
  tp_torch_free(c, 300, 0, s);            /* 5: all before 5: 4 */
  void *d = tp_torch_alloc(400, 0, NULL); /* 6: the legacy stream: -1 */
  tp_torch_free(d, 400, 0, NULL);         /* 7: 6 */
  REQUIRE_EXIT(a && b && c && d);
  tp__torch_trace_flush();

  FILE *f = fopen(path, "r");
  REQUIRE_EXIT(f != NULL);
  char line[256];
  REQUIRE_EXIT(fgets(line, sizeof line, f) != NULL);
  CHECK(strcmp(line, "action,addr,size,stream,done\n") == 0);
  static const long long want[8] = {-1, 0, 1, 1, 1, 4, -1, 6};
  static const int stream_of[8] = {1, 1, 1, 1, 1, 1, 0, 0};
  int n = 0;
  while (fgets(line, sizeof line, f) && n < 8) {
    char action[32];
    unsigned long long addr;
    long long size, done;
    int stream;
    REQUIRE_EXIT(sscanf(line, "%31[^,],%llu,%lld,%d,%lld", action, &addr, &size,
                        &stream, &done) == 5);
    CHECK_EQ_INT(stream, stream_of[n]);
    if (!CHECK_EQ_INT(done, want[n]))
      printf("   at operation %d\n", n);
    n++;
  }
  fclose(f);
  CHECK_EQ_INT(n, 8);
  CHECK_OK(tp_stream_destroy(s));

  /* The replay reads the column: lags 1, 1, 2, 3, 1 and 1. */
  trace t;
  char err[600];
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  replay_lag_stats st;
  REQUIRE_EXIT(replay_measure_lag(&t, &st) == 0);
  CHECK_EQ_U64(st.known, 6);
  CHECK_EQ_U64(st.unknown, 2);
  CHECK_EQ_U64(st.median, 1);
  CHECK_EQ_U64(st.max, 3);
  trace_free(&t);
}

/* A failure of the column's own work (here a free on a stream destroyed
 * since, which the column cannot find) stops the column, and the rest of
 * the file says -1 in it: every line keeps five fields, and the replay
 * still reads the file. The column once vanished from the following lines. */
static void test_column_after_failure(void) {
  tp_stream_t gone;
  REQUIRE_OK_EXIT(tp_stream_create(&gone, TP_STREAM_NON_BLOCKING));
  CHECK_OK(tp_stream_destroy(gone));
  int local = 0;
  tp_torch_free(&local, 4, 0, gone); /* refused, and the column stops */
  void *e = tp_torch_alloc(500, 0, NULL);
  REQUIRE_EXIT(e != NULL);
  tp_torch_free(e, 500, 0, NULL);
  tp__torch_trace_flush();

  FILE *f = fopen(path, "r");
  REQUIRE_EXIT(f != NULL);
  char line[256];
  int n = 0, short_lines = 0;
  long long last_done = 0;
  REQUIRE_EXIT(fgets(line, sizeof line, f) != NULL);
  while (fgets(line, sizeof line, f)) {
    char action[32];
    unsigned long long addr;
    long long size;
    int stream;
    if (sscanf(line, "%31[^,],%llu,%lld,%d,%lld", action, &addr, &size, &stream,
               &last_done) != 5)
      short_lines++;
    n++;
  }
  fclose(f);
  CHECK_EQ_INT(short_lines, 0);
  CHECK(n >= 11);
  CHECK_EQ_INT(last_done, -1);
  trace t;
  char err[600];
  if (!CHECK(trace_load(&t, path, err, sizeof err) == 0))
    printf("   %s\n", err);
  else
    trace_free(&t);
}

int main(void) {
  snprintf(path, sizeof path, "/tmp/tp_record_%d.csv", (int)getpid());
  setenv("TIDEPOOL_TORCH_TRACE", path, 1);
  setenv("TIDEPOOL_TORCH_TRACE_COMPLETION", "1", 1);
  if (!check_on_host()) {
    printf("SKIP: the held streams of this test need the host platform\n");
    return 77;
  }
  RUN_TEST(test_column);
  RUN_TEST(test_column_after_failure);
  remove(path);
  return check_done();
}
