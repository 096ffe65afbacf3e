/* Tests that need two devices: peer access to a pool granted read-write and
 * read-only, and revoked, for blocks mapped before and after each change,
 * used by copies, memsets and host functions on the peer's streams, with
 * either device current; default and current pools per device, and
 * trimming one device's pool; allocation on one device's stream from the
 * other device's pool; reuse across devices only behind the dependencies
 * the policies allow. Skipped (check.h's skip code) with one device; the
 * host platform has two with TIDEPOOL_HOST_DEVICES=2, which CI sets for a
 * second run of the suite. */
#include "check.h"

#define MiB ((size_t)1 << 20)

static tp_pool_t pool0;
static tp_stream_t s0, s1; /* on device 0 and on device 1 */

static uint64_t attr64(tp_pool_t pool, tp_pool_attr_t a) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, a, &v));
  return v;
}

static void set_int(tp_pool_t pool, tp_pool_attr_t a, int v) {
  CHECK_OK(tp_pool_set_attribute(pool, a, &v));
}

static void set64(tp_pool_t pool, tp_pool_attr_t a, uint64_t v) {
  CHECK_OK(tp_pool_set_attribute(pool, a, &v));
}

static tp_access_flags_t access_of(tp_pool_t pool, int device) {
  tp_access_flags_t f = TP_ACCESS_NONE;
  tp_location_t loc = {TP_LOCATION_DEVICE, device, 0};
  CHECK_OK(tp_pool_get_access(&f, pool, &loc));
  return f;
}

static void grant(tp_pool_t pool, int device, tp_access_flags_t f) {
  tp_access_desc_t d = {{TP_LOCATION_DEVICE, device, 0}, f};
  CHECK_OK(tp_pool_set_access(pool, &d, 1));
}

/* Copies `size` bytes of device memory at `p` to the host through stream
 * `s` (whose device may read it) and checks them against `value`. */
static void expect_bytes(const void *p, size_t size, unsigned char value,
                         tp_stream_t s) {
  unsigned char *host = malloc(size);
  REQUIRE(host != NULL);
  memset(host, (unsigned char)~value, size);
  CHECK_OK(tp_memcpy_async(host, p, size, s));
  CHECK_OK(tp_stream_synchronize(s));
  size_t bad = 0;
  for (size_t i = 0; i < size; i++)
    bad += host[i] != value;
  CHECK_EQ_U64(bad, 0);
  free(host);
}

/* Device 1 reads `src` (device 0's pool) into its own pool, with each device
 * current in turn: the copy must not depend on the thread's device. A host
 * function queued after each copy on the same stream runs after it. */
static void peer_reads(const void *src, size_t size, unsigned char value) {
  tp_pool_t pool1 = NULL;
  REQUIRE_OK(tp_device_get_mem_pool(&pool1, 1));
  for (int current = 0; current < 2; current++) {
    CHECK_OK(tp_set_device(current));
    void *dst = NULL;
    REQUIRE_OK(tp_malloc_from_pool_async(&dst, size, pool1, s1));
    CHECK_OK(tp_memset_async(dst, 0, size, s1));
    CHECK_OK(tp_memcpy_async(dst, src, size, s1));
    atomic_int ran = 0;
    CHECK_OK(tp_launch_host_func(s1, check_set_flag, &ran));
    CHECK_OK(tp_stream_synchronize(s1));
    CHECK_EQ_INT(atomic_load(&ran), 1);
    expect_bytes(dst, size, value, s1);
    CHECK_OK(tp_free_async(dst, s1));
  }
  CHECK_OK(tp_set_device(0));
  CHECK_OK(tp_stream_synchronize(s1));
}

