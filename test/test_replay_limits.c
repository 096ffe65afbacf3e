/* Tests of the trace readers on hostile or huge input, each made here
 * rather than kept as a file: gzip members and what follows the last one,
 * the bounds on what a small file may make the reader hold, and lookups
 * that must not cost the square of the input. */
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "trace.h"

static char dir[] = "/tmp/tp_replay_limits.XXXXXX";

static void path_of(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", dir, name);
}

/* Appends n bytes gzip'd as one member of their own. */
static void append_gz(const char *name, const void *bytes, size_t n) {
  char path[256];
  path_of(path, sizeof path, name);
  gzFile f = gzopen(path, "ab");
  REQUIRE_EXIT(f != NULL);
  CHECK_EQ_INT(gzwrite(f, bytes, (unsigned)n), (int)n);
  CHECK_EQ_INT(gzclose(f), Z_OK);
}

static void append_raw(const char *name, const void *bytes, size_t n) {
  char path[256];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "ab");
  REQUIRE_EXIT(f != NULL);
  CHECK_EQ_U64(fwrite(bytes, 1, n, f), n);
  CHECK_EQ_INT(fclose(f), 0);
}

/* Loads a trace expected to fail, with a message that names the file and
 * contains `want`. */
static void expect_error(const char *name, const char *want) {
  char path[256], err[600] = "";
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

static int load(trace *t, const char *name) {
  char path[256], err[600] = "";
  path_of(path, sizeof path, name);
  if (trace_load(t, path, err, sizeof err) == 0)
    return 0;
  CHECK_FAIL("%s: %s", name, err);
  return -1;
}

/* ---- gzip members ----------------------------------------------------------
 */

static const char head[] = "action,addr,size,stream\nalloc,1,100,0\n";
static const char tail[] = "alloc,2,200,0\nfree_requested,1,0,0\n";

/* Members concatenated (what `cat a.gz b.gz` or gzip's own appending make)
 * read as one stream, as gzip reads them. */
static void test_gzip_members(void) {
  append_gz("members.csv.gz", head, sizeof head - 1);
  append_gz("members.csv.gz", tail, sizeof tail - 1);
  trace t;
  if (load(&t, "members.csv.gz") != 0)
    return;
  CHECK_EQ_U64(t.nops, 3);
  CHECK_EQ_U64(t.nallocs, 2);
  CHECK_EQ_INT(t.ops[2].where, 4);
  trace_free(&t);
}

/* Bytes after the last member that are no member are refused, with the
 * offset where they begin: zlib's gzread skipped them without a word, so
 * that a trace with something else appended read as if whole. */
static void test_gzip_trailing_garbage(void) {
  append_gz("garbage.csv.gz", head, sizeof head - 1);
  append_gz("garbage.csv.gz", tail, sizeof tail - 1);
  static const char junk[] = "alloc,3,300,0\n";
  append_raw("garbage.csv.gz", junk, sizeof junk - 1);
  expect_error("garbage.csv.gz", "that is not another gzip member");
  /* The zeros a tape or a disk image pads with are no member either. */
  append_gz("padded.csv.gz", head, sizeof head - 1);
  static const char zeros[512];
  append_raw("padded.csv.gz", zeros, sizeof zeros);
  expect_error("padded.csv.gz", "after the end of the gzip stream at byte");
  /* One byte, too short for a member's magic. */
  append_gz("one.csv.gz", head, sizeof head - 1);
  append_raw("one.csv.gz", "\x1f", 1);
  expect_error("one.csv.gz", "not another gzip member");
  /* A member cut inside its header is a truncated file. */
  append_gz("cut.csv.gz", head, sizeof head - 1);
  append_raw("cut.csv.gz", "\x1f\x8b\x08", 3);
  expect_error("cut.csv.gz", "truncated");
}

int main(void) {
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  RUN_TEST(test_gzip_members);
  RUN_TEST(test_gzip_trailing_garbage);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
