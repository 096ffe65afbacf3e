/* A near-free PyTorch pluggable allocator, to measure what PyTorch's own
 * path to a pluggable allocator costs (bench/torch_lockstep.py, allocator
 * "null"). Freed blocks wait in a list per exact size (rounded up to 512
 * bytes) and are handed out again at once; nothing is ever given back and
 * streams are ignored, which is safe only for a program that allocates and
 * frees on one stream, as the GPT benchmark does. Not part of tidepool.
 *
 * TORCH_NULL_FRESH chooses how a block of 1 MiB or more is first made:
 * "alloc" (the default) cuMemAlloc, "vmm" the driver's virtual memory with
 * one 2 MiB physical chunk made and mapped at a time (as tidepool and
 * expandable_segments make theirs), "vmm1" one physical allocation for the
 * whole block. Smaller blocks always come from cuMemAlloc.
 *
 *   cc -O2 -shared -fPIC -o null_alloc.so bench/null_alloc/null_alloc.c \
 *      -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define SLOTS 8192 /* distinct sizes; a training loop uses a few hundred */

typedef struct {
  size_t size; /* 0: empty slot */
  void **v;
  size_t n, cap;
} bin;

static bin bins[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static bin *bin_of(size_t size) {
  size_t h = (size >> 9) * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < SLOTS; i++) {
    bin *b = &bins[(h + i) % SLOTS];
    if (b->size == size || b->size == 0) {
      b->size = size;
      return b;
    }
  }
  return NULL;
}

#define CHUNK ((size_t)2 << 20)

/* A block of `size` bytes (a multiple of CHUNK) from the driver's virtual
 * memory: `pieces` physical allocations of size / pieces bytes each. */
static CUdeviceptr vmm_block(size_t size, size_t pieces, int device) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                            CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr base = 0;
  CUresult r = cuMemAddressReserve(&base, size, CHUNK, 0, 0);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "null_alloc: reserving %zu bytes: error %d\n", size, r);
    return 0;
  }
  size_t piece = size / pieces;
  for (size_t i = 0; i < pieces; i++) {
    CUmemGenericAllocationHandle h = 0;
    const char *what = "cuMemCreate";
    r = cuMemCreate(&h, piece, &prop, 0);
    if (r == CUDA_SUCCESS) {
      what = "cuMemMap";
      r = cuMemMap(base + i * piece, piece, 0, h, 0);
    }
    if (r == CUDA_SUCCESS) {
      what = "cuMemSetAccess";
      r = cuMemSetAccess(base + i * piece, piece, &access, 1);
    }
    if (r != CUDA_SUCCESS) {
      fprintf(stderr,
              "null_alloc: VMM block of %zu bytes, piece %zu of %zu: %s "
              "error %d\n",
              size, i, pieces, what, r);
      return 0; /* a benchmark's allocator: what was made stays */
    }
    (void)cuMemRelease(h); /* the mapping keeps the memory */
  }
  return base;
}

static void *fresh(size_t size, int device) {
  CUcontext ctx = NULL;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
    CUdevice dev;
    if (cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return NULL;
  }
  const char *mode = getenv("TORCH_NULL_FRESH");
  if (mode && size >= (CHUNK >> 1) &&
      (!strcmp(mode, "vmm") || !strcmp(mode, "vmm1"))) {
    size_t whole = (size + CHUNK - 1) / CHUNK * CHUNK;
    size_t pieces = !strcmp(mode, "vmm") ? whole / CHUNK : 1;
    return (void *)(uintptr_t)vmm_block(whole, pieces, device);
  }
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, size) != CUDA_SUCCESS) {
    fprintf(stderr, "null_alloc: cuMemAlloc(%zu) failed\n", size);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

void *null_alloc(ssize_t size, int device, void *stream) {
  (void)stream;
  if (size <= 0)
    return NULL;
  size_t r = ((size_t)size + 511) & ~(size_t)511;
  pthread_mutex_lock(&lock);
  bin *b = bin_of(r);
  void *p = b && b->n ? b->v[--b->n] : NULL;
  pthread_mutex_unlock(&lock);
  return p ? p : fresh(r, device);
}

void null_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device;
  (void)stream;
  if (!ptr)
    return;
  size_t r = ((size_t)size + 511) & ~(size_t)511;
  pthread_mutex_lock(&lock);
  bin *b = bin_of(r);
  if (b && b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 16;
    void **v = realloc(b->v, cap * sizeof *v);
    if (v) {
      b->v = v;
      b->cap = cap;
    }
  }
  if (b && b->n < b->cap)
    b->v[b->n++] = ptr;
  pthread_mutex_unlock(&lock);
}
