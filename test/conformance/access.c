/* conformance_access: tp_pool_get_access and tp_pool_set_access on one
 * device: the owning device's access, unknown devices, bad lists and
 * flags. Access from a second device is conformance_access_peer. */
#include "conformance.h"

static tp_access_flags_t access_of(tp_pool_t pool, int device) {
  tp_location_t loc = loc_device(device);
  tp_access_flags_t flags = (tp_access_flags_t)77;
  CHECK_OK(tp_pool_get_access(&flags, pool, &loc));
  return flags;
}

static void test_access(void) {
  tp_pool_t pool = device_pool(0);
  REQUIRE(pool != NULL);
  int bad = unknown_device();
  tp_location_t dev0 = loc_device(0), unknown = loc_device(bad),
                minus = loc_device(-1);

  step("the own device is read-write and cannot be lowered");
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
  tp_access_desc_t d0 = {dev0, TP_ACCESS_READ_WRITE};
  CHECK_OK(tp_pool_set_access(pool, &d0, 1));
  /* The driver's answers (bench/edge_answers.cu, H200): read-only is not
   * supported there, none is a bad device. */
  d0.flags = TP_ACCESS_READ;
  CHECK_ERR(tp_pool_set_access(pool, &d0, 1), TP_ERROR_NOT_SUPPORTED);
  d0.flags = TP_ACCESS_NONE;
  CHECK_ERR(tp_pool_set_access(pool, &d0, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);

  step("unknown devices");
  tp_access_flags_t flags;
  /* Reading an unknown device's access is a bad value, setting it a bad
   * device, as the driver answers. */
  CHECK_ERR(tp_pool_get_access(&flags, pool, &unknown), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&flags, pool, &minus), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t du = {unknown, TP_ACCESS_READ_WRITE};
  CHECK_ERR(tp_pool_set_access(pool, &du, 1), TP_ERROR_INVALID_DEVICE);
  du.location = minus;
  CHECK_ERR(tp_pool_set_access(pool, &du, 1), TP_ERROR_INVALID_DEVICE);

  step("bad lists and flags");
  CHECK_OK(tp_pool_set_access(pool, NULL, 0));
  CHECK_ERR(tp_pool_set_access(pool, NULL, 1), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t df = {dev0, (tp_access_flags_t)2};
  CHECK_ERR(tp_pool_set_access(pool, &df, 1), TP_ERROR_INVALID_VALUE);

  step("the own device is still read-write");
  CHECK_EQ_INT(access_of(pool, 0), TP_ACCESS_READ_WRITE);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_access),
  };
  return conformance_main(argc, argv, "access", tests,
                          CONFORMANCE_COUNT(tests));
}
