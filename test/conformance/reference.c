/* conformance_reference: tidepool against the real driver's answers. Reads
 * driver_answers.txt (what CUDA's own allocator returned for each call),
 * makes each call through tidepool, checks the matching TP_* code and the
 * figures printed with it, and fails on any row that no test checked. */
#include <sys/mman.h>
#include <unistd.h>

#include "conformance.h"

/* ========================================================================
 * The table
 * ======================================================================== */

#define REF_MAX_ROWS 128
#define REF_MAX_FIGURES 4

/* One call of the driver's probe: its label, its answer as a TP_* code,
 * and the lines of figures printed after it. */
typedef struct ref_row {
  char label[96];
  tp_error_t want;
  int checked;
  int nfig;
  char figure[REF_MAX_FIGURES][128];
  int figure_checked[REF_MAX_FIGURES];
} ref_row_t;

static ref_row_t ref_rows[REF_MAX_ROWS];
static int ref_nrows = -1; /* -1 until loaded */

static const struct {
  const char *cuda;
  tp_error_t tp;
} ref_codes[] = {
    {"cudaSuccess", TP_SUCCESS},
    {"cudaErrorInvalidValue", TP_ERROR_INVALID_VALUE},
    {"cudaErrorMemoryAllocation", TP_ERROR_OUT_OF_MEMORY},
    {"cudaErrorInvalidDevice", TP_ERROR_INVALID_DEVICE},
};

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' ||
               s[n - 1] == '\r'))
    s[--n] = '\0';
  return s;
}

/* Parses one line into the table; returns 0 at "DONE", 1 otherwise. */
static int ref_parse_line(char *line, int lineno) {
  if (line[0] == '#' || trim(line)[0] == '\0')
    return 1;
  if (line[0] == ' ') {
    /* Figures belong to the row printed above them. */
    ref_row_t *r = ref_nrows > 0 ? &ref_rows[ref_nrows - 1] : NULL;
    if (!r || r->nfig == REF_MAX_FIGURES) {
      CHECK_FAIL("driver_answers.txt:%d: figures without a row", lineno);
      return 1;
    }
    snprintf(r->figure[r->nfig++], sizeof r->figure[0], "%s", trim(line));
    return 1;
  }
  char *text = trim(line);
  if (strcmp(text, "DONE") == 0)
    return 0;
  char *arrow = strstr(text, " -> ");
  if (!arrow || ref_nrows == REF_MAX_ROWS) {
    CHECK_FAIL("driver_answers.txt:%d: not a row: %s", lineno, text);
    return 1;
  }
  *arrow = '\0';
  const char *answer = trim(arrow + 4);
  ref_row_t *r = &ref_rows[ref_nrows];
  memset(r, 0, sizeof *r);
  snprintf(r->label, sizeof r->label, "%s", trim(text));
  size_t k = 0, n = sizeof ref_codes / sizeof ref_codes[0];
  while (k < n && strcmp(ref_codes[k].cuda, answer) != 0)
    k++;
  if (k == n) {
    CHECK_FAIL("driver_answers.txt:%d: no TP_* code for %s", lineno, answer);
    return 1;
  }
  r->want = ref_codes[k].tp;
  ref_nrows++;
  return 1;
}

/* Reads the table once; a table that cannot be read ends the program,
 * since every check below depends on it. */
static void ref_load(void) {
  if (ref_nrows >= 0)
    return;
  ref_nrows = 0;
  FILE *f = fopen(TP_DRIVER_ANSWERS, "r");
  if (!f) {
    CHECK_FAIL("cannot open %s", TP_DRIVER_ANSWERS);
    exit(check_done());
  }
  char line[512];
  int lineno = 0, done = 0;
  while (!done && fgets(line, sizeof line, f))
    done = !ref_parse_line(line, ++lineno);
  fclose(f);
  if (!CHECK(done) || !CHECK(ref_nrows > 0))
    exit(check_done());
}

/* The row with this label, marked as checked; NULL (with a failure) when
 * the table has none. */
