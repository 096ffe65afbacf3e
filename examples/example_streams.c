/* example_streams: a guided tour of tidepool's stream-ordered allocator on
 * whatever platform the process gets (the host platform needs no GPU). It
 * shows pools, same-stream and cross-stream reuse, statistics, the release
 * threshold, a pool's size limit and trimming, one printed line per step. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tidepool.h"

/* A gate that holds a stream's worker: work queued behind it (and frees
 * behind that) stays pending until the main thread opens it. This is how the
 * tour makes "a free that has not completed yet" visible. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate;

static gate held = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void gate_wait(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Stops the tour. The gate is opened first so that a stream worker still
 * held there cannot keep the process from exiting. */
static _Noreturn void die(const char *what, const char *why) {
  fprintf(stderr, "example_streams: %s%s\n", what, why);
  gate_open(&held);
  exit(EXIT_FAILURE);
}

/* Every call is checked: on failure, say which call and why, and stop. */
#define CHECK(call)                                                            \
  do {                                                                         \
    tp_error_t rc_ = (call);                                                   \
    if (rc_ != TP_SUCCESS)                                                     \
      die(#call " failed: ", tp_error_name(rc_));                              \
  } while (0)

/* A broken promise of the API (as opposed to a failed call) also stops the
 * tour, so that CI, which runs this program, notices it. */
static void expect(int ok, const char *what) {
  if (!ok)
    die("unexpected: ", what);
}

static const char *bytes(char *buf, size_t len, uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 18) == 0)
    snprintf(buf, len, "%.4g MiB", (double)n / (1u << 20));
  else if (n >= 1024 && n % 256 == 0)
    snprintf(buf, len, "%.4g KiB", (double)n / 1024);
  else
    snprintf(buf, len, "%llu B", (unsigned long long)n);
  return buf;
}

static uint64_t attr64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = 0;
  CHECK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static int step_no;

/* Prints one step of the tour followed by the pool's statistics. */
static void step(tp_pool_t pool, const char *what) {
  char rc[32], rh[32], uc[32], uh[32];
  printf("%2d. %-58s reserved %s (high %s), used %s (high %s)\n", ++step_no,
         what,
         bytes(rc, sizeof rc, attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT)),
         bytes(rh, sizeof rh, attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH)),
         bytes(uc, sizeof uc, attr64(pool, TP_POOL_ATTR_USED_MEM_CURRENT)),
         bytes(uh, sizeof uh, attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH)));
}

