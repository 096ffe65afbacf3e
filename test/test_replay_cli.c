/* Tests of tidepool-replay's command line, run as a user runs it: options
 * before and after the traces and as --opt=value, JSON that escapes odd
 * file names, an out-of-memory that names the trace line and the device's
 * size, skipped frees and double allocations in the human output, a
 * directory, plots and Perfetto files of several traces, repeated passes
 * through one pool, the lag measurement, a snapshot's comparison with
 * PyTorch's allocator, and the answers to bad options. */
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char dir[] = "/tmp/tp_cli_test.XXXXXX";

static void path_of(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", dir, name);
}

static void write_file(const char *name, const char *text) {
  char path[512];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "w");
  REQUIRE_EXIT(f != NULL);
  fputs(text, f);
  fclose(f);
}

/* Runs the tool with `args` (a shell fragment, in the test directory) and
 * returns its exit status, with stdout and stderr together in out. */
static int run(const char *env, const char *args, char *out, size_t len) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && %s '%s' --no-progress --platform host %s 2>&1", dir,
           env ? env : "", TP_REPLAY_BIN, args);
  FILE *p = popen(cmd, "r");
  REQUIRE_EXIT(p != NULL);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = '\0';
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void expect_in(const char *out, const char *want) {
  if (!strstr(out, want))
    CHECK_FAIL("output lacks '%s':\n%s", want, out);
}

/* Whether this build runs under ThreadSanitizer (the tool is built alike). */
#if defined(__SANITIZE_THREAD__)
static const bool under_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
static const bool under_tsan = true;
#else
static const bool under_tsan = false;
#endif
#else
static const bool under_tsan = false;
#endif

static char out[1 << 16];

static const char small[] = "action,addr,size,stream\n"
                            "alloc,1,1000,0\n"
                            "alloc,2,3000,0\n"
                            "free_requested,1,1000,0\n"
                            "free_requested,2,3000,0\n";

static void test_options_anywhere(void) {
  write_file("small.csv", small);
  CHECK_EQ_INT(run(NULL, "small.csv --json --lag=3", out, sizeof out), 0);
  expect_in(out, "\"trace\":\"small\"");
  expect_in(out, "\"lag\":3");
  CHECK_EQ_INT(
      run(NULL, "--threshold=1M --lag 2 small.csv --json", out, sizeof out), 0);
  expect_in(out, "\"lag\":2");
  expect_in(out, "\"threshold\":1048576");
}

static void test_bad_options(void) {
  write_file("small.csv", small);
  CHECK_EQ_INT(run(NULL, "small.csv --bogus", out, sizeof out), 2);
  expect_in(out, "unknown option '--bogus'");
  CHECK_EQ_INT(run(NULL, "small.csv --lag", out, sizeof out), 2);
  expect_in(out, "'--lag' needs a value");
  CHECK_EQ_INT(run(NULL, "small.csv --lag=-1", out, sizeof out), 2);
  expect_in(out, "--lag takes a count");
  /* strtoull would take the space and the sign: 2^64 - 1 bytes. */
  CHECK_EQ_INT(run(NULL, "small.csv --threshold ' -1'", out, sizeof out), 2);
  expect_in(out, "bad --threshold");
  /* Nothing is replayed to draw (both were once dropped without a word). */
  CHECK_EQ_INT(
      run(NULL, "small.csv --measure-lag --plot=m.svg", out, sizeof out), 2);
  expect_in(out, "--measure-lag replays nothing");
  CHECK_EQ_INT(run(NULL, "--json", out, sizeof out), 2);
  expect_in(out, "no trace given");
  CHECK_EQ_INT(run(NULL, "--help", out, sizeof out), 0);
  expect_in(out, "1 us stands for");
}

/* Figures that cannot be written fail the run (it once exited 0 with its
 * output lost); a carriage return alone ends no line (it once hid the rest
 * of the file in line 1, and a 1 GiB allocation with it); a flag given a
 * value is told so; a stray control byte is shown as its code. */
