/* bench_alloc: the allocation benchmark. It times stream-ordered
 * malloc+free through a table of allocator backends and prints each figure
 * next to the H200 driver anchor recorded in docs/design.md, then side by side
 * with the other backends of the same run: the driver's allocators on the
 * cuda platform, glibc's malloc and free on the host platform.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "dl_table.h"
#include "tidepool.h"

/* ========================================================================
 * Anchors
 *
 * Figures of the CUDA driver's own pool (driver 580, NVIDIA H200), copied
 * from docs/design.md's "Measured anchors". They were measured on another
 * machine at another time: they give scale, they are not a side-by-side run.
 * ======================================================================== */

#define ANCHOR_PAIR_NS 1200.0 /* cudaMallocAsync+cudaFreeAsync, same stream */
#define ANCHOR_T1_MPAIRS 0.86 /* one thread, M pairs/s */
#define ANCHOR_TN_MPAIRS_LO 0.25 /* 2 to 16 threads, M pairs/s in total */
#define ANCHOR_TN_MPAIRS_HI 0.29

/* ========================================================================
 * Allocator backends
 *
 * Every measurement goes through this table, so that a side-by-side run
 * (cudaMallocAsync next to tidepool in one process) is one more entry, not a
 * rewrite. Streams are void pointers because each backend has its own stream
 * type; error codes are ints for the same reason, and 0 means success. The
 * indirect call costs the same few nanoseconds for every backend.
 * ======================================================================== */

typedef struct backend {
  const char *name;
  /* Readies the allocator (for tidepool: the current device's default pool
   * with release threshold UINT64_MAX, as the driver benchmark set it). */
  int (*prepare)(void);
  int (*stream_create)(void **stream);
  int (*stream_destroy)(void *stream);
  int (*stream_synchronize)(void *stream);
  int (*alloc)(void **ptr, size_t size, void *stream);
  int (*dealloc)(void *ptr, void *stream);
  const char *(*error_name)(int code);
} backend;

static int tp_prepare(void) {
  int device = 0;
  tp_error_t rc = tp_get_device(&device);
  if (rc != TP_SUCCESS)
    return (int)rc;
  tp_pool_t pool = NULL;
  rc = tp_device_get_default_mem_pool(&pool, device);
  if (rc != TP_SUCCESS)
    return (int)rc;
  uint64_t threshold = UINT64_MAX;
  rc = tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &threshold);
  if (rc != TP_SUCCESS)
    return (int)rc;
  /* The pool is the current one of the device, so tp_malloc_async uses it. */
  return (int)tp_device_set_mem_pool(device, pool);
}

static int tp_stream_create_(void **stream) {
  tp_stream_t s = NULL;
  tp_error_t rc = tp_stream_create(&s, TP_STREAM_NON_BLOCKING);
  *stream = s;
  return (int)rc;
}

static int tp_stream_destroy_(void *stream) {
  return (int)tp_stream_destroy((tp_stream_t)stream);
}

static int tp_stream_synchronize_(void *stream) {
  return (int)tp_stream_synchronize((tp_stream_t)stream);
}

static int tp_alloc_(void **ptr, size_t size, void *stream) {
  return (int)tp_malloc_async(ptr, size, (tp_stream_t)stream);
}

static int tp_dealloc_(void *ptr, void *stream) {
  return (int)tp_free_async(ptr, (tp_stream_t)stream);
}

static const char *tp_error_name_(int code) {
  return tp_error_name((tp_error_t)code);
}

/* ---- the CUDA driver's allocators, side by side on the cuda platform ----
 * Reached through dlopen, as tidepool itself reaches the driver, so that this
 * program builds without the toolkit. cuMemAllocAsync is the allocator
 * behind cudaMallocAsync (the device's default pool, release threshold
 * raised to the maximum as the anchors were measured); cuMemAlloc is the one
 * behind cudaMalloc. Streams are the driver's own, non-blocking. */
#define TP_LIKELY_(x) __builtin_expect(!!(x), 1)
typedef int cu_result;
typedef void *cu_stream;
typedef void *cu_pool;
typedef void *cu_ctx;
typedef unsigned long long cu_ptr;
static struct {
  cu_result (*init)(unsigned);
  cu_result (*primary_retain)(cu_ctx *, int);
  cu_result (*ctx_set)(cu_ctx);
  cu_result (*default_pool)(cu_pool *, int);
  cu_result (*pool_set)(cu_pool, int, void *);
  cu_result (*stream_create)(cu_stream *, unsigned);
  cu_result (*stream_destroy)(cu_stream);
  cu_result (*stream_sync)(cu_stream);
  cu_result (*alloc_async)(cu_ptr *, size_t, cu_stream);
  cu_result (*free_async)(cu_ptr, cu_stream);
  cu_result (*alloc)(cu_ptr *, size_t);
  cu_result (*free)(cu_ptr);
  cu_result (*error_name)(cu_result, const char **);
  cu_ctx ctx;
} cu;
static _Thread_local bool cu_thread_ready;

