/* Tests of the trace readers on hostile or huge input, each made here
 * rather than kept as a file: gzip members and what follows the last one,
 * the bounds on what a small file may make the reader hold, lookups that
 * must not cost the square of the input (timed against a file of the same
 * size made ordinarily), and line numbers counted in 64 bits. */
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "pickle.h"
#include "trace.h"
#include "trace_internal.h"

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

/* ---- the limit on what reading a trace may hold ----------------------------
 */

/* Writes n bytes as they are. */
static void write_raw(const char *name, const void *bytes, size_t n) {
  char path[256];
  path_of(path, sizeof path, name);
  FILE *f = fopen(path, "wb");
  REQUIRE_EXIT(f != NULL);
  CHECK_EQ_U64(fwrite(bytes, 1, n, f), n);
  CHECK_EQ_INT(fclose(f), 0);
}

/* A gzip bomb: 64 MiB of one CSV line, 64 KB gzip'd, against a limit of
 * 16 MiB, refused at the line where the limit was crossed. Before the
 * limit, a 489 KB file of this kind held 903 MB while read. */
static void test_limit_gzip_bomb(void) {
  setenv("TIDEPOOL_REPLAY_MEMORY_LIMIT", "16M", 1);
  char path[256];
  path_of(path, sizeof path, "bomb.csv.gz");
  gzFile f = gzopen(path, "wb9");
  REQUIRE_EXIT(f != NULL);
  CHECK(gzputs(f, "action,addr,size,stream\n") > 0);
  static char block[1 << 16];
  for (size_t i = 0; i + 12 <= sizeof block; i += 12)
    memcpy(block + i, "alloc,0,0,0\n", 12);
  size_t whole = sizeof block / 12 * 12;
  for (int i = 0; i < 1024; i++)
    CHECK_EQ_INT(gzwrite(f, block, (unsigned)whole), (int)whole);
  CHECK_EQ_INT(gzclose(f), Z_OK);
  /* 16 MiB less the header's 24 bytes is line 1398100 and a bit. */
  expect_error("bomb.csv.gz",
               "decompresses to more than 16 MiB, the memory reading a trace "
               "may take (TIDEPOOL_REPLAY_MEMORY_LIMIT), by line 1398101");
  /* A plain file larger than the limit is refused before it is read. */
  static char big[(16 << 20) + 1];
  memset(big, '\n', sizeof big);
  write_raw("big.csv", big, sizeof big);
  expect_error("big.csv", "a file of 16777217 bytes is more than 16 MiB");
  unsetenv("TIDEPOOL_REPLAY_MEMORY_LIMIT");
}

/* Pickles whose opcodes make far more memory than their bytes: a value of
 * 40 bytes for each 'N', a pointer of 8 for each DUP; 4 MiB of either
 * passes a limit of 16 MiB and is refused at the opcode where the values
 * crossed it. Before the limit, 20 KB gzip'd of 'N' held 1.19 GB. */
static void test_limit_pickle(void) {
  setenv("TIDEPOOL_REPLAY_MEMORY_LIMIT", "16M", 1);
  size_t n = 4 << 20;
  char *p = malloc(n + 6);
  REQUIRE_EXIT(p != NULL);
  memcpy(p, "\x80\x04(N", 4);
  memset(p + 4, 'N', n);
  memcpy(p + 4 + n, "l.", 2);
  write_raw("nones.pickle", p, n + 6);
  expect_error("nones.pickle",
               "its values need more than 16 MiB, the memory reading a "
               "trace may take (TIDEPOOL_REPLAY_MEMORY_LIMIT)");
  expect_error("nones.pickle", "nones.pickle: pickle byte ");
  memset(p + 4, '2', n); /* DUP */
  write_raw("dups.pickle", p, n + 6);
  expect_error("dups.pickle", "its values need more than 16 MiB");
  free(p);
  unsetenv("TIDEPOOL_REPLAY_MEMORY_LIMIT");
}

/* Operations cost more than their lines: 24 bytes each and the table of
 * live addresses, against lines of 14 bytes. */
