/* The interposer's diagnostics, which are not CUDA's: for tests, benchmarks
 * and the curious, under a version node of their own (TIDEPOOL_PRELOAD_0).
 * Reach them with dlsym(RTLD_DEFAULT, ...) or ctypes.CDLL(None). */
#include "driver.h"

/* 0 undecided, 1 off, 2 cuda, 3 host. */
TP_PL_EXPORT int tidepool_preload_mode(void) {
  return tp__pl_mode();
}

/* A counter of the list in preload.h (0 allocations answered, 1 frees,
 * 2 pool calls, 3 allocator calls forwarded, 4 synchronizations seen,
 * 5 event records and waits seen, 6 failures answered, 7 of all these, the
 * calls that came through the driver's entry points); 0 for others. */
TP_PL_EXPORT unsigned long long tidepool_preload_counter(int which) {
  return tp__pl_counter(which);
}

/* tidepool's own figures of the current pool of `device` (an ordinal),
 * asked directly rather than through CUDA's names: out[0] reserved, out[1]
 * reserved high, out[2] used, out[3] used high. Returns a tp_error_t;
 * INVALID_VALUE while tidepool does not answer. The calling thread's
 * context is left as it was (tidepool's first call on a thread makes a
 * context current). */
TP_PL_EXPORT int tidepool_preload_pool_stats(int device,
                                             unsigned long long out[4]) {
  if (!out || !tp__pl_on())
    return TP_ERROR_INVALID_VALUE;
  static const tp_pool_attr_t attrs[4] = {
      TP_POOL_ATTR_RESERVED_MEM_CURRENT, TP_POOL_ATTR_RESERVED_MEM_HIGH,
      TP_POOL_ATTR_USED_MEM_CURRENT, TP_POOL_ATTR_USED_MEM_HIGH};
  CUcontext saved = tp__pl_drv_ctx_save();
  tp_pool_t pool = NULL;
  tp_error_t err = tp_device_get_mem_pool(&pool, device);
  for (int i = 0; err == TP_SUCCESS && i < 4; i++) {
    uint64_t v = 0;
    err = tp_pool_get_attribute(pool, attrs[i], &v);
    out[i] = v;
  }
  tp__pl_drv_ctx_restore(saved);
  return err;
}
