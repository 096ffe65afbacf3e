/* What the driver's virtual memory management costs by size of physical
 * allocation: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and
 * cuMemRelease for one handle of 2 to 128 MiB, and for 2 MiB handles mapped
 * side by side with one access call over them, as tidepool's pools grow.
 * It tells how much of a pool's growth is per-call overhead. Needs a GPU. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_vmm.h"

static cu_vmm cu;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void ok(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "vmm_cost: %s failed with %d\n", what, (int)r);
    exit(1);
  }
}

static int load(void) {
  return cu_vmm_load(&cu);
}

int main(void) {
  if (load() != 0 || cu.init(0) != CUDA_SUCCESS) {
    printf("vmm_cost: no CUDA driver here; nothing measured\n");
    return 0;
  }
  CUcontext ctx;
  ok(cu.retain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  ok(cu.set(ctx), "cuCtxSetCurrent");
  const size_t MiB = (size_t)1 << 20, total = 1024 * MiB;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                         CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr va;
  ok(cu.reserve(&va, total, 0, 0, 0), "cuMemAddressReserve");
  CUmemGenericAllocationHandle *h = calloc(total / (2 * MiB), sizeof *h);

  printf("one handle per allocation, %zu MiB in all per row; microseconds\n",
         total / MiB);
  printf("%8s %9s %9s %9s %9s %9s %12s\n", "size MiB", "create", "map",
         "access", "unmap", "release", "all per 2MiB");
  for (size_t size = 2 * MiB; size <= 128 * MiB; size *= 2) {
    size_t n = total / size;
    double t[6];
    t[0] = now_us();
    for (size_t i = 0; i < n; i++)
      ok(cu.create(&h[i], size, &prop, 0), "cuMemCreate");
    t[1] = now_us();
    for (size_t i = 0; i < n; i++)
      ok(cu.map(va + i * size, size, 0, h[i], 0), "cuMemMap");
    t[2] = now_us();
    for (size_t i = 0; i < n; i++)
      ok(cu.access(va + i * size, size, &acc, 1), "cuMemSetAccess");
    t[3] = now_us();
    for (size_t i = 0; i < n; i++)
      ok(cu.unmap(va + i * size, size), "cuMemUnmap");
    t[4] = now_us();
    for (size_t i = 0; i < n; i++)
      ok(cu.release(h[i]), "cuMemRelease");
    t[5] = now_us();
    printf("%8zu %9.1f %9.1f %9.1f %9.1f %9.1f %12.1f\n", size / MiB,
           (t[1] - t[0]) / n, (t[2] - t[1]) / n, (t[3] - t[2]) / n,
           (t[4] - t[3]) / n, (t[5] - t[4]) / n,
           (t[5] - t[0]) / (double)(total / (2 * MiB)));
  }

  /* tidepool's growth today: 2 MiB handles side by side, one access call
   * over the run, one unmap call over it. */
  printf("\n2 MiB handles mapped side by side, one access and one unmap call "
         "per run\n%8s %12s %12s %12s\n",
         "run MiB", "create+map", "access", "unmap+rel");
  for (size_t run = 2 * MiB; run <= 128 * MiB; run *= 4) {
    size_t runs = total / run, per = run / (2 * MiB);
    double t0 = now_us(), tc = 0, ta = 0, tu = 0;
    for (size_t r = 0; r < runs; r++) {
      CUdeviceptr at = va + r * run;
      double a = now_us();
      for (size_t i = 0; i < per; i++) {
        ok(cu.create(&h[r * per + i], 2 * MiB, &prop, 0), "cuMemCreate");
        ok(cu.map(at + i * 2 * MiB, 2 * MiB, 0, h[r * per + i], 0), "cuMemMap");
      }
      double b = now_us();
      ok(cu.access(at, run, &acc, 1), "cuMemSetAccess");
      double c = now_us();
      tc += b - a;
      ta += c - b;
    }
    double u = now_us();
    for (size_t r = 0; r < runs; r++) {
      ok(cu.unmap(va + r * run, run), "cuMemUnmap");
      for (size_t i = 0; i < per; i++)
        ok(cu.release(h[r * per + i]), "cuMemRelease");
    }
    tu = now_us() - u;
    (void)t0;
    size_t chunks = total / (2 * MiB);
    printf("%8zu %12.1f %12.1f %12.1f   (per 2 MiB chunk)\n", run / MiB,
           tc / chunks, ta / chunks, tu / chunks);
  }
  ok(cu.unreserve(va, total), "cuMemAddressFree");
  free(h);
  return 0;
}