static void test_limit_operations(void) {
  setenv("TIDEPOOL_REPLAY_MEMORY_LIMIT", "16M", 1);
  size_t cap = 16 << 20, at = 0;
  char *text = malloc(cap);
  REQUIRE_EXIT(text != NULL);
  at += (size_t)snprintf(text, cap, "action,addr,size,stream\n");
  for (int i = 0; at + 32 < 8u << 20; i++)
    at += (size_t)snprintf(text + at, cap - at, "alloc,%d,1,0\n", i);
  write_raw("ops.csv", text, at);
  free(text);
  expect_error("ops.csv", "its operations need more than 16 MiB");
  /* Under the limit the same kind of file reads. */
  setenv("TIDEPOOL_REPLAY_MEMORY_LIMIT", "64m", 1);
  trace t;
  if (load(&t, "ops.csv") == 0) {
    CHECK(t.nops > 400000);
    trace_free(&t);
  }
  setenv("TIDEPOOL_REPLAY_MEMORY_LIMIT", "64x", 1);
  expect_error("ops.csv", "TIDEPOOL_REPLAY_MEMORY_LIMIT=64x is not a byte");
  unsetenv("TIDEPOOL_REPLAY_MEMORY_LIMIT");
}

/* ---- lookups that must not cost the square of the input ------------------
 */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Loads a file and says how long that took; -1 where it failed. */
static double load_timed(const char *name, trace *t) {
  double t0 = now_s();
  return load(t, name) == 0 ? now_s() - t0 : -1;
}

/* A file made to be slow against one of its size made ordinarily: within
 * ten times and half a second of it, however fast the build runs
 * (sanitizers, a busy machine). Each case took over 50 times as long. */
static void check_linear(const char *what, double took, double base) {
  if (took >= 0 && base >= 0 && took > 10 * base + 0.5)
    CHECK_FAIL("%s took %.2f s; one of its size made ordinarily %.2f s", what,
               took, base);
}

/* A pickle written here, in the opcodes PyTorch's snapshots use. */
typedef struct pickle_out {
  char *b;
  size_t n, cap;
} pickle_out;

static void po_bytes(pickle_out *w, const void *s, size_t n) {
  if (w->n + n > w->cap) {
    w->cap = (w->n + n) * 2;
    w->b = realloc(w->b, w->cap);
    REQUIRE_EXIT(w->b != NULL);
  }
  memcpy(w->b + w->n, s, n);
  w->n += n;
}

static void po_str(pickle_out *w, const char *s) {
  unsigned char n = (unsigned char)strlen(s);
  po_bytes(w, "\x8c", 1); /* SHORT_BINUNICODE */
  po_bytes(w, &n, 1);
  po_bytes(w, s, n);
}

static void po_int(pickle_out *w, uint64_t v) {
  unsigned char b[10] = {0x8a, 8}; /* LONG1 of 8 bytes, below 2^63 */
  for (int i = 0; i < 8; i++)
    b[2 + i] = (unsigned char)(v >> (8 * i));
  po_bytes(w, b, sizeof b);
}

/* {'action': action, 'addr': addr, 'size': size, 'stream': 0} */
static void po_event(pickle_out *w, const char *action, uint64_t addr,
                     uint64_t size) {
  po_bytes(w, "}(", 2);
  po_str(w, "action");
  po_str(w, action);
  po_str(w, "addr");
  po_int(w, addr);
  po_str(w, "size");
  po_int(w, size);
  po_str(w, "stream");
  po_bytes(w, "K\x00u", 3);
}

/* {'device_traces': [[ ... the events ... ]]} */
static void po_begin(pickle_out *w) {
  po_bytes(w, "\x80\x04}(", 4);
  po_str(w, "device_traces");
  po_bytes(w, "](](", 4);
}

static void po_end(pickle_out *w, const char *name) {
  po_bytes(w, "eeu.", 4);
  write_raw(name, w->b, w->n);
  free(w->b);
  memset(w, 0, sizeof *w);
}

/* A history of n segments, freed oldest first or newest first. */
static void segments_pickle(const char *name, uint64_t n, bool oldest_first) {
  pickle_out w = {0};
  po_begin(&w);
  for (uint64_t i = 0; i < n; i++)
    po_event(&w, "segment_alloc", (i + 1) << 24, 2 << 20);
  po_event(&w, "alloc", 1 << 20, 512);
  for (uint64_t i = 0; i < n; i++)
    po_event(&w, "segment_free", (oldest_first ? i + 1 : n - i) << 24, 2 << 20);
  po_end(&w, name);
}

/* PyTorch's reserve over a history of 150,000 segments, freed oldest
 * first: each free searched the live segments from the newest (200,000
 * took 16 s); a table finds them at once, as fast as when they are freed
 * newest first. A second segment at a live address (a damaged history) is
 * freed first. */
