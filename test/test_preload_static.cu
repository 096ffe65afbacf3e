// test_preload_static: a CUDA program as nvcc builds it by default, with the
// runtime linked statically (-cudart static), so that its cudaMallocAsync and
// cudaMemPool* calls never reach an LD_PRELOAD'ed runtime-level symbol; the
// runtime reaches the driver through dlopen, dlsym and cuGetProcAddress,
// where libtidepool_preload.so's driver-level layer answers. Checks, through
// the interposer's diagnostics, that tidepool answered (its counters and its
// own pool figures equal what the runtime reports), that the memory works in
// a kernel, and that frees, cudaFree of a stream-ordered allocation and the
// release threshold behave. With "off" (TIDEPOOL_PRELOAD=0) it checks that
// the driver answered instead. Built and run by bench/gpu_preload.sh (not by
// CMake: the project builds no CUDA code). Exit 0 passed, 1 failed, 77 no GPU.
//
//   nvcc -o test_preload_static test/test_preload_static.cu
//   LD_PRELOAD=build/libtidepool_preload.so ./test_preload_static cuda
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::printf("FAIL line %d: %s\n", __LINE__, #cond);                      \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_CUDA(expr)                                                       \
  do {                                                                         \
    cudaError_t rc_ = (expr);                                                  \
    if (rc_ != cudaSuccess) {                                                  \
      std::printf("FAIL line %d: %s: %s\n", __LINE__, #expr,                   \
                  cudaGetErrorName(rc_));                                      \
      failures++;                                                              \
    }                                                                          \
  } while (0)

// The interposer's diagnostics (see src/preload/diag.c).
static int (*preload_mode)(void);
static unsigned long long (*preload_counter)(int);
static int (*preload_pool_stats)(int, unsigned long long[4]);
enum { MODE_UNDECIDED, MODE_OFF, MODE_CUDA, MODE_HOST };
enum { C_MALLOC, C_FREE, C_POOL, C_DRIVER = 7 };

template <typename F> static void find(F *out, const char *name) {
  void *sym = dlsym(RTLD_DEFAULT, name);
  std::memcpy(out, &sym, sizeof sym);
}

static unsigned long long counter(int which) {
  return preload_counter ? preload_counter(which) : 0;
}

static uint64_t attr(cudaMemPool_t pool, cudaMemPoolAttr a) {
  uint64_t v = UINT64_MAX;
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, a, &v));
  return v;
}

__global__ void fill(unsigned *p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = v + (unsigned)i;
}

int main(int argc, char **argv) {
  bool off = argc > 1 && std::strcmp(argv[1], "off") == 0;
  find(&preload_mode, "tidepool_preload_mode");
  find(&preload_counter, "tidepool_preload_counter");
  find(&preload_pool_stats, "tidepool_preload_pool_stats");
  if (!preload_mode || !preload_counter || !preload_pool_stats) {
    std::printf("FAIL: libtidepool_preload.so is not preloaded\n");
    return 1;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const size_t n = (size_t)16 << 20, bytes = n * sizeof(unsigned);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t zero = 0;
  CHECK_CUDA(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));

  unsigned long long mallocs = counter(C_MALLOC), driver = counter(C_DRIVER);
  unsigned *p = nullptr;
  CHECK_CUDA(cudaMallocAsync((void **)&p, bytes, s));
  fill<<<256, 256, 0, s>>>(p, n, 7);
  CHECK_CUDA(cudaGetLastError());
  unsigned back[4] = {0, 0, 0, 0};
  CHECK_CUDA(cudaMemcpyAsync(back, p + n - 4, sizeof back,
                             cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK(back[3] == 7 + (unsigned)(n - 1));
  uint64_t used = attr(pool, cudaMemPoolAttrUsedMemCurrent);
  uint64_t reserved = attr(pool, cudaMemPoolAttrReservedMemCurrent);
  CHECK(used >= bytes);
  int mode = preload_mode();
  unsigned long long answered = counter(C_MALLOC) - mallocs;
  if (off) {
    CHECK(mode != MODE_CUDA);
    CHECK(answered == 0);
    CHECK(counter(C_DRIVER) == driver);
  } else {
    CHECK(mode == MODE_CUDA);
    CHECK(answered == 1);
    CHECK(counter(C_DRIVER) > driver);
    // The runtime's figures are tidepool's own.
    unsigned long long own[4] = {0, 0, 0, 0};
    CHECK(preload_pool_stats(0, own) == 0);
    CHECK(own[0] == reserved);
    CHECK(own[2] == used);
  }
  CHECK_CUDA(cudaFreeAsync(p, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK(attr(pool, cudaMemPoolAttrUsedMemCurrent) == 0);
  CHECK(attr(pool, cudaMemPoolAttrReservedMemCurrent) == 0);

  // cudaFree of a stream-ordered allocation, and an error the driver gives.
  unsigned long long frees = counter(C_FREE);
  CHECK_CUDA(cudaMallocAsync((void **)&p, bytes, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaFree(p));
  // tidepool's cudaFree waits until the memory is free for everyone; the
  // driver's pool may still count it as used when cudaFree returns (an
  // H200, 2026-11-30), so only tidepool's figure is checked.
  if (!off) {
    CHECK(attr(pool, cudaMemPoolAttrUsedMemCurrent) == 0);
    CHECK(counter(C_FREE) - frees == 1);
  }
  void *huge = nullptr;
  CHECK(cudaMallocAsync(&huge, (size_t)1 << 50, s) ==
        cudaErrorMemoryAllocation);
  (void)cudaGetLastError();
  CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("test_preload_static (%s): mode %d, %llu allocations and %llu "
              "calls answered through the driver's entry points, pool "
              "reserved %llu MiB at its peak: %s\n",
              off ? "off" : "cuda", mode, counter(C_MALLOC),
              counter(C_DRIVER),
              (unsigned long long)(attr(pool, cudaMemPoolAttrReservedMemHigh) >>
                                   20),
              failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
