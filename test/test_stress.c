/* test_stress: many threads allocating, filling, checking and freeing in
 * stream order at once, across two pools, with cross-stream frees, policy
 * toggles, trims and out-of-memory, to prove that no two live blocks overlap
 * and that every pool ends empty. Seeded: the seed is printed for reruns. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pool/pool.h"
#include "pool/pool_verify.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define DEFAULT_SEED UINT64_C(0x7469646570303031)
#define MAX_THREADS 64
#define MAX_SLOTS 64
/* Blocks up to this size are checked whole; larger ones at their first,
 * middle and last SAMPLE bytes, which keeps big blocks affordable. */
#define FULL_CHECK_MAX (64 * KiB)
#define SAMPLE (4 * KiB)
/* Mismatch details printed at most this many times; all are counted. */
#define MAX_MISMATCH_REPORTS 20

/* What one phase runs. */
typedef struct phase_cfg {
  const char *name;
  int threads;
  int ops;   /* per thread */
  int slots; /* live blocks a thread holds at most */
  /* Percentages of allocations: medium (64 KiB..8 MiB) and huge (32 MiB);
   * the rest are small (1 B..64 KiB). */
  unsigned pct_medium, pct_huge;
  /* Percentage of allocations that go to the default pool (0 in a phase
   * that uses only the created pool). */
  unsigned pct_default;
  /* The default pool's live bytes per thread stay below this, so that the
   * default pool never runs out for want of memory: there, out-of-memory is
   * a bug. */
  size_t default_cap;
  size_t created_max;  /* max_size of the created pool */
  int verify_every;    /* thread 0 verifies the created pool this often */
  int toggle_oom_wait; /* thread 0 also toggles TP_POOL_ATTR_OOM_WAIT */
} phase_cfg;

/* A live block as the test sees it: between the return of its malloc and
 * the call of its free. */
typedef struct block {
  unsigned char *ptr;
  size_t size;
  unsigned char tag;
  int stream; /* index of the stream that allocated and filled it */
  int from_default;
  unsigned seq; /* the allocation's number in the phase, for reports */
} block;

/* ========================================================================
 * State shared by the threads of a phase
 * ======================================================================== */

static int on_host;
static tp_pool_t default_pool;
static tp_pool_t created_pool;

/* Outcomes, counted over all threads of a phase. */
static atomic_long n_allocs, n_frees, n_cross_frees, n_checks, n_mismatches;
static atomic_long n_oom_created, n_oom_default, n_syncs, n_trims, n_toggles,
    n_verifies;
static atomic_uint alloc_seq;

/* Every live block of every thread, indexed by thread and slot, so that an
 * allocation can be compared against all others. Two blocks live in this
 * table at once are live at once in any stream order, so their ranges must
 * be disjoint: this catches overlaps that byte checks of sampled big blocks
 * could miss. */
typedef struct range {
  uintptr_t lo, hi; /* [lo, hi); lo == hi: empty */
} range;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static range live[MAX_THREADS * MAX_SLOTS];
static int live_n; /* entries in use: threads times slots */

/* Who was last given each tag: when a block holds a foreign tag, this names
 * the block whose work most likely wrote it, which is what a report of
 * corruption needs to be acted on. */
typedef struct tag_owner {
  uintptr_t lo, hi;
  int thread, stream, from_default;
  unsigned seq;
} tag_owner;
static tag_owner tag_owners[256];

/* Enters a block into the table; fails the test when it overlaps another. */
static void live_add(int index, const void *ptr, size_t size, unsigned seq,
                     unsigned char tag, int stream, int from_default) {
  uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < live_n; i++) {
    if (live[i].lo < hi && lo < live[i].hi)
      CHECK_FAIL("block [%#" PRIxPTR ", %#" PRIxPTR ") overlaps live block "
                 "[%#" PRIxPTR ", %#" PRIxPTR ") of thread %d",
                 lo, hi, live[i].lo, live[i].hi, i / MAX_SLOTS);
  }
  live[index] = (range){lo, hi};
  tag_owners[tag] =
      (tag_owner){lo, hi, index / MAX_SLOTS, stream, from_default, seq};
  pthread_mutex_unlock(&live_lock);
}

static void live_remove(int index) {
  pthread_mutex_lock(&live_lock);
  live[index] = (range){0, 0};
  pthread_mutex_unlock(&live_lock);
}

/* ========================================================================
 * Checking a block's bytes
 * ======================================================================== */

/* The pieces of a block that are checked: all of a small block, the first,
 * middle and last SAMPLE bytes of a large one. Returns how many. */
