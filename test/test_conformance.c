/* Conformance: what tidepool promises through its public API alone, on
 * every platform: the driver's reference answers, reuse policies, release,
 * trim, statistics, destroy, access, current pools, OOM, stream runtime. */
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include "check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ========================================================================
 * Helpers
 * ======================================================================== */

static tp_location_t loc_device(int id) {
  tp_location_t loc = {TP_LOCATION_DEVICE, id, 0};
  return loc;
}

static tp_location_t loc_host(void) {
  tp_location_t loc = {TP_LOCATION_HOST, 0, 0};
  return loc;
}

static tp_location_t loc_numa(int node) {
  tp_location_t loc = {TP_LOCATION_HOST_NUMA, node, 0};
  return loc;
}

static tp_location_t loc_none(void) {
  tp_location_t loc = {TP_LOCATION_NONE, 0, 0};
  return loc;
}

/* Properties are zeroed first, as the manual asks, so that fields a test
 * does not name (usage) hold their documented default. */
static tp_pool_props_t props_make(tp_allocation_type_t type, tp_location_t loc,
                                  unsigned handle_types, size_t max_size) {
  tp_pool_props_t p;
  memset(&p, 0, sizeof p);
  p.alloc_type = type;
  p.location = loc;
  p.handle_types = handle_types;
  p.max_size = max_size;
  return p;
}

/* A pinned pool of device 0; NULL (with a failure counted) when creation
 * fails. */
static tp_pool_t device_pool(size_t max_size) {
  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_NONE, max_size);
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return NULL;
  CHECK(pool != NULL);
  return pool;
}

static tp_pool_t default_pool(void) {
  tp_pool_t pool = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&pool, 0));
  CHECK(pool != NULL);
  return pool;
}

/* Reads a uint64_t attribute. The value is prefilled with a pattern so that
 * an implementation that writes only four bytes is caught by the caller's
 * comparisons. */
static uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = UINT64_C(0xAAAAAAAAAAAAAAAA);
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

/* Reads an int attribute and checks that no more than an int was written:
 * the value types are part of the contract. */
static int attr_int(tp_pool_t pool, tp_pool_attr_t attr) {
  struct {
    int v;
    int guard;
  } w = {-12345, 0x5A5A5A5A};
  CHECK_OK(tp_pool_get_attribute(pool, attr, &w.v));
  CHECK_EQ_INT(w.guard, 0x5A5A5A5A);
  return w.v;
}

static void set_u64(tp_pool_t pool, tp_pool_attr_t attr, uint64_t v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static void set_int(tp_pool_t pool, tp_pool_attr_t attr, int v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static void set_policies(tp_pool_t pool, int follow, int opportunistic,
                         int internal) {
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, follow);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, opportunistic);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, internal);
}

static uint64_t reserved_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
}

static uint64_t used_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
}

static uint64_t chunk_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_CHUNK_SIZE);
}

static uint64_t round_up(uint64_t x, uint64_t m) {
  return m ? (x + m - 1) / m * m : x;
}

static tp_stream_t stream_new(unsigned flags) {
  tp_stream_t s = NULL;
  CHECK_OK(tp_stream_create(&s, flags));
  CHECK(s != NULL);
  return s;
}

/* Synchronizes and destroys a stream made by stream_new; NULL is skipped so
 * that cleanup paths can call it unconditionally. */
static void stream_done(tp_stream_t s) {
  if (!s)
    return;
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

static tp_event_t event_new(void) {
  tp_event_t ev = NULL;
  CHECK_OK(tp_event_create(&ev));
  CHECK(ev != NULL);
  return ev;
}

static int ranges_overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* A host function that raises a flag: tests launch it to see when a
 * stream's work really runs. */
static void raise_flag_fn(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

/* A host function that keeps its stream busy for (intptr_t)arg
 * milliseconds without the test having to release it. */
static void sleep_fn(void *arg) {
  check_sleep_ms((long)(intptr_t)arg);
}

/* Copies `n` bytes of pool memory into `out`, through the stream (on every
 * platform) and, on host, also by direct dereference, which must agree. */
static void read_back(void *out, const void *pool_mem, size_t n,
                      tp_stream_t s) {
  CHECK_OK(tp_memcpy_async(out, pool_mem, n, s));
  CHECK_OK(tp_stream_synchronize(s));
  if (check_on_host())
    CHECK(memcmp(out, pool_mem, n) == 0);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v)
      return 0;
  return 1;
}

/* ========================================================================
 * 1. The driver's reference answers (shared/reference/driver-answers.txt),
 *    one check per row, labelled with the row.
 * ======================================================================== */

static void test_driver_alloc_free_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);

  check_context("mallocAsync size 0");
  void *p = (void *)&p;
  CHECK_OK(tp_malloc_async(&p, 0, s));
  CHECK_EQ_PTR(p, NULL);

  check_context("mallocAsync NULL devPtr");
  CHECK_ERR(tp_malloc_async(NULL, 64, s), TP_ERROR_INVALID_VALUE);

  check_context("freeAsync NULL");
  CHECK_OK(tp_free_async(NULL, s));

  check_context("freeAsync host pointer");
  int local = 0;
  CHECK_ERR(tp_free_async(&local, s), TP_ERROR_INVALID_VALUE);
  void *heap = malloc(4096);
  REQUIRE(heap != NULL);
  CHECK_ERR(tp_free_async(heap, s), TP_ERROR_INVALID_VALUE);
  free(heap);

  check_context("freeAsync interior pointer");
  void *q = NULL;
  REQUIRE_OK(tp_malloc_async(&q, 4096, s));
  REQUIRE(q != NULL);
  CHECK_ERR(tp_free_async((char *)q + 8, s), TP_ERROR_INVALID_VALUE);
  /* 512 bytes in is a granule boundary, so a registry keyed by granules
   * must still see that it is inside q's block. */
  CHECK_ERR(tp_free_async((char *)q + 512, s), TP_ERROR_INVALID_VALUE);

  check_context("freeAsync ok");
  CHECK_OK(tp_free_async(q, s));

  check_context("freeAsync double free");
  CHECK_ERR(tp_free_async(q, s), TP_ERROR_INVALID_VALUE);

  check_context("sync after double free");
  CHECK_OK(tp_stream_synchronize(s));

  check_context("mallocAsync huge 1<<50");
  p = NULL;
  CHECK_ERR(tp_malloc_async(&p, (size_t)1 << 50, s), TP_ERROR_OUT_OF_MEMORY);

  check_context("mallocAsync SIZE_MAX");
  CHECK_ERR(tp_malloc_async(&p, SIZE_MAX, s), TP_ERROR_OUT_OF_MEMORY);

  check_context("ptrs for sizes 1,1,3000");
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(tp_malloc_async(&a, 1, s));
  CHECK_OK(tp_malloc_async(&b, 1, s));
  CHECK_OK(tp_malloc_async(&c, 3000, s));
  if (CHECK(a && b && c)) {
    CHECK(a != b && b != c && a != c);
    CHECK_EQ_U64((uintptr_t)a % 512, 0);
    CHECK_EQ_U64((uintptr_t)b % 512, 0);
    CHECK_EQ_U64((uintptr_t)c % 512, 0);
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

static void test_driver_attribute_rows(void) {
  tp_pool_t def = default_pool();
  REQUIRE(def != NULL);

  check_context("destroy default pool");
  CHECK_ERR(tp_pool_destroy(def), TP_ERROR_INVALID_VALUE);

  check_context("set ReservedMemHigh nonzero");
  uint64_t v = 1;
  CHECK_ERR(tp_pool_set_attribute(def, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);

  check_context("set ReservedMemHigh zero");
  v = 0;
  CHECK_OK(tp_pool_set_attribute(def, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v));

  check_context("set UsedMemCurrent (read-only)");
  v = 0;
  CHECK_ERR(tp_pool_set_attribute(def, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);

  check_context("get attr bogus 999");
  uint64_t big = 0;
  CHECK_ERR(tp_pool_get_attribute(def, (tp_pool_attr_t)999, &big),
            TP_ERROR_INVALID_VALUE);

  check_context("get attr NULL value");
  CHECK_ERR(
      tp_pool_get_attribute(def, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, NULL),
      TP_ERROR_INVALID_VALUE);

  check_context("get ReuseAllowOpportunistic");
  CHECK_EQ_INT(attr_int(def, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 1);

  check_context("get ReleaseThreshold");
  CHECK_EQ_U64(attr_u64(def, TP_POOL_ATTR_RELEASE_THRESHOLD), 0);
  check_context(NULL);
}

static void test_driver_pool_create_rows(void) {
  tp_pool_t pool = NULL;
  tp_pool_props_t props;

  check_context("pool create device");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  check_context("pool create NULL props");
  CHECK_ERR(tp_pool_create(&pool, NULL), TP_ERROR_INVALID_VALUE);

  check_context("pool create device id 57");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(57), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  check_context("pool create allocType 77");
  props = props_make((tp_allocation_type_t)77, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  check_context("pool create host + posix fd");
  props = props_make(TP_ALLOCATION_PINNED, loc_host(), TP_HANDLE_POSIX_FD, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  check_context("pool create HostNumaCurrent");
  tp_location_t numa_current = {TP_LOCATION_HOST_NUMA_CURRENT, 0, 0};
  props = props_make(TP_ALLOCATION_PINNED, numa_current, 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  check_context("pool create host");
  props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  check_context("pool create host numa 0");
  props = props_make(TP_ALLOCATION_PINNED, loc_numa(0), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  check_context("pool create managed maxSize!=0");
  props = props_make(TP_ALLOCATION_MANAGED, loc_device(0), 0, 64 * MiB);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  check_context("pool create managed");
  props = props_make(TP_ALLOCATION_MANAGED, loc_device(0), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));

  /* The manual also admits managed pools without a preferred location. */
  check_context("pool create managed, location none");
  props = props_make(TP_ALLOCATION_MANAGED, loc_none(), 0, 0);
  if (CHECK_OK(tp_pool_create(&pool, &props)))
    CHECK_OK(tp_pool_destroy(pool));
  check_context(NULL);
}

static void test_driver_pool_statistics_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);

  check_context("pool create maxSize 64MiB");
  tp_pool_t capped = device_pool(64 * MiB);
  if (capped) {
    check_context("alloc 48MiB from 64MiB pool");
    void *big = NULL, *more = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&big, 48 * MiB, capped, s));
    check_context("alloc 32MiB more from 64MiB pool");
    CHECK_ERR(tp_malloc_from_pool_async(&more, 32 * MiB, capped, s),
              TP_ERROR_OUT_OF_MEMORY);
    check_context("after free+sync: reserved 0 used 0");
    CHECK_OK(tp_free_async(big, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(capped), 0);
    CHECK_EQ_U64(used_of(capped), 0);
    CHECK_OK(tp_pool_destroy(capped));
  }

  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  tp_pool_t host = NULL;
  check_context("pool create host");
  if (CHECK_OK(tp_pool_create(&host, &props))) {
    check_context("alloc from host pool");
    void *p = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&p, 100, host, s));
    check_context("one 100-byte alloc: reserved > 0, used 100");
    CHECK(reserved_of(host) > 0);
    CHECK_EQ_U64(used_of(host), 100);
    check_context("after free+sync (threshold 0): reserved 0 used 0");
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(host), 0);
    CHECK_EQ_U64(used_of(host), 0);

    /* The stream is held so that the free is certainly pending when the
     * figures are read: the driver's row is about memory of a free that
     * has not been synchronized, and must not depend on timing. */
    check_context("100MiB alloc+free before sync: reserved >= 100MiB");
    gate_t g;
    CHECK_OK(tp_malloc_from_pool_async(&p, 100 * MiB, host, s));
    CHECK_OK(hold_stream(s, &g));
    CHECK_OK(tp_free_async(p, s));
    CHECK(reserved_of(host) >= 100 * MiB);
    release(&g);
    check_context("after sync: reserved 0");
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(reserved_of(host), 0);
    CHECK_EQ_U64(used_of(host), 0);
    CHECK_OK(tp_pool_destroy(host));
  }

  check_context("destroy pool with outstanding alloc");
  tp_pool_t doomed = device_pool(0);
  if (doomed) {
    void *p = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&p, MiB, doomed, s));
    CHECK_OK(tp_pool_destroy(doomed));
    check_context("free after pool destroy");
    CHECK_OK(tp_free_async(p, s));
    check_context("sync");
    CHECK_OK(tp_stream_synchronize(s));
  }

  check_context("trimTo on default");
  tp_pool_t def = default_pool();
  CHECK_OK(tp_pool_trim_to(def, 0));
  check_context(NULL);
  stream_done(s);
}

