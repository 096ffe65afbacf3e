/* test_preload_driver: the driver's stream-ordered allocator reached the way
 * a statically linked CUDA runtime (libcudart_static, inside CuPy, cuBLAS
 * and programs built by nvcc) reaches it: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2, cuGetProcAddress for cuGetProcAddress itself and then
 * for every entry point, with the versions and flags a runtime passes. Run
 * with libtidepool_preload.so preloaded, it checks that tidepool answers
 * (its pool statistics and the interposer's counters), with the driver's
 * CUresult codes, and that what is not tidepool's reaches the driver. Runs
 * against the stand-in libcuda.so.1 (TIDEPOOL_PRELOAD=host, tidepool's host
 * platform, or =0, everything passed on) and against the real driver
 * (cuda; exit 77 without a GPU).
 * Usage: test_preload_driver host|off|cuda */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "check.h"

#define MiB ((size_t)1 << 20)
#define SKIP_EXIT 77
#define LEGACY 0 /* the flags of a runtime built for the legacy stream */
#define PER_THREAD CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

#define CHECK_RC(expr, want) CHECK_EQ_INT((expr), (want))
#define REQUIRE_RC(expr, want) REQUIRE_EQ_INT((expr), (want))

/* ---- the driver, as a static runtime finds it -------------------------------
 */

static void *libcuda;
static PFN_cuGetProcAddress_v12000 dlsym_get_proc; /* as dlsym gave it */
static PFN_cuGetProcAddress_v12000 get_proc;       /* as it gave itself */

static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDeviceGetCount_v2000 device_count;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_retain;
  PFN_cuCtxGetCurrent_v4000 ctx_get;
  PFN_cuCtxSetCurrent_v4000 ctx_set;
  PFN_cuCtxCreate_v3020 ctx_create;
  PFN_cuCtxDestroy_v4000 ctx_destroy;
  PFN_cuCtxSynchronize_v2000 ctx_sync;
  PFN_cuCtxSynchronize_v13000 ctx_sync_v2;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamSynchronize_v2000 stream_sync;
  PFN_cuStreamSynchronize_v7000_ptsz stream_sync_ptsz;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  PFN_cuGraphDestroy_v10000 graph_destroy;
  PFN_cuStreamIsCapturing_v10000 is_capturing;
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
  PFN_cuMemAllocAsync_v11020_ptsz alloc_ptsz;
  PFN_cuMemFreeAsync_v11020 free;
  PFN_cuMemFreeAsync_v11020_ptsz free_ptsz;
  PFN_cuMemAllocFromPoolAsync_v11020 alloc_from_pool;
  PFN_cuMemPoolCreate_v11020 pool_create;
  PFN_cuMemPoolDestroy_v11020 pool_destroy;
  PFN_cuMemPoolGetAttribute_v11020 pool_get_attr;
  PFN_cuMemPoolSetAttribute_v11020 pool_set_attr;
  PFN_cuMemPoolSetAccess_v11020 pool_set_access;
  PFN_cuMemPoolGetAccess_v11020 pool_get_access;
  PFN_cuMemPoolTrimTo_v11020 pool_trim;
  PFN_cuPointerGetAttribute_v4000 ptr_attr;
  PFN_cuGraphCreate_v10000 graph_create;
  PFN_cuStreamBeginCaptureToGraph_v12030 begin_to_graph;
  PFN_cuGraphInstantiateWithParams_v12000 instantiate_params;
  PFN_cuPointerGetAttributes_v7000 ptr_attrs;
  PFN_cuMemGetAddressRange_v3020 addr_range;
  PFN_cuMemPoolExportToShareableHandle_v11020 pool_export;
  PFN_cuMemPoolImportFromShareableHandle_v11020 pool_import;
  PFN_cuMemPoolExportPointer_v11020 ptr_export;
  PFN_cuMemPoolImportPointer_v11020 ptr_import;
  PFN_cuDeviceGetDefaultMemPool_v11020 default_pool;
  PFN_cuDeviceGetMemPool_v11020 get_pool;
  PFN_cuDeviceSetMemPool_v11020 set_pool;
  PFN_cuMemGetDefaultMemPool_v13000 mem_default_pool;
  PFN_cuMemGetMemPool_v13000 mem_get_pool;
  PFN_cuMemSetMemPool_v13000 mem_set_pool;
} cu;

static int fetch_quietly(const char *name, int version, cuuint64_t flags,
                         void *out) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (get_proc(name, &fn, version, flags, &found) != CUDA_SUCCESS ||
      found != CU_GET_PROC_ADDRESS_SUCCESS || !fn)
    return 0;
  memcpy(out, &fn, sizeof fn);
  return 1;
}

static int fetch(const char *name, int version, cuuint64_t flags, void *out) {
  if (fetch_quietly(name, version, flags, out))
    return 1;
  printf("FAIL: the driver has no %s at %d\n", name, version);
  return 0;
}

static int load_driver(void) {
  libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!libcuda)
    return 0;
  void *sym = dlsym(libcuda, "cuGetProcAddress_v2");
  memcpy(&dlsym_get_proc, &sym, sizeof sym);
  if (!dlsym_get_proc)
    return 0;
  get_proc = dlsym_get_proc;
  void *self = NULL;
  if (!fetch("cuGetProcAddress", 12000, LEGACY, &self))
    return 0;
  memcpy(&get_proc, &self, sizeof self);
  int ok = 1;
