/* test_preload: the CUDA runtime's stream-ordered allocator called by its own
 * names (cudaMallocAsync, cudaMemPool*, ...) with libtidepool_preload.so
 * preloaded, checking that tidepool answers, with the runtime's error codes
 * and last error. Built twice: against a stand-in runtime (run with
 * TIDEPOOL_PRELOAD=host, the host platform, or =0, everything forwarded)
 * and against the toolkit's runtime (run on a GPU; exit 77 without one).
 * Usage: test_preload host|off|cuda (or env, for the launcher's test) */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "check.h"

#define MiB ((size_t)1 << 20)
#define SKIP_EXIT 77

/* The entry points of per-thread default stream builds, which the header
 * declares only for them. */
extern cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
extern cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);

#define CHECK_RC(expr, want) CHECK_EQ_INT((expr), (want))
#define REQUIRE_RC(expr, want) REQUIRE_EQ_INT((expr), (want))

/* ---- the interposer's and the stand-in's diagnostics ----------------------
 */

enum { MODE_UNDECIDED, MODE_OFF, MODE_CUDA, MODE_HOST };
enum { C_MALLOC, C_FREE, C_POOL, C_FORWARDED, C_SYNC, C_EVENT, C_FAILED };
enum { C_DRIVER = 7 };

static int (*preload_mode)(void);
static unsigned long long (*preload_counter)(int);
static int (*preload_pool_stats)(int, unsigned long long[4]);
static unsigned long (*stub_calls)(const char *);
static unsigned long (*driver_stub_calls)(const char *);
static void *(*stub_next)(const char *);
static int expected_mode;

static unsigned long long counter(int which) {
  return preload_counter(which);
}

static unsigned long stub(const char *name) {
  return stub_calls ? stub_calls(name) : 0;
}

/* How many times the stand-in driver's `name` was called (0 on a GPU). */
static unsigned long driver_stub(const char *name) {
  return driver_stub_calls ? driver_stub_calls(name) : 0;
}

static uint64_t attr(cudaMemPool_t pool, enum cudaMemPoolAttr a) {
  uint64_t v = UINT64_MAX;
  CHECK_RC(cudaMemPoolGetAttribute(pool, a, &v), cudaSuccess);
  return v;
}

static cudaMemPool_t new_pool(unsigned handle_types) {
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = (enum cudaMemAllocationHandleType)handle_types;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = NULL;
  CHECK_RC(cudaMemPoolCreate(&pool, &props), cudaSuccess);
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

static atomic_int *hold(cudaStream_t stream, int slot) {
  atomic_store(&hold_open[slot], 0);
  CHECK_RC(cudaLaunchHostFunc(stream, hold_fn, &hold_open[slot]), cudaSuccess);
  return &hold_open[slot];
}

/* ---- tests ------------------------------------------------------------------
 */

static void test_malloc_free(void) {
  cudaMemPool_t pool = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t zero = 0;
  REQUIRE_RC(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero),
      cudaSuccess);
  unsigned long long mallocs = counter(C_MALLOC), frees = counter(C_FREE);
  void *p = NULL;
  REQUIRE_RC(cudaMallocAsync(&p, MiB, NULL), cudaSuccess);
  CHECK(p != NULL);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 1);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrUsedMemCurrent), MiB);
  /* tidepool reserves in 2 MiB chunks, the driver in 32 MiB steps. */
  uint64_t reserved = attr(pool, cudaMemPoolAttrReservedMemCurrent);
  CHECK_EQ_U64(reserved, 2 * MiB);

  unsigned char back[64];
  CHECK_RC(cudaMemsetAsync(p, 0x5a, MiB, NULL), cudaSuccess);
  CHECK_RC(cudaMemcpyAsync(back, (char *)p + MiB - sizeof back, sizeof back,
                           cudaMemcpyDeviceToHost, NULL),
           cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK_EQ_INT(back[0], 0x5a);
  CHECK_EQ_INT(back[sizeof back - 1], 0x5a);

  /* tidepool's own figures, asked directly, are the runtime names'. */
  unsigned long long own[4] = {0};
  CHECK_EQ_INT(preload_pool_stats(0, own), 0);
  CHECK_EQ_U64(own[0], reserved);
  CHECK_EQ_U64(own[2], MiB);

  CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrUsedMemCurrent), 0);
  /* The runtime's synchronize reaches tidepool once, which falls to the
   * release threshold (0). */
  unsigned long long syncs = counter(C_SYNC);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 1);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReservedMemCurrent), 0);
  CHECK(attr(pool, cudaMemPoolAttrUsedMemHigh) >= MiB);
  CHECK_RC(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero),
           cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrUsedMemHigh), 0);

  /* Size 0 succeeds with NULL, as tidepool answers. */
  p = &zero;
  CHECK_RC(cudaMallocAsync(&p, 0, NULL), cudaSuccess);
  CHECK(p == NULL);
}

static void test_errors(void) {
  (void)cudaGetLastError();
  CHECK_RC(cudaMallocAsync(NULL, 16, NULL), cudaErrorInvalidValue);
  CHECK_RC(cudaPeekAtLastError(), cudaErrorInvalidValue);
  CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_RC(cudaGetLastError(), cudaSuccess);

  void *p = NULL;
  CHECK_RC(cudaMallocAsync(&p, (size_t)1 << 62, NULL),
           cudaErrorMemoryAllocation);
  CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
  CHECK_RC(cudaGetLastError(), cudaSuccess);

  /* A runtime failure after tidepool's is the last error. */
  CHECK_RC(cudaMallocAsync(NULL, 16, NULL), cudaErrorInvalidValue);
  CHECK_RC(cudaSetDevice(1 << 20), cudaErrorInvalidDevice);
  CHECK_RC(cudaGetLastError(), cudaErrorInvalidDevice);
  CHECK_RC(cudaGetLastError(), cudaSuccess);

  cudaMemPool_t pool = NULL;
  CHECK_RC(cudaDeviceGetDefaultMemPool(&pool, 1 << 20), cudaErrorInvalidDevice);
  CHECK_RC(cudaDeviceGetDefaultMemPool(NULL, 0), cudaErrorInvalidValue);
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t v = 0;
  CHECK_RC(cudaMemPoolGetAttribute(pool, (enum cudaMemPoolAttr)0x77, &v),
           cudaErrorInvalidValue);
  CHECK_RC(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInvalidValue);
  CHECK_RC(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, NULL),
           cudaErrorInvalidValue);
  /* The default pool cannot be destroyed. */
  CHECK_RC(cudaMemPoolDestroy(pool), cudaErrorInvalidValue);
  CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_RC(
      cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, NULL),
      cudaErrorInvalidValue);
  CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);

  /* A pointer nobody gave out goes to the runtime, which refuses it. */
  unsigned long long forwarded = counter(C_FORWARDED);
  int local = 0;
  CHECK(cudaFreeAsync(&local, NULL) != cudaSuccess);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 1);
  (void)cudaGetLastError();
}