static void test_driver_current_pool_rows(void) {
  tp_location_t dev0 = loc_device(0);

  check_context("setMemPool device 0 <- host pool");
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, loc_host(), 0, 0);
  tp_pool_t host = NULL;
  if (CHECK_OK(tp_pool_create(&host, &props))) {
    CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, host),
              TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_pool_destroy(host));
  }

  check_context("setMemPool device 0 <- managed type mismatch");
  props = props_make(TP_ALLOCATION_MANAGED, dev0, 0, 0);
  tp_pool_t managed = NULL;
  if (CHECK_OK(tp_pool_create(&managed, &props))) {
    CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, managed),
              TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_pool_destroy(managed));
  }

  /* The refused calls above must have left device 0's current pool alone. */
  tp_pool_t cur = NULL;
  CHECK_OK(tp_mem_get_pool(&cur, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(cur, default_pool());

  tp_pool_t pool = NULL;
  tp_location_t none = loc_none(), hostloc = loc_host();
  check_context("getDefault managed + location none");
  CHECK_OK(tp_mem_get_default_pool(&pool, &none, TP_ALLOCATION_MANAGED));
  CHECK(pool != NULL);

  check_context("getDefault pinned + location none");
  CHECK_ERR(tp_mem_get_default_pool(&pool, &none, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);

  check_context("getDefault pinned + host");
  pool = NULL;
  CHECK_OK(tp_mem_get_default_pool(&pool, &hostloc, TP_ALLOCATION_PINNED));
  CHECK(pool != NULL);
  check_context(NULL);
}

/* An ordinal no device has: 5 as in the driver's row where that is unknown,
 * otherwise one past the machine's devices. */
static int unknown_device(void) {
  int count = 0;
  CHECK_OK(tp_get_device_count(&count));
  return count > 5 ? count + 5 : 5;
}

static void test_driver_access_rows(void) {
  tp_pool_t def = default_pool();
  REQUIRE(def != NULL);
  tp_location_t dev0 = loc_device(0);

  check_context("getAccess own device");
  tp_access_flags_t flags = (tp_access_flags_t)77;
  CHECK_OK(tp_pool_get_access(&flags, def, &dev0));
  CHECK_EQ_INT(flags, TP_ACCESS_READ_WRITE);

  check_context("setAccess own device to none");
  tp_access_desc_t desc = {dev0, TP_ACCESS_NONE};
  CHECK_ERR(tp_pool_set_access(def, &desc, 1), TP_ERROR_INVALID_DEVICE);
  flags = (tp_access_flags_t)77;
  CHECK_OK(tp_pool_get_access(&flags, def, &dev0));
  CHECK_EQ_INT(flags, TP_ACCESS_READ_WRITE);

  check_context("setAccess device 5");
  desc.location = loc_device(unknown_device());
  desc.flags = TP_ACCESS_READ_WRITE;
  CHECK_ERR(tp_pool_set_access(def, &desc, 1), TP_ERROR_INVALID_DEVICE);
  check_context(NULL);
}

static void test_driver_ipc_rows(void) {
  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  REQUIRE(s != NULL);
  tp_pool_t plain = device_pool(0);
  REQUIRE(plain != NULL);

  check_context("exportPointer from non-IPC pool");
  void *p = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, plain, s));
  tp_pool_ptr_export_data_t data;
  memset(&data, 0, sizeof data);
  CHECK_ERR(tp_pool_export_pointer(&data, p), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_free_async(p, s));

  check_context("exportToShareableHandle non-IPC pool");
  int fd = -1;
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(&fd, plain, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(plain));

  check_context("pool create IPC posix fd");
  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD, 0);
  tp_pool_t ipc = NULL;
  if (!CHECK_OK(tp_pool_create(&ipc, &props))) {
    stream_done(s);
    return;
  }

  check_context("export IPC pool flags=1");
  fd = -1;
  CHECK_ERR(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_POSIX_FD, 1),
            TP_ERROR_INVALID_VALUE);

  check_context("export IPC pool");
  fd = -1;
  CHECK_OK(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_POSIX_FD, 0));
  CHECK(fd >= 0);
  CHECK_EQ_U64(sizeof(tp_pool_ptr_export_data_t), 64);

  /* Not a row of the driver's, but the other half of the same contract:
   * a live allocation of an IPC pool can be exported. */
  check_context("exportPointer from IPC pool");
  p = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, ipc, s));
  CHECK_OK(tp_pool_export_pointer(&data, p));

  check_context("import own pool handle");
  tp_pool_t imported = NULL;
  if (fd >= 0 &&
      CHECK_OK(tp_pool_import_from_shareable_handle(
          &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0))) {
    CHECK(imported != NULL);
    check_context("mallocFromPool on imported pool");
    void *q = NULL;
    CHECK_ERR(tp_malloc_from_pool_async(&q, 4096, imported, s),
              TP_ERROR_INVALID_VALUE);
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

/* ========================================================================
 * 2. Reuse policies
 *
 * A pool with room to spare may answer a request from fresh memory rather
 * than from the block a test freed, so "the block was reused" is only an
 * observable rule when the freed block is the pool's only free memory. The
 * tests therefore fill a pool capped by max_size with blocks of one size,
 * free one of them (X), and ask again: the answer is X when a policy allows
 * reuse, and OUT_OF_MEMORY when none does (TP_POOL_ATTR_OOM_WAIT is off, so
 * the pool may not wait on the host for the pending free). The release
 * threshold is UINT64_MAX so that no synchronize unmaps X's memory.
 *
 * Whether a stream's work waits is seen through device work (a memset)
 * and tp_stream_query, not only through host functions: on cuda the host
 * functions of all streams run on one driver thread, which a held stream's
 * gate occupies, so no host function of another stream runs while a gate
 * is closed there.
 * ======================================================================== */

/* Labels failures with the step being checked, size included. */
static _Thread_local char step_label_[160];
static void step(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void step(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(step_label_, sizeof step_label_, fmt, ap);
  va_end(ap);
  check_context(step_label_);
}

typedef struct full_pool {
  tp_pool_t pool;
  size_t size;
  void **blocks; /* live blocks; NULL where the test freed one */
  int n;
} full_pool_t;

/* Creates a capped pool with the given policies and fills it with blocks of
 * `size` on `filler`. Returns 0 (with a failure counted) when the pool
 * cannot be set up. */
static int fp_make(full_pool_t *fp, size_t size, int follow, int opportunistic,
                   int internal, tp_stream_t filler) {
  memset(fp, 0, sizeof *fp);
  fp->size = size;
  uint64_t chunk = chunk_of(default_pool());
  if (!CHECK(chunk > 0 && chunk < ((uint64_t)1 << 40)))
    return 0;
  /* Room for at least eight blocks and two chunks: enough for the tests
   * to pick X and Y, few enough for small blocks to fill quickly. */
  uint64_t want =
      8 * (uint64_t)size > 2 * chunk ? 8 * (uint64_t)size : 2 * chunk;
  size_t cap = (size_t)round_up(want, chunk);
  fp->pool = device_pool(cap);
  if (!fp->pool)
    return 0;
  set_u64(fp->pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set_int(fp->pool, TP_POOL_ATTR_OOM_WAIT, 0);
  set_policies(fp->pool, follow, opportunistic, internal);
  int max_blocks = (int)(cap / size) + 1;
  fp->blocks = calloc((size_t)max_blocks, sizeof *fp->blocks);
  if (!CHECK(fp->blocks != NULL))
    return 0;
  for (;;) {
    void *p = NULL;
    tp_error_t err = tp_malloc_from_pool_async(&p, size, fp->pool, filler);
    if (err == TP_ERROR_OUT_OF_MEMORY)
      break;
    if (!CHECK_OK(err))
      return 0;
    if (fp->n == max_blocks) {
      /* More blocks than max_size holds: the cap is not enforced. */
      CHECK_FAIL("a pool capped at %zu bytes gave more than %d blocks of %zu",
                 cap, max_blocks, size);
      CHECK_OK(tp_free_async(p, filler));
      break;
    }
    fp->blocks[fp->n++] = p;
  }
  CHECK_EQ_U64(used_of(fp->pool), (uint64_t)fp->n * size);
  CHECK(reserved_of(fp->pool) <= cap);
  CHECK_OK(tp_stream_synchronize(filler));
  return CHECK(fp->n >= 3);
}

/* Frees block i on `s`; the caller keeps its address to recognise it. */
static void *fp_free(full_pool_t *fp, int i, tp_stream_t s) {
  void *x = fp->blocks[i];
  CHECK_OK(tp_free_async(x, s));
  fp->blocks[i] = NULL;
  return x;
}

/* Allocates on `s` and expects block i's address `x` back. A macro, so
 * that a failure names the caller's line. */
#define fp_expect_reuse(fp, i, x, s) fp_expect_reuse_(fp, i, x, s, __LINE__)
static void fp_expect_reuse_(full_pool_t *fp, int i, void *x, tp_stream_t s,
                             int line) {
  void *p = NULL;
  tp_error_t err = tp_malloc_from_pool_async(&p, fp->size, fp->pool, s);
  if (!check_err_(__FILE__, line, "allocating the freed block's size", err,
                  TP_SUCCESS))
    return;
  if (check_eq_ptr_(__FILE__, line, "the block given", "the freed block", p, x))
    fp->blocks[i] = p;
  else
    CHECK_OK(tp_free_async(p, s));
}

/* Allocates on `s` and expects no memory: the only free block may not be
 * reused by `s` yet. */
#define fp_expect_none(fp, x, s) fp_expect_none_(fp, x, s, __LINE__)
static void fp_expect_none_(full_pool_t *fp, void *x, tp_stream_t s, int line) {
  void *p = NULL;
  tp_error_t err = tp_malloc_from_pool_async(&p, fp->size, fp->pool, s);
  if (check_err_(__FILE__, line, "allocating the freed block's size", err,
                 TP_ERROR_OUT_OF_MEMORY) ||
      err != TP_SUCCESS)
    return;
  check_fail_(__FILE__, line, "got %p (%s), which the policies forbid", p,
              p == x ? "the pending block" : "memory beyond max_size");
  CHECK_OK(tp_free_async(p, s));
}

/* Frees what is still live on `s`, checks that the pool is empty, and
 * destroys it. */
static void fp_release(full_pool_t *fp, tp_stream_t s) {
  check_context(NULL);
  if (fp->blocks)
    for (int i = 0; i < fp->n; i++)
      if (fp->blocks[i])
        CHECK_OK(tp_free_async(fp->blocks[i], s));
  CHECK_OK(tp_device_synchronize());
  if (fp->pool) {
    CHECK_EQ_U64(used_of(fp->pool), 0);
    CHECK_OK(tp_pool_destroy(fp->pool));
  }
  free(fp->blocks);
  memset(fp, 0, sizeof *fp);
}

typedef struct policy_streams {
  tp_stream_t f, a, b, c; /* filler, freeing, allocating, third */
} policy_streams_t;

/* All policies off: only stream order allows reuse, until a synchronize
 * makes the free known complete to every stream. */
static void reuse_without_policies(size_t size, policy_streams_t *st) {
  gate_t g;
  step("%zu B, no policies, room to spare: B gets other memory", size);
  tp_pool_t roomy = device_pool(0);
  if (roomy) {
    set_u64(roomy, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
    set_policies(roomy, 0, 0, 0);
    void *x = NULL, *y = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&x, size, roomy, st->a));
    CHECK_OK(hold_stream(st->a, &g));
    CHECK_OK(tp_free_async(x, st->a));
    if (CHECK_OK(tp_malloc_from_pool_async(&y, size, roomy, st->b))) {
      CHECK(y != x);
      CHECK(!ranges_overlap(x, size, y, size));
      CHECK_OK(tp_free_async(y, st->b));
    }
    release(&g);
    CHECK_OK(tp_device_synchronize());
    CHECK_OK(tp_pool_destroy(roomy));
  }

  full_pool_t fp;
  step("%zu B, no policies: fill", size);
  if (!fp_make(&fp, size, 0, 0, 0, st->f)) {
    fp_release(&fp, st->f);
    return;
  }
  REQUIRE_OK(hold_stream(st->a, &g));
  void *x = fp_free(&fp, 0, st->a);
  step("%zu B, no policies: A reuses its own free at once", size);
  fp_expect_reuse(&fp, 0, x, st->a);
  if (fp.blocks[0])
    x = fp_free(&fp, 0, st->a);
  step("%zu B, no policies: B may not reuse A's pending free", size);
  fp_expect_none(&fp, x, st->b);
  release(&g);
  step("%zu B, no policies: after tp_stream_synchronize(A), B reuses", size);
  CHECK_OK(tp_stream_synchronize(st->a));
  fp_expect_reuse(&fp, 0, x, st->b);
  fp_release(&fp, st->f);
}

/* ALLOW_OPPORTUNISTIC alone: a free is reusable by another stream once it
 * has completed, whether or not anyone synchronized. */
static void reuse_opportunistic(size_t size, policy_streams_t *st) {
  gate_t g;
  full_pool_t fp;
  step("%zu B, opportunistic: fill", size);
  if (!fp_make(&fp, size, 0, 1, 0, st->f)) {
    fp_release(&fp, st->f);
    return;
  }
  REQUIRE_OK(hold_stream(st->a, &g));
  void *x = fp_free(&fp, 0, st->a);
  step("%zu B, opportunistic: not reused while A is held", size);
  fp_expect_none(&fp, x, st->b);
  release(&g);
  step("%zu B, opportunistic: reused after tp_stream_synchronize(A)", size);
  CHECK_OK(tp_stream_synchronize(st->a));
  fp_expect_reuse(&fp, 0, x, st->b);

  if (!fp.blocks[0]) {
    fp_release(&fp, st->f);
    return;
  }
  REQUIRE_OK(hold_stream(st->a, &g));
  x = fp_free(&fp, 0, st->a);
  step("%zu B, opportunistic: not reused while A is held (again)", size);
  fp_expect_none(&fp, x, st->b);
  release(&g);
  step("%zu B, opportunistic: reused once A's work completed, unsynced", size);
  CHECK_OK(check_poll_stream(st->a, 5000));
  fp_expect_reuse(&fp, 0, x, st->b);
  fp_release(&fp, st->f);
}

/* FOLLOW_EVENT_DEPENDENCIES alone: a stream that waits on an event recorded
 * after a free may reuse the block, even though the free has not run. */
static void reuse_follow_events(size_t size, policy_streams_t *st) {
  gate_t g;
  full_pool_t fp;
  atomic_int flag = 0;
  step("%zu B, follow events: fill", size);
  if (!fp_make(&fp, size, 1, 0, 0, st->f)) {
    fp_release(&fp, st->f);
    return;
  }
  tp_event_t ev = event_new();
  REQUIRE(ev != NULL);
  REQUIRE_OK(hold_stream(st->a, &g));
  void *x = fp_free(&fp, 0, st->a);
  CHECK_OK(tp_event_record(ev, st->a));
  step("%zu B, follow events: no reuse before B waits on the event", size);
  fp_expect_none(&fp, x, st->b);
  step("%zu B, follow events: reused after tp_stream_wait_event", size);
  CHECK_OK(tp_stream_wait_event(st->b, ev, 0));
  fp_expect_reuse(&fp, 0, x, st->b);
  /* The reuse is safe only because B's later work waits for A. */
  step("%zu B, follow events: B's work waits for A", size);
  if (fp.blocks[0]) {
    CHECK_OK(tp_memset_async(x, 0, size, st->b));
    check_sleep_ms(50);
    CHECK_ERR(tp_stream_query(st->b), TP_ERROR_NOT_READY);
  }
  CHECK_OK(tp_launch_host_func(st->b, raise_flag_fn, &flag));
  check_sleep_ms(50);
  CHECK_EQ_INT(atomic_load(&flag), 0);
  release(&g);
  CHECK_OK(tp_stream_synchronize(st->b));
  CHECK_EQ_INT(atomic_load(&flag), 1);
  CHECK_OK(tp_event_destroy(ev));
  fp_release(&fp, st->f);
}

/* ALLOW_INTERNAL_DEPENDENCIES alone: another stream may take a pending
 * block, and the pool makes that stream wait for the free. */
static void reuse_internal_dependencies(size_t size, policy_streams_t *st) {
  gate_t g;
  full_pool_t fp;
  atomic_int flag = 0;
  step("%zu B, internal dependencies: fill", size);
  if (!fp_make(&fp, size, 0, 0, 1, st->f)) {
    fp_release(&fp, st->f);
    return;
  }
  REQUIRE_OK(hold_stream(st->a, &g));
  void *x = fp_free(&fp, 0, st->a);
  step("%zu B, internal dependencies: B reuses while A is held", size);
  fp_expect_reuse(&fp, 0, x, st->b);
  step("%zu B, internal dependencies: B's work waits for A", size);
  /* Only a B that took X owes A a wait; otherwise the failure is above. */
  if (fp.blocks[0]) {
    CHECK_OK(tp_memset_async(x, 0, size, st->b));
    check_sleep_ms(50);
    CHECK_ERR(tp_stream_query(st->b), TP_ERROR_NOT_READY);
  }
  CHECK_OK(tp_launch_host_func(st->b, raise_flag_fn, &flag));
  check_sleep_ms(50);
  if (fp.blocks[0])
    CHECK_EQ_INT(atomic_load(&flag), 0);
  release(&g);
  CHECK_OK(tp_stream_synchronize(st->b));
  CHECK_EQ_INT(atomic_load(&flag), 1);
  fp_release(&fp, st->f);
}

/* All policies on, as the driver: given a pending free on a held stream
 * and a completed free of the same size, a third stream gets the one that
 * needs no dependency, and its work does not wait for the held stream. */
static void reuse_prefers_no_dependency(size_t size, policy_streams_t *st) {
  gate_t g;
  full_pool_t fp;
  step("%zu B, preference: fill", size);
  if (!fp_make(&fp, size, 1, 1, 1, st->f)) {
    fp_release(&fp, st->f);
    return;
  }
  void *y = fp_free(&fp, 1, st->b);
  CHECK_OK(tp_stream_synchronize(st->b));
  REQUIRE_OK(hold_stream(st->a, &g));
  void *x = fp_free(&fp, 0, st->a);
  step("%zu B, preference: C gets the completed block Y, not X", size);
  fp_expect_reuse(&fp, 1, y, st->c);
  step("%zu B, preference: C's work does not wait for held A", size);
  if (fp.blocks[1]) {
    CHECK_OK(tp_memset_async(y, 0, size, st->c));
    CHECK_OK(check_poll_stream(st->c, 5000));
  }
  release(&g);
  step("%zu B, preference: X is reusable after A synchronized", size);
  CHECK_OK(tp_stream_synchronize(st->a));
  fp_expect_reuse(&fp, 0, x, st->c);
  fp_release(&fp, st->f);
}

static void reuse_policies(size_t size) {
  policy_streams_t st;
  st.f = stream_new(TP_STREAM_NON_BLOCKING);
  st.a = stream_new(TP_STREAM_NON_BLOCKING);
  st.b = stream_new(TP_STREAM_NON_BLOCKING);
  st.c = stream_new(TP_STREAM_NON_BLOCKING);
  if (st.f && st.a && st.b && st.c) {
    reuse_without_policies(size, &st);
    release_all_gates();
    reuse_opportunistic(size, &st);
    release_all_gates();
    reuse_follow_events(size, &st);
    release_all_gates();
    reuse_internal_dependencies(size, &st);
    release_all_gates();
    reuse_prefers_no_dependency(size, &st);
    release_all_gates();
  }
  check_context(NULL);
  stream_done(st.f);
  stream_done(st.a);
  stream_done(st.b);
  stream_done(st.c);
}

static void test_reuse_policies_small(void) {
  reuse_policies(1000);
}

static void test_reuse_policies_large(void) {
  reuse_policies(4 * MiB);
}

/* ========================================================================
 * 3. The legacy default stream (NULL), with FOLLOW_EVENT_DEPENDENCIES only:
 *    NULL waits for every blocking stream and every blocking stream waits
 *    for NULL, so those frees are followed without events; non-blocking
 *    streams are outside that order.
 * ======================================================================== */

static void legacy_stream(size_t size) {
  tp_stream_t f = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t a = stream_new(TP_STREAM_DEFAULT);
  tp_stream_t b = stream_new(TP_STREAM_DEFAULT);
  tp_stream_t n = stream_new(TP_STREAM_NON_BLOCKING);
  full_pool_t fp;
  gate_t g;
  memset(&fp, 0, sizeof fp);
  if (!f || !a || !b || !n)
    goto done;
  step("%zu B, legacy: fill", size);
  if (!fp_make(&fp, size, 1, 0, 0, f))
    goto done;

  if (!CHECK_OK(hold_stream(a, &g)))
    goto done;
  void *x = fp_free(&fp, 0, a);
  step("%zu B, legacy: NULL reuses a free of held blocking A", size);
  fp_expect_reuse(&fp, 0, x, NULL);
  release(&g);
  CHECK_OK(tp_device_synchronize());

  if (fp.blocks[0]) {
    if (!CHECK_OK(hold_stream(NULL, &g)))
      goto done;
    x = fp_free(&fp, 0, NULL);
    step("%zu B, legacy: blocking B reuses a free of held NULL", size);
    fp_expect_reuse(&fp, 0, x, b);
    release(&g);
    CHECK_OK(tp_device_synchronize());
  }

  if (fp.blocks[0]) {
    if (!CHECK_OK(hold_stream(n, &g)))
      goto done;
    x = fp_free(&fp, 0, n);
    step("%zu B, legacy: NULL may not reuse a free of held non-blocking", size);
    fp_expect_none(&fp, x, NULL);
    release(&g);
    CHECK_OK(tp_stream_synchronize(n));
    fp_expect_reuse(&fp, 0, x, NULL);
    CHECK_OK(tp_device_synchronize());
  }

  if (fp.blocks[0] && fp.blocks[1]) {
    if (!CHECK_OK(hold_stream(a, &g)))
      goto done;
    x = fp_free(&fp, 0, a);
    /* Two blocking streams meet only through work on NULL. */
    step("%zu B, legacy: blocking B may not reuse held A's free alone", size);
    fp_expect_none(&fp, x, b);
    step("%zu B, legacy: B reuses it once NULL work follows A", size);
    CHECK_OK(tp_memset_async(fp.blocks[1], 0, size, NULL));
    fp_expect_reuse(&fp, 0, x, b);
    release(&g);
    CHECK_OK(tp_device_synchronize());
  }

done:
  release_all_gates();
  fp_release(&fp, f);
  stream_done(f);
  stream_done(a);
  stream_done(b);
  stream_done(n);
}

static void test_legacy_stream_small(void) {
  legacy_stream(1000);
}

static void test_legacy_stream_large(void) {
  legacy_stream(4 * MiB);
}

/* ========================================================================
 * 4. Release threshold, at each kind of synchronize
 * ======================================================================== */

enum { SYNC_STREAM, SYNC_EVENT, SYNC_DEVICE, SYNC_KINDS };
static const char *const sync_names[SYNC_KINDS] = {"stream", "event", "device"};

/* Synchronizes the work queued on `s` by the given kind of call. */
static void sync_by(int kind, tp_stream_t s, tp_event_t ev) {
  switch (kind) {
  case SYNC_STREAM: CHECK_OK(tp_stream_synchronize(s)); break;
  case SYNC_EVENT:
    CHECK_OK(tp_event_record(ev, s));
    CHECK_OK(tp_event_synchronize(ev));
    break;
  default: CHECK_OK(tp_device_synchronize()); break;
  }
}

/* Allocates `n` blocks of `size` on `s` and frees them again, in stream
 * order, so that `n * size` bytes are free once the stream has run. */
static void churn(tp_pool_t pool, int n, size_t size, tp_stream_t s) {
  void *p[8] = {0};
  for (int i = 0; i < n && i < 8; i++)
    CHECK_OK(tp_malloc_from_pool_async(&p[i], size, pool, s));
  for (int i = 0; i < n && i < 8; i++)
    CHECK_OK(tp_free_async(p[i], s));
}

static void test_release_threshold(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && ev && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);
  const uint64_t t = 16 * MiB;

  for (int kind = 0; kind < SYNC_KINDS; kind++) {
    step("threshold 0, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
    void *small = NULL, *big = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&small, 1000, pool, s));
    CHECK_OK(tp_malloc_from_pool_async(&big, 8 * MiB, pool, s));
    CHECK(reserved_of(pool) >= 8 * MiB + 1000);
    CHECK_OK(tp_free_async(small, s));
    CHECK_OK(tp_free_async(big, s));
    sync_by(kind, s, ev);
    CHECK_EQ_U64(reserved_of(pool), 0);
    CHECK_EQ_U64(used_of(pool), 0);

    step("threshold 16 MiB, 64 MiB freed, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, t);
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), t);
    churn(pool, 4, 16 * MiB, s);
    sync_by(kind, s, ev);
    uint64_t r = reserved_of(pool);
    CHECK(r <= round_up(t, chunk));
    CHECK(r > 0);
    CHECK_EQ_U64(used_of(pool), 0);
    CHECK_OK(tp_pool_trim_to(pool, 0));
    CHECK_EQ_U64(reserved_of(pool), 0);

    step("threshold UINT64_MAX keeps all, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
    void *p[4] = {0};
    for (int i = 0; i < 4; i++)
      CHECK_OK(tp_malloc_from_pool_async(&p[i], 16 * MiB, pool, s));
    uint64_t before = reserved_of(pool);
    CHECK(before >= 64 * MiB);
    for (int i = 0; i < 4; i++)
      CHECK_OK(tp_free_async(p[i], s));
    sync_by(kind, s, ev);
    CHECK_EQ_U64(reserved_of(pool), before);
    CHECK_OK(tp_pool_trim_to(pool, 0));
    CHECK_EQ_U64(reserved_of(pool), 0);
  }
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_event_destroy(ev));
  stream_done(s);
}

