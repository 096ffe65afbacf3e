/* Tests of the trace replay's CSV format: the parser's answers to bad input
 * (missing file, a directory, truncated gzip, malformed and unknown lines,
 * each naming file and line), the optional completion column and the lag
 * measured from it, double allocations, and the replay's accounting against
 * an independent count. */
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "replay.h"
#include "trace.h"

static char dir[] = "/tmp/tp_trace_test.XXXXXX";

static void path_of(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", dir, name);
}

/* Writes `text` gzip'd, or only its first `cut` compressed bytes. */
static void write_gz(const char *name, const char *text, long cut) {
  char path[256], tmp[256];
  path_of(path, sizeof path, name);
  path_of(tmp, sizeof tmp, "whole.gz");
  gzFile f = gzopen(cut >= 0 ? tmp : path, "wb");
  REQUIRE_EXIT(f != NULL);
  CHECK(gzputs(f, text) >= 0);
  CHECK_EQ_INT(gzclose(f), Z_OK);
  if (cut < 0)
    return;
  FILE *in = fopen(tmp, "rb"), *out = fopen(path, "wb");
  REQUIRE_EXIT(in && out);
  for (long i = 0; i < cut; i++) {
    int c = fgetc(in);
    if (c == EOF)
      break;
    fputc(c, out);
  }
  fclose(in);
  fclose(out);
}

/* Loads a trace expected to fail, with a message that contains `want`. */
static void expect_error(const char *name, const char *want) {
  char path[256], err[512] = "";
  path_of(path, sizeof path, name);
  trace t;
  check_context(name);
  CHECK_EQ_INT(trace_load(&t, path, err, sizeof err), -1);
  if (!strstr(err, want))
    CHECK_FAIL("message '%s' lacks '%s'", err, want);
  if (!strstr(err, path))
    CHECK_FAIL("message '%s' does not name the file", err);
  check_context(NULL);
}

static void test_parser_errors(void) {
  expect_error("missing.csv.gz", "cannot open");
  write_gz("header.csv.gz", "what,ever\nalloc,1,2,0\n", -1);
  expect_error("header.csv.gz", ":1: expected the header");
  write_gz("unknown.csv.gz",
           "action,addr,size,stream\nalloc,1,2,0\nresize,1,3,0\n", -1);
  expect_error("unknown.csv.gz", ":3: unknown action 'resize'");
  write_gz("fields.csv.gz", "action,addr,size,stream\nalloc,1,2\n", -1);
  expect_error("fields.csv.gz", ":2: the stream field is missing");
  write_gz("number.csv.gz", "action,addr,size,stream\nalloc,1,12x,0\n", -1);
  expect_error("number.csv.gz", ":2: size has a stray character");
  write_gz("extra.csv.gz", "action,addr,size,stream\nalloc,1,2,0,9\n", -1);
  expect_error("extra.csv.gz", ":2: more than four fields");
  write_gz("done_missing.csv.gz",
           "action,addr,size,stream,done\nalloc,1,2,0,-1\nalloc,3,2,0\n", -1);
  expect_error("done_missing.csv.gz", ":3: the done field is missing");
  write_gz("done_future.csv.gz",
           "action,addr,size,stream,done\nalloc,1,2,0,-1\nalloc,3,2,0,5\n", -1);
  expect_error("done_future.csv.gz", ":3: done 5 names an operation after");
  write_gz("done_six.csv.gz", "action,addr,size,stream,done\nalloc,1,2,0,0,1\n",
           -1);
  expect_error("done_six.csv.gz", ":2: more than five fields");
  write_gz("header_only.csv.gz", "action,addr,size,stream\n", -1);
  expect_error("header_only.csv.gz", "no allocations or frees");
  char sub[256];
  path_of(sub, sizeof sub, "a_directory.csv.gz");
  REQUIRE_EXIT(mkdir(sub, 0700) == 0);
  expect_error("a_directory.csv.gz", "is a directory");
  write_gz("stream.csv.gz", "action,addr,size,stream\nalloc,1,2,70000\n", -1);
  expect_error("stream.csv.gz", ":2: stream 70000 is out of range");
  char longline[600] = "action,addr,size,stream\nalloc,1,2,0";
  memset(longline + strlen(longline), '0', 400);
  longline[sizeof longline - 1] = '\0';
  write_gz("long.csv.gz", longline, -1);
  expect_error("long.csv.gz", ":2: line too long");
  write_gz("big.csv.gz",
           "action,addr,size,stream\nalloc,1,99999999999999999999999,0\n", -1);
  expect_error("big.csv.gz", ":2: size is too large");
  /* A long trace cut in the middle of its compressed bytes. */
  char *text = malloc(1 << 20);
  REQUIRE_EXIT(text != NULL);
  size_t at = (size_t)sprintf(text, "action,addr,size,stream\n");
  for (int i = 0; i < 20000; i++)
    at += (size_t)sprintf(text + at, "alloc,%d,%d,0\nfree_requested,%d,%d,0\n",
                          1000 + i, 512 + i, 1000 + i, 512 + i);
  write_gz("cut.csv.gz", text, 20000);
  free(text);
  expect_error("cut.csv.gz", "truncated");
  char path[256];
  path_of(path, sizeof path, "empty.csv.gz");
  FILE *f = fopen(path, "wb");
  REQUIRE_EXIT(f != NULL);
  fclose(f);
  expect_error("empty.csv.gz", "empty");
}