static int check_regions(size_t size, size_t off[3], size_t len[3]) {
  if (size <= FULL_CHECK_MAX) {
    off[0] = 0;
    len[0] = size;
    return 1;
  }
  off[0] = 0;
  off[1] = size / 2 - SAMPLE / 2;
  off[2] = size - SAMPLE;
  len[0] = len[1] = len[2] = SAMPLE;
  return 3;
}

/* What a check needs to know of its block, and to say about it. */
typedef struct check_job {
  const unsigned char *ptr;
  size_t size;
  unsigned char tag;
  int thread, stream, from_default;
  unsigned seq;
} check_job;

static const char *pool_name(int from_default) {
  return from_default ? "default" : "created";
}

/* Compares `n` bytes against the tag; reports the first wrong byte. */
static void compare_bytes(const unsigned char *got, size_t n,
                          const check_job *b, size_t block_off) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] == b->tag)
      continue;
    long count = atomic_fetch_add(&n_mismatches, 1) + 1;
    /* Past the first few, mismatches are only counted: the phase fails
     * on the count anyway, and a flood of lines would bury the first. */
    if (count > MAX_MISMATCH_REPORTS)
      return;
    pthread_mutex_lock(&live_lock);
    tag_owner o = tag_owners[got[i]];
    pthread_mutex_unlock(&live_lock);
    CHECK_FAIL("allocation %u, %p (%zu bytes, %s pool, thread %d stream "
               "%d): byte %zu is 0x%02x, expected tag 0x%02x; tag 0x%02x was "
               "last given to allocation %u, [%#" PRIxPTR ", %#" PRIxPTR
               ") (%s pool, thread %d stream %d)",
               b->seq, (const void *)b->ptr, b->size,
               pool_name(b->from_default), b->thread, b->stream, block_off + i,
               got[i], b->tag, got[i], o.seq, o.lo, o.hi,
               pool_name(o.from_default), o.thread, o.stream);
    return;
  }
}

/* Runs on the stream's worker, in stream order between the block's memset
 * and its free: on the host platform, device memory is host memory. */
static void check_job_fn(void *arg) {
  check_job *job = arg;
  size_t off[3], len[3];
  int n = check_regions(job->size, off, len);
  for (int i = 0; i < n; i++)
    compare_bytes(job->ptr + off[i], len[i], job, off[i]);
  atomic_fetch_add(&n_checks, 1);
  free(job);
}

/* ========================================================================
 * One thread's work
 * ======================================================================== */

typedef struct worker {
  int index;
  const phase_cfg *cfg;
  check_rng rng;
  tp_stream_t streams[2];
  tp_event_t event;
  block slots[MAX_SLOTS];
  size_t default_live; /* bytes this thread holds in the default pool */
  /* Where blocks are copied back for checking off the host platform. */
  unsigned char
      host_buf[FULL_CHECK_MAX > 3 * SAMPLE ? FULL_CHECK_MAX : 3 * SAMPLE];
  char label[64];
} worker;

static size_t pick_size(worker *w) {
  unsigned r = (unsigned)rng_below(&w->rng, 100);
  if (r < w->cfg->pct_huge)
    return 32 * MiB;
  if (r < w->cfg->pct_huge + w->cfg->pct_medium)
    return (size_t)rng_range(&w->rng, 64 * KiB, 8 * MiB);
  return (size_t)rng_range(&w->rng, 1, 64 * KiB);
}

/* Queues (host) or performs (elsewhere) the check of a block's bytes on the
 * stream that filled it, ordered before the block's free. */
static void check_block(worker *w, const block *b) {
  tp_stream_t s = w->streams[b->stream];
  check_job what = {b->ptr,    b->size,         b->tag, w->index,
                    b->stream, b->from_default, b->seq};
  if (on_host) {
    check_job *job = malloc(sizeof *job);
    REQUIRE(job != NULL);
    *job = what;
    if (!CHECK_OK(tp_launch_host_func(s, check_job_fn, job)))
      free(job);
    return;
  }
  /* Off the host platform the bytes are copied back; the synchronize this
   * needs makes the thread slower but the check is the same. */
  size_t off[3], len[3], at = 0;
  int n = check_regions(b->size, off, len);
  for (int i = 0; i < n; i++) {
    CHECK_OK(tp_memcpy_async(w->host_buf + at, b->ptr + off[i], len[i], s));
    at += len[i];
  }
  if (!CHECK_OK(tp_stream_synchronize(s)))
    return;
  at = 0;
  for (int i = 0; i < n; i++) {
    compare_bytes(w->host_buf + at, len[i], &what, off[i]);
    at += len[i];
  }
  atomic_fetch_add(&n_checks, 1);
}

