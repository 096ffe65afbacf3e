/* test_preload_fake: libtidepool_preload.so end to end over the fake driver
 * (test/fake_cuda, TIDEPOOL_PLATFORM=cuda), as a plain driver-API program
 * uses it: libcuda.so.1 opened with dlopen, every entry point fetched
 * through cuGetProcAddress_v2 as a runtime does, real streams that run their
 * work on threads of the fake. It checks what test_preload_driver (run over
 * the fake too) does not: that a block freed on a stream held by a host
 * function is handed to another stream only as each reuse policy allows,
 * and then after the free in stream order (the memory's contents tell); that
 * the pool figures are exact with allocations on several streams and
 * threads; the driver's answers to bad input; graphs captured with
 * allocations in them, launched several times; and a forked child's answers.
 * Usage: test_preload_fake (with LD_PRELOAD, TIDEPOOL_PLATFORM=cuda and the
 * fake first in LD_LIBRARY_PATH) */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "check.h"

#define MiB ((size_t)1 << 20)
#define PER_THREAD CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
#define CHECK_RC(expr, want) CHECK_EQ_INT((expr), (want))
#define REQUIRE_RC(expr, want) REQUIRE_EQ_INT((expr), (want))

static PFN_cuGetProcAddress_v12000 get_proc;

static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_retain;
  PFN_cuCtxSetCurrent_v4000 ctx_set;
  PFN_cuCtxSynchronize_v2000 ctx_sync;
  PFN_cuCtxSynchronize_v13000 ctx_sync_v2;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamSynchronize_v2000 stream_sync;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  PFN_cuGraphDestroy_v10000 graph_destroy;
  PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
  PFN_cuGraphLaunch_v10000 graph_launch;
  PFN_cuGraphExecDestroy_v10000 exec_destroy;
  PFN_cuEventCreate_v2000 event_create;
  PFN_cuEventDestroy_v4000 event_destroy;
  PFN_cuEventRecord_v2000 event_record;
  PFN_cuEventSynchronize_v2000 event_sync;
  PFN_cuStreamWaitEvent_v3020 stream_wait;
  PFN_cuLaunchHostFunc_v10000 launch_host_func;
  PFN_cuMemAlloc_v3020 mem_alloc;
  PFN_cuMemFree_v3020 mem_free;
  PFN_cuMemsetD8Async_v3020 memset_d8;
  PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh;
  PFN_cuMemAllocAsync_v11020 alloc;
  PFN_cuMemFreeAsync_v11020 free;
  PFN_cuMemAllocFromPoolAsync_v11020 alloc_from_pool;
  PFN_cuMemPoolCreate_v11020 pool_create;
  PFN_cuMemPoolDestroy_v11020 pool_destroy;
  PFN_cuMemPoolGetAttribute_v11020 pool_get_attr;
  PFN_cuMemPoolSetAttribute_v11020 pool_set_attr;
  PFN_cuMemPoolSetAccess_v11020 pool_set_access;
  PFN_cuMemPoolTrimTo_v11020 pool_trim;
  PFN_cuDeviceGetDefaultMemPool_v11020 default_pool;
  PFN_cuDeviceGetMemPool_v11020 get_pool;
  PFN_cuDeviceSetMemPool_v11020 set_pool;
  PFN_cuDeviceGetGraphMemAttribute_v11040 graph_mem_get;
  PFN_cuDeviceSetGraphMemAttribute_v11040 graph_mem_set;
  PFN_cuDeviceGraphMemTrim_v11040 graph_mem_trim;
  PFN_cuStreamBeginCapture_v10010_ptsz begin_capture_pt;
  PFN_cuStreamEndCapture_v10000_ptsz end_capture_pt;
  PFN_cuStreamBeginCaptureToGraph_v12030 begin_to_graph;
  PFN_cuMemPoolExportPointer_v11020 ptr_export;
  PFN_cuGraphCreate_v10000 graph_create;
  unsigned long long (*capture_questions)(void); /* the fake's own */
  unsigned long long (*id_questions)(void);      /* the fake's own */
  unsigned long long (*ctx_syncs)(void);         /* the fake's own */
  unsigned long long (*stream_syncs)(void);      /* the fake's own */
  unsigned long long (*event_syncs)(void);       /* the fake's own */
} cu;

static int fetch(const char *name, int version, cuuint64_t flags, void *out) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (get_proc(name, &fn, version, flags, &found) != CUDA_SUCCESS ||
      found != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
    printf("FAIL: the driver has no %s at %d\n", name, version);
    return 0;
  }
  memcpy(out, &fn, sizeof fn);
  return 1;
}

static int load_driver(void) {
  void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!libcuda)
    return 0;
  void *sym = dlsym(libcuda, "cuGetProcAddress_v2");
  memcpy(&get_proc, &sym, sizeof sym);
  if (!get_proc)
    return 0;
  /* As a runtime does: cuGetProcAddress through itself first. */
  void *self = NULL;
  if (!fetch("cuGetProcAddress", 12000, 0, &self))
    return 0;
  memcpy(&get_proc, &self, sizeof self);
  int ok = 1;