static bool cu_load(void) {
  const dl_sym syms[] = {{&cu.init, "cuInit"},
                         {&cu.primary_retain, "cuDevicePrimaryCtxRetain"},
                         {&cu.ctx_set, "cuCtxSetCurrent"},
                         {&cu.default_pool, "cuDeviceGetDefaultMemPool"},
                         {&cu.pool_set, "cuMemPoolSetAttribute"},
                         {&cu.stream_create, "cuStreamCreate"},
                         {&cu.stream_destroy, "cuStreamDestroy_v2"},
                         {&cu.stream_sync, "cuStreamSynchronize"},
                         {&cu.alloc_async, "cuMemAllocAsync"},
                         {&cu.free_async, "cuMemFreeAsync"},
                         {&cu.alloc, "cuMemAlloc_v2"},
                         {&cu.free, "cuMemFree_v2"},
                         {&cu.error_name, "cuGetErrorName"}};
  if (dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]))
    return false;
  return cu.init(0) == 0 && cu.primary_retain(&cu.ctx, 0) == 0;
}

/* Each thread works in device 0's primary context, as tidepool's do. */
static inline int cu_ready(void) {
  if (TP_LIKELY_(cu_thread_ready))
    return 0;
  cu_thread_ready = true;
  return cu.ctx_set(cu.ctx);
}

static int cu_prepare_async(void) {
  cu_pool pool;
  int rc = cu_ready();
  if (rc == 0)
    rc = cu.default_pool(&pool, 0);
  uint64_t threshold = UINT64_MAX;
  return rc ? rc : cu.pool_set(pool, 4 /* RELEASE_THRESHOLD */, &threshold);
}
static int cu_prepare_plain(void) {
  return cu_ready();
}
static int cu_stream_create_(void **stream) {
  int rc = cu_ready();
  return rc ? rc : cu.stream_create((cu_stream *)stream, 1 /* NON_BLOCKING */);
}
static int cu_stream_destroy_(void *stream) {
  return cu.stream_destroy(stream);
}
static int cu_stream_synchronize_(void *stream) {
  return cu.stream_sync(stream);
}
static int cu_alloc_async_(void **ptr, size_t size, void *stream) {
  cu_ptr p = 0;
  int rc = cu_ready();
  rc = rc ? rc : cu.alloc_async(&p, size, stream);
  *ptr = (void *)(uintptr_t)p;
  return rc;
}
static int cu_free_async_(void *ptr, void *stream) {
  return cu.free_async((cu_ptr)(uintptr_t)ptr, stream);
}
static int cu_alloc_(void **ptr, size_t size, void *stream) {
  (void)stream;
  cu_ptr p = 0;
  int rc = cu_ready();
  rc = rc ? rc : cu.alloc(&p, size);
  *ptr = (void *)(uintptr_t)p;
  return rc;
}
static int cu_free_(void *ptr, void *stream) {
  (void)stream;
  return cu.free((cu_ptr)(uintptr_t)ptr);
}
static const char *cu_error_name_(int code) {
  const char *name = "CUDA_ERROR_UNKNOWN";
  cu.error_name(code, &name);
  return name;
}

/* ---- the C library's malloc and free, side by side on the host platform
 * ----
 * What a host allocator costs on this machine: the yardstick for the cost of
 * tidepool's own bookkeeping, which is all a host-platform pair measures.
 * Streams mean nothing to it. */
static int libc_prepare(void) {
  return 0;
}
static int libc_stream_create(void **stream) {
  static char token;
  *stream = &token;
  return 0;
}
static int libc_stream_nop(void *stream) {
  (void)stream;
  return 0;
}
static int libc_alloc(void **ptr, size_t size, void *stream) {
  (void)stream;
  *ptr = malloc(size);
  return *ptr ? 0 : 1;
}
static int libc_dealloc(void *ptr, void *stream) {
  (void)stream;
  free(ptr);
  return 0;
}
static const char *libc_error_name(int code) {
  return code ? "out of memory" : "success";
}

static backend backends[4] = {
    {"tidepool", tp_prepare, tp_stream_create_, tp_stream_destroy_,
     tp_stream_synchronize_, tp_alloc_, tp_dealloc_, tp_error_name_},
};
static size_t N_BACKENDS = 1;
/* The index of tidepool on streams the driver made (as PyTorch's are), when
 * it runs: the driver's figures are compared with it as well. */