/* ========================================================================
 * 5. trim_to
 * ======================================================================== */

static void test_trim_to(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);

  step("trim_to(X) keeps at most X, rounded up to the chunk");
  churn(pool, 4, 16 * MiB, s);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(reserved_of(pool) >= 64 * MiB);
  uint64_t unmaps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  const uint64_t keep = 20 * MiB + 1000;
  CHECK_OK(tp_pool_trim_to(pool, keep));
  uint64_t r = reserved_of(pool);
  CHECK(r <= round_up(keep, chunk));
  CHECK(attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS) > unmaps0);

  step("trim_to(0) after completed frees releases everything");
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);

  step("trim_to keeps the memory of live allocations");
  void *live = NULL, *gone = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&live, 8 * MiB, pool, s));
  CHECK_OK(tp_memset_async(live, 0x5C, 8 * MiB, s));
  CHECK_OK(tp_malloc_from_pool_async(&gone, 32 * MiB, pool, s));
  CHECK_OK(tp_free_async(gone, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  uint64_t used = used_of(pool);
  r = reserved_of(pool);
  CHECK_EQ_U64(used, 8 * MiB);
  CHECK(r >= used);
  /* The 32 MiB freed block went; at most the live block's partial chunks
   * at either end may stay beyond its own bytes. */
  CHECK(r <= used + 2 * chunk);
  unsigned char *host = malloc(8 * MiB);
  REQUIRE(host != NULL);
  read_back(host, live, 8 * MiB, s);
  CHECK(all_bytes(host, 8 * MiB, 0x5C));
  free(host);

  step("trim_to keeps the memory of a free that is still pending");
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_free_async(live, s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) >= 8 * MiB);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

/* ========================================================================
 * 6. Statistics and attributes
 * ======================================================================== */

typedef struct attr_info {
  tp_pool_attr_t attr;
  const char *name;
  int is_u64;
} attr_info_t;

static const attr_info_t read_only_attrs[] = {
    {TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT", 1},
    {TP_POOL_ATTR_USED_MEM_CURRENT, "USED_MEM_CURRENT", 1},
    {TP_POOL_ATTR_ALLOCATION_TYPE, "ALLOCATION_TYPE", 0},
    {TP_POOL_ATTR_EXPORT_HANDLE_TYPES, "EXPORT_HANDLE_TYPES", 0},
    {TP_POOL_ATTR_LOCATION_ID, "LOCATION_ID", 0},
    {TP_POOL_ATTR_LOCATION_TYPE, "LOCATION_TYPE", 0},
    {TP_POOL_ATTR_LOCALITY_DOMAIN_ID, "LOCALITY_DOMAIN_ID", 0},
    {TP_POOL_ATTR_MAX_POOL_SIZE, "MAX_POOL_SIZE", 1},
    {TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, "HW_DECOMPRESS_ENABLED", 0},
    {TP_POOL_ATTR_CHUNK_MAPS, "CHUNK_MAPS", 1},
    {TP_POOL_ATTR_CHUNK_UNMAPS, "CHUNK_UNMAPS", 1},
    {TP_POOL_ATTR_CHUNK_SIZE, "CHUNK_SIZE", 1},
};

/* The read-only attributes refuse a write of their own current value (the
 * one write that could pass for harmless) and keep that value. */
static void check_read_only_attrs(tp_pool_t pool) {
  size_t n = sizeof read_only_attrs / sizeof read_only_attrs[0];
  for (size_t i = 0; i < n; i++) {
    const attr_info_t *a = &read_only_attrs[i];
    step("set read-only %s", a->name);
    if (a->is_u64) {
      uint64_t v = attr_u64(pool, a->attr);
      uint64_t w = v;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      w = v + 1;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      CHECK_EQ_U64(attr_u64(pool, a->attr), v);
    } else {
      int v = attr_int(pool, a->attr);
      int w = v;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      w = v + 1;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      CHECK_EQ_INT(attr_int(pool, a->attr), v);
    }
  }
  check_context(NULL);
}

static int is_power_of_two(uint64_t x) {
  return x && !(x & (x - 1));
}

/* Read-only attributes report the properties the pool was created with. */
static void check_props_read_back(tp_allocation_type_t type, tp_location_t loc,
                                  unsigned handles, size_t max_size) {
  tp_pool_props_t props = props_make(type, loc, handles, max_size);
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return;
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_ALLOCATION_TYPE), type);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_EXPORT_HANDLE_TYPES), handles);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_TYPE), loc.type);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_ID), loc.id);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCALITY_DOMAIN_ID), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_HW_DECOMPRESS_ENABLED), 0);
  if (max_size)
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), max_size);
  CHECK(is_power_of_two(chunk_of(pool)));
  CHECK_OK(tp_pool_destroy(pool));
}

