/* The findings of an outside attack on the core, one test each: a pool
 * destroyed while other threads allocate from it as the current pool, the
 * used high watermark across streams, wild pool handles, a max_size below
 * one chunk, a wild address given to stream memory work, a pool destroyed
 * under an allocation that waits out of memory, and what a synchronize
 * covers while other threads queue work. Every platform;
 * the race runs for a bounded time. */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"

/* ---- 1. the current pool destroyed under allocating threads ------------- */

typedef struct racer {
  atomic_bool *stop;
  long pairs;
  tp_error_t bad; /* the first unexpected answer */
} racer;

static void *racer_main(void *arg) {
  racer *r = arg;
  tp_stream_t s = NULL;
  if (tp_stream_create(&s, TP_STREAM_NON_BLOCKING) != TP_SUCCESS) {
    r->bad = TP_ERROR_PLATFORM;
    return NULL;
  }
  size_t sizes[] = {256, 4096, 40000, 3 << 20};
  while (!atomic_load(r->stop)) {
    void *p = NULL;
    size_t size = sizes[r->pairs % 4];
    tp_error_t err = tp_malloc_async(&p, size, s);
    if (err == TP_SUCCESS)
      err = tp_free_async(p, s);
    if (err != TP_SUCCESS && r->bad == TP_SUCCESS)
      r->bad = err;
    r->pairs++;
  }
  if (tp_stream_synchronize(s) != TP_SUCCESS && r->bad == TP_SUCCESS)
    r->bad = TP_ERROR_PLATFORM;
  (void)tp_stream_destroy(s);
  return NULL;
}

static void test_current_pool_destroyed_under_allocations(void) {
  atomic_bool stop = false;
  racer r[2] = {{&stop, 0, TP_SUCCESS}, {&stop, 0, TP_SUCCESS}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    REQUIRE(pthread_create(&t[i], NULL, racer_main, &r[i]) == 0);
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  int rounds = 0;
  double end = check_now_s() + 2.0;
  while (check_now_s() < end || rounds < 50) {
    tp_pool_t pool;
    if (!CHECK_OK(tp_pool_create(&pool, &props)))
      break;
    CHECK_OK(tp_device_set_mem_pool(0, pool));
    /* Give the racers a moment on the new pool now and then. */
    if (rounds % 8 == 0)
      check_sleep_us(200);
    CHECK_OK(tp_pool_destroy(pool));
    rounds++;
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    check_context("racing thread");
    CHECK_ERR(r[i].bad, TP_SUCCESS);
    CHECK(r[i].pairs > 0);
  }
  tp_pool_t def, cur;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  CHECK_OK(tp_device_get_mem_pool(&cur, 0));
  CHECK_EQ_PTR(cur, def);
  printf("   %d pools created and destroyed, %ld + %ld pairs alongside\n",
         rounds, r[0].pairs, r[1].pairs);
}

/* ---- 2. the used high watermark across streams ----------------------------
 */

static uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static tp_pool_t fresh_pool(void) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  tp_pool_t pool = NULL;
  CHECK_OK(tp_pool_create(&pool, &props));
  return pool;
}

static void test_used_high_two_streams(void) {
  tp_pool_t pool = fresh_pool();
  tp_stream_t x, y;
  REQUIRE_OK(tp_stream_create(&x, 0));
  REQUIRE_OK(tp_stream_create(&y, 0));
  void *a, *b, *c;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 100000, pool, x));
  REQUIRE_OK(tp_free_async(a, x));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 50000, pool, y));
  REQUIRE_OK(tp_malloc_from_pool_async(&c, 90000, pool, x));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 140000);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 140000);
  CHECK_OK(tp_free_async(b, y));
  CHECK_OK(tp_free_async(c, x));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_destroy(x));
  CHECK_OK(tp_stream_destroy(y));
  CHECK_OK(tp_pool_destroy(pool));
}

