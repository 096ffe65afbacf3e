/* test_promises: a black-box attack on the promises of include/tidepool.h
 * that the other suites leave open: the errors of each entry point for bad,
 * destroyed and foreign handles, watermarks and trim while frees are pending
 * on several streams, the lifetimes of streams and events, and races
 * between a thread that uses an object and one that changes or frees it.
 * Expectations come from the header (and CUDA where the header defers to
 * it), never from what tidepool happens to do. Seeded: TP_PROMISES_SEED or
 * the first argument; with a test's name as an argument, only that test. */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define DEFAULT_SEED UINT64_C(0x70726f6d69736573)

static uint64_t seed;
static int ndevices;

/* ========================================================================
 * Helpers
 * ======================================================================== */

static tp_location_t dev_loc(int id) {
  tp_location_t loc = {TP_LOCATION_DEVICE, id, 0};
  return loc;
}

static tp_pool_props_t props_of(tp_allocation_type_t type, tp_location_t loc,
                                unsigned handles, size_t max_size) {
  tp_pool_props_t p;
  memset(&p, 0, sizeof p); /* the header: zero what you do not set */
  p.alloc_type = type;
  p.location = loc;
  p.handle_types = handles;
  p.max_size = max_size;
  return p;
}

static tp_pool_t new_pool(int device, size_t max_size) {
  tp_pool_props_t props =
      props_of(TP_ALLOCATION_PINNED, dev_loc(device), 0, max_size);
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return NULL;
  return pool;
}

static uint64_t attr64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = UINT64_C(0xAAAAAAAAAAAAAAAA);
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static void set64(tp_pool_t pool, tp_pool_attr_t attr, uint64_t v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static void set_int(tp_pool_t pool, tp_pool_attr_t attr, int v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static uint64_t used_of(tp_pool_t pool) {
  return attr64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
}

static uint64_t reserved_of(tp_pool_t pool) {
  return attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
}

static uint64_t round_up(uint64_t x, uint64_t m) {
  return (x + m - 1) / m * m;
}

static tp_stream_t new_stream(void) {
  tp_stream_t s = NULL;
  CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  return s;
}

static void stream_done(tp_stream_t s) {
  if (!s)
    return;
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v)
      return 0;
  return 1;
}

/* ========================================================================
 * Pool creation and destruction
 * ======================================================================== */

/* tp_pool_create's list: unknown locations and handle bits are
 * INVALID_VALUE, TP_HANDLE_FABRIC (which no platform supports for pools)
 * NOT_SUPPORTED, a max_size of exactly one chunk is the smallest allowed. */
static void test_pool_create_rejects(void) {
  tp_pool_t pool = NULL;
  tp_pool_props_t props;

  check_context("NULL props and out pointer together");
  CHECK_ERR(tp_pool_create(NULL, NULL), TP_ERROR_INVALID_VALUE);
  check_context("NULL props");
  CHECK_ERR(tp_pool_create(&pool, NULL), TP_ERROR_INVALID_VALUE);

  check_context("location types the header does not accept");
  const int bad_types[] = {TP_LOCATION_HOST_NUMA_CURRENT,
                           TP_LOCATION_DEVICE_LOCALITY_DOMAIN,
                           TP_LOCATION_INVISIBLE, 7, -1};
  for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
    tp_location_t loc = {(tp_location_type_t)bad_types[i], 0, 0};
    props = props_of(TP_ALLOCATION_PINNED, loc, 0, 0);
    CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  }

  check_context("device ordinals that do not exist");
  const int bad_devs[] = {ndevices, ndevices + 1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad_devs / sizeof bad_devs[0]; i++) {
    props = props_of(TP_ALLOCATION_PINNED, dev_loc(bad_devs[i]), 0, 0);
    CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  }

  check_context("host NUMA nodes that do not exist");
  tp_location_t numa_neg = {TP_LOCATION_HOST_NUMA, -1, 0};
  props = props_of(TP_ALLOCATION_PINNED, numa_neg, 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  tp_location_t numa_far = {TP_LOCATION_HOST_NUMA, 4096, 0};
  props = props_of(TP_ALLOCATION_PINNED, numa_far, 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);

  /* Bits that tp_handle_type_t does not name (the driver's Win32 ones
   * among them): INVALID_VALUE, as docs/design.md records the driver. */
  check_context("unknown handle-type bits");
  const unsigned bad_bits[] = {2u, 4u, 16u, 0x80000000u,
                               TP_HANDLE_POSIX_FD | 2u};
  for (size_t i = 0; i < sizeof bad_bits / sizeof bad_bits[0]; i++) {
    props = props_of(TP_ALLOCATION_PINNED, dev_loc(0), bad_bits[i], 0);
    CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  }

  /* "NOT_SUPPORTED for handle types the platform lacks" (host), and on
   * cuda a fabric pool "where the device reports fabric handles", which
   * no platform exports yet. */
  check_context("TP_HANDLE_FABRIC on a device pool");
  props = props_of(TP_ALLOCATION_PINNED, dev_loc(0), TP_HANDLE_FABRIC, 0);
  pool = NULL;
  tp_error_t err = tp_pool_create(&pool, &props);
  if (check_on_host() || err != TP_SUCCESS)
    CHECK_ERR(err, TP_ERROR_NOT_SUPPORTED);
  if (err == TP_SUCCESS) {
    int fd = -1;
    CHECK_ERR(
        tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_FABRIC, 0),
        TP_ERROR_NOT_SUPPORTED);
    CHECK_OK(tp_pool_destroy(pool));
  }

  check_context("max_size: one chunk is the least");
  tp_pool_t probe = new_pool(0, 0);
  REQUIRE(probe != NULL);
  uint64_t chunk = attr64(probe, TP_POOL_ATTR_CHUNK_SIZE);
  CHECK_OK(tp_pool_destroy(probe));
  REQUIRE(chunk > 0);
  props = props_of(TP_ALLOCATION_PINNED, dev_loc(0), 0, chunk - 1);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  props = props_of(TP_ALLOCATION_PINNED, dev_loc(0), 0, chunk);
  pool = NULL;
  if (CHECK_OK(tp_pool_create(&pool, &props))) {
    void *p = NULL, *q = NULL;
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), chunk);
    if (CHECK_OK(tp_malloc_from_pool_async(&p, chunk, pool, NULL))) {
      set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
      CHECK_ERR(tp_malloc_from_pool_async(&q, 1, pool, NULL),
                TP_ERROR_OUT_OF_MEMORY);
      CHECK_OK(tp_free_async(p, NULL));
    }
    CHECK_OK(tp_stream_synchronize(NULL));
    CHECK_OK(tp_pool_destroy(pool));
  }
  check_context(NULL);
}

/* tp_pool_destroy refuses every default pool (INVALID_VALUE, "a default
 * pool"), and the refused pool goes on working. */
static void test_default_pools_refuse_destroy(void) {
  struct {
    tp_location_t loc;
    tp_allocation_type_t type;
    const char *name;
  } defs[] = {
      {{TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_PINNED, "device 0 pinned"},
      {{TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_MANAGED, "device 0 managed"},
      {{TP_LOCATION_HOST, 0, 0}, TP_ALLOCATION_PINNED, "host"},
      {{TP_LOCATION_HOST_NUMA, 0, 0}, TP_ALLOCATION_PINNED, "host NUMA 0"},
      {{TP_LOCATION_NONE, 0, 0}, TP_ALLOCATION_MANAGED, "managed, none"},
      {{TP_LOCATION_DEVICE, 1, 0}, TP_ALLOCATION_PINNED, "device 1 pinned"},
  };
  tp_stream_t s = new_stream();
  REQUIRE(s != NULL);
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
    if (defs[i].loc.type == TP_LOCATION_DEVICE && defs[i].loc.id >= ndevices)
      continue;
    check_context(defs[i].name);
    tp_pool_t def = NULL, again = NULL, cur = NULL;
    if (!CHECK_OK(tp_mem_get_default_pool(&def, &defs[i].loc, defs[i].type)))
      continue;
    CHECK_ERR(tp_pool_destroy(def), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_mem_get_default_pool(&again, &defs[i].loc, defs[i].type));
    CHECK_EQ_PTR(again, def);
    CHECK_OK(tp_mem_get_pool(&cur, &defs[i].loc, defs[i].type));
    CHECK_EQ_PTR(cur, def);
    uint64_t before = used_of(def);
    void *p = NULL;
    if (CHECK_OK(tp_malloc_from_pool_async(&p, 1000, def, s))) {
      CHECK_EQ_U64(used_of(def), before + 1000);
      CHECK_OK(tp_free_async(p, s));
    }
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_OK(tp_pool_trim_to(def, 0));
    CHECK_EQ_U64(used_of(def), before);
  }
  check_context(NULL);
  stream_done(s);
}

/* "A destroyed pool's handle stays recognised until four million more
 * pools have been created": a few thousand creates never hand out the
 * handle of a destroyed pool, and each old handle answers INVALID_VALUE. */
static void test_destroyed_pool_handles_not_recycled(void) {
  enum { N = 3000 };
  tp_pool_t *h = calloc(N, sizeof *h);
  REQUIRE(h != NULL);
  tp_pool_props_t props = props_of(TP_ALLOCATION_PINNED, dev_loc(0), 0, 0);
  int made = 0;
  for (; made < N; made++) {
    if (!CHECK_OK(tp_pool_create(&h[made], &props)))
      break;
    /* A destroyed handle, or one of a pool that is being destroyed with a
     * live block, must not be given out again. */
    if (made % 2 == 0) {
      CHECK_OK(tp_pool_destroy(h[made]));
    } else {
      void *p = NULL;
      if (CHECK_OK(tp_malloc_from_pool_async(&p, 512, h[made], NULL))) {
        CHECK_OK(tp_pool_destroy(h[made]));
        CHECK_OK(tp_free_async(p, NULL));
      } else {
        CHECK_OK(tp_pool_destroy(h[made]));
      }
    }
  }
  CHECK_OK(tp_stream_synchronize(NULL));
  int dups = 0;
  for (int i = 0; i < made && dups < 3; i++)
    for (int j = i + 1; j < made && dups < 3; j++)
      if (h[i] == h[j]) {
        CHECK_FAIL("pools %d and %d got the same handle %p", i, j,
                   (void *)h[i]);
        dups++;
      }
  tp_pool_t live = new_pool(0, 0);
  for (int i = 0; i < made; i++) {
    uint64_t v = 0;
    if (live == h[i])
      CHECK_FAIL("a new pool got destroyed pool %d's handle", i);
    if (!CHECK_ERR(
            tp_pool_get_attribute(h[i], TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE))
      break;
  }
  if (live)
    CHECK_OK(tp_pool_destroy(live));
  free(h);
}

/* ========================================================================
 * Attributes
 * ======================================================================== */

typedef struct attr_desc {
  tp_pool_attr_t attr;
  int u64;
} attr_desc_t;

static const attr_desc_t all_attrs[] = {
    {TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 0},
    {TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0},
    {TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0},
    {TP_POOL_ATTR_RELEASE_THRESHOLD, 1},
    {TP_POOL_ATTR_RESERVED_MEM_CURRENT, 1},
    {TP_POOL_ATTR_RESERVED_MEM_HIGH, 1},
    {TP_POOL_ATTR_USED_MEM_CURRENT, 1},
    {TP_POOL_ATTR_USED_MEM_HIGH, 1},
    {TP_POOL_ATTR_ALLOCATION_TYPE, 0},
    {TP_POOL_ATTR_EXPORT_HANDLE_TYPES, 0},
    {TP_POOL_ATTR_LOCATION_ID, 0},
    {TP_POOL_ATTR_LOCATION_TYPE, 0},
    {TP_POOL_ATTR_LOCALITY_DOMAIN_ID, 0},
    {TP_POOL_ATTR_MAX_POOL_SIZE, 1},
    {TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, 0},
    {TP_POOL_ATTR_OOM_WAIT, 0},
    {TP_POOL_ATTR_CHUNK_MAPS, 1},
    {TP_POOL_ATTR_CHUNK_UNMAPS, 1},
    {TP_POOL_ATTR_CHUNK_SIZE, 1},
    {TP_POOL_ATTR_GROWTH_SLACK, 1},
};
#define NATTRS (sizeof all_attrs / sizeof all_attrs[0])

/* Every attribute on every kind of pool: NULL values refused both ways,
 * reads write exactly the header's type (an int attribute no more than an
 * int, a uint64_t one all eight bytes), and the values that the header
 * fixes (HW_DECOMPRESS 0, the props read back, a fresh pool's figures 0). */
static void test_attribute_values_and_widths(void) {
  tp_pool_props_t kinds[4];
  const char *names[4] = {"device", "host", "host NUMA 0", "managed"};
  tp_location_t host = {TP_LOCATION_HOST, 0, 0};
  tp_location_t numa0 = {TP_LOCATION_HOST_NUMA, 0, 0};
  kinds[0] = props_of(TP_ALLOCATION_PINNED, dev_loc(0), 0, 8 * MiB);
  kinds[1] = props_of(TP_ALLOCATION_PINNED, host, 0, 0);
  kinds[2] = props_of(TP_ALLOCATION_PINNED, numa0, 0, 0);
  kinds[3] = props_of(TP_ALLOCATION_MANAGED, dev_loc(0), 0, 0);
  for (int k = 0; k < 4; k++) {
    check_context(names[k]);
    tp_pool_t pool = NULL;
    if (!CHECK_OK(tp_pool_create(&pool, &kinds[k])))
      continue;
    for (size_t i = 0; i < NATTRS; i++) {
      tp_pool_attr_t a = all_attrs[i].attr;
      CHECK_ERR(tp_pool_get_attribute(pool, a, NULL), TP_ERROR_INVALID_VALUE);
      CHECK_ERR(tp_pool_set_attribute(pool, a, NULL), TP_ERROR_INVALID_VALUE);
      struct {
        union {
          uint64_t u;
          int i;
        } v;
        uint64_t guard;
      } w;
      memset(&w, 0xAA, sizeof w);
      if (!CHECK_OK(tp_pool_get_attribute(pool, a, &w.v)))
        continue;
      if (!CHECK_EQ_U64(w.guard, UINT64_C(0xAAAAAAAAAAAAAAAA)))
        CHECK_FAIL("attribute %d wrote past its value", (int)a);
      if (!all_attrs[i].u64) {
        /* An int: the bytes after it stay as they were. */
        unsigned char *b = (unsigned char *)&w.v;
        if (!all_bytes(b + sizeof(int), sizeof(uint64_t) - sizeof(int), 0xAA))
          CHECK_FAIL("int attribute %d wrote more than an int", (int)a);
      }
    }
    /* A fresh pool: nothing reserved or used, and the read of a uint64_t
     * overwrote the whole 0xAA pattern. */
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_CHUNK_MAPS), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS), 0);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_CHUNK_SIZE), 2 * MiB);
    int v = -1;
    CHECK_OK(
        tp_pool_get_attribute(pool, TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, &v));
    CHECK_EQ_INT(v, 0);
    CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_LOCATION_TYPE, &v));
    CHECK_EQ_INT(v, kinds[k].location.type);
    CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_ALLOCATION_TYPE, &v));
    CHECK_EQ_INT(v, kinds[k].alloc_type);
    if (kinds[k].max_size)
      CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), kinds[k].max_size);

    /* The read-write ones keep any value of their type that the header
     * allows: a threshold need not be a chunk multiple. */
    set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 12345);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), 12345);
    set64(pool, TP_POOL_ATTR_GROWTH_SLACK, 1);
    CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_GROWTH_SLACK), 1);
    set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
    CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                   &v));
    CHECK_EQ_INT(v, 0);
    /* Read-only ones refuse 0 as well, on every kind of pool. */
    uint64_t zero = 0;
    CHECK_ERR(
        tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT, &zero),
        TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_CHUNK_MAPS, &zero),
              TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_pool_destroy(pool));
  }
  check_context("attributes tidepool does not have");
  tp_pool_t def = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  const int unknown[] = {16, 17, 50, 105, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    uint64_t v = 0;
    CHECK_ERR(tp_pool_get_attribute(def, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_set_attribute(def, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
  }
  check_context(NULL);
}

/* The high watermarks: reset only by 0, which sets them to the current
 * figure; a trim lowers the current reserved figure, never its high; a
 * reset while a free is still pending counts that free as done with, as
 * "used" does at the free. */
static void test_watermark_resets(void) {
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t s = new_stream();
  REQUIRE(pool && s);
  uint64_t chunk = attr64(pool, TP_POOL_ATTR_CHUNK_SIZE);
  set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);

  check_context("nonzero resets refused, whatever the value");
  void *small = NULL, *big = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&small, 1000, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&big, 9 * MiB, pool, s));
  uint64_t peak_used = 9 * MiB + 1000;
  uint64_t peak_res = reserved_of(pool);
  CHECK(peak_res >= peak_used);
  const uint64_t bad[] = {1, peak_used, peak_res, UINT64_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = bad[i];
    CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &v),
              TP_ERROR_INVALID_VALUE);
    v = bad[i];
    CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v),
              TP_ERROR_INVALID_VALUE);
  }
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_res);

  check_context("a reset while a free is pending on a held stream");
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_free_async(big, s));
  CHECK_EQ_U64(used_of(pool), 1000);
  set64(pool, TP_POOL_ATTR_USED_MEM_HIGH, 0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 1000);
  /* Trim cannot give back the pending block's chunks. */
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) >= 9 * MiB + 1000);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));

  check_context("trim lowers reserved but not its watermark");
  CHECK_OK(tp_pool_trim_to(pool, 0));
  uint64_t r = reserved_of(pool);
  CHECK(r >= 1000 && r <= 2 * chunk);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_res);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 1000);
  set64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, 0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), r);

  check_context("after a reset, the watermarks follow new peaks");
  void *again = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&again, 5 * MiB, pool, s));
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 5 * MiB + 1000);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), reserved_of(pool));
  CHECK_OK(tp_free_async(again, s));
  CHECK_OK(tp_free_async(small, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 5 * MiB + 1000);
  set64(pool, TP_POOL_ATTR_USED_MEM_HIGH, 0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 0);

  check_context("a destroyed pool's watermarks cannot be reset");
  CHECK_OK(tp_pool_destroy(pool));
  uint64_t zero = 0;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero),
            TP_ERROR_INVALID_VALUE);
  check_context(NULL);
  stream_done(s);
}