static void test_statistics(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(64 * MiB);
  REQUIRE(s && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);

  step("a fresh pool holds nothing");
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 0);

  step("used counts the bytes asked for; reserved whole chunks");
  void *a = NULL, *b = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&a, 1000, pool, s));
  CHECK_EQ_U64(used_of(pool), 1000);
  uint64_t r = reserved_of(pool);
  CHECK(r >= 1000);
  CHECK_EQ_U64(r % chunk, 0);

  step("high watermarks track the peak");
  CHECK_OK(tp_malloc_from_pool_async(&b, 3 * MiB, pool, s));
  uint64_t peak_used = 1000 + 3 * MiB;
  CHECK_EQ_U64(used_of(pool), peak_used);
  uint64_t peak_reserved = reserved_of(pool);
  CHECK(peak_reserved >= peak_used);
  CHECK_EQ_U64(peak_reserved % chunk, 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(used_of(pool), 1000);
  r = reserved_of(pool);
  CHECK(r >= 1000 && r < peak_reserved);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);

  step("a nonzero write to a watermark is refused and changes nothing");
  uint64_t v = 5;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);
  v = peak_used;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);

  step("resetting a watermark to 0 sets it to the current value");
  set_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH, 0);
  set_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 1000);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), r);

  step("CHUNK_MAPS counts the chunks mapped as the pool grows");
  uint64_t maps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  uint64_t unmaps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  uint64_t r0 = reserved_of(pool);
  CHECK_OK(tp_malloc_from_pool_async(&b, 6 * MiB, pool, s));
  uint64_t maps1 = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  uint64_t r1 = reserved_of(pool);
  CHECK(maps1 > maps0);
  CHECK(r1 > r0);
  CHECK((maps1 - maps0) * chunk >= r1 - r0);
  step("CHUNK_UNMAPS counts the chunks released");
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  uint64_t unmaps1 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  CHECK(unmaps1 > unmaps0);
  CHECK((unmaps1 - unmaps0) * chunk >= r1);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 6 * MiB + 1000);

  step("defaults of the read-write attributes");
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               1);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 1);

  step("the read-write attributes keep what is written");
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 0);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 1);
  set_policies(pool, 0, 1, 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               0);
  set_policies(pool, 1, 0, 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               1);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, (uint64_t)1 << 40);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD),
               (uint64_t)1 << 40);

  check_read_only_attrs(pool);

  step("read-only attributes match the props: device pool");
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_ALLOCATION_TYPE),
               TP_ALLOCATION_PINNED);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_EXPORT_HANDLE_TYPES), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_DEVICE);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_ID), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), 64 * MiB);
  step("read-only attributes match the props: other pools");
  check_props_read_back(TP_ALLOCATION_PINNED, loc_device(0), 0, 32 * MiB);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD,
                        0);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_host(), 0, 16 * MiB);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_numa(0), 0, 0);
  check_props_read_back(TP_ALLOCATION_MANAGED, loc_device(0), 0, 0);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