/* Frees of names never allocated (and of names freed already) are skipped;
 * a name reused after its free is a new allocation. */
static void test_names(void) {
  write_gz("names.csv.gz",
           "action,addr,size,stream\n"
           "free_requested,7,100,0\n" /* allocated before recording */
           "alloc,1,1000,0\n"
           "alloc,2,3000,1\n"
           "free_requested,1,1000,0\n"
           "free_completed,1,1000,0\n"
           "free_requested,1,1000,0\n" /* a second free of name 1 */
           "alloc,1,5000,0\n"          /* the address again: a new one */
           "free_requested,1,5000,1\n",
           -1);
  char path[256], err[512];
  path_of(path, sizeof path, "names.csv.gz");
  trace t;
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  CHECK_EQ_U64(t.nops, 8);
  CHECK_EQ_U64(t.nallocs, 3);
  CHECK_EQ_INT(t.nnames, 3);
  CHECK_EQ_INT(t.nstreams, 2);
  CHECK_EQ_INT(t.ops[0].name, (int64_t)TRACE_NO_NAME);
  CHECK_EQ_INT(t.ops[3].name, t.ops[1].name);
  CHECK_EQ_INT(t.ops[5].name, (int64_t)TRACE_NO_NAME);
  CHECK_EQ_U64(t.unknown_frees, 2);
  CHECK_EQ_U64(t.double_allocs, 0);
  CHECK_EQ_U64(t.peak_live, 8000);
  /* Each operation knows its line, for messages. */
  CHECK_EQ_INT(t.ops[0].where, 2);
  CHECK_EQ_INT(t.ops[7].where, 9);
  CHECK(t.done == NULL);
  CHECK(t.ops[6].name != t.ops[1].name);
  CHECK_EQ_INT(t.ops[7].name, t.ops[6].name);

  replay_options o = {.threshold = UINT64_MAX};
  replay_result r;
  REQUIRE_EXIT(replay_trace(&o, &t, &r, err, sizeof err) == 0);
  CHECK_EQ_U64(r.allocs, 3);
  CHECK_EQ_U64(r.ops, 5);
  CHECK_EQ_U64(r.skipped_frees, 2);
  /* Live bytes peak at 3000 + 5000 after the third allocation. */
  CHECK_EQ_U64(r.peak_used, 8000);
  CHECK(r.peak_reserved >= r.peak_used);
  CHECK(r.maps >= 1);
  trace_free(&t);
}

/* An allocation at an address that is still live: counted, and the earlier
 * allocation stays live (the trace never frees it), in the reader's count
 * and in the replay's. */
static void test_double_alloc(void) {
  write_gz("double.csv.gz",
           "action,addr,size,stream\n"
           "alloc,1,1000,0\n"
           "alloc,1,3000,0\n" /* address 1 again, still live */
           "free_requested,1,3000,0\n",
           -1);
  char path[256], err[512];
  path_of(path, sizeof path, "double.csv.gz");
  trace t;
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  CHECK_EQ_U64(t.double_allocs, 1);
  CHECK_EQ_U64(t.nallocs, 2);
  CHECK_EQ_U64(t.peak_live, 4000);
  CHECK_EQ_INT(t.ops[2].name, t.ops[1].name);
  replay_options o = {.threshold = UINT64_MAX};
  replay_result r;
  REQUIRE_EXIT(replay_trace(&o, &t, &r, err, sizeof err) == 0);
  CHECK_EQ_U64(r.peak_used, 4000);
  CHECK_EQ_U64(r.skipped_frees, 0);
  trace_free(&t);
}

/* The fifth column and the lag measured from it: operations issued since
 * the newest operation of the same stream known complete. */