static void test_output_and_line_ends(void) {
  write_file("small.csv", small);
  CHECK_EQ_INT(run(NULL, "small.csv >/dev/full", out, sizeof out), 1);
  CHECK_EQ_INT(run(NULL, "small.csv --json >/dev/full", out, sizeof out), 1);
  write_file("cr.csv", "action,addr,size,stream\ralloc,1,1073741824,0\n"
                       "alloc,2,20,0\n");
  CHECK_EQ_INT(run(NULL, "cr.csv", out, sizeof out), 1);
  expect_in(out, "cr.csv:1: a carriage return without a line feed");
  write_file("crlf.csv", "action,addr,size,stream\r\nalloc,1,100,0\r\n"
                         "free_requested,1,100,0\r\n");
  CHECK_EQ_INT(run(NULL, "crlf.csv", out, sizeof out), 0);
  write_file("crcr.csv", "action,addr,size,stream\nalloc,1,10,0\r\r\n");
  CHECK_EQ_INT(run(NULL, "crcr.csv", out, sizeof out), 1);
  expect_in(out, "crcr.csv:2: stream has a stray byte 0x0d");
  /* In an RMM log, in the fields that are never parsed too. */
  write_file("rmm_cr.csv", "Thread,Time,Action,Pointer,Size,Stream\n"
                           "1,0\r,allocate,0x10,100,0\n");
  CHECK_EQ_INT(run(NULL, "rmm_cr.csv", out, sizeof out), 1);
  expect_in(out, "rmm_cr.csv:2: a carriage return without a line feed");
  CHECK_EQ_INT(run(NULL, "small.csv --json=1", out, sizeof out), 2);
  expect_in(out, "option '--json=1' takes no value");
}

/* A file named we"ird\name.csv gives valid JSON: the quote and the
 * backslash escaped. */
static void test_json_escapes(void) {
  write_file("we\"ird\\name.csv", small);
  CHECK_EQ_INT(run(NULL, "'we\"ird\\name.csv' --json", out, sizeof out), 0);
  expect_in(out, "\"trace\":\"we\\\"ird\\\\name\"");
}

/* 100 MiB asked for on line 3 of a device of 64 MiB. */
static void test_oom(void) {
  write_file("big.csv", "action,addr,size,stream\n"
                        "alloc,1,1000,0\n"
                        "alloc,2,104857600,0\n");
  CHECK_EQ_INT(
      run("TIDEPOOL_HOST_DEVICE_MEMORY=64M", "big.csv", out, sizeof out), 1);
  expect_in(out, "big.csv:3: allocating 104857600 bytes");
  expect_in(out, "TP_ERROR_OUT_OF_MEMORY");
  expect_in(out, "TIDEPOOL_HOST_DEVICE_MEMORY=64M");
}

/* The emulated device has the replay's 32 GiB also where
 * TIDEPOOL_HOST_DEVICE_MEMORY is set but empty, which the host platform
 * reads as unset (the replay kept the empty value, and the platform's 4
 * GiB refused a 5 GiB allocation). */
static void test_empty_device_memory(void) {
  write_file("five.csv", "action,addr,size,stream\n"
                         "alloc,1,5368709120,0\n"
                         "free_requested,1,5368709120,0\n");
  CHECK_EQ_INT(run("TIDEPOOL_HOST_DEVICE_MEMORY=", "five.csv", out, sizeof out),
               0);
  expect_in(out, "five ");
  /* A device of 32 TiB: its pools' ranges, four times the device, could
   * not be reserved, and every pool of it failed with OUT_OF_MEMORY. Not
   * under ThreadSanitizer, whose layout leaves a process no 64 TiB. */
  if (under_tsan) {
    printf("   (32 TiB device: not under ThreadSanitizer)\n");
    return;
  }
  write_file("small.csv", small);
  CHECK_EQ_INT(
      run("TIDEPOOL_HOST_DEVICE_MEMORY=32T", "small.csv", out, sizeof out), 0);
}

/* The growth slack the pools had is in the output, also where
 * TIDEPOOL_GROWTH_SLACK chose it (the JSON said -1 and the text nothing). */
static void test_growth_slack_shown(void) {
  write_file("small.csv", small);
  CHECK_EQ_INT(run("TIDEPOOL_GROWTH_SLACK=", "small.csv", out, sizeof out), 0);
  expect_in(out, "growth slack 3906 ppm");
  CHECK_EQ_INT(run("TIDEPOOL_GROWTH_SLACK=25000", "small.csv", out, sizeof out),
               0);
  expect_in(out, "growth slack 25000 ppm");
  CHECK_EQ_INT(
      run("TIDEPOOL_GROWTH_SLACK=25000", "--json small.csv", out, sizeof out),
      0);
  expect_in(out, "\"growth_slack\":25000");
  CHECK_EQ_INT(run("TIDEPOOL_GROWTH_SLACK=25000",
                   "--growth-slack 0 --json small.csv", out, sizeof out),
               0);
  expect_in(out, "\"growth_slack\":0}");
}

static void test_notes(void) {
  write_file("notes.csv", "action,addr,size,stream\n"
                          "free_requested,9,100,0\n"
                          "alloc,1,1000,0\n"
                          "alloc,1,2000,0\n"
                          "free_requested,1,2000,0\n");
  CHECK_EQ_INT(run(NULL, "notes.csv", out, sizeof out), 0);
  expect_in(out, "note: 1 free of no live allocation");
  expect_in(out, "1 allocation at an address still live");

  /* An allocation of 0 bytes gives no pointer, and its free is no free of
   * an allocation never made (it was counted as one). */
  write_file("zero.csv", "action,addr,size,stream\n"
                         "alloc,1,0,0\n"
                         "free_requested,1,0,0\n");
  CHECK_EQ_INT(run(NULL, "zero.csv", out, sizeof out), 0);
  if (strstr(out, "never made"))
    CHECK_FAIL("a 0-byte allocation's free was counted as foreign:\n%s", out);
}