#define F(field, name, version, flags)                                         \
  ok = fetch(name, version, flags, &cu.field) && ok
  F(init, "cuInit", 2000, LEGACY);
  F(device_get, "cuDeviceGet", 2000, LEGACY);
  F(device_count, "cuDeviceGetCount", 2000, LEGACY);
  F(primary_retain, "cuDevicePrimaryCtxRetain", 7000, LEGACY);
  F(ctx_get, "cuCtxGetCurrent", 4000, LEGACY);
  F(ctx_set, "cuCtxSetCurrent", 4000, LEGACY);
  F(ctx_sync, "cuCtxSynchronize", 2000, LEGACY);
  F(ctx_sync_v2, "cuCtxSynchronize", 13000, LEGACY);
  F(stream_create, "cuStreamCreate", 2000, LEGACY);
  F(stream_destroy, "cuStreamDestroy", 4000, LEGACY);
  F(stream_sync, "cuStreamSynchronize", 2000, LEGACY);
  F(stream_sync_ptsz, "cuStreamSynchronize", 7000, PER_THREAD);
  F(begin_capture, "cuStreamBeginCapture", 10010, LEGACY);
  F(end_capture, "cuStreamEndCapture", 10000, LEGACY);
  F(graph_destroy, "cuGraphDestroy", 10000, LEGACY);
  F(is_capturing, "cuStreamIsCapturing", 10000, LEGACY);
  F(instantiate, "cuGraphInstantiateWithFlags", 11040, LEGACY);
  F(graph_launch, "cuGraphLaunch", 10000, LEGACY);
  F(exec_destroy, "cuGraphExecDestroy", 10000, LEGACY);
  F(event_create, "cuEventCreate", 2000, LEGACY);
  F(event_destroy, "cuEventDestroy", 4000, LEGACY);
  F(event_record, "cuEventRecord", 2000, LEGACY);
  F(event_sync, "cuEventSynchronize", 2000, LEGACY);
  F(stream_wait, "cuStreamWaitEvent", 3020, LEGACY);
  F(launch_host_func, "cuLaunchHostFunc", 10000, LEGACY);
  F(mem_alloc, "cuMemAlloc", 3020, LEGACY);
  F(mem_free, "cuMemFree", 3020, LEGACY);
  F(memset_d8, "cuMemsetD8Async", 3020, LEGACY);
  F(memcpy_dtoh, "cuMemcpyDtoHAsync", 3020, LEGACY);
  F(alloc, "cuMemAllocAsync", 11020, LEGACY);
  F(alloc_ptsz, "cuMemAllocAsync", 11020, PER_THREAD);
  F(free, "cuMemFreeAsync", 11020, LEGACY);
  F(free_ptsz, "cuMemFreeAsync", 11020, PER_THREAD);
  F(alloc_from_pool, "cuMemAllocFromPoolAsync", 11020, LEGACY);
  F(pool_create, "cuMemPoolCreate", 11020, LEGACY);
  F(pool_destroy, "cuMemPoolDestroy", 11020, LEGACY);
  F(pool_get_attr, "cuMemPoolGetAttribute", 11020, LEGACY);
  F(pool_set_attr, "cuMemPoolSetAttribute", 11020, LEGACY);
  F(pool_set_access, "cuMemPoolSetAccess", 11020, LEGACY);
  F(pool_get_access, "cuMemPoolGetAccess", 11020, LEGACY);
  F(pool_trim, "cuMemPoolTrimTo", 11020, LEGACY);
  F(pool_export, "cuMemPoolExportToShareableHandle", 11020, LEGACY);
  F(pool_import, "cuMemPoolImportFromShareableHandle", 11020, LEGACY);
  F(ptr_export, "cuMemPoolExportPointer", 11020, LEGACY);
  F(ptr_import, "cuMemPoolImportPointer", 11020, LEGACY);
  F(default_pool, "cuDeviceGetDefaultMemPool", 11020, LEGACY);
  F(get_pool, "cuDeviceGetMemPool", 11020, LEGACY);
  F(set_pool, "cuDeviceSetMemPool", 11020, LEGACY);
  F(mem_default_pool, "cuMemGetDefaultMemPool", 13000, LEGACY);
  F(mem_get_pool, "cuMemGetMemPool", 13000, LEGACY);
  F(mem_set_pool, "cuMemSetMemPool", 13000, LEGACY);
#undef F
  /* Older ABIs a driver may drop: the test that uses them is skipped. */
  (void)fetch_quietly("cuCtxCreate", 3020, LEGACY, &cu.ctx_create);
  (void)fetch_quietly("cuCtxDestroy", 4000, LEGACY, &cu.ctx_destroy);
  /* The stand-in driver has no pointer attributes, nor these. */
  (void)fetch_quietly("cuGraphCreate", 10000, LEGACY, &cu.graph_create);
  (void)fetch_quietly("cuStreamBeginCaptureToGraph", 12030, LEGACY,
                      &cu.begin_to_graph);
  (void)fetch_quietly("cuGraphInstantiateWithParams", 12000, LEGACY,
                      &cu.instantiate_params);
  (void)fetch_quietly("cuPointerGetAttribute", 4000, LEGACY, &cu.ptr_attr);
  (void)fetch_quietly("cuPointerGetAttributes", 7000, LEGACY, &cu.ptr_attrs);
  (void)fetch_quietly("cuMemGetAddressRange", 3020, LEGACY, &cu.addr_range);
  return ok;
}

/* ---- the interposer's and the stand-in's diagnostics ------------------------
 */

enum { MODE_UNDECIDED, MODE_OFF, MODE_CUDA, MODE_HOST };
enum { C_MALLOC, C_FREE, C_POOL, C_FORWARDED, C_SYNC, C_EVENT, C_FAILED };
enum { C_DRIVER = 7 };

static int (*preload_mode)(void);
static unsigned long long (*preload_counter)(int);
static int (*preload_pool_stats)(int, unsigned long long[4]);
static unsigned long (*stub_calls)(const char *);
static int expected_mode;

static unsigned long long counter(int which) {
  return preload_counter(which);
}

/* How many times the stand-in driver's `name` was called (0 on a GPU). */
static unsigned long stub(const char *name) {
  return stub_calls ? stub_calls(name) : 0;
}

static int on(void) {
  return expected_mode != MODE_OFF;
}

/* The file name of the object `fn` lies in. */
static const char *object_of(const void *fn) {
  Dl_info info;
  if (!dladdr(fn, &info) || !info.dli_fname)
    return "?";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

static int in_interposer(const void *fn) {
  return strstr(object_of(fn), "tidepool_preload") != NULL;
}

static CUdevice dev0;
static CUcontext ctx0;

static uint64_t attr(CUmemoryPool pool, CUmemPool_attribute a) {
  uint64_t v = UINT64_MAX;
  CHECK_RC(cu.pool_get_attr(pool, a, &v), CUDA_SUCCESS);
  return v;
}

static CUmemoryPool new_pool(unsigned handle_types) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = (CUmemAllocationHandleType)handle_types;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool = NULL;
  CHECK_RC(cu.pool_create(&pool, &props), CUDA_SUCCESS);
  return pool;
}

/* ---- holding a stream -----------------------------------------------------
 * A host function that waits for a flag keeps everything queued behind it
 * pending, for as long as the test wants (30 s at most). */