int main(void) {
  char line[160], b1[32], b2[32];
  const char *platform = tp_platform_name();
  if (!platform) {
    fprintf(stderr, "example_streams: tidepool could not start a platform\n");
    return EXIT_FAILURE;
  }
  int devices = 0;
  CHECK(tp_get_device_count(&devices));
  printf("tidepool example on the %s platform, %d device(s); using device 0\n",
         platform, devices);
  CHECK(tp_set_device(0));

  /* An explicit pool on device 0, made current so that plain
   * tp_malloc_async draws from it. Opportunistic reuse and internal
   * dependencies are turned off so that the only way for one stream to reuse
   * another's free is an event dependency the program created: the tour can
   * then show that rule on its own. The release threshold keeps one chunk. */
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location.type = TP_LOCATION_DEVICE;
  props.location.id = 0;
  tp_pool_t pool = NULL, default_pool = NULL;
  CHECK(tp_pool_create(&pool, &props));
  CHECK(tp_device_get_default_mem_pool(&default_pool, 0));
  CHECK(tp_device_set_mem_pool(0, pool));
  int off = 0;
  CHECK(tp_pool_set_attribute(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                              &off));
  CHECK(tp_pool_set_attribute(
      pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
  /* One allocation of exactly one chunk fills a chunk, which keeps the
   * figures easy to follow. */
  const uint64_t chunk = attr64(pool, TP_POOL_ATTR_CHUNK_SIZE);
  const size_t size = (size_t)chunk;
  uint64_t threshold = chunk;
  CHECK(
      tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &threshold));
  snprintf(line, sizeof line, "created a pool (chunk %s, release threshold %s)",
           bytes(b1, sizeof b1, chunk), bytes(b2, sizeof b2, threshold));
  step(pool, line);

  tp_stream_t a = NULL, b = NULL;
  CHECK(tp_stream_create(&a, TP_STREAM_NON_BLOCKING));
  CHECK(tp_stream_create(&b, TP_STREAM_NON_BLOCKING));
  tp_event_t freed_on_a = NULL;
  CHECK(tp_event_create(&freed_on_a));
  step(pool, "created streams A and B and an event");

  /* Same-stream reuse: stream order alone makes it safe. */
  void *p1 = NULL, *p2 = NULL;
  CHECK(tp_malloc_async(&p1, size, a));
  CHECK(tp_memset_async(p1, 0, size, a));
  snprintf(line, sizeof line, "A: malloc %s -> %p, memset",
           bytes(b1, sizeof b1, size), p1);
  step(pool, line);
  CHECK(tp_free_async(p1, a));
  step(pool, "A: free it (used drops at once, reserved stays)");
  CHECK(tp_malloc_async(&p2, size, a));
  snprintf(line, sizeof line, "A: malloc again -> %p: %s", p2,
           p2 == p1 ? "the same block" : "another block");
  step(pool, line);

  /* Hold A behind a gate, then queue work on the block and free it: the free
   * is pending, and B may not take the block without a dependency. */
  CHECK(tp_launch_host_func(a, gate_wait, &held));
  CHECK(tp_memset_async(p2, 1, size, a));
  CHECK(tp_free_async(p2, a));
  step(pool, "A: hold A at a gate, memset the block, free it");
  void *q = NULL;
  CHECK(tp_malloc_async(&q, size, b));
  snprintf(line, sizeof line, "B: malloc -> %p: %s", q,
           q == p2 ? "A's block!" : "new (A's free is pending)");
  step(pool, line);
  expect(q != p2, "stream B reused a block whose free on stream A is still "
                  "pending, with no dependency between them");

  /* After B waits on an event recorded behind the free, everything B does
   * next is ordered after A's use of the block, so B may have it although
   * A's work has still not run. */
  CHECK(tp_event_record(freed_on_a, a));
  CHECK(tp_stream_wait_event(b, freed_on_a, 0));
  void *r = NULL;
  CHECK(tp_malloc_async(&r, size, b));
  snprintf(line, sizeof line, "B waits on A's event; malloc -> %p: %s", r,
           r == p2 ? "A's block" : "another block");
  step(pool, line);
  if (r != p2)
    printf("    note: the pool may reuse A's block here but did not\n");
  CHECK(tp_memset_async(r, 2, size, b));

  gate_open(&held);
  CHECK(tp_free_async(q, b));
  CHECK(tp_free_async(r, b));
  step(pool, "open the gate; B: free both blocks");

  /* Synchronize: completed frees become free memory, and the pool gives back
   * what it holds above the release threshold. */
  CHECK(tp_device_synchronize());
  uint64_t reserved = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  snprintf(line, sizeof line, "device synchronize: reserved falls to <= %s",
           bytes(b1, sizeof b1, threshold));
  step(pool, line);
  expect(reserved <= threshold,
         "reserved memory above the release threshold after synchronize");

  uint64_t zero = 0;
  CHECK(tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero));
  CHECK(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero));
  step(pool, "reset both high watermarks (to the current values)");

  /* With an unlimited threshold the pool keeps what it mapped; trimming is
   * then how a program gives memory back. */
  threshold = UINT64_MAX;
  CHECK(
      tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &threshold));
  void *big = NULL;
  CHECK(tp_malloc_async(&big, 3 * size, a));
  CHECK(tp_free_async(big, a));
  CHECK(tp_stream_synchronize(a));
  snprintf(line, sizeof line, "threshold UINT64_MAX; malloc+free %s on A, sync",
           bytes(b1, sizeof b1, 3 * size));
  step(pool, line);
  expect(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) >= 3 * chunk,
         "the pool released memory below an unlimited release threshold");
  CHECK(tp_pool_trim_to(pool, size));
  snprintf(line, sizeof line, "trim to %s", bytes(b1, sizeof b1, size));
  step(pool, line);
  expect(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) <= size,
         "trim kept more than asked while nothing was in use");
  CHECK(tp_pool_trim_to(pool, 0));
  step(pool, "trim to 0");
  expect(attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) == 0,
         "trim to 0 kept memory while nothing was in use");

  /* A pool with a size limit: tp_malloc_from_pool_async answers
   * out-of-memory rather than growing past max_size. */
  tp_pool_props_t small_props = props;
  small_props.max_size = (size_t)(4 * chunk);
  tp_pool_t small = NULL;
  CHECK(tp_pool_create(&small, &small_props));
  snprintf(line, sizeof line, "created a second pool, max_size %s",
           bytes(b1, sizeof b1, small_props.max_size));
  step(small, line);
  void *s1 = NULL, *s2 = NULL;
  CHECK(tp_malloc_from_pool_async(&s1, 3 * size, small, a));
  snprintf(line, sizeof line, "A: malloc %s from it",
           bytes(b1, sizeof b1, 3 * size));
  step(small, line);
  tp_error_t oom = tp_malloc_from_pool_async(&s2, 2 * size, small, a);
  snprintf(line, sizeof line, "A: malloc %s more -> %s",
           bytes(b1, sizeof b1, 2 * size), tp_error_name(oom));
  step(small, line);
  expect(oom == TP_ERROR_OUT_OF_MEMORY,
         "a pool grew past its max_size (or failed otherwise)");
  CHECK(tp_free_async(s1, a));
  CHECK(tp_malloc_from_pool_async(&s2, 2 * size, small, a));
  snprintf(line, sizeof line, "A: free the first; malloc %s now succeeds",
           bytes(b1, sizeof b1, 2 * size));
  step(small, line);
  CHECK(tp_free_async(s2, a));
  CHECK(tp_stream_synchronize(a));
  step(small, "A: free, synchronize (threshold 0: all released)");
  expect(attr64(small, TP_POOL_ATTR_RESERVED_MEM_CURRENT) == 0,
         "memory above a release threshold of 0 survived a synchronize");

  /* Tidy up: the default pool becomes current again, then everything goes. */
  CHECK(tp_device_set_mem_pool(0, default_pool));
  CHECK(tp_pool_destroy(small));
  CHECK(tp_pool_destroy(pool));
  CHECK(tp_event_destroy(freed_on_a));
  CHECK(tp_stream_destroy(b));
  CHECK(tp_stream_destroy(a));
  printf("done: every call succeeded\n");
  return EXIT_SUCCESS;
}