static void test_peer_access(void) {
  const size_t size = 3 * MiB; /* two chunks, one shared with the next */
  CHECK_EQ_INT(access_of(pool0, 0), TP_ACCESS_READ_WRITE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_NONE);
  void *before = NULL, *after = NULL, *later = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&before, size, pool0, s0));
  CHECK_OK(tp_memset_async(before, 0x11, size, s0));
  CHECK_OK(tp_stream_synchronize(s0));

  /* Read-write: the grant covers memory mapped before it and after it. */
  grant(pool0, 1, TP_ACCESS_READ_WRITE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_READ_WRITE);
  uint64_t maps = attr64(pool0, TP_POOL_ATTR_CHUNK_MAPS);
  REQUIRE_OK(tp_malloc_from_pool_async(&after, size, pool0, s0));
  CHECK(attr64(pool0, TP_POOL_ATTR_CHUNK_MAPS) > maps);
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_memset_async(before, 0x22, size, s1));
  CHECK_OK(tp_memset_async(after, 0x33, size, s1));
  atomic_int ran = 0;
  CHECK_OK(tp_launch_host_func(s1, check_set_flag, &ran));
  CHECK_OK(tp_stream_synchronize(s1));
  CHECK_EQ_INT(atomic_load(&ran), 1);
  expect_bytes(before, size, 0x22, s0);
  expect_bytes(after, size, 0x33, s0);
  expect_bytes(after, size, 0x33, s1);
  /* A copy inside device 0's pool, queued on device 1's stream. */
  CHECK_OK(tp_memcpy_async(after, before, MiB, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  expect_bytes(after, MiB, 0x22, s0);
  CHECK_OK(tp_memset_async(after, 0x33, MiB, s0));
  CHECK_OK(tp_stream_synchronize(s0));

  /* Read only: device 1 copies out of the pool, from blocks mapped before
   * the change and after it. */
  grant(pool0, 1, TP_ACCESS_READ);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_READ);
  maps = attr64(pool0, TP_POOL_ATTR_CHUNK_MAPS);
  REQUIRE_OK(tp_malloc_from_pool_async(&later, size, pool0, s0));
  CHECK(attr64(pool0, TP_POOL_ATTR_CHUNK_MAPS) > maps);
  CHECK_OK(tp_memset_async(later, 0x66, size, s0));
  CHECK_OK(tp_stream_synchronize(s0));
  peer_reads(before, size, 0x22);
  peer_reads(after, size, 0x33);
  peer_reads(later, size, 0x66);
  /* The fault of a forbidden access is observable only on the host
   * platform: on a GPU it would end the process's context. */
  if (check_on_host()) {
    CHECK_OK(tp_memset_async(before, 0x44, size, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    CHECK_OK(tp_memset_async(later, 0x44, size, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    expect_bytes(before, size, 0x22, s0);
    expect_bytes(later, size, 0x66, s0);
  }

  /* Revoked: nothing for device 1, in old chunks and new ones. */
  grant(pool0, 1, TP_ACCESS_NONE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_NONE);
  void *revoked = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&revoked, size, pool0, s0));
  if (check_on_host()) {
    unsigned char buf[512];
    CHECK_OK(tp_memcpy_async(buf, before, sizeof buf, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    CHECK_OK(tp_memcpy_async(buf, revoked, sizeof buf, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  }
  /* And granted again, as any change. */
  grant(pool0, 1, TP_ACCESS_READ_WRITE);
  CHECK_OK(tp_memset_async(revoked, 0x77, size, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  expect_bytes(revoked, size, 0x77, s0);
  grant(pool0, 1, TP_ACCESS_NONE);

  /* The own device keeps its rights, and cannot lose them. */
  CHECK_EQ_INT(access_of(pool0, 0), TP_ACCESS_READ_WRITE);
  tp_access_desc_t own = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ};
  CHECK_ERR(tp_pool_set_access(pool0, &own, 1), TP_ERROR_NOT_SUPPORTED);
  CHECK_OK(tp_free_async(before, s0));
  CHECK_OK(tp_free_async(after, s0));
  CHECK_OK(tp_free_async(later, s0));
  CHECK_OK(tp_free_async(revoked, s0));
  CHECK_OK(tp_stream_synchronize(s0));
}

static void test_pools_per_device(void) {
  tp_pool_t d0 = NULL, d1 = NULL, c1 = NULL, got = NULL;
  REQUIRE_OK(tp_device_get_default_mem_pool(&d0, 0));
  REQUIRE_OK(tp_device_get_default_mem_pool(&d1, 1));
  CHECK(d0 != d1);
  int type = -1, id = -1;
  CHECK_OK(tp_pool_get_attribute(d1, TP_POOL_ATTR_LOCATION_ID, &id));
  CHECK_OK(tp_pool_get_attribute(d1, TP_POOL_ATTR_LOCATION_TYPE, &type));
  CHECK_EQ_INT(id, 1);
  CHECK_EQ_INT(type, TP_LOCATION_DEVICE);
  /* A pool of one device cannot be the other's current pool: the driver's
   * answer, INVALID_VALUE (conformance_reference keeps its reference rows). */
  CHECK_ERR(tp_device_set_mem_pool(1, pool0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(0, d1), TP_ERROR_INVALID_VALUE);
  tp_location_t dev1 = {TP_LOCATION_DEVICE, 1, 0};
  CHECK_ERR(tp_mem_set_pool(&dev1, TP_ALLOCATION_PINNED, pool0),
            TP_ERROR_INVALID_VALUE);

  /* Current pools are per device: tp_malloc_async on a stream of device 1
   * draws from device 1's current pool, whatever the thread's current
   * device, and device 0's stays. */
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 1, 0};
  REQUIRE_OK(tp_pool_create(&c1, &props));
  CHECK_OK(tp_device_set_mem_pool(1, c1));
  CHECK_OK(tp_device_get_mem_pool(&got, 1));
  CHECK_EQ_PTR(got, c1);
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, d0);
  CHECK_OK(tp_set_device(0));
  void *p = NULL, *q = NULL;
  uint64_t used0 = attr64(d0, TP_POOL_ATTR_USED_MEM_CURRENT);
  REQUIRE_OK(tp_malloc_async(&p, 5000, s1));
  REQUIRE_OK(tp_malloc_async(&q, 7000, s0));
  CHECK_EQ_U64(attr64(c1, TP_POOL_ATTR_USED_MEM_CURRENT), 5000);
  CHECK_EQ_U64(attr64(d0, TP_POOL_ATTR_USED_MEM_CURRENT), used0 + 7000);
  CHECK_OK(tp_free_async(p, s1));
  CHECK_OK(tp_free_async(q, s0));
  CHECK_OK(tp_stream_synchronize(s1));
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_device_set_mem_pool(1, d1));
  CHECK_OK(tp_pool_destroy(c1));

  /* Trimming one device's pool leaves the other's. */
  set64(d0, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set64(d1, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 8 * MiB, d0, s0));
  REQUIRE_OK(tp_malloc_from_pool_async(&q, 8 * MiB, d1, s1));
  CHECK_OK(tp_free_async(p, s0));
  CHECK_OK(tp_free_async(q, s1));
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_stream_synchronize(s1));
  uint64_t r1 = attr64(d1, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  CHECK(attr64(d0, TP_POOL_ATTR_RESERVED_MEM_CURRENT) >= 8 * MiB);
  CHECK(r1 >= 8 * MiB);
  CHECK_OK(tp_pool_trim_to(d0, 0));
  CHECK_EQ_U64(attr64(d0, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_EQ_U64(attr64(d1, TP_POOL_ATTR_RESERVED_MEM_CURRENT), r1);
  CHECK_OK(tp_pool_trim_to(d1, 0));
  CHECK_EQ_U64(attr64(d1, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  set64(d0, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
  set64(d1, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);

  /* A pool of device 0 serves a stream of device 1, as the driver allows;
   * with access granted, device 1's work uses the block. */
  grant(pool0, 1, TP_ACCESS_READ_WRITE);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, MiB, pool0, s1));
  CHECK_OK(tp_memset_async(p, 0x5a, MiB, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  expect_bytes(p, MiB, 0x5a, s0);
  expect_bytes(p, MiB, 0x5a, s1);
  CHECK_OK(tp_free_async(p, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  grant(pool0, 1, TP_ACCESS_NONE);
}

/* A block freed on a held stream of device 1 is reused by a stream of
 * device 0 only behind a dependency: an event, or an internal one that
 * makes device 0's stream wait. */
static void test_cross_device_order(void) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  props.max_size = 2 * MiB; /* one chunk: reuse or out-of-memory */
  tp_pool_t pool = NULL;
  REQUIRE_OK(tp_pool_create(&pool, &props));
  grant(pool, 1, TP_ACCESS_READ_WRITE);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 1);
  const size_t size = 2 * MiB;

  gate_t g;
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, size, pool, s1));
  REQUIRE_OK(hold_stream(s1, &g));
  CHECK_OK(tp_memset_async(x, 0x31, size, s1));
  CHECK_OK(tp_free_async(x, s1));
  /* No dependency: device 0's stream may not have it. */
  CHECK_ERR(tp_malloc_from_pool_async(&y, size, pool, s0),
            TP_ERROR_OUT_OF_MEMORY);
  /* An event recorded after the free, waited on by device 0's stream. */
  tp_event_t ev = NULL;
  CHECK_OK(tp_set_device(1));
  REQUIRE_OK(tp_event_create(&ev));
  CHECK_OK(tp_event_record(ev, s1));
  CHECK_OK(tp_set_device(0));
  CHECK_OK(tp_stream_wait_event(s0, ev, 0));
  CHECK_OK(tp_malloc_from_pool_async(&y, size, pool, s0));
  CHECK_EQ_PTR(y, x);
  /* Device 0's work waits for device 1's held work: its memset lands after
   * device 1's, which the gate still holds. */
  CHECK_OK(tp_memset_async(y, 0x32, size, s0));
  CHECK_ERR(tp_stream_query(s0), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s0));
  expect_bytes(y, size, 0x32, s0);
  CHECK_OK(tp_free_async(y, s0));

  /* Internal dependencies alone: the pool makes device 0's stream wait. */
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1);
  CHECK_OK(tp_stream_synchronize(s0));
  REQUIRE_OK(tp_malloc_from_pool_async(&x, size, pool, s1));
  REQUIRE_OK(hold_stream(s1, &g));
  CHECK_OK(tp_memset_async(x, 0x41, size, s1));
  CHECK_OK(tp_free_async(x, s1));
  CHECK_OK(tp_malloc_from_pool_async(&y, size, pool, s0));
  CHECK_EQ_PTR(y, x);
  CHECK_OK(tp_memset_async(y, 0x42, size, s0));
  CHECK_ERR(tp_stream_query(s0), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s0));
  expect_bytes(y, size, 0x42, s0);
  CHECK_OK(tp_free_async(y, s0));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_set_device(1));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_set_device(0));
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_pool_destroy(pool));
}

int main(void) {
  int n = 0;
  REQUIRE_OK_EXIT(tp_get_device_count(&n));
  if (n < 2)
    return check_skip("%d device(s); this test needs 2 (on the host "
                      "platform, TIDEPOOL_HOST_DEVICES=2)",
                      n);
  printf("platform %s, %d devices\n", tp_platform_name(), n);
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  REQUIRE_OK_EXIT(tp_pool_create(&pool0, &props));
  REQUIRE_OK_EXIT(tp_set_device(1));
  REQUIRE_OK_EXIT(tp_stream_create(&s1, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK_EXIT(tp_set_device(0));
  REQUIRE_OK_EXIT(tp_stream_create(&s0, TP_STREAM_NON_BLOCKING));
  RUN_TEST(test_peer_access);
  RUN_TEST(test_pools_per_device);
  RUN_TEST(test_cross_device_order);
  CHECK_OK(tp_stream_destroy(s0));
  CHECK_OK(tp_stream_destroy(s1));
  CHECK_OK(tp_pool_destroy(pool0));
  return check_done();
}