/* Checks and frees the block in `slot`: on its own stream, or on the other
 * one after that stream waits for an event recorded behind the check. */
static void free_slot(worker *w, int slot) {
  block *b = &w->slots[slot];
  if (!b->ptr)
    return;
  check_block(w, b);
  int on = b->stream;
  if (rng_chance(&w->rng, 30)) {
    on = 1 - b->stream;
    CHECK_OK(tp_event_record(w->event, w->streams[b->stream]));
    CHECK_OK(tp_stream_wait_event(w->streams[on], w->event, 0));
    atomic_fetch_add(&n_cross_frees, 1);
  }
  /* Out of the table before the free: from the free on, the pool may hand
   * the bytes to another thread, which then enters them itself. */
  live_remove(w->index * MAX_SLOTS + slot);
  CHECK_OK(tp_free_async(b->ptr, w->streams[on]));
  atomic_fetch_add(&n_frees, 1);
  if (b->from_default)
    w->default_live -= b->size;
  *b = (block){0};
}

/* Allocates into the empty `slot` and fills the block with a fresh tag. */
static void alloc_slot(worker *w, int slot) {
  const phase_cfg *cfg = w->cfg;
  size_t size = pick_size(w);
  int s = (int)rng_below(&w->rng, 2);
  int from_default = rng_chance(&w->rng, cfg->pct_default) &&
                     w->default_live + size <= cfg->default_cap;
  void *ptr = NULL;
  tp_error_t err =
      from_default
          ? tp_malloc_async(&ptr, size, w->streams[s])
          : tp_malloc_from_pool_async(&ptr, size, created_pool, w->streams[s]);
  if (err == TP_ERROR_OUT_OF_MEMORY) {
    if (!from_default) {
      atomic_fetch_add(&n_oom_created, 1);
      return;
    }
    /* The default pool holds far less than the device's memory here (see
     * default_cap), so running out there is the allocator's fault. */
    atomic_fetch_add(&n_oom_default, 1);
    CHECK_FAIL("out of memory in the default pool for %zu bytes, with %zu "
               "bytes live in it on this thread",
               size, w->default_live);
    return;
  }
  if (!CHECK_OK(err) || !CHECK(ptr != NULL))
    return;
  CHECK_EQ_U64((uintptr_t)ptr % 512, 0);
  atomic_fetch_add(&n_allocs, 1);
  /* Tags come from one counter for all threads, so that blocks allocated
   * close together in time, the likeliest to collide, differ; 0 is left
   * out since fresh memory often reads 0. */
  unsigned seq = atomic_fetch_add(&alloc_seq, 1);
  unsigned char tag = (unsigned char)(seq % 255u + 1u);
  live_add(w->index * MAX_SLOTS + slot, ptr, size, seq, tag, s, from_default);
  w->slots[slot] = (block){ptr, size, tag, s, from_default, seq};
  if (from_default)
    w->default_live += size;
  CHECK_OK(tp_memset_async(ptr, tag, size, w->streams[s]));
}

/* The invariant walk for a pool that other threads are using. The full
 * tp__pool_verify also compares `used` with the live allocations, which
 * holds only when no allocation or free is in flight (pool_verify.h says
 * so): the stream caches' fast path changes both without the pool lock. So
 * mid-phase the structure alone is walked, under the pool lock, as debug
 * builds do after each slow-path operation; phase ends call the full one. */
static int verify_live(tp_pool_t pool, char *why, size_t why_len) {
  tp__pool *p;
  if (tp__pool_get(pool, &p) != TP_SUCCESS) {
    snprintf(why, why_len, "not a live pool");
    return 1;
  }
  tp__mutex_lock(&p->lock);
  int r = tp__pool_walk(p, false, why, why_len);
  tp__mutex_unlock(&p->lock);
  return r;
}

static const tp_pool_attr_t reuse_attrs[] = {
    TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
    TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
    TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    TP_POOL_ATTR_OOM_WAIT,
};

/* Thread 0's chores: turning the created pool's policies on and off under
 * the other threads' feet, and walking its invariants. */