#define F(field, name, version) ok = fetch(name, version, 0, &cu.field) && ok
  F(init, "cuInit", 2000);
  F(device_get, "cuDeviceGet", 2000);
  F(primary_retain, "cuDevicePrimaryCtxRetain", 7000);
  F(ctx_set, "cuCtxSetCurrent", 4000);
  F(ctx_sync, "cuCtxSynchronize", 2000);
  F(ctx_sync_v2, "cuCtxSynchronize", 13000);
  F(stream_create, "cuStreamCreate", 2000);
  F(stream_destroy, "cuStreamDestroy", 4000);
  F(stream_sync, "cuStreamSynchronize", 2000);
  F(begin_capture, "cuStreamBeginCapture", 10010);
  F(end_capture, "cuStreamEndCapture", 10000);
  F(graph_destroy, "cuGraphDestroy", 10000);
  F(instantiate, "cuGraphInstantiateWithFlags", 11040);
  F(graph_launch, "cuGraphLaunch", 10000);
  F(exec_destroy, "cuGraphExecDestroy", 10000);
  F(event_create, "cuEventCreate", 2000);
  F(event_destroy, "cuEventDestroy", 4000);
  F(event_record, "cuEventRecord", 2000);
  F(event_sync, "cuEventSynchronize", 2000);
  F(stream_wait, "cuStreamWaitEvent", 3020);
  F(launch_host_func, "cuLaunchHostFunc", 10000);
  F(mem_alloc, "cuMemAlloc", 3020);
  F(mem_free, "cuMemFree", 3020);
  F(memset_d8, "cuMemsetD8Async", 3020);
  F(memcpy_dtoh, "cuMemcpyDtoHAsync", 3020);
  F(alloc, "cuMemAllocAsync", 11020);
  F(free, "cuMemFreeAsync", 11020);
  F(alloc_from_pool, "cuMemAllocFromPoolAsync", 11020);
  F(pool_create, "cuMemPoolCreate", 11020);
  F(pool_destroy, "cuMemPoolDestroy", 11020);
  F(pool_get_attr, "cuMemPoolGetAttribute", 11020);
  F(pool_set_attr, "cuMemPoolSetAttribute", 11020);
  F(pool_set_access, "cuMemPoolSetAccess", 11020);
  F(pool_trim, "cuMemPoolTrimTo", 11020);
  F(default_pool, "cuDeviceGetDefaultMemPool", 11020);
  F(get_pool, "cuDeviceGetMemPool", 11020);
  F(set_pool, "cuDeviceSetMemPool", 11020);
  F(graph_mem_get, "cuDeviceGetGraphMemAttribute", 11040);
  F(graph_mem_set, "cuDeviceSetGraphMemAttribute", 11040);
  F(graph_mem_trim, "cuDeviceGraphMemTrim", 11040);
  F(begin_to_graph, "cuStreamBeginCaptureToGraph", 12030);
  F(graph_create, "cuGraphCreate", 10000);
  F(ptr_export, "cuMemPoolExportPointer", 11020);
#undef F
  ok = fetch("cuStreamBeginCapture", 10010, PER_THREAD, &cu.begin_capture_pt) &&
       ok;
  ok = fetch("cuStreamEndCapture", 10000, PER_THREAD, &cu.end_capture_pt) && ok;
  sym = dlsym(libcuda, "fake_cuda_capture_questions");
  memcpy(&cu.capture_questions, &sym, sizeof sym);
  sym = dlsym(libcuda, "fake_cuda_id_questions");
  memcpy(&cu.id_questions, &sym, sizeof sym);
  sym = dlsym(libcuda, "fake_cuda_ctx_syncs");
  memcpy(&cu.ctx_syncs, &sym, sizeof sym);
  sym = dlsym(libcuda, "fake_cuda_stream_syncs");
  memcpy(&cu.stream_syncs, &sym, sizeof sym);
  sym = dlsym(libcuda, "fake_cuda_event_syncs");
  memcpy(&cu.event_syncs, &sym, sizeof sym);
  return ok && cu.capture_questions && cu.id_questions && cu.ctx_syncs &&
         cu.stream_syncs && cu.event_syncs;
}

/* ---- the interposer's diagnostics --------------------------------------- */

enum { MODE_CUDA = 2 };
enum { C_MALLOC, C_FREE, C_POOL, C_FORWARDED };

static int (*preload_mode)(void);
static unsigned long long (*preload_counter)(int);

static int load_diagnostics(void) {
  void *sym = dlsym(RTLD_DEFAULT, "tidepool_preload_mode");
  memcpy(&preload_mode, &sym, sizeof sym);
  sym = dlsym(RTLD_DEFAULT, "tidepool_preload_counter");
  memcpy(&preload_counter, &sym, sizeof sym);
  return preload_mode && preload_counter;
}

/* ---- helpers ---------------------------------------------------------------
 */

static CUdevice dev0;
static CUcontext ctx_of_test; /* device 0's primary context */

static uint64_t attr(CUmemoryPool pool, CUmemPool_attribute a) {
  uint64_t v = UINT64_MAX;
  CHECK_RC(cu.pool_get_attr(pool, a, &v), CUDA_SUCCESS);
  return v;
}

/* An allocation and free on s while s captures: the driver is asked (the
 * capture was seen), and the graph's memory is not the pool's. */
static void check_graph_alloc(CUmemoryPool pool, CUstream s) {
  uint64_t used = attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  unsigned long long asked = cu.capture_questions();
  CUdeviceptr g = 0;
  CHECK_RC(cu.alloc(&g, MiB, s), CUDA_SUCCESS);
  CHECK(cu.capture_questions() > asked);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used);
  CHECK_RC(cu.free(g, s), CUDA_SUCCESS);
}

static void set_int(CUmemoryPool pool, CUmemPool_attribute a, int v) {
  CHECK_RC(cu.pool_set_attr(pool, a, &v), CUDA_SUCCESS);
}

static CUmemoryPool new_pool(void) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = NULL;
  CHECK_RC(cu.pool_create(&pool, &props), CUDA_SUCCESS);
  return pool;
}