static void test_pool_create(void) {
  cudaMemPool_t pool = new_pool(0);
  REQUIRE(pool != NULL);
  uint64_t threshold = 4 * MiB;
  CHECK_RC(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                   &threshold),
           cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReleaseThreshold), 4 * MiB);
  int on = -1;
  CHECK_RC(cudaMemPoolGetAttribute(
               pool, cudaMemPoolReuseFollowEventDependencies, &on),
           cudaSuccess);
  CHECK_EQ_INT(on, 1);

  struct cudaMemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = cudaMemLocationTypeDevice;
  desc.location.id = 0;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK_RC(cudaMemPoolSetAccess(pool, &desc, 1), cudaSuccess);
  CHECK_RC(cudaMemPoolSetAccess(pool, NULL, 1), cudaErrorInvalidValue);
  /* A count no list can have: the runtime's one documented error. */
  CHECK_RC(cudaMemPoolSetAccess(pool, &desc, SIZE_MAX), cudaErrorInvalidValue);
  enum cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
  struct cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
  CHECK_RC(cudaMemPoolGetAccess(&flags, pool, &loc), cudaSuccess);
  CHECK_EQ_INT(flags, cudaMemAccessFlagsProtReadWrite);
  loc.id = 1 << 20;
  CHECK_RC(cudaMemPoolGetAccess(&flags, pool, &loc), cudaErrorInvalidValue);
  (void)cudaGetLastError();

  cudaMemPool_t def = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&def, 0), cudaSuccess);
  uint64_t def_used = attr(def, cudaMemPoolAttrUsedMemCurrent);
  void *p = NULL;
  REQUIRE_RC(cudaMallocFromPoolAsync(&p, 3 * MiB, pool, NULL), cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrUsedMemCurrent), 3 * MiB);
  CHECK_EQ_U64(attr(def, cudaMemPoolAttrUsedMemCurrent), def_used);
  CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  /* Kept up to the threshold, then trimmed. */
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReservedMemCurrent), 4 * MiB);
  CHECK_RC(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReservedMemCurrent), 0);

  CHECK_RC(cudaMemPoolDestroy(pool), cudaSuccess);
  CHECK_RC(cudaMemPoolDestroy(pool), cudaErrorInvalidValue);
  (void)cudaGetLastError();

  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = (enum cudaMemLocationType)99;
  CHECK_RC(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
  props.location.type = cudaMemLocationTypeDevice;
  props.handleTypes = cudaMemHandleTypeWin32; /* the driver's answer on Linux */
  CHECK_RC(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
  props.handleTypes = cudaMemHandleTypeNone;
  props.allocType = (enum cudaMemAllocationType)5;
  CHECK_RC(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
  CHECK_RC(cudaMemPoolCreate(NULL, &props), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

static void test_current_pools(void) {
  cudaMemPool_t def = NULL, cur = NULL, got = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&def, 0), cudaSuccess);
  REQUIRE_RC(cudaDeviceGetMemPool(&cur, 0), cudaSuccess);
  CHECK(def == cur);
  struct cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
  CHECK_RC(cudaMemGetDefaultMemPool(&got, &loc, cudaMemAllocationTypePinned),
           cudaSuccess);
  CHECK(got == def);
  CHECK_RC(cudaMemGetMemPool(&got, &loc, cudaMemAllocationTypePinned),
           cudaSuccess);
  CHECK(got == def);

  cudaMemPool_t mine = new_pool(0);
  REQUIRE(mine != NULL);
  CHECK_RC(cudaDeviceSetMemPool(0, mine), cudaSuccess);
  CHECK_RC(cudaDeviceGetMemPool(&got, 0), cudaSuccess);
  CHECK(got == mine);
  CHECK_RC(cudaMemGetMemPool(&got, &loc, cudaMemAllocationTypePinned),
           cudaSuccess);
  CHECK(got == mine);
  void *p = NULL;
  CHECK_RC(cudaMallocAsync(&p, MiB, NULL), cudaSuccess);
  CHECK_EQ_U64(attr(mine, cudaMemPoolAttrUsedMemCurrent), MiB);
  CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
  CHECK_RC(cudaMemSetMemPool(&loc, cudaMemAllocationTypePinned, def),
           cudaSuccess);
  CHECK_RC(cudaDeviceGetMemPool(&got, 0), cudaSuccess);
  CHECK(got == def);
  /* A pool tidepool did not make cannot become current. */
  CHECK_RC(cudaDeviceSetMemPool(0, (cudaMemPool_t)&loc), cudaErrorInvalidValue);
  CHECK_RC(cudaMemGetMemPool(&got, NULL, cudaMemAllocationTypePinned),
           cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK_RC(cudaMemPoolDestroy(mine), cudaSuccess);
}

static void test_cuda_free(void) {
  cudaMemPool_t pool = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  unsigned long long frees = counter(C_FREE);
  void *p = NULL;
  REQUIRE_RC(cudaMallocAsync(&p, MiB, NULL), cudaSuccess);
  CHECK_RC(cudaFree(p), cudaSuccess);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrUsedMemCurrent), 0);
  /* cudaFree of the runtime's own memory is the runtime's. */
  unsigned long before = stub("cudaFree");
  void *q = NULL;
  REQUIRE_RC(cudaMalloc(&q, 4096), cudaSuccess);
  CHECK_RC(cudaFree(q), cudaSuccess);
  CHECK_EQ_U64(counter(C_FREE) - frees, 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cudaFree") - before, 1);
}

/* Sets both policies that let a stream reuse another's pending free
 * (internal dependencies and opportunistic reuse) to `on`. */
static void cross_stream_reuse(cudaMemPool_t pool, int on) {
  CHECK_RC(cudaMemPoolSetAttribute(
               pool, cudaMemPoolReuseAllowInternalDependencies, &on),
           cudaSuccess);
  CHECK_RC(
      cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &on),
      cudaSuccess);
}

/* A block freed on stream a, before an event that stream b waits for, is
 * reused by b while a is still held; stream c, unordered, gets other
 * memory. Only possible if tidepool learned the record and the wait. */
static void test_event_order(void) {
  cudaMemPool_t pool = new_pool(0);
  REQUIRE(pool != NULL);
  cross_stream_reuse(pool, 0);
  cudaStream_t a = NULL, b = NULL, c = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  REQUIRE_RC(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  REQUIRE_RC(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e = NULL;
  REQUIRE_RC(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  unsigned long long events = counter(C_EVENT);

  atomic_int *gate = hold(a, 0);
  void *p = NULL, *x = NULL, *q = NULL;
  CHECK_RC(cudaMallocFromPoolAsync(&p, 4 * MiB, pool, a), cudaSuccess);
  CHECK_RC(cudaFreeAsync(p, a), cudaSuccess);
  CHECK_RC(cudaEventRecord(e, a), cudaSuccess);
  CHECK_RC(cudaMallocFromPoolAsync(&x, 4 * MiB, pool, c), cudaSuccess);
  CHECK(x != p);
  CHECK_RC(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  CHECK_RC(cudaMallocFromPoolAsync(&q, 4 * MiB, pool, b), cudaSuccess);
  CHECK_EQ_PTR(q, p);
  CHECK_EQ_U64(counter(C_EVENT) - events, 2);
  atomic_store(gate, 1);

  CHECK_RC(cudaFreeAsync(x, c), cudaSuccess);
  CHECK_RC(cudaFreeAsync(q, b), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(a), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(b), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(c), cudaSuccess);
  CHECK_RC(cudaEventDestroy(e), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(a), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(b), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(c), cudaSuccess);
  CHECK_RC(cudaMemPoolDestroy(pool), cudaSuccess);
}

/* cudaEventSynchronize lets tidepool see the free complete and release. */
static void test_event_synchronize(void) {
  cudaMemPool_t pool = new_pool(0);
  REQUIRE(pool != NULL);
  cudaStream_t a = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e = NULL;
  REQUIRE_RC(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  void *p = NULL;
  CHECK_RC(cudaMallocFromPoolAsync(&p, 4 * MiB, pool, a), cudaSuccess);
  CHECK_RC(cudaFreeAsync(p, a), cudaSuccess);
  CHECK_RC(cudaEventRecord(e, a), cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReservedMemCurrent), 4 * MiB);
  CHECK_RC(cudaEventSynchronize(e), cudaSuccess);
  CHECK_EQ_U64(attr(pool, cudaMemPoolAttrReservedMemCurrent), 0);
  CHECK_RC(cudaEventDestroy(e), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(a), cudaSuccess);
  CHECK_RC(cudaMemPoolDestroy(pool), cudaSuccess);
}

/* What the host functions of a graph captured in the host mode see. */
typedef struct graph_run {
  unsigned char *mem, *side, *keep;
  atomic_int runs, bad;
} graph_run;

static void fill_and_check(unsigned char *p, unsigned char value,
                           graph_run *r) {
  memset(p, value, MiB);
  for (size_t i = 0; i < MiB; i += 4096)
    if (p[i] != value)
      atomic_fetch_add(&r->bad, 1);
}

static void run_main(void *arg) {
  graph_run *r = arg;
  fill_and_check(r->mem, 0x5a, r);
  atomic_fetch_add(&r->runs, 1);
}

static void run_side(void *arg) {
  graph_run *r = arg;
  fill_and_check(r->side, 0x6b, r);
}

static void run_keep(void *arg) {
  graph_run *r = arg;
  fill_and_check(r->keep, 0x3c, r);
}

/* Allocations and frees on a stream being captured are tidepool's graph
 * allocations, on a capture of the runtime's (with a GPU, where the driver
 * captures) as of tidepool's (the host mode, where the streams are
 * tidepool's and so is capture): nothing is forwarded. The work around
 * them runs at every launch (host functions on host; a memset and a copy
 * out with a GPU), a fork through events joins the capture, and an
 * allocation the graph does not free is freed once after each launch. */
static void test_capture(void) {
  bool host = expected_mode == MODE_HOST;
  cudaStream_t s = NULL, s2 = NULL;
  cudaEvent_t fork = NULL, join = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  REQUIRE_RC(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking),
             cudaSuccess);
  REQUIRE_RC(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming),
             cudaSuccess);
  REQUIRE_RC(cudaEventCreateWithFlags(&join, cudaEventDisableTiming),
             cudaSuccess);
  unsigned char *out = NULL;
  REQUIRE_RC(cudaMallocAsync((void **)&out, 3 * 4096, s), cudaSuccess);
  REQUIRE_RC(cudaStreamSynchronize(s), cudaSuccess);
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long long mallocs = counter(C_MALLOC), frees = counter(C_FREE);
  unsigned long stub_mallocs = stub("cudaMallocAsync");
  graph_run run = {0};

  REQUIRE_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal),
             cudaSuccess);
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CHECK_RC(cudaStreamIsCapturing(s, &st), cudaSuccess);
  CHECK_EQ_INT(st, cudaStreamCaptureStatusActive);
  void *g = NULL, *side = NULL, *keep = NULL;
  CHECK_RC(cudaMallocAsync(&g, MiB, s), cudaSuccess);
  CHECK_RC(cudaEventRecord(fork, s), cudaSuccess);
  CHECK_RC(cudaStreamWaitEvent(s2, fork, 0), cudaSuccess);
  CHECK_RC(cudaStreamIsCapturing(s2, &st), cudaSuccess);
  CHECK_EQ_INT(st, cudaStreamCaptureStatusActive);
  CHECK_RC(cudaMallocAsync(&side, MiB, s2), cudaSuccess);
  run.mem = g;
  run.side = side;
  if (host) {
    CHECK_RC(cudaLaunchHostFunc(s, run_main, &run), cudaSuccess);
    CHECK_RC(cudaLaunchHostFunc(s2, run_side, &run), cudaSuccess);
  } else {
    CHECK_RC(cudaMemsetAsync(g, 0x5a, MiB, s), cudaSuccess);
    CHECK_RC(cudaMemcpyAsync(out, (char *)g + MiB - 4096, 4096,
                             cudaMemcpyDeviceToDevice, s),
             cudaSuccess);
    CHECK_RC(cudaMemsetAsync(side, 0x6b, MiB, s2), cudaSuccess);
    CHECK_RC(
        cudaMemcpyAsync(out + 4096, side, 4096, cudaMemcpyDeviceToDevice, s2),
        cudaSuccess);
  }
  CHECK_RC(cudaFreeAsync(side, s2), cudaSuccess);
  CHECK_RC(cudaEventRecord(join, s2), cudaSuccess);
  CHECK_RC(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
  CHECK_RC(cudaFreeAsync(g, s), cudaSuccess);
  CHECK_RC(cudaMallocAsync(&keep, MiB, s), cudaSuccess);
  run.keep = keep;
  if (host) {
    CHECK_RC(cudaLaunchHostFunc(s, run_keep, &run), cudaSuccess);
  } else {
    CHECK_RC(cudaMemsetAsync(keep, 0x3c, MiB, s), cudaSuccess);
    CHECK_RC(cudaMemcpyAsync(out + 2 * 4096, keep, 4096,
                             cudaMemcpyDeviceToDevice, s),
             cudaSuccess);
  }
  cudaGraph_t graph = NULL;
  REQUIRE_RC(cudaStreamEndCapture(s, &graph), cudaSuccess);
  CHECK_RC(cudaStreamIsCapturing(s2, &st), cudaSuccess);
  CHECK_EQ_INT(st, cudaStreamCaptureStatusNone);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 3);
  CHECK_EQ_U64(counter(C_FREE) - frees, 2);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 0);
  if (stub_calls)
    CHECK_EQ_U64(stub("cudaMallocAsync") - stub_mallocs, 0);
  CHECK(g != side && side != keep && g != keep);

  cudaGraphExec_t exec = NULL, second = NULL;
  REQUIRE_RC(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  /* A graph with allocations has one exec at a time, as in CUDA, which
   * refuses a second with cudaErrorNotSupported (H100, driver 580). */
  CHECK_RC(cudaGraphInstantiate(&second, graph, 0), cudaErrorNotSupported);
  CHECK(second == NULL);
  (void)cudaGetLastError();
  for (int i = 0; i < 3; i++) {
    CHECK_RC(cudaMemsetAsync(out, 0, 3 * 4096, s), cudaSuccess);
    CHECK_RC(cudaGraphLaunch(exec, s), cudaSuccess);
    CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
    unsigned char back[3] = {0, 0, 0};
    for (int k = 0; !host && k < 3; k++)
      CHECK_RC(
          cudaMemcpy(&back[k], out + k * 4096 + 17, 1, cudaMemcpyDeviceToHost),
          cudaSuccess);
    if (!host) {
      CHECK_EQ_INT(back[0], 0x5a);
      CHECK_EQ_INT(back[1], 0x6b);
      CHECK_EQ_INT(back[2], 0x3c);
    }
    /* An allocation the graph does not free is live after a launch, which
     * refuses the next launch until it is freed (with a GPU the driver's
     * exec is launched by tidepool, which adopted it), once per launch. */
    if (i == 0)
      CHECK_RC(cudaGraphLaunch(exec, s), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK_RC(cudaFreeAsync(keep, s), cudaSuccess);
    CHECK_RC(cudaFreeAsync(keep, s), cudaErrorInvalidValue);
    (void)cudaGetLastError();
  }
  CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
  if (host) {
    CHECK_EQ_INT(atomic_load(&run.runs), 3);
    CHECK_EQ_INT(atomic_load(&run.bad), 0);
  }
  /* The output of a last launch outlives the graph until it is freed. */
  CHECK_RC(cudaGraphLaunch(exec, s), cudaSuccess);
  CHECK_RC(cudaGraphExecDestroy(exec), cudaSuccess);
  CHECK_RC(cudaGraphDestroy(graph), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
  if (!host) {
    unsigned char kept = 0;
    CHECK_RC(cudaMemcpy(&kept, keep, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ_INT(kept, 0x3c);
  }
  CHECK_RC(cudaFreeAsync(keep, s), cudaSuccess);
  CHECK_RC(cudaFreeAsync(keep, s), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CHECK_RC(cudaFreeAsync(out, s), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
  CHECK_RC(cudaEventDestroy(fork), cudaSuccess);
  CHECK_RC(cudaEventDestroy(join), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(s2), cudaSuccess);
}

/* The fake driver's count of the capture questions it was asked; NULL
 * where the driver is another (a GPU's, or the host mode's stand-in). */
static unsigned long long (*fake_questions)(void);

static unsigned long long questions(void) {
  return fake_questions ? fake_questions() : 0;
}

static unsigned long long pairs_ask(cudaStream_t s, int pairs) {
  unsigned long long before = questions();
  for (int i = 0; i < pairs; i++) {
    void *p = NULL;
    CHECK_RC(cudaMallocAsync(&p, 256, s), cudaSuccess);
    CHECK_RC(cudaFreeAsync(p, s), cudaSuccess);
  }
  return questions() - before;
}

/* The runtime's begin and end are counted (by the runtime-level layer and
 * again at the driver's entry points the runtime reaches): with a GPU, an
 * allocation and a free ask the driver nothing about capture while no
 * capture is under way, and ask while one is; an allocation in the capture
 * is the graph's (its free there too). Over the fake driver the questions
 * are counted; elsewhere the sequence runs and answers as it must. */
static void test_capture_counted(void) {
  if (expected_mode == MODE_HOST) {
    printf("   (host mode: tidepool's own captures)\n");
    return;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  void *sym = lib ? dlsym(lib, "fake_cuda_capture_questions") : NULL;
  memcpy(&fake_questions, &sym, sizeof sym);
  if (!fake_questions)
    printf("   (not the fake driver: the questions are not counted)\n");
  cudaStream_t s = NULL, t = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  REQUIRE_RC(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
  (void)pairs_ask(s, 1); /* a stream of the program's is met once */
  (void)pairs_ask(t, 1);
  CHECK_EQ_U64(pairs_ask(t, 50), 0);
  for (int round = 0; round < 2; round++) {
    REQUIRE_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed),
               cudaSuccess);
    unsigned long long asked = pairs_ask(t, 5);
    if (fake_questions)
      CHECK(asked >= 10);
    void *g = NULL;
    CHECK_RC(cudaMallocAsync(&g, MiB, s), cudaSuccess);
    CHECK_RC(cudaFreeAsync(g, s), cudaSuccess);
    cudaGraph_t graph = NULL;
    REQUIRE_RC(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK_RC(cudaGraphDestroy(graph), cudaSuccess);
    CHECK_EQ_U64(pairs_ask(t, 50), 0);
  }
  CHECK_RC(cudaStreamSynchronize(t), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(t), cudaSuccess);
  if (lib)
    dlclose(lib);
}

/* A pool shared through a POSIX descriptor (passed by value on import, as
 * the runtime takes it) and a pointer through its 64-byte record. */
/* A synchronize during a global capture is refused with
 * cudaErrorStreamCaptureUnsupported and invalidates the capture, as CUDA
 * documents: in the host mode tidepool owns the captures, and a stream,
 * device or event synchronize answered the stand-in runtime's success while
 * the capture was lost. */
static void test_synchronize_in_capture(void) {
  if (expected_mode != MODE_HOST && stub_calls) {
    printf("   (the stand-in runtime keeps no captures)\n");
    return;
  }
  cudaStream_t s = NULL;
  cudaEvent_t e = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  REQUIRE_RC(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  REQUIRE_RC(cudaEventRecord(e, s), cudaSuccess);
  for (int way = 0; way < 3; way++) {
    void *p = NULL;
    cudaGraph_t g = NULL;
    REQUIRE_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal),
               cudaSuccess);
    CHECK_RC(cudaMallocAsync(&p, 4096, s), cudaSuccess);
    cudaError_t r = way == 0   ? cudaStreamSynchronize(s)
                    : way == 1 ? cudaDeviceSynchronize()
                               : cudaEventSynchronize(e);
    if (r != cudaErrorStreamCaptureUnsupported)
      CHECK_FAIL("way %d: the synchronize answered %d", way, (int)r);
    CHECK_RC(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CHECK(g == NULL);
    (void)cudaGetLastError();
  }
  CHECK_RC(cudaEventDestroy(e), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
}

static void test_ipc(void) {
  cudaMemPool_t pool = new_pool(cudaMemHandleTypePosixFileDescriptor);
  REQUIRE(pool != NULL);
  int fd = -1;
  CHECK_RC(cudaMemPoolExportToShareableHandle(
               &fd, pool, cudaMemHandleTypePosixFileDescriptor, 0),
           cudaSuccess);
  REQUIRE(fd >= 0);
  cudaMemPool_t imported = NULL;
  CHECK_RC(cudaMemPoolImportFromShareableHandle(
               &imported, (void *)(intptr_t)fd,
               cudaMemHandleTypePosixFileDescriptor, 0),
           cudaSuccess);
  void *p = NULL, *q = NULL;
  CHECK_RC(cudaMallocFromPoolAsync(&p, MiB, pool, NULL), cudaSuccess);
  CHECK_RC(cudaMemsetAsync(p, 0x3c, MiB, NULL), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  struct cudaMemPoolPtrExportData data;
  memset(&data, 0, sizeof data);
  CHECK_RC(cudaMemPoolExportPointer(&data, p), cudaSuccess);
  if (imported)
    CHECK_RC(cudaMemPoolImportPointer(&q, imported, &data), cudaSuccess);
  CHECK(q != NULL);
  if (q) {
    unsigned char back[16] = {0};
    CHECK_RC(
        cudaMemcpyAsync(back, q, sizeof back, cudaMemcpyDeviceToHost, NULL),
        cudaSuccess);
    CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
    CHECK_EQ_INT(back[0], 0x3c);
    CHECK_RC(cudaFreeAsync(q, NULL), cudaSuccess);
    CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  }
  CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  if (imported)
    CHECK_RC(cudaMemPoolDestroy(imported), cudaSuccess);
  CHECK_RC(cudaMemPoolDestroy(pool), cudaSuccess);
  close(fd);
  /* A descriptor that cannot be tidepool's (a pool that the driver exported
   * in a process where tidepool does not answer) is the runtime's to
   * import; in the host mode tidepool refuses it. */
  int other = open("/dev/null", O_RDONLY);
  if (!CHECK(other >= 0))
    return;
  bool host = expected_mode == MODE_HOST;
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long before = stub("cudaMemPoolImportFromShareableHandle");
  cudaMemPool_t foreign = NULL;
  cudaError_t rc = cudaMemPoolImportFromShareableHandle(
      &foreign, (void *)(intptr_t)other, cudaMemHandleTypePosixFileDescriptor,
      0);
  CHECK(rc != cudaSuccess);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, host ? 0 : 1);
  if (stub_calls)
    CHECK_EQ_U64(stub("cudaMemPoolImportFromShareableHandle") - before,
                 host ? 0 : 1);
  if (host)
    CHECK_RC(rc, cudaErrorInvalidValue);
  (void)cudaGetLastError();
  close(other);
}

/* Calls on a pool tidepool did not make go to the runtime. */
static void test_foreign_pool_stub(void) {
  cudaMemPool_t foreign = (cudaMemPool_t)(uintptr_t)0x1234000;
  unsigned long long forwarded = counter(C_FORWARDED);
  unsigned long before = stub("cudaMemPoolGetAttribute");
  uint64_t v = 0;
  CHECK_RC(cudaMemPoolGetAttribute(foreign, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorNotSupported);
  CHECK_EQ_U64(stub("cudaMemPoolGetAttribute") - before, 1);
  void *p = NULL;
  CHECK_RC(cudaMallocFromPoolAsync(&p, 16, foreign, NULL),
           cudaErrorNotSupported);
  CHECK_RC(cudaMemPoolTrimTo(foreign, 0), cudaErrorNotSupported);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 3);
  /* The runtime's failure is the last error. */
  CHECK_RC(cudaGetLastError(), cudaErrorNotSupported);
}

/* The driver's own function `name`, past the interposer, which hands out
 * tidepool's version of the allocator's driver functions too: the C
 * library's dlsym, found through the dlvsym the interposer leaves alone
 * (its older version, or the only one). */
#if defined(TP_PL_DL_COMPAT)
extern void *libc_dlvsym(void *, const char *, const char *);
__asm__(".symver libc_dlvsym, dlvsym@" TP_PL_DL_COMPAT);
#else
#define libc_dlvsym dlvsym
#endif

static void *driver_own(void *libcuda, const char *name) {
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  void *sym = libc ? libc_dlvsym(libc, "dlsym", TP_PL_DL_DEFAULT) : NULL;
  if (!sym) {
    void *libdl = dlopen("libdl.so.2", RTLD_LAZY | RTLD_NOLOAD);
    sym = libdl ? libc_dlvsym(libdl, "dlsym", TP_PL_DL_DEFAULT) : NULL;
  }
  void *(*real_dlsym)(void *, const char *) = NULL;
  memcpy(&real_dlsym, &sym, sizeof sym);
  return real_dlsym ? real_dlsym(libcuda, name) : NULL;
}

/* Fills the function pointer at `slot` with the driver's own `name`. */
static bool driver_fn(void *libcuda, const char *name, void *slot) {
  void *sym = driver_own(libcuda, name);
  memcpy(slot, &sym, sizeof sym);
  return sym != NULL;
}

/* A pool of the driver's own (made through the driver API, past the
 * interposer) stays the runtime's: allocations from it and their frees go
 * there. */
static void test_foreign_pool_driver(void) {
  void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(libcuda != NULL);
  int (*get_pool)(void **, int) = NULL;
  int (*device_get)(int *, int) = NULL;
  REQUIRE(driver_fn(libcuda, "cuDeviceGetDefaultMemPool", &get_pool) &&
          driver_fn(libcuda, "cuDeviceGet", &device_get));
  int dev = -1;
  void *driver_pool = NULL;
  REQUIRE_EQ_INT(device_get(&dev, 0), 0);
  REQUIRE_EQ_INT(get_pool(&driver_pool, dev), 0);
  unsigned long long forwarded = counter(C_FORWARDED);
  void *p = NULL;
  CHECK_RC(cudaMallocFromPoolAsync(&p, MiB, (cudaMemPool_t)driver_pool, NULL),
           cudaSuccess);
  CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, 2);
  dlclose(libcuda);
}

/* What only a real runtime has: per-thread default stream entry points and
 * pointer attributes from the driver. */
static void test_cuda_only(void) {
  void *p = NULL;
  unsigned long long mallocs = counter(C_MALLOC);
  CHECK_RC(cudaMallocAsync_ptsz(&p, MiB, NULL), cudaSuccess);
  CHECK_EQ_U64(counter(C_MALLOC) - mallocs, 1);
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  CHECK_RC(cudaPointerGetAttributes(&a, p), cudaSuccess);
  CHECK_EQ_INT(a.type, cudaMemoryTypeDevice);
  CHECK_EQ_INT(a.device, 0);
  CHECK_EQ_PTR(a.devicePointer, p);
  CHECK_RC(cudaFreeAsync_ptsz(p, NULL), cudaSuccess);
  CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
}

/* A call the runtime-level layer passes to the runtime reaches the driver
 * (through the entry points the runtime got from cuGetProcAddress, which
 * are the driver-level layer's), and is handled once: by the runtime-level
 * layer, never again by the driver-level one. */
static void test_once(void) {
  unsigned long long driver = counter(C_DRIVER);
  unsigned long long syncs = counter(C_SYNC), events = counter(C_EVENT);
  unsigned long stream_syncs = driver_stub("cuStreamSynchronize");
  unsigned long ctx_syncs = driver_stub("cuCtxSynchronize");
  unsigned long records = driver_stub("cuEventRecord");
  /* Over the fake driver, outside the host mode: the work is waited for
   * once, the application's synchronize being tidepool's too. */
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  unsigned long long (*fake_ctx_syncs)(void) = NULL;
  unsigned long long (*fake_stream_syncs)(void) = NULL;
  void *sym = lib ? dlsym(lib, "fake_cuda_ctx_syncs") : NULL;
  if (expected_mode != MODE_HOST)
    memcpy(&fake_ctx_syncs, &sym, sizeof sym);
  sym = lib ? dlsym(lib, "fake_cuda_stream_syncs") : NULL;
  if (expected_mode != MODE_HOST)
    memcpy(&fake_stream_syncs, &sym, sizeof sym);
  unsigned long long fake_ctx = fake_ctx_syncs ? fake_ctx_syncs() : 0;
  unsigned long long fake_streams = fake_stream_syncs ? fake_stream_syncs() : 0;
  CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
  if (fake_ctx_syncs && fake_stream_syncs) {
    CHECK_EQ_U64(fake_ctx_syncs() - fake_ctx, 1);
    CHECK_EQ_U64(fake_stream_syncs() - fake_streams, 1);
  }
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 2);
  cudaStream_t s = NULL;
  REQUIRE_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e = NULL;
  REQUIRE_RC(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  CHECK_RC(cudaEventRecord(e, NULL), cudaSuccess);
  CHECK_RC(cudaStreamWaitEvent(s, e, 0), cudaSuccess);
  void *esym = lib ? dlsym(lib, "fake_cuda_event_syncs") : NULL;
  unsigned long long (*fake_event_syncs)(void) = NULL;
  if (expected_mode != MODE_HOST)
    memcpy(&fake_event_syncs, &esym, sizeof esym);
  unsigned long long fake_events = fake_event_syncs ? fake_event_syncs() : 0;
  CHECK_RC(cudaEventSynchronize(e), cudaSuccess);
  if (fake_event_syncs)
    CHECK_EQ_U64(fake_event_syncs() - fake_events, 1);
  if (lib)
    dlclose(lib);
  CHECK_EQ_U64(counter(C_EVENT) - events, 2);
  CHECK_EQ_U64(counter(C_SYNC) - syncs, 3);
  CHECK_RC(cudaEventDestroy(e), cudaSuccess);
  CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
  if (driver_stub_calls) {
    CHECK_EQ_U64(driver_stub("cuStreamSynchronize") - stream_syncs, 1);
    CHECK_EQ_U64(driver_stub("cuCtxSynchronize") - ctx_syncs, 1);
    CHECK_EQ_U64(driver_stub("cuEventRecord") - records, 1);
  }
  /* A free tidepool refused at the runtime's level, and a call on a pool
   * not tidepool's, both passed to the runtime, are not looked at again at
   * the driver's. */
  unsigned long long forwarded = counter(C_FORWARDED);
  int local = 0;
  CHECK(cudaFreeAsync(&local, NULL) != cudaSuccess);
  (void)cudaGetLastError();
  /* A made-up pool handle only for the stand-in runtime over the stand-in
   * driver: a real runtime, or a driver that emulates pools (the fake),
   * follows it and crashes, as the driver does with any bad handle. */
  bool made_up = stub_calls && driver_stub_calls;
  if (made_up) {
    uint64_t v = 0;
    CHECK(cudaMemPoolGetAttribute((cudaMemPool_t)(uintptr_t)0x1234000,
                                  cudaMemPoolAttrUsedMemCurrent,
                                  &v) != cudaSuccess);
    (void)cudaGetLastError();
  }
  CHECK_EQ_U64(counter(C_FORWARDED) - forwarded, made_up ? 2 : 1);
  CHECK_EQ_U64(counter(C_DRIVER) - driver, 0);
}

/* RTLD_NEXT keeps meaning "after the caller" through the interposer's
 * dlsym: from the program the interposer is next, from the runtime (after
 * the interposer) nothing defines the runtime's names. Where the
 * interposer's dlsym is its C fallback, "after the interposer". */
static void test_rtld_next(void) {
  CHECK(dlsym(RTLD_NEXT, "malloc") != NULL);
  if (!TP_PRELOAD_EXACT_RTLD_NEXT) {
    printf("   RTLD_NEXT is passed on from the interposer (C entry)\n");
    return;
  }
  void *next = dlsym(RTLD_NEXT, "cudaMallocAsync");
  CHECK(next != NULL);
  CHECK_EQ_PTR(next, dlsym(RTLD_DEFAULT, "cudaMallocAsync"));
  if (stub_next) {
    CHECK(stub_next("cudaMallocAsync") == NULL);
    CHECK(stub_next("malloc") != NULL);
  }
}

/* TIDEPOOL_PRELOAD=0: everything reaches the runtime, and the interposer
 * answers nothing. */
static void test_off(void) {
  void *p = NULL;
  unsigned long before = stub("cudaMallocAsync");
  cudaError_t rc = cudaMallocAsync(&p, 16, NULL);
  CHECK_EQ_INT(preload_mode(), MODE_OFF);
  cudaMemPool_t pool = NULL;
  if (stub_calls) {
    CHECK_RC(rc, cudaErrorNotSupported);
    CHECK_EQ_U64(stub("cudaMallocAsync") - before, 1);
    CHECK_RC(cudaGetLastError(), cudaErrorNotSupported);
    CHECK_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaErrorNotSupported);
    CHECK_EQ_U64(stub("cudaDeviceGetDefaultMemPool"), 1);
    CHECK_RC(cudaFreeAsync(&pool, NULL), cudaErrorInvalidValue);
    CHECK_EQ_U64(stub("cudaFreeAsync"), 1);
    (void)cudaGetLastError();
  } else {
    /* The driver's pool answers. */
    CHECK_RC(rc, cudaSuccess);
    CHECK_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
    CHECK(attr(pool, cudaMemPoolAttrUsedMemCurrent) >= 16);
    CHECK_RC(cudaFreeAsync(p, NULL), cudaSuccess);
    CHECK_RC(cudaStreamSynchronize(NULL), cudaSuccess);
  }
  /* The runtime answers a NULL value, also through the interposer. */
  CHECK_RC(
      cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, NULL),
      cudaErrorInvalidValue);
  (void)cudaGetLastError();
  for (int i = C_MALLOC; i <= C_DRIVER; i++)
    CHECK_EQ_U64(counter(i), 0);
}

/* tidepool's current device follows the runtime's: what the NULL stream
 * means, and which pool cudaMallocAsync takes from, on every thread. */
static void *alloc_on_device_1(void *arg) {
  void **p = (void **)arg;
  if (cudaSetDevice(1) == cudaSuccess &&
      cudaMallocAsync(p, MiB, NULL) != cudaSuccess)
    *p = NULL;
  return NULL;
}

/* Allocates a MiB on `s` and checks that it came from `want` (whose bytes
 * in use were `want_used`), not `other` (`other_used`); frees it and waits. */
static void mib_from(cudaStream_t s, cudaMemPool_t want, uint64_t want_used,
                     cudaMemPool_t other, uint64_t other_used) {
  void *p = NULL;
  CHECK_RC(cudaMallocAsync(&p, MiB, s), cudaSuccess);
  CHECK_EQ_U64(attr(want, cudaMemPoolAttrUsedMemCurrent), want_used + MiB);
  CHECK_EQ_U64(attr(other, cudaMemPoolAttrUsedMemCurrent), other_used);
  CHECK_RC(cudaFreeAsync(p, s), cudaSuccess);
  CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
  CHECK_EQ_U64(attr(want, cudaMemPoolAttrUsedMemCurrent), want_used);
}

static void test_devices(void) {
  int n = 0;
  REQUIRE_RC(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) {
    printf("   skipped: one device\n");
    return;
  }
  cudaMemPool_t pool0 = NULL, pool1 = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool0, 0), cudaSuccess);
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool1, 1), cudaSuccess);
  CHECK(pool0 != pool1);
  uint64_t used0 = attr(pool0, cudaMemPoolAttrUsedMemCurrent);
  uint64_t used1 = attr(pool1, cudaMemPoolAttrUsedMemCurrent);
  void *q = NULL;
  REQUIRE_RC(cudaSetDevice(1), cudaSuccess);
  mib_from(NULL, pool1, used1, pool0, used0);
  CHECK_RC(cudaSetDevice(0), cudaSuccess);

  pthread_t t;
  REQUIRE_EQ_INT(pthread_create(&t, NULL, alloc_on_device_1, &q), 0);
  pthread_join(t, NULL);
  CHECK(q != NULL);
  CHECK_EQ_U64(attr(pool1, cudaMemPoolAttrUsedMemCurrent), used1 + MiB);
  CHECK_EQ_U64(attr(pool0, cudaMemPoolAttrUsedMemCurrent), used0);
  /* Freed from this thread, on device 0: the block still knows its pool. */
  CHECK_RC(cudaFreeAsync(q, NULL), cudaSuccess);
  CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
  CHECK_EQ_U64(attr(pool1, cudaMemPoolAttrUsedMemCurrent), used1);

  /* cudaStreamLegacy is the legacy stream of the runtime's device too. */
  REQUIRE_RC(cudaSetDevice(1), cudaSuccess);
  mib_from(cudaStreamLegacy, pool1, used1, pool0, used0);
  CHECK_RC(cudaSetDevice(0), cudaSuccess);

  /* A primary context made current through the driver makes its device the
   * runtime's, which the interposer reads from the context. */
  void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(libcuda != NULL);
  int (*device_get)(int *, int) = NULL;
  int (*retain)(void **, int) = NULL;
  int (*set_current)(void *) = NULL;
  REQUIRE(driver_fn(libcuda, "cuDeviceGet", &device_get) &&
          driver_fn(libcuda, "cuDevicePrimaryCtxRetain", &retain) &&
          driver_fn(libcuda, "cuCtxSetCurrent", &set_current));
  int dev1 = -1;
  void *ctx1 = NULL;
  REQUIRE_EQ_INT(device_get(&dev1, 1), 0);
  REQUIRE_EQ_INT(retain(&ctx1, dev1), 0);
  for (int round = 0; round < 2; round++) { /* the second finds it known */
    REQUIRE_EQ_INT(set_current(ctx1), 0);
    int d = -1;
    CHECK_RC(cudaGetDevice(&d), cudaSuccess);
    CHECK_EQ_INT(d, 1);
    mib_from(NULL, pool1, used1, pool0, used0);
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    mib_from(NULL, pool0, used0, pool1, used1);
  }
  dlclose(libcuda);
}

/* A thread's per-thread stream ends with the thread (the fake driver's key
 * destructor), unseen by the interposer; a later destructor of the same
 * thread that allocates on cudaStreamPerThread gets a new stream in the
 * same context. A block freed on the old stream, whose free a host
 * function still holds, must not go to the new one (no policy allows it
 * here). A cache of the per-thread stream's id by context without a
 * thread-exit hook (f408717, reverted) handed it over. The stream's id is
 * asked of the driver directly at both ends: where the driver keeps the
 * stream into the later destructor (the same id), reuse is allowed and
 * nothing is checked; the fake must end it. */
typedef int (*stream_id_fn)(void *stream, unsigned long long *id);
static stream_id_fn late_id_of;
static unsigned long long early_id, late_id;
static atomic_int late_gate;
static void *late_pending;
static pthread_key_t late_key;
static atomic_int late_reused, late_ran;

static void late_allocs(void *arg) {
  (void)arg;
  if (cudaSetDevice(0) != cudaSuccess)
    return;
  for (int k = 0; k < 4; k++) {
    void *p = NULL;
    if (cudaMallocAsync(&p, 4096, cudaStreamPerThread) != cudaSuccess)
      return;
    atomic_fetch_add(&late_reused, p == late_pending);
    (void)cudaFreeAsync(p, cudaStreamPerThread);
  }
  /* Asked after the allocations, which are what the test is about. */
  if (late_id_of(cudaStreamPerThread, &late_id) != 0)
    return;
  atomic_store(&late_ran, 1);
}

static void *per_thread_then_end(void *arg) {
  (void)arg;
  if (cudaSetDevice(0) != cudaSuccess)
    return NULL;
  for (int i = 0; i < 3; i++) {
    void *p = NULL;
    if (cudaMallocAsync(&p, 4096, cudaStreamPerThread) == cudaSuccess)
      (void)cudaFreeAsync(p, cudaStreamPerThread);
  }
  (void)cudaStreamSynchronize(cudaStreamPerThread);
  if (cudaMallocAsync(&late_pending, 4096, cudaStreamPerThread) != cudaSuccess)
    return NULL;
  (void)cudaLaunchHostFunc(cudaStreamPerThread, hold_fn, &late_gate);
  (void)cudaFreeAsync(late_pending, cudaStreamPerThread);
  if (late_id_of(cudaStreamPerThread, &early_id) != 0)
    return NULL;
  (void)pthread_setspecific(late_key, &late_gate);
  return NULL;
}

static void test_per_thread_after_thread_end(void) {
  void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  bool fake = libcuda && dlsym(libcuda, "fake_cuda_live");
  void *sym = libcuda ? dlsym(libcuda, "cuStreamGetId") : NULL;
  memcpy(&late_id_of, &sym, sizeof sym);
  if (!late_id_of) {
    printf("   (no driver to ask the stream's id)\n");
    if (libcuda)
      dlclose(libcuda);
    return;
  }
  cudaMemPool_t pool = NULL;
  REQUIRE_RC(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  cross_stream_reuse(pool, 0);
  atomic_store(&late_gate, 0);
  atomic_store(&late_ran, 0);
  atomic_store(&late_reused, 0);
  REQUIRE_EQ_INT(pthread_key_create(&late_key, late_allocs), 0);
  pthread_t t;
  REQUIRE_EQ_INT(pthread_create(&t, NULL, per_thread_then_end, NULL), 0);
  pthread_join(t, NULL);
  CHECK_EQ_INT(atomic_load(&late_ran), 1);
  if (fake)
    CHECK(early_id != late_id);
  if (early_id != late_id)
    CHECK_EQ_INT(atomic_load(&late_reused), 0);
  else
    printf("   (the driver kept the thread's per-thread stream into the later "
           "destructor, id %llu: reuse is allowed there)\n",
           early_id);
  atomic_store(&late_gate, 1);
  CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
  (void)pthread_key_delete(late_key);
  cross_stream_reuse(pool, 1);
  dlclose(libcuda);
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
  sym = dlsym(RTLD_DEFAULT, "cudart_stub_calls");
  memcpy(&stub_calls, &sym, sizeof sym);
  sym = dlsym(RTLD_DEFAULT, "cudart_stub_next");
  memcpy(&stub_next, &sym, sizeof sym);
  return preload_mode && preload_counter && preload_pool_stats;
}

/* The stand-in driver, which the runtime (stand-in or real) has opened by
 * now. */
static void load_driver_diagnostics(void) {
  void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  void *sym = libcuda ? dlsym(libcuda, "cuda_stub_calls") : NULL;
  memcpy(&driver_stub_calls, &sym, sizeof sym);
}

int main(int argc, char **argv) {
  const char *want = argc > 1 ? argv[1] : "host";
  /* For the launcher's test: what tidepool-run set, and an exit status of
   * the command's own. */
  if (strcmp(want, "env") == 0) {
    const char *preload = getenv("LD_PRELOAD");
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    printf("%s|%s", preload ? preload : "", conf ? conf : "unset");
    return 3;
  }
  expected_mode = strcmp(want, "off") == 0    ? MODE_OFF
                  : strcmp(want, "cuda") == 0 ? MODE_CUDA
                                              : MODE_HOST;
  if (!load_diagnostics()) {
    printf("FAIL: libtidepool_preload.so is not preloaded (LD_PRELOAD)\n");
    return 1;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    printf("SKIP: the runtime sees no CUDA device\n");
    return SKIP_EXIT;
  }
  load_driver_diagnostics();
  printf("test_preload: %s, runtime %s, %d device(s)\n", want,
         stub_calls ? "stand-in" : "real", devices);
  /* Nothing is decided before the first allocator call. */
  CHECK_EQ_INT(preload_mode(), MODE_UNDECIDED);
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
  RUN_TEST(test_cuda_free);
  RUN_TEST(test_event_order);
  RUN_TEST(test_event_synchronize);
  RUN_TEST(test_capture);
  RUN_TEST(test_synchronize_in_capture);
  RUN_TEST(test_capture_counted);
  RUN_TEST(test_ipc);
  RUN_TEST(test_devices);
  RUN_TEST(test_once);
  RUN_TEST(test_per_thread_after_thread_end);
  if (stub_calls) {
    RUN_TEST(test_foreign_pool_stub);
  } else {
    RUN_TEST(test_foreign_pool_driver);
    RUN_TEST(test_cuda_only);
  }
  printf("interposer: %llu allocations, %llu frees, %llu pool calls, %llu "
         "forwarded, %llu synchronizations, %llu event calls answered or "
         "seen\n",
         counter(C_MALLOC), counter(C_FREE), counter(C_POOL),
         counter(C_FORWARDED), counter(C_SYNC), counter(C_EVENT));
  return check_done();
}