/* ========================================================================
 * 7. Destroy
 * ======================================================================== */

static void test_destroy(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  tp_location_t dev0 = loc_device(0);

  step("destroy with a live allocation succeeds");
  void *p = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p, MiB, pool, s));
  CHECK_OK(tp_memset_async(p, 0x11, MiB, s));
  CHECK_OK(tp_pool_destroy(pool));

  /* The pool object stays alive behind its live allocation, so its handle
   * cannot have been recycled for another pool yet. */
  step("a destroyed handle is refused");
  uint64_t v = 0;
  void *q = NULL;
  CHECK_ERR(tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(&q, 64, pool, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_destroy(pool), TP_ERROR_INVALID_VALUE);
  v = 0;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_trim_to(pool, 0), TP_ERROR_INVALID_VALUE);
  tp_access_flags_t flags;
  CHECK_ERR(tp_pool_get_access(&flags, pool, &dev0), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t desc = {dev0, TP_ACCESS_READ_WRITE};
  CHECK_ERR(tp_pool_set_access(pool, &desc, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(0, pool), TP_ERROR_INVALID_VALUE);

  step("the live allocation stays usable until freed");
  CHECK_OK(tp_memset_async(p, 0x22, MiB, s));
  unsigned char *host = malloc(MiB);
  REQUIRE(host != NULL);
  read_back(host, p, MiB, s);
  CHECK(all_bytes(host, MiB, 0x22));
  free(host);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));

  step("a destroyed current pool stops being current");
  tp_pool_t def = default_pool();
  tp_pool_t cur = device_pool(0);
  if (cur) {
    tp_pool_t got = NULL;
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, cur));
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, cur);
    CHECK_OK(tp_pool_destroy(cur));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, def);
    got = NULL;
    CHECK_OK(tp_device_get_mem_pool(&got, 0));
    CHECK_EQ_PTR(got, def);
    /* And allocation follows: tp_malloc_async now uses the default pool. */
    uint64_t before = used_of(def);
    CHECK_OK(tp_malloc_async(&p, 1000, s));
    CHECK_EQ_U64(used_of(def), before + 1000);
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
  }

  step("a destroyed current host pool stops being current");
  tp_location_t host_loc = loc_host();
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, host_loc, 0, 0);
  tp_pool_t hp = NULL, host_def = NULL, got = NULL;
  CHECK_OK(tp_mem_get_default_pool(&host_def, &host_loc, TP_ALLOCATION_PINNED));
  if (CHECK_OK(tp_pool_create(&hp, &props))) {
    CHECK_OK(tp_mem_set_pool(&host_loc, TP_ALLOCATION_PINNED, hp));
    CHECK_OK(tp_pool_destroy(hp));
    CHECK_OK(tp_mem_get_pool(&got, &host_loc, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, host_def);
  }
  check_context(NULL);
  stream_done(s);
}

/* ========================================================================
 * 8. Access
 * ======================================================================== */

static tp_access_flags_t access_of(tp_pool_t pool, int device) {
  tp_location_t loc = loc_device(device);
  tp_access_flags_t flags = (tp_access_flags_t)77;
  CHECK_OK(tp_pool_get_access(&flags, pool, &loc));
  return flags;
}

/* Work of device 1 on device 0's pool memory. Only on host is it safe to
 * let an access fault: the manual promises TP_ERROR_ILLEGAL_ADDRESS at the
 * next synchronize there, while on cuda a fault spoils the context. */
static void access_from_device1(tp_pool_t pool) {
  tp_stream_t s0 = stream_new(TP_STREAM_NON_BLOCKING);
  CHECK_OK(tp_set_device(1));
  tp_stream_t s1 = stream_new(TP_STREAM_NON_BLOCKING);
  CHECK_OK(tp_set_device(0));
  if (!s0 || !s1) {
    stream_done(s0);
    stream_done(s1);
    return;
  }
  void *before = NULL, *after = NULL;
  unsigned char buf[256];
  tp_access_desc_t d1 = {loc_device(1), TP_ACCESS_READ_WRITE};
  CHECK_OK(tp_malloc_from_pool_async(&before, 4 * MiB, pool, s0));
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_pool_set_access(pool, &d1, 1));
  CHECK_OK(tp_malloc_from_pool_async(&after, 8 * MiB, pool, s0));
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_memset_async(before, 0x31, 4 * MiB, s1));
  CHECK_OK(tp_memset_async(after, 0x32, 8 * MiB, s1));
  CHECK_OK(tp_memcpy_async(buf, (char *)after + 8 * MiB - sizeof buf,
                           sizeof buf, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  CHECK(all_bytes(buf, sizeof buf, 0x32));
  if (check_on_host()) {
    d1.flags = TP_ACCESS_READ;
    CHECK_OK(tp_pool_set_access(pool, &d1, 1));
    CHECK_OK(tp_memcpy_async(buf, before, sizeof buf, s1));
    CHECK_OK(tp_stream_synchronize(s1));
    CHECK(all_bytes(buf, sizeof buf, 0x31));
    CHECK_OK(tp_memset_async(before, 0, sizeof buf, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    d1.flags = TP_ACCESS_NONE;
    CHECK_OK(tp_pool_set_access(pool, &d1, 1));
    CHECK_OK(tp_memcpy_async(buf, after, sizeof buf, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    /* The fault is reported once, at the next synchronize. */
    CHECK_OK(tp_stream_synchronize(s1));
  }
  d1.flags = TP_ACCESS_NONE;
  CHECK_OK(tp_pool_set_access(pool, &d1, 1));
  CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);
  CHECK_OK(tp_free_async(before, s0));
  CHECK_OK(tp_free_async(after, s0));
  stream_done(s0);
  stream_done(s1);
}

static void test_access(void) {
  tp_pool_t pool = device_pool(0);
  REQUIRE(pool != NULL);
  int count = 0;
  CHECK_OK(tp_get_device_count(&count));
  int bad = unknown_device();
  tp_location_t dev0 = loc_device(0), unknown = loc_device(bad),
                minus = loc_device(-1);

  step("the own device is read-write and cannot be lowered");
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
  tp_access_desc_t d0 = {dev0, TP_ACCESS_READ_WRITE};
  CHECK_OK(tp_pool_set_access(pool, &d0, 1));
  d0.flags = TP_ACCESS_READ;
  CHECK_ERR(tp_pool_set_access(pool, &d0, 1), TP_ERROR_INVALID_DEVICE);
  d0.flags = TP_ACCESS_NONE;
  CHECK_ERR(tp_pool_set_access(pool, &d0, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);

  step("unknown devices");
  tp_access_flags_t flags;
  CHECK_ERR(tp_pool_get_access(&flags, pool, &unknown),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_pool_get_access(&flags, pool, &minus), TP_ERROR_INVALID_DEVICE);
  tp_access_desc_t du = {unknown, TP_ACCESS_READ_WRITE};
  CHECK_ERR(tp_pool_set_access(pool, &du, 1), TP_ERROR_INVALID_DEVICE);
  du.location = minus;
  CHECK_ERR(tp_pool_set_access(pool, &du, 1), TP_ERROR_INVALID_DEVICE);

  step("bad lists and flags");
  CHECK_OK(tp_pool_set_access(pool, NULL, 0));
  CHECK_ERR(tp_pool_set_access(pool, NULL, 1), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t df = {dev0, (tp_access_flags_t)2};
  CHECK_ERR(tp_pool_set_access(pool, &df, 1), TP_ERROR_INVALID_VALUE);

  if (count < 2) {
    printf("   multi-device access: skipped (1 device)\n");
  } else {
    step("device 1: grant, read, revoke");
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);
    tp_access_desc_t d1 = {loc_device(1), TP_ACCESS_READ_WRITE};
    CHECK_OK(tp_pool_set_access(pool, &d1, 1));
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_READ_WRITE);
    d1.flags = TP_ACCESS_READ;
    CHECK_OK(tp_pool_set_access(pool, &d1, 1));
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_READ);
    d1.flags = TP_ACCESS_NONE;
    CHECK_OK(tp_pool_set_access(pool, &d1, 1));
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);

    step("device 1: a list with one bad entry applies none of it");
    tp_access_desc_t list[2] = {{loc_device(1), TP_ACCESS_READ_WRITE},
                                {unknown, TP_ACCESS_READ_WRITE}};
    CHECK_ERR(tp_pool_set_access(pool, list, 2), TP_ERROR_INVALID_DEVICE);
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);
    list[1].location = dev0;
    list[1].flags = TP_ACCESS_NONE;
    CHECK_ERR(tp_pool_set_access(pool, list, 2), TP_ERROR_INVALID_DEVICE);
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);

    step("device 1: a grant covers memory mapped before and after it");
    access_from_device1(pool);
  }
  step("the own device is still read-write");
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
}