static size_t FOREIGN = 0;

static void add_libc_backend(void) {
  backends[N_BACKENDS++] = (backend){
      "glibc malloc+free", libc_prepare, libc_stream_create, libc_stream_nop,
      libc_stream_nop,     libc_alloc,   libc_dealloc,       libc_error_name};
}

/* On the cuda platform the driver's two allocators run in the same process,
 * after tidepool, for ratios measured side by side. */
static void add_driver_backends(bool with_plain) {
  if (!cu_load()) {
    printf("note: libcuda could not be loaded; no side-by-side figures\n");
    return;
  }
  /* tidepool's allocations on driver streams: streams tidepool did not
   * make, which it must recognise on every call. */
  FOREIGN = N_BACKENDS;
  backends[N_BACKENDS++] = (backend){"tidepool on driver streams",
                                     tp_prepare,
                                     cu_stream_create_,
                                     cu_stream_destroy_,
                                     tp_stream_synchronize_,
                                     tp_alloc_,
                                     tp_dealloc_,
                                     tp_error_name_};
  backends[N_BACKENDS++] = (backend){"driver cudaMallocAsync (cuMemAllocAsync)",
                                     cu_prepare_async,
                                     cu_stream_create_,
                                     cu_stream_destroy_,
                                     cu_stream_synchronize_,
                                     cu_alloc_async_,
                                     cu_free_async_,
                                     cu_error_name_};
  if (with_plain)
    backends[N_BACKENDS++] = (backend){"driver cudaMalloc (cuMemAlloc)",
                                       cu_prepare_plain,
                                       cu_stream_create_,
                                       cu_stream_destroy_,
                                       cu_stream_synchronize_,
                                       cu_alloc_,
                                       cu_free_,
                                       cu_error_name_};
}

/* A failed call ends the program: a benchmark that went on after an error
 * would print figures of something else. */
static void check(const backend *b, int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "bench_alloc: %s: %s failed: %s\n", b->name, what,
            b->error_name(rc));
    exit(EXIT_FAILURE);
  }
}

/* ========================================================================
 * Configuration and results
 * ======================================================================== */

#define MAX_THREAD_COUNTS 32
#define MAX_THREADS 1024

static const size_t pair_sizes[] = {256, 4096, 1u << 20, 64u << 20};
#define N_SIZES (sizeof pair_sizes / sizeof pair_sizes[0])

typedef struct config {
  int quick;
  int no_plain; /* leave out cudaMalloc on the cuda platform */
  const char *json_path;
  int thread_counts[MAX_THREAD_COUNTS];
  int n_thread_counts;
  int warmup_pairs;   /* untimed pairs before each measurement */
  int batch_pairs;    /* pairs in one timed batch */
  int min_batches;    /* at least this many batches... */
  int max_batches;    /* ...at most this many... */
  double min_seconds; /* ...and until this much time has gone */
  int bulk_count;     /* allocations held at once in the bulk test */
  int bulk_rounds;
  double thread_seconds; /* duration of each thread-count run */
} config;

typedef struct pair_result {
  size_t size;
  double ns; /* median ns per pair over the batches */
  int batches;
} pair_result;

typedef struct thread_result {
  int threads;
  double mpairs; /* M pairs/s, all threads together */
} thread_result;

typedef struct results {
  pair_result pairs[N_SIZES];
  double bulk_alloc_ns, bulk_free_ns;
  double two_streams_ns;
  int two_streams_batches;
  thread_result threads[MAX_THREAD_COUNTS];
} results;

/* ========================================================================
 * Timing helpers
 * ======================================================================== */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_seconds(double seconds) {
  struct timespec ts;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p) {
    fprintf(stderr, "bench_alloc: out of host memory\n");
    exit(EXIT_FAILURE);
  }
  return p;
}

/* One alloc+free pair on `stream`, the unit of most measurements. */
static inline void pair(const backend *b, void *stream, size_t size) {
  void *p = NULL;
  check(b, b->alloc(&p, size, stream), "malloc_async");
  check(b, b->dealloc(p, stream), "free_async");
}

/* Whether another timed batch is due after `n` since `start`: at least the
 * minimum count, at most the maximum, and until the minimum time is spent. */
static bool more_batches(const config *cfg, int n, uint64_t start) {
  return n < cfg->max_batches &&
         (n < cfg->min_batches ||
          (double)(now_ns() - start) < cfg->min_seconds * 1e9);
}

/* Runs timed batches of `batch_pairs` pairs of `size` bytes, each pair
 * spread round-robin over `streams`, and returns the median ns per pair.
 * Batches continue until both the minimum count and minimum time are met,
 * so fast and slow sizes get comparable confidence. */
