/* A library linked against the (fake) driver, as a plugin opened with
 * dlopen after the interposer started would be: its driver calls bind by
 * name, past every lookup the interposer answers. test_preload_fake calls
 * it to begin and end a capture and destroy a stream that way, and through
 * the driver's cuGetProcAddress called by name. */
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

/* The driver's function of `name`, through cuGetProcAddress by name. */
static void *by_proc(const char *name, int version) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult found;
  if (cuGetProcAddress(name, &fn, version, 0, &found) != CUDA_SUCCESS ||
      found != CU_GET_PROC_ADDRESS_SUCCESS)
    return NULL;
  return fn;
}

PLUGIN_API CUresult plugin_proc_begin(CUstream s) {
  CUresult (*begin)(CUstream, CUstreamCaptureMode) = NULL;
  void *fn = by_proc("cuStreamBeginCapture", 10010);
  __builtin_memcpy(&begin, &fn, sizeof fn);
  return begin ? begin(s, CU_STREAM_CAPTURE_MODE_RELAXED)
               : CUDA_ERROR_NOT_FOUND;
}

PLUGIN_API CUresult plugin_proc_destroy(CUstream s) {
  CUresult (*destroy)(CUstream) = NULL;
  void *fn = by_proc("cuStreamDestroy", 4000);
  __builtin_memcpy(&destroy, &fn, sizeof fn);
  return destroy ? destroy(s) : CUDA_ERROR_NOT_FOUND;
}