/* ========================================================================
 * 9. Default and current pools
 * ======================================================================== */

/* Gets the default pool twice and checks that it is one stable handle. */
static tp_pool_t stable_default(tp_location_t loc, tp_allocation_type_t type) {
  tp_pool_t a = NULL, b = NULL;
  CHECK_OK(tp_mem_get_default_pool(&a, &loc, type));
  CHECK_OK(tp_mem_get_default_pool(&b, &loc, type));
  CHECK(a != NULL);
  CHECK_EQ_PTR(a, b);
  /* Until something is made current, the current pool is the default. */
  tp_pool_t cur = NULL;
  CHECK_OK(tp_mem_get_pool(&cur, &loc, type));
  CHECK_EQ_PTR(cur, a);
  return a;
}

static void test_default_and_current_pools(void) {
  tp_location_t dev0 = loc_device(0), host = loc_host(), numa0 = loc_numa(0),
                none = loc_none();
  int count = 0;
  CHECK_OK(tp_get_device_count(&count));
  REQUIRE(count >= 1);

  step("default pools exist and are stable");
  tp_pool_t dpin = stable_default(dev0, TP_ALLOCATION_PINNED);
  tp_pool_t dhost = stable_default(host, TP_ALLOCATION_PINNED);
  tp_pool_t dnuma = stable_default(numa0, TP_ALLOCATION_PINNED);
  tp_pool_t dman = stable_default(dev0, TP_ALLOCATION_MANAGED);
  tp_pool_t dnone = stable_default(none, TP_ALLOCATION_MANAGED);
  /* The managed defaults are checked where they exist, but the rest of
   * the test needs only the pinned ones. */
  REQUIRE(dpin && dhost && dnuma);
  tp_pool_t viadev = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&viadev, 0));
  CHECK_EQ_PTR(viadev, dpin);
  CHECK(dpin != dhost);
  CHECK(dpin != dman);

  step("default pools describe their location and type");
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_DEVICE);
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_LOCATION_ID), 0);
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_ALLOCATION_TYPE),
               TP_ALLOCATION_PINNED);
  CHECK_EQ_INT(attr_int(dhost, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_HOST);
  CHECK_EQ_INT(attr_int(dnuma, TP_POOL_ATTR_LOCATION_TYPE),
               TP_LOCATION_HOST_NUMA);
  CHECK_EQ_INT(attr_int(dnuma, TP_POOL_ATTR_LOCATION_ID), 0);
  if (dman)
    CHECK_EQ_INT(attr_int(dman, TP_POOL_ATTR_ALLOCATION_TYPE),
                 TP_ALLOCATION_MANAGED);
  if (dnone)
    CHECK_EQ_INT(attr_int(dnone, TP_POOL_ATTR_ALLOCATION_TYPE),
                 TP_ALLOCATION_MANAGED);

  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  tp_pool_t mine = device_pool(0);
  REQUIRE(s && mine);
  step("tp_mem_set_pool makes tp_malloc_async use the pool");
  tp_pool_t got = NULL;
  CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, mine));
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, mine);
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, mine);
  uint64_t def_used = used_of(dpin);
  void *p = NULL, *q = NULL;
  CHECK_OK(tp_malloc_async(&p, 1000, s));
  CHECK_OK(tp_malloc_async(&q, 3000, NULL));
  CHECK_EQ_U64(used_of(mine), 4000);
  CHECK_EQ_U64(used_of(dpin), def_used);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_free_async(q, NULL));
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(used_of(mine), 0);

  step("tp_device_set_mem_pool / tp_device_get_mem_pool");
  CHECK_OK(tp_device_set_mem_pool(0, dpin));
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, dpin);
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, dpin);
  CHECK_OK(tp_device_set_mem_pool(0, mine));
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, mine);
  CHECK_OK(tp_malloc_async(&p, 2000, s));
  CHECK_EQ_U64(used_of(mine), 2000);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, dpin));
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, dpin);

  step("current pools are per location and type");
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, host, 0, 0);
  tp_pool_t hp = NULL;
  if (CHECK_OK(tp_pool_create(&hp, &props))) {
    CHECK_OK(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, hp));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &host, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, hp);
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, dpin);
    CHECK_ERR(tp_device_set_mem_pool(0, hp), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, dhost));
    CHECK_OK(tp_pool_destroy(hp));
  }
  props = props_make(TP_ALLOCATION_MANAGED, dev0, 0, 0);
  tp_pool_t mp = NULL;
  if (CHECK_OK(tp_pool_create(&mp, &props))) {
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_MANAGED, mp));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_MANAGED));
    CHECK_EQ_PTR(got, mp);
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, dpin);
    CHECK_ERR(tp_device_set_mem_pool(0, mp), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_MANAGED, dman));
    CHECK_OK(tp_pool_destroy(mp));
  }

  step("invalid device ids");
  tp_location_t bad = loc_device(count), neg = loc_device(-1);
  got = NULL;
  CHECK_ERR(tp_device_get_default_mem_pool(&got, -1), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_default_mem_pool(&got, count),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_mem_pool(&got, count), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_mem_pool(&got, -1), TP_ERROR_INVALID_DEVICE);
  /* The device is checked before the pool is compared with it, as the
   * driver's cudaDeviceSetMemPool does. */
  CHECK_ERR(tp_device_set_mem_pool(count, mine), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_set_mem_pool(-1, mine), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &bad, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_get_pool(&got, &neg, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_attribute(&count,
                                    TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, -1),
            TP_ERROR_INVALID_DEVICE);

  step("NULL pointers");
  CHECK_ERR(tp_device_get_default_mem_pool(NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_mem_pool(NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(0, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(NULL, &dev0, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, NULL, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(NULL, &dev0, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, NULL, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(NULL, TP_ALLOCATION_PINNED, dpin),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, NULL),
            TP_ERROR_INVALID_VALUE);
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, dpin);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(mine));
  stream_done(s);
}

/* ========================================================================
 * 10. Out of memory
 * ======================================================================== */

/* A pool filled by one block X, freed on `a` behind 200 ms of work; `b`
 * then asks for the same size, which only a host-side wait can give. */
static void oom_wait_recovers(int follow, int opportunistic, int internal,
                              tp_stream_t a, tp_stream_t b) {
  const size_t cap = 16 * MiB;
  tp_pool_t pool = device_pool(cap);
  if (!pool)
    return;
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set_policies(pool, follow, opportunistic, internal);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 1);
  void *x = NULL, *y = NULL;
  if (CHECK_OK(tp_malloc_from_pool_async(&x, cap, pool, a))) {
    CHECK_OK(tp_stream_synchronize(a));
    CHECK_OK(tp_launch_host_func(a, sleep_fn, (void *)(intptr_t)200));
    CHECK_OK(tp_free_async(x, a));
    if (CHECK_OK(tp_malloc_from_pool_async(&y, cap, pool, b))) {
      CHECK_EQ_PTR(y, x);
      /* Neither policy lets b take a pending block, so the free must have
       * completed before the allocation returned. */
      CHECK_OK(tp_stream_query(a));
      CHECK_OK(tp_free_async(y, b));
    }
  }
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_destroy(pool));
}