static ref_row_t *ref_row(const char *label) {
  ref_load();
  for (int i = 0; i < ref_nrows; i++)
    if (strcmp(ref_rows[i].label, label) == 0) {
      ref_rows[i].checked = 1;
      return &ref_rows[i];
    }
  CHECK_FAIL("driver_answers.txt has no row \"%s\"", label);
  return NULL;
}

/* The driver's answer to the row's call. */
static tp_error_t ref_answer(const char *label) {
  ref_row_t *r = ref_row(label);
  return r ? r->want : (tp_error_t)-1;
}

/* Checks that tidepool's answer `got` to the row's call is the driver's. */
#define CHECK_ROW(label, expr)                                                 \
  check_row_(__FILE__, __LINE__, label, #expr, (expr))
static int check_row_(const char *file, int line, const char *label,
                      const char *text, tp_error_t got) {
  check_context(label);
  ref_row_t *r = ref_row(label);
  return r && check_err_(file, line, text, got, r->want);
}

/* The rest of the figure line printed after row `label` that starts with
 * `prefix`, marked as checked; NULL (with a failure) when there is none. */
static const char *ref_figure(const char *label, const char *prefix) {
  ref_row_t *r = ref_row(label);
  size_t n = strlen(prefix);
  for (int i = 0; r && i < r->nfig; i++)
    if (strncmp(r->figure[i], prefix, n) == 0) {
      r->figure_checked[i] = 1;
      check_context(r->figure[i]);
      return r->figure[i] + n;
    }
  CHECK_FAIL("driver_answers.txt has no figure \"%s\" after \"%s\"", prefix,
             label);
  return NULL;
}

/* The number after `word ` in a figure line ("reserved 0 used 100"). */
static uint64_t ref_number(const char *text, const char *word) {
  size_t n = strlen(word);
  for (const char *p = text; p && (p = strstr(p, word)) != NULL; p += n)
    if ((p == text || p[-1] == ' ' || p[-1] == '(') && p[n] == ' ')
      return strtoull(p + n + 1, NULL, 0);
  CHECK_FAIL("no figure \"%s\" in \"%s\"", word, text ? text : "(none)");
  return UINT64_MAX;
}

/* ========================================================================
 * The rows, grouped by the part of the API they call
 * ======================================================================== */

static void test_alloc_free_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);

  void *p = (void *)&p;
  CHECK_ROW("mallocAsync size 0", tp_malloc_async(&p, 0, s));
  const char *fig = ref_figure("mallocAsync size 0", "ptr after size 0 = ");
  if (CHECK(fig && strcmp(fig, "(nil)") == 0))
    CHECK_EQ_PTR(p, NULL);

  CHECK_ROW("mallocAsync NULL devPtr", tp_malloc_async(NULL, 64, s));
  CHECK_ROW("freeAsync NULL", tp_free_async(NULL, s));

  int local = 0;
  CHECK_ROW("freeAsync host pointer", tp_free_async(&local, s));
  void *heap = malloc(4096);
  REQUIRE(heap != NULL);
  CHECK_ROW("freeAsync host pointer", tp_free_async(heap, s));
  free(heap);

  check_context("freeAsync interior pointer");
  void *q = NULL;
  REQUIRE_OK(tp_malloc_async(&q, 4096, s));
  REQUIRE(q != NULL);
  CHECK_ROW("freeAsync interior pointer", tp_free_async((char *)q + 8, s));
  /* 512 bytes in is a granule boundary, so a registry keyed by granules
   * must still see that it is inside q's block. */
  CHECK_ROW("freeAsync interior pointer", tp_free_async((char *)q + 512, s));

  CHECK_ROW("freeAsync ok", tp_free_async(q, s));
  CHECK_ROW("freeAsync double free", tp_free_async(q, s));
  CHECK_ROW("sync after double free", tp_stream_synchronize(s));

  /* A deliberate difference: the driver accepts a pointer of its own
   * cudaMalloc, while tidepool owns no memory outside its pools and
   * refuses every pointer that none of them gave out. Memory the test maps
   * itself stands in for another allocator's. */
  check_context("freeAsync of cudaMalloc pointer");
  CHECK_EQ_INT(ref_answer("freeAsync of cudaMalloc pointer"), TP_SUCCESS);
  void *other = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (CHECK(other != MAP_FAILED)) {
    CHECK_ERR(tp_free_async(other, s), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_stream_synchronize(s));
    munmap(other, 2 * MiB);
  }

  p = NULL;
  CHECK_ROW("mallocAsync huge 1<<50", tp_malloc_async(&p, (size_t)1 << 50, s));
  CHECK_ROW("mallocAsync SIZE_MAX", tp_malloc_async(&p, SIZE_MAX, s));

  /* The driver's three pointers were one granule apart; tidepool keeps
   * the granule as the alignment and the blocks apart. */
  fig = ref_figure("mallocAsync SIZE_MAX", "ptrs for sizes 1,1,3000: ");
  uint64_t granule = ref_number(fig, "diff");
  CHECK_EQ_U64(granule, 512);
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(tp_malloc_async(&a, 1, s));
  CHECK_OK(tp_malloc_async(&b, 1, s));
  CHECK_OK(tp_malloc_async(&c, 3000, s));
  if (CHECK(a && b && c) && granule != 0 && granule != UINT64_MAX) {
    CHECK(a != b && b != c && a != c);
    CHECK_EQ_U64((uintptr_t)a % granule, 0);
    CHECK_EQ_U64((uintptr_t)b % granule, 0);
    CHECK_EQ_U64((uintptr_t)c % granule, 0);
    CHECK(!ranges_overlap(a, 1, b, 1));
    CHECK(!ranges_overlap(a, 1, c, 3000));
    CHECK(!ranges_overlap(b, 1, c, 3000));
  }
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_free_async(c, s));
  check_context(NULL);
  stream_done(s);
}

