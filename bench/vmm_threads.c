// Whether the driver runs the VMM calls of several threads in parallel:
// T threads bring up 512 chunks of 2 MiB between them (create, then map and
// access), then tear them down (unmap, then release); wall time per chunk
// for each phase, T = 1, 2, 4, 8, 16, twice. Were the calls parallel, a
// background thread (or several) could take VMM work off the allocating
// thread for free. Build and run on a GPU machine (one line):
//   gcc -O2 -I/usr/local/cuda/include -o vmm_threads bench/vmm_threads.c
//   -lcuda -lpthread && ./vmm_threads
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}
#define N 512
static CUdeviceptr va;
static size_t g;
static CUmemAllocationProp p;
static CUmemAccessDesc ad;
static CUcontext ctx;
static CUmemGenericAllocationHandle h[N];
static int T;
static int phase;
static pthread_barrier_t bar;
static double tphase[4][2];
static void *work(void *arg) {
  long id = (long)arg;
  cuCtxSetCurrent(ctx);
  for (int ph = 0; ph < 4; ph++) {
    pthread_barrier_wait(&bar);
    for (int i = id; i < N; i += T) {
      CUresult r = 0;
      if (ph == 0)
        r = cuMemCreate(&h[i], g, &p, 0);
      else if (ph == 1) {
        r = cuMemMap(va + i * g, g, 0, h[i], 0);
        if (!r)
          r = cuMemSetAccess(va + i * g, g, &ad, 1);
      } else if (ph == 2)
        r = cuMemUnmap(va + i * g, g);
      else
        r = cuMemRelease(h[i]);
      if (r) {
        printf("phase %d chunk %d failed %d\n", ph, i, (int)r);
        exit(1);
      }
    }
    pthread_barrier_wait(&bar);
  }
  return NULL;
}
int main() {
  cuInit(0);
  CUdevice d;
  cuDeviceGet(&d, 0);
  cuDevicePrimaryCtxRetain(&ctx, d);
  cuCtxSetCurrent(ctx);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  g = 2 << 20;
  if (cuMemAddressReserve(&va, (size_t)N * g, 0, 0, 0)) {
    printf("reserve failed\n");
    return 1;
  }
  ad.location = p.location;
  ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int ts[] = {1, 2, 4, 8, 16};
  for (int rep = 0; rep < 2; rep++)
    for (unsigned k = 0; k < sizeof ts / sizeof *ts; k++) {
      T = ts[k];
      pthread_barrier_init(&bar, NULL, T + 1);
      pthread_t th[16];
      for (long i = 0; i < T; i++)
        pthread_create(&th[i], NULL, work, (void *)i);
      double tt[5];
      for (int ph = 0; ph < 4; ph++) {
        pthread_barrier_wait(&bar);
        tt[ph] = now_us();
        pthread_barrier_wait(&bar);
        tt[ph + 1] = now_us();
        tphase[ph][0] = tt[ph + 1] - tt[ph];
      }
      for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
      printf("threads %2d: us per chunk  create %.1f  map+access %.1f  unmap "
             "%.1f  release %.1f  all %.1f\n",
             T, tphase[0][0] / N, tphase[1][0] / N, tphase[2][0] / N,
             tphase[3][0] / N,
             (tphase[0][0] + tphase[1][0] + tphase[2][0] + tphase[3][0]) / N);
      pthread_barrier_destroy(&bar);
    }
  return 0;
}
