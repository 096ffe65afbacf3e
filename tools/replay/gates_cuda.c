/* The CUDA driver's stream memory operations for the lag model's gates:
 * cuStreamWriteValue32 and cuStreamWaitValue32 on words of host memory
 * that cuMemHostAlloc maps for the device. A waiting stream holds no host
 * thread, so any number of streams can be held at once. libcuda is reached
 * through dlopen and cuGetProcAddress, as the rest of the replay reaches
 * it, so the tool builds without the CUDA toolkit. */
#include <stdio.h>
#include <stdlib.h>

#include "dl_table.h"
#include "gates.h"

/* The few driver types used, as cuda.h declares them. */
typedef int cu_result;
typedef int cu_device;
typedef void *cu_context;
typedef void *cu_stream;
typedef unsigned long long cu_ptr;
enum {
  CU_MEMHOSTALLOC_PORTABLE = 0x01,
  CU_MEMHOSTALLOC_DEVICEMAP = 0x02,
  CU_STREAM_WAIT_VALUE_GEQ = 0x0,
  CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
};

static struct {
  cu_result (*init)(unsigned);
  cu_result (*error_name)(cu_result, const char **);
  cu_result (*device_get)(cu_device *, int);
  cu_result (*primary_retain)(cu_context *, cu_device);
  cu_result (*primary_release)(cu_device);
  cu_result (*ctx_push)(cu_context);
  cu_result (*ctx_pop)(cu_context *);
  cu_result (*host_alloc)(void **, size_t, unsigned);
  cu_result (*free_host)(void *);
  cu_result (*device_pointer)(cu_ptr *, void *, unsigned);
  cu_result (*write32)(cu_stream, cu_ptr, uint32_t, unsigned);
  cu_result (*wait32)(cu_stream, cu_ptr, uint32_t, unsigned);
} cu;

/* The ABI versions are those of cuda.h's current names: the memory
 * operations of CUDA 11.7 (cuStreamWaitValue32_v2), which need no driver
 * option, unlike the first ones. */
static int load(char *err, size_t len) {
  if (cu.wait32)
    return 0;
  const dl_cu_sym syms[] = {
      {&cu.init, "cuInit", 2000},
      {&cu.error_name, "cuGetErrorName", 6000},
      {&cu.device_get, "cuDeviceGet", 2000},
      {&cu.primary_retain, "cuDevicePrimaryCtxRetain", 7000},
      {&cu.primary_release, "cuDevicePrimaryCtxRelease", 11000},
      {&cu.ctx_push, "cuCtxPushCurrent", 4000},
      {&cu.ctx_pop, "cuCtxPopCurrent", 4000},
      {&cu.host_alloc, "cuMemHostAlloc", 2020},
      {&cu.free_host, "cuMemFreeHost", 2000},
      {&cu.device_pointer, "cuMemHostGetDevicePointer", 3020},
      {&cu.write32, "cuStreamWriteValue32", 11070},
      {&cu.wait32, "cuStreamWaitValue32", 11070}};
  const char *missing = dl_table_load_cuda(syms, sizeof syms / sizeof syms[0]);
  if (missing && !*missing)
    snprintf(err, len, "libcuda.so.1 cannot be loaded");
  else if (missing)
    snprintf(err, len, "libcuda lacks %s", missing);
  if (missing)
    cu.wait32 = NULL;
  return missing ? -1 : 0;
}

static const char *name_of(cu_result r) {
  const char *n = "CUDA_ERROR_UNKNOWN";
  cu.error_name(r, &n);
  return n;
}

typedef struct cuda_words {
  cu_device dev;
  cu_context ctx; /* device 0's primary context, retained */
  char *host;     /* the words as the host sees them */
  cu_ptr device;  /* and as the device does */
} cuda_words;

/* A stream given as NULL is the legacy stream of the current context, so
 * every call runs with the words' context current. */
static cu_result enter(cuda_words *w) {
  return cu.ctx_push(w->ctx);
}

static void leave(void) {
  cu_context prev;
  (void)cu.ctx_pop(&prev);
}

static int fail(const char *what, cu_result r, char *err, size_t len) {
  snprintf(err, len, "%s: %s", what, name_of(r));
  return -1;
}

static int words_alloc(void **ctx, _Atomic uint32_t **words, size_t n,
                       char *err, size_t len) {
  if (load(err, len) != 0)
    return -1;
  cuda_words *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  cu_result r = cu.init(0);
  if (r == 0)
    r = cu.device_get(&w->dev, 0);
  if (r == 0)
    r = cu.primary_retain(&w->ctx, w->dev);
  if (r) {
    free(w);
    return fail("device 0's primary context", r, err, len);
  }
  void *host = NULL;
  r = enter(w);
  if (r == 0) {
    size_t bytes = n * sizeof(uint32_t);
    r = cu.host_alloc(&host, bytes,
                      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == 0)
      r = cu.device_pointer(&w->device, host, 0);
    if (r == 0) {
      /* Zeroed through atomics: the device reads these words. */
      for (size_t i = 0; i < n; i++)
        atomic_init((_Atomic uint32_t *)host + i, 0);
    } else if (host) {
      (void)cu.free_host(host);
    }
    leave();
  }
  if (r) {
    (void)cu.primary_release(w->dev);
    free(w);
    return fail("cuMemHostAlloc of the gates' words", r, err, len);
  }
  w->host = host;
  *words = (_Atomic uint32_t *)host;
  *ctx = w;
  return 0;
}

static void words_release(void *ctx, _Atomic uint32_t *words) {
  cuda_words *w = ctx;
  (void)words;
  if (enter(w) == 0) {
    (void)cu.free_host(w->host);
    leave();
  }
  (void)cu.primary_release(w->dev);
  free(w);
}

static cu_ptr device_address(const cuda_words *w, _Atomic uint32_t *word) {
  return w->device + (cu_ptr)((char *)word - w->host);
}

static int write_word(void *ctx, tp_stream_t s, _Atomic uint32_t *word,
                      uint32_t value, char *err, size_t len) {
  cuda_words *w = ctx;
  cu_result r = enter(w);
  if (r == 0) {
    /* The default flags put a memory fence before the write: the host sees
     * the number only after the effects of the work before it, the events
     * the pool polls included. */
    r = cu.write32((cu_stream)s, device_address(w, word), value,
                   CU_STREAM_WRITE_VALUE_DEFAULT);
    leave();
  }
  return r ? fail("cuStreamWriteValue32", r, err, len) : 0;
}

static int wait_word(void *ctx, tp_stream_t s, _Atomic uint32_t *word,
                     uint32_t value, char *err, size_t len) {
  cuda_words *w = ctx;
  cu_result r = enter(w);
  if (r == 0) {
    r = cu.wait32((cu_stream)s, device_address(w, word), value,
                  CU_STREAM_WAIT_VALUE_GEQ);
    leave();
  }
  return r ? fail("cuStreamWaitValue32", r, err, len) : 0;
}

const gate_memops gate_memops_cuda = {.name = "cuda stream memory operations",
                                      .alloc = words_alloc,
                                      .release = words_release,
                                      .write = write_word,
                                      .wait = wait_word,
                                      .changed = NULL};
