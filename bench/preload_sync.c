/* What a synchronize costs through the CUDA runtime's names on idle work:
 * cudaStreamSynchronize of a stream the program made, cudaEventSynchronize
 * right after a record on it, and cudaDeviceSynchronize, each the median of
 * rounds of N calls. Run it as it is (the driver alone) and under
 * tidepool-run, which books every synchronize for its pools: the
 * difference is tidepool's. Usage: preload_sync [calls per round, default
 * 10000]. Linked against the runtime where the toolkit has it; needs a
 * GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_clock.h"

enum { ROUNDS = 9 };

static cudaStream_t stream;
static cudaEvent_t event;

static cudaError_t stream_sync(void) {
  return cudaStreamSynchronize(stream);
}

static cudaError_t event_sync(void) {
  cudaError_t r = cudaEventRecord(event, stream);
  return r != cudaSuccess ? r : cudaEventSynchronize(event);
}

static cudaError_t device_sync(void) {
  return cudaDeviceSynchronize();
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000;
  if (n <= 0) {
    fprintf(stderr, "usage: preload_sync [calls per round > 0]\n");
    return 2;
  }
  void *p = NULL;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) !=
          cudaSuccess ||
      cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
      cudaMallocAsync(&p, 1 << 20, stream) != cudaSuccess ||
      cudaFreeAsync(p, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    fprintf(stderr, "preload_sync: no device to run on\n");
    return 1;
  }
  static const struct {
    const char *name;
    cudaError_t (*call)(void);
  } calls[] = {{"cudaStreamSynchronize", stream_sync},
               {"cudaEventRecord+Synchronize", event_sync},
               {"cudaDeviceSynchronize", device_sync}};
  for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
    double t[ROUNDS];
    for (int j = 0; j < ROUNDS; j++) {
      double t0 = bench_now_ns();
      for (long i = 0; i < n; i++)
        if (calls[k].call() != cudaSuccess) {
          fprintf(stderr, "%s failed\n", calls[k].name);
          return 1;
        }
      t[j] = (bench_now_ns() - t0) / (double)n;
    }
    qsort(t, ROUNDS, sizeof t[0], bench_cmp_double);
    printf("%-28s %8.1f ns (median of %d rounds of %ld)\n", calls[k].name,
           t[ROUNDS / 2], ROUNDS, n);
  }
  return 0;
}