/* One thread on several streams, at random, with resets of the high: after
 * every step the high is the exact peak since the last reset. */
static void test_used_high_random_streams(void) {
  enum { STREAMS = 4, LIVE = 64, STEPS = 4000 };
  check_rng rng = {0x5eed0002};
  tp_pool_t pool = fresh_pool();
  tp_stream_t s[STREAMS];
  for (int i = 0; i < STREAMS; i++)
    REQUIRE_OK(tp_stream_create(&s[i], TP_STREAM_NON_BLOCKING));
  void *ptr[LIVE] = {0};
  size_t size[LIVE] = {0};
  uint64_t used = 0, high = 0;
  for (int step = 0; step < STEPS; step++) {
    unsigned k = (unsigned)rng_below(&rng, LIVE);
    tp_stream_t st = s[rng_below(&rng, STREAMS)];
    if (ptr[k]) {
      if (!CHECK_OK(tp_free_async(ptr[k], st)))
        break;
      used -= size[k];
      ptr[k] = NULL;
    } else {
      size[k] = rng_chance(&rng, 70) ? rng_range(&rng, 1, 32768)
                                     : rng_range(&rng, 32769, 4u << 20);
      if (!CHECK_OK(tp_malloc_from_pool_async(&ptr[k], size[k], pool, st)))
        break;
      used += size[k];
      high = used > high ? used : high;
    }
    if (rng_chance(&rng, 2)) {
      uint64_t zero = 0;
      CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero));
      high = used;
    }
    if (step % 16 == 0 || rng_chance(&rng, 5)) {
      char label[32];
      snprintf(label, sizeof label, "step %d", step);
      check_context(label);
      if (!CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used) ||
          !CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), high))
        break;
    }
  }
  check_context(NULL);
  for (int k = 0; k < LIVE; k++)
    if (ptr[k])
      CHECK_OK(tp_free_async(ptr[k], s[0]));
  CHECK_OK(tp_device_synchronize());
  for (int i = 0; i < STREAMS; i++)
    CHECK_OK(tp_stream_destroy(s[i]));
  CHECK_OK(tp_pool_destroy(pool));
}

/* Two threads on one stream, as PyTorch's forward pass allocates and its
 * autograd thread frees and allocates: the high follows the exact peak. */
typedef struct turn {
  atomic_int step;
  tp_pool_t pool;
  tp_stream_t s;
  void *p[16];
} turn;

static void wait_turn(turn *t, int step) {
  while (atomic_load(&t->step) != step)
    check_sleep_us(50);
}

static void *second_thread(void *arg) {
  turn *t = arg;
  wait_turn(t, 1);
  for (int i = 0; i < 2; i++) /* frees the first thread's blocks */
    CHECK_OK(tp_free_async(t->p[i], t->s));
  atomic_store(&t->step, 2);
  wait_turn(t, 3);
  for (int i = 0; i < 2; i++) /* no more than it freed, yet a new peak */
    CHECK_OK(tp_malloc_from_pool_async(&t->p[i], 1 << 20, t->pool, t->s));
  atomic_store(&t->step, 4);
  return NULL;
}

static void test_used_high_two_threads_one_stream(void) {
  turn t = {.pool = fresh_pool()};
  REQUIRE_OK(tp_stream_create(&t.s, 0));
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, second_thread, &t) == 0);
  for (int i = 0; i < 12; i++)
    CHECK_OK(tp_malloc_from_pool_async(&t.p[i], 1 << 20, t.pool, t.s));
  atomic_store(&t.step, 1);
  wait_turn(&t, 2);
  for (int i = 12; i < 14; i++)
    CHECK_OK(tp_malloc_from_pool_async(&t.p[i], 1 << 20, t.pool, t.s));
  atomic_store(&t.step, 3);
  wait_turn(&t, 4);
  pthread_join(th, NULL);
  /* The peak has passed by the time the figures are read. */
  for (int i = 10; i < 14; i++)
    CHECK_OK(tp_free_async(t.p[i], t.s));
  CHECK_EQ_U64(attr_u64(t.pool, TP_POOL_ATTR_USED_MEM_CURRENT), 10u << 20);
  CHECK_EQ_U64(attr_u64(t.pool, TP_POOL_ATTR_USED_MEM_HIGH), 14u << 20);
  for (int i = 0; i < 10; i++)
    CHECK_OK(tp_free_async(t.p[i], t.s));
  CHECK_OK(tp_stream_synchronize(t.s));
  CHECK_OK(tp_stream_destroy(t.s));
  CHECK_OK(tp_pool_destroy(t.pool));
}