static void test_directory(void) {
  char sub[512];
  path_of(sub, sizeof sub, "adir");
  REQUIRE_EXIT(mkdir(sub, 0700) == 0);
  CHECK_EQ_INT(run(NULL, "adir", out, sizeof out), 1);
  expect_in(out, "adir: is a directory");
}

static char *slurp(const char *name) {
  char path[512];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Two traces, one chart and one Perfetto process each; the Perfetto file
 * says what its time axis counts. */
static void test_plots(void) {
  write_file("one.csv", small);
  write_file("two.csv", small);
  CHECK_EQ_INT(run(NULL, "one.csv two.csv --plot=p.svg --perfetto p.json", out,
                   sizeof out),
               0);
  const char *svg = slurp("p.svg");
  REQUIRE(svg != NULL);
  expect_in(svg, ">one: peak reserved");
  expect_in(svg, ">two: peak reserved");
  const char *json = slurp("p.json");
  REQUIRE(json != NULL);
  expect_in(json, "\"pid\":1");
  expect_in(json, "\"pid\":2");
  expect_in(json, "1 us = 1 operation of the trace");
  /* A control character in a trace's name, which XML allows in no form,
   * is drawn as '?' (the SVG was once no valid XML). */
  write_file("a\001b.csv", small);
  CHECK_EQ_INT(run(NULL, "a?b.csv --plot=q.svg", out, sizeof out), 0);
  const char *q = slurp("q.svg");
  REQUIRE(q != NULL);
  expect_in(q, ">a?b: peak reserved");
  for (const char *c = q; *c; c++)
    if ((unsigned char)*c < 0x20 && *c != '\n' && *c != '\t' && *c != '\r')
      CHECK_FAIL("the SVG holds the control byte 0x%02x", (unsigned char)*c);
  /* A byte that is no UTF-8 (a name of another encoding, or one cut inside
   * a character) is drawn as U+FFFD, not copied. */
  write_file("c\377d.csv", small);
  CHECK_EQ_INT(run(NULL, "c?d.csv --plot=r.svg", out, sizeof out), 0);
  const char *r = slurp("r.svg");
  REQUIRE(r != NULL);
  expect_in(r, ">c&#xfffd;d: peak reserved");
  if (strchr(r, '\377'))
    CHECK_FAIL("the SVG holds the byte 0xff");
}

/* A trace of two streams that leaves allocations live at its end, makes an
 * allocation of 0 bytes and frees one it never made: what a pass must
 * leave behind as it found it for the next to start alike. */
static const char steps[] = "action,addr,size,stream\n"
                            "alloc,1,1048576,0\n"
                            "alloc,2,3000,1\n"
                            "alloc,3,0,0\n"
                            "free_requested,3,0,0\n"
                            "free_requested,9,100,0\n"
                            "alloc,4,4194304,1\n"
                            "free_requested,1,1048576,0\n"
                            "alloc,5,2097152,0\n"
                            "free_requested,4,4194304,1\n"
                            "free_requested,5,2097152,0\n"
                            "alloc,6,8192,0\n";

/* The number after "key": in a JSON line, or UINT64_MAX where the key is
 * missing (which no figure checked here can be). */
static uint64_t json_u64(const char *json, const char *key) {
  char want[64];
  snprintf(want, sizeof want, "\"%s\":", key);
  const char *at = strstr(json, want);
  return at ? strtoull(at + strlen(want), NULL, 10) : UINT64_MAX;
}

/* --passes replays the trace again through the same pool: the first pass's
 * figures stay what a run of one pass gives, the later passes' operations
 * are summed, the live allocations a pass leaves are freed before the
 * next (or the peak in use would grow), and a run of one pass prints no
 * new key. */
static void test_passes(void) {
  write_file("steps.csv", steps);
  static const char *const bad[] = {"0", "101", "x", "-1", "''", "' 2'"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char args[64];
    snprintf(args, sizeof args, "steps.csv --passes %s", bad[i]);
    CHECK_EQ_INT(run(NULL, args, out, sizeof out), 2);
    expect_in(out, "--passes takes a count of passes from 1 to 100");
  }
  CHECK_EQ_INT(run(NULL, "steps.csv --passes=", out, sizeof out), 2);
  expect_in(out, "--passes takes a count");

  CHECK_EQ_INT(run(NULL, "steps.csv --json", out, sizeof out), 0);
  if (strstr(out, "\"passes\"") || strstr(out, "warm_"))
    CHECK_FAIL("a run of one pass prints the passes' keys:\n%s", out);
  uint64_t ops = json_u64(out, "ops"), used = json_u64(out, "peak_used");
  uint64_t reserved = json_u64(out, "peak_reserved");
  uint64_t allocs = json_u64(out, "allocs"), maps = json_u64(out, "chunk_maps");
  CHECK_EQ_U64(ops, 9);
  CHECK_EQ_U64(allocs, 6);
  CHECK_EQ_U64(json_u64(out, "skipped_frees"), 1);

  CHECK_EQ_INT(run(NULL, "--passes 3 steps.csv --json", out, sizeof out), 0);
  CHECK_EQ_U64(json_u64(out, "passes"), 3);
  CHECK_EQ_U64(json_u64(out, "ops"), ops);
  CHECK_EQ_U64(json_u64(out, "warm_ops"), 2 * ops);
  CHECK_EQ_U64(json_u64(out, "allocs"), allocs);
  CHECK_EQ_U64(json_u64(out, "peak_used"), used);
  /* The row's peaks are the first pass's; the later passes' may be higher. */
  CHECK_EQ_U64(json_u64(out, "peak_reserved"), reserved);
  CHECK(json_u64(out, "all_peak_reserved") >= reserved &&
        json_u64(out, "all_peak_reserved") != UINT64_MAX);
  CHECK_EQ_U64(json_u64(out, "chunk_maps"), maps);
  CHECK_EQ_U64(json_u64(out, "skipped_frees"), 1);
  /* The pool keeps what it mapped (threshold max): the same trace again
   * needs no chunk more. */
  CHECK_EQ_U64(json_u64(out, "warm_maps"), 0);
  CHECK_EQ_U64(json_u64(out, "warm_unmaps"), 0);
  if (json_u64(out, "warm_ops_per_s") == UINT64_MAX ||
      json_u64(out, "warm_seconds") == UINT64_MAX)
    CHECK_FAIL("the JSON lacks the later passes' speed:\n%s", out);

  CHECK_EQ_INT(run(NULL, "steps.csv --passes=3", out, sizeof out), 0);
  expect_in(out, "\n  passes 2-3: ");
  expect_in(out, " ops/s, 0 maps, 0 unmaps; ratio over every pass ");
  CHECK_EQ_INT(run(NULL, "steps.csv --passes=2", out, sizeof out), 0);
  expect_in(out, "\n  pass 2: ");
}

static void test_measure_lag(void) {
  write_file("rec.csv", "action,addr,size,stream,done\n"
                        "alloc,1,100,0,-1\n"
                        "alloc,2,100,0,-1\n"
                        "alloc,3,100,0,0\n"
                        "free_requested,1,100,0,0\n"
                        "free_requested,2,100,0,3\n");
  CHECK_EQ_INT(
      run(NULL, "--measure-lag rec.csv small.csv --json", out, sizeof out), 0);
  expect_in(out, "\"trace\":\"rec\",\"ops\":5,\"lag_known\":3");
  expect_in(out, "\"lag_median\":2");
  expect_in(out, "\"lag_max\":3");
  expect_in(out, "\"trace\":\"small\",\"lag_known\":0");
}

static void test_snapshot(void) {
  CHECK_EQ_INT(
      run(NULL, "'" TP_TEST_DATA "/snapshot_small.pickle'", out, sizeof out),
      0);
  expect_in(out, "your allocator: peak reserved 22.0 MiB (ratio 5.7672)");
  /* Events on two devices: the one with the most is replayed, and a note
   * says so (the other was dropped without a word). */
  CHECK_EQ_INT(run(NULL, "'" TP_TEST_DATA "/snapshot_two_devices.pickle'", out,
                   sizeof out),
               0);
  expect_in(out, "events on 2 devices; only device 1's");
  CHECK_EQ_INT(run(NULL,
                   "--json '" TP_TEST_DATA "/snapshot_two_devices.pickle'", out,
                   sizeof out),
               0);
  expect_in(out, "\"device\":1,\"devices_with_events\":2");
}

int main(void) {
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  if (access(TP_REPLAY_BIN, X_OK) != 0) {
    printf("SKIP: %s is not built\n", TP_REPLAY_BIN);
    return 77;
  }
  RUN_TEST(test_options_anywhere);
  RUN_TEST(test_bad_options);
  RUN_TEST(test_json_escapes);
  RUN_TEST(test_output_and_line_ends);
  RUN_TEST(test_oom);
  RUN_TEST(test_empty_device_memory);
  RUN_TEST(test_growth_slack_shown);
  RUN_TEST(test_notes);
  RUN_TEST(test_directory);
  RUN_TEST(test_plots);
  RUN_TEST(test_passes);
  RUN_TEST(test_measure_lag);
  RUN_TEST(test_snapshot);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