static void test_done_column(void) {
  write_gz("done.csv.gz",
           "action,addr,size,stream,done\n"
           "alloc,1,100,0,-1\n"          /* 0: nothing known yet */
           "alloc,2,100,0,-1\n"          /* 1 */
           "free_requested,1,100,0,0\n"  /* 2: lag 2 */
           "alloc,3,100,1,-1\n"          /* 3: another stream, nothing known */
           "alloc,4,100,0,2\n"           /* 4: lag 2 */
           "free_requested,2,100,0,4\n"  /* 5: lag 1 */
           "free_requested,4,100,0,1\n", /* 6: lag 5 */
           -1);
  char path[256], err[512];
  path_of(path, sizeof path, "done.csv.gz");
  trace t;
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  REQUIRE_EXIT(t.done != NULL);
  CHECK_EQ_INT(t.done[0], -1);
  CHECK_EQ_INT(t.done[4], 2);
  replay_lag_stats st;
  REQUIRE_EXIT(replay_measure_lag(&t, &st) == 0);
  CHECK_EQ_U64(st.known, 4);
  CHECK_EQ_U64(st.unknown, 3);
  /* Sorted lags 1, 2, 2, 5. */
  CHECK_EQ_U64(st.median, 2);
  CHECK_EQ_U64(st.p90, 5);
  CHECK_EQ_U64(st.max, 5);
  CHECK(st.mean > 2.49 && st.mean < 2.51);
  /* The column changes nothing in the replay itself: the same trace
   * without it replays to the same figures. */
  replay_options o = {.threshold = UINT64_MAX};
  replay_result r, r4;
  REQUIRE_EXIT(replay_trace(&o, &t, &r, err, sizeof err) == 0);
  trace_free(&t);
  write_gz("done4.csv.gz",
           "action,addr,size,stream\nalloc,1,100,0\nalloc,2,100,0\n"
           "free_requested,1,100,0\nalloc,3,100,1\nalloc,4,100,0\n"
           "free_requested,2,100,0\nfree_requested,4,100,0\n",
           -1);
  path_of(path, sizeof path, "done4.csv.gz");
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  CHECK(t.done == NULL);
  REQUIRE_EXIT(replay_trace(&o, &t, &r4, err, sizeof err) == 0);
  CHECK_EQ_U64(r.peak_used, r4.peak_used);
  CHECK_EQ_U64(r.peak_reserved, r4.peak_reserved);
  CHECK_EQ_U64(r.ops, r4.ops);
  trace_free(&t);
  /* A trace without the column has no distribution. */
  write_gz("nodone.csv.gz", "action,addr,size,stream\nalloc,1,100,0\n", -1);
  path_of(path, sizeof path, "nodone.csv.gz");
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  CHECK_EQ_INT(replay_measure_lag(&t, &st), -1);
  trace_free(&t);
}

/* A seeded random trace: the replay's peak used must equal the peak of
 * live bytes counted here, independently of the pool. */
static void test_accounting(void) {
  check_rng rng = {42};
  size_t cap = 1 << 22, at = 0;
  char *text = malloc(cap);
  REQUIRE_EXIT(text != NULL);
  at += (size_t)sprintf(text, "action,addr,size,stream\n");
  uint64_t live[64] = {0}, cur = 0, peak = 0;
  for (int i = 0; i < 5000; i++) {
    int k = (int)rng_below(&rng, 64);
    int s = (int)rng_below(&rng, 3);
    if (live[k]) {
      at += (size_t)sprintf(text + at, "free_requested,%d,%llu,%d\n", k,
                            (unsigned long long)live[k], s);
      cur -= live[k];
      live[k] = 0;
    } else {
      live[k] = rng_range(&rng, 1, rng_chance(&rng, 20) ? 8u << 20 : 70000);
      at += (size_t)sprintf(text + at, "alloc,%d,%llu,%d\n", k,
                            (unsigned long long)live[k], s);
      cur += live[k];
      if (cur > peak)
        peak = cur;
    }
  }
  write_gz("random.csv.gz", text, -1);
  free(text);
  char path[256], err[512];
  path_of(path, sizeof path, "random.csv.gz");
  trace t;
  REQUIRE_EXIT(trace_load(&t, path, err, sizeof err) == 0);
  replay_timeline tl = {0};
  replay_options o = {.threshold = UINT64_MAX, .timeline = &tl};
  replay_result r;
  REQUIRE_EXIT(replay_trace(&o, &t, &r, err, sizeof err) == 0);
  CHECK_EQ_U64(r.peak_used, peak);
  CHECK(r.peak_reserved >= peak);
  CHECK(r.ratio >= 1.0);
  CHECK(tl.n > 0);
  /* The timeline never shows more used than the peak, nor used above
   * reserved. */
  for (size_t i = 0; i < tl.n; i++)
    CHECK(tl.v[i].used <= peak && tl.v[i].used <= tl.v[i].reserved);
  char svg[256], json[256];
  path_of(svg, sizeof svg, "plot.svg");
  path_of(json, sizeof json, "trace.json");
  FILE *f = fopen(svg, "w");
  REQUIRE_EXIT(f != NULL);
  replay_chart svg_chart = {"random <test>", &tl};
  CHECK_EQ_INT(replay_write_svg(f, &svg_chart, 1), 0);
  fclose(f);
  f = fopen(json, "w");
  REQUIRE_EXIT(f != NULL);
  replay_chart json_chart = {"random \"test\"", &tl};
  CHECK_EQ_INT(replay_write_perfetto(f, &json_chart, 1), 0);
  fclose(f);
  free(tl.v);
  trace_free(&t);
}

int main(void) {
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  RUN_TEST(test_parser_errors);
  RUN_TEST(test_names);
  RUN_TEST(test_double_alloc);
  RUN_TEST(test_done_column);
  RUN_TEST(test_accounting);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