/* A reset of the high racing an allocation, one thread on one stream doing
 * all the allocating: once both returned, the allocation is live, so the
 * high is the peak it made whichever went first (a reset sets the high to
 * the current figure). The reset once took the total before it moved the
 * peak key, and an allocation finished in between was in neither: in about
 * one trial of sixty the high stayed at the figure before it. Many caches
 * in the pool lengthen the total, and so that window. */
enum { RESET_BASE = 1000, RESET_X = 5000 };

typedef struct reset_race {
  tp_pool_t pool;
  tp_stream_t s;
  atomic_int go, allocated, freed, may_free;
  int trials;
} reset_race;

static void spin_for(uint64_t *r, unsigned bound) {
  *r = *r * 6364136223846793005u + 1442695040888963407u;
  for (volatile unsigned k = (unsigned)(*r >> 33) % bound; k > 0; k--) {
  }
}

static void *reset_race_allocator(void *arg) {
  reset_race *rr = arg;
  uint64_t r = 7;
  for (int t = 1; t <= rr->trials; t++) {
    while (atomic_load(&rr->go) != t)
      sched_yield();
    spin_for(&r, 4000);
    void *x = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&x, RESET_X, rr->pool, rr->s));
    atomic_store(&rr->allocated, t);
    while (atomic_load(&rr->may_free) != t)
      sched_yield();
    CHECK_OK(tp_free_async(x, rr->s));
    atomic_store(&rr->freed, t);
  }
  return NULL;
}

static void test_used_high_reset_races_allocation(void) {
  reset_race rr = {.pool = fresh_pool(), .trials = 20000};
  enum { STREAMS = 200 };
  tp_stream_t others[STREAMS];
  for (int i = 0; i < STREAMS; i++) {
    void *p = NULL;
    REQUIRE_OK(tp_stream_create(&others[i], 0));
    REQUIRE_OK(tp_malloc_from_pool_async(&p, 512, rr.pool, others[i]));
    REQUIRE_OK(tp_free_async(p, others[i]));
  }
  REQUIRE_OK(tp_stream_create(&rr.s, 0));
  void *base = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&base, RESET_BASE, rr.pool, rr.s));
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, reset_race_allocator, &rr) == 0);
  uint64_t r = 11;
  int lost = 0;
  for (int t = 1; t <= rr.trials; t++) {
    atomic_store(&rr.go, t);
    spin_for(&r, 4000);
    uint64_t zero = 0;
    CHECK_OK(tp_pool_set_attribute(rr.pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero));
    while (atomic_load(&rr.allocated) != t)
      sched_yield();
    atomic_store(&rr.may_free, t);
    while (atomic_load(&rr.freed) != t)
      sched_yield();
    lost +=
        attr_u64(rr.pool, TP_POOL_ATTR_USED_MEM_HIGH) != RESET_BASE + RESET_X;
  }
  pthread_join(th, NULL);
  CHECK_EQ_INT(lost, 0);
  CHECK_OK(tp_free_async(base, rr.s));
  CHECK_OK(tp_stream_synchronize(rr.s));
  CHECK_OK(tp_stream_destroy(rr.s));
  for (int i = 0; i < STREAMS; i++)
    CHECK_OK(tp_stream_destroy(others[i]));
  CHECK_OK(tp_pool_destroy(rr.pool));
}