/* ========================================================================
 * Statistics, release threshold and trim across several streams
 * ======================================================================== */

/* Three streams each free a block; two are held. A synchronize of one
 * stream may give back only that stream's free, down to the threshold;
 * the held frees keep their memory until their streams are synchronized,
 * and "used" has counted every free from its call. */
static void test_threshold_with_pending_frees(void) {
  enum { NS = 3 };
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t s[NS] = {new_stream(), new_stream(), new_stream()};
  REQUIRE(pool && s[0] && s[1] && s[2]);
  uint64_t chunk = attr64(pool, TP_POOL_ATTR_CHUNK_SIZE);
  const uint64_t block = 8 * MiB, t = 6 * MiB;
  set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, t);
  /* No stream may take another's pending block: each free stays its
   * stream's until synchronized. */
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);

  void *p[NS];
  for (int i = 0; i < NS; i++)
    REQUIRE_OK(tp_malloc_from_pool_async(&p[i], block, pool, s[i]));
  CHECK_EQ_U64(used_of(pool), NS * block);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), NS * block);
  uint64_t r0 = reserved_of(pool);
  CHECK(r0 >= NS * block);

  gate_t g1, g2;
  REQUIRE_OK(hold_stream(s[1], &g1));
  REQUIRE_OK(hold_stream(s[2], &g2));
  for (int i = 0; i < NS; i++) {
    CHECK_OK(tp_free_async(p[i], s[i]));
    CHECK_EQ_U64(used_of(pool), (NS - 1 - (uint64_t)i) * block);
  }
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), NS * block);

  check_context("stream 0 synchronized, 1 and 2 held");
  CHECK_OK(tp_stream_synchronize(s[0]));
  uint64_t r = reserved_of(pool);
  CHECK(r >= 2 * block);
  CHECK(r <= 2 * block + round_up(t, chunk) + 2 * chunk);
  CHECK(r < r0);

  check_context("stream 1 released and synchronized, 2 held");
  release(&g1);
  CHECK_OK(tp_stream_synchronize(s[1]));
  r = reserved_of(pool);
  CHECK(r >= block);
  CHECK(r <= block + round_up(t, chunk) + 2 * chunk);

  check_context("a trim meanwhile keeps the held free");
  CHECK_OK(tp_pool_trim_to(pool, 0));
  r = reserved_of(pool);
  CHECK(r >= block);
  CHECK(r <= block + 2 * chunk);

  check_context("all synchronized: at most the threshold stays");
  release(&g2);
  CHECK_OK(tp_stream_synchronize(s[2]));
  CHECK(reserved_of(pool) <= round_up(t, chunk));
  CHECK_EQ_U64(used_of(pool), 0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), r0);
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  check_context(NULL);
  for (int i = 0; i < NS; i++)
    stream_done(s[i]);
  CHECK_OK(tp_pool_destroy(pool));
}

/* A free stays usable as its own promises say when a later free of its
 * stream lands next to it: an event recorded between the two, a wait on
 * it or its synchronize covers the earlier free (tp_stream_wait_event,
 * tp_event_synchronize), and a free a synchronize showed complete counts
 * as free for a trim or a release (tp_pool_trim_to) while the later free
 * is pending. The pool holds three chunks, so a block not given back or
 * handed out shows as OUT_OF_MEMORY. Four ways: 0 a waiter following the
 * event, 1 the event synchronized at threshold 0, 2 a trim, 3 a release at
 * another stream's synchronize. */
static void test_later_free_keeps_earlier_usable(void) {
  for (int way = 0; way < 4; way++) {
    char what[64];
    snprintf(what, sizeof what, "way %d", way);
    check_context(what);
    tp_stream_t d = new_stream(), b = new_stream();
    tp_pool_t probe = new_pool(0, 0);
    REQUIRE(d && b && probe);
    uint64_t chunk = attr64(probe, TP_POOL_ATTR_CHUNK_SIZE);
    CHECK_OK(tp_pool_destroy(probe));
    tp_pool_t pool = new_pool(0, (size_t)(3 * chunk));
    REQUIRE(pool);
    set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, way == 0);
    set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
    set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
    set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
    uint64_t threshold = way == 0 ? UINT64_MAX : way == 1 ? 0 : 3 * chunk;
    set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, threshold);
    void *v[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
      REQUIRE_OK(tp_malloc_from_pool_async(&v[i], chunk, pool, d));
    CHECK_OK(tp_stream_synchronize(d));
    /* x1 and x2: two blocks next to each other. */
    void *x1 = NULL, *x2 = NULL;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 3; j++)
        if ((uintptr_t)v[j] == (uintptr_t)v[i] + chunk)
          x1 = v[i], x2 = v[j];
    REQUIRE(x1 && x2);
    tp_event_t e = NULL;
    CHECK_OK(tp_event_create(&e));
    CHECK_OK(tp_free_async(x1, d));
    if (way <= 1)
      CHECK_OK(tp_event_record(e, d));
    else
      CHECK_OK(tp_stream_synchronize(d));
    gate_t g;
    REQUIRE_OK(hold_stream(d, &g));
    CHECK_OK(tp_free_async(x2, d));
    uint64_t before = reserved_of(pool);
    CHECK_EQ_U64(before, 3 * chunk);
    switch (way) {
    case 0: CHECK_OK(tp_stream_wait_event(b, e, 0)); break;
    case 1: CHECK_OK(tp_event_synchronize(e)); break;
    case 2: CHECK_OK(tp_pool_trim_to(pool, 0)); break;
    default:
      set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
      CHECK_OK(tp_stream_synchronize(b));
    }
    /* x1's chunk is given back, except where the waiter may take it. */
    CHECK_EQ_U64(reserved_of(pool), way == 0 ? 3 * chunk : 2 * chunk);
    void *y = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&y, chunk, pool, b));
    if (way == 0)
      CHECK(y == x1);
    release(&g);
    CHECK_OK(tp_stream_synchronize(d));
    if (y)
      CHECK_OK(tp_free_async(y, b));
    for (int i = 0; i < 3; i++)
      if (v[i] != x1 && v[i] != x2)
        CHECK_OK(tp_free_async(v[i], d));
    stream_done(b);
    stream_done(d);
    CHECK_OK(tp_event_destroy(e));
    CHECK_OK(tp_pool_destroy(pool));
  }
  check_context(NULL);
}

/* A pool that can make no more memory (its max_size reached) serves a
 * request from its wholly free chunks whatever its growth slack, which
 * only trades memory for fewer chunk moves where memory can be made: with
 * the slack at a quarter, two free chunks that were no neighbours failed a
 * two-chunk request with OUT_OF_MEMORY (and so did a default pool whose
 * device was full, at the default slack from about 512 MiB used). The
 * blocks that stay live keep their bytes. */
static void test_full_pool_moves_free_chunks(void) {
  const uint64_t slacks[] = {0, 250000, 1000000};
  for (size_t k = 0; k < sizeof slacks / sizeof slacks[0]; k++) {
    tp_pool_t probe = new_pool(0, 0);
    REQUIRE(probe);
    uint64_t chunk = attr64(probe, TP_POOL_ATTR_CHUNK_SIZE);
    CHECK_OK(tp_pool_destroy(probe));
    tp_pool_t pool = new_pool(0, 4 * chunk);
    REQUIRE(pool);
    set64(pool, TP_POOL_ATTR_GROWTH_SLACK, slacks[k]);
    /* The free chunks stay mapped through the synchronize. */
    set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
    tp_stream_t s = NULL;
    REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
    void *a[4] = {0}, *big = NULL;
    for (int i = 0; i < 4; i++)
      CHECK_OK(tp_malloc_from_pool_async(&a[i], chunk, pool, s));
    CHECK_OK(tp_memset_async(a[1], 0x11, chunk, s));
    CHECK_OK(tp_memset_async(a[3], 0x33, chunk, s));
    CHECK_OK(tp_free_async(a[0], s));
    CHECK_OK(tp_free_async(a[2], s));
    CHECK_OK(tp_stream_synchronize(s));
    if (!CHECK_OK(tp_malloc_from_pool_async(&big, 2 * chunk, pool, s)))
      printf("   (growth slack %" PRIu64 ")\n", slacks[k]);
    CHECK_EQ_U64(reserved_of(pool), 4 * chunk);
    unsigned char *host = malloc(chunk);
    REQUIRE(host);
    for (int i = 1; i < 4; i += 2) {
      CHECK_OK(tp_memcpy_async(host, a[i], chunk, s));
      CHECK_OK(tp_stream_synchronize(s));
      CHECK(all_bytes(host, chunk, i == 1 ? 0x11 : 0x33));
      CHECK_OK(tp_free_async(a[i], s));
    }
    free(host);
    if (big)
      CHECK_OK(tp_free_async(big, s));
    stream_done(s);
    CHECK_OK(tp_pool_destroy(pool));
  }
}

