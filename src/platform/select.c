/* Chooses the platform of the process once, from TIDEPOOL_PLATFORM or by
 * probing, and keeps the detail of the last platform error per thread. */
#include <pthread.h>
#include <string.h>

#include "common/common.h"
#include "common/seen.h"
#include "platform/platform.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static tp_error_t init_result = TP_ERROR_NO_DEVICE;

static _Thread_local int last_code;
static _Thread_local const char *last_name;

tp_error_t tp__platform_fail(int code, const char *name) {
  last_code = code;
  last_name = name ? name : "unknown";
  return TP_ERROR_PLATFORM;
}

TP_API tp_error_t tp_get_last_platform_error(int *code, const char **name) {
  if (code)
    *code = last_code;
  if (name)
    *name = last_name ? last_name : "none";
  return TP_SUCCESS;
}

/* The captures count goes in first: a thread that finds the platform set
 * reads it next. A platform that cannot count them may have them counted
 * for it (seen.h). */
static void chosen(const tp__platform_ops *ops) {
  tp__hot.captures_active =
      ops->captures_active ? ops->captures_active : tp__seen_counter();
  atomic_store_explicit(&tp__hot.foreign_watched, tp__seen_streams_watched(),
                        memory_order_relaxed);
  atomic_store_explicit(&tp__platform, ops, memory_order_release);
}

static void choose(void) {
  const char *want = getenv("TIDEPOOL_PLATFORM");
  if (want && strcmp(want, "host") == 0) {
    init_result = tp__host_platform.init();
    if (init_result == TP_SUCCESS)
      chosen(&tp__host_platform);
    return;
  }
  if (want && strcmp(want, "cuda") == 0) {
    init_result = tp__cuda_platform.init();
    if (init_result == TP_SUCCESS)
      chosen(&tp__cuda_platform);
    else
      fprintf(stderr,
              "tidepool: TIDEPOOL_PLATFORM=cuda, but the cuda platform "
              "cannot start here (%s)\n",
              tp_error_name(init_result));
    return;
  }
  if (want && *want) {
    fprintf(stderr, "tidepool: TIDEPOOL_PLATFORM=%s is neither host nor cuda\n",
            want);
    init_result = TP_ERROR_INVALID_VALUE;
    return;
  }
  if (tp__cuda_platform.init() == TP_SUCCESS) {
    chosen(&tp__cuda_platform);
    init_result = TP_SUCCESS;
    return;
  }
  init_result = tp__host_platform.init();
  if (init_result == TP_SUCCESS)
    chosen(&tp__host_platform);
}

tp_error_t tp__platform_init(void) {
  if (TP_LIKELY(tp__platform != NULL))
    return TP_SUCCESS;
  pthread_once(&init_once, choose);
  return init_result;
}