static double time_batches(const backend *b, const config *cfg,
                           void *const *streams, int n_streams, size_t size,
                           int *batches_out) {
  for (int i = 0; i < cfg->warmup_pairs; i++)
    pair(b, streams[i % n_streams], size);
  double *per_pair = xcalloc((size_t)cfg->max_batches, sizeof *per_pair);
  uint64_t start = now_ns();
  int n = 0;
  while (more_batches(cfg, n, start)) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < cfg->batch_pairs; i++)
      pair(b, streams[i % n_streams], size);
    per_pair[n++] = (double)(now_ns() - t0) / cfg->batch_pairs;
  }
  double m = median(per_pair, n);
  free(per_pair);
  *batches_out = n;
  return m;
}

/* ========================================================================
 * Measurements
 * ======================================================================== */

static void bench_same_stream(const backend *b, const config *cfg, void *stream,
                              results *r) {
  for (size_t i = 0; i < N_SIZES; i++) {
    r->pairs[i].size = pair_sizes[i];
    r->pairs[i].ns =
        time_batches(b, cfg, &stream, 1, pair_sizes[i], &r->pairs[i].batches);
  }
  check(b, b->stream_synchronize(stream), "stream_synchronize");
}

/* bulk_count allocations of 256 bytes, then as many frees, timed apart: the
 * cost when the pool holds many live blocks at once. */
static void bench_bulk(const backend *b, const config *cfg, void *stream,
                       results *r) {
  void **ptrs = xcalloc((size_t)cfg->bulk_count, sizeof *ptrs);
  double *alloc_ns = xcalloc((size_t)cfg->bulk_rounds, sizeof *alloc_ns);
  double *free_ns = xcalloc((size_t)cfg->bulk_rounds, sizeof *free_ns);
  /* Round -1 warms the pool up to its high-water mark and is not kept. */
  for (int round = -1; round < cfg->bulk_rounds; round++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < cfg->bulk_count; i++)
      check(b, b->alloc(&ptrs[i], 256, stream), "malloc_async");
    uint64_t t1 = now_ns();
    for (int i = 0; i < cfg->bulk_count; i++)
      check(b, b->dealloc(ptrs[i], stream), "free_async");
    uint64_t t2 = now_ns();
    if (round >= 0) {
      alloc_ns[round] = (double)(t1 - t0) / cfg->bulk_count;
      free_ns[round] = (double)(t2 - t1) / cfg->bulk_count;
    }
  }
  check(b, b->stream_synchronize(stream), "stream_synchronize");
  r->bulk_alloc_ns = median(alloc_ns, cfg->bulk_rounds);
  r->bulk_free_ns = median(free_ns, cfg->bulk_rounds);
  free(free_ns);
  free(alloc_ns);
  free(ptrs);
}

/* Alloc and free on A, then on B, and so on: each stream's fast path
 * interleaved with the other's, 256-byte blocks. */
static void bench_two_streams(const backend *b, const config *cfg,
                              void *stream_a, void *stream_b, results *r) {
  void *streams[2] = {stream_a, stream_b};
  r->two_streams_ns =
      time_batches(b, cfg, streams, 2, 256, &r->two_streams_batches);
  check(b, b->stream_synchronize(stream_a), "stream_synchronize");
  check(b, b->stream_synchronize(stream_b), "stream_synchronize");
}

typedef struct worker {
  const backend *b;
  void *stream;
  int warmup_pairs;
  pthread_barrier_t *start;
  atomic_int *stop;
  uint64_t pairs; /* out */
  uint64_t ns;    /* out */
  pthread_t tid;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  /* Warm up before the barrier so that every thread starts the timed part
   * with its stream's blocks already in the pool. */
  for (int i = 0; i < w->warmup_pairs; i++)
    pair(w->b, w->stream, 256);
  pthread_barrier_wait(w->start);
  uint64_t t0 = now_ns(), n = 0;
  while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
    /* Checking the flag every 64 pairs keeps its cost out of the figure;
     * the run overshoots its duration by at most 64 pairs. */
    for (int i = 0; i < 64; i++)
      pair(w->b, w->stream, 256);
    n += 64;
  }
  w->ns = now_ns() - t0;
  w->pairs = n;
  return NULL;
}

/* `threads` threads, each on its own stream, run 256-byte pairs for a fixed
 * time; returns the aggregate in M pairs/s (the sum of each thread's rate). */