/* tp_pool_trim_to: "whatever the release threshold"; each stream's cached
 * blocks given back first; frees known complete through an event or a
 * device synchronize count; the figures it leaves: unmapped chunks equal
 * the reserved bytes given back, used and the watermarks untouched, a keep
 * at or above what is reserved changes nothing. */
static void test_trim_figures(void) {
  enum { NS = 3 };
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t s[NS] = {new_stream(), new_stream(), new_stream()};
  tp_event_t ev = NULL;
  CHECK_OK(tp_event_create(&ev));
  REQUIRE(pool && s[0] && s[1] && s[2] && ev);
  uint64_t chunk = attr64(pool, TP_POOL_ATTR_CHUNK_SIZE);
  set64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);

  check_context("frees on three streams, each synchronized alone");
  void *live = NULL, *p[NS];
  REQUIRE_OK(tp_malloc_from_pool_async(&live, 3000, pool, s[0]));
  for (int i = 0; i < NS; i++)
    REQUIRE_OK(tp_malloc_from_pool_async(&p[i], 6 * MiB + 100, pool, s[i]));
  for (int i = 0; i < NS; i++) {
    CHECK_OK(tp_free_async(p[i], s[i]));
    CHECK_OK(tp_stream_synchronize(s[i]));
  }
  uint64_t r0 = reserved_of(pool);
  uint64_t high0 = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
  uint64_t uhigh0 = attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH);
  CHECK(r0 >= NS * (6 * MiB + 100));

  check_context("a keep at or above reserved changes nothing");
  uint64_t unmaps0 = attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  CHECK_OK(tp_pool_trim_to(pool, (size_t)r0));
  CHECK_OK(tp_pool_trim_to(pool, SIZE_MAX));
  CHECK_EQ_U64(reserved_of(pool), r0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS), unmaps0);

  check_context("trim to 5 MiB");
  uint64_t maps0 = attr64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  CHECK_OK(tp_pool_trim_to(pool, 5 * MiB));
  uint64_t r1 = reserved_of(pool);
  CHECK(r1 <= round_up(5 * MiB, chunk));
  CHECK(r1 >= 5 * MiB);
  uint64_t unmaps1 = attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  CHECK_EQ_U64((unmaps1 - unmaps0) * chunk, r0 - r1);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_CHUNK_MAPS), maps0);
  CHECK_EQ_U64(used_of(pool), 3000);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), high0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH), uhigh0);
  CHECK_EQ_U64(attr64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) <= 2 * chunk);

  check_context("a free known complete through an event synchronize");
  void *q = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&q, 10 * MiB, pool, s[1]));
  CHECK_OK(tp_free_async(q, s[1]));
  CHECK_OK(tp_event_record(ev, s[1]));
  CHECK_OK(tp_event_synchronize(ev));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) <= 2 * chunk);

  check_context("a free known complete through a device synchronize");
  REQUIRE_OK(tp_malloc_from_pool_async(&q, 10 * MiB, pool, s[2]));
  CHECK_OK(tp_free_async(q, s[2]));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) <= 2 * chunk);

  check_context("the live block survives every trim");
  unsigned char out[64];
  CHECK_OK(tp_memset_async(live, 0x6B, 3000, s[0]));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_OK(
      tp_memcpy_async(out, (char *)live + 3000 - sizeof out, sizeof out, s[0]));
  CHECK_OK(tp_stream_synchronize(s[0]));
  CHECK(all_bytes(out, sizeof out, 0x6B));
  CHECK_OK(tp_free_async(live, s[0]));
  CHECK_OK(tp_stream_synchronize(s[0]));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  for (int i = 0; i < NS; i++)
    stream_done(s[i]);
  CHECK_OK(tp_pool_destroy(pool));
}

/* ========================================================================
 * Allocation and free
 * ======================================================================== */

/* tp_malloc_async and tp_malloc_from_pool_async: size 0 gives NULL and
 * counts nothing on every kind of pool; every pointer is aligned to 512;
 * sizes the pool cannot hold are OUT_OF_MEMORY and change nothing. */