static atomic_int hold_open[8];

static void hold_fn(void *arg) {
  atomic_int *open = (atomic_int *)arg;
  double deadline = check_now_s() + 30.0;
  while (!atomic_load(open)) {
    if (check_now_s() > deadline) {
      CHECK_FAIL("a held stream was never released");
      break;
    }
    check_sleep_us(100);
  }
}

static atomic_int *hold(CUstream stream, int slot) {
  atomic_store(&hold_open[slot], 0);
  CHECK_RC(cu.launch_host_func(stream, hold_fn, &hold_open[slot]),
           CUDA_SUCCESS);
  return &hold_open[slot];
}

/* ---- tests ------------------------------------------------------------------
 */

/* What dlsym and cuGetProcAddress hand out: tidepool's versions of the
 * allocator's entry points (also looked up by their exported names), the
 * driver's own for the rest. */
static void test_handed_out(void) {
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)dlsym_get_proc), on());
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)get_proc), on());
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.alloc), on());
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.alloc_ptsz), on());
  CHECK(cu.alloc != cu.alloc_ptsz);
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.mem_free), on());
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.ctx_sync_v2), on());
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.init), 0);
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.ctx_get), 0);
  const char *exported[] = {"cuMemAllocAsync_ptsz", "cuMemPoolCreate",
                            "cuMemFree_v2", "cuStreamSynchronize",
                            "cuGetProcAddress"};
  for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
    check_context(exported[i]);
    void *fn = dlsym(libcuda, exported[i]);
    CHECK(fn != NULL);
    CHECK_EQ_INT(in_interposer(fn), on());
  }
  check_context(NULL);
  CHECK_EQ_INT(in_interposer(dlsym(libcuda, "cuInit")), 0);
  /* The host mode's stream calls are wrapped only in the host mode. */
  void *fn = dlsym(libcuda, "cuStreamCreate");
  CHECK_EQ_INT(in_interposer(fn), expected_mode == MODE_HOST);
}

/* RTLD_NEXT and RTLD_DEFAULT keep their meaning through the interposer
 * (where its dlsym is the assembly entry, see dl.h): from the program, the
 * interposer (preloaded, so next) is found; from inside libcuda, opened
 * RTLD_LOCAL, its own symbols are in scope. */
static void test_rtld_next(void) {
  CHECK(dlsym(RTLD_NEXT, "malloc") != NULL);
  if (!TP_PRELOAD_EXACT_RTLD_NEXT) {
    printf("   RTLD_NEXT is passed on from the interposer (C entry)\n");
    return;
  }
  void *next = dlsym(RTLD_NEXT, "tidepool_preload_mode");
  CHECK(next != NULL);
  CHECK_EQ_PTR(next, dlsym(RTLD_DEFAULT, "tidepool_preload_mode"));
  CHECK_EQ_PTR(dlvsym(RTLD_NEXT, "tidepool_preload_mode", "TIDEPOOL_PRELOAD_0"),
               next);
  CHECK(dlsym(RTLD_NEXT, "tidepool_no_such_symbol") == NULL);
  void *(*stub_default)(const char *) = NULL;
  void *sym = dlsym(libcuda, "cuda_stub_default");
  memcpy(&stub_default, &sym, sizeof sym);
  if (stub_calls) {
    REQUIRE(stub_default != NULL);
    CHECK(stub_default("cuda_stub_calls") != NULL);
    CHECK(dlsym(RTLD_DEFAULT, "cuda_stub_calls") == NULL);
  }
}

