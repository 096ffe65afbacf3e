/* Tests of the replay's other input formats: the pickle reader on
 * hand-made pickles (every int encoding, the memo, damaged streams), PyTorch
 * memory snapshots and RMM logs from test/data (made by
 * test/data/make_test_data.py), with the figures those files were built to
 * give, and their damaged variants, each refused with the file and the
 * place named. */
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "pickle.h"
#include "replay.h"
#include "trace.h"

/* ---- the pickle reader ----------------------------------------------------
 */

static int parse(const char *bytes, size_t n, pk_doc **doc, pk_value **root,
                 char *err, size_t len) {
  return pk_parse((const unsigned char *)bytes, n, SIZE_MAX, doc, root, err,
                  len);
}

/* Each int opcode, including LONG1 at the edges of int64_t. */
static void test_pickle_ints(void) {
  /* PROTO 4, MARK, then ints, LIST, STOP:
   *   K 7 | M 0x1234 | J -2 | LONG1 of 0 bytes (0) | LONG1 -1 (1 byte) |
   *   LONG1 2^40 (6 bytes) | LONG1 INT64_MIN (8 bytes) |
   *   LONG1 INT64_MAX (8 bytes) | LONG1 2^63 (9 bytes: too big) */
  static const char p[] = "\x80\x04("
                          "K\x07"
                          "M\x34\x12"
                          "J\xfe\xff\xff\xff"
                          "\x8a\x00"
                          "\x8a\x01\xff"
                          "\x8a\x06\x00\x00\x00\x00\x00\x01"
                          "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
                          "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"
                          "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00"
                          "l.";
  pk_doc *doc;
  pk_value *root;
  char err[300];
  REQUIRE_EXIT(parse(p, sizeof p - 1, &doc, &root, err, sizeof err) == 0);
  REQUIRE_EXIT(root->type == PK_LIST && root->u.list.n == 9);
  const int64_t want[8] = {7,  0x1234,           -2,        0,
                           -1, INT64_C(1) << 40, INT64_MIN, INT64_MAX};
  for (int i = 0; i < 8; i++) {
    CHECK(root->u.list.v[i]->type == PK_INT && !root->u.list.v[i]->big);
    CHECK_EQ_INT(root->u.list.v[i]->u.i, want[i]);
  }
  CHECK(root->u.list.v[8]->big);
  pk_free(doc);
}

/* Strings, dicts and the memo: a value stored once and fetched twice is the
 * same value, and a dict finds its keys. */
static void test_pickle_memo(void) {
  /* PROTO 2, EMPTY_DICT BINPUT 0, MARK, "a" BINPUT 1, EMPTY_LIST BINPUT 2,
   * "b" BINGET 2, SETITEMS: {"a": L, "b": L}; then BINGET 2, 1.5, APPEND,
   * POP (the list), STOP. */
  static const char p[] = "\x80\x02}q\x00("
                          "\x8c\x01"
                          "aq\x01"
                          "]q\x02"
                          "\x8c\x01"
                          "b"
                          "h\x02"
                          "u"
                          "h\x02"
                          "G\x3f\xf8\x00\x00\x00\x00\x00\x00"
                          "a"
                          "0"
                          ".";
  pk_doc *doc;
  pk_value *root;
  char err[300];
  REQUIRE_EXIT(parse(p, sizeof p - 1, &doc, &root, err, sizeof err) == 0);
  const pk_value *a = pk_get(root, "a"), *b = pk_get(root, "b");
  REQUIRE_EXIT(a && b);
  CHECK(a == b);
  CHECK(a->type == PK_LIST && a->u.list.n == 1);
  CHECK(a->u.list.v[0]->type == PK_FLOAT && a->u.list.v[0]->u.f == 1.5);
  CHECK(pk_get(root, "c") == NULL);
  pk_free(doc);

  /* A key given twice: the last value is the dict's, as in Python (keys
   * are appended, not searched for, so that a dict of many keys costs
   * their number, not its square). */
  static const char twice[] = "\x80\x04}(\x8c\x01kK\x01\x8c\x01kK\x02u.";
  REQUIRE_EXIT(parse(twice, sizeof twice - 1, &doc, &root, err, sizeof err) ==
               0);
  const pk_value *k = pk_get(root, "k");
  CHECK(k && k->type == PK_INT && k->u.i == 2);
  pk_free(doc);
}

