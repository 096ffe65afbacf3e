/* Whether VMM calls on one thread slow another thread's launches: the main
 * thread enqueues small memsets on a stream for a second at a time while a
 * second thread either sleeps or moves 2 MiB chunks between two halves of a
 * range (unmap, map, set access) as fast as it can; six alternating
 * seconds. Were launches to wait for VMM calls, taking chunk moves off the
 * allocating thread would gain nothing. Needs a GPU. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cu_vmm.h"

#define NCHUNKS 64

static cu_vmm cu;
/* What the launching thread calls besides. */
static struct {
  CUresult (*stream_create)(CUstream *, unsigned);
  CUresult (*stream_sync)(CUstream);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*memset)(CUdeviceptr, unsigned char, size_t, CUstream);
} cs;

static CUcontext ctx;
static CUdeviceptr va;
static const size_t gran = (size_t)2 << 20;
static CUmemGenericAllocationHandle h[NCHUNKS];
static CUmemAccessDesc acc;
static atomic_int stop, moving, failed;
static atomic_long moves;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Moves every chunk from one half of the range to the other, and back. */
static void *mover(void *arg) {
  (void)arg;
  cu.set(ctx);
  int half = 0;
  while (!atomic_load(&stop)) {
    if (!atomic_load(&moving)) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
      continue;
    }
    for (int i = 0; i < NCHUNKS; i++) {
      CUdeviceptr from = va + ((size_t)half * NCHUNKS + (size_t)i) * gran;
      CUdeviceptr to = va + ((size_t)(1 - half) * NCHUNKS + (size_t)i) * gran;
      if (cu.unmap(from, gran) != CUDA_SUCCESS ||
          cu.map(to, gran, 0, h[i], 0) != CUDA_SUCCESS ||
          cu.access(to, gran, &acc, 1) != CUDA_SUCCESS) {
        atomic_store(&failed, 1);
        return NULL;
      }
      atomic_fetch_add(&moves, 1);
    }
    half = 1 - half;
  }
  return NULL;
}

static int load(void) {
  const dl_sym syms[] = {{&cs.stream_create, "cuStreamCreate"},
                         {&cs.stream_sync, "cuStreamSynchronize"},
                         {&cs.mem_alloc, "cuMemAlloc_v2"},
                         {&cs.memset, "cuMemsetD8Async"}};
  if (cu_vmm_load(&cu) != 0)
    return -1;
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

int main(void) {
  if (load() != 0 || cu.init(0) != CUDA_SUCCESS ||
      cu.retain(&ctx, 0) != CUDA_SUCCESS) {
    printf("launch_vs_vmm: no CUDA driver or device here; nothing measured\n");
    return 0;
  }
  cu.set(ctx);
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUstream s;
  CUdeviceptr buf;
  int ok = cu.reserve(&va, 2 * NCHUNKS * gran, 0, 0, 0) == CUDA_SUCCESS &&
           cs.stream_create(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
           cs.mem_alloc(&buf, 1 << 20) == CUDA_SUCCESS;
  for (int i = 0; ok && i < NCHUNKS; i++)
    ok = cu.create(&h[i], gran, &prop, 0) == CUDA_SUCCESS &&
         cu.map(va + (size_t)i * gran, gran, 0, h[i], 0) == CUDA_SUCCESS &&
         cu.access(va + (size_t)i * gran, gran, &acc, 1) == CUDA_SUCCESS;
  pthread_t t;
  if (!ok || pthread_create(&t, NULL, mover, NULL) != 0) {
    fprintf(stderr, "launch_vs_vmm: setting up failed\n");
    return 1;
  }
  for (int second = 0; second < 6 && !atomic_load(&failed); second++) {
    int m = second & 1;
    atomic_store(&moving, m);
    long m0 = atomic_load(&moves), n = 0;
    double t0 = now_s();
    while (now_s() - t0 < 1.0) {
      for (int k = 0; k < 64; k++)
        if (cs.memset(buf + (CUdeviceptr)(k & 15) * 4096, 1, 256, s) !=
            CUDA_SUCCESS)
          atomic_store(&failed, 1);
      n += 64;
      if ((n & 4095) == 0)
        cs.stream_sync(s);
    }
    cs.stream_sync(s);
    double dt = now_s() - t0;
    printf("second %d, mover %s: %.0f launches/s, %.0f moves/s\n", second + 1,
           m ? "moving" : "idle  ", (double)n / dt,
           (double)(atomic_load(&moves) - m0) / dt);
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  if (atomic_load(&failed)) {
    fprintf(stderr, "launch_vs_vmm: a driver call failed\n");
    return 1;
  }
  return 0;
}
