/* Whether the driver runs the VMM calls of several threads in parallel:
 * T threads bring up 512 chunks of 2 MiB between them (create, then map and
 * access), then tear them down (unmap, then release); the wall time per
 * chunk of each phase, for T = 1, 2, 4, 8 and 16, twice. Were the calls
 * parallel, background threads could make chunks faster than the allocating
 * thread alone. Needs a GPU. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cu_vmm.h"

#define NCHUNKS 512
#define MAX_THREADS 16

static cu_vmm cu;

/* What every worker shares: the range, the chunks, and the phases' gate. */
static struct {
  CUcontext ctx;
  CUdeviceptr va;
  size_t gran;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
  CUmemGenericAllocationHandle h[NCHUNKS];
  int threads;
  pthread_barrier_t gate;
} w;

enum { CREATE, MAP, UNMAP, RELEASE, PHASES };

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static CUresult step(int phase, int i) {
  CUdeviceptr at = w.va + (CUdeviceptr)i * w.gran;
  switch (phase) {
  case CREATE: return cu.create(&w.h[i], w.gran, &w.prop, 0);
  case MAP: {
    CUresult r = cu.map(at, w.gran, 0, w.h[i], 0);
    return r != CUDA_SUCCESS ? r : cu.access(at, w.gran, &w.access, 1);
  }
  case UNMAP: return cu.unmap(at, w.gran);
  default: return cu.release(w.h[i]);
  }
}

/* Worker `id` takes every threads-th chunk in each phase; the main thread
 * times each phase between two passes of the gate. */
static void *work(void *arg) {
  int id = (int)(intptr_t)arg;
  cu.set(w.ctx);
  for (int phase = 0; phase < PHASES; phase++) {
    pthread_barrier_wait(&w.gate);
    for (int i = id; i < NCHUNKS; i += w.threads) {
      CUresult r = step(phase, i);
      if (r != CUDA_SUCCESS) {
        fprintf(stderr, "vmm_threads: phase %d, chunk %d: error %d\n", phase, i,
                (int)r);
        exit(1);
      }
    }
    pthread_barrier_wait(&w.gate);
  }
  return NULL;
}

static int load(void) {
  return cu_vmm_load(&cu);
}

int main(void) {
  if (load() != 0 || cu.init(0) != CUDA_SUCCESS ||
      cu.retain(&w.ctx, 0) != CUDA_SUCCESS) {
    printf("vmm_threads: no CUDA driver or device here; nothing measured\n");
    return 0;
  }
  cu.set(w.ctx);
  w.gran = (size_t)2 << 20;
  w.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  w.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  w.access.location = w.prop.location;
  w.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cu.reserve(&w.va, NCHUNKS * w.gran, 0, 0, 0) != CUDA_SUCCESS) {
    fprintf(stderr, "vmm_threads: cuMemAddressReserve failed\n");
    return 1;
  }
  printf("us per chunk     create  map+access   unmap  release     all\n");
  const int counts[] = {1, 2, 4, 8, MAX_THREADS};
  for (int round = 0; round < 2; round++)
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
      w.threads = counts[k];
      pthread_barrier_init(&w.gate, NULL, (unsigned)w.threads + 1);
      pthread_t th[MAX_THREADS];
      for (int i = 0; i < w.threads; i++)
        pthread_create(&th[i], NULL, work, (void *)(intptr_t)i);
      double us[PHASES], all = 0;
      for (int phase = 0; phase < PHASES; phase++) {
        pthread_barrier_wait(&w.gate);
        double t0 = now_us();
        pthread_barrier_wait(&w.gate);
        us[phase] = (now_us() - t0) / NCHUNKS;
        all += us[phase];
      }
      for (int i = 0; i < w.threads; i++)
        pthread_join(th[i], NULL);
      pthread_barrier_destroy(&w.gate);
      printf("%2d thread%s    %8.1f %10.1f %8.1f %8.1f %8.1f\n", w.threads,
             w.threads == 1 ? " " : "s", us[CREATE], us[MAP], us[UNMAP],
             us[RELEASE], all);
    }
  return 0;
}