/* Damaged streams: each refused with the offset and the reason. */
static void test_pickle_damaged(void) {
  static const struct {
    const char *bytes;
    size_t n;
    const char *want;
  } cases[] = {
      {"\x80\x04K", 3, "ends inside an int"},
      {"\x80\x04K\x01", 4, "without the STOP"},
      {"\x80\x09K\x01.", 5, "protocol 9"},
      {"\x80\x04h\x05.", 5, "memo index 5 was never stored"},
      {"\x80\x04}K\x01u.", 6, "no mark"},
      {"\x80\x04}(K\x01u.", 7, "odd count"},
      {"\x80\x04K\x01K\x02.", 7, "STOP with 2 values"},
      {"\x80\x04K\x01.junk", 9, "4 bytes after the pickle's end"},
      {"\x80\x04X\xff\xff\xff\x7f"
       "ab.",
       10, "runs past the end"},
      {"\x80\x04"
       "a.",
       4, "APPEND without a list"},
      {"\x80\x04\xfe.", 4, "opcode 0xfe"},
      {"\x80\x04r\x00\x00\x00\x7f.", 8, "memo store with an empty stack"},
      /* An index no pickler gives after one value: refused before the memo
       * grows to it (2^28 - 1 once asked for 2 GiB). */
      {"\x80\x04]r\xff\xff\xff\x0f.", 9, "memo index 268435455 is out"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pk_doc *doc = NULL;
    pk_value *root = NULL;
    char err[300] = "";
    check_context(cases[i].want);
    CHECK_EQ_INT(
        parse(cases[i].bytes, cases[i].n, &doc, &root, err, sizeof err), -1);
    if (!strstr(err, cases[i].want) || !strstr(err, "pickle byte "))
      CHECK_FAIL("message '%s' lacks '%s' or the offset", err, cases[i].want);
    CHECK(doc == NULL);
  }
  check_context(NULL);
}

/* ---- snapshots and RMM logs ------------------------------------------------
 */

static void data_path(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", TP_TEST_DATA, name);
}

static int load(trace *t, const char *name) {
  char path[512], err[600];
  data_path(path, sizeof path, name);
  if (trace_load(t, path, err, sizeof err) == 0)
    return 0;
  CHECK_FAIL("%s: %s", name, err);
  return -1;
}

/* The small snapshot as make_test_data.py built it: 13 operations on 2
 * streams, 5 allocations, one free of an allocation made before the
 * history, live bytes peaking at 4000000 and PyTorch's segments at 22 MiB.
 * Protocols 2 (gzip'd), 4 and 5 read to the same operations. */
static void test_snapshot(void) {
  static const char *const files[] = {
      "snapshot_small.pickle", "snapshot_p5.pickle", "snapshot_p2.pickle.gz"};
  trace first = {0};
  for (size_t f = 0; f < 3; f++) {
    trace t;
    check_context(files[f]);
    if (load(&t, files[f]) != 0)
      continue;
    CHECK_EQ_INT(t.format, TRACE_FORMAT_SNAPSHOT);
    CHECK_EQ_U64(t.nops, 13);
    CHECK_EQ_U64(t.nallocs, 5);
    CHECK_EQ_INT(t.nstreams, 2);
    CHECK_EQ_U64(t.unknown_frees, 1);
    CHECK_EQ_U64(t.double_allocs, 0);
    CHECK_EQ_U64(t.peak_live, 4000000);
    CHECK(t.has_user);
    CHECK_EQ_U64(t.user_peak_reserved, 22u << 20);
    CHECK_EQ_INT(t.device, 0);
    /* a3, the sixth operation, is entry 6, on the side stream. */
    CHECK_EQ_INT(t.ops[5].action, TRACE_ALLOC);
    CHECK_EQ_INT(t.ops[5].where, 6);
    CHECK_EQ_INT(t.ops[5].stream, 1);
    CHECK_EQ_U64(t.ops[5].size, 500000);
    if (f == 0) {
      first = t;
      continue;
    }
    for (size_t i = 0; first.ops && i < t.nops && i < first.nops; i++) {
      const trace_op *a = &t.ops[i], *b = &first.ops[i];
      if (a->name != b->name || a->stream != b->stream ||
          a->action != b->action || a->size != b->size || a->where != b->where)
        CHECK_FAIL("operation %zu differs from %s's", i, files[0]);
    }
    trace_free(&t);
  }
  check_context(NULL);
  if (!first.ops)
    return;
  replay_options o = {.threshold = UINT64_MAX};
  replay_result r;
  char err[600];
  REQUIRE_EXIT(replay_trace(&o, &first, &r, err, sizeof err) == 0);
  CHECK_EQ_U64(r.peak_used, 4000000);
  CHECK_EQ_U64(r.skipped_frees, 1);
  CHECK_EQ_U64(r.allocs, 5);
  trace_free(&first);
}

/* A snapshot PyTorch 2.11 wrote on an H200 (bench/gpu_record.sh's snapshot
 * step, under its own caching allocator): the reserve computed from its
 * segment events equals what torch.cuda.max_memory_reserved() said in that
 * run, 155,189,248 bytes, with 775 allocations. */
static void test_snapshot_from_h200(void) {
  trace t;
  if (load(&t, "snapshot_h200.pickle.gz") != 0)
    return;
  CHECK_EQ_INT(t.format, TRACE_FORMAT_SNAPSHOT);
  CHECK(t.has_user);
  CHECK_EQ_U64(t.user_peak_reserved, 155189248);
  CHECK_EQ_U64(t.nallocs, 775);
  replay_options o = {.threshold = UINT64_MAX};
  replay_result r;
  char err[600];
  if (replay_trace(&o, &t, &r, err, sizeof err) != 0)
    CHECK_FAIL("replay: %s", err);
  else
    CHECK(r.peak_reserved < t.user_peak_reserved);
  trace_free(&t);
}

/* Expandable segments: PyTorch's reserve follows its maps and unmaps. */
static void test_snapshot_expandable(void) {
  trace t;
  if (load(&t, "snapshot_expandable.pickle") != 0)
    return;
  CHECK(t.has_user);
  CHECK_EQ_U64(t.user_peak_reserved, 10u << 20);
  CHECK_EQ_U64(t.peak_live, 7000000);
  CHECK_EQ_U64(t.nallocs, 3);
  CHECK_EQ_INT(t.nstreams, 1);
  trace_free(&t);
}

static void test_rmm(void) {
  trace t;
  if (load(&t, "rmm_small.csv") != 0)
    return;
  CHECK_EQ_INT(t.format, TRACE_FORMAT_RMM);
  CHECK(!t.has_user);
  CHECK_EQ_U64(t.nallocs, 3);
  CHECK_EQ_U64(t.nops, 7); /* the failed allocation is no operation */
  CHECK_EQ_INT(t.nstreams, 2);
  CHECK_EQ_U64(t.unknown_frees, 1);
  CHECK_EQ_U64(t.peak_live, 3145728);
  CHECK_EQ_INT(t.ops[1].stream, 1);
  CHECK_EQ_INT(t.ops[1].where, 3);
  CHECK_EQ_INT(t.ops[2].action, TRACE_FREE);
  CHECK_EQ_INT(t.ops[2].name, t.ops[0].name);
  replay_options o = {.threshold = UINT64_MAX};
  replay_result r;
  char err[600];
  REQUIRE_EXIT(replay_trace(&o, &t, &r, err, sizeof err) == 0);
  CHECK_EQ_U64(r.peak_used, 3145728);
  trace_free(&t);
}

/* The same RMM log gzip'd reads the same. */
static void test_rmm_gzip(void) {
  char in[512], out[] = "/tmp/tp_rmm_XXXXXX";
  data_path(in, sizeof in, "rmm_small.csv");
  int fd = mkstemp(out);
  REQUIRE_EXIT(fd >= 0);
  close(fd);
  FILE *f = fopen(in, "rb");
  gzFile g = gzopen(out, "wb");
  REQUIRE_EXIT(f && g);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    CHECK(gzwrite(g, buf, (unsigned)n) == (int)n);
  fclose(f);
  CHECK_EQ_INT(gzclose(g), Z_OK);
  trace t;
  char err[600];
  REQUIRE_EXIT(trace_load(&t, out, err, sizeof err) == 0);
  CHECK_EQ_INT(t.format, TRACE_FORMAT_RMM);
  CHECK_EQ_U64(t.peak_live, 3145728);
  trace_free(&t);
  remove(out);
}

static void test_damaged(void) {
  static const struct {
    const char *file, *want;
  } cases[] = {
      {"bad_snapshot_truncated.pickle", "without the STOP opcode"},
      {"bad_snapshot_size_type.pickle",
       "device_traces[0][3]: 'size' is a str, not an int"},
      {"bad_snapshot_no_stream.pickle",
       "device_traces[0][6]: 'stream' is missing"},
      {"bad_snapshot_entry_list.pickle",
       "device_traces[0][2]: a list, not a dict"},
      {"bad_snapshot_no_traces.pickle", "without 'device_traces'"},
      {"bad_snapshot_empty_traces.pickle", "holds no events"},
      {"bad_snapshot_list.pickle", "holds a list, not the dict"},
      {"bad_snapshot_set.pickle", "opcode 0x8f"},
      {"bad_snapshot_flipped.pickle", "opcode 0xff"},
      {"bad_snapshot_segments_wrap.pickle",
       "device_traces[0][3]: its segments add up past 2^64 bytes"},
      {"bad_rmm_pointer.csv", "bad_rmm_pointer.csv:5: the pointer '0xZZ'"},
      {"bad_rmm_fields.csv", "bad_rmm_fields.csv:3: 5 fields"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[512], err[600] = "";
    data_path(path, sizeof path, cases[i].file);
    trace t;
    check_context(cases[i].file);
    CHECK_EQ_INT(trace_load(&t, path, err, sizeof err), -1);
    if (!strstr(err, cases[i].want))
      CHECK_FAIL("message '%s' lacks '%s'", err, cases[i].want);
    if (!strstr(err, path))
      CHECK_FAIL("message '%s' does not name the file", err);
  }
  check_context(NULL);
}

/* A trace with more streams than the replay runs (one platform stream, on
 * host a thread, for each) is refused at the line of the first one too
 * many: a small file once made 65,534 threads. */
static void test_too_many_streams(void) {
  char path[] = "/tmp/tp_streams_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  FILE *f = fdopen(fd, "w");
  REQUIRE(f != NULL);
  fprintf(f, "Thread,Time,Action,Pointer,Size,Stream\n");
  for (int i = 0; i < TRACE_MAX_STREAMS + 5; i++)
    fprintf(f, "1,0.0,allocate,0x%x,512,0x%x\n", 0x10000 + i * 0x1000,
            0x100 + i);
  fclose(f);
  trace t;
  char err[600] = "", want[64];
  CHECK_EQ_INT(trace_load(&t, path, err, sizeof err), -1);
  snprintf(want, sizeof want, ":%d: more than %d streams",
           TRACE_MAX_STREAMS + 1, TRACE_MAX_STREAMS - 1);
  if (!strstr(err, want))
    CHECK_FAIL("message '%s' lacks '%s'", err, want);
  unlink(path);
}

int main(void) {
  RUN_TEST(test_pickle_ints);
  RUN_TEST(test_pickle_memo);
  RUN_TEST(test_pickle_damaged);
  RUN_TEST(test_snapshot);
  RUN_TEST(test_snapshot_from_h200);
  RUN_TEST(test_snapshot_expandable);
  RUN_TEST(test_rmm);
  RUN_TEST(test_rmm_gzip);
  RUN_TEST(test_damaged);
  RUN_TEST(test_too_many_streams);
  return check_done();
}