static void test_attribute_rows(void) {
  tp_pool_t def = default_pool();
  REQUIRE(def != NULL);

  CHECK_ROW("destroy default pool", tp_pool_destroy(def));

  uint64_t v = 1;
  CHECK_ROW("set ReservedMemHigh nonzero",
            tp_pool_set_attribute(def, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v));
  v = 0;
  CHECK_ROW("set ReservedMemHigh zero",
            tp_pool_set_attribute(def, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v));
  v = 0;
  CHECK_ROW("set UsedMemCurrent (read-only)",
            tp_pool_set_attribute(def, TP_POOL_ATTR_USED_MEM_CURRENT, &v));

  uint64_t big = 0;
  CHECK_ROW("get attr bogus 999",
            tp_pool_get_attribute(def, (tp_pool_attr_t)999, &big));
  CHECK_ROW(
      "get attr NULL value",
      tp_pool_get_attribute(def, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, NULL));

  /* attr_int also checks that no more than an int was written. */
  int iv = -1;
  CHECK_ROW(
      "get ReuseAllowOpportunistic",
      tp_pool_get_attribute(def, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &iv));
  const char *fig = ref_figure("get ReuseAllowOpportunistic", "value ");
  if (fig) {
    int want = (int)strtol(fig, NULL, 0);
    CHECK_EQ_INT(iv, want);
    CHECK_EQ_INT(attr_int(def, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), want);
  }

  v = UINT64_C(0xAAAAAAAAAAAAAAAA);
  CHECK_ROW("get ReleaseThreshold",
            tp_pool_get_attribute(def, TP_POOL_ATTR_RELEASE_THRESHOLD, &v));
  fig = ref_figure("get ReleaseThreshold", "value ");
  if (fig)
    CHECK_EQ_U64(v, strtoull(fig, NULL, 0));
  check_context(NULL);
}

