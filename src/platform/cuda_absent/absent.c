/* The cuda platform of a build that found no CUDA toolkit headers: it never
 * starts, so the process runs on the host platform. */
#include "platform/platform.h"

static tp_error_t absent_init(void) {
  return TP_ERROR_NO_DEVICE;
}

const tp__platform_ops tp__cuda_platform = {.name = "cuda",
                                            .init = absent_init};