static double run_threads(const backend *b, const config *cfg, int threads) {
  worker *w = xcalloc((size_t)threads, sizeof *w);
  pthread_barrier_t start;
  atomic_int stop;
  atomic_init(&stop, 0);
  if (pthread_barrier_init(&start, NULL, (unsigned)threads + 1) != 0) {
    fprintf(stderr, "bench_alloc: pthread_barrier_init failed\n");
    exit(EXIT_FAILURE);
  }
  for (int i = 0; i < threads; i++) {
    w[i].b = b;
    w[i].warmup_pairs = cfg->warmup_pairs < 1000 ? cfg->warmup_pairs : 1000;
    w[i].start = &start;
    w[i].stop = &stop;
    check(b, b->stream_create(&w[i].stream), "stream_create");
    if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]) != 0) {
      fprintf(stderr, "bench_alloc: pthread_create failed\n");
      exit(EXIT_FAILURE);
    }
  }
  pthread_barrier_wait(&start);
  sleep_seconds(cfg->thread_seconds);
  atomic_store(&stop, 1);
  double rate = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(w[i].tid, NULL);
    if (w[i].ns > 0)
      rate += (double)w[i].pairs * 1e3 / (double)w[i].ns; /* M pairs/s */
    check(b, b->stream_synchronize(w[i].stream), "stream_synchronize");
    check(b, b->stream_destroy(w[i].stream), "stream_destroy");
  }
  pthread_barrier_destroy(&start);
  free(w);
  return rate;
}

/* ========================================================================
 * Output
 * ======================================================================== */

static void format_size(char *buf, size_t len, size_t size) {
  if (size >= (1u << 20) && size % (1u << 20) == 0)
    snprintf(buf, len, "%zu MiB", size >> 20);
  else if (size >= 1024 && size % 1024 == 0)
    snprintf(buf, len, "%zu KiB", size >> 10);
  else
    snprintf(buf, len, "%zu B", size);
}

static const thread_result *find_threads(const results *r, const config *cfg,
                                         int threads) {
  for (int i = 0; i < cfg->n_thread_counts; i++)
    if (r->threads[i].threads == threads)
      return &r->threads[i];
  return NULL;
}

static void anchor_rate(int threads, double *lo, double *hi) {
  if (threads == 1) {
    *lo = *hi = ANCHOR_T1_MPAIRS;
  } else if (threads >= 2 && threads <= 16) {
    *lo = ANCHOR_TN_MPAIRS_LO;
    *hi = ANCHOR_TN_MPAIRS_HI;
  } else {
    *lo = *hi = 0; /* the anchor covers 1 to 16 threads only */
  }
}

static void run_backend(const backend *b, const config *cfg, results *r) {
  check(b, b->prepare(), "prepare");
  void *a = NULL, *s = NULL;
  check(b, b->stream_create(&a), "stream_create");
  check(b, b->stream_create(&s), "stream_create");

  printf("\n== %s\n", b->name);
  printf("\nSame-stream malloc_async+free_async pair, median of batches of "
         "%d pairs\n",
         cfg->batch_pairs);
  printf("  %-8s %12s %9s   %-14s %s\n", "size", "ns/pair", "batches",
         "H200 anchor ns", "anchor/ours");
  bench_same_stream(b, cfg, a, r);
  for (size_t i = 0; i < N_SIZES; i++) {
    char sz[32];
    format_size(sz, sizeof sz, r->pairs[i].size);
    printf("  %-8s %12.1f %9d   %-14.0f %.1fx\n", sz, r->pairs[i].ns,
           r->pairs[i].batches, ANCHOR_PAIR_NS,
           ANCHOR_PAIR_NS / r->pairs[i].ns);
  }

  bench_bulk(b, cfg, a, r);
  printf("\n%d allocations of 256 B, then %d frees, median of %d rounds\n",
         cfg->bulk_count, cfg->bulk_count, cfg->bulk_rounds);
  printf("  %.1f ns per alloc, %.1f ns per free (no anchor)\n",
         r->bulk_alloc_ns, r->bulk_free_ns);

  bench_two_streams(b, cfg, a, s, r);
  printf("\nTwo streams alternating (alloc+free on A, then on B), 256 B\n");
  printf("  %.1f ns per pair, median of %d batches (no anchor: the driver "
         "anchor is same-stream)\n",
         r->two_streams_ns, r->two_streams_batches);

  check(b, b->stream_destroy(s), "stream_destroy");
  check(b, b->stream_destroy(a), "stream_destroy");

  printf("\nThreads, each on its own stream, 256 B pairs, %.2f s each\n",
         cfg->thread_seconds);
  printf("  %-7s %14s %9s   %-18s %s\n", "threads", "M pairs/s", "scaling",
         "H200 anchor M/s", "ours/anchor");
  for (int i = 0; i < cfg->n_thread_counts; i++) {
    r->threads[i].threads = cfg->thread_counts[i];
    r->threads[i].mpairs = run_threads(b, cfg, cfg->thread_counts[i]);
  }
  const thread_result *one = find_threads(r, cfg, 1);
  for (int i = 0; i < cfg->n_thread_counts; i++) {
    const thread_result *t = &r->threads[i];
    char scaling[32], anchor[32], ratio[48];
    if (one && one->mpairs > 0)
      snprintf(scaling, sizeof scaling, "%.2fx", t->mpairs / one->mpairs);
    else
      snprintf(scaling, sizeof scaling, "n/a");
    double lo, hi;
    anchor_rate(t->threads, &lo, &hi);
    if (lo == 0) {
      snprintf(anchor, sizeof anchor, "n/a");
      snprintf(ratio, sizeof ratio, "n/a");
    } else if (lo == hi) {
      snprintf(anchor, sizeof anchor, "%.2f", lo);
      snprintf(ratio, sizeof ratio, "%.1fx", t->mpairs / lo);
    } else {
      snprintf(anchor, sizeof anchor, "%.2f-%.2f", lo, hi);
      snprintf(ratio, sizeof ratio, "%.1fx-%.1fx", t->mpairs / hi,
               t->mpairs / lo);
    }
    printf("  %-7d %14.3f %9s   %-18s %s\n", t->threads, t->mpairs, scaling,
           anchor, ratio);
  }
}

