/* Tests that need two devices: peer access to a pool granted, made read-only
 * and revoked, for blocks allocated before and after the change; default
 * and current pools per device; allocation on one device's stream from
 * another device's pool; reuse across devices only behind the dependencies
 * the policies allow. Skips with one device (the host platform has two with
 * TIDEPOOL_HOST_DEVICES=2, which CI sets for a second run of the suite). */
#include "check.h"

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

/* Copies `size` bytes of pool memory at `p` to the host through a stream of
 * device 0 and checks them against `value`. */
static void expect_bytes(void *p, size_t size, unsigned char value) {
  unsigned char *host = malloc(size);
  REQUIRE(host != NULL);
  CHECK_OK(tp_memcpy_async(host, p, size, s0));
  CHECK_OK(tp_stream_synchronize(s0));
  size_t bad = 0;
  for (size_t i = 0; i < size; i++)
    bad += host[i] != value;
  CHECK_EQ_U64(bad, 0);
  free(host);
}

static void test_peer_access(void) {
  const size_t size = 3u << 20;
  CHECK_EQ_INT(access_of(pool0, 0), TP_ACCESS_READ_WRITE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_NONE);
  void *before = NULL, *after = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&before, size, pool0, s0));
  CHECK_OK(tp_memset_async(before, 0x11, size, s0));
  CHECK_OK(tp_stream_synchronize(s0));

  grant(pool0, 1, TP_ACCESS_READ_WRITE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_READ_WRITE);
  REQUIRE_OK(tp_malloc_from_pool_async(&after, size, pool0, s0));
  CHECK_OK(tp_stream_synchronize(s0));
  /* Device 1 writes both blocks: the grant covers memory mapped before it
   * and memory mapped after it. */
  CHECK_OK(tp_memset_async(before, 0x22, size, s1));
  CHECK_OK(tp_memset_async(after, 0x33, size, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  expect_bytes(before, size, 0x22);
  expect_bytes(after, size, 0x33);

  /* Read only: device 1 may copy out of the pool. */
  grant(pool0, 1, TP_ACCESS_READ);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_READ);
  void *dst = NULL;
  tp_pool_t pool1 = NULL;
  REQUIRE_OK(tp_device_get_mem_pool(&pool1, 1));
  REQUIRE_OK(tp_malloc_from_pool_async(&dst, size, pool1, s1));
  CHECK_OK(tp_memcpy_async(dst, before, size, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  CHECK_OK(tp_free_async(dst, s1));
  /* The fault of a forbidden access is observable only on the host
   * platform: on a GPU it would end the process's context. */
  if (check_on_host()) {
    CHECK_OK(tp_memset_async(before, 0x44, size, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
    expect_bytes(before, size, 0x22);
  }

  grant(pool0, 1, TP_ACCESS_NONE);
  CHECK_EQ_INT(access_of(pool0, 1), TP_ACCESS_NONE);
  if (check_on_host()) {
    CHECK_OK(tp_memcpy_async(after, before, 512, s1));
    CHECK_ERR(tp_stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  }
  /* The own device keeps its rights, and cannot lose them. */
  CHECK_EQ_INT(access_of(pool0, 0), TP_ACCESS_READ_WRITE);
  tp_access_desc_t own = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ};
  CHECK_ERR(tp_pool_set_access(pool0, &own, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(tp_free_async(before, s0));
  CHECK_OK(tp_free_async(after, s0));
  CHECK_OK(tp_stream_synchronize(s0));
}

static void test_pools_per_device(void) {
  tp_pool_t d0 = NULL, d1 = NULL, c1 = NULL;
  REQUIRE_OK(tp_device_get_default_mem_pool(&d0, 0));
  REQUIRE_OK(tp_device_get_default_mem_pool(&d1, 1));
  CHECK(d0 != d1);
  int type = -1, id = -1;
  CHECK_OK(tp_pool_get_attribute(d1, TP_POOL_ATTR_LOCATION_ID, &id));
  CHECK_OK(tp_pool_get_attribute(d1, TP_POOL_ATTR_LOCATION_TYPE, &type));
  CHECK_EQ_INT(id, 1);
  CHECK_EQ_INT(type, TP_LOCATION_DEVICE);
  /* A pool of device 0 cannot be device 1's current pool. */
  CHECK_ERR(tp_device_set_mem_pool(1, pool0), TP_ERROR_INVALID_VALUE);

  /* tp_malloc_async on a stream of device 1 draws from device 1's current
   * pool, whatever the thread's current device. */
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 1, 0};
  REQUIRE_OK(tp_pool_create(&c1, &props));
  CHECK_OK(tp_device_set_mem_pool(1, c1));
  CHECK_OK(tp_set_device(0));
  void *p = NULL;
  REQUIRE_OK(tp_malloc_async(&p, 5000, s1));
  CHECK_EQ_U64(attr64(c1, TP_POOL_ATTR_USED_MEM_CURRENT), 5000);
  CHECK_OK(tp_free_async(p, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  CHECK_OK(tp_device_set_mem_pool(1, d1));
  CHECK_OK(tp_pool_destroy(c1));

  /* A pool of device 0 serves a stream of device 1, as the seed allows. */
  grant(pool0, 1, TP_ACCESS_READ_WRITE);
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 1u << 20, pool0, s1));
  CHECK_OK(tp_memset_async(p, 0x5a, 1u << 20, s1));
  CHECK_OK(tp_stream_synchronize(s1));
  expect_bytes(p, 1u << 20, 0x5a);
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
  props.max_size = 2u << 20; /* one chunk: reuse or out-of-memory */
  tp_pool_t pool = NULL;
  REQUIRE_OK(tp_pool_create(&pool, &props));
  grant(pool, 1, TP_ACCESS_READ_WRITE);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 1);
  const size_t size = 2u << 20;

  gate_t g;
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, size, pool, s1));
  REQUIRE_OK(hold_stream(s1, &g));
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
  /* And device 0's work waits for device 1's held work. */
  CHECK_ERR(tp_stream_query(s0), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s0));
  CHECK_OK(tp_free_async(y, s0));

  /* Internal dependencies alone: the pool makes device 0's stream wait. */
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 0);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1);
  CHECK_OK(tp_stream_synchronize(s0));
  REQUIRE_OK(tp_malloc_from_pool_async(&x, size, pool, s1));
  REQUIRE_OK(hold_stream(s1, &g));
  CHECK_OK(tp_free_async(x, s1));
  CHECK_OK(tp_malloc_from_pool_async(&y, size, pool, s0));
  CHECK_EQ_PTR(y, x);
  CHECK_OK(tp_memset_async(y, 1, 512, s0));
  CHECK_ERR(tp_stream_query(s0), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s0));
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