static void test_malloc_edges(void) {
  tp_stream_t s = new_stream();
  REQUIRE(s != NULL);
  tp_location_t host = {TP_LOCATION_HOST, 0, 0};
  tp_location_t none = {TP_LOCATION_NONE, 0, 0};
  tp_pool_t pools[4] = {NULL, NULL, NULL, NULL};
  CHECK_OK(tp_device_get_default_mem_pool(&pools[0], 0));
  CHECK_OK(tp_mem_get_default_pool(&pools[1], &host, TP_ALLOCATION_PINNED));
  CHECK_OK(tp_mem_get_default_pool(&pools[2], &none, TP_ALLOCATION_MANAGED));
  pools[3] = new_pool(0, 16 * MiB);
  static const size_t sizes[] = {1,   2,    511,   512,     513,
                                 777, 4097, 65535, MiB + 1, 3 * MiB - 1};
  enum { NSIZES = sizeof sizes / sizeof sizes[0] };
  for (int k = 0; k < 4; k++) {
    char label[48];
    snprintf(label, sizeof label, "pool kind %d", k);
    check_context(label);
    if (!pools[k])
      continue;
    uint64_t used0 = used_of(pools[k]);
    void *p = (void *)&p;
    CHECK_OK(tp_malloc_from_pool_async(&p, 0, pools[k], s));
    CHECK_EQ_PTR(p, NULL);
    CHECK_EQ_U64(used_of(pools[k]), used0);

    void *blk[NSIZES];
    uint64_t sum = 0;
    for (int i = 0; i < NSIZES; i++) {
      blk[i] = NULL;
      if (!CHECK_OK(tp_malloc_from_pool_async(&blk[i], sizes[i], pools[k], s)))
        continue;
      sum += sizes[i];
      if ((uintptr_t)blk[i] % 512 != 0)
        CHECK_FAIL("size %zu: pointer %p is not 512-aligned", sizes[i], blk[i]);
    }
    CHECK_EQ_U64(used_of(pools[k]), used0 + sum);

    const size_t huge[] = {(size_t)1 << 50, (size_t)1 << 62, SIZE_MAX - 4095};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
      p = NULL;
      CHECK_ERR(tp_malloc_from_pool_async(&p, huge[i], pools[k], s),
                TP_ERROR_OUT_OF_MEMORY);
    }
    CHECK_EQ_U64(used_of(pools[k]), used0 + sum);
    for (int i = 0; i < NSIZES; i++)
      if (blk[i])
        CHECK_OK(tp_free_async(blk[i], s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_EQ_U64(used_of(pools[k]), used0);
  }

  check_context("a pool with max_size: beyond the cap, then the pool works");
  if (pools[3]) {
    void *p = NULL;
    set_int(pools[3], TP_POOL_ATTR_OOM_WAIT, 0);
    CHECK_ERR(tp_malloc_from_pool_async(&p, 16 * MiB + 1, pools[3], s),
              TP_ERROR_OUT_OF_MEMORY);
    if (CHECK_OK(tp_malloc_from_pool_async(&p, 16 * MiB, pools[3], s)))
      CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_OK(tp_pool_destroy(pools[3]));
  }

  check_context("tp_malloc_async: size 0 and a size too large");
  tp_pool_t def = pools[0];
  uint64_t used0 = used_of(def);
  void *p = (void *)&p;
  CHECK_OK(tp_malloc_async(&p, 0, s));
  CHECK_EQ_PTR(p, NULL);
  p = (void *)&p;
  CHECK_OK(tp_malloc_async(&p, 0, NULL));
  CHECK_EQ_PTR(p, NULL);
  CHECK_ERR(tp_malloc_async(&p, (size_t)1 << 60, s), TP_ERROR_OUT_OF_MEMORY);
  CHECK_EQ_U64(used_of(def), used0);
  check_context(NULL);
  stream_done(s);
}

/* tp_free_async's list: a pointer already freed (also while its free is
 * still pending, on the same or another stream), an interior pointer of a
 * live or pending block, an unknown stream: all INVALID_VALUE, and "a
 * rejected free changes nothing": the block stays live and freeable. */
static void test_free_rejections(void) {
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t a = new_stream(), b = new_stream();
  REQUIRE(pool && a && b);
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 100000, pool, a));
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 5000, pool, a));

  check_context("interior pointers of a live block");
  const size_t offs[] = {1, 511, 512, 4096, 99999};
  for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
    CHECK_ERR(tp_free_async((char *)x + offs[i], a), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(used_of(pool), 105000);

  check_context("a second free while the first is pending");
  gate_t g;
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_free_async(x, a));
  CHECK_EQ_U64(used_of(pool), 5000);
  CHECK_ERR(tp_free_async(x, a), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async(x, b), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async(x, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((char *)x + 512, b), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(used_of(pool), 5000);
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_ERR(tp_free_async(x, b), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(used_of(pool), 5000);

  /* On cuda a destroyed stream is the driver's to judge (the header). */
  if (check_on_host()) {
    check_context("a free on a destroyed stream (host)");
    tp_stream_t dead = new_stream();
    REQUIRE(dead != NULL);
    CHECK_OK(tp_stream_destroy(dead));
    CHECK_ERR(tp_free_async(y, dead), TP_ERROR_INVALID_VALUE);
    CHECK_EQ_U64(used_of(pool), 5000);
  }
  /* The block is still the caller's: usable, then freeable elsewhere. */
  unsigned char byte = 0;
  CHECK_OK(tp_memset_async(y, 0x42, 5000, b));
  CHECK_OK(tp_memcpy_async(&byte, (char *)y + 4999, 1, b));
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_INT(byte, 0x42);
  CHECK_OK(tp_free_async(y, b));
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_U64(used_of(pool), 0);

  if (check_on_host()) {
    check_context("a free on a stream handle tidepool never made (host)");
    void *z = NULL;
    uint64_t fake[32];
    memset(fake, 0, sizeof fake);
    REQUIRE_OK(tp_malloc_from_pool_async(&z, 4096, pool, a));
    CHECK_ERR(tp_free_async(z, (tp_stream_t)(void *)fake),
              TP_ERROR_INVALID_VALUE);
    CHECK_EQ_U64(used_of(pool), 4096);
    CHECK_OK(tp_free_async(z, a));
  }

  check_context("NULL is a no-op free on any live stream");
  CHECK_OK(tp_free_async(NULL, a));
  CHECK_OK(tp_free_async(NULL, NULL));

  check_context("a deferred destroy: frees succeed once, then refuse");
  void *w = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&w, 3 * MiB, pool, a));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_ERR(tp_free_async((char *)w + 512, a), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_free_async(w, a));
  CHECK_ERR(tp_free_async(w, a), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_ERR(tp_free_async(w, b), TP_ERROR_INVALID_VALUE);
  check_context(NULL);
  stream_done(a);
  stream_done(b);
}

/* ========================================================================
 * Streams
 * ======================================================================== */

/* Every call that takes a stream answers INVALID_VALUE for one destroyed
 * (the header: "on host it answers INVALID_VALUE"), and for a handle
 * tidepool never made (host; on cuda any CUstream is accepted). */
static void stream_calls_refuse(tp_stream_t bad, tp_pool_t pool, void *live,
                                tp_event_t ev) {
  void *p = NULL;
  unsigned char buf[16];
  atomic_int flag = 0;
  CHECK_ERR(tp_malloc_async(&p, 4096, bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(&p, 4096, pool, bad),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async(live, bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memset_async(live, 0, 16, bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(buf, live, 16, bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_launch_host_func(bad, check_set_flag, &flag),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_record(ev, bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_wait_event(bad, ev, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_query(bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_synchronize(bad), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_begin_capture(bad, TP_CAPTURE_MODE_RELAXED),
            TP_ERROR_INVALID_VALUE);
  tp_capture_status_t st = TP_CAPTURE_STATUS_ACTIVE;
  CHECK_ERR(tp_stream_is_capturing(bad, &st), TP_ERROR_INVALID_VALUE);
  tp_graph_t graph = (tp_graph_t)(uintptr_t)0x5000;
  CHECK_ERR(tp_stream_end_capture(bad, &graph), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_PTR(graph, NULL); /* "On failure *graph is NULL." */
  CHECK_ERR(tp_stream_destroy(bad), TP_ERROR_INVALID_VALUE);
  check_sleep_ms(20);
  CHECK_EQ_INT(atomic_load(&flag), 0);
}

/* A child made by fork() after the parent used the library, while a
 * stream of the parent is busy, gets an answer from every call
 * (NOT_PERMITTED, as the header says) instead of hanging on work that no
 * thread of the child will ever run. */
static void test_fork_child_refused(void) {
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t s = new_stream();
  REQUIRE(pool && s);
  void *x = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4096, pool, s));
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_free_async(x, s));
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(20);
    int bad = 0;
    void *y = NULL;
    tp_stream_t t = NULL;
    tp_event_t ev = NULL;
    bad += tp_malloc_async(&y, 4096, s) != TP_ERROR_NOT_PERMITTED;
    bad +=
        tp_malloc_from_pool_async(&y, 4096, pool, s) != TP_ERROR_NOT_PERMITTED;
    bad += tp_free_async(x, s) != TP_ERROR_NOT_PERMITTED;
    bad += tp_stream_synchronize(s) != TP_ERROR_NOT_PERMITTED;
    bad += tp_device_synchronize() != TP_ERROR_NOT_PERMITTED;
    bad += tp_stream_create(&t, 0) != TP_ERROR_NOT_PERMITTED;
    bad += tp_event_create(&ev) != TP_ERROR_NOT_PERMITTED;
    bad += tp_pool_trim_to(pool, 0) != TP_ERROR_NOT_PERMITTED;
    bad += tp_pool_destroy(pool) != TP_ERROR_NOT_PERMITTED;
    _exit(bad ? 10 + bad : 0);
  }
  int status = 0;
  double until = check_now_s() + 30;
  pid_t got = 0;
  while ((got = waitpid(pid, &status, WNOHANG)) == 0 && check_now_s() < until)
    check_sleep_ms(10);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    CHECK_FAIL("the forked child hung");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    CHECK_FAIL("the forked child: %s %d (10 + calls answered otherwise)",
               WIFEXITED(status) ? "exit" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(used_of(pool), 0);
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_pool_destroy(pool));
}

/* CUDA's event calls report a fault of the work they wait for; on host a
 * copy to an address the process does not have faults its stream. The
 * event reports it without clearing it (the stream's synchronize does),
 * and the pool's frees behind the fault complete all the same. */
static void test_event_reports_fault(void) {
  if (!check_on_host()) {
    printf("   (host only: a fault on cuda ends the context)\n");
    return;
  }
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t s = new_stream(), t = new_stream();
  tp_event_t before = NULL, after = NULL;
  CHECK_OK(tp_event_create(&before));
  CHECK_OK(tp_event_create(&after));
  REQUIRE(pool && s && t && before && after);
  uint64_t keep = UINT64_MAX;
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &keep));
  void *x = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 3 << 20, pool, s));
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_event_record(before, s));
  static const char bytes[16] = "fault";
  CHECK_OK(tp_memcpy_async((void *)(uintptr_t)4096, bytes, sizeof bytes, s));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_event_record(after, s));
  CHECK_ERR(tp_event_query(after), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_ERR(tp_event_synchronize(after), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_ERR(tp_event_query(after), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(tp_event_synchronize(before));
  CHECK_EQ_U64(used_of(pool), 0);
  /* The free behind the fault completed: another stream that waits on the
   * event takes its bytes without the pool growing. */
  uint64_t reserved = reserved_of(pool);
  CHECK_OK(tp_stream_wait_event(t, after, 0));
  void *y = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&y, 3 << 20, pool, t));
  CHECK_EQ_U64(reserved_of(pool), reserved);
  CHECK_OK(tp_free_async(y, t));
  CHECK_OK(tp_stream_synchronize(t));
  CHECK_ERR(tp_stream_synchronize(s), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(tp_stream_synchronize(s)); /* reported once */
  CHECK_OK(tp_event_query(after));
  CHECK_OK(tp_event_synchronize(after));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_OK(tp_event_destroy(before));
  CHECK_OK(tp_event_destroy(after));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_stream_destroy(t));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A stream that faults and is destroyed before anything synchronizes it:
 * the next device synchronize reports the fault (ILLEGAL_ADDRESS), once,
 * and events recorded behind it answer SUCCESS after that, whether the
 * faulting work was still held when the synchronize began (way 0) or had
 * run before it (way 1). In way 1 the synchronize answered SUCCESS and the
 * event ILLEGAL_ADDRESS for good: the drained stream had left the device's
 * list with its fault. Host only, as test_event_reports_fault. */
static void test_destroyed_stream_fault_reported(void) {
  if (!check_on_host()) {
    printf("   (host only: a fault on cuda ends the context)\n");
    return;
  }
  static const char bytes[16] = "fault";
  for (int way = 0; way < 2; way++) {
    tp_stream_t s = new_stream();
    tp_event_t e = NULL;
    CHECK_OK(tp_event_create(&e));
    REQUIRE(s && e);
    gate_t g;
    REQUIRE_OK(hold_stream(s, &g));
    CHECK_OK(tp_memcpy_async((void *)(uintptr_t)4096, bytes, sizeof bytes, s));
    CHECK_OK(tp_event_record(e, s));
    CHECK_OK(tp_stream_destroy(s));
    gate_opener_t o;
    if (way == 0) {
      REQUIRE(gate_open_after(&o, g, 100));
    } else {
      release(&g);
      CHECK_ERR(tp_event_synchronize(e), TP_ERROR_ILLEGAL_ADDRESS);
      check_sleep_ms(20); /* the destroyed stream drains meanwhile */
    }
    CHECK_ERR(tp_device_synchronize(), TP_ERROR_ILLEGAL_ADDRESS);
    if (way == 0)
      gate_opener_join(&o);
    CHECK_OK(tp_device_synchronize()); /* reported once */
    CHECK_OK(tp_event_query(e));
    CHECK_OK(tp_event_synchronize(e));
    CHECK_OK(tp_event_destroy(e));
  }
}

/* Event handles: a stream's handle is no event (on the host platform the
 * two were numbered alike, and a stream's handle named another event,
 * which a destroy then took), and among thousands of events made and
 * destroyed in random order each handle answers for its own event. */
static void test_event_handles(void) {
  tp_stream_t s = new_stream();
  tp_event_t keep[4] = {0};
  for (int i = 0; i < 4; i++)
    CHECK_OK(tp_event_create(&keep[i]));
  REQUIRE(s);
  CHECK_ERR(tp_event_record((tp_event_t)s, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_query((tp_event_t)s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_destroy((tp_event_t)s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_query((tp_stream_t)keep[0]), TP_ERROR_INVALID_VALUE);
  for (int i = 0; i < 4; i++) {
    CHECK_OK(tp_event_record(keep[i], s));
    CHECK_OK(tp_event_destroy(keep[i]));
  }
  enum { N = 3000 };
  tp_event_t *ev = calloc(N, sizeof *ev);
  bool *live = calloc(N, sizeof *live);
  REQUIRE(ev && live);
  check_rng r = {seed ^ 0x6576656e74ull};
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++)
      if (!live[i])
        live[i] = CHECK_OK(tp_event_create(&ev[i]));
    for (int i = 0; i < N; i++) {
      if (rng_chance(&r, 50)) {
        CHECK_OK(tp_event_destroy(ev[i]));
        live[i] = false;
      }
    }
    for (int i = 0; i < N; i++)
      if (live[i])
        CHECK_OK(tp_event_record(ev[i], s));
    for (int i = 0; i < N; i++)
      if (ev[i])
        CHECK_ERR(tp_event_query(ev[i]),
                  live[i] ? TP_SUCCESS : TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_stream_synchronize(s));
  }
  for (int i = 0; i < N; i++)
    if (live[i])
      CHECK_OK(tp_event_destroy(ev[i]));
  free(ev);
  free(live);
  CHECK_OK(tp_stream_destroy(s));
}

/* A stream handle answers for its own stream: a live one allocates from its
 * device's current pool, and a destroyed one is refused (host only: on cuda
 * a gone stream's handle is the driver's to judge). */
static void stream_answers(tp_stream_t h, bool live, tp_pool_t pool) {
  void *p = NULL;
  if (!live) {
    if (check_on_host()) {
      CHECK_ERR(tp_stream_query(h), TP_ERROR_INVALID_VALUE);
      CHECK_ERR(tp_malloc_async(&p, 256, h), TP_ERROR_INVALID_VALUE);
    }
    return;
  }
  CHECK_OK(tp_stream_query(h));
  if (!CHECK_OK(tp_malloc_async(&p, 256, h)))
    return;
  tp_pool_t of = NULL;
  CHECK_OK(tp_pointer_get_attribute(&of, TP_POINTER_ATTR_MEMPOOL_HANDLE, p));
  CHECK_EQ_PTR(of, pool);
  CHECK_OK(tp_free_async(p, h));
}

/* Thousands of streams over the devices, a random half destroyed: each
 * handle still answers for its own stream when the thread's cache of
 * handles misses, as it does on every call of a rotation over more than
 * four, and the registry's index decides (a scan of every stream did). */
static void test_stream_handles(void) {
  enum { N = 3000, ROTATE = 8 };
  int ndev = 1;
  CHECK_OK(tp_get_device_count(&ndev));
  ndev = ndev > 2 ? 2 : ndev < 1 ? 1 : ndev;
  tp_pool_t pools[2] = {0};
  for (int d = 0; d < ndev; d++)
    CHECK_OK(tp_device_get_mem_pool(&pools[d], d));
  tp_stream_t *h = calloc(N, sizeof *h);
  bool *live = calloc(N, sizeof *live);
  REQUIRE(h && live);
  for (int i = 0; i < N; i++) {
    REQUIRE_OK(tp_set_device(i % ndev));
    live[i] = CHECK_OK(tp_stream_create(&h[i], TP_STREAM_NON_BLOCKING));
  }
  REQUIRE_OK(tp_set_device(0));
  check_rng r = {seed ^ 0x73747265616dull};
  for (int i = 0; i < N; i++)
    if (live[i] && rng_chance(&r, 50)) {
      CHECK_OK(tp_stream_destroy(h[i]));
      live[i] = false;
    }
  /* Every handle in order, then at random, then over a few of each kind
   * in turn, as a thread that uses several streams does. */
  for (int i = 0; i < N; i++)
    if (h[i])
      stream_answers(h[i], live[i], pools[i % ndev]);
  for (int k = 0; k < N; k++) {
    int i = (int)rng_below(&r, N);
    if (h[i])
      stream_answers(h[i], live[i], pools[i % ndev]);
  }
  int few[ROTATE];
  for (int k = 0; k < ROTATE; k++)
    few[k] = (int)rng_below(&r, N);
  for (int rep = 0; rep < 100; rep++)
    for (int k = 0; k < ROTATE; k++)
      if (h[few[k]])
        stream_answers(h[few[k]], live[few[k]], pools[few[k] % ndev]);
  for (int i = 0; i < N; i++)
    if (live[i])
      CHECK_OK(tp_stream_destroy(h[i]));
  for (int i = 0; i < N; i++)
    if (h[i])
      stream_answers(h[i], false, NULL);
  free(h);
  free(live);
}

static void test_dead_and_foreign_streams(void) {
  if (!check_on_host()) {
    printf("   (host only: on cuda a gone stream is the driver's to judge)\n");
    return;
  }
  tp_pool_t pool = new_pool(0, 0);
  tp_stream_t live_s = new_stream();
  tp_event_t ev = NULL;
  CHECK_OK(tp_event_create(&ev));
  REQUIRE(pool && live_s && ev);
  void *live = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&live, 4096, pool, live_s));
  CHECK_OK(tp_event_record(ev, live_s));
  CHECK_OK(tp_stream_synchronize(live_s));

  check_context("a destroyed stream, idle");
  tp_stream_t dead = new_stream();
  REQUIRE(dead != NULL);
  CHECK_OK(tp_stream_destroy(dead));
  stream_calls_refuse(dead, pool, live, ev);

  check_context("a destroyed stream that had work and frees");
  tp_stream_t busy = new_stream();
  REQUIRE(busy != NULL);
  void *q = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&q, MiB, pool, busy));
  CHECK_OK(tp_memset_async(q, 1, MiB, busy));
  CHECK_OK(tp_free_async(q, busy));
  CHECK_OK(tp_stream_destroy(busy));
  stream_calls_refuse(busy, pool, live, ev);
  CHECK_OK(tp_device_synchronize());

  check_context("a destroyed stream the thread was alternating with");
  tp_stream_t a = new_stream(), b = new_stream();
  REQUIRE(a && b);
  for (int i = 0; i < 4; i++) {
    void *pa = NULL, *pb = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&pa, 256, pool, a));
    CHECK_OK(tp_malloc_from_pool_async(&pb, 256, pool, b));
    CHECK_OK(tp_free_async(pa, a));
    CHECK_OK(tp_free_async(pb, b));
  }
  CHECK_OK(tp_stream_destroy(b));
  stream_calls_refuse(b, pool, live, ev);
  void *pa = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&pa, 256, pool, a));
  CHECK_OK(tp_free_async(pa, a));
  CHECK_OK(tp_stream_destroy(a));
  stream_calls_refuse(a, pool, live, ev);

  check_context("a destroyed stream, with new streams made after it");
  /* Made and destroyed in turns, a new stream's memory often lands where
   * the destroyed one's was; its handle must not name the new stream. */
  for (int i = 0; i < 32; i++) {
    tp_stream_t gone = new_stream();
    REQUIRE(gone != NULL);
    CHECK_OK(tp_stream_destroy(gone));
    tp_stream_t fresh = new_stream();
    REQUIRE(fresh != NULL);
    CHECK(fresh != gone);
    CHECK_ERR(tp_stream_query(gone), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_stream_destroy(gone), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_stream_query(fresh));
    CHECK_OK(tp_stream_destroy(fresh));
  }

  check_context("stream handles tidepool never made");
  uint64_t zeros[64], ones[64];
  memset(zeros, 0, sizeof zeros);
  memset(ones, 0xFF, sizeof ones);
  stream_calls_refuse((tp_stream_t)(void *)zeros, pool, live, ev);
  stream_calls_refuse((tp_stream_t)(void *)ones, pool, live, ev);
  stream_calls_refuse((tp_stream_t)(void *)&zeros[1], pool, live, ev);

  check_context("the live block is intact and the pool counts it alone");
  CHECK_EQ_U64(used_of(pool), 4096);
  CHECK_OK(tp_free_async(live, live_s));
  CHECK_OK(tp_stream_synchronize(live_s));
  CHECK_EQ_U64(used_of(pool), 0);
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(live_s);
  CHECK_OK(tp_pool_destroy(pool));
}