static void test_snapshot_many_segments(void) {
  enum { SEGMENTS = 150000 };
  segments_pickle("lifo.pickle", SEGMENTS, false);
  segments_pickle("fifo.pickle", SEGMENTS, true);
  trace t;
  double base = load_timed("lifo.pickle", &t);
  if (base >= 0)
    trace_free(&t);
  double took = load_timed("fifo.pickle", &t);
  if (took < 0)
    return;
  CHECK(t.has_user);
  CHECK_EQ_U64(t.user_peak_reserved, (uint64_t)SEGMENTS * (2 << 20));
  CHECK_EQ_U64(t.nops, 1);
  trace_free(&t);
  check_linear("freeing segments oldest first", took, base);
  pickle_out w = {0};
  /* Two segments at one address, 4 MiB then 1 MiB: the free takes the
   * newer, so that 2 MiB more make 6; had it taken the older, 3. */
  po_begin(&w);
  po_event(&w, "alloc", 1 << 20, 512);
  po_event(&w, "segment_alloc", 1 << 24, 4 << 20);
  po_event(&w, "segment_alloc", 1 << 24, 1 << 20);
  po_event(&w, "segment_free", 1 << 24, 0);
  po_event(&w, "segment_alloc", 2 << 24, 2 << 20);
  po_end(&w, "same_address.pickle");
  if (load(&t, "same_address.pickle") != 0)
    return;
  CHECK_EQ_U64(t.user_peak_reserved, 6 << 20);
  trace_free(&t);
}

/* One dict of `keys` keys shared through the memo by `events` events, the
 * four that matter first or last. */
static void shared_dict_pickle(const char *name, int keys, int events,
                               bool first) {
  pickle_out w = {0};
  po_begin(&w);
  po_bytes(&w, "}\x94(", 3); /* EMPTY_DICT, MEMOIZE (as 0), MARK */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == !first) {
      po_str(&w, "action");
      po_str(&w, "alloc");
      po_str(&w, "addr");
      po_int(&w, 4096);
      po_str(&w, "size");
      po_int(&w, 512);
      po_str(&w, "stream");
      po_int(&w, 7);
      continue;
    }
    for (int i = 0; i < keys; i++) {
      char key[32];
      snprintf(key, sizeof key, "key%d", i);
      po_str(&w, key);
      po_int(&w, (uint64_t)i);
    }
  }
  po_str(&w, "size"); /* given twice: the last is the dict's */
  po_int(&w, 1024);
  po_bytes(&w, "u", 1);
  for (int i = 1; i < events; i++)
    po_bytes(&w, "h\x00", 2); /* BINGET 0 */
  po_end(&w, name);
}

/* One dict of 20,000 keys, its four that matter first, shared through the
 * memo by 20,000 events: each lookup searched the keys from the last (13 s
 * for this 400 KB file); an index finds them at once, as fast as where
 * they come last. */
static void test_snapshot_shared_dict(void) {
  enum { KEYS = 20000, EVENTS = 20000 };
  shared_dict_pickle("shared_last.pickle", KEYS, EVENTS, false);
  shared_dict_pickle("shared_first.pickle", KEYS, EVENTS, true);
  trace t;
  double base = load_timed("shared_last.pickle", &t);
  if (base >= 0)
    trace_free(&t);
  double took = load_timed("shared_first.pickle", &t);
  if (took < 0)
    return;
  CHECK_EQ_U64(t.nops, EVENTS);
  CHECK_EQ_U64(t.double_allocs, EVENTS - 1);
  CHECK_EQ_U64(t.ops[0].size, 1024);
  CHECK_EQ_INT(t.nstreams, 2);
  trace_free(&t);
  check_linear("a shared dict's keys", took, base);
}

/* pk_get on dicts with and without an index: the last of a repeated key,
 * and a key absent, in dicts of 3 and of 40 keys. */
static void test_pickle_index(void) {
  for (int keys = 3; keys <= 40; keys += 37) {
    pickle_out w = {0};
    po_bytes(&w, "\x80\x04}(", 4);
    for (int i = 0; i < keys; i++) {
      char key[32];
      snprintf(key, sizeof key, "k%d", i);
      po_str(&w, key);
      po_int(&w, (uint64_t)i);
    }
    po_bytes(&w, "K\x05", 2); /* an int key, which no string finds */
    po_int(&w, 99);
    po_str(&w, "k1");
    po_int(&w, 100);
    po_bytes(&w, "u.", 2);
    pk_doc *doc;
    pk_value *root;
    char err[300];
    REQUIRE_EXIT(pk_parse((const unsigned char *)w.b, w.n, SIZE_MAX, &doc,
                          &root, err, sizeof err) == 0);
    CHECK_EQ_INT(root->u.dict.index != NULL, keys > 8);
    for (int i = 0; i < keys; i++) {
      char key[32];
      snprintf(key, sizeof key, "k%d", i);
      const pk_value *v = pk_get(root, key);
      CHECK(v && v->type == PK_INT && v->u.i == (i == 1 ? 100 : i));
    }
    CHECK(pk_get(root, "k") == NULL);
    CHECK(pk_get(root, "5") == NULL);
    CHECK(pk_get(root, "") == NULL);
    pk_free(doc);
    free(w.b);
  }
}