/* The same-stream pair of tidepool and of another backend in alternating
 * batches, each on a stream of its own, the order swapped every round: the
 * median of the rounds' ratios (other / ours). Both meet the same machine,
 * where the medians above come from runs seconds apart, between which a
 * VM's speed can drift by half. */
static double alternating_ratio(const backend *ours, const backend *other,
                                const config *cfg, size_t size, int *rounds) {
  const backend *b[2] = {ours, other};
  void *st[2] = {NULL, NULL};
  /* run_backend prepared both already. */
  for (int j = 0; j < 2; j++) {
    check(b[j], b[j]->stream_create(&st[j]), "stream_create");
    for (int i = 0; i < cfg->warmup_pairs; i++)
      pair(b[j], st[j], size);
  }
  double *ratio = xcalloc((size_t)cfg->max_batches, sizeof *ratio);
  uint64_t start = now_ns();
  int n = 0;
  while (more_batches(cfg, n, start)) {
    double ns[2];
    for (int k = 0; k < 2; k++) {
      int j = (n + k) % 2;
      uint64_t t0 = now_ns();
      for (int i = 0; i < cfg->batch_pairs; i++)
        pair(b[j], st[j], size);
      ns[j] = (double)(now_ns() - t0);
    }
    ratio[n++] = ns[1] / ns[0];
  }
  double m = median(ratio, n);
  free(ratio);
  for (int j = 0; j < 2; j++) {
    check(b[j], b[j]->stream_synchronize(st[j]), "stream_synchronize");
    check(b[j], b[j]->stream_destroy(st[j]), "stream_destroy");
  }
  *rounds = n;
  return m;
}

/* tidepool against another backend of the same run: their ratio, above 1
 * when tidepool is faster. */
static void print_side_by_side(const config *cfg, const backend *other,
                               const backend *ours, const results *tp,
                               const results *o) {
  printf("\n== side by side in this run: %s / %s (above 1: tidepool "
         "faster)\n",
         other->name, ours->name);
  for (size_t i = 0; i < N_SIZES; i++) {
    char sz[32];
    format_size(sz, sizeof sz, tp->pairs[i].size);
    printf("  same-stream pair %-8s %10.1f ns vs %10.1f ns   %8.1fx\n", sz,
           o->pairs[i].ns, tp->pairs[i].ns, o->pairs[i].ns / tp->pairs[i].ns);
  }
  for (size_t i = 0; i < N_SIZES; i++) {
    char sz[32];
    int rounds = 0;
    format_size(sz, sizeof sz, pair_sizes[i]);
    double ratio = alternating_ratio(ours, other, cfg, pair_sizes[i], &rounds);
    printf("  same-stream pair %-8s in alternating batches, median of %d "
           "rounds: %.2fx\n",
           sz, rounds, ratio);
  }
  printf("  10k allocs, per alloc   %10.1f ns vs %10.1f ns   %8.1fx\n",
         o->bulk_alloc_ns, tp->bulk_alloc_ns,
         o->bulk_alloc_ns / tp->bulk_alloc_ns);
  printf("  10k frees, per free     %10.1f ns vs %10.1f ns   %8.1fx\n",
         o->bulk_free_ns, tp->bulk_free_ns, o->bulk_free_ns / tp->bulk_free_ns);
  printf("  two streams alternating %10.1f ns vs %10.1f ns   %8.1fx\n",
         o->two_streams_ns, tp->two_streams_ns,
         o->two_streams_ns / tp->two_streams_ns);
  for (int i = 0; i < cfg->n_thread_counts; i++)
    printf("  %2d threads, M pairs/s  %10.3f    vs %10.3f      %8.1fx\n",
           tp->threads[i].threads, o->threads[i].mpairs, tp->threads[i].mpairs,
           tp->threads[i].mpairs / o->threads[i].mpairs);
}