static void test_pool_create_rows(void) {
  tp_pool_t pool = NULL;
  tp_pool_props_t props;

  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  if (CHECK_ROW("pool create device", tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  CHECK_ROW("pool create NULL props", tp_pool_create(&pool, NULL));

  props = props_make(TP_ALLOCATION_PINNED, loc_device(57), 0, 0);
  CHECK_ROW("pool create device id 57", tp_pool_create(&pool, &props));

  props = props_make((tp_allocation_type_t)77, loc_device(0), 0, 0);
  CHECK_ROW("pool create allocType 77", tp_pool_create(&pool, &props));

  props = props_make(TP_ALLOCATION_PINNED, loc_host(), TP_HANDLE_POSIX_FD, 0);
  CHECK_ROW("pool create host + posix fd", tp_pool_create(&pool, &props));

  tp_location_t numa_current = {TP_LOCATION_HOST_NUMA_CURRENT, 0, 0};
  props = props_make(TP_ALLOCATION_PINNED, numa_current, 0, 0);
  CHECK_ROW("pool create HostNumaCurrent", tp_pool_create(&pool, &props));

  props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  if (CHECK_ROW("pool create host", tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  props = props_make(TP_ALLOCATION_PINNED, loc_numa(0), 0, 0);
  if (CHECK_ROW("pool create host numa 0", tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  props = props_make(TP_ALLOCATION_MANAGED, loc_device(0), 0, 64 * MiB);
  CHECK_ROW("pool create managed maxSize!=0", tp_pool_create(&pool, &props));

  props = props_make(TP_ALLOCATION_MANAGED, loc_device(0), 0, 0);
  if (CHECK_ROW("pool create managed", tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  /* Not a row of the driver's: the manual also admits managed pools
   * without a preferred location. */
  check_context("pool create managed, location none");
  props = props_make(TP_ALLOCATION_MANAGED, loc_none(), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));
  check_context(NULL);
}

static void test_pool_statistics_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);

  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 64 * MiB);
  tp_pool_t capped = NULL;
  if (CHECK_ROW("pool create maxSize 64MiB", tp_pool_create(&capped, &props))) {
    void *big = NULL, *more = NULL;
    CHECK_ROW("alloc 48MiB from 64MiB pool",
              tp_malloc_from_pool_async(&big, 48 * MiB, capped, s));
    CHECK_ROW("alloc 32MiB more from 64MiB pool",
              tp_malloc_from_pool_async(&more, 32 * MiB, capped, s));
    const char *fig =
        ref_figure("alloc 32MiB more from 64MiB pool", "after free+sync: ");
    CHECK_OK(tp_free_async(big, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(capped), ref_number(fig, "reserved"));
    CHECK_EQ_U64(used_of(capped), ref_number(fig, "used"));
    CHECK_OK(tp_pool_destroy(capped));
  }

  props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  tp_pool_t host = NULL;
  if (CHECK_ROW("pool create host", tp_pool_create(&host, &props))) {
    void *p = NULL;
    CHECK_ROW("alloc from host pool",
              tp_malloc_from_pool_async(&p, 100, host, s));
    /* Used is the driver's figure; reserved is whole chunks, not the
     * driver's 32 MiB (a deliberate difference), so only its rule holds:
     * some memory is reserved, at least what is used. */
    const char *fig =
        ref_figure("alloc from host pool", "one 100-byte alloc: ");
    uint64_t r = reserved_of(host);
    CHECK(r > 0);
    CHECK(r >= used_of(host));
    CHECK_EQ_U64(used_of(host), ref_number(fig, "used"));
    CHECK(ref_number(fig, "reserved") > 0);

    fig = ref_figure("alloc from host pool", "after free+sync (threshold 0): ");
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(host), ref_number(fig, "reserved"));
    CHECK_EQ_U64(used_of(host), ref_number(fig, "used"));

    /* The stream is held so that the free is certainly pending when the
     * figures are read: the driver's row is about memory of a free that
     * has not been synchronized, and must not depend on timing. The
     * driver's figure is its 100 MiB rounded up to 32 MiB steps; the rule
     * is that the pending free's bytes stay reserved. */
    fig = ref_figure("alloc from host pool", "100MiB alloc+free before sync: ");
    CHECK(ref_number(fig, "reserved") >= 100 * MiB);
    gate_t g;
    CHECK_OK(tp_malloc_from_pool_async(&p, 100 * MiB, host, s));
    CHECK_OK(hold_stream(s, &g));
    CHECK_OK(tp_free_async(p, s));
    CHECK(reserved_of(host) >= 100 * MiB);
    release(&g);
    fig = ref_figure("alloc from host pool", "after sync: ");
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(host), ref_number(fig, "reserved"));
    CHECK_EQ_U64(used_of(host), 0);
    CHECK_OK(tp_pool_destroy(host));
  }

  check_context("destroy pool with outstanding alloc");
  tp_pool_t doomed = device_pool(0);
  if (doomed) {
    void *p = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&p, MiB, doomed, s));
    CHECK_ROW("destroy pool with outstanding alloc", tp_pool_destroy(doomed));
    CHECK_ROW("free after pool destroy", tp_free_async(p, s));
    CHECK_ROW("sync", tp_stream_synchronize(s));
  }

  tp_pool_t def = default_pool();
  CHECK_ROW("trimTo on default", tp_pool_trim_to(def, 0));
  check_context(NULL);
  stream_done(s);
}

static void test_current_pool_rows(void) {
  tp_location_t dev0 = loc_device(0);

  check_context("setMemPool device 0 <- host pool");
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  tp_pool_t host = NULL;
  if (CHECK_OK(tp_pool_create(&host, &props))) {
    CHECK_ROW("setMemPool device 0 <- host pool",
              tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, host));
    CHECK_OK(tp_pool_destroy(host));
  }

  check_context("setMemPool device 0 <- managed type mismatch");
  props = props_make(TP_ALLOCATION_MANAGED, dev0, 0, 0);
  tp_pool_t managed = NULL;
  if (CHECK_OK(tp_pool_create(&managed, &props))) {
    CHECK_ROW("setMemPool device 0 <- managed type mismatch",
              tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, managed));
    CHECK_OK(tp_pool_destroy(managed));
  }

  /* The refused calls above must have left device 0's current pool alone. */
  tp_pool_t cur = NULL;
  CHECK_OK(tp_mem_get_pool(&cur, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(cur, default_pool());

  tp_pool_t pool = NULL;
  tp_location_t none = loc_none(), hostloc = loc_host();
  if (CHECK_ROW("getDefault managed + location none",
                tp_mem_get_default_pool(&pool, &none, TP_ALLOCATION_MANAGED)))
    CHECK(pool != NULL);

  CHECK_ROW("getDefault pinned + location none",
            tp_mem_get_default_pool(&pool, &none, TP_ALLOCATION_PINNED));

  pool = NULL;
  if (CHECK_ROW("getDefault pinned + host",
                tp_mem_get_default_pool(&pool, &hostloc, TP_ALLOCATION_PINNED)))
    CHECK(pool != NULL);
  check_context(NULL);
}

static void test_access_rows(void) {
  tp_pool_t def = default_pool();
  REQUIRE(def != NULL);
  tp_location_t dev0 = loc_device(0);

  /* The driver printed its flags' value; tidepool's enum has the same
   * values, so the figure compares directly. */
  tp_access_flags_t flags = (tp_access_flags_t)77;
  CHECK_ROW("getAccess own device", tp_pool_get_access(&flags, def, &dev0));
  const char *fig = ref_figure("getAccess own device", "flags ");
  if (fig)
    CHECK_EQ_INT(flags, strtol(fig, NULL, 0));
  CHECK_EQ_INT(flags, TP_ACCESS_READ_WRITE);

  tp_access_desc_t desc = {dev0, TP_ACCESS_NONE};
  CHECK_ROW("setAccess own device to none", tp_pool_set_access(def, &desc, 1));
  flags = (tp_access_flags_t)77;
  CHECK_OK(tp_pool_get_access(&flags, def, &dev0));
  CHECK_EQ_INT(flags, TP_ACCESS_READ_WRITE);

  desc.location = loc_device(unknown_device());
  desc.flags = TP_ACCESS_READ_WRITE;
  CHECK_ROW("setAccess device 5", tp_pool_set_access(def, &desc, 1));
  check_context(NULL);
}

static void test_ipc_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);
  tp_pool_t plain = device_pool(0);
  REQUIRE(plain != NULL);

  check_context("exportPointer from non-IPC pool");
  void *p = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, plain, s));
  tp_pool_ptr_export_data_t data;
  memset(&data, 0, sizeof data);
  CHECK_ROW("exportPointer from non-IPC pool",
            tp_pool_export_pointer(&data, p));
  CHECK_OK(tp_free_async(p, s));

  int fd = -1;
  CHECK_ROW(
      "exportToShareableHandle non-IPC pool",
      tp_pool_export_to_shareable_handle(&fd, plain, TP_HANDLE_POSIX_FD, 0));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(plain));

  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD, 0);
  tp_pool_t ipc = NULL;
  if (!CHECK_ROW("pool create IPC posix fd", tp_pool_create(&ipc, &props))) {
    stream_done(s);
    return;
  }

  fd = -1;
  CHECK_ROW("export IPC pool flags=1", tp_pool_export_to_shareable_handle(
                                           &fd, ipc, TP_HANDLE_POSIX_FD, 1));

  fd = -1;
  CHECK_ROW("export IPC pool", tp_pool_export_to_shareable_handle(
                                   &fd, ipc, TP_HANDLE_POSIX_FD, 0));
  CHECK(fd >= 0);
  const char *fig =
      ref_figure("export IPC pool", "sizeof(cudaMemPoolPtrExportData)=");
  if (fig)
    CHECK_EQ_U64(sizeof(tp_pool_ptr_export_data_t), strtoull(fig, NULL, 0));

  /* Not a row of the driver's, but the other half of the same contract:
   * a live allocation of an IPC pool can be exported. */
  check_context("exportPointer from IPC pool");
  p = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, ipc, s));
  CHECK_OK(tp_pool_export_pointer(&data, p));

  check_context("import own pool handle");
  tp_pool_t imported = NULL;
  if (CHECK(fd >= 0) &&
      CHECK_ROW("import own pool handle",
                tp_pool_import_from_shareable_handle(
                    &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0))) {
    CHECK(imported != NULL);
    void *q = NULL;
    CHECK_ROW("mallocFromPool on imported pool",
              tp_malloc_from_pool_async(&q, 4096, imported, s));
    CHECK_OK(tp_pool_destroy(imported));
  }
  check_context(NULL);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(ipc));
  if (fd >= 0)
    close(fd);
  stream_done(s);
}

/* Every row and every figure of the table was compared: a row that no test
 * reads is a reference answer silently dropped. Runs last. */
static void test_every_row_checked(void) {
  ref_load();
  CHECK(ref_nrows > 0);
  for (int i = 0; i < ref_nrows; i++) {
    const ref_row_t *r = &ref_rows[i];
    if (!r->checked)
      CHECK_FAIL("the row \"%s\" was not checked", r->label);
    for (int k = 0; k < r->nfig; k++)
      if (!r->figure_checked[k])
        CHECK_FAIL("the figure \"%s\" after \"%s\" was not checked",
                   r->figure[k], r->label);
  }
  printf("   %d rows of the driver's answers\n", ref_nrows);
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_alloc_free_rows),
      CONFORMANCE_TEST(test_attribute_rows),
      CONFORMANCE_TEST(test_pool_create_rows),
      CONFORMANCE_TEST(test_pool_statistics_rows),
      CONFORMANCE_TEST(test_current_pool_rows),
      CONFORMANCE_TEST(test_access_rows),
      CONFORMANCE_TEST(test_ipc_rows),
      CONFORMANCE_TEST(test_every_row_checked),
  };
  return conformance_main(argc, argv, "reference", tests,
                          CONFORMANCE_COUNT(tests));
}