/* A stream destroyed with work and a free still queued behind a gate: the
 * work still runs, and the freed block becomes reusable by another stream
 * once it has completed (the header: "blocks freed on it stay reusable by
 * other streams as their frees complete"). */
static void test_stream_destroyed_with_pending_free(void) {
  tp_pool_t pool = new_pool(0, 2 * MiB); /* one chunk: reuse or nothing */
  tp_stream_t s = new_stream(), t = new_stream();
  REQUIRE(pool && s && t);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  void *x = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 2 * MiB, pool, s));
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  atomic_int ran = 0;
  CHECK_OK(tp_memset_async(x, 0x33, 2 * MiB, s));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_launch_host_func(s, check_set_flag, &ran));
  /* The destroy may wait for the work or return at once (CUDA's does);
   * either way the gate opens within the test's time. */
  gate_opener_t o;
  REQUIRE(gate_open_after(&o, g, 200));
  CHECK_OK(tp_stream_destroy(s));
  gate_opener_join(&o);
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_INT(atomic_load(&ran), 1);
  CHECK_EQ_U64(used_of(pool), 0);
  void *y = NULL;
  if (CHECK_OK(tp_malloc_from_pool_async(&y, 2 * MiB, pool, t)))
    CHECK_OK(tp_free_async(y, t));
  CHECK_OK(tp_stream_synchronize(t));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  stream_done(t);
  CHECK_OK(tp_pool_destroy(pool));
}

/* 2 MiB on `s` from `pool`, or from the current pool where pool is NULL. */
static tp_error_t alloc_2mib(void **p, tp_pool_t pool, tp_stream_t s) {
  return pool ? tp_malloc_from_pool_async(p, 2 * MiB, pool, s)
              : tp_malloc_async(p, 2 * MiB, s);
}

/* A block freed on the legacy stream while `blocking` is held, then asked
 * for by `taker` from the same pool: where the taker gets it, it must wait
 * behind the held work. `retagged`: the block was first freed on the held
 * stream and taken, pending, by the legacy stream. */
static void legacy_free_taken(tp_pool_t pool, tp_stream_t blocking,
                              tp_stream_t taker, bool retagged) {
  void *p = NULL, *q = NULL;
  gate_t g;
  if (retagged) {
    REQUIRE_OK(alloc_2mib(&p, pool, blocking));
    REQUIRE_OK(hold_stream(blocking, &g));
    CHECK_OK(tp_free_async(p, blocking));
    REQUIRE_OK(alloc_2mib(&p, pool, NULL));
  } else {
    REQUIRE_OK(alloc_2mib(&p, pool, NULL));
    CHECK_OK(tp_stream_synchronize(NULL));
    REQUIRE_OK(hold_stream(blocking, &g));
  }
  CHECK_OK(tp_free_async(p, NULL));
  tp_error_t asked = tp_stream_query(NULL);
  CHECK(asked == TP_SUCCESS || asked == TP_ERROR_NOT_READY);
  CHECK_OK(alloc_2mib(&q, pool, taker));
  if (q == p)
    CHECK_ERR(tp_stream_query(taker), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_free_async(q, taker));
  CHECK_OK(tp_device_synchronize());
}

/* A free on the legacy stream follows the work its device's blocking
 * streams queued before it (an action there waits for them): the block may
 * be handed to another stream only behind that work. On cuda, asking the
 * legacy stream itself (a query or synchronize of it) covers only its own
 * queue, and had the free taken as done while a blocking stream was held
 * (the fuzzer on the fake driver: another stream got the block and did not
 * wait). */
static void test_legacy_free_follows_blocking_streams(void) {
  tp_stream_t blocking = NULL, other = new_stream();
  CHECK_OK(tp_stream_create(&blocking, 0));
  REQUIRE(blocking && other);
  legacy_free_taken(NULL, blocking, other, false);
  stream_done(other);
  stream_done(blocking);
}

/* Under every reuse policy, a block freed on the legacy stream while a
 * blocking stream is held (freed there, or taken pending from the held
 * stream's free and so retagged to the legacy stream) goes to another
 * stream, blocking or not, only behind the held work. */
static void test_legacy_free_policies_and_takers(void) {
  static const char *names[2][2] = {
      {"non-blocking taker", "non-blocking taker, retagged"},
      {"blocking taker", "blocking taker, retagged"}};
  for (int policy = 0; policy < 8; policy++) {
    for (int taker_kind = 0; taker_kind < 2; taker_kind++) {
      for (int retagged = 0; retagged < 2; retagged++) {
        tp_stream_t blocking = NULL, taker = NULL;
        CHECK_OK(tp_stream_create(&blocking, 0));
        CHECK_OK(
            tp_stream_create(&taker, taker_kind ? 0 : TP_STREAM_NON_BLOCKING));
        tp_pool_t pool = new_pool(0, 0);
        REQUIRE(blocking && taker && pool);
        set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, policy & 1);
        set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                (policy >> 1) & 1);
        set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                (policy >> 2) & 1);
        char label[64];
        snprintf(label, sizeof label, "policy %d, %s", policy,
                 names[taker_kind][retagged]);
        check_context(label);
        legacy_free_taken(pool, blocking, taker, retagged);
        check_context(NULL);
        stream_done(taker);
        stream_done(blocking);
        CHECK_OK(tp_pool_destroy(pool));
      }
    }
  }
}

/* The mirror image: a free on a blocking stream follows the work queued
 * on the legacy stream before it (an action there would wait for it), so
 * the block may be handed to another stream only behind that work. On
 * cuda, asking the blocking stream itself (the core's poll, a query or a
 * synchronize of it) covers only its own queue, which the free left empty
 * (found by the fuzzer on the fake driver: with the legacy stream held,
 * another stream got the block and did not wait). */
static void test_blocking_free_follows_legacy(void) {
  tp_stream_t blocking = NULL, other = new_stream();
  CHECK_OK(tp_stream_create(&blocking, 0));
  REQUIRE(blocking && other);
  for (int query = 0; query < 2; query++) {
    void *p = NULL, *q = NULL;
    REQUIRE_OK(tp_malloc_async(&p, 2 * MiB, blocking));
    CHECK_OK(tp_stream_synchronize(blocking));
    gate_t g;
    REQUIRE_OK(hold_stream(NULL, &g));
    CHECK_OK(tp_free_async(p, blocking));
    /* Asked by the allocation's poll alone, or by a query first. */
    if (query) {
      tp_error_t asked = tp_stream_query(blocking);
      CHECK(asked == TP_SUCCESS || asked == TP_ERROR_NOT_READY);
    }
    CHECK_OK(tp_malloc_async(&q, 2 * MiB, other));
    if (q == p)
      CHECK_ERR(tp_stream_query(other), TP_ERROR_NOT_READY);
    release(&g);
    CHECK_OK(tp_free_async(q, other));
    CHECK_OK(tp_device_synchronize());
  }
  stream_done(other);
  stream_done(blocking);
}

/* Stream-ordered memory work refused at the call ("a range that wraps
 * around the end of the address space") queues nothing: the stream is not
 * faulted by it. */