/* A CSV of n allocations at the addresses k * step, then frees of every
 * other one. */
static void addresses_csv(const char *name, uint64_t n, uint64_t step) {
  size_t cap = (size_t)n * 64, at = 0;
  char *text = malloc(cap);
  REQUIRE_EXIT(text != NULL);
  at += (size_t)snprintf(text, cap, "action,addr,size,stream\n");
  for (uint64_t k = 1; k <= n; k++)
    at += (size_t)snprintf(text + at, cap - at, "alloc,%llu,512,0\n",
                           (unsigned long long)(k * step));
  for (uint64_t k = 1; k <= n; k += 2)
    at += (size_t)snprintf(text + at, cap - at, "free_requested,%llu,0,0\n",
                           (unsigned long long)(k * step));
  write_raw(name, text, at);
  free(text);
}

/* Addresses chosen to collide in the address table's old hash (a
 * multiplication by 0x9E3779B97F4A7C15, of which bits 17 and up chose the
 * slot): k * 2^40 times the inverse of that constant. 100,000 of them took
 * 20 s; the seeded hash spreads them as it does addresses k * 4096. */
static void test_colliding_addresses(void) {
  enum { ALLOCS = 100000 };
  const uint64_t c = 0x9E3779B97F4A7C15ull;
  uint64_t inv = c; /* Newton's iteration: the inverse modulo 2^64 */
  for (int i = 0; i < 6; i++)
    inv *= 2 - c * inv;
  REQUIRE_EXIT(inv * c == 1);
  addresses_csv("ordinary.csv", ALLOCS, 4096);
  addresses_csv("colliding.csv", ALLOCS, inv << 40);
  trace t;
  double base = load_timed("ordinary.csv", &t);
  if (base >= 0)
    trace_free(&t);
  double took = load_timed("colliding.csv", &t);
  if (took < 0)
    return;
  CHECK_EQ_U64(t.nallocs, ALLOCS);
  CHECK_EQ_U64(t.unknown_frees, 0);
  CHECK_EQ_U64(t.double_allocs, 0);
  CHECK_EQ_U64(t.peak_live, (uint64_t)ALLOCS * 512);
  CHECK_EQ_INT(t.ops[ALLOCS].name, 0);
  trace_free(&t);
  check_linear("colliding addresses", took, base);
}

/* ---- line numbers ----------------------------------------------------------
 */

/* Lines and entries count in 64 bits: in 32, line 2^32 + 1 of a file of
 * 4 GiB of blank lines (4 MB gzip'd) was taken for the header and skipped,
 * and a message named a line 2^32 too low. Such a file takes a minute to
 * read, so that the test checks the types the count goes through. */
_Static_assert(sizeof(((trace_op *)0)->where) == 8, "64-bit trace_op.where");

static int last_line(void *ctx, const char *line, uint64_t lineno, char *err,
                     size_t len) {
  (void)line;
  (void)err;
  (void)len;
  *(uint64_t *)ctx = lineno;
  return 0;
}

static void test_line_numbers(void) {
  static const char text[] = "a\nb\r\n\nc";
  trace_line_fn fn = last_line;
  uint64_t last = 0;
  char err[200];
  CHECK_EQ_INT(
      trace_each_line(text, sizeof text - 1, "x", fn, &last, err, sizeof err),
      0);
  CHECK_EQ_U64(last, 4);
}

int main(void) {
  REQUIRE_EXIT(mkdtemp(dir) != NULL);
  RUN_TEST(test_gzip_members);
  RUN_TEST(test_gzip_trailing_garbage);
  RUN_TEST(test_limit_gzip_bomb);
  RUN_TEST(test_limit_pickle);
  RUN_TEST(test_limit_operations);
  RUN_TEST(test_snapshot_many_segments);
  RUN_TEST(test_snapshot_shared_dict);
  RUN_TEST(test_pickle_index);
  RUN_TEST(test_colliding_addresses);
  RUN_TEST(test_line_numbers);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    printf("   could not remove %s\n", dir);
  return check_done();
}