/* ---- 3. wild pool handles -------------------------------------------------
 */

static void test_wild_pool_handles(void) {
  tp_pool_t real = fresh_pool();
  REQUIRE(real != NULL);
  /* A copy of a real handle's bytes elsewhere is not a handle either. */
  unsigned char copy[64];
  memcpy(copy, (const void *)real, sizeof copy > 16 ? 16 : sizeof copy);
  tp_pool_t wild[] = {(tp_pool_t)(uintptr_t)0x1000,
                      (tp_pool_t)(uintptr_t)0xdeadbeef000ull,
                      (tp_pool_t)(uintptr_t)1, (tp_pool_t)(void *)copy,
                      (tp_pool_t)((char *)real + 1)};
  for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++) {
    char label[48];
    snprintf(label, sizeof label, "wild handle %p", (void *)wild[i]);
    check_context(label);
    uint64_t v = 0;
    void *p = NULL;
    tp_access_flags_t f;
    tp_location_t dev0 = {TP_LOCATION_DEVICE, 0, 0};
    tp_access_desc_t desc = {dev0, TP_ACCESS_READ_WRITE};
    CHECK_ERR(tp_pool_get_attribute(wild[i], TP_POOL_ATTR_USED_MEM_CURRENT, &v),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(
        tp_pool_set_attribute(wild[i], TP_POOL_ATTR_RELEASE_THRESHOLD, &v),
        TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_malloc_from_pool_async(&p, 4096, wild[i], NULL),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_trim_to(wild[i], 0), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_get_access(&f, wild[i], &dev0), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_set_access(wild[i], &desc, 1), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_device_set_mem_pool(0, wild[i]), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_destroy(wild[i]), TP_ERROR_INVALID_VALUE);
  }
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(real));
  uint64_t v;
  CHECK_ERR(tp_pool_get_attribute(real, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
}

/* ---- 7. max_size below one chunk ------------------------------------------
 */

static void test_max_size_is_a_bound(void) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  tp_pool_t pool = NULL;
  props.max_size = 1000;
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  /* A limit between chunks holds the whole chunks below it, never more. */
  props.max_size = 3u << 20;
  REQUIRE_OK(tp_pool_create(&pool, &props));
  uint64_t chunk = attr_u64(pool, TP_POOL_ATTR_CHUNK_SIZE);
  uint64_t max = attr_u64(pool, TP_POOL_ATTR_MAX_POOL_SIZE);
  CHECK_EQ_U64(max, 3u << 20);
  void *p[64];
  int n = 0;
  while (n < 64 &&
         tp_malloc_from_pool_async(&p[n], 256 << 10, pool, NULL) == TP_SUCCESS)
    n++;
  CHECK(n > 0 && n < 64);
  uint64_t reserved = attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
  CHECK(reserved <= max);
  CHECK(reserved == max / chunk * chunk);
  for (int i = 0; i < n; i++)
    CHECK_OK(tp_free_async(p[i], NULL));
  CHECK_OK(tp_stream_synchronize(NULL));
  CHECK_OK(tp_pool_destroy(pool));
}

/* ---- 8. a wild address given to stream memory work ------------------------
 */