static void test_memory_work_rejections(void) {
  tp_stream_t s = new_stream();
  REQUIRE(s != NULL);
  unsigned char buf[64];
  void *top = (void *)(uintptr_t)(UINTPTR_MAX - 15);
  CHECK_ERR(tp_memset_async(top, 0, 32, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memset_async(top, 0, SIZE_MAX, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(top, buf, 32, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(buf, top, 32, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memset_async(buf, 0, SIZE_MAX, s), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  /* Size 0 touches nothing, wherever it points. */
  CHECK_OK(tp_memset_async(top, 0, 0, s));
  CHECK_OK(tp_memcpy_async(top, top, 0, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_ERR(tp_launch_host_func(NULL, NULL, NULL), TP_ERROR_INVALID_VALUE);
  stream_done(s);
}

/* ========================================================================
 * Events
 * ======================================================================== */

typedef struct seen {
  atomic_int *watched;
  atomic_int value;
  atomic_int ran;
} seen_t;

static void look(void *arg) {
  seen_t *s = arg;
  atomic_store(&s->value, atomic_load(s->watched));
  atomic_store(&s->ran, 1);
}

/* Events as CUDA defines them: a query answers for the latest record; a
 * wait takes the record current at the call, not later ones; a destroy
 * with recorded work pending returns at once and leaves earlier waits in
 * force; a destroyed or foreign event is INVALID_VALUE everywhere. */
static void test_event_semantics(void) {
  tp_stream_t a = new_stream(), b = new_stream(), c = new_stream();
  tp_event_t ev = NULL;
  CHECK_OK(tp_event_create(&ev));
  REQUIRE(a && b && c && ev);
  gate_t g;

  check_context("a query answers for the latest record");
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_ERR(tp_event_query(ev), TP_ERROR_NOT_READY);
  CHECK_OK(tp_event_record(ev, b));
  CHECK_OK(check_poll_event(ev, 5000));
  CHECK_OK(tp_event_synchronize(ev));

  check_context("a wait takes the record current at the call");
  atomic_int a_done = 0;
  seen_t obs = {&a_done, 0, 0};
  CHECK_OK(tp_launch_host_func(a, check_set_flag, &a_done));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_wait_event(c, ev, 0));
  CHECK_OK(tp_event_record(ev, b)); /* later: must not shorten c's wait */
  CHECK_OK(tp_launch_host_func(c, look, &obs));
  check_sleep_ms(50);
  CHECK_EQ_INT(atomic_load(&obs.ran), 0);
  CHECK_ERR(tp_stream_query(c), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(c));
  CHECK_EQ_INT(atomic_load(&obs.ran), 1);
  CHECK_EQ_INT(atomic_load(&obs.value), 1);

  check_context("destroying an event whose work is pending");
  tp_event_t pend = NULL;
  REQUIRE_OK(tp_event_create(&pend));
  REQUIRE_OK(hold_stream(a, &g));
  atomic_int a_done2 = 0;
  seen_t obs2 = {&a_done2, 0, 0};
  CHECK_OK(tp_launch_host_func(a, check_set_flag, &a_done2));
  CHECK_OK(tp_event_record(pend, a));
  CHECK_OK(tp_stream_wait_event(c, pend, 0));
  CHECK_OK(tp_launch_host_func(c, look, &obs2));
  gate_opener_t o;
  REQUIRE(gate_open_after(&o, g, 3000));
  double t0 = check_now_s();
  CHECK_OK(tp_event_destroy(pend));
  double took = check_now_s() - t0;
  if (took > 1.5)
    CHECK_FAIL("tp_event_destroy waited %.2f s for the recorded work", took);
  check_sleep_ms(30);
  CHECK_EQ_INT(atomic_load(&obs2.ran), 0);
  release(&g); /* the opener's copy is its own to write */
  gate_opener_join(&o);
  CHECK_OK(tp_stream_synchronize(c));
  CHECK_EQ_INT(atomic_load(&obs2.ran), 1);
  CHECK_EQ_INT(atomic_load(&obs2.value), 1);

  check_context("a destroyed event");
  CHECK_ERR(tp_event_record(pend, a), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_query(pend), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_synchronize(pend), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_wait_event(a, pend, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_destroy(pend), TP_ERROR_INVALID_VALUE);

  check_context("a destroyed event, with new events made after it");
  /* A new event's memory often lands where the destroyed one's was; the
   * old handle must not name the new event. */
  for (int i = 0; i < 32; i++) {
    tp_event_t old = NULL, fresh = NULL;
    REQUIRE_OK(tp_event_create(&old));
    CHECK_OK(tp_event_destroy(old));
    REQUIRE_OK(tp_event_create(&fresh));
    CHECK(fresh != old);
    CHECK_ERR(tp_event_query(old), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_event_destroy(old), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_event_query(fresh));
    CHECK_OK(tp_event_destroy(fresh));
  }

  check_context("event handles tidepool never made");
  uint64_t fake[32];
  memset(fake, 0, sizeof fake);
  tp_event_t bad[] = {(tp_event_t)(void *)fake, (tp_event_t)(void *)&fake[3]};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_ERR(tp_event_record(bad[i], a), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_event_query(bad[i]), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_event_synchronize(bad[i]), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_stream_wait_event(a, bad[i], 0), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_event_destroy(bad[i]), TP_ERROR_INVALID_VALUE);
  }

  check_context("an event recorded on a stream destroyed since");
  tp_stream_t gone = new_stream();
  REQUIRE(gone != NULL);
  CHECK_OK(tp_launch_host_func(gone, check_set_flag, &a_done));
  CHECK_OK(tp_event_record(ev, gone));
  CHECK_OK(tp_stream_destroy(gone));
  CHECK_OK(tp_stream_wait_event(b, ev, 0));
  CHECK_OK(tp_event_synchronize(ev));
  CHECK_OK(tp_event_query(ev));
  CHECK_OK(tp_stream_synchronize(b));
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(a);
  stream_done(b);
  stream_done(c);
}

/* ========================================================================
 * Default and current pools, access, devices
 * ======================================================================== */

/* tp_mem_get/set_pool: unknown devices are INVALID_DEVICE; combinations
 * with no default pool and pools of another location or type are
 * INVALID_VALUE; a destroyed current pool of each location and type gives
 * way to that location's own default. */
static void test_current_pool_rules(void) {
  tp_location_t host = {TP_LOCATION_HOST, 0, 0};
  tp_location_t numa0 = {TP_LOCATION_HOST_NUMA, 0, 0};
  tp_location_t none = {TP_LOCATION_NONE, 0, 0};
  tp_location_t numa_cur = {TP_LOCATION_HOST_NUMA_CURRENT, 0, 0};
  tp_location_t far = dev_loc(ndevices);
  tp_pool_t dev0 = NULL, got = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&dev0, 0));

  check_context("unknown devices");
  CHECK_ERR(tp_mem_get_pool(&got, &far, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_get_pool(&got, &far, TP_ALLOCATION_MANAGED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &far, TP_ALLOCATION_MANAGED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_set_pool(&far, TP_ALLOCATION_PINNED, dev0),
            TP_ERROR_INVALID_DEVICE);

  check_context("combinations with no default pool");
  CHECK_ERR(tp_mem_get_default_pool(&got, &host, TP_ALLOCATION_MANAGED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &numa_cur, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, &numa_cur, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &none, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);

  check_context("a pool of another location or type");
  tp_pool_props_t props;
  tp_pool_t hp = NULL, np = NULL, mdev = NULL, mnone = NULL;
  props = props_of(TP_ALLOCATION_PINNED, host, 0, 0);
  CHECK_OK(tp_pool_create(&hp, &props));
  props = props_of(TP_ALLOCATION_PINNED, numa0, 0, 0);
  CHECK_OK(tp_pool_create(&np, &props));
  props = props_of(TP_ALLOCATION_MANAGED, dev_loc(0), 0, 0);
  CHECK_OK(tp_pool_create(&mdev, &props));
  props = props_of(TP_ALLOCATION_MANAGED, none, 0, 0);
  CHECK_OK(tp_pool_create(&mnone, &props));
  REQUIRE(hp && np && mdev && mnone);
  CHECK_ERR(tp_mem_set_pool(&numa0, TP_ALLOCATION_PINNED, hp),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, np),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, dev0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&none, TP_ALLOCATION_MANAGED, mdev),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(dev_loc(0).type == TP_LOCATION_DEVICE
                                ? &(tp_location_t){TP_LOCATION_DEVICE, 0, 0}
                                : &none,
                            TP_ALLOCATION_MANAGED, mnone),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&(tp_location_t){TP_LOCATION_DEVICE, 0, 0},
                            TP_ALLOCATION_PINNED, mdev),
            TP_ERROR_INVALID_VALUE);

  check_context("each destroyed current pool gives way to its default");
  struct {
    tp_location_t loc;
    tp_allocation_type_t type;
    tp_pool_t pool;
  } rows[] = {{numa0, TP_ALLOCATION_PINNED, np},
              {dev_loc(0), TP_ALLOCATION_MANAGED, mdev},
              {none, TP_ALLOCATION_MANAGED, mnone},
              {host, TP_ALLOCATION_PINNED, hp}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    tp_pool_t def = NULL;
    CHECK_OK(tp_mem_get_default_pool(&def, &rows[i].loc, rows[i].type));
    CHECK_OK(tp_mem_set_pool(&rows[i].loc, rows[i].type, rows[i].pool));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &rows[i].loc, rows[i].type));
    CHECK_EQ_PTR(got, rows[i].pool);
    CHECK_OK(tp_pool_destroy(rows[i].pool));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &rows[i].loc, rows[i].type));
    CHECK_EQ_PTR(got, def);
  }
  /* Making a managed pool current does not change what tp_malloc_async
   * uses: that is the pinned current pool of the stream's device. */
  check_context("tp_malloc_async uses the pinned current pool");
  tp_pool_t mine = new_pool(0, 0);
  props = props_of(TP_ALLOCATION_MANAGED, dev_loc(0), 0, 0);
  tp_pool_t m2 = NULL;
  CHECK_OK(tp_pool_create(&m2, &props));
  if (mine && m2) {
    CHECK_OK(tp_device_set_mem_pool(0, mine));
    CHECK_OK(tp_mem_set_pool(&(tp_location_t){TP_LOCATION_DEVICE, 0, 0},
                             TP_ALLOCATION_MANAGED, m2));
    void *p = NULL;
    CHECK_OK(tp_malloc_async(&p, 7777, NULL));
    CHECK_EQ_U64(used_of(mine), 7777);
    CHECK_EQ_U64(used_of(m2), 0);
    CHECK_OK(tp_free_async(p, NULL));
    CHECK_OK(tp_stream_synchronize(NULL));
    CHECK_OK(tp_pool_destroy(m2));
    CHECK_OK(tp_pool_destroy(mine));
  }
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, dev0);

  if (ndevices >= 2) {
    check_context("device 1's destroyed current pool gives way to its own");
    tp_pool_t d1 = NULL, p1 = new_pool(1, 0);
    CHECK_OK(tp_device_get_default_mem_pool(&d1, 1));
    if (p1) {
      CHECK_OK(tp_device_set_mem_pool(1, p1));
      CHECK_OK(tp_pool_destroy(p1));
      got = NULL;
      CHECK_OK(tp_device_get_mem_pool(&got, 1));
      CHECK_EQ_PTR(got, d1);
      got = NULL;
      CHECK_OK(tp_device_get_mem_pool(&got, 0));
      CHECK_EQ_PTR(got, dev0);
    }
  }
  check_context(NULL);
}

static tp_access_flags_t access_of(tp_pool_t pool, int device) {
  tp_access_flags_t f = (tp_access_flags_t)-1;
  tp_location_t loc = dev_loc(device);
  CHECK_OK(tp_pool_get_access(&f, pool, &loc));
  return f;
}

/* tp_pool_set_access: "All descriptors are checked before any is applied",
 * with each refusal's own code; a NULL list with count 0 is no error; the
 * own device keeps READ_WRITE through everything. */
static void test_access_checked_before_applied(void) {
  tp_pool_t pool = new_pool(0, 0);
  REQUIRE(pool != NULL);
  tp_access_flags_t f;
  check_context("a NULL list of no descriptors");
  CHECK_OK(tp_pool_set_access(pool, NULL, 0));

  check_context("unknown devices");
  tp_location_t far = dev_loc(ndevices), neg = dev_loc(-1);
  CHECK_ERR(tp_pool_get_access(&f, pool, &far), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&f, pool, &neg), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t d_far = {far, TP_ACCESS_READ_WRITE};
  tp_access_desc_t d_neg = {neg, TP_ACCESS_READ};
  CHECK_ERR(tp_pool_set_access(pool, &d_far, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_pool_set_access(pool, &d_neg, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);

  if (ndevices < 2) {
    printf("   (one device: the all-or-nothing lists need two)\n");
  } else {
    const tp_access_desc_t grant1 = {dev_loc(1), TP_ACCESS_READ_WRITE};
    const struct {
      tp_access_desc_t second;
      tp_error_t want;
      const char *what;
    } rows[] = {
        {{dev_loc(ndevices), TP_ACCESS_READ_WRITE},
         TP_ERROR_INVALID_DEVICE,
         "then an unknown device"},
        {{dev_loc(0), TP_ACCESS_READ},
         TP_ERROR_NOT_SUPPORTED,
         "then the own device read-only"},
        {{dev_loc(0), TP_ACCESS_NONE},
         TP_ERROR_INVALID_DEVICE,
         "then the own device none"},
        {{dev_loc(1), (tp_access_flags_t)2},
         TP_ERROR_INVALID_VALUE,
         "then unknown flags"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
      check_context(rows[i].what);
      tp_access_desc_t list[2] = {grant1, rows[i].second};
      CHECK_ERR(tp_pool_set_access(pool, list, 2), rows[i].want);
      CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_NONE);
      CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
    }
    check_context("a good list applies whole");
    tp_access_desc_t ok[2] = {{dev_loc(1), TP_ACCESS_READ},
                              {dev_loc(0), TP_ACCESS_READ_WRITE}};
    CHECK_OK(tp_pool_set_access(pool, ok, 2));
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_READ);
    CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
    /* And a bad list leaves a granted access as it was. */
    tp_access_desc_t revoke_bad[2] = {{dev_loc(1), TP_ACCESS_NONE},
                                      {dev_loc(ndevices), TP_ACCESS_NONE}};
    CHECK_ERR(tp_pool_set_access(pool, revoke_bad, 2), TP_ERROR_INVALID_DEVICE);
    CHECK_EQ_INT(access_of(pool, 1), TP_ACCESS_READ);
  }
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
}

/* tp_device_synchronize waits for the streams of the calling thread's
 * current device only: a held stream of another device does not hold it.
 * And the legacy stream NULL is the current device's. */
static void test_device_synchronize_scope(void) {
  if (ndevices < 2) {
    printf("   (needs two devices)\n");
    return;
  }
  REQUIRE_OK(tp_set_device(1));
  tp_stream_t s1 = new_stream();
  REQUIRE_OK(tp_set_device(0));
  REQUIRE(s1 != NULL);
  gate_t g;
  REQUIRE_OK(hold_stream(s1, &g));
  gate_opener_t o;
  REQUIRE(gate_open_after(&o, g, 3000));
  double t0 = check_now_s();
  CHECK_OK(tp_device_synchronize());
  double took = check_now_s() - t0;
  if (took > 1.5)
    CHECK_FAIL("device 0's synchronize waited %.2f s for device 1", took);
  CHECK_ERR(tp_stream_query(s1), TP_ERROR_NOT_READY);
  /* The legacy stream of device 0 does not wait for device 1 either. */
  CHECK_OK(tp_stream_synchronize(NULL));
  release(&g); /* the opener's copy is its own to write */
  gate_opener_join(&o);
  REQUIRE_OK(tp_set_device(1));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_query(s1));
  CHECK_OK(tp_stream_destroy(s1));
  REQUIRE_OK(tp_set_device(0));
}

/* ========================================================================
 * Capture and graph memory: the bad-argument rows not pinned elsewhere
 * ======================================================================== */