static void write_json(const char *path, const config *cfg,
                       const char *platform, const results *all) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "bench_alloc: cannot write %s: %s\n", path,
            strerror(errno));
    exit(EXIT_FAILURE);
  }
  fprintf(f, "{\n  \"benchmark\": \"bench_alloc\",\n");
  fprintf(f, "  \"platform\": \"%s\",\n  \"quick\": %s,\n", platform,
          cfg->quick ? "true" : "false");
  fprintf(f,
          "  \"anchor\": {\"source\": \"docs/design.md: CUDA driver 580 on an "
          "NVIDIA H200, measured separately, not a side-by-side run\", "
          "\"same_stream_pair_ns\": %.0f, \"threads_1_mpairs_per_s\": %.2f, "
          "\"threads_2_to_16_mpairs_per_s\": [%.2f, %.2f]},\n",
          ANCHOR_PAIR_NS, ANCHOR_T1_MPAIRS, ANCHOR_TN_MPAIRS_LO,
          ANCHOR_TN_MPAIRS_HI);
  fprintf(f, "  \"backends\": [\n");
  for (size_t k = 0; k < N_BACKENDS; k++) {
    const results *r = &all[k];
    fprintf(f, "    {\n      \"name\": \"%s\",\n", backends[k].name);
    fprintf(f, "      \"same_stream_pair\": [\n");
    for (size_t i = 0; i < N_SIZES; i++)
      fprintf(f,
              "        {\"size\": %zu, \"ns_per_pair\": %.2f, \"batches\": %d, "
              "\"batch_pairs\": %d, \"anchor_over_ours\": %.3f}%s\n",
              r->pairs[i].size, r->pairs[i].ns, r->pairs[i].batches,
              cfg->batch_pairs, ANCHOR_PAIR_NS / r->pairs[i].ns,
              i + 1 < N_SIZES ? "," : "");
    fprintf(f, "      ],\n");
    fprintf(f,
            "      \"bulk\": {\"count\": %d, \"size\": 256, \"rounds\": %d, "
            "\"ns_per_alloc\": %.2f, \"ns_per_free\": %.2f},\n",
            cfg->bulk_count, cfg->bulk_rounds, r->bulk_alloc_ns,
            r->bulk_free_ns);
    fprintf(f,
            "      \"two_streams_alternating\": {\"size\": 256, "
            "\"ns_per_pair\": %.2f, \"batches\": %d},\n",
            r->two_streams_ns, r->two_streams_batches);
    fprintf(f, "      \"threads\": [\n");
    const thread_result *one = find_threads(r, cfg, 1);
    for (int i = 0; i < cfg->n_thread_counts; i++) {
      const thread_result *t = &r->threads[i];
      double lo, hi;
      anchor_rate(t->threads, &lo, &hi);
      fprintf(f, "        {\"threads\": %d, \"mpairs_per_s\": %.4f, ",
              t->threads, t->mpairs);
      if (one && one->mpairs > 0)
        fprintf(f, "\"scaling_vs_1\": %.3f, ", t->mpairs / one->mpairs);
      else
        fprintf(f, "\"scaling_vs_1\": null, ");
      if (lo > 0)
        fprintf(f, "\"anchor_mpairs_per_s\": [%.2f, %.2f]}", lo, hi);
      else
        fprintf(f, "\"anchor_mpairs_per_s\": null}");
      fprintf(f, "%s\n", i + 1 < cfg->n_thread_counts ? "," : "");
    }
    fprintf(f, "      ]\n    }%s\n", k + 1 < N_BACKENDS ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "bench_alloc: cannot write %s: %s\n", path,
            strerror(errno));
    exit(EXIT_FAILURE);
  }
}

/* ========================================================================
 * Command line
 * ======================================================================== */

static void usage(FILE *out) {
  fprintf(out,
          "usage: bench_alloc [--quick] [--json FILE] [--threads LIST]\n"
          "  --quick         short runs (a smoke test; figures are rough)\n"
          "  --no-cudamalloc on cuda, leave cudaMalloc out of the side by "
          "side\n"
          "  --json FILE     also write every figure to FILE as one JSON "
          "object\n"
          "  --threads LIST  thread counts, comma-separated (default "
          "1,2,4,8,16)\n");
}