static CUstream new_stream(void) {
  CUstream s = NULL;
  CHECK_RC(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  return s;
}

/* A host function that waits for its gate to open and then writes `len`
 * bytes of `value` at `mem` (when set): the last use of a block by work
 * queued before its free, as a kernel still running would be. */
typedef struct held {
  atomic_int open, ran;
  unsigned char *mem;
  size_t len;
  unsigned char value;
} held;

static void held_fn(void *arg) {
  held *h = arg;
  double deadline = check_now_s() + 30.0;
  while (!atomic_load(&h->open)) {
    if (check_now_s() > deadline) {
      CHECK_FAIL("a held stream was never released");
      break;
    }
    check_sleep_us(100);
  }
  if (h->mem)
    memset(h->mem, h->value, h->len);
  atomic_store(&h->ran, 1);
}

static void mark_fn(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

/* ---- tests ------------------------------------------------------------------
 */

/* The first allocation decides the mode: tidepool's cuda platform answers,
 * and the figures the pool attributes give are tidepool's (2 MiB chunks),
 * not the fake driver's own pool's (which would charge 4 KiB pages). */
static void test_from_tidepool(void) {
  unsigned long long mallocs = preload_counter(C_MALLOC);
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  uint64_t zero = 0;
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
           CUDA_SUCCESS);
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc(&p, 100, NULL), CUDA_SUCCESS);
  CHECK_EQ_INT(preload_mode(), MODE_CUDA);
  CHECK_EQ_U64(preload_counter(C_MALLOC) - mallocs, 1);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 100);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * MiB);
  /* The memory is the device's: work on the stream reaches it. */
  unsigned char back[4] = {0};
  CHECK_RC(cu.memset_d8(p, 0x7e, 100, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.memcpy_dtoh(back, p + 96, sizeof back, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_EQ_INT(back[3], 0x7e);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
}

/* A block freed on stream a behind a held host function that still writes
 * to it, then asked for on stream b, under each combination of the reuse
 * policies. Nothing orders b after a's free: b may be given the block only
 * where internal dependencies are allowed, and then its work must wait for
 * the free (its memset lands after the held function's write). */
static void reuse_case(int follow, int opportunistic, int internal) {
  char label[64];
  snprintf(label, sizeof label, "follow %d opportunistic %d internal %d",
           follow, opportunistic, internal);
  check_context(label);
  CUmemoryPool pool = new_pool();
  REQUIRE(pool != NULL);
  set_int(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, follow);
  set_int(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, opportunistic);
  set_int(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, internal);
  CUstream a = new_stream(), b = new_stream();
  CUdeviceptr p = 0, q = 0;
  REQUIRE_RC(cu.alloc_from_pool(&p, 4 * MiB, pool, a), CUDA_SUCCESS);
  static held h;
  atomic_store(&h.open, 0);
  atomic_store(&h.ran, 0);
  h.mem = (unsigned char *)(uintptr_t)p;
  h.len = 4 * MiB;
  h.value = 0xaa;
  CHECK_RC(cu.launch_host_func(a, held_fn, &h), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, a), CUDA_SUCCESS);

  REQUIRE_RC(cu.alloc_from_pool(&q, 4 * MiB, pool, b), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(q, 0x55, 4 * MiB, b), CUDA_SUCCESS);
  atomic_int b_ran = 0;
  CHECK_RC(cu.launch_host_func(b, mark_fn, &b_ran), CUDA_SUCCESS);
  if (q == p) {
    CHECK(internal);
    /* b's work waits for a's free. */
    check_sleep_ms(30);
    CHECK_EQ_INT(atomic_load(&b_ran), 0);
  }
  atomic_store(&h.open, 1);
  CHECK_RC(cu.stream_sync(b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(a), CUDA_SUCCESS);
  unsigned char back[2] = {0};
  CHECK_RC(cu.memcpy_dtoh(&back[0], q, 1, b), CUDA_SUCCESS);
  CHECK_RC(cu.memcpy_dtoh(&back[1], q + 4 * MiB - 1, 1, b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(b), CUDA_SUCCESS);
  CHECK_EQ_INT(back[0], 0x55);
  CHECK_EQ_INT(back[1], 0x55);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MiB);
  CHECK_RC(cu.free(q, b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(b), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_RC(cu.stream_destroy(a), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(b), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
  check_context(NULL);
}

static void test_reuse_policies(void) {
  for (int bits = 0; bits < 8; bits++)
    reuse_case(bits & 1, (bits >> 1) & 1, (bits >> 2) & 1);
}

/* With an event between them, b follows a's free: with event dependencies
 * followed the block may be b's at once, and b's work lands after a's. */
static void test_reuse_after_event(void) {
  CUmemoryPool pool = new_pool();
  REQUIRE(pool != NULL);
  set_int(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
  set_int(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
  CUstream a = new_stream(), b = new_stream();
  CUevent e = NULL;
  REQUIRE_RC(cu.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  REQUIRE_RC(cu.alloc_from_pool(&p, 2 * MiB, pool, a), CUDA_SUCCESS);
  static held h;
  atomic_store(&h.open, 0);
  h.mem = (unsigned char *)(uintptr_t)p;
  h.len = 2 * MiB;
  h.value = 0xaa;
  CHECK_RC(cu.launch_host_func(a, held_fn, &h), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, a), CUDA_SUCCESS);
  CHECK_RC(cu.event_record(e, a), CUDA_SUCCESS);
  CHECK_RC(cu.stream_wait(b, e, 0), CUDA_SUCCESS);
  REQUIRE_RC(cu.alloc_from_pool(&q, 2 * MiB, pool, b), CUDA_SUCCESS);
  CHECK(q == p);
  CHECK_RC(cu.memset_d8(q, 0x55, 2 * MiB, b), CUDA_SUCCESS);
  atomic_store(&h.open, 1);
  unsigned char back = 0;
  CHECK_RC(cu.memcpy_dtoh(&back, q + 12345, 1, b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(b), CUDA_SUCCESS);
  CHECK_EQ_INT(back, 0x55);
  CHECK_RC(cu.free(q, b), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_RC(cu.event_destroy(e), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(a), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(b), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
}

/* Allocations on several streams from several threads: used is the sum of
 * the sizes asked for, exactly, and its high mark the most held at once;
 * reserved stays at the threshold once everything is freed. */
#define STAT_THREADS 4
#define STAT_ALLOCS 16

typedef struct stat_arg {
  CUcontext ctx;
  CUmemoryPool pool;
  CUstream stream;
  CUdeviceptr ptrs[STAT_ALLOCS];
  size_t sizes[STAT_ALLOCS];
  CUresult err;
} stat_arg;

static void *stat_thread(void *arg) {
  stat_arg *s = arg;
  s->err = cu.ctx_set(s->ctx);
  for (int i = 0; i < STAT_ALLOCS && s->err == CUDA_SUCCESS; i++)
    s->err = cu.alloc_from_pool(&s->ptrs[i], s->sizes[i], s->pool, s->stream);
  return NULL;
}

static void test_exact_stats(void) {
  CUmemoryPool pool = new_pool();
  REQUIRE(pool != NULL);
  uint64_t keep = UINT64_MAX;
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
           CUDA_SUCCESS);
  CUcontext ctx = NULL;
  REQUIRE_RC(cu.primary_retain(&ctx, dev0), CUDA_SUCCESS);
  static stat_arg args[STAT_THREADS];
  uint64_t total = 0;
  pthread_t threads[STAT_THREADS];
  for (int t = 0; t < STAT_THREADS; t++) {
    args[t] = (stat_arg){.ctx = ctx, .pool = pool, .stream = new_stream()};
    for (int i = 0; i < STAT_ALLOCS; i++) {
      args[t].sizes[i] = (size_t)(t + 1) * 4096 + (size_t)i * 777 + 1;
      total += args[t].sizes[i];
    }
  }
  for (int t = 0; t < STAT_THREADS; t++)
    REQUIRE_EQ_INT(pthread_create(&threads[t], NULL, stat_thread, &args[t]), 0);
  for (int t = 0; t < STAT_THREADS; t++) {
    pthread_join(threads[t], NULL);
    CHECK_RC(args[t].err, CUDA_SUCCESS);
  }
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), total);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), total);
  uint64_t reserved = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  CHECK(reserved >= total);
  CHECK_EQ_U64(reserved % (2 * MiB), 0);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), reserved);
  /* Every pointer distinct and apart by at least its size. */
  for (int t = 0; t < STAT_THREADS; t++)
    for (int i = 0; i < STAT_ALLOCS; i++)
      for (int u = 0; u < STAT_THREADS; u++)
        for (int j = 0; j < STAT_ALLOCS; j++) {
          if (u == t && j == i)
            continue;
          CUdeviceptr x = args[t].ptrs[i], y = args[u].ptrs[j];
          if (x <= y && x + args[t].sizes[i] > y)
            CHECK_FAIL("blocks %d.%d and %d.%d overlap", t, i, u, j);
        }

  /* Half freed, each on another thread's stream (ordered after it). */
  uint64_t freed = 0;
  for (int t = 0; t < STAT_THREADS; t++)
    for (int i = 0; i < STAT_ALLOCS; i += 2) {
      CHECK_RC(cu.free(args[t].ptrs[i], args[(t + 1) % STAT_THREADS].stream),
               CUDA_SUCCESS);
      freed += args[t].sizes[i];
    }
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), total - freed);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), total);
  uint64_t zero = 0;
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
           CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), total - freed);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), reserved);
  for (int t = 0; t < STAT_THREADS; t++)
    for (int i = 1; i < STAT_ALLOCS; i += 2)
      CHECK_RC(cu.free(args[t].ptrs[i], args[t].stream), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), reserved);
  CHECK_RC(cu.pool_trim(pool, 0), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero),
           CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0);
  for (int t = 0; t < STAT_THREADS; t++)
    CHECK_RC(cu.stream_destroy(args[t].stream), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
}