static void test_capture_and_graph_memory_errors(void) {
  tp_stream_t s = new_stream();
  REQUIRE(s != NULL);
  check_context("end_capture failures leave *graph NULL");
  tp_graph_t graph = (tp_graph_t)(uintptr_t)0x5000;
  CHECK_ERR(tp_stream_end_capture(s, &graph), TP_ERROR_ILLEGAL_STATE);
  CHECK_EQ_PTR(graph, NULL);
  graph = (tp_graph_t)(uintptr_t)0x5000;
  CHECK_ERR(tp_stream_end_capture(NULL, &graph), TP_ERROR_ILLEGAL_STATE);
  CHECK_EQ_PTR(graph, NULL);
  tp_capture_status_t st = TP_CAPTURE_STATUS_INVALIDATED;
  CHECK_OK(tp_stream_is_capturing(s, &st));
  CHECK_EQ_INT(st, TP_CAPTURE_STATUS_NONE);

  check_context("graph memory attributes");
  uint64_t v = 0;
  CHECK_ERR(tp_device_set_graph_mem_attribute(
                0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_graph_mem_attribute(
                0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_graph_mem_attribute(0, (tp_graph_mem_attr_t)4, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_graph_mem_attribute(0, (tp_graph_mem_attr_t)-1, &v),
            TP_ERROR_INVALID_VALUE);
  v = UINT64_MAX;
  CHECK_ERR(tp_device_set_graph_mem_attribute(
                0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);
  v = 0;
  CHECK_OK(tp_device_set_graph_mem_attribute(
      0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &v));
  CHECK_OK(tp_device_set_graph_mem_attribute(0, TP_GRAPH_MEM_ATTR_USED_MEM_HIGH,
                                             &v));
  CHECK_ERR(tp_device_set_graph_mem_attribute(
                ndevices, TP_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_graph_mem_attribute(
                -1, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &v),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_graph_mem_trim(ndevices), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(tp_device_graph_mem_trim(0));
  check_context(NULL);
  stream_done(s);
}

/* ========================================================================
 * IPC: the rejections of pool import and pointer export
 * ======================================================================== */

static void test_ipc_rejections(void) {
  tp_pool_t imported = (tp_pool_t)(uintptr_t)0x5000;
  check_context("import: TP_HANDLE_FABRIC is NOT_SUPPORTED");
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)3, TP_HANDLE_FABRIC, 0),
            TP_ERROR_NOT_SUPPORTED);
  check_context("import: descriptors of no exported pool");
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (CHECK(devnull >= 0)) {
    double t0 = check_now_s();
    CHECK_ERR(tp_pool_import_from_shareable_handle(
                  &imported, (void *)(uintptr_t)devnull, TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
    CHECK(check_now_s() - t0 < 5.0);
    close(devnull);
    /* Now a closed descriptor. */
    CHECK_ERR(tp_pool_import_from_shareable_handle(
                  &imported, (void *)(uintptr_t)devnull, TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
  }
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(intptr_t)-1, TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);

  check_context("export_pointer: only the start of a live allocation");
  tp_pool_props_t props =
      props_of(TP_ALLOCATION_PINNED, dev_loc(0), TP_HANDLE_POSIX_FD, 0);
  tp_pool_t ipc = NULL;
  tp_stream_t s = new_stream();
  REQUIRE(s != NULL);
  if (CHECK_OK(tp_pool_create(&ipc, &props))) {
    void *p = NULL;
    tp_pool_ptr_export_data_t rec, rec2;
    REQUIRE_OK(tp_malloc_from_pool_async(&p, 64 * KiB, ipc, s));
    CHECK_OK(tp_pool_export_pointer(&rec, p));
    CHECK_OK(tp_pool_export_pointer(&rec2, p));
    CHECK(memcmp(&rec, &rec2, sizeof rec) == 0); /* "the same bytes" */
    gate_t g;
    REQUIRE_OK(hold_stream(s, &g));
    CHECK_OK(tp_free_async(p, s));
    /* Freed, though the free is still pending: no longer live. */
    CHECK_ERR(tp_pool_export_pointer(&rec, p), TP_ERROR_INVALID_VALUE);
    release(&g);
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_ERR(tp_pool_export_pointer(&rec, p), TP_ERROR_INVALID_VALUE);
    int fd = -1;
    CHECK_OK(tp_pool_destroy(ipc));
    CHECK_ERR(
        tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_POSIX_FD, 0),
        TP_ERROR_INVALID_VALUE);
    if (fd >= 0)
      close(fd);
  }
  check_context(NULL);
  stream_done(s);
}

/* ========================================================================
 * Races
 * ======================================================================== */

/* 1. One thread makes and destroys streams, allocating from a pool across
 *    them and leaving frees queued on streams it destroys; another reads
 *    every attribute of the pool meanwhile. One thread does all the
 *    allocating, so the header makes USED_MEM_HIGH exact: a high read after
 *    a current figure is never below it, and ends at the worker's peak. */

#define CHURN_LIMIT (24 * MiB) /* the worker's live bytes never exceed it */

typedef struct churn {
  tp_pool_t pool;
  atomic_int stop;
  check_rng rng;
  uint64_t peak; /* the worker's own count of the exact peak */
  long streams, reads;
} churn_t;

static void *churn_worker(void *arg) {
  churn_t *c = arg;
  enum { LIVE = 16 };
  void *ptr[LIVE] = {0};
  size_t size[LIVE] = {0};
  uint64_t used = 0;
  tp_stream_t keep = NULL; /* frees left over when a stream went */
  if (!CHECK_OK(tp_stream_create(&keep, TP_STREAM_NON_BLOCKING)))
    return NULL;
  while (!atomic_load(&c->stop)) {
    tp_stream_t s = NULL;
    if (!CHECK_OK(tp_stream_create(&s, rng_chance(&c->rng, 50)
                                           ? TP_STREAM_NON_BLOCKING
                                           : TP_STREAM_DEFAULT)))
      break;
    int ops = (int)rng_range(&c->rng, 1, 24);
    bool wrote = false;
    for (int i = 0; i < ops; i++) {
      int k = (int)rng_below(&c->rng, LIVE);
      if (ptr[k]) {
        if (!CHECK_OK(tp_free_async(ptr[k], s)))
          break;
        used -= size[k];
        ptr[k] = NULL;
        continue;
      }
      size_t sz = rng_chance(&c->rng, 70)
                      ? (size_t)rng_range(&c->rng, 1, 64 * KiB)
                      : (size_t)rng_range(&c->rng, 64 * KiB, 3 * MiB);
      if (used + sz > CHURN_LIMIT)
        continue;
      if (!CHECK_OK(tp_malloc_from_pool_async(&ptr[k], sz, c->pool, s)))
        break;
      size[k] = sz;
      used += sz;
      if (used > c->peak)
        c->peak = used;
      if (rng_chance(&c->rng, 20)) {
        CHECK_OK(tp_memset_async(ptr[k], 0x5A, sz < 4096 ? sz : 4096, s));
        wrote = true;
      }
    }
    /* Destroyed with its frees still queued, now and then synchronized. A
     * stream that wrote is synchronized: a later stream frees what it
     * wrote, and the free must come after the write (the caller's duty). */
    if (wrote || rng_chance(&c->rng, 20))
      CHECK_OK(tp_stream_synchronize(s));
    CHECK_OK(tp_stream_destroy(s));
    c->streams++;
  }
  for (int k = 0; k < LIVE; k++)
    if (ptr[k])
      CHECK_OK(tp_free_async(ptr[k], keep));
  CHECK_OK(tp_stream_synchronize(keep));
  CHECK_OK(tp_stream_destroy(keep));
  return NULL;
}

static void *churn_reader(void *arg) {
  churn_t *c = arg;
  int reported = 0;
  while (!atomic_load(&c->stop)) {
    uint64_t cur = 0, high = 0;
    tp_error_t e1 =
        tp_pool_get_attribute(c->pool, TP_POOL_ATTR_USED_MEM_CURRENT, &cur);
    tp_error_t e2 =
        tp_pool_get_attribute(c->pool, TP_POOL_ATTR_USED_MEM_HIGH, &high);
    if ((e1 != TP_SUCCESS || e2 != TP_SUCCESS || high < cur ||
         cur > CHURN_LIMIT) &&
        reported++ < 3)
      CHECK_FAIL("used %" PRIu64 " high %" PRIu64 " (%s, %s)", cur, high,
                 tp_error_name(e1), tp_error_name(e2));
    for (size_t i = 0; i < NATTRS; i++) {
      uint64_t v = 0;
      tp_error_t e = tp_pool_get_attribute(c->pool, all_attrs[i].attr, &v);
      if (e != TP_SUCCESS && reported++ < 3)
        CHECK_FAIL("attribute %d: %s", (int)all_attrs[i].attr,
                   tp_error_name(e));
    }
    tp_access_flags_t f = TP_ACCESS_NONE;
    tp_location_t loc = dev_loc(0);
    if (tp_pool_get_access(&f, c->pool, &loc) != TP_SUCCESS ||
        f != TP_ACCESS_READ_WRITE) {
      if (reported++ < 3)
        CHECK_FAIL("own device access %d", (int)f);
    }
    c->reads++;
  }
  return NULL;
}

static void test_race_stats_vs_stream_churn(void) {
  churn_t c;
  memset(&c, 0, sizeof c);
  c.pool = new_pool(0, 0);
  c.rng.state = seed ^ 0x1111;
  REQUIRE(c.pool != NULL);
  pthread_t w, r;
  REQUIRE(pthread_create(&w, NULL, churn_worker, &c) == 0);
  REQUIRE(pthread_create(&r, NULL, churn_reader, &c) == 0);
  check_sleep_ms(1500);
  atomic_store(&c.stop, 1);
  pthread_join(w, NULL);
  pthread_join(r, NULL);
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(used_of(c.pool), 0);
  CHECK_EQ_U64(attr64(c.pool, TP_POOL_ATTR_USED_MEM_HIGH), c.peak);
  CHECK_OK(tp_pool_trim_to(c.pool, 0));
  CHECK_EQ_U64(reserved_of(c.pool), 0);
  CHECK_OK(tp_pool_destroy(c.pool));
  printf("   %ld streams churned, %ld rounds of reads, peak %" PRIu64 "\n",
         c.streams, c.reads, c.peak);
}

/* 2. tp_pool_trim_to and release-threshold changes on one thread, while
 *    others read blocks through stream work queued before the block's free
 *    and held behind a gate: "only frees already known to have completed
 *    count as free", so a trim never takes memory that queued work still
 *    reads, nor a live block's. */

typedef struct trim_race {
  tp_pool_t pool;
  atomic_int stop;
  long trims;
  atomic_long rounds[2]; /* read by the trimming thread as they go */
} trim_race_t;

typedef struct trim_worker {
  trim_race_t *t;
  int index;
  check_rng rng;
} trim_worker_t;

static void *trim_reader_main(void *arg) {
  trim_worker_t *w = arg;
  trim_race_t *t = w->t;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  enum { OUT = 256 };
  unsigned char *out = malloc(OUT);
  /* The read goes to device memory of the default pool: on cuda a copy to
   * pageable host memory returns only once done, which a held stream
   * would never let it. */
  void *side = NULL;
  if (!CHECK_OK(tp_malloc_async(&side, OUT, s)))
    side = NULL;
  int reported = 0;
  while (out && side && !atomic_load(&t->stop)) {
    size_t size = rng_chance(&w->rng, 50)
                      ? (size_t)rng_range(&w->rng, OUT, 64 * KiB)
                      : (size_t)rng_range(&w->rng, 64 * KiB, 5 * MiB);
    unsigned char v = (unsigned char)rng_range(&w->rng, 1, 255);
    void *p = NULL;
    if (!CHECK_OK(tp_malloc_from_pool_async(&p, size, t->pool, s)))
      break;
    CHECK_OK(tp_memset_async(p, v, size, s));
    gate_t g;
    if (!CHECK_OK(hold_stream(s, &g)))
      break;
    memset(out, 0, OUT);
    /* Read the block's last bytes after the gate, then free it: the read
     * is queued before the free, behind the held stream. */
    CHECK_OK(tp_memcpy_async(side, (char *)p + size - OUT, OUT, s));
    CHECK_OK(tp_free_async(p, s));
    check_sleep_us((long)rng_below(&w->rng, 500));
    release(&g);
    CHECK_OK(tp_memcpy_async(out, side, OUT, s));
    tp_error_t err = tp_stream_synchronize(s);
    if ((err != TP_SUCCESS || !all_bytes(out, OUT, v)) && reported++ < 3)
      CHECK_FAIL("worker %d: read back %s, byte 0x%02x, expected 0x%02x",
                 w->index, tp_error_name(err), out[0], v);
    atomic_fetch_add(&t->rounds[w->index], 1);
  }
  free(out);
  if (side)
    CHECK_OK(tp_free_async(side, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_race_trim_vs_pending_reads(void) {
  trim_race_t t;
  memset(&t, 0, sizeof t);
  t.pool = new_pool(0, 0);
  REQUIRE(t.pool != NULL);
  tp_stream_t mine = new_stream();
  REQUIRE(mine != NULL);
  trim_worker_t w[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    w[i].t = &t;
    w[i].index = i;
    w[i].rng.state = seed ^ (0x2222u + (unsigned)i);
    REQUIRE(pthread_create(&th[i], NULL, trim_reader_main, &w[i]) == 0);
  }
  /* This thread also keeps a live block of its own, rewritten and checked
   * between trims. */
  void *live = NULL;
  unsigned char got[64];
  CHECK_OK(tp_malloc_from_pool_async(&live, 3 * MiB, t.pool, mine));
  check_rng rng = {seed ^ 0x2233};
  /* 1.5 s, and on a slow machine until each reader has held a read. */
  double start = check_now_s();
  int reported = 0;
  for (;;) {
    double now = check_now_s();
    bool both = atomic_load(&t.rounds[0]) > 0 && atomic_load(&t.rounds[1]) > 0;
    if (now > start + 60 || (now > start + 1.5 && both))
      break;
    tp_error_t err = tp_pool_trim_to(t.pool, (size_t)rng_below(&rng, 8 * MiB));
    if (err != TP_SUCCESS && reported++ < 3)
      CHECK_FAIL("tp_pool_trim_to: %s", tp_error_name(err));
    uint64_t th_v = rng_chance(&rng, 50) ? 0 : UINT64_MAX;
    CHECK_OK(
        tp_pool_set_attribute(t.pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &th_v));
    if (live && rng_chance(&rng, 10)) {
      unsigned char v = (unsigned char)rng_range(&rng, 1, 255);
      CHECK_OK(tp_memset_async(live, v, 3 * MiB, mine));
      CHECK_OK(tp_pool_trim_to(t.pool, 0));
      CHECK_OK(
          tp_memcpy_async(got, (char *)live + 3 * MiB - 64, sizeof got, mine));
      CHECK_OK(tp_stream_synchronize(mine));
      if (!all_bytes(got, sizeof got, v) && reported++ < 3)
        CHECK_FAIL("the live block reads 0x%02x, expected 0x%02x", got[0], v);
    }
    t.trims++;
    sched_yield();
  }
  atomic_store(&t.stop, 1);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  if (live)
    CHECK_OK(tp_free_async(live, mine));
  CHECK_OK(tp_stream_synchronize(mine));
  CHECK_EQ_U64(used_of(t.pool), 0);
  CHECK_OK(tp_pool_trim_to(t.pool, 0));
  CHECK_EQ_U64(reserved_of(t.pool), 0);
  CHECK(atomic_load(&t.rounds[0]) > 0 && atomic_load(&t.rounds[1]) > 0);
  printf("   %ld trims, %ld + %ld held reads\n", t.trims,
         atomic_load(&t.rounds[0]), atomic_load(&t.rounds[1]));
  stream_done(mine);
  CHECK_OK(tp_pool_destroy(t.pool));
}

/* 3. Two threads free the same blocks at once, each on its own stream:
 *    "a pointer already freed" is refused and "a rejected free changes
 *    nothing", so each block is freed exactly once and "used" ends at 0. */

#define DF_BLOCKS 48

typedef struct double_free {
  tp_pool_t pool;
  pthread_barrier_t barrier;
  void *blocks[DF_BLOCKS];
  atomic_int ok[DF_BLOCKS];
  atomic_int stop;
  atomic_int odd; /* answers other than SUCCESS and INVALID_VALUE */
} double_free_t;

typedef struct df_worker {
  double_free_t *d;
  int index;
  check_rng rng;
} df_worker_t;

static void *df_main(void *arg) {
  df_worker_t *w = arg;
  double_free_t *d = w->d;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  int order[DF_BLOCKS];
  for (;;) {
    pthread_barrier_wait(&d->barrier); /* the blocks are ready */
    if (atomic_load(&d->stop))
      break;
    for (int i = 0; i < DF_BLOCKS; i++)
      order[i] = i;
    for (int i = DF_BLOCKS - 1; i > 0; i--) {
      int j = (int)rng_below(&w->rng, (uint64_t)i + 1);
      int tmp = order[i];
      order[i] = order[j];
      order[j] = tmp;
    }
    for (int i = 0; i < DF_BLOCKS; i++) {
      int k = order[i];
      tp_error_t err = tp_free_async(d->blocks[k], s);
      if (err == TP_SUCCESS)
        atomic_fetch_add(&d->ok[k], 1);
      else if (err != TP_ERROR_INVALID_VALUE)
        atomic_fetch_add(&d->odd, 1);
    }
    CHECK_OK(tp_stream_synchronize(s));
    pthread_barrier_wait(&d->barrier); /* the round is over */
  }
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_race_double_free(void) {
  double_free_t d;
  memset(&d, 0, sizeof d);
  d.pool = new_pool(0, 0);
  tp_stream_t s = new_stream();
  REQUIRE(d.pool && s);
  REQUIRE(pthread_barrier_init(&d.barrier, NULL, 3) == 0);
  df_worker_t w[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    w[i].d = &d;
    w[i].index = i;
    w[i].rng.state = seed ^ (0x3333u + (unsigned)i);
    REQUIRE(pthread_create(&th[i], NULL, df_main, &w[i]) == 0);
  }
  check_rng rng = {seed ^ 0x3344};
  long rounds = 0;
  int reported = 0;
  double end = check_now_s() + 1.0;
  for (;;) {
    int more = check_now_s() < end;
    for (int k = 0; more && k < DF_BLOCKS; k++) {
      size_t size = rng_chance(&rng, 80)
                        ? (size_t)rng_range(&rng, 1, 16 * KiB)
                        : (size_t)rng_range(&rng, 16 * KiB, 2 * MiB);
      atomic_store(&d.ok[k], 0);
      if (!CHECK_OK(tp_malloc_from_pool_async(&d.blocks[k], size, d.pool, s)))
        more = 0;
    }
    if (more)
      CHECK_OK(tp_stream_synchronize(s));
    else
      atomic_store(&d.stop, 1);
    pthread_barrier_wait(&d.barrier);
    if (!more)
      break;
    pthread_barrier_wait(&d.barrier);
    for (int k = 0; k < DF_BLOCKS; k++) {
      int n = atomic_load(&d.ok[k]);
      if (n != 1 && reported++ < 3)
        CHECK_FAIL("round %ld: block %d freed %d times", rounds, k, n);
    }
    uint64_t used = used_of(d.pool);
    if (used != 0 && reported++ < 3)
      CHECK_FAIL("round %ld: used %" PRIu64 " after every block was freed",
                 rounds, used);
    rounds++;
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&d.barrier);
  CHECK_EQ_INT(atomic_load(&d.odd), 0);
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(used_of(d.pool), 0);
  CHECK_OK(tp_pool_trim_to(d.pool, 0));
  CHECK_EQ_U64(reserved_of(d.pool), 0);
  printf("   %ld rounds of %d blocks freed twice at once\n", rounds, DF_BLOCKS);
  stream_done(s);
  CHECK_OK(tp_pool_destroy(d.pool));
}

/* 4. A watermark reset racing the growth it should count. Whichever comes
 *    first, once both have returned the high is at least the current
 *    figure: a reset that came first is followed by the growth's raise, one
 *    that came second sets the high to the grown figure. For USED_MEM_HIGH
 *    the header says so outright ("never below the current figure when
 *    read"); for RESERVED_MEM_HIGH it is what a high watermark since the
 *    last reset means (CUDA's cudaMemPoolAttrReservedMemHigh). */

typedef struct reset_race {
  tp_pool_t pool;
  pthread_barrier_t barrier;
  atomic_int stop;
  void *block;
  size_t size;
} reset_race_t;

static void *grower_main(void *arg) {
  reset_race_t *r = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  for (;;) {
    pthread_barrier_wait(&r->barrier);
    if (atomic_load(&r->stop))
      break;
    r->block = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&r->block, r->size, r->pool, s));
    pthread_barrier_wait(&r->barrier);
    pthread_barrier_wait(&r->barrier); /* the figures have been read */
    if (r->block)
      CHECK_OK(tp_free_async(r->block, s));
    CHECK_OK(tp_stream_synchronize(s)); /* threshold 0: back to nothing */
  }
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void *resetter_main(void *arg) {
  reset_race_t *r = arg;
  for (;;) {
    pthread_barrier_wait(&r->barrier);
    if (atomic_load(&r->stop))
      break;
    uint64_t zero = 0;
    CHECK_OK(
        tp_pool_set_attribute(r->pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero));
    zero = 0;
    CHECK_OK(tp_pool_set_attribute(r->pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero));
    pthread_barrier_wait(&r->barrier);
    pthread_barrier_wait(&r->barrier);
  }
  return NULL;
}

static void test_race_watermark_reset_vs_growth(void) {
  reset_race_t r;
  memset(&r, 0, sizeof r);
  r.pool = new_pool(0, 0);
  REQUIRE(r.pool != NULL);
  REQUIRE(pthread_barrier_init(&r.barrier, NULL, 3) == 0);
  pthread_t g, z;
  REQUIRE(pthread_create(&g, NULL, grower_main, &r) == 0);
  REQUIRE(pthread_create(&z, NULL, resetter_main, &r) == 0);
  check_rng rng = {seed ^ 0x4444};
  long rounds = 0, reserved_below = 0, used_below = 0;
  uint64_t first_cur = 0, first_high = 0;
  double end = check_now_s() + 1.5;
  for (;;) {
    int more = check_now_s() < end;
    r.size = (size_t)rng_range(&rng, 2, 6) * MiB - rng_below(&rng, 4096);
    if (!more)
      atomic_store(&r.stop, 1);
    pthread_barrier_wait(&r.barrier); /* grow and reset at once */
    if (!more)
      break;
    pthread_barrier_wait(&r.barrier); /* both returned */
    uint64_t cur = reserved_of(r.pool);
    uint64_t high = attr64(r.pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
    if (high < cur && reserved_below++ == 0) {
      first_cur = cur;
      first_high = high;
    }
    uint64_t ucur = used_of(r.pool);
    if (attr64(r.pool, TP_POOL_ATTR_USED_MEM_HIGH) < ucur)
      used_below++;
    pthread_barrier_wait(&r.barrier); /* the grower frees */
    rounds++;
  }
  pthread_join(g, NULL);
  pthread_join(z, NULL);
  pthread_barrier_destroy(&r.barrier);
  printf("   %ld rounds; RESERVED_MEM_HIGH below current in %ld\n", rounds,
         reserved_below);
  CHECK_EQ_INT(used_below, 0);
  /* A reset that raced a growth must not leave the high below the total:
   * the reset once stored the total it had loaded, losing the raise of a
   * growth that came between its load and its store. */
  if (reserved_below)
    CHECK_FAIL("RESERVED_MEM_HIGH %" PRIu64 " < RESERVED_MEM_CURRENT %" PRIu64
               " after a reset raced a growth (%ld of %ld rounds)",
               first_high, first_cur, reserved_below, rounds);
  CHECK_OK(tp_pool_destroy(r.pool));
}

/* A pool made current by one thread while another destroys it: the
 * destroy's "a pool that was current for its location stops being so"
 * holds whichever call comes first. The set once checked the pool live,
 * lost the processor to the whole destroy, then stored it as current: the
 * getters named a destroyed pool while allocations went to the default. */
typedef struct set_race {
  pthread_barrier_t barrier;
  tp_pool_t pool;
  atomic_int stop;
} set_race_t;

static void *setter_main(void *arg) {
  set_race_t *r = arg;
  for (;;) {
    pthread_barrier_wait(&r->barrier);
    if (atomic_load(&r->stop))
      return NULL;
    tp_error_t err = tp_device_set_mem_pool(0, r->pool);
    if (err != TP_SUCCESS && err != TP_ERROR_INVALID_VALUE)
      CHECK_FAIL("tp_device_set_mem_pool: %s", tp_error_name(err));
    pthread_barrier_wait(&r->barrier);
  }
}

static void test_race_set_current_vs_destroy(void) {
  set_race_t r;
  memset(&r, 0, sizeof r);
  REQUIRE(pthread_barrier_init(&r.barrier, NULL, 2) == 0);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, setter_main, &r) == 0);
  long rounds = 0, stale = 0;
  double end = check_now_s() + 1.0;
  for (;;) {
    int more = check_now_s() < end;
    r.pool = more ? new_pool(0, 0) : NULL;
    if (!more)
      atomic_store(&r.stop, 1);
    pthread_barrier_wait(&r.barrier); /* set and destroy at once */
    if (!more)
      break;
    CHECK_OK(tp_pool_destroy(r.pool));
    pthread_barrier_wait(&r.barrier); /* both returned */
    tp_pool_t cur = NULL;
    uint64_t v;
    CHECK_OK(tp_device_get_mem_pool(&cur, 0));
    if (tp_pool_get_attribute(cur, TP_POOL_ATTR_USED_MEM_CURRENT, &v) !=
        TP_SUCCESS)
      stale++;
    rounds++;
  }
  pthread_join(t, NULL);
  pthread_barrier_destroy(&r.barrier);
  printf("   %ld rounds\n", rounds);
  if (stale)
    CHECK_FAIL("the current pool was a destroyed one after %ld of %ld rounds",
               stale, rounds);
  tp_pool_t def = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  CHECK_OK(tp_device_set_mem_pool(0, def));
}

/* ========================================================================
 * main
 * ======================================================================== */

int main(int argc, char **argv) {
  /* Two emulated devices unless the caller chose otherwise, so that the
   * device-crossing promises are attacked too (host platform only). */
  setenv("TIDEPOOL_HOST_DEVICES", "2", 0);
  const char *env = getenv("TP_PROMISES_SEED");
  seed = DEFAULT_SEED;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] >= '0' && argv[i][0] <= '9')
      seed = strtoull(argv[i], NULL, 0);
    else
      only = argv[i];
  }
  if (env && *env)
    seed = strtoull(env, NULL, 0);
  const char *platform = tp_platform_name();
  printf("test_promises on %s, seed 0x%" PRIx64 "\n",
         platform ? platform : "(none)", seed);
  REQUIRE_EXIT(platform != NULL);
  REQUIRE_OK_EXIT(tp_get_device_count(&ndevices));
  printf("%d device(s)\n", ndevices);
  struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
#define T(fn) {#fn, fn}
      T(test_pool_create_rejects),
      T(test_default_pools_refuse_destroy),
      T(test_destroyed_pool_handles_not_recycled),
      T(test_attribute_values_and_widths),
      T(test_watermark_resets),
      T(test_threshold_with_pending_frees),
      T(test_trim_figures),
      T(test_full_pool_moves_free_chunks),
      T(test_later_free_keeps_earlier_usable),
      T(test_malloc_edges),
      T(test_free_rejections),
      T(test_dead_and_foreign_streams),
      T(test_stream_destroyed_with_pending_free),
      T(test_legacy_free_follows_blocking_streams),
      T(test_legacy_free_policies_and_takers),
      T(test_blocking_free_follows_legacy),
      T(test_memory_work_rejections),
      T(test_event_semantics),
      T(test_event_reports_fault),
      T(test_destroyed_stream_fault_reported),
      T(test_event_handles),
      T(test_stream_handles),
      T(test_fork_child_refused),
      T(test_current_pool_rules),
      T(test_access_checked_before_applied),
      T(test_device_synchronize_scope),
      T(test_capture_and_graph_memory_errors),
      T(test_ipc_rejections),
      T(test_race_stats_vs_stream_churn),
      T(test_race_trim_vs_pending_reads),
      T(test_race_double_free),
      T(test_race_watermark_reset_vs_growth),
      T(test_race_set_current_vs_destroy),
#undef T
  };
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (!only || strcmp(only, tests[i].name) == 0)
      check_run_(tests[i].name, tests[i].fn);
  return check_done();
}