static int parse_threads(config *cfg, const char *list) {
  cfg->n_thread_counts = 0;
  const char *p = list;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno != 0 || v < 1 || v > MAX_THREADS ||
        (*end != ',' && *end != '\0') ||
        cfg->n_thread_counts == MAX_THREAD_COUNTS)
      return -1;
    cfg->thread_counts[cfg->n_thread_counts++] = (int)v;
    p = *end == ',' ? end + 1 : end;
  }
  return cfg->n_thread_counts > 0 ? 0 : -1;
}

static void parse_args(config *cfg, int argc, char **argv) {
  static const int default_threads[] = {1, 2, 4, 8, 16};
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < sizeof default_threads / sizeof *default_threads; i++)
    cfg->thread_counts[cfg->n_thread_counts++] = default_threads[i];
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      cfg->quick = 1;
    } else if (strcmp(argv[i], "--no-cudamalloc") == 0) {
      cfg->no_plain = 1;
    } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      cfg->json_path = argv[++i];
    } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      if (parse_threads(cfg, argv[++i]) != 0) {
        fprintf(stderr, "bench_alloc: bad --threads list '%s'\n", argv[i]);
        exit(2);
      }
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      exit(0);
    } else {
      usage(stderr);
      exit(2);
    }
  }
  cfg->batch_pairs = 1000;
  if (cfg->quick) {
    cfg->warmup_pairs = 1000;
    cfg->min_batches = 5;
    cfg->max_batches = 50;
    cfg->min_seconds = 0.01;
    cfg->bulk_count = 10000;
    cfg->bulk_rounds = 3;
    cfg->thread_seconds = 0.05;
  } else {
    cfg->warmup_pairs = 10000;
    cfg->min_batches = 31;
    cfg->max_batches = 2000;
    cfg->min_seconds = 0.3;
    cfg->bulk_count = 10000;
    cfg->bulk_rounds = 11;
    cfg->thread_seconds = 0.5;
  }
}

int main(int argc, char **argv) {
  config cfg;
  parse_args(&cfg, argc, argv);

  const char *platform = tp_platform_name();
  if (!platform) {
    fprintf(stderr, "bench_alloc: tidepool could not start a platform\n");
    return EXIT_FAILURE;
  }
  int devices = 0;
  tp_error_t rc = tp_get_device_count(&devices);
  if (rc != TP_SUCCESS) {
    fprintf(stderr, "bench_alloc: tp_get_device_count failed: %s\n",
            tp_error_name(rc));
    return EXIT_FAILURE;
  }

  printf("bench_alloc: platform %s, %d device(s), device 0's default pool, "
         "release threshold UINT64_MAX%s\n",
         platform, devices, cfg.quick ? ", --quick (rough figures)" : "");
  printf("H200 anchor columns: the CUDA driver's own pool (driver 580) on an "
         "NVIDIA H200, from docs/design.md,\n"
         "  measured separately, NOT in this run: cudaMallocAsync+"
         "cudaFreeAsync on one stream %.1f us a pair;\n"
         "  1 thread %.2f M pairs/s, 2 to 16 threads on their own streams "
         "%.2f-%.2f M pairs/s in total.\n"
         "  Ratios above 1 (anchor/ours for times, ours/anchor for rates) "
         "mean faster than the anchor.\n",
         ANCHOR_PAIR_NS / 1000, ANCHOR_T1_MPAIRS, ANCHOR_TN_MPAIRS_LO,
         ANCHOR_TN_MPAIRS_HI);

  if (strcmp(platform, "cuda") == 0)
    add_driver_backends(!cfg.no_plain);
  else if (strcmp(platform, "host") == 0)
    add_libc_backend();
  results all[4];
  memset(all, 0, sizeof all);
  for (size_t k = 0; k < N_BACKENDS; k++)
    run_backend(&backends[k], &cfg, &all[k]);

  for (size_t k = 1; k < N_BACKENDS; k++)
    if (k != FOREIGN)
      print_side_by_side(&cfg, &backends[k], &backends[0], &all[0], &all[k]);
  for (size_t k = FOREIGN + 1; FOREIGN && k < N_BACKENDS; k++)
    print_side_by_side(&cfg, &backends[k], &backends[FOREIGN], &all[FOREIGN],
                       &all[k]);
  if (cfg.json_path) {
    write_json(cfg.json_path, &cfg, platform, all);
    printf("\nwrote %s\n", cfg.json_path);
  }
  /* Figures that could not be written (a full disk, a closed pipe) make a
   * failed run, not a silent one. */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "bench_alloc: writing the output failed\n");
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
