/* The API's base: one-time initialisation of the platform and the core,
 * the fork rule, and the devices (count, current device, attributes) that
 * every other entry point checks against. */
#include <pthread.h>

#include "api/api.h"
#include "common/guard.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static tp_error_t init_err = TP_ERROR_NO_DEVICE;
static int ndevices;
TP_TLS bool tp__api_ready;
TP_TLS bool tp__api_quick;

/* A child made by fork() has none of the parent's threads (the host
 * platform's stream workers, say) and, on cuda, no usable context: from
 * then on every call there answers NOT_PERMITTED (CUDA's runtime answers
 * an initialization error) instead of waiting for work that will never
 * run. The forking thread is the child's only one, so clearing its ready
 * flag sends every entry point to the slow path below. */
static void forked_child(void) {
  init_err = TP_ERROR_NOT_PERMITTED;
  tp__api_ready = false;
  tp__api_quick = false;
}

static void init_once(void) {
  if (pthread_atfork(NULL, NULL, forked_child) != 0) {
    init_err = TP_ERROR_OUT_OF_MEMORY;
    return;
  }
  init_err = tp__platform_init();
  if (init_err == TP_SUCCESS)
    init_err = tp__streams_init();
  if (init_err == TP_SUCCESS)
    init_err = tp__platform->device_count(&ndevices);
  if (init_err == TP_SUCCESS && ndevices > TP_MAX_DEVICES)
    ndevices = TP_MAX_DEVICES;
}

tp_error_t tp__api_init_slow(void) {
  pthread_once(&once, init_once);
  TP_FORWARD(init_err);
  /* A thread starts on device 0, like a CUDA runtime thread. */
  if (ndevices > 0)
    TP_FORWARD(tp__platform->set_device(tp__current_device()));
  tp__api_ready = true;
  /* The first entry gives the thread its guard record, which it keeps. */
  tp__fence_init();
  tp__guard_enter();
  tp__api_quick = tp__hot.fence_expedited && tp__guard_me.rec != NULL;
  tp__guard_exit();
  /* A new thread: those that ended before it may have left streams. */
  tp__pools_drop_lost();
  return TP_SUCCESS;
}

tp_error_t tp__check_device(int device) {
  TP_RETURN_IF(device < 0 || device >= ndevices, TP_ERROR_INVALID_DEVICE);
  return TP_SUCCESS;
}

TP_API const char *tp_platform_name(void) {
  return tp__api_init() == TP_SUCCESS ? tp__platform->name : NULL;
}

/* ---- devices --------------------------------------------------------------
 */

TP_API tp_error_t tp_get_device_count(int *count) {
  TP_RETURN_IF(!count, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  *count = ndevices;
  return TP_SUCCESS;
}

TP_API tp_error_t tp_set_device(int device) {
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  TP_FORWARD(tp__platform->set_device(device));
  tp__set_current_device(device);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_get_device(int *device) {
  TP_RETURN_IF(!device, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  *device = tp__current_device();
  return TP_SUCCESS;
}

TP_API tp_error_t tp_device_get_attribute(int *value, tp_device_attr_t attr,
                                          int device) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(tp__check_device(device));
  TP_RETURN_IF(attr < TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED ||
                   attr > TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS,
               TP_ERROR_INVALID_VALUE);
  return tp__platform->device_attribute(value, attr, device);
}