static void test_out_of_memory(void) {
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(a && b);
  gate_t g;

  step("max_size 64 MiB: beyond fails and the pool stays usable");
  tp_pool_t pool = device_pool(64 * MiB);
  if (pool) {
    void *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&x, 48 * MiB, pool, a));
    CHECK_ERR(tp_malloc_from_pool_async(&z, 32 * MiB, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&z, 64 * MiB + 1, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&z, SIZE_MAX, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_OK(tp_malloc_from_pool_async(&y, 16 * MiB, pool, a));
    /* 64 MiB are in use, so not even a small block fits. */
    CHECK_ERR(tp_malloc_from_pool_async(&z, 1000, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK(reserved_of(pool) <= 64 * MiB);
    CHECK(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH) <= 64 * MiB);
    CHECK_OK(tp_free_async(x, a));
    CHECK_OK(tp_free_async(y, a));
    CHECK_OK(tp_stream_synchronize(a));
    CHECK_OK(tp_malloc_from_pool_async(&x, 64 * MiB, pool, a));
    CHECK_OK(tp_memset_async(x, 0, 64 * MiB, a));
    CHECK_OK(tp_free_async(x, a));
    CHECK_OK(tp_stream_synchronize(a));
    CHECK_EQ_U64(reserved_of(pool), 0);
    CHECK_OK(tp_pool_destroy(pool));
  }

  step("OOM_WAIT=0: a pending free on a held stream fails fast");
  pool = device_pool(16 * MiB);
  if (pool) {
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
    set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
    set_policies(pool, 0, 0, 0);
    void *x = NULL, *y = NULL;
    if (CHECK_OK(tp_malloc_from_pool_async(&x, 16 * MiB, pool, a)) &&
        CHECK_OK(hold_stream(a, &g))) {
      CHECK_OK(tp_free_async(x, a));
      double t0 = check_now_s();
      CHECK_ERR(tp_malloc_from_pool_async(&y, 16 * MiB, pool, b),
                TP_ERROR_OUT_OF_MEMORY);
      /* A wait would last until the gate's own timeout. */
      CHECK(check_now_s() - t0 < 5.0);
      release(&g);
      CHECK_OK(tp_stream_synchronize(a));
      step("OOM_WAIT=0: the pool is usable once the free is synchronized");
      if (CHECK_OK(tp_malloc_from_pool_async(&y, 16 * MiB, pool, b))) {
        CHECK_EQ_PTR(y, x);
        CHECK_OK(tp_free_async(y, b));
      }
    }
    CHECK_OK(tp_device_synchronize());
    CHECK_OK(tp_pool_destroy(pool));
  }

  /* With internal dependencies the pool would take the pending block
   * without waiting, so the policies that leave only the host wait are
   * tested: opportunistic alone, and none (the wait is a host-side
   * synchronization, after which a free is reusable by every stream). */
  step("OOM_WAIT=1: a full pool recovers by waiting (opportunistic only)");
  oom_wait_recovers(0, 1, 0, a, b);
  step("OOM_WAIT=1: a full pool recovers by waiting (no policies)");
  oom_wait_recovers(0, 0, 0, a, b);
  check_context(NULL);
  stream_done(a);
  stream_done(b);
}

/* ========================================================================
 * 11. The stream runtime
 * ======================================================================== */

typedef struct observer {
  atomic_int *watched;
  atomic_int seen; /* the watched flag's value when the observer ran */
  atomic_int ran;
} observer_t;

static void observe_fn(void *arg) {
  observer_t *o = arg;
  atomic_store(&o->seen, atomic_load(o->watched));
  atomic_store(&o->ran, 1);
}

static void test_stream_runtime_order(void) {
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  REQUIRE(a && b && ev);
  gate_t g;

  step("queries answer NOT_READY while a stream is held");
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_ERR(tp_stream_query(a), TP_ERROR_NOT_READY);
  CHECK_OK(tp_event_record(ev, a));
  CHECK_ERR(tp_event_query(ev), TP_ERROR_NOT_READY);
  CHECK_OK(tp_stream_query(b));
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_OK(tp_stream_query(a));
  CHECK_OK(tp_event_query(ev));
  CHECK_OK(tp_event_synchronize(ev));

  step("an event never recorded has completed");
  tp_event_t fresh = event_new();
  if (fresh) {
    CHECK_OK(tp_event_query(fresh));
    CHECK_OK(tp_event_synchronize(fresh));
    CHECK_OK(tp_stream_wait_event(b, fresh, 0));
    CHECK_OK(tp_stream_synchronize(b));
    CHECK_OK(tp_event_destroy(fresh));
  }

  step("tp_stream_wait_event orders b after a's recorded work");
  atomic_int done_a = 0, done_b = 0;
  observer_t obs = {&done_a, 0, 0};
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_launch_host_func(a, raise_flag_fn, &done_a));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_wait_event(b, ev, 0));
  CHECK_OK(tp_launch_host_func(b, observe_fn, &obs));
  CHECK_OK(tp_launch_host_func(b, raise_flag_fn, &done_b));
  check_sleep_ms(50);
  CHECK_EQ_INT(atomic_load(&obs.ran), 0);
  CHECK_EQ_INT(atomic_load(&done_b), 0);
  CHECK_ERR(tp_stream_query(b), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_INT(atomic_load(&obs.ran), 1);
  CHECK_EQ_INT(atomic_load(&obs.seen), 1);
  CHECK_EQ_INT(atomic_load(&done_b), 1);

  step("work recorded later does not hold an earlier wait");
  atomic_int late = 0;
  void *buf = NULL;
  REQUIRE_OK(tp_malloc_async(&buf, 4096, b));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_wait_event(b, ev, 0));
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_launch_host_func(a, raise_flag_fn, &late));
  /* Device work, not a host function: on cuda the host functions of all
   * streams share one thread, which the held stream's gate occupies. */
  CHECK_OK(tp_memset_async(buf, 0x7E, 4096, b));
  CHECK_OK(check_poll_stream(b, 5000));
  CHECK_EQ_INT(atomic_load(&late), 0);
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_EQ_INT(atomic_load(&late), 1);
  CHECK_OK(tp_free_async(buf, b));
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(a);
  stream_done(b);
}

static void test_stream_runtime_memory(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(s != NULL);
  const size_t n = 64 * KiB;
  unsigned char *src = malloc(n), *dst = malloc(n);
  void *p = NULL, *q = NULL;
  if (!CHECK(src && dst) || !CHECK_OK(tp_malloc_async(&p, n, s)) ||
      !CHECK_OK(tp_malloc_async(&q, n, s))) {
    free(src);
    free(dst);
    stream_done(s);
    return;
  }

  step("memset, then copy back to the host");
  CHECK_OK(tp_memset_async(p, 0xA5, n, s));
  memset(dst, 0, n);
  read_back(dst, p, n, s);
  CHECK(all_bytes(dst, n, 0xA5));

  step("host to pool, pool to pool, pool to host");
  for (size_t i = 0; i < n; i++)
    src[i] = (unsigned char)(i * 7 + 3);
  CHECK_OK(tp_memcpy_async(p, src, n, s));
  CHECK_OK(tp_memcpy_async(q, p, n, s));
  memset(dst, 0, n);
  read_back(dst, q, n, s);
  CHECK(memcmp(dst, src, n) == 0);

  step("a partial memset touches only its range");
  CHECK_OK(tp_memset_async((char *)q + 100, 0, 200, s));
  read_back(dst, q, n, s);
  CHECK(all_bytes(dst + 100, 200, 0));
  CHECK(memcmp(dst, src, 100) == 0);
  CHECK(memcmp(dst + 300, src + 300, n - 300) == 0);

  step("the legacy default stream carries memory work too");
  CHECK_OK(tp_memset_async(p, 0x3C, n, NULL));
  CHECK_OK(tp_memcpy_async(dst, p, n, NULL));
  CHECK_OK(tp_stream_synchronize(NULL));
  CHECK(all_bytes(dst, n, 0x3C));

  step("size 0 with NULL pointers does nothing");
  CHECK_OK(tp_memset_async(NULL, 0, 0, s));
  CHECK_OK(tp_memcpy_async(NULL, NULL, 0, s));
  check_context(NULL);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_free_async(q, s));
  free(src);
  free(dst);
  stream_done(s);
}

typedef struct device_probe {
  int count;
  int initial;    /* the new thread's device before it sets one */
  int after;      /* after tp_set_device(count - 1) */
  tp_error_t err; /* of that tp_set_device */
} device_probe_t;

static void *device_thread(void *arg) {
  device_probe_t *d = arg;
  d->initial = -1;
  tp_get_device(&d->initial);
  d->err = tp_set_device(d->count - 1);
  d->after = -1;
  tp_get_device(&d->after);
  return NULL;
}

