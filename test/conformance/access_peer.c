/* conformance_access_peer: access to a pool of device 0 from device 1:
 * grants, lists applied whole or not at all, and work of device 1 on memory
 * mapped before and after a grant. Skipped where there is one device
 * (TIDEPOOL_HOST_DEVICES=2 gives the host platform two). */
#include "conformance.h"

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

static void test_access_peer(void) {
  tp_pool_t pool = device_pool(0);
  REQUIRE(pool != NULL);
  tp_location_t dev0 = loc_device(0), unknown = loc_device(unknown_device());

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

  step("the own device is still read-write");
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
}

int main(int argc, char **argv) {
  int count = 0;
  if (tp_get_device_count(&count) == TP_SUCCESS && count < 2)
    return check_skip("access from a second device needs two devices");
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_access_peer),
  };
  return conformance_main(argc, argv, "access_peer", tests,
                          CONFORMANCE_COUNT(tests));
}
