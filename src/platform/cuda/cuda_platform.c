/* Placeholder until the cuda platform lands: it never starts. */
#include "platform/platform.h"

static tp_error_t absent_init(void) {
  return TP_ERROR_NO_DEVICE;
}

const tp__platform_ops tp__cuda_platform = {.name = "cuda",
                                            .init = absent_init};