static void test_stream_runtime_bad_arguments(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  REQUIRE(s && ev);
  unsigned char buf[64];
  tp_stream_t t = NULL;

  step("stream and event creation");
  CHECK_ERR(tp_stream_create(NULL, TP_STREAM_DEFAULT), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_create(&t, 2), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_create(&t, 0x80000001u), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_create(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_destroy(NULL), TP_ERROR_INVALID_VALUE);

  step("events");
  CHECK_ERR(tp_stream_wait_event(s, ev, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_wait_event(s, NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_record(NULL, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_query(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_synchronize(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_destroy(NULL), TP_ERROR_INVALID_VALUE);

  step("host functions and memory work");
  CHECK_ERR(tp_launch_host_func(s, NULL, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memset_async(NULL, 0, 16, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(NULL, buf, 16, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(buf, NULL, 16, s), TP_ERROR_INVALID_VALUE);

  step("devices");
  int count = -1, dev = -1;
  CHECK_ERR(tp_get_device_count(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_get_device(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_get_device_count(&count));
  CHECK(count >= 1);
  CHECK_ERR(tp_set_device(-1), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_set_device(count), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(tp_get_device(&dev));
  CHECK_EQ_INT(dev, 0);
  CHECK_OK(tp_set_device(0));

  step("the current device is per thread");
  device_probe_t probe = {count, -1, -1, TP_ERROR_PLATFORM};
  pthread_t th;
  if (CHECK_EQ_INT(pthread_create(&th, NULL, device_thread, &probe), 0)) {
    pthread_join(th, NULL);
    CHECK_EQ_INT(probe.initial, 0);
    CHECK_OK(probe.err);
    CHECK_EQ_INT(probe.after, count - 1);
    dev = -1;
    CHECK_OK(tp_get_device(&dev));
    CHECK_EQ_INT(dev, 0);
  }
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(s);
}

static void test_error_names(void) {
  static const struct {
    tp_error_t code;
    const char *name;
    const char *text;
  } codes[] = {
#define TP_ERROR_ROW_(name, value, text) {name, #name, text},
      TP_ERROR_LIST(TP_ERROR_ROW_)
#undef TP_ERROR_ROW_
  };
  size_t n = sizeof codes / sizeof codes[0];
  CHECK_EQ_U64(n, 20);
  for (size_t i = 0; i < n; i++) {
    const char *name = tp_error_name(codes[i].code);
    const char *text = tp_error_string(codes[i].code);
    check_context(codes[i].name);
    if (CHECK(name != NULL))
      CHECK(strcmp(name, codes[i].name) == 0);
    if (CHECK(text != NULL))
      CHECK(strcmp(text, codes[i].text) == 0);
  }
  check_context("unknown error values");
  const tp_error_t unknown[] = {(tp_error_t)10, (tp_error_t)12345,
                                (tp_error_t)-1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *name = tp_error_name(unknown[i]);
    const char *text = tp_error_string(unknown[i]);
    if (CHECK(name != NULL))
      CHECK(strcmp(name, "TP_ERROR_UNKNOWN") == 0);
    if (CHECK(text != NULL))
      CHECK(text[0] != '\0');
  }
  check_context("platform");
  const char *platform = tp_platform_name();
  CHECK(platform &&
        (strcmp(platform, "host") == 0 || strcmp(platform, "cuda") == 0));
  int code = 0;
  const char *pname = NULL;
  CHECK_OK(tp_get_last_platform_error(NULL, NULL));
  CHECK_OK(tp_get_last_platform_error(&code, &pname));
  check_context(NULL);
}

/* ========================================================================
 * 12. Bad input for every allocator entry point
 * ======================================================================== */

static void bad_input_allocation(tp_stream_t s, tp_pool_t pool) {
  void *p = NULL;
  step("allocation: NULL out pointers");
  CHECK_ERR(tp_malloc_async(NULL, 1000, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(NULL, 1000, pool, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(NULL, 0, pool, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_async(NULL, 0, s), TP_ERROR_INVALID_VALUE);
  step("allocation: no pool");
  CHECK_ERR(tp_malloc_from_pool_async(&p, 1000, NULL, s),
            TP_ERROR_INVALID_VALUE);

  step("allocation: sizes whose rounding overflows");
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 511,
                          SIZE_MAX / 2 + 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    p = (void *)&p;
    CHECK_ERR(tp_malloc_async(&p, sizes[i], s), TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&p, sizes[i], pool, s),
              TP_ERROR_OUT_OF_MEMORY);
  }
  step("allocation: size 0 from a pool");
  p = (void *)&p;
  CHECK_OK(tp_malloc_from_pool_async(&p, 0, pool, s));
  CHECK_EQ_PTR(p, NULL);
  /* After all those refusals, the pool still works and holds nothing. */
  CHECK_EQ_U64(used_of(pool), 0);
  if (CHECK_OK(tp_malloc_from_pool_async(&p, 1000, pool, s)))
    CHECK_OK(tp_free_async(p, s));
}

static void bad_input_free(tp_stream_t s, tp_pool_t pool) {
  step("free: pointers no pool gave out");
  int local = 0;
  static int global_var;
  CHECK_ERR(tp_free_async(&local, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async(&global_var, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((void *)(uintptr_t)0x1000, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((void *)(uintptr_t)UINTPTR_MAX, s),
            TP_ERROR_INVALID_VALUE);

  step("free: a block freed and synchronized, freed again");
  void *p = NULL;
  if (CHECK_OK(tp_malloc_from_pool_async(&p, 3 * MiB, pool, s))) {
    CHECK_ERR(tp_free_async((char *)p + MiB, s), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_ERR(tp_free_async(p, s), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_free_async((char *)p + 512, s), TP_ERROR_INVALID_VALUE);
  }
  /* A rejected free changes nothing: the pool's count is intact. */
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(used_of(pool), 0);
}

static void bad_input_pool_create(void) {
  tp_pool_t pool = NULL;
  tp_pool_props_t props;
  step("create: NULL out pointer");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(NULL, &props), TP_ERROR_INVALID_VALUE);
  step("create: a zeroed struct has an invalid location");
  memset(&props, 0, sizeof props);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: unknown allocation types");
  props = props_make(TP_ALLOCATION_INVALID, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  props = props_make((tp_allocation_type_t)77, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: unknown location type 99");
  tp_location_t loc99 = {(tp_location_type_t)99, 0, 0};
  props = props_make(TP_ALLOCATION_PINNED, loc99, 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: pinned with no location");
  props = props_make(TP_ALLOCATION_PINNED, loc_none(), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: device -1");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(-1), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: usage != 0");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  props.usage = 1;
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  check_context(NULL);
}

static void bad_input_attributes(tp_pool_t pool) {
  uint64_t v = 0;
  step("attributes: no pool");
  CHECK_ERR(tp_pool_get_attribute(NULL, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(NULL, TP_POOL_ATTR_RELEASE_THRESHOLD, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_destroy(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_trim_to(NULL, 0), TP_ERROR_INVALID_VALUE);
  step("attributes: unknown attributes");
  const int unknown[] = {0, 16, 99, 104, 999, -1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    v = 0;
    CHECK_ERR(tp_pool_get_attribute(pool, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_set_attribute(pool, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
  }
  step("attributes: NULL values");
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_OOM_WAIT, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_attribute(pool, TP_POOL_ATTR_CHUNK_SIZE, NULL),
            TP_ERROR_INVALID_VALUE);
}

static void bad_input_access(tp_pool_t pool) {
  tp_location_t dev0 = loc_device(0);
  tp_access_flags_t flags;
  tp_access_desc_t desc = {dev0, TP_ACCESS_READ_WRITE};
  step("access: NULL arguments");
  CHECK_ERR(tp_pool_get_access(NULL, pool, &dev0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&flags, NULL, &dev0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&flags, pool, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_access(NULL, &desc, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_access(pool, NULL, 2), TP_ERROR_INVALID_VALUE);
  step("access: unknown flags");
  desc.flags = (tp_access_flags_t)4;
  CHECK_ERR(tp_pool_set_access(pool, &desc, 1), TP_ERROR_INVALID_VALUE);
}

static void bad_input_default_pools(tp_pool_t pool) {
  tp_location_t dev0 = loc_device(0);
  tp_location_t loc99 = {(tp_location_type_t)99, 0, 0};
  tp_pool_t got = NULL;
  step("current pools: unknown location type 99");
  CHECK_ERR(tp_mem_get_default_pool(&got, &loc99, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, &loc99, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&loc99, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
  step("current pools: unknown allocation types");
  CHECK_ERR(tp_mem_get_default_pool(&got, &dev0, (tp_allocation_type_t)77),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &dev0, TP_ALLOCATION_INVALID),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, &dev0, (tp_allocation_type_t)77),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, (tp_allocation_type_t)77, pool),
            TP_ERROR_INVALID_VALUE);
  step("current pools: host NUMA current has no pool");
  tp_location_t cur = {TP_LOCATION_HOST_NUMA_CURRENT, 0, 0};
  CHECK_ERR(tp_mem_set_pool(&cur, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
}

static void bad_input_device_attributes(void) {
  int count = 0, v = -1;
  CHECK_OK(tp_get_device_count(&count));
  step("device attributes: bad arguments");
  CHECK_ERR(
      tp_device_get_attribute(NULL, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_attribute(&v, (tp_device_attr_t)999, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_attribute(&v, (tp_device_attr_t)0, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, count),
      TP_ERROR_INVALID_DEVICE);
  step("device attributes: values");
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 0));
  CHECK_EQ_INT(v, 1);
  v = -1;
  CHECK_OK(tp_device_get_attribute(
      &v, TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0));
  CHECK(v >= 0 && (v & ~(TP_HANDLE_POSIX_FD | TP_HANDLE_FABRIC)) == 0);
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT, 0));
  CHECK(v >= 0);
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS, 0));
  CHECK(v == 0 || v == 1);
}

static void bad_input_ipc(tp_stream_t s, tp_pool_t plain) {
  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD, 0);
  tp_pool_t ipc = NULL, imported = NULL;
  step("ipc: create an exportable pool");
  if (!CHECK_OK(tp_pool_create(&ipc, &props)))
    return;
  int fd = -1, local = 0;
  void *p = NULL, *q = NULL;
  tp_pool_ptr_export_data_t data;
  memset(&data, 0, sizeof data);

  step("ipc: export with bad arguments");
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(NULL, ipc, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(&fd, NULL, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_FABRIC, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_NONE, 0),
            TP_ERROR_INVALID_VALUE);

  step("ipc: export pointer with bad arguments");
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, ipc, s));
  CHECK_ERR(tp_pool_export_pointer(NULL, p), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, &local), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, (char *)p + 512),
            TP_ERROR_INVALID_VALUE);

  step("ipc: import with bad arguments");
  if (CHECK_OK(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_POSIX_FD,
                                                  0))) {
    CHECK_ERR(tp_pool_import_from_shareable_handle(NULL, (void *)(uintptr_t)fd,
                                                   TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
    /* The descriptor comes by value: a pointer to it is no descriptor. */
    CHECK_ERR(tp_pool_import_from_shareable_handle(&imported, &fd,
                                                   TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
    imported = NULL;
    CHECK_OK(tp_pool_import_from_shareable_handle(
        &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  }
  step("ipc: import pointer with bad arguments");
  CHECK_OK(tp_pool_export_pointer(&data, p));
  tp_pool_ptr_export_data_t forged;
  memset(&forged, 0, sizeof forged);
  if (imported) {
    CHECK_ERR(tp_pool_import_pointer(NULL, imported, &data),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_import_pointer(&q, imported, NULL),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_import_pointer(&q, imported, &forged),
              TP_ERROR_INVALID_VALUE);
  }
  CHECK_ERR(tp_pool_import_pointer(&q, NULL, &data), TP_ERROR_INVALID_VALUE);
  /* Only an imported pool maps another process's allocations. */
  CHECK_ERR(tp_pool_import_pointer(&q, plain, &data), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_pointer(&q, ipc, &data), TP_ERROR_INVALID_VALUE);

  check_context(NULL);
  if (imported)
    CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(ipc));
  if (fd >= 0)
    close(fd);
}

static void test_bad_input(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  bad_input_allocation(s, pool);
  bad_input_free(s, pool);
  bad_input_pool_create();
  bad_input_attributes(pool);
  bad_input_access(pool);
  bad_input_default_pools(pool);
  bad_input_device_attributes();
  bad_input_ipc(s, pool);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

/* ========================================================================
 * main
 * ======================================================================== */

int main(void) {
  const char *platform = tp_platform_name();
  printf("tidepool conformance on platform %s\n",
         platform ? platform : "(none)");
  REQUIRE_EXIT(platform != NULL);

  RUN_TEST(test_driver_alloc_free_rows);
  RUN_TEST(test_driver_attribute_rows);
  RUN_TEST(test_driver_pool_create_rows);
  RUN_TEST(test_driver_pool_statistics_rows);
  RUN_TEST(test_driver_current_pool_rows);
  RUN_TEST(test_driver_access_rows);
  RUN_TEST(test_driver_ipc_rows);
  RUN_TEST(test_reuse_policies_small);
  RUN_TEST(test_reuse_policies_large);
  RUN_TEST(test_legacy_stream_small);
  RUN_TEST(test_legacy_stream_large);
  RUN_TEST(test_release_threshold);
  RUN_TEST(test_trim_to);
  RUN_TEST(test_statistics);
  RUN_TEST(test_destroy);
  RUN_TEST(test_access);
  RUN_TEST(test_default_and_current_pools);
  RUN_TEST(test_out_of_memory);
  RUN_TEST(test_stream_runtime_order);
  RUN_TEST(test_stream_runtime_memory);
  RUN_TEST(test_stream_runtime_bad_arguments);
  RUN_TEST(test_error_names);
  RUN_TEST(test_bad_input);
  return check_done();
}