/* Bad input answers as the driver does (test/conformance/driver_answers.txt
 * for the rows it has, cuda.h's documented codes for the others). */
static void test_bad_input(void) {
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(NULL, 16, NULL), CUDA_ERROR_INVALID_VALUE);
  p = 1;
  CHECK_RC(cu.alloc(&p, 0, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(p, 0);
  CHECK_RC(cu.alloc(&p, (size_t)1 << 50, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(cu.alloc(&p, SIZE_MAX, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_RC(cu.free(0, NULL), CUDA_SUCCESS);

  /* Twice, an interior pointer, a host pointer. */
  REQUIRE_RC(cu.alloc(&p, 4096, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p + 256, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  int local = 0;
  CHECK_RC(cu.free((CUdeviceptr)(uintptr_t)&local, NULL),
           CUDA_ERROR_INVALID_VALUE);

  /* Exporting a pointer of a pool made without a shareable handle type is
   * refused, as the driver refuses it, not passed to a driver that does
   * not know the address (the fake answers NOT_SUPPORTED there). */
  REQUIRE_RC(cu.alloc(&p, 4096, NULL), CUDA_SUCCESS);
  CUmemPoolPtrExportData record;
  CHECK_RC(cu.ptr_export(&record, p), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.ptr_export(&record, p + 100), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);

  /* cuMemAlloc's memory freed in stream order: the driver takes it. */
  CUdeviceptr m = 0;
  REQUIRE_RC(cu.mem_alloc(&m, 8192), CUDA_SUCCESS);
  unsigned long long forwarded = preload_counter(C_FORWARDED);
  CHECK_RC(cu.free(m, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(preload_counter(C_FORWARDED) - forwarded, 1);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_RC(cu.mem_free(m), CUDA_ERROR_INVALID_VALUE);

  /* A stream-ordered allocation freed with cuMemFree; then again. */
  REQUIRE_RC(cu.alloc(&p, 4096, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.mem_free(p), CUDA_SUCCESS);
  CHECK_RC(cu.mem_free(p), CUDA_ERROR_INVALID_VALUE);

  /* A destroyed stream's handle is refused (the driver says
   * CUDA_ERROR_INVALID_HANDLE; tidepool's cuda platform has no such code and
   * answers INVALID_VALUE, see cuda_stream.c). */
  CUstream s = new_stream();
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK(cu.alloc(&p, 4096, s) != CUDA_SUCCESS);

  /* Pools: the default cannot be destroyed, a destroyed one is gone, an
   * allocation outlives its destroyed pool. */
  CUmemoryPool def = NULL;
  REQUIRE_RC(cu.default_pool(&def, dev0), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(def), CUDA_ERROR_INVALID_VALUE);
  uint64_t v = 1;
  CHECK_RC(cu.pool_set_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_set_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_get_attr(def, (CUmemPool_attribute)999, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_get_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL),
           CUDA_ERROR_INVALID_VALUE);
  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CHECK_RC(cu.pool_set_access(def, &desc, 1), CUDA_ERROR_INVALID_DEVICE);
  desc.location.id = 5;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_RC(cu.pool_set_access(def, &desc, 1), CUDA_ERROR_INVALID_DEVICE);

  CUmemoryPool pool = new_pool();
  REQUIRE(pool != NULL);
  REQUIRE_RC(cu.alloc_from_pool(&p, MiB, pool, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.alloc_from_pool(&p, MiB, pool, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.set_pool(dev0, pool), CUDA_ERROR_INVALID_VALUE);
  CUmemoryPool cur = NULL;
  CHECK_RC(cu.get_pool(&cur, dev0), CUDA_SUCCESS);
  CHECK(cur == def);
}

/* A destroyed pool that was the device's current one: the device falls
 * back to its default pool, as the driver's does. */
static void test_destroy_current(void) {
  CUmemoryPool def = NULL, cur = NULL;
  REQUIRE_RC(cu.default_pool(&def, dev0), CUDA_SUCCESS);
  CUmemoryPool pool = new_pool();
  REQUIRE(pool != NULL);
  CHECK_RC(cu.set_pool(dev0, pool), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
  CHECK_RC(cu.get_pool(&cur, dev0), CUDA_SUCCESS);
  CHECK(cur == def);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, MiB, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
}

/* A graph captured with allocations, launched several times: each launch
 * has its memory (the kept one's contents read back), the freed one is
 * reused within the graph, and the figures fall back once done. */
static void test_capture(void) {
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  uint64_t used = attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUstream s = new_stream();
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr tmp = 0, out = 0;
  CHECK_RC(cu.alloc(&tmp, MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.alloc(&out, 64, s), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(tmp, 0x11, MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(out, 0x22, 64, s), CUDA_SUCCESS);
  CHECK_RC(cu.free(tmp, s), CUDA_SUCCESS);
  CUgraph graph = NULL;
  REQUIRE_RC(cu.end_capture(s, &graph), CUDA_SUCCESS);
  CUgraphExec exec = NULL;
  REQUIRE_RC(cu.instantiate(&exec, graph, 0), CUDA_SUCCESS);
  for (int i = 0; i < 3; i++) {
    CHECK_RC(cu.graph_launch(exec, s), CUDA_SUCCESS);
    unsigned char back = 0;
    CHECK_RC(cu.memcpy_dtoh(&back, out + 63, 1, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
    CHECK_EQ_INT(back, 0x22);
    CHECK_RC(cu.free(out, s), CUDA_SUCCESS);
  }
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  CHECK_RC(cu.exec_destroy(exec), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used);
}

static uint64_t graph_mem(CUgraphMem_attribute attr) {
  cuuint64_t v = UINT64_MAX;
  CHECK_RC(cu.graph_mem_get(dev0, attr, &v), CUDA_SUCCESS);
  return v;
}

/* The driver's graph memory calls are tidepool's too (a program built with
 * the static runtime reaches them only through cuGetProcAddress): a graph's
 * output counts while it lives, trim gives the memory back once it is
 * freed and the graph gone, and the highs reset only to 0. */
static void test_graph_mem_driver_names(void) {
  CHECK_RC(cu.graph_mem_trim(dev0), CUDA_SUCCESS);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 0);
  CUstream s = new_stream();
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr out = 0;
  CHECK_RC(cu.alloc(&out, 4 * MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(out, 0x33, 4 * MiB, s), CUDA_SUCCESS);
  CUgraph graph = NULL;
  REQUIRE_RC(cu.end_capture(s, &graph), CUDA_SUCCESS);
  CUgraphExec exec = NULL;
  REQUIRE_RC(cu.instantiate(&exec, graph, 0), CUDA_SUCCESS);
  CHECK_RC(cu.graph_launch(exec, s), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  CHECK(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= 4 * MiB);
  CHECK(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >= 4 * MiB);
  CHECK_RC(cu.graph_mem_get(dev0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, NULL),
           CUDA_ERROR_INVALID_VALUE);
  cuuint64_t v = 1;
  CHECK_RC(cu.graph_mem_set(dev0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.free(out, s), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  CHECK_RC(cu.exec_destroy(exec), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_RC(cu.graph_mem_trim(dev0), CUDA_SUCCESS);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 0);
  v = 0;
  CHECK_RC(cu.graph_mem_set(dev0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v),
           CUDA_SUCCESS);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), 0);
}

/* The capture questions that `pairs` allocation and free pairs on `s`
 * asked the driver. */
static unsigned long long pairs_ask(CUstream s, int pairs) {
  unsigned long long before = cu.capture_questions();
  for (int i = 0; i < pairs; i++) {
    CUdeviceptr p = 0;
    CHECK_RC(cu.alloc(&p, 256, s), CUDA_SUCCESS);
    CHECK_RC(cu.free(p, s), CUDA_SUCCESS);
  }
  return cu.capture_questions() - before;
}

/* A capture that fails (here invalidated by a synchronize of its stream)
 * returns no graph, so its allocations were never made: the driver ends
 * it, and tidepool's memory for it goes too, where it once stayed mapped
 * for good, 4 MiB a capture (a helper's black-box round). */
static void test_failed_capture_memory(void) {
  CHECK_RC(cu.graph_mem_trim(dev0), CUDA_SUCCESS);
  uint64_t before = graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  CUstream s = new_stream();
  for (int i = 0; i < 3; i++) {
    REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
    CUdeviceptr out = 0;
    CHECK_RC(cu.alloc(&out, 4 * MiB, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUgraph graph = NULL;
    CHECK_RC(cu.end_capture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(graph == NULL);
  }
  /* Nor is the failed capture counted any more, though the driver names
   * no id for it: a pair elsewhere asks nothing about capture. */
  CHECK_EQ_U64(pairs_ask(NULL, 10), 0);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  /* A stream destroyed while it captures takes its capture with it: its
   * memory goes, and it is counted no more (both stayed). */
  s = new_stream();
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  CUdeviceptr gone = 0;
  CHECK_RC(cu.alloc(&gone, 4 * MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(NULL, 10), 0);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_RC(cu.graph_mem_trim(dev0), CUDA_SUCCESS);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), before);
}

/* A capture may free the output of a graph captured before it and not yet
 * instantiated, as CUDA's programming guide builds a consumer graph from
 * the producer's address: each launch of the consumer frees what the
 * producer's last launch made, and the producer may launch again. The
 * free was refused (the application ended the producer's capture with the
 * driver, unseen), and every relaunch of the producer then failed. */
static void test_free_in_later_capture(void) {
  CUstream s = new_stream();
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr q = 0;
  CHECK_RC(cu.alloc(&q, 2 * MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(q, 0x44, 2 * MiB, s), CUDA_SUCCESS);
  CUgraph producer = NULL, consumer = NULL;
  REQUIRE_RC(cu.end_capture(s, &producer), CUDA_SUCCESS);
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CHECK_RC(cu.free(q, s), CUDA_SUCCESS);
  REQUIRE_RC(cu.end_capture(s, &consumer), CUDA_SUCCESS);
  CUgraphExec make = NULL, take = NULL;
  REQUIRE_RC(cu.instantiate(&make, producer, 0), CUDA_SUCCESS);
  REQUIRE_RC(cu.instantiate(&take, consumer, 0), CUDA_SUCCESS);
  for (int i = 0; i < 3; i++) {
    CHECK_RC(cu.graph_launch(make, s), CUDA_SUCCESS);
    unsigned char back = 0;
    CHECK_RC(cu.memcpy_dtoh(&back, q + 99, 1, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
    CHECK_EQ_INT(back, 0x44);
    CHECK_RC(cu.graph_launch(take, s), CUDA_SUCCESS);
  }
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  CHECK_RC(cu.exec_destroy(take), CUDA_SUCCESS);
  CHECK_RC(cu.exec_destroy(make), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(consumer), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(producer), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_RC(cu.graph_mem_trim(dev0), CUDA_SUCCESS);
  CHECK_EQ_U64(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
}

/* Every capture begins through the driver entries the interposer hands
 * out, which count them: while none is under way an allocation or a free
 * asks the driver nothing about capture (each asked once before), while
 * one is, they ask, and an allocation in it is the graph's. Each begin
 * counts: a failed one, one on the per-thread stream, one into a graph. */
static void test_capture_questions(void) {
  CUstream s = new_stream(), t = new_stream();
  /* Adopting a stream of the program's asks once. */
  (void)pairs_ask(s, 1);
  (void)pairs_ask(t, 1);
  CHECK_EQ_U64(pairs_ask(t, 100), 0);

  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  CHECK(pairs_ask(t, 10) >= 20);
  CUdeviceptr in_graph = 0;
  CHECK_RC(cu.alloc(&in_graph, MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED),
           CUDA_ERROR_ILLEGAL_STATE);
  CHECK_RC(cu.free(in_graph, s), CUDA_SUCCESS);
  CUgraph graph = NULL;
  REQUIRE_RC(cu.end_capture(s, &graph), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(t, 100), 0);
  /* A second end finds no capture, and leaves the count as it is. */
  graph = NULL;
  CHECK(cu.end_capture(s, &graph) != CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(t, 100), 0);

  REQUIRE_RC(cu.begin_capture_pt(NULL, CU_STREAM_CAPTURE_MODE_RELAXED),
             CUDA_SUCCESS);
  CHECK(pairs_ask(t, 10) >= 20);
  REQUIRE_RC(cu.end_capture_pt(NULL, &graph), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(t, 100), 0);

  CUgraph into = NULL;
  REQUIRE_RC(cu.graph_create(&into, 0), CUDA_SUCCESS);
  REQUIRE_RC(
      cu.begin_to_graph(s, into, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED),
      CUDA_SUCCESS);
  CHECK(pairs_ask(t, 10) >= 20);
  graph = NULL;
  REQUIRE_RC(cu.end_capture(s, &graph), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(into), CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(t, 100), 0);

  CHECK_RC(cu.stream_sync(t), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(t), CUDA_SUCCESS);
}

/* A library linked against the driver, opened now (test/preload_plugin.c),
 * begins and ends a capture and destroys a stream by the driver's names:
 * the interposer defines those names too, so the capture is counted (an
 * allocation in it asks, and is the graph's: the pool's figures do not
 * move) and the destruction seen (a new stream that takes the handle does
 * not get a block freed on the old one behind a hold). */
/* CU_STREAM_PER_THREAD names another stream in each context of a thread
 * (two devices): an end that fails in another context leaves the capture
 * of the first counted (an allocation in it still asks, and is the
 * graph's), and the handle met in one context is not taken for the
 * other's stream (the allocation comes from the other device's pool). */
static void test_per_thread_stream_contexts(void) {
  CUdevice dev1 = 0;
  CUcontext ctx1 = NULL;
  if (cu.device_get(&dev1, 1) != CUDA_SUCCESS) {
    printf("   (one device: nothing to check)\n");
    return;
  }
  REQUIRE_RC(cu.primary_retain(&ctx1, dev1), CUDA_SUCCESS);
  CUmemoryPool pool0 = NULL, pool1 = NULL;
  REQUIRE_RC(cu.default_pool(&pool0, dev0), CUDA_SUCCESS);
  REQUIRE_RC(cu.default_pool(&pool1, dev1), CUDA_SUCCESS);
  CUstream pt = CU_STREAM_PER_THREAD;
  (void)pairs_ask(pt, 4);

  REQUIRE_RC(cu.begin_capture(pt, CU_STREAM_CAPTURE_MODE_RELAXED),
             CUDA_SUCCESS);
  REQUIRE_RC(cu.ctx_set(ctx1), CUDA_SUCCESS);
  CUgraph graph = NULL;
  CHECK_RC(cu.end_capture(pt, &graph), CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE_RC(cu.ctx_set(ctx_of_test), CUDA_SUCCESS);
  check_graph_alloc(pool0, pt);
  REQUIRE_RC(cu.end_capture(pt, &graph), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);

  (void)pairs_ask(pt, 4);
  REQUIRE_RC(cu.ctx_set(ctx1), CUDA_SUCCESS);
  uint64_t used0 = attr(pool0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  uint64_t used1 = attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, MiB, pt), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used0);
  CHECK_EQ_U64(attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used1 + MiB);
  CHECK_RC(cu.free(p, pt), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  REQUIRE_RC(cu.ctx_set(ctx_of_test), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
}

static atomic_int gate_open;
static void gate_wait(void *arg);

static void linked_library(bool by_proc) {
  void *plugin = dlopen(TP_PRELOAD_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(plugin != NULL);
  CUresult (*begin)(CUstream);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*destroy)(CUstream);
  void *sym = dlsym(plugin, by_proc ? "plugin_proc_begin" : "plugin_begin");
  memcpy(&begin, &sym, sizeof sym);
  sym = dlsym(plugin, "plugin_end");
  memcpy(&end, &sym, sizeof sym);
  sym = dlsym(plugin, by_proc ? "plugin_proc_destroy" : "plugin_destroy");
  memcpy(&destroy, &sym, sizeof sym);
  REQUIRE(begin && end && destroy);
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  CUstream s = new_stream();
  (void)pairs_ask(s, 1);
  REQUIRE_RC(begin(s), CUDA_SUCCESS);
  check_graph_alloc(pool, s);
  CUgraph graph = NULL;
  REQUIRE_RC(end(s, &graph), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_EQ_U64(pairs_ask(s, 50), 0);

  CUdeviceptr kept = 0;
  REQUIRE_RC(cu.alloc(&kept, 4096, s), CUDA_SUCCESS);
  atomic_store(&gate_open, 0);
  REQUIRE_RC(cu.launch_host_func(s, gate_wait, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(kept, s), CUDA_SUCCESS);
  CHECK_RC(destroy(s), CUDA_SUCCESS);
  CUstream fresh = new_stream();
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, 4096, fresh), CUDA_SUCCESS);
  CHECK(p != kept);
  CHECK_RC(cu.free(p, fresh), CUDA_SUCCESS);
  atomic_store(&gate_open, 1);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(fresh), CUDA_SUCCESS);
  CHECK_EQ_INT(dlclose(plugin), 0);
}

/* By name, and through the driver's cuGetProcAddress called by name (a
 * driver whose table hands out its own functions, as the one linked with
 * -Bsymbolic of fakecuda_preload_fake_symbolic, would hand out unwrapped
 * ones: the interposer defines cuGetProcAddress too). */
static void test_linked_library(void) {
  linked_library(false);
  linked_library(true);
}

/* Captures begun and ended on several threads at once, in every mode, some
 * ended from the wrong thread or twice: once all have ended, the count is
 * back to none, and a pair asks nothing. */
typedef struct {
  int seed;
  CUstream s;
} capture_job;

static void *capture_loop(void *arg) {
  capture_job *job = arg;
  int seed = job->seed;
  CHECK_RC(cu.ctx_set(ctx_of_test), CUDA_SUCCESS);
  CUstream s = job->s;
  for (int i = 0; i < 200; i++) {
    CUstreamCaptureMode mode = (CUstreamCaptureMode)((seed + i) % 3);
    if (cu.begin_capture(s, mode) != CUDA_SUCCESS)
      continue;
    CUdeviceptr p = 0;
    if (cu.alloc(&p, 4096, s) == CUDA_SUCCESS)
      (void)cu.free(p, s);
    CUgraph g = NULL;
    (void)cu.end_capture(s, &g);
    if (g)
      (void)cu.graph_destroy(g);
    g = NULL;
    if ((seed + i) % 7 == 0 && cu.end_capture(s, &g) == CUDA_SUCCESS && g)
      (void)cu.graph_destroy(g); /* a second end: ILLEGAL_STATE */
  }
  return NULL;
}

static void test_capture_count_threads(void) {
  pthread_t t[4];
  capture_job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (capture_job){i, new_stream()};
    REQUIRE(pthread_create(&t[i], NULL, capture_loop, &jobs[i]) == 0);
  }
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  /* Synchronized once no capture is left (a global one forbids it). */
  for (int i = 0; i < 4; i++) {
    CHECK_RC(cu.stream_sync(jobs[i].s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_destroy(jobs[i].s), CUDA_SUCCESS);
  }
  CUstream u = new_stream();
  (void)pairs_ask(u, 1);
  CHECK_EQ_U64(pairs_ask(u, 100), 0);
  CHECK_RC(cu.stream_destroy(u), CUDA_SUCCESS);
}

/* Every stream destruction passes through the interposer too, so a stream
 * of the program's that tidepool met is known by its handle with no
 * question to the driver (each pair asked its id twice before). A new
 * stream that takes a destroyed one's handle (the fake hands handles out
 * again) is told apart: a block freed on the old stream, whose work a
 * host function still holds, is not handed to the new one. */
static atomic_int gate_open;

static void gate_wait(void *arg) {
  (void)arg;
  while (!atomic_load(&gate_open))
    usleep(100);
}

static void test_stream_ids_unasked(void) {
  CUstream t = new_stream();
  (void)pairs_ask(t, 1);
  unsigned long long ids = cu.id_questions();
  CHECK_EQ_U64(pairs_ask(t, 100), 0);
  CHECK_EQ_U64(cu.id_questions() - ids, 0);

  CUstream old = new_stream();
  CUdeviceptr kept = 0;
  REQUIRE_RC(cu.alloc(&kept, 4096, old), CUDA_SUCCESS);
  atomic_store(&gate_open, 0);
  REQUIRE_RC(cu.launch_host_func(old, gate_wait, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(kept, old), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(old), CUDA_SUCCESS);
  CUstream fresh = new_stream();
  if (fresh != old)
    printf("   (the fake gave the new stream another handle)\n");
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, 4096, fresh), CUDA_SUCCESS);
  CHECK(p != kept);
  CHECK_RC(cu.free(p, fresh), CUDA_SUCCESS);
  atomic_store(&gate_open, 1);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  /* Met again after a destruction: asked once, then no more. */
  (void)pairs_ask(t, 1);
  ids = cu.id_questions();
  CHECK_EQ_U64(pairs_ask(t, 100), 0);
  CHECK_EQ_U64(cu.id_questions() - ids, 0);
  CHECK_RC(cu.stream_destroy(fresh), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(t), CUDA_SUCCESS);

  /* The per-thread stream, met again in the same context with no
   * destruction since, is known without its id too (the thread's exit
   * hook guards the one end no call shows). */
  (void)pairs_ask(CU_STREAM_PER_THREAD, 1);
  ids = cu.id_questions();
  CHECK_EQ_U64(pairs_ask(CU_STREAM_PER_THREAD, 100), 0);
  CHECK_EQ_U64(cu.id_questions() - ids, 0);
}

/* The application's context, stream or event synchronize is tidepool's too: the
 * work is waited for once (a second cuCtxSynchronize right after would
 * invalidate every capture another thread began in between, whatever its
 * mode), and the frees it covers complete: memory freed behind a held host
 * function goes back at the release threshold of 0. In both of the
 * driver's forms of the context's. */
static void test_sync_once(void) {
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  uint64_t zero = 0;
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
           CUDA_SUCCESS);
  CUstream s = new_stream();
  CUevent e = NULL;
  REQUIRE_RC(cu.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  for (int way = 0; way < 4; way++) {
    CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
    uint64_t r0 = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    CUdeviceptr p = 0;
    REQUIRE_RC(cu.alloc(&p, 3 * MiB, s), CUDA_SUCCESS);
    CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= r0 + 4 * MiB);
    atomic_store(&gate_open, 0);
    REQUIRE_RC(cu.launch_host_func(s, gate_wait, NULL), CUDA_SUCCESS);
    CHECK_RC(cu.free(p, s), CUDA_SUCCESS);
    CHECK_RC(cu.event_record(e, s), CUDA_SUCCESS);
    atomic_store(&gate_open, 1);
    unsigned long long before[3] = {cu.ctx_syncs(), cu.stream_syncs(),
                                    cu.event_syncs()};
    CHECK_RC(way == 0   ? cu.ctx_sync()
             : way == 1 ? cu.ctx_sync_v2(NULL)
             : way == 2 ? cu.stream_sync(s)
                        : cu.event_sync(e),
             CUDA_SUCCESS);
    CHECK_EQ_U64(cu.ctx_syncs() - before[0], way < 2 ? 1 : 0);
    CHECK_EQ_U64(cu.stream_syncs() - before[1], way == 2 ? 1 : 0);
    CHECK_EQ_U64(cu.event_syncs() - before[2], way == 3 ? 1 : 0);
    CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), r0);
  }
  CHECK_RC(cu.event_destroy(e), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
}

/* A child that fork() made after the parent allocated cannot use the
 * parent's CUDA: the driver answers CUDA_ERROR_NOT_INITIALIZED, and so
 * must the interposer (it answered NOT_PERMITTED). The parent goes on. */
static void test_forked_child(void) {
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc(&p, MiB, NULL), CUDA_SUCCESS);
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    CUdeviceptr q = 0;
    CUmemoryPool pool = NULL;
    int bad = cu.alloc(&q, 4096, NULL) != CUDA_ERROR_NOT_INITIALIZED ||
              cu.free(p, NULL) != CUDA_ERROR_NOT_INITIALIZED ||
              cu.default_pool(&pool, dev0) != CUDA_ERROR_NOT_INITIALIZED;
    _exit(bad);
  }
  int status = -1;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
}

int main(void) {
  if (!load_driver()) {
    printf("FAIL: libcuda.so.1 (the fake driver) cannot be used\n");
    return 1;
  }
  if (!load_diagnostics()) {
    printf("FAIL: libtidepool_preload.so is not preloaded (LD_PRELOAD)\n");
    return 1;
  }
  REQUIRE_EXIT(cu.init(0) == CUDA_SUCCESS);
  CUcontext ctx0 = NULL;
  REQUIRE_EXIT(cu.device_get(&dev0, 0) == CUDA_SUCCESS);
  REQUIRE_EXIT(cu.primary_retain(&ctx0, dev0) == CUDA_SUCCESS);
  REQUIRE_EXIT(cu.ctx_set(ctx0) == CUDA_SUCCESS);
  ctx_of_test = ctx0;
  RUN_TEST(test_from_tidepool);
  REQUIRE_EXIT(preload_mode() == MODE_CUDA);
  RUN_TEST(test_reuse_policies);
  RUN_TEST(test_reuse_after_event);
  RUN_TEST(test_exact_stats);
  RUN_TEST(test_bad_input);
  RUN_TEST(test_destroy_current);
  RUN_TEST(test_capture);
  RUN_TEST(test_graph_mem_driver_names);
  RUN_TEST(test_failed_capture_memory);
  RUN_TEST(test_free_in_later_capture);
  RUN_TEST(test_capture_questions);
  RUN_TEST(test_stream_ids_unasked);
  RUN_TEST(test_capture_count_threads);
  RUN_TEST(test_linked_library);
  RUN_TEST(test_per_thread_stream_contexts);
  RUN_TEST(test_sync_once);
  RUN_TEST(test_forked_child);
  return check_done();
}
