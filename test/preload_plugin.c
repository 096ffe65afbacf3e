/* A library linked against the (fake) driver, as a plugin opened with
 * dlopen after the interposer started would be: its driver calls bind by
 * name, past every lookup the interposer answers. test_preload_fake calls
 * it to begin and end a capture and destroy a stream that way. */
#include <cuda.h>

#define PLUGIN_API __attribute__((visibility("default")))

PLUGIN_API CUresult plugin_begin(CUstream s) {
  return cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
}

PLUGIN_API CUresult plugin_end(CUstream s, CUgraph *g) {
  return cuStreamEndCapture(s, g);
}

PLUGIN_API CUresult plugin_destroy(CUstream s) {
  return cuStreamDestroy(s);
}