static void chores(worker *w, int op) {
  const phase_cfg *cfg = w->cfg;
  if (rng_chance(&w->rng, 2)) {
    size_t nattrs = cfg->toggle_oom_wait ? 4 : 3;
    int value = (int)rng_below(&w->rng, 2);
    CHECK_OK(tp_pool_set_attribute(
        created_pool, reuse_attrs[rng_below(&w->rng, nattrs)], &value));
    atomic_fetch_add(&n_toggles, 1);
  }
  if (cfg->verify_every && op % cfg->verify_every == 0) {
    char why[256] = "";
    if (verify_live(created_pool, why, sizeof why) != 0)
      CHECK_FAIL("created pool inconsistent after %d operations: %s", op, why);
    atomic_fetch_add(&n_verifies, 1);
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  const phase_cfg *cfg = w->cfg;
  check_context(w->label);
  for (int op = 0; op < cfg->ops; op++) {
    int slot = (int)rng_below(&w->rng, (uint64_t)cfg->slots);
    if (w->slots[slot].ptr)
      free_slot(w, slot);
    else
      alloc_slot(w, slot);
    if (rng_chance(&w->rng, 2)) {
      CHECK_OK(tp_stream_synchronize(w->streams[rng_below(&w->rng, 2)]));
      atomic_fetch_add(&n_syncs, 1);
    }
    if (rng_below(&w->rng, 200) == 0) {
      static const size_t keep[] = {0, 16 * MiB, 64 * MiB};
      tp_pool_t pool = cfg->pct_default && rng_chance(&w->rng, 50)
                           ? default_pool
                           : created_pool;
      CHECK_OK(tp_pool_trim_to(pool, keep[rng_below(&w->rng, 3)]));
      atomic_fetch_add(&n_trims, 1);
    }
    if (w->index == 0)
      chores(w, op);
  }
  for (int slot = 0; slot < cfg->slots; slot++)
    free_slot(w, slot);
  for (int i = 0; i < 2; i++)
    CHECK_OK(tp_stream_synchronize(w->streams[i]));
  check_context(NULL);
  return NULL;
}

/* ========================================================================
 * Phases
 * ======================================================================== */

static uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = UINT64_MAX;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static void verify_pool(tp_pool_t pool, const char *which, const char *when) {
  char why[256] = "";
  if (tp__pool_verify(pool, why, sizeof why) != 0)
    CHECK_FAIL("%s pool inconsistent %s: %s", which, when, why);
}

/* Trims a pool to nothing and checks that nothing stays reserved or used:
 * every block has been freed and every free has completed by now. */
static void expect_empty(tp_pool_t pool, const char *which, const char *when) {
  CHECK_OK(tp_pool_trim_to(pool, 0));
  uint64_t reserved = attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  uint64_t used = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  if (reserved != 0 || used != 0)
    CHECK_FAIL("%s pool %s: reserved %" PRIu64 ", used %" PRIu64
               " (both should be 0)",
               which, when, reserved, used);
  verify_pool(pool, which, when);
}

static int env_int(const char *name, int fallback, int lo, int hi) {
  const char *s = getenv(name);
  if (!s || !*s)
    return fallback;
  long v = strtol(s, NULL, 0);
  if (v < lo || v > hi) {
    printf("%s=%s out of range [%d, %d]; using %d\n", name, s, lo, hi,
           fallback);
    return fallback;
  }
  return (int)v;
}

static void reset_counters(void) {
  atomic_long *all[] = {&n_allocs,      &n_frees,      &n_cross_frees,
                        &n_checks,      &n_mismatches, &n_oom_created,
                        &n_oom_default, &n_syncs,      &n_trims,
                        &n_toggles,     &n_verifies};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    atomic_store(all[i], 0);
  atomic_store(&alloc_seq, 0);
  memset(tag_owners, 0, sizeof tag_owners);
}

static void run_phase(const phase_cfg *cfg, uint64_t seed) {
  printf("-- %s: %d threads x %d operations, created pool max %zu MiB\n",
         cfg->name, cfg->threads, cfg->ops, cfg->created_max / MiB);
  fflush(stdout);
  reset_counters();
  live_n = cfg->threads * MAX_SLOTS;
  memset(live, 0, sizeof live);

  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location.type = TP_LOCATION_DEVICE;
  props.location.id = 0;
  props.max_size = cfg->created_max;
  REQUIRE_OK(tp_pool_create(&created_pool, &props));

  worker *workers = calloc((size_t)cfg->threads, sizeof *workers);
  pthread_t *tids = calloc((size_t)cfg->threads, sizeof *tids);
  REQUIRE(workers != NULL && tids != NULL);
  int started = 0;
  for (int t = 0; t < cfg->threads; t++) {
    worker *w = &workers[t];
    w->index = t;
    w->cfg = cfg;
    /* Each thread's choices depend only on the seed and its index. */
    w->rng.state = seed ^ (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(t + 1));
    snprintf(w->label, sizeof w->label, "%s thread %d", cfg->name, t);
    /* One stream of each kind, so that legacy-stream ordering is in play. */
    if (!CHECK_OK(tp_stream_create(&w->streams[0], TP_STREAM_DEFAULT)) ||
        !CHECK_OK(tp_stream_create(&w->streams[1], TP_STREAM_NON_BLOCKING)) ||
        !CHECK_OK(tp_event_create(&w->event)))
      break;
    if (pthread_create(&tids[t], NULL, worker_main, w) != 0) {
      CHECK_FAIL("pthread_create failed for thread %d", t);
      break;
    }
    started++;
  }
  double t0 = check_now_s();
  for (int t = 0; t < started; t++)
    pthread_join(tids[t], NULL);
  double elapsed = check_now_s() - t0;

  printf("   %.2f s: %ld allocations, %ld frees (%ld on the other stream), "
         "%ld checks, %ld mismatches\n"
         "   out of memory: %ld in the created pool, %ld in the default "
         "pool; %ld synchronizes, %ld trims, %ld policy toggles, %ld "
         "verifies\n",
         elapsed, atomic_load(&n_allocs), atomic_load(&n_frees),
         atomic_load(&n_cross_frees), atomic_load(&n_checks),
         atomic_load(&n_mismatches), atomic_load(&n_oom_created),
         atomic_load(&n_oom_default), atomic_load(&n_syncs),
         atomic_load(&n_trims), atomic_load(&n_toggles),
         atomic_load(&n_verifies));
  fflush(stdout);

  /* Everything is freed; once the device is idle, trimming must leave both
   * pools empty, first with the streams still alive (their caches must
   * have been flushed by the synchronize), then after their destruction. */
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_INT(atomic_load(&n_mismatches), 0);
  CHECK_EQ_INT(atomic_load(&n_checks), atomic_load(&n_frees));
  expect_empty(created_pool, "created", "after the phase");
  if (cfg->pct_default)
    expect_empty(default_pool, "default", "after the phase");
  for (int t = 0; t < cfg->threads; t++) {
    worker *w = &workers[t];
    for (int i = 0; i < 2; i++)
      if (w->streams[i])
        CHECK_OK(tp_stream_destroy(w->streams[i]));
    if (w->event)
      CHECK_OK(tp_event_destroy(w->event));
  }
  CHECK_OK(tp_device_synchronize());
  expect_empty(created_pool, "created", "after the streams were destroyed");
  expect_empty(default_pool, "default", "after the streams were destroyed");
  CHECK_OK(tp_pool_destroy(created_pool));
  created_pool = NULL;
  free(workers);
  free(tids);
}

int main(int argc, char **argv) {
  const char *seed_text = argc > 1 ? argv[1] : getenv("TP_STRESS_SEED");
  uint64_t seed =
      seed_text && *seed_text ? strtoull(seed_text, NULL, 0) : DEFAULT_SEED;
  int threads = env_int("TP_STRESS_THREADS", 4, 1, MAX_THREADS);
  int ops = env_int("TP_STRESS_OPS", 3000, 1, 100000000);
  const char *platform = tp_platform_name();
  REQUIRE_EXIT(platform != NULL);
  on_host = check_on_host();
  printf("test_stress: seed 0x%016" PRIx64
         " (rerun with TP_STRESS_SEED=0x%" PRIx64 "), platform %s, checks %s\n",
         seed, seed, platform,
         on_host ? "in host functions" : "by copying back");
  fflush(stdout);
  REQUIRE_OK_EXIT(tp_device_get_default_mem_pool(&default_pool, 0));

  /* Phase 1: both pools, many threads. With slots half full on average,
   * some 30 MiB are live in the created pool, so its 256 MiB cap is rarely
   * if ever reached here: out-of-memory is allowed but not expected. This
   * phase is about concurrency across pools, streams and policies. */
  phase_cfg wide = {
      .name = "two pools",
      .threads = threads,
      .ops = ops,
      .slots = 24,
      .pct_medium = 25,
      .pct_huge = 1,
      .pct_default = 50,
      .default_cap = 128 * MiB,
      .created_max = 256 * MiB,
      .verify_every = 64,
      .toggle_oom_wait = 0,
  };
  run_phase(&wide, seed);

  /* Phase 2: two threads in a pool that holds only 32 MiB, with bigger
   * blocks, so that most large requests meet out-of-memory and its paths
   * (the host-side wait among them, toggled) run constantly. */
  phase_cfg tight = {
      .name = "tight pool",
      .threads = 2,
      .ops = ops,
      .slots = 16,
      .pct_medium = 40,
      .pct_huge = 3,
      .pct_default = 0,
      .default_cap = 0,
      .created_max = 32 * MiB,
      .verify_every = 32,
      .toggle_oom_wait = 1,
  };
  run_phase(&tight, seed ^ UINT64_C(0x5448494748540000));
  return check_done();
}
