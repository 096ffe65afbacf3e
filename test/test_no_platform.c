/* A platform that cannot start (a bad TIDEPOOL_PLATFORM, or the setting
 * NAME=VALUE given as the argument): the README's promise that
 * tp_platform_name() is NULL and every call answers INVALID_VALUE, also
 * given a device out of range (the PyTorch entry points answered
 * INVALID_DEVICE there). The variable is set before the first call, which
 * is when it is read. */
#include <stdlib.h>

#include "check.h"

int main(int argc, char **argv) {
  const char *setting = argc > 1 ? argv[1] : "TIDEPOOL_PLATFORM=no-such";
  char name[64] = "";
  const char *eq = strchr(setting, '=');
  REQUIRE_EXIT(eq && (size_t)(eq - setting) < sizeof name);
  memcpy(name, setting, (size_t)(eq - setting));
  setenv(name, eq + 1, 1);
  CHECK(tp_platform_name() == NULL);
  int n = -1;
  CHECK_ERR(tp_get_device_count(&n), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_set_device(0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_set_device(-1), TP_ERROR_INVALID_VALUE);
  void *p = NULL;
  CHECK_ERR(tp_malloc_async(&p, 256, NULL), TP_ERROR_INVALID_VALUE);
  CHECK(p == NULL);
  tp_stream_t s = NULL;
  CHECK_ERR(tp_stream_create(&s, 0), TP_ERROR_INVALID_VALUE);
  tp_pool_t pool = NULL;
  CHECK_ERR(tp_device_get_default_mem_pool(&pool, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_synchronize(), TP_ERROR_INVALID_VALUE);
  uint64_t out[4] = {0};
  CHECK_ERR(tp_torch_stats(0, out), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_torch_stats(-1, out), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_torch_trim(-1, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_torch_trim(1 << 20, 0), TP_ERROR_INVALID_VALUE);
  return check_done();
}