static void test_wild_address_faults_the_stream(void) {
  if (!check_on_host()) {
    printf("   (host platform only: a wild address on a GPU is the "
           "driver's illegal address)\n");
    return;
  }
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  char host[64] = "untouched";
  CHECK_OK(tp_memset_async((void *)(uintptr_t)0x1000, 0, 16, s));
  CHECK_ERR(tp_stream_synchronize(s), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(tp_memcpy_async(host, (const void *)(uintptr_t)0x2000, 16, s));
  CHECK_ERR(tp_stream_synchronize(s), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK(strcmp(host, "untouched") == 0);
  /* The stream works on after the faults, with host buffers too. */
  char src[64] = "stream-ordered copy", dst[64] = {0};
  CHECK_OK(tp_memcpy_async(dst, src, sizeof src, s));
  CHECK_OK(tp_memset_async(src, 'x', 8, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(strcmp(dst, "stream-ordered copy") == 0);
  CHECK(memcmp(src, "xxxxxxxx", 8) == 0);
  void *dev = NULL;
  CHECK_OK(tp_malloc_async(&dev, 1 << 20, s));
  CHECK_OK(tp_memset_async(dev, 7, 1 << 20, s));
  CHECK_OK(tp_memcpy_async(dst, dev, sizeof dst, s));
  CHECK_OK(tp_free_async(dev, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(dst[0] == 7 && dst[63] == 7);
  CHECK_OK(tp_stream_destroy(s));
}

/* ---- 9. a pool or stream destroyed while an allocation waits out of memory
 * The allocation waits on the host for a pending free (OOM_WAIT), the pool
 * lock dropped; the destroy that comes meanwhile must leave it whole: it
 * either completes with memory that works and frees, or answers
 * INVALID_VALUE. Its stream's cache was once freed under it. */

typedef struct waiter {
  tp_pool_t pool;
  tp_stream_t stream;
  void *ptr;
  tp_error_t err;
  atomic_bool done;
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  w->err = tp_malloc_from_pool_async(&w->ptr, 2u << 20, w->pool, w->stream);
  atomic_store(&w->done, true);
  return NULL;
}

/* `what`: 0 destroys the pool, 1 the stream the allocation waits on (its
 * cache, once freed under the waiting allocation too; ASan sees it). */
static void destroyed_under_oom_wait(int what) {
  tp_stream_t s1 = NULL, s2 = NULL;
  REQUIRE_OK(tp_stream_create(&s1, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&s2, TP_STREAM_NON_BLOCKING));
  for (int round = 0; round < 3; round++) {
    tp_pool_props_t props = {0};
    props.alloc_type = TP_ALLOCATION_PINNED;
    props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
    props.max_size = 2u << 20;
    waiter w = {.stream = s2};
    REQUIRE_OK(tp_pool_create(&w.pool, &props));
    int off = 0;
    CHECK_OK(tp_pool_set_attribute(
        w.pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
    CHECK_OK(tp_pool_set_attribute(
        w.pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off));
    void *x = NULL;
    REQUIRE_OK(tp_malloc_from_pool_async(&x, 2u << 20, w.pool, s1));
    gate_t gate;
    REQUIRE_OK(hold_stream(s1, &gate));
    CHECK_OK(tp_free_async(x, s1));
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, waiter_main, &w) == 0);
    check_sleep_ms(30);
    CHECK(!atomic_load(&w.done)); /* waiting for x's free */
    CHECK_OK(what ? tp_stream_destroy(s2) : tp_pool_destroy(w.pool));
    release(&gate);
    pthread_join(t, NULL);
    if (w.err == TP_SUCCESS) {
      CHECK_OK(what ? TP_SUCCESS : tp_memset_async(w.ptr, 7, 2u << 20, s2));
      CHECK_OK(tp_free_async(w.ptr, what ? s1 : s2));
    } else {
      CHECK_ERR(w.err, TP_ERROR_INVALID_VALUE);
    }
    CHECK_OK(tp_device_synchronize());
    if (what) {
      CHECK_OK(tp_pool_destroy(w.pool));
      REQUIRE_OK(tp_stream_create(&s2, TP_STREAM_NON_BLOCKING));
    }
    /* The pool went with its last allocation. */
    CHECK_ERR(tp_pool_trim_to(w.pool, 0), TP_ERROR_INVALID_VALUE);
  }
  CHECK_OK(tp_stream_destroy(s1));
  CHECK_OK(tp_stream_destroy(s2));
}

static void test_pool_destroyed_under_oom_wait(void) {
  destroyed_under_oom_wait(0);
}

static void test_stream_destroyed_under_oom_wait(void) {
  destroyed_under_oom_wait(1);
}

/* ---- 10. what a synchronize covers -----------------------------------------
 * A synchronize waits for the work queued before it, and only that work's
 * dependencies are done when it returns: a wait that another thread queues
 * on the stream during a stream synchronize, or a record of the event
 * during an event synchronize, makes no free behind it reusable (both were
 * once taken as covered, and a pending block went to another stream while
 * the freeing stream still wrote it). */

typedef struct syncer {
  tp_stream_t stream;
  tp_event_t event;
  atomic_int started; /* about to synchronize */
} syncer;

static void *syncer_main(void *arg) {
  syncer *y = arg;
  atomic_store(&y->started, 1);
  CHECK_OK(y->event ? tp_event_synchronize(y->event)
                    : tp_stream_synchronize(y->stream));
  return NULL;
}

static void sync_covers_only_earlier(bool event) {
  tp_stream_t s = NULL, s2 = NULL, s3 = NULL;
  tp_event_t e = NULL, f = NULL;
  tp_pool_t pool = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&s2, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&s3, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_event_create(&e));
  REQUIRE_OK(tp_event_create(&f));
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  REQUIRE_OK(tp_pool_create(&pool, &props));
  int off = 0;
  CHECK_OK(tp_pool_set_attribute(
      pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                 &off));
  void *x = NULL, *q = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4u << 20, pool, s2));
  REQUIRE_OK(tp_stream_synchronize(s2));
  gate_t g1, g2;
  REQUIRE_OK(hold_stream(s, &g1));
  syncer y = {s, NULL, 0};
  if (event) {
    REQUIRE_OK(tp_event_record(f, s));
    y.event = f;
  }
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, syncer_main, &y) == 0);
  /* The synchronize must be under way before the later work is queued:
   * the thread is seen to start, then given time to enter the wait (a
   * machine too loaded for that fails the test, with the hold's 30 s). */
  while (!atomic_load(&y.started))
    check_sleep_ms(1);
  check_sleep_ms(50); /* the synchronize waits for s's held work */
  REQUIRE_OK(hold_stream(s2, &g2));
  CHECK_OK(tp_memset_async(x, 0x11, 4u << 20, s2));
  CHECK_OK(tp_free_async(x, s2));
  CHECK_OK(tp_event_record(e, s2));
  CHECK_OK(tp_stream_wait_event(s, e, 0));
  if (event)
    CHECK_OK(tp_event_record(f, s));
  release(&g1);
  pthread_join(t, NULL);
  /* s2's free is still held: s3 may not have its block. */
  CHECK_OK(tp_malloc_from_pool_async(&q, 4u << 20, pool, s3));
  CHECK(q != x);
  release(&g2);
  CHECK_OK(tp_free_async(q, s3));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_event_destroy(e));
  CHECK_OK(tp_event_destroy(f));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_stream_destroy(s2));
  CHECK_OK(tp_stream_destroy(s3));
}

static void test_sync_covers_only_earlier_work(void) {
  sync_covers_only_earlier(false);
  sync_covers_only_earlier(true);
}

/* Runs every test, or with an argument only those whose name holds it. */
int main(int argc, char **argv) {
  struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
#define T(fn) {#fn, fn}
      T(test_wild_pool_handles),
      T(test_used_high_two_streams),
      T(test_used_high_random_streams),
      T(test_used_high_two_threads_one_stream),
      T(test_used_high_reset_races_allocation),
      T(test_max_size_is_a_bound),
      T(test_wild_address_faults_the_stream),
      T(test_current_pool_destroyed_under_allocations),
      T(test_pool_destroyed_under_oom_wait),
      T(test_stream_destroyed_under_oom_wait),
      T(test_sync_covers_only_earlier_work),
#undef T
  };
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (argc < 2 || strstr(tests[i].name, argv[1]))
      check_run_(tests[i].name, tests[i].fn);
  return check_done();
}
