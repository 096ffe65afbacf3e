// Whether the driver's VMM calls slow the device's work down: times, with
// events, a fixed sequence of memory-bound kernels over a 1 GiB buffer while
// a host thread (a) sleeps, (b) moves 2 MiB chunks of an unrelated range
// (cuMemUnmap, cuMemMap, cuMemSetAccess), (c) only maps and sets access
// (each mapping then unmapped in one call per 32 chunks), or (d) unmaps one
// chunk at a time. A host thread's VMM calls that stalled the device would
// show as device time, which a host-bound training step does not hide.
// Then times, on one thread, the host side of the kernel launches that
// follow a VMM call.
// Build and run on a GPU machine:
//   nvcc -O2 -o vmm_stall bench/vmm_stall.cu -lcuda -lpthread && ./vmm_stall
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <atomic>
#include <stdio.h>
#include <time.h>

#define OK(x)                                                                  \
  do {                                                                         \
    CUresult r_ = (x);                                                         \
    if (r_) {                                                                  \
      printf("%s failed %d\n", #x, (int)r_);                                   \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__global__ void touch(float *a, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    a[i] = a[i] * 1.0001f + 1.0f;
}

static const size_t G = 2u << 20;
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
enum { SLOTS = 64 };
static CUcontext ctx;
static CUdeviceptr va;
static CUmemGenericAllocationHandle h[SLOTS];
static CUmemAccessDesc ad;
static std::atomic<int> mode, stop;
static std::atomic<long> ops;

static void *mover(void *arg) {
  (void)arg;
  cuCtxSetCurrent(ctx);
  long i = 0;
  int last = 0;
  while (!stop.load()) {
    int m = mode.load();
    if (m != last) { /* each mode starts from all chunks mapped once */
      if (last == 2)
        for (size_t s = 0; s < SLOTS; s++)
          (void)cuMemUnmap(va + (SLOTS + s) * G, G);
      i = 0;
      last = m;
    }
    size_t s = (size_t)(i % SLOTS);
    if (m == 1) { /* a move: unmap, map again, access */
      cuMemUnmap(va + s * G, G);
      cuMemMap(va + s * G, G, 0, h[s], 0);
      cuMemSetAccess(va + s * G, G, &ad, 1);
      ops.fetch_add(1);
    } else if (m == 2) { /* map and access 32 chunks, then one unmap */
      if (s % 32 == 0 && i > 0)
        cuMemUnmap(va + (SLOTS + (s + 32) % SLOTS) * G, 32 * G);
      cuMemMap(va + (SLOTS + s) * G, G, 0, h[s], 0);
      cuMemSetAccess(va + (SLOTS + s) * G, G, &ad, 1);
      ops.fetch_add(1);
    } else if (m == 3) { /* unmap one chunk; map it back without timing */
      cuMemUnmap(va + s * G, G);
      ops.fetch_add(1);
      cuMemMap(va + s * G, G, 0, h[s], 0);
      cuMemSetAccess(va + s * G, G, &ad, 1);
    } else {
      struct timespec t = {0, 200000};
      nanosleep(&t, NULL);
    }
    if (m)
      i++;
  }
  return NULL;
}

int main(void) {
  cudaFree(0);
  OK(cuCtxGetCurrent(&ctx));
  CUmemAllocationProp p = {};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  ad.location = p.location;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(cuMemAddressReserve(&va, 2 * SLOTS * G, 0, 0, 0));
  for (int s = 0; s < SLOTS; s++) {
    OK(cuMemCreate(&h[s], G, &p, 0));
    OK(cuMemMap(va + s * G, G, 0, h[s], 0));
    OK(cuMemSetAccess(va + s * G, G, &ad, 1));
  }
  size_t n = (1u << 30) / sizeof(float);
  float *buf;
  cudaMalloc(&buf, n * sizeof(float));
  cudaMemset(buf, 0, n * sizeof(float));
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  pthread_t th;
  pthread_create(&th, NULL, mover, NULL);
  const char *names[] = {"idle", "moves (unmap+map+access)", "map+access",
                         "unmaps"};
  for (int round = 0; round < 3; round++) {
    for (int m = 0; m < 4; m++) {
      cudaDeviceSynchronize();
      mode.store(m);
      struct timespec t = {0, 20000000};
      nanosleep(&t, NULL);
      long before = ops.load();
      cudaEventRecord(e0, st);
      for (int k = 0; k < 400; k++)
        touch<<<1056, 512, 0, st>>>(buf, n);
      cudaEventRecord(e1, st);
      cudaEventSynchronize(e1);
      long done = ops.load() - before;
      mode.store(0);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      printf("round %d %-26s device %8.2f ms for 400 kernels, %6ld VMM ops "
             "meanwhile (%.0f/s)\n",
             round, names[m], ms, done, done / (ms / 1e3));
    }
  }
  stop.store(1);
  pthread_join(th, NULL);

  /* Part 2: the host time of the first kernel launches after a VMM call on
   * the same thread, against launches after none: a driver that makes the
   * next launch pay for a mapping change would show here, not above. */
  float *small;
  cudaMalloc(&small, 4096 * sizeof(float));
  const char *kinds[] = {"no VMM call", "move (unmap+map+access)",
                         "map+access (second mapping)", "unmap"};
  for (int round = 0; round < 2; round++) {
    for (int m = 0; m < 4; m++) {
      double first = 0, next = 0;
      const int reps = 2000;
      for (int r = 0; r < reps; r++) {
        size_t sl = (size_t)(r % SLOTS);
        if (m == 1) {
          OK(cuMemUnmap(va + sl * G, G));
          OK(cuMemMap(va + sl * G, G, 0, h[sl], 0));
          OK(cuMemSetAccess(va + sl * G, G, &ad, 1));
        } else if (m == 2) {
          OK(cuMemMap(va + (SLOTS + sl) * G, G, 0, h[sl], 0));
          OK(cuMemSetAccess(va + (SLOTS + sl) * G, G, &ad, 1));
        } else if (m == 3) {
          OK(cuMemUnmap(va + sl * G, G));
        }
        double t0 = now_us();
        touch<<<1, 32, 0, st>>>(small, 4096);
        double t1 = now_us();
        for (int k = 0; k < 4; k++)
          touch<<<1, 32, 0, st>>>(small, 4096);
        double t2 = now_us();
        first += t1 - t0;
        next += (t2 - t1) / 4;
        if (m == 2)
          OK(cuMemUnmap(va + (SLOTS + sl) * G, G));
        if (m == 3) {
          OK(cuMemMap(va + sl * G, G, 0, h[sl], 0));
          OK(cuMemSetAccess(va + sl * G, G, &ad, 1));
        }
        if (r % 64 == 63)
          cudaStreamSynchronize(st);
      }
      cudaStreamSynchronize(st);
      printf("round %d after %-28s first launch %7.2f us, next four %6.2f us "
             "each\n",
             round, kinds[m], first / reps, next / reps);
    }
  }
  return 0;
}
