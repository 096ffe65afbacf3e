/* The same-stream pair through the CUDA runtime's names, as a program that
 * was never changed for tidepool makes it: cudaMallocAsync then
 * cudaFreeAsync of one size on one stream, in batches, on a stream the
 * program made (a stream tidepool did not make, known by its handle), the
 * default stream (NULL), the legacy stream named as cudaStreamLegacy and
 * the per-thread default stream; then a burst of
 * 10,000 allocations followed by their frees. Run it as it is (the driver's
 * pool) and under tidepool-run (tidepool's): bench/gpu_preload_pair.sh
 * alternates the two and prints the ratios. Linked against the runtime
 * where the toolkit has it; needs a GPU. */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "dl_table.h"

enum { BATCH = 2000, BATCHES = 31, BURST = 10000 };

static int fail(const char *what, cudaError_t e) {
  fprintf(stderr, "preload_pair: %s: %s\n", what, cudaGetErrorName(e));
  return -1;
}

/* The median over BATCHES batches of the time of one pair, in ns. */
static int pair_ns(cudaStream_t s, size_t size, double *out) {
  double t[BATCHES];
  void *p;
  cudaError_t e;
  for (int b = -1; b < BATCHES; b++) { /* batch -1 warms up */
    double t0 = bench_now_ns();
    for (int i = 0; i < BATCH; i++) {
      if ((e = cudaMallocAsync(&p, size, s)) != cudaSuccess)
        return fail("cudaMallocAsync", e);
      if ((e = cudaFreeAsync(p, s)) != cudaSuccess)
        return fail("cudaFreeAsync", e);
    }
    if (b >= 0)
      t[b] = (bench_now_ns() - t0) / BATCH;
  }
  qsort(t, BATCHES, sizeof t[0], bench_cmp_double);
  *out = t[BATCHES / 2];
  return cudaStreamSynchronize(s) == cudaSuccess ? 0 : -1;
}

/* What the interposer asks on each call, alone: the runtime's current
 * device (cudaGetDevice, which it reads before every answer) and the
 * driver's current context (cuCtxGetCurrent), ns a call, median of 31
 * batches. `ctx_ns` is 0 where libcuda's symbol is not found. */
static void question_ns(double *device_ns, double *ctx_ns) {
  int (*ctx_get)(void **) = NULL;
  const dl_sym sym[] = {{&ctx_get, "cuCtxGetCurrent"}};
  bool have_ctx = dl_table_load("libcuda.so.1", sym, 1) == NULL;
  double td[BATCHES], tc[BATCHES];
  for (int b = 0; b < BATCHES; b++) {
    int d;
    void *c;
    double t0 = bench_now_ns();
    for (int i = 0; i < BATCH; i++)
      (void)cudaGetDevice(&d);
    double t1 = bench_now_ns();
    for (int i = 0; have_ctx && i < BATCH; i++)
      (void)ctx_get(&c);
    double t2 = bench_now_ns();
    td[b] = (t1 - t0) / BATCH;
    tc[b] = (t2 - t1) / BATCH;
  }
  qsort(td, BATCHES, sizeof td[0], bench_cmp_double);
  qsort(tc, BATCHES, sizeof tc[0], bench_cmp_double);
  *device_ns = td[BATCHES / 2];
  *ctx_ns = have_ctx ? tc[BATCHES / 2] : 0;
}

/* The median over 5 rounds of BURST allocations then their frees: ns per
 * allocation and per free. */
static int burst_ns(cudaStream_t s, size_t size, double *alloc, double *free_) {
  static void *p[BURST];
  double ta[5], tf[5];
  cudaError_t e;
  for (int r = -1; r < 5; r++) {
    double t0 = bench_now_ns();
    for (int i = 0; i < BURST; i++)
      if ((e = cudaMallocAsync(&p[i], size, s)) != cudaSuccess)
        return fail("cudaMallocAsync", e);
    double t1 = bench_now_ns();
    for (int i = 0; i < BURST; i++)
      if ((e = cudaFreeAsync(p[i], s)) != cudaSuccess)
        return fail("cudaFreeAsync", e);
    double t2 = bench_now_ns();
    if (r >= 0) {
      ta[r] = (t1 - t0) / BURST;
      tf[r] = (t2 - t1) / BURST;
    }
    if (cudaStreamSynchronize(s) != cudaSuccess)
      return -1;
  }
  qsort(ta, 5, sizeof ta[0], bench_cmp_double);
  qsort(tf, 5, sizeof tf[0], bench_cmp_double);
  *alloc = ta[2];
  *free_ = tf[2];
  return 0;
}

int main(int argc, char **argv) {
  bool json = argc > 1 && strcmp(argv[1], "--json") == 0;
  cudaStream_t made;
  cudaError_t e = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    printf("preload_pair: no GPU here (%s)\n", cudaGetErrorName(e));
    return 0;
  }
  /* The default pool keeps what it reserved, as PyTorch sets it, so that
   * the driver's pool is not timed releasing memory at each synchronize. */
  cudaMemPool_t pool;
  unsigned long long keep = ~0ull;
  if ((e = cudaDeviceGetDefaultMemPool(&pool, 0)) != cudaSuccess ||
      (e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                   &keep)) != cudaSuccess) {
    (void)fail("the default pool", e);
    return 1;
  }
  const struct {
    const char *name;
    cudaStream_t s;
  } streams[] = {{"made", made},
                 {"null", NULL},
                 {"legacy", cudaStreamLegacy},
                 {"per-thread", cudaStreamPerThread}};
  const size_t sizes[] = {256, (size_t)1 << 20};
  if (json)
    printf("{");
  for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      double ns;
      if (pair_ns(streams[i].s, sizes[k], &ns) != 0)
        return 1;
      if (json)
        printf("\"pair_%s_%zu\":%.1f,", streams[i].name, sizes[k], ns);
      else
        printf("same-stream pair, %-10s stream, %8zu B: %8.1f ns\n",
               streams[i].name, sizes[k], ns);
    }
  double a = 0, f = 0;
  if (burst_ns(made, 256, &a, &f) != 0)
    return 1;
  double qd = 0, qc = 0;
  question_ns(&qd, &qc);
  if (json)
    printf("\"burst_alloc\":%.1f,\"burst_free\":%.1f,\"cudaGetDevice\":%.1f,"
           "\"cuCtxGetCurrent\":%.1f}\n",
           a, f, qd, qc);
  else
    printf("%d allocations of 256 B then their frees, made stream: %.1f ns "
           "an allocation, %.1f ns a free\ncudaGetDevice %.1f ns a call, "
           "cuCtxGetCurrent %.1f ns a call\n",
           BURST, a, f, qd, qc);
  return cudaStreamDestroy(made) == cudaSuccess ? 0 : 1;
}