static void test_malloc_free(void) {
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  uint64_t zero = 0;
  REQUIRE_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
             CUDA_SUCCESS);
  unsigned long long mallocs = counter(C_MALLOC), frees = counter(C_FREE);
  unsigned long long driver = counter(C_DRIVER);
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc(&p, MiB, NULL), CUDA_SUCCESS);
  CHECK(p != 0);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 1);
  CHECK_EQ_U64(counter(C_DRIVER) - driver, 1);
  CHECK_EQ_U64(stub("cuMemAllocAsync"), 0);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MiB);
  /* tidepool reserves in 2 MiB chunks, the driver in 32 MiB steps. */
  uint64_t reserved = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  CHECK_EQ_U64(reserved, 2 * MiB);

  unsigned char back[64];
  CHECK_RC(cu.memset_d8(p, 0x5a, MiB, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.memcpy_dtoh(back, p + MiB - sizeof back, sizeof back, NULL),
           CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_EQ_INT(back[0], 0x5a);
  CHECK_EQ_INT(back[sizeof back - 1], 0x5a);

  /* tidepool's own figures, asked directly, are the driver names'. */
  unsigned long long own[4] = {0};
  CHECK_EQ_INT(preload_pool_stats(0, own), 0);
  CHECK_EQ_U64(own[0], reserved);
  CHECK_EQ_U64(own[2], MiB);

  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  /* The synchronize reaches tidepool once, which falls to the release
   * threshold (0). */
  unsigned long long syncs = counter(C_SYNC);
  unsigned long driver_syncs = stub("cuStreamSynchronize");
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cuStreamSynchronize") - driver_syncs, 1);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= MiB);
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
           CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);

  /* Size 0 succeeds with 0, as tidepool answers. */
  p = 1;
  CHECK_RC(cu.alloc(&p, 0, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(p, 0);
}

static void test_errors(void) {
  unsigned long long failed = counter(C_FAILED);
  CHECK_RC(cu.alloc(NULL, 16, NULL), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, (size_t)1 << 62, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ_U64(counter(C_FAILED) - failed, 2);

  CUmemoryPool pool = NULL;
  CHECK_RC(cu.default_pool(&pool, (CUdevice)-5), CUDA_ERROR_INVALID_DEVICE);
  CHECK_RC(cu.default_pool(NULL, dev0), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  /* The get and set forms answer INVALID_VALUE for a device that does not
   * exist, as the runtime's do (cudaDeviceGetMemPool of device 99). */
  CUmemoryPool cur = NULL;
  CHECK_RC(cu.get_pool(&cur, (CUdevice)12345), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.set_pool((CUdevice)12345, pool), CUDA_ERROR_INVALID_VALUE);
  uint64_t v = 0;
  CHECK_RC(cu.pool_get_attr(pool, (CUmemPool_attribute)0x77, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_get_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL),
           CUDA_ERROR_INVALID_VALUE);
  /* The default pool cannot be destroyed. */
  CHECK_RC(cu.pool_destroy(pool), CUDA_ERROR_INVALID_VALUE);

  /* A pointer nobody gave out goes to the driver, which refuses it. */
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long driver_frees = stub("cuMemFreeAsync");
  int local = 0;
  CHECK(cu.free((CUdeviceptr)(uintptr_t)&local, NULL) != CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cuMemFreeAsync") - driver_frees, 1);
}

static void test_pool_create(void) {
  CUmemoryPool pool = new_pool(0);
  REQUIRE(pool != NULL);
  uint64_t threshold = 4 * MiB;
  CHECK_RC(
      cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
      CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 4 * MiB);
  int reuse = -1;
  CHECK_RC(cu.pool_get_attr(
               pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &reuse),
           CUDA_SUCCESS);
  CHECK_EQ_INT(reuse, 1);

  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_RC(cu.pool_set_access(pool, &desc, 1), CUDA_SUCCESS);
  CHECK_RC(cu.pool_set_access(pool, NULL, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_set_access(pool, &desc, SIZE_MAX), CUDA_ERROR_INVALID_VALUE);
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CHECK_RC(cu.pool_get_access(&flags, pool, &loc), CUDA_SUCCESS);
  CHECK_EQ_INT(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  loc.id = 1 << 20;
  CHECK_RC(cu.pool_get_access(&flags, pool, &loc), CUDA_ERROR_INVALID_VALUE);

  CUmemoryPool def = NULL;
  REQUIRE_RC(cu.default_pool(&def, dev0), CUDA_SUCCESS);
  uint64_t def_used = attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc_from_pool(&p, 3 * MiB, pool, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  CHECK_EQ_U64(attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), def_used);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  /* Kept up to the threshold, then trimmed. */
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  CHECK_RC(cu.pool_trim(pool, 0), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);

  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_ERROR_INVALID_VALUE);

  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = (CUmemLocationType)99;
  CHECK_RC(cu.pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.handleTypes = CU_MEM_HANDLE_TYPE_WIN32; /* as the driver on Linux */
  CHECK_RC(cu.pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.allocType = (CUmemAllocationType)5;
  CHECK_RC(cu.pool_create(&pool, &props), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.pool_create(NULL, &props), CUDA_ERROR_INVALID_VALUE);
}

static void test_current_pools(void) {
  CUmemoryPool def = NULL, cur = NULL, got = NULL;
  REQUIRE_RC(cu.default_pool(&def, dev0), CUDA_SUCCESS);
  REQUIRE_RC(cu.get_pool(&cur, dev0), CUDA_SUCCESS);
  CHECK(def == cur);
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CHECK_RC(cu.mem_default_pool(&got, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
           CUDA_SUCCESS);
  CHECK(got == def);
  CHECK_RC(cu.mem_get_pool(&got, &loc, CU_MEM_ALLOCATION_TYPE_PINNED),
           CUDA_SUCCESS);
  CHECK(got == def);

  CUmemoryPool mine = new_pool(0);
  REQUIRE(mine != NULL);
  CHECK_RC(cu.set_pool(dev0, mine), CUDA_SUCCESS);
  CHECK_RC(cu.get_pool(&got, dev0), CUDA_SUCCESS);
  CHECK(got == mine);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc(&p, MiB, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MiB);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.mem_set_pool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, def),
           CUDA_SUCCESS);
  CHECK_RC(cu.get_pool(&got, dev0), CUDA_SUCCESS);
  CHECK(got == def);
  /* A pool tidepool did not make cannot become current. */
  CHECK_RC(cu.set_pool(dev0, (CUmemoryPool)&loc), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.mem_get_pool(&got, NULL, CU_MEM_ALLOCATION_TYPE_PINNED),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(mine), CUDA_SUCCESS);
}

/* cuMemFree takes stream-ordered allocations too; the driver's own memory
 * stays the driver's. */
static void test_mem_free(void) {
  CUmemoryPool pool = NULL;
  REQUIRE_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
  unsigned long long frees = counter(C_FREE);
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc(&p, MiB, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.mem_free(p), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  unsigned long before = stub("cuMemFree_v2");
  CUdeviceptr q = 0;
  REQUIRE_RC(cu.mem_alloc(&q, 4096), CUDA_SUCCESS);
  CHECK_RC(cu.mem_free(q), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cuMemFree_v2") - before, 1);
}

/* A block freed on stream a, before an event that stream b waits for, is
 * reused by b while a is still held; stream c, unordered, gets other
 * memory. Only possible if tidepool learned the record and the wait. */
static void test_event_order(void) {
  CUmemoryPool pool = new_pool(0);
  REQUIRE(pool != NULL);
  int off = 0;
  CHECK_RC(cu.pool_set_attr(
               pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off),
           CUDA_SUCCESS);
  CHECK_RC(
      cu.pool_set_attr(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off),
      CUDA_SUCCESS);
  CUstream a = NULL, b = NULL, c = NULL;
  REQUIRE_RC(cu.stream_create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  REQUIRE_RC(cu.stream_create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  REQUIRE_RC(cu.stream_create(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent e = NULL;
  REQUIRE_RC(cu.event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  unsigned long long events = counter(C_EVENT);

  atomic_int *gate = hold(a, 0);
  CUdeviceptr p = 0, x = 0, q = 0;
  CHECK_RC(cu.alloc_from_pool(&p, 4 * MiB, pool, a), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, a), CUDA_SUCCESS);
  CHECK_RC(cu.event_record(e, a), CUDA_SUCCESS);
  CHECK_RC(cu.alloc_from_pool(&x, 4 * MiB, pool, c), CUDA_SUCCESS);
  CHECK(x != p);
  CHECK_RC(cu.stream_wait(b, e, 0), CUDA_SUCCESS);
  CHECK_RC(cu.alloc_from_pool(&q, 4 * MiB, pool, b), CUDA_SUCCESS);
  CHECK_EQ_U64(q, p);
  CHECK_EQ_U64(counter(C_EVENT) - events, 2);
  atomic_store(gate, 1);

  CHECK_RC(cu.free(x, c), CUDA_SUCCESS);
  CHECK_RC(cu.free(q, b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(a), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(c), CUDA_SUCCESS);
  /* cuEventSynchronize lets tidepool see the frees before it complete. */
  CHECK_RC(cu.event_sync(e), CUDA_SUCCESS);
  CHECK_RC(cu.event_destroy(e), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(a), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(b), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(c), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
}

/* Both forms of the context's synchronize reach tidepool, once each. */
static void test_ctx_synchronize(void) {
  CUmemoryPool pool = new_pool(0);
  REQUIRE(pool != NULL);
  CUdeviceptr p = 0;
  unsigned long long syncs = counter(C_SYNC);
  CHECK_RC(cu.alloc_from_pool(&p, 4 * MiB, pool, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 1);
  CHECK_RC(cu.alloc_from_pool(&p, 4 * MiB, pool, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync_v2(NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 2);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
}

/* The per-thread variants: NULL is the calling thread's default stream
 * (which only the cuda platform knows). */
static void test_per_thread(void) {
  unsigned long long mallocs = counter(C_MALLOC), syncs = counter(C_SYNC);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc_ptsz(&p, MiB, NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 1);
  CHECK_RC(cu.free_ptsz(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync_ptsz(NULL), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 1);
  CHECK_EQ_U64(stub("cuMemAllocAsync_ptsz"), 0);
}

/* What the host functions of a graph captured in the host mode see. */
typedef struct graph_run {
  unsigned char *mem, *keep;
  atomic_int runs, bad;
} graph_run;

static void run_graph(void *arg) {
  graph_run *r = arg;
  memset(r->mem, 0x5a, MiB);
  memset(r->keep, 0x3c, MiB);
  if (r->mem[MiB - 1] != 0x5a || r->keep[MiB - 1] != 0x3c)
    atomic_fetch_add(&r->bad, 1);
  atomic_fetch_add(&r->runs, 1);
}

/* Allocations and frees on a stream being captured are tidepool's graph
 * allocations, as through the runtime (test_preload's test_capture): the
 * driver's capture with a GPU, tidepool's own in the host mode, where the
 * driver's capture and graph calls are tidepool's too. The work runs at
 * every launch; the allocation the graph does not free is freed once after
 * each. */
static void test_capture(void) {
  bool host = expected_mode == MODE_HOST;
  CUstream s = NULL;
  REQUIRE_RC(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long long mallocs = counter(C_MALLOC), frees = counter(C_FREE);
  unsigned long driver_mallocs = stub("cuMemAllocAsync");
  graph_run run = {0};
  REQUIRE_RC(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK_RC(cu.is_capturing(s, &st), CUDA_SUCCESS);
  CHECK_EQ_INT(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUdeviceptr g = 0, keep = 0;
  CHECK_RC(cu.alloc(&g, MiB, s), CUDA_SUCCESS);
  CHECK_RC(cu.alloc(&keep, MiB, s), CUDA_SUCCESS);
  run.mem = (unsigned char *)(uintptr_t)g;
  run.keep = (unsigned char *)(uintptr_t)keep;
  if (host) {
    CHECK_RC(cu.launch_host_func(s, run_graph, &run), CUDA_SUCCESS);
  } else {
    CHECK_RC(cu.memset_d8(g, 0x5a, MiB, s), CUDA_SUCCESS);
    CHECK_RC(cu.memset_d8(keep, 0x3c, MiB, s), CUDA_SUCCESS);
  }
  CHECK_RC(cu.free(g, s), CUDA_SUCCESS);
  CUgraph graph = NULL;
  REQUIRE_RC(cu.end_capture(s, &graph), CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 0);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 2);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cuMemAllocAsync") - driver_mallocs, 0);
  CUgraphExec exec = NULL, second = NULL;
  REQUIRE_RC(cu.instantiate(&exec, graph, 0), CUDA_SUCCESS);
  /* A graph with allocations has one exec at a time, as in CUDA: with a
   * GPU the driver made a second one, which the layer takes back. */
  CHECK_RC(cu.instantiate(&second, graph, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK(second == NULL);
  for (int i = 0; i < 3; i++) {
    CHECK_RC(cu.graph_launch(exec, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
    unsigned char back = 0;
    if (!host) {
      CHECK_RC(cu.memcpy_dtoh(&back, keep + 17, 1, s), CUDA_SUCCESS);
      CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
      CHECK_EQ_INT(back, 0x3c);
    }
    /* tidepool sees the launches (with a GPU it adopted the driver's exec
     * and launches it): the output is live after each until freed, which
     * refuses another launch, and may be freed once. */
    if (i == 0)
      CHECK_RC(cu.graph_launch(exec, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cu.free(keep, s), CUDA_SUCCESS);
    CHECK_RC(cu.free(keep, s), CUDA_ERROR_INVALID_VALUE);
  }
  if (host) {
    CHECK_EQ_INT(atomic_load(&run.runs), 3);
    CHECK_EQ_INT(atomic_load(&run.bad), 0);
  }
  /* The output of the last launch outlives the graph until it is freed. */
  CHECK_RC(cu.graph_launch(exec, s), CUDA_SUCCESS);
  CHECK_RC(cu.exec_destroy(exec), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  if (!host) {
    unsigned char back = 0;
    CHECK_RC(cu.memcpy_dtoh(&back, keep + 17, 1, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
    CHECK_EQ_INT(back, 0x3c);
  }
  CHECK_RC(cu.free(keep, s), CUDA_SUCCESS);
  CHECK_RC(cu.free(keep, s), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
}

/* A capture into the application's graph (cuStreamBeginCaptureToGraph):
 * its output follows every launch of the graph's exec (freed after each, a
 * relaunch refused while it is live), and a second exec, refused, says so
 * in cuGraphInstantiateWithParams' result_out (it said success). */
static void test_capture_to_graph(void) {
  if (!cu.graph_create || !cu.begin_to_graph || !cu.instantiate_params) {
    printf("   skipped: the driver cannot capture into a graph\n");
    return;
  }
  CUstream s = NULL;
  REQUIRE_RC(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUgraph graph = NULL, ended = NULL;
  REQUIRE_RC(cu.graph_create(&graph, 0), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  REQUIRE_RC(
      cu.begin_to_graph(s, graph, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL),
      CUDA_SUCCESS);
  CHECK_RC(cu.alloc(&a, MiB, s), CUDA_SUCCESS);
  REQUIRE_RC(cu.end_capture(s, &ended), CUDA_SUCCESS);
  CHECK(ended == graph);
  CUDA_GRAPH_INSTANTIATE_PARAMS params;
  memset(&params, 0, sizeof params);
  params.result_out = (CUgraphInstantiateResult)77;
  CUgraphExec exec = NULL, second = NULL;
  REQUIRE_RC(cu.instantiate_params(&exec, graph, &params), CUDA_SUCCESS);
  CHECK_EQ_INT(params.result_out, CUDA_GRAPH_INSTANTIATE_SUCCESS);
  params.result_out = (CUgraphInstantiateResult)77;
  CHECK_RC(cu.instantiate_params(&second, graph, &params),
           CUDA_ERROR_NOT_SUPPORTED);
  CHECK(second == NULL);
  CHECK(params.result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS &&
        params.result_out != (CUgraphInstantiateResult)77);
  for (int i = 0; i < 3; i++) {
    CHECK_RC(cu.graph_launch(exec, s), CUDA_SUCCESS);
    if (i == 0)
      CHECK_RC(cu.graph_launch(exec, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(cu.free(a, s), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(s), CUDA_SUCCESS);
  }
  CHECK_RC(cu.exec_destroy(exec), CUDA_SUCCESS);
  CHECK_RC(cu.graph_destroy(graph), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(s), CUDA_SUCCESS);
}

/* A context the program made itself is not a primary context, in which
 * tidepool's pools live: its allocations are the driver's; and without a
 * current context the driver gives its error. */
static void test_other_contexts(void) {
  CUdeviceptr p = 0;
  unsigned long long forwarded = counter(C_FORWARDED);
  if (cu.ctx_create && cu.ctx_destroy) {
    CUcontext mine = NULL;
    REQUIRE_RC(cu.ctx_create(&mine, 0, dev0), CUDA_SUCCESS);
    unsigned long long mallocs = counter(C_MALLOC);
    CUresult r = cu.alloc(&p, MiB, NULL);
    CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 1);
    CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 0);
    if (stub_calls) {
      CHECK_RC(r, CUDA_ERROR_NOT_SUPPORTED);
    } else {
      CHECK_RC(r, CUDA_SUCCESS);
      CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
      CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
    }
    CHECK_RC(cu.ctx_destroy(mine), CUDA_SUCCESS);
  } else {
    printf("   skipped a created context: the driver has no cuCtxCreate_v2\n");
  }

  REQUIRE_RC(cu.ctx_set(NULL), CUDA_SUCCESS);
  forwarded = counter(C_FORWARDED);
  CHECK(cu.alloc(&p, MiB, NULL) != CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 1);
  REQUIRE_RC(cu.ctx_set(ctx0), CUDA_SUCCESS);
}

/* tidepool's pool and pointer used where no context is current: from a
 * thread that never made one current (a finalizer thread of Numba or
 * CuPy), and after cuCtxSetCurrent(NULL). The driver answers such calls on
 * its own pools and pointers; tidepool must too, rather than hand its
 * objects to the driver, which refused them (the free was lost and the
 * memory stayed in use). The caller's context (none) stays current. */
static CUmemoryPool own_pool;
static CUdeviceptr own_ptr;
static CUstream own_stream;

static void *use_without_context(void *arg) {
  (void)arg;
  CUcontext now = ctx0;
  CHECK_RC(cu.ctx_get(&now), CUDA_SUCCESS);
  CHECK(now == NULL);
  uint64_t used = 0;
  CHECK_RC(cu.pool_get_attr(own_pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
           CUDA_SUCCESS);
  CHECK_EQ_U64(used, MiB);
  CHECK_RC(cu.pool_trim(own_pool, 0), CUDA_SUCCESS);
  CHECK_RC(cu.free(own_ptr, own_stream), CUDA_SUCCESS);
  CHECK_RC(cu.free(own_ptr, own_stream), CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.ctx_get(&now), CUDA_SUCCESS);
  CHECK(now == NULL);
  return NULL;
}

static void test_own_objects_without_context(void) {
  own_pool = new_pool(0);
  REQUIRE(own_pool != NULL);
  REQUIRE_RC(cu.stream_create(&own_stream, CU_STREAM_NON_BLOCKING),
             CUDA_SUCCESS);
  REQUIRE_RC(cu.alloc_from_pool(&own_ptr, MiB, own_pool, own_stream),
             CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(own_stream), CUDA_SUCCESS);
  pthread_t t;
  if (CHECK(pthread_create(&t, NULL, use_without_context, NULL) == 0))
    pthread_join(t, NULL);
  CHECK_RC(cu.stream_sync(own_stream), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(own_pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);

  /* The same thread, its context taken away: a free on the legacy stream
   * names the current context's, of which there is none (the driver's
   * answer), a free on a stream of a primary context is made, and the pool
   * is destroyed. */
  CUdeviceptr p = 0;
  REQUIRE_RC(cu.alloc_from_pool(&p, MiB, own_pool, own_stream), CUDA_SUCCESS);
  REQUIRE_RC(cu.ctx_set(NULL), CUDA_SUCCESS);
  CHECK(cu.free(p, NULL) != CUDA_SUCCESS);
  CHECK_RC(cu.free(p, own_stream), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(own_pool), CUDA_SUCCESS);
  CUcontext now = ctx0;
  CHECK_RC(cu.ctx_get(&now), CUDA_SUCCESS);
  CHECK(now == NULL);
  REQUIRE_RC(cu.ctx_set(ctx0), CUDA_SUCCESS);
  uint64_t v = 0;
  CHECK_RC(cu.pool_get_attr(own_pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
           CUDA_ERROR_INVALID_VALUE);
  CHECK_RC(cu.stream_sync(own_stream), CUDA_SUCCESS);
  CHECK_RC(cu.stream_destroy(own_stream), CUDA_SUCCESS);
}

/* What the driver's pointer queries tell of tidepool's allocations: the
 * allocation (its start, its size, its pool), as the driver tells of its
 * own pools', not the range tidepool reserved for the pool or the chunk
 * mapped there (which the driver told before). */
static void check_pointer(CUdeviceptr p, size_t off, size_t size,
                          CUmemoryPool pool) {
  CUdeviceptr start = 0, base = 0;
  size_t got = 0, range = 0;
  CUmemoryPool of = NULL;
  CHECK_RC(cu.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + off),
           CUDA_SUCCESS);
  CHECK_EQ_U64(start, p);
  CHECK_RC(cu.ptr_attr(&got, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + off),
           CUDA_SUCCESS);
  CHECK_EQ_U64(got, size);
  CHECK_RC(cu.ptr_attr(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p + off),
           CUDA_SUCCESS);
  CHECK(of == pool);
  CHECK_RC(cu.addr_range(&base, &range, p + off), CUDA_SUCCESS);
  CHECK_EQ_U64(base, p);
  CHECK_EQ_U64(range, size);
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  of = NULL;
  got = 0;
  start = 0;
  void *data[3] = {&of, &got, &start};
  CHECK_RC(cu.ptr_attrs(3, attrs, data, p + off), CUDA_SUCCESS);
  CHECK(of == pool);
  CHECK_EQ_U64(got, size);
  CHECK_EQ_U64(start, p);
}

static void test_pointer_attributes(void) {
  if (!cu.ptr_attr || !cu.ptr_attrs || !cu.addr_range) {
    printf("   skipped: the driver has no pointer attributes\n");
    return;
  }
  CHECK_EQ_INT(in_interposer((void *)(uintptr_t)cu.ptr_attr), 1);
  CUmemoryPool def = NULL, pool = new_pool(0);
  REQUIRE_RC(cu.default_pool(&def, dev0), CUDA_SUCCESS);
  REQUIRE(pool != NULL);
  CUdeviceptr small = 0, large = 0;
  REQUIRE_RC(cu.alloc(&small, 3000, NULL), CUDA_SUCCESS);
  REQUIRE_RC(cu.alloc_from_pool(&large, 5 * MiB + 7, pool, NULL), CUDA_SUCCESS);
  check_pointer(small, 0, 3000, def);
  check_pointer(small, 2999, 3000, def);
  check_pointer(large, 0, 5 * MiB + 7, pool);
  check_pointer(large, 4 * MiB + 5, 5 * MiB + 7, pool);
  /* A freed allocation is the driver's to tell of again. */
  CHECK_RC(cu.free(large, NULL), CUDA_SUCCESS);
  size_t got = 0;
  if (cu.ptr_attr(&got, CU_POINTER_ATTRIBUTE_RANGE_SIZE, large) == CUDA_SUCCESS)
    CHECK(got != 5 * MiB + 7);
  CHECK_RC(cu.free(small, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
}

/* A pool shared through a POSIX descriptor (passed by value on import, as
 * the driver takes it) and a pointer through its 64-byte record. */
static void test_ipc(void) {
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  REQUIRE(pool != NULL);
  int fd = -1;
  CHECK_RC(
      cu.pool_export(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_SUCCESS);
  REQUIRE(fd >= 0);
  CUmemoryPool imported = NULL;
  CHECK_RC(cu.pool_import(&imported, (void *)(intptr_t)fd,
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           CUDA_SUCCESS);
  CUdeviceptr p = 0, q = 0;
  CHECK_RC(cu.alloc_from_pool(&p, MiB, pool, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.memset_d8(p, 0x3c, MiB, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  CUmemPoolPtrExportData data;
  memset(&data, 0, sizeof data);
  CHECK_RC(cu.ptr_export(&data, p), CUDA_SUCCESS);
  if (imported)
    CHECK_RC(cu.ptr_import(&q, imported, &data), CUDA_SUCCESS);
  CHECK(q != 0);
  if (q) {
    unsigned char back[16] = {0};
    CHECK_RC(cu.memcpy_dtoh(back, q, sizeof back, NULL), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
    CHECK_EQ_INT(back[0], 0x3c);
    CHECK_RC(cu.free(q, NULL), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  }
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  if (imported)
    CHECK_RC(cu.pool_destroy(imported), CUDA_SUCCESS);
  CHECK_RC(cu.pool_destroy(pool), CUDA_SUCCESS);
  close(fd);
  /* A descriptor that cannot be tidepool's (a pool that another process's
   * driver exported) is the driver's to import; in the host mode tidepool
   * refuses it. */
  int other = open("/dev/null", O_RDONLY);
  if (!CHECK(other >= 0))
    return;
  bool host = expected_mode == MODE_HOST;
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long before = stub("cuMemPoolImportFromShareableHandle");
  CUmemoryPool foreign = NULL;
  CUresult rc = cu.pool_import(&foreign, (void *)(intptr_t)other,
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CHECK(rc != CUDA_SUCCESS);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, host ? 0 : 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cuMemPoolImportFromShareableHandle") - before,
                 host ? 0 : 1);
  if (host)
    CHECK_RC(rc, CUDA_ERROR_INVALID_VALUE);
  close(other);
}

/* Calls on a pool tidepool did not make go to the driver. */
static void test_foreign_pool(void) {
  CUmemoryPool foreign = (CUmemoryPool)(uintptr_t)0x1234000;
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long before = stub("cuMemPoolGetAttribute");
  uint64_t v = 0;
  CHECK_RC(cu.pool_get_attr(foreign, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
           CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ_U64(stub("cuMemPoolGetAttribute") - before, 1);
  CUdeviceptr p = 0;
  CHECK_RC(cu.alloc_from_pool(&p, 16, foreign, NULL), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_RC(cu.pool_trim(foreign, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 3);
}

/* tidepool's device follows the thread's current context, on every
 * thread. */
static CUresult use_device_1(CUdeviceptr *p) {
  CUdevice dev;
  CUcontext ctx;
  CUresult r = cu.device_get(&dev, 1);
  if (r == CUDA_SUCCESS)
    r = cu.primary_retain(&ctx, dev);
  if (r == CUDA_SUCCESS)
    r = cu.ctx_set(ctx);
  if (r == CUDA_SUCCESS)
    r = cu.alloc(p, MiB, NULL);
  return r;
}

static void *alloc_on_device_1(void *arg) {
  CUdeviceptr *p = arg;
  if (use_device_1(p) != CUDA_SUCCESS)
    *p = 0;
  return NULL;
}

static void test_devices(void) {
  int n = 0;
  REQUIRE_RC(cu.device_count(&n), CUDA_SUCCESS);
  if (n < 2) {
    printf("   skipped: one device\n");
    return;
  }
  CUdevice dev1;
  REQUIRE_RC(cu.device_get(&dev1, 1), CUDA_SUCCESS);
  CUmemoryPool pool0 = NULL, pool1 = NULL;
  REQUIRE_RC(cu.default_pool(&pool0, dev0), CUDA_SUCCESS);
  REQUIRE_RC(cu.default_pool(&pool1, dev1), CUDA_SUCCESS);
  CHECK(pool0 != pool1);
  uint64_t used0 = attr(pool0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  uint64_t used1 = attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p = 0, q = 0;
  CHECK_RC(use_device_1(&p), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used1 + MiB);
  CHECK_EQ_U64(attr(pool0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used0);
  CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  REQUIRE_RC(cu.ctx_set(ctx0), CUDA_SUCCESS);

  pthread_t t;
  REQUIRE_EQ_INT(pthread_create(&t, NULL, alloc_on_device_1, &q), 0);
  pthread_join(t, NULL);
  CHECK(q != 0);
  CHECK_EQ_U64(attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used1 + MiB);
  CHECK_EQ_U64(attr(pool0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used0);
  /* Freed from this thread, on device 0: the block still knows its pool. */
  CHECK_RC(cu.free(q, NULL), CUDA_SUCCESS);
  CHECK_RC(cu.ctx_sync(), CUDA_SUCCESS);
  CHECK_EQ_U64(attr(pool1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used1);
}

/* TIDEPOOL_PRELOAD=0: everything reaches the driver, and the interposer
 * answers nothing. */
static void test_off(void) {
  CUdeviceptr p = 0;
  unsigned long before = stub("cuMemAllocAsync");
  CUresult r = cu.alloc(&p, 16, NULL);
  /* Nothing reached the interposer, which had nothing to decide. */
  CHECK(preload_mode() == MODE_OFF || preload_mode() == MODE_UNDECIDED);
  CUmemoryPool pool = NULL;
  if (stub_calls) {
    CHECK_RC(r, CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ_U64(stub("cuMemAllocAsync") - before, 1);
    CHECK_RC(cu.default_pool(&pool, dev0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ_U64(stub("cuDeviceGetDefaultMemPool"), 1);
  } else {
    /* The driver's pool answers. */
    CHECK_RC(r, CUDA_SUCCESS);
    CHECK_RC(cu.default_pool(&pool, dev0), CUDA_SUCCESS);
    CHECK(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 16);
    CHECK_RC(cu.free(p, NULL), CUDA_SUCCESS);
    CHECK_RC(cu.stream_sync(NULL), CUDA_SUCCESS);
  }
  for (int i = C_MALLOC; i <= C_DRIVER; i++)
    CHECK_EQ_U64(counter(i), 0);
}

/* ---- main ------------------------------------------------------------------
 */

static int load_diagnostics(void) {
  void *sym = dlsym(RTLD_DEFAULT, "tidepool_preload_mode");
  memcpy(&preload_mode, &sym, sizeof sym);
  sym = dlsym(RTLD_DEFAULT, "tidepool_preload_counter");
  memcpy(&preload_counter, &sym, sizeof sym);
  sym = dlsym(RTLD_DEFAULT, "tidepool_preload_pool_stats");
  memcpy(&preload_pool_stats, &sym, sizeof sym);
  sym = dlsym(libcuda, "cuda_stub_calls");
  memcpy(&stub_calls, &sym, sizeof sym);
  return preload_mode && preload_counter && preload_pool_stats;
}

int main(int argc, char **argv) {
  const char *want = argc > 1 ? argv[1] : "host";
  expected_mode = strcmp(want, "off") == 0    ? MODE_OFF
                  : strcmp(want, "cuda") == 0 ? MODE_CUDA
                                              : MODE_HOST;
  if (!load_driver()) {
    if (expected_mode == MODE_CUDA) {
      printf("SKIP: no CUDA driver (libcuda.so.1)\n");
      return SKIP_EXIT;
    }
    printf("FAIL: the stand-in libcuda.so.1 cannot be used\n");
    return 1;
  }
  if (!load_diagnostics()) {
    printf("FAIL: libtidepool_preload.so is not preloaded (LD_PRELOAD)\n");
    return 1;
  }
  int devices = 0;
  if (cu.init(0) != CUDA_SUCCESS || cu.device_count(&devices) != CUDA_SUCCESS ||
      devices == 0) {
    printf("SKIP: the driver sees no CUDA device\n");
    return SKIP_EXIT;
  }
  /* As the runtime does: the primary context of device 0, current. */
  REQUIRE_EXIT(cu.device_get(&dev0, 0) == CUDA_SUCCESS);
  REQUIRE_EXIT(cu.primary_retain(&ctx0, dev0) == CUDA_SUCCESS);
  REQUIRE_EXIT(cu.ctx_set(ctx0) == CUDA_SUCCESS);
  printf("test_preload_driver: %s, driver %s, %d device(s)\n", want,
         stub_calls ? "stand-in" : "real", devices);
  /* Nothing is decided before the first allocator call. */
  CHECK_EQ_INT(preload_mode(), MODE_UNDECIDED);
  RUN_TEST(test_handed_out);
  RUN_TEST(test_rtld_next);
  if (expected_mode == MODE_OFF) {
    RUN_TEST(test_off);
    return check_done();
  }
  RUN_TEST(test_malloc_free);
  REQUIRE_EXIT(preload_mode() == expected_mode);
  RUN_TEST(test_errors);
  RUN_TEST(test_pool_create);
  RUN_TEST(test_current_pools);
  RUN_TEST(test_mem_free);
  RUN_TEST(test_event_order);
  RUN_TEST(test_ctx_synchronize);
  RUN_TEST(test_capture);
  RUN_TEST(test_capture_to_graph);
  RUN_TEST(test_other_contexts);
  RUN_TEST(test_own_objects_without_context);
  RUN_TEST(test_pointer_attributes);
  RUN_TEST(test_ipc);
  RUN_TEST(test_devices);
  if (stub_calls)
    RUN_TEST(test_foreign_pool);
  else
    RUN_TEST(test_per_thread);
  printf("interposer: %llu allocations, %llu frees, %llu pool calls, %llu "
         "forwarded, %llu synchronizations, %llu event calls; %llu through "
         "the driver's entry points\n",
         counter(C_MALLOC), counter(C_FREE), counter(C_POOL),
         counter(C_FORWARDED), counter(C_SYNC), counter(C_EVENT),
         counter(C_DRIVER));
  return check_done();
}
