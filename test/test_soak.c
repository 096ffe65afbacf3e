/* test_soak: threads that use an object while another thread destroys it,
 * for every such pair the API allows: the current pool, pools used by
 * handle, events, frees racing with a deferred destroy, the current pool
 * set while it is destroyed, IPC imports racing with destroys, and an
 * exporter's release of a shared block racing a second free of it. The
 * promise tested: a call on a destroyed object answers
 * TP_ERROR_INVALID_VALUE and never crashes, and a call that raced with the
 * destroy either succeeds fully or answers INVALID_VALUE. Streams, graphs
 * and execs destroyed while in use (undefined in CUDA) are held to the same
 * promise, so that a program's race costs it an error, not its heap. Meant
 * for TSan and ASan.
 *
 * Usage: test_soak [--case NAME] [SEED]; TP_SOAK_SECONDS (default 6) is the
 * time shared by the cases, TP_SOAK_SEED the seed, TP_SOAK_SKIP a list of
 * cases to leave out. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "check.h"
#include "platform/host/host_testing.h"

#define KiB ((size_t)1 << 10)
/* A descriptor as tp_pool_import_from_shareable_handle takes it: by value,
 * cast to a pointer, as the driver does. */
#define FD_HANDLE(fd) ((void *)(uintptr_t)(fd))
#define MiB ((size_t)1 << 20)
#define DEFAULT_SEED UINT64_C(0x736f616b30303031)
#define WORKERS 2
/* Unexpected answers printed per case; all are counted. */
#define MAX_REPORTS 5

static uint64_t seed;
static double case_seconds = 1.0;
static atomic_int stop;
static atomic_int reports;

/* Whether `err` is among the allowed answers; prints the first few that are
 * not (from any thread), counting every one as a failure. */
static bool expect_in(tp_error_t err, unsigned allowed, const char *what,
                      const char *line) {
  if (allowed & (1u << err))
    return true;
  if (atomic_fetch_add(&reports, 1) < MAX_REPORTS) {
    CHECK_FAIL("%s returned %s (%s)", what, tp_error_name(err), line);
  } else {
    atomic_fetch_add(&check_failures_, 1); /* counted, not printed */
  }
  return false;
}

#define OK_ (1u << TP_SUCCESS)
#define INVAL_ (1u << TP_ERROR_INVALID_VALUE)
#define OOM_ (1u << TP_ERROR_OUT_OF_MEMORY)
#define NOTREADY_ (1u << TP_ERROR_NOT_READY)
#define NOTPERM_ (1u << TP_ERROR_NOT_PERMITTED)
#define STR_(x) #x
#define XSTR_(x) STR_(x)
#define EXPECT(expr, allowed)                                                  \
  expect_in((expr), (allowed), #expr, __FILE__ ":" XSTR_(__LINE__))

static tp_pool_props_t device_props(unsigned handle_types) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  props.handle_types = handle_types;
  return props;
}

static size_t small_or_medium(check_rng *r) {
  return rng_chance(r, 70) ? (size_t)rng_range(r, 1, 32 * KiB)
                           : (size_t)rng_range(r, 32 * KiB, 3 * MiB);
}

/* Live platform objects before a case, to compare with after it. */
static tp__host_live live_before;

static void leak_baseline(void) {
  tp__host_live_get(&live_before);
}

/* After a case: every pool it made is gone, so nothing beyond what the
 * default pool keeps may stay mapped; the default pool is trimmed first. */
static void leak_check(void) {
  if (!check_on_host())
    return;
  tp_pool_t def = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  tp__host_live after;
  double deadline = check_now_s() + 10.0;
  for (;;) {
    CHECK_OK(tp_device_synchronize());
    CHECK_OK(tp_pool_trim_to(def, 0));
    tp__host_live_get(&after);
    if ((after.chunks <= live_before.chunks &&
         after.reservations <= live_before.reservations) ||
        check_now_s() > deadline)
      break;
    check_sleep_ms(1);
  }
  CHECK(after.chunks <= live_before.chunks);
  CHECK(after.reservations <= live_before.reservations);
  CHECK_EQ_U64(after.streams, live_before.streams);
  CHECK_EQ_U64(after.events, live_before.events);
}

typedef struct worker {
  pthread_t thread;
  int index;
  check_rng rng;
  long ops;
} worker;

static void start_workers(worker *w, int n, void *(*fn)(void *)) {
  atomic_store(&stop, 0);
  for (int i = 0; i < n; i++) {
    w[i].index = i;
    w[i].rng.state = seed ^ (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(i + 1));
    w[i].ops = 0;
    REQUIRE_EXIT(pthread_create(&w[i].thread, NULL, fn, &w[i]) == 0);
  }
}

static long stop_workers(worker *w, int n) {
  atomic_store(&stop, 1);
  long ops = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(w[i].thread, NULL);
    ops += w[i].ops;
  }
  return ops;
}

/* ========================================================================
 * 1. The current pool replaced and destroyed while threads allocate from
 *    it (issue 14, finding 1): tp_malloc_async must always succeed.
 * ======================================================================== */

static void *current_pool_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  while (!atomic_load(&stop)) {
    void *p = NULL;
    size_t size = small_or_medium(&w->rng);
    if (EXPECT(tp_malloc_async(&p, size, s), OK_)) {
      if (rng_chance(&w->rng, 20))
        EXPECT(tp_memset_async(p, w->index, size, s), OK_);
      EXPECT(tp_free_async(p, s), OK_);
    }
    if (rng_chance(&w->rng, 5))
      EXPECT(tp_stream_synchronize(s), OK_);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_current_pool_destroyed(void) {
  leak_baseline();
  worker w[WORKERS];
  check_rng rng = {seed};
  start_workers(w, WORKERS, current_pool_worker);
  long rounds = 0;
  double end = check_now_s() + case_seconds;
  tp_pool_props_t props = device_props(0);
  while (check_now_s() < end) {
    tp_pool_t pool = NULL;
    if (!CHECK_OK(tp_pool_create(&pool, &props)))
      break;
    CHECK_OK(tp_device_set_mem_pool(0, pool));
    if (rng_chance(&rng, 50))
      check_sleep_us((long)rng_below(&rng, 200));
    CHECK_OK(tp_pool_destroy(pool));
    rounds++;
  }
  long ops = stop_workers(w, WORKERS);
  tp_pool_t cur = NULL, def = NULL;
  CHECK_OK(tp_device_get_mem_pool(&cur, 0));
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  CHECK_EQ_PTR(cur, def);
  printf("   %ld pools made current and destroyed, %ld allocations\n", rounds,
         ops);
  leak_check();
}

/* ========================================================================
 * 2. A pool used through its handle (attributes, trim, access, allocation,
 *    export) while another thread destroys it.
 * ======================================================================== */

/* The pool the main thread publishes, with its generation; `dead` is the
 * newest generation whose destroy has returned. */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static tp_pool_t slot_pool;
static uint64_t slot_gen;
static atomic_uint_fast64_t dead_gen;
/* Successful destroys of each generation's pool, from any thread. */
#define MAX_GENS (1 << 16)
static atomic_int destroys[MAX_GENS];

static void slot_publish(tp_pool_t pool, uint64_t gen) {
  pthread_mutex_lock(&slot_lock);
  slot_pool = pool;
  slot_gen = gen;
  pthread_mutex_unlock(&slot_lock);
}

static tp_pool_t slot_read(uint64_t *gen) {
  pthread_mutex_lock(&slot_lock);
  tp_pool_t p = slot_pool;
  *gen = slot_gen;
  pthread_mutex_unlock(&slot_lock);
  return p;
}

/* One call on `pool` of generation `gen`. `dead`: its destroy had
 * returned before the call began, so only INVALID_VALUE may come back. */
static void pool_call(worker *w, tp_stream_t s, tp_pool_t pool, uint64_t gen,
                      bool dead) {
  unsigned any = dead ? INVAL_ : OK_ | INVAL_;
  uint64_t u = 0;
  int i = 0;
  if (rng_chance(&w->rng, 3)) {
    /* Two destroys racing: exactly one of them succeeds. */
    tp_error_t err = tp_pool_destroy(pool);
    if (EXPECT(err, any) && err == TP_SUCCESS && gen < MAX_GENS)
      atomic_fetch_add(&destroys[gen], 1);
    return;
  }
  switch (rng_below(&w->rng, 9)) {
  case 0: {
    static const tp_pool_attr_t attrs[] = {
        TP_POOL_ATTR_RESERVED_MEM_CURRENT, TP_POOL_ATTR_USED_MEM_CURRENT,
        TP_POOL_ATTR_USED_MEM_HIGH,        TP_POOL_ATTR_RELEASE_THRESHOLD,
        TP_POOL_ATTR_RESERVED_MEM_HIGH,    TP_POOL_ATTR_MAX_POOL_SIZE};
    tp_pool_attr_t a = attrs[rng_below(&w->rng, 6)];
    EXPECT(tp_pool_get_attribute(pool, a, &u), any);
    break;
  }
  case 1: {
    static const tp_pool_attr_t attrs[] = {
        TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, TP_POOL_ATTR_OOM_WAIT};
    i = (int)rng_below(&w->rng, 2);
    EXPECT(tp_pool_set_attribute(pool, attrs[rng_below(&w->rng, 4)], &i), any);
    break;
  }
  case 2:
    u = rng_chance(&w->rng, 50) ? 0 : UINT64_MAX;
    EXPECT(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &u),
           any);
    break;
  case 3:
    u = 0;
    EXPECT(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &u), any);
    break;
  case 4:
    EXPECT(tp_pool_trim_to(pool, (size_t)rng_below(&w->rng, 4 * MiB)), any);
    break;
  case 5: {
    tp_location_t loc = {TP_LOCATION_DEVICE, 0, 0};
    tp_access_flags_t f = TP_ACCESS_NONE;
    if (rng_chance(&w->rng, 50)) {
      EXPECT(tp_pool_get_access(&f, pool, &loc), any);
    } else {
      tp_access_desc_t d = {loc, TP_ACCESS_READ_WRITE};
      EXPECT(tp_pool_set_access(pool, &d, 1), any);
    }
    break;
  }
  case 6: {
    int fd = -1;
    if (EXPECT(tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD,
                                                  0),
               any) &&
        fd >= 0)
      close(fd);
    break;
  }
  default: {
    void *p = NULL;
    size_t size = small_or_medium(&w->rng);
    tp_error_t err = tp_malloc_from_pool_async(&p, size, pool, s);
    if (!EXPECT(err, dead ? INVAL_ : OK_ | INVAL_ | OOM_) || err != TP_SUCCESS)
      break;
    /* A block that came back is the caller's in full, even when the pool
     * went meanwhile: writable, exportable while live, freeable. */
    EXPECT(tp_memset_async(p, 0x5A, size, s), OK_);
    tp_pool_ptr_export_data_t rec;
    EXPECT(tp_pool_export_pointer(&rec, p), OK_ | INVAL_);
    EXPECT(tp_free_async(p, s), OK_);
    break;
  }
  }
}

static void *pool_handle_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  tp_pool_t stale = NULL;
  uint64_t stale_gen = 0;
  while (!atomic_load(&stop)) {
    uint64_t gen = 0;
    tp_pool_t pool = slot_read(&gen);
    /* Now and then a handle whose pool is certainly gone. */
    if (stale && rng_chance(&w->rng, 20)) {
      pool = stale;
      gen = stale_gen;
    } else if (pool) {
      stale = pool;
      stale_gen = gen;
    }
    if (!pool) {
      sched_yield();
      continue;
    }
    bool dead = atomic_load(&dead_gen) >= gen;
    pool_call(w, s, pool, gen, dead);
    if (rng_chance(&w->rng, 3))
      EXPECT(tp_stream_synchronize(s), OK_);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_pool_handle_destroyed(void) {
  leak_baseline();
  atomic_store(&dead_gen, 0);
  slot_publish(NULL, 0);
  worker w[WORKERS];
  check_rng rng = {seed + 2};
  start_workers(w, WORKERS, pool_handle_worker);
  uint64_t gen = 0;
  double end = check_now_s() + case_seconds;
  while (check_now_s() < end) {
    tp_pool_props_t props =
        device_props(rng_chance(&rng, 30) ? TP_HANDLE_POSIX_FD : 0);
    tp_pool_t pool = NULL;
    if (!CHECK_OK(tp_pool_create(&pool, &props)))
      break;
    slot_publish(pool, ++gen);
    check_sleep_us((long)rng_below(&rng, 300));
    tp_error_t err = tp_pool_destroy(pool);
    if (EXPECT(err, OK_ | INVAL_) && err == TP_SUCCESS && gen < MAX_GENS)
      atomic_fetch_add(&destroys[gen], 1);
    atomic_store(&dead_gen, gen);
    /* Destroying twice is refused, whatever the workers did. */
    CHECK_ERR(tp_pool_destroy(pool), TP_ERROR_INVALID_VALUE);
  }
  slot_publish(NULL, gen);
  long ops = stop_workers(w, WORKERS);
  for (uint64_t g = 1; g <= gen && g < MAX_GENS; g++) {
    int n = atomic_load(&destroys[g]);
    if (n != 1 && atomic_fetch_add(&reports, 1) < MAX_REPORTS)
      CHECK_FAIL("pool %" PRIu64 " was destroyed successfully %d times", g, n);
  }
  printf("   %" PRIu64 " pools destroyed under %ld calls\n", gen, ops);
  leak_check();
}

/* ========================================================================
 * 3. Events recorded, waited on, queried and synchronised while another
 *    thread destroys them.
 * ======================================================================== */

static pthread_mutex_t ev_slot_lock = PTHREAD_MUTEX_INITIALIZER;
static tp_event_t ev_slot;
static uint64_t ev_gen;              /* generation of ev_slot */
static atomic_uint_fast64_t ev_made; /* generations created so far */
static atomic_uint_fast64_t ev_dead; /* newest generation destroyed */

static void *event_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  tp_event_t stale = NULL;
  uint64_t stale_gen = 0;
  while (!atomic_load(&stop)) {
    pthread_mutex_lock(&ev_slot_lock);
    tp_event_t e = ev_slot;
    uint64_t gen = ev_gen;
    pthread_mutex_unlock(&ev_slot_lock);
    if (stale && rng_chance(&w->rng, 20)) {
      e = stale;
      gen = stale_gen;
    } else if (e) {
      stale = e;
      stale_gen = gen;
    }
    if (!e) {
      sched_yield();
      continue;
    }
    /* Dead before the call, with no event alive or being made from before
     * the call to after it: the address cannot name a newer event, so only
     * INVALID_VALUE may come back. */
    uint64_t made = atomic_load(&ev_made);
    bool dead = atomic_load(&ev_dead) >= gen && atomic_load(&ev_dead) == made;
    tp_error_t err;
    const char *what;
    switch (rng_below(&w->rng, 4)) {
    case 0:
      err = tp_event_record(e, s);
      what = "tp_event_record";
      break;
    case 1:
      err = tp_event_query(e);
      what = "tp_event_query";
      break;
    case 2:
      err = tp_event_synchronize(e);
      what = "tp_event_synchronize";
      break;
    default:
      err = tp_stream_wait_event(s, e, 0);
      what = "tp_stream_wait_event";
      break;
    }
    bool strict = dead && atomic_load(&ev_made) == made;
    expect_in(err, strict ? INVAL_ : OK_ | INVAL_ | NOTREADY_, what,
              strict ? "event destroyed before the call" : "racing");
    if (rng_chance(&w->rng, 5))
      EXPECT(tp_stream_synchronize(s), OK_);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_event_destroyed(void) {
  leak_baseline();
  atomic_store(&ev_made, 0);
  atomic_store(&ev_dead, 0);
  worker w[WORKERS];
  check_rng rng = {seed + 3};
  start_workers(w, WORKERS, event_worker);
  uint64_t gen = 0;
  double end = check_now_s() + case_seconds;
  while (check_now_s() < end) {
    tp_event_t e = NULL;
    atomic_fetch_add(&ev_made, 1);
    if (!CHECK_OK(tp_event_create(&e)))
      break;
    pthread_mutex_lock(&ev_slot_lock);
    ev_slot = e;
    ev_gen = ++gen;
    pthread_mutex_unlock(&ev_slot_lock);
    check_sleep_us((long)rng_below(&rng, 300));
    pthread_mutex_lock(&ev_slot_lock);
    ev_slot = NULL;
    pthread_mutex_unlock(&ev_slot_lock);
    CHECK_OK(tp_event_destroy(e));
    atomic_store(&ev_dead, gen);
    check_sleep_us((long)rng_below(&rng, 100));
  }
  long ops = stop_workers(w, WORKERS);
  printf("   %" PRIu64 " events destroyed under %ld calls\n", gen, ops);
  leak_check();
}

/* ========================================================================
 * 4. Frees of a pool's memory racing with the pool's destroy: the destroy
 *    defers, every free succeeds, and the pool's memory goes once the last
 *    free has completed.
 * ======================================================================== */

#define DEFER_BLOCKS 48

static pthread_barrier_t round_barrier;
static tp_pool_t defer_pool;

static void *deferred_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  void *blocks[DEFER_BLOCKS];
  size_t sizes[DEFER_BLOCKS];
  for (;;) {
    pthread_barrier_wait(&round_barrier); /* the pool exists */
    if (atomic_load(&stop))
      break;
    tp_pool_t pool = defer_pool;
    int n = 0;
    for (int i = 0; i < DEFER_BLOCKS; i++) {
      sizes[n] = small_or_medium(&w->rng) / 4 + 1;
      if (EXPECT(tp_malloc_from_pool_async(&blocks[n], sizes[n], pool, s),
                 OK_ | OOM_) &&
          blocks[n]) {
        EXPECT(tp_memset_async(blocks[n], w->index + 1, sizes[n], s), OK_);
        n++;
      }
    }
    pthread_barrier_wait(&round_barrier); /* the destroy may start */
    for (int i = 0; i < n; i++) {
      EXPECT(tp_free_async(blocks[i], s), OK_);
      if (rng_chance(&w->rng, 10)) {
        /* Racing with the destroy: a new block or a refusal. */
        void *p = NULL;
        tp_error_t err = tp_malloc_from_pool_async(&p, 4096, pool, s);
        if (EXPECT(err, OK_ | INVAL_) && err == TP_SUCCESS)
          EXPECT(tp_free_async(p, s), OK_);
      }
      w->ops++;
    }
    EXPECT(tp_stream_synchronize(s), OK_);
    pthread_barrier_wait(&round_barrier); /* the round is over */
  }
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_free_races_destroy(void) {
  leak_baseline();
  REQUIRE(pthread_barrier_init(&round_barrier, NULL, WORKERS + 1) == 0);
  worker w[WORKERS];
  check_rng rng = {seed + 4};
  start_workers(w, WORKERS, deferred_worker);
  long rounds = 0;
  double end = check_now_s() + case_seconds;
  tp_pool_props_t props = device_props(0);
  for (;;) {
    bool more =
        check_now_s() < end && CHECK_OK(tp_pool_create(&defer_pool, &props));
    if (!more)
      atomic_store(&stop, 1);
    pthread_barrier_wait(&round_barrier);
    if (!more)
      break;
    pthread_barrier_wait(&round_barrier);
    check_sleep_us((long)rng_below(&rng, 200));
    CHECK_OK(tp_pool_destroy(defer_pool));
    void *p = NULL;
    CHECK_ERR(tp_malloc_from_pool_async(&p, 4096, defer_pool, NULL),
              TP_ERROR_INVALID_VALUE);
    pthread_barrier_wait(&round_barrier);
    rounds++;
  }
  long ops = stop_workers(w, WORKERS);
  pthread_barrier_destroy(&round_barrier);
  printf("   %ld deferred destroys, %ld frees\n", rounds, ops);
  leak_check();
}

/* ========================================================================
 * 5. The current pool set by one thread while another destroys that pool:
 *    once both calls have returned, the current pool is a live one.
 * ======================================================================== */

static _Atomic(tp_pool_t) setter_pool;
static atomic_int setter_round;
static atomic_int setter_done_round;

static void *setter_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  while (!atomic_load(&stop)) {
    int round = atomic_load(&setter_round);
    tp_pool_t pool = atomic_load(&setter_pool);
    if (pool && w->index == 0)
      EXPECT(tp_device_set_mem_pool(0, pool), OK_ | INVAL_);
    void *p = NULL;
    size_t size = small_or_medium(&w->rng);
    if (EXPECT(tp_malloc_async(&p, size, s), OK_))
      EXPECT(tp_free_async(p, s), OK_);
    if (w->index == 0)
      atomic_store(&setter_done_round, round);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_set_current_races_destroy(void) {
  leak_baseline();
  atomic_store(&setter_pool, NULL);
  atomic_store(&setter_round, 0);
  atomic_store(&setter_done_round, 0);
  worker w[WORKERS];
  check_rng rng = {seed + 5};
  start_workers(w, WORKERS, setter_worker);
  tp_pool_t def = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  long rounds = 0;
  double end = check_now_s() + case_seconds;
  tp_pool_props_t props = device_props(0);
  while (check_now_s() < end) {
    tp_pool_t pool = NULL;
    if (!CHECK_OK(tp_pool_create(&pool, &props)))
      break;
    atomic_store(&setter_pool, pool);
    check_sleep_us((long)rng_below(&rng, 200));
    CHECK_OK(tp_pool_destroy(pool));
    atomic_store(&setter_pool, NULL);
    /* Wait until the setter has begun a round after the destroy, so that
     * its last set with the destroyed pool has returned. */
    int round = atomic_fetch_add(&setter_round, 1) + 1;
    double deadline = check_now_s() + 10.0;
    while (atomic_load(&setter_done_round) < round && check_now_s() < deadline)
      sched_yield();
    tp_pool_t cur = NULL;
    if (CHECK_OK(tp_device_get_mem_pool(&cur, 0))) {
      uint64_t v = 0;
      /* The current pool is never a destroyed one. */
      if (!CHECK_OK(
              tp_pool_get_attribute(cur, TP_POOL_ATTR_USED_MEM_CURRENT, &v)))
        CHECK_OK(tp_device_set_mem_pool(0, def));
    }
    rounds++;
  }
  stop_workers(w, WORKERS);
  CHECK_OK(tp_device_set_mem_pool(0, def));
  printf("   %ld rounds\n", rounds);
  leak_check();
}

/* ========================================================================
 * 6. IPC within one process: pointers imported while the exporter frees
 *    and destroys, and while the imported pool itself is destroyed.
 * ======================================================================== */

static tp_pool_t ipc_imported;
static tp_pool_ptr_export_data_t ipc_rec;
static int ipc_fd = -1; /* the exporter's descriptor, open for the round */
/* This round destroys the imported pool first: a pointer imported through
 * it may then stop being valid under the worker, so the worker only imports
 * and frees (the free may then be refused), without reading. */
static bool ipc_imported_first;

static void *import_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  for (;;) {
    pthread_barrier_wait(&round_barrier); /* the record exists */
    if (atomic_load(&stop))
      break;
    tp_pool_ptr_export_data_t rec = ipc_rec;
    tp_pool_t imported = ipc_imported;
    bool imported_first = ipc_imported_first;
    int fd = ipc_fd;
    pthread_barrier_wait(&round_barrier); /* the destroys may start */
    for (int i = 0; i < 20; i++) {
      if (rng_chance(&w->rng, 10)) {
        /* A new importer while the exporter may be going: admitted in
         * full, or refused (NOT_PERMITTED once the exporter serves as many
         * channels as it allows). */
        tp_pool_t mine = NULL;
        tp_error_t err = tp_pool_import_from_shareable_handle(
            &mine, FD_HANDLE(fd), TP_HANDLE_POSIX_FD, 0);
        if (EXPECT(err, OK_ | INVAL_ | NOTPERM_) && err == TP_SUCCESS)
          EXPECT(tp_pool_destroy(mine), OK_);
      }
      void *q = NULL;
      tp_error_t err = tp_pool_import_pointer(&q, imported, &rec);
      if (!EXPECT(err, OK_ | INVAL_) || err != TP_SUCCESS) {
        w->ops++;
        continue;
      }
      if (imported_first) {
        EXPECT(tp_free_async(q, s), OK_ | INVAL_);
      } else {
        unsigned char byte = 0;
        EXPECT(tp_memcpy_async(&byte, q, 1, s), OK_);
        EXPECT(tp_stream_synchronize(s), OK_);
        if (byte != 0x77)
          CHECK_FAIL("imported byte 0x%02x, expected 0x77", byte);
        EXPECT(tp_free_async(q, s), OK_);
      }
      w->ops++;
    }
    EXPECT(tp_stream_synchronize(s), OK_);
    pthread_barrier_wait(&round_barrier); /* the round is over */
  }
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_ipc_races_destroy(void) {
  leak_baseline();
  REQUIRE(pthread_barrier_init(&round_barrier, NULL, WORKERS + 1) == 0);
  worker w[WORKERS];
  check_rng rng = {seed + 6};
  start_workers(w, WORKERS, import_worker);
  tp_stream_t s = NULL;
  CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  long rounds = 0;
  double end = check_now_s() + case_seconds;
  tp_pool_props_t props = device_props(TP_HANDLE_POSIX_FD);
  for (;;) {
    tp_pool_t pool = NULL;
    void *p = NULL;
    int fd = -1;
    bool more = check_now_s() < end && CHECK_OK(tp_pool_create(&pool, &props));
    if (more && !CHECK_OK(tp_pool_export_to_shareable_handle(
                    &fd, pool, TP_HANDLE_POSIX_FD, 0))) {
      CHECK_OK(tp_pool_destroy(pool));
      more = false;
    }
    if (more) {
      more = CHECK_OK(tp_pool_import_from_shareable_handle(
          &ipc_imported, FD_HANDLE(fd), TP_HANDLE_POSIX_FD, 0));
      ipc_fd = fd;
      if (!more) {
        close(fd);
        CHECK_OK(tp_pool_destroy(pool));
      }
    }
    if (more) {
      CHECK_OK(tp_malloc_from_pool_async(&p, 64 * KiB, pool, s));
      CHECK_OK(tp_memset_async(p, 0x77, 64 * KiB, s));
      CHECK_OK(tp_stream_synchronize(s));
      CHECK_OK(tp_pool_export_pointer(&ipc_rec, p));
    }
    if (!more)
      atomic_store(&stop, 1);
    ipc_imported_first = rng_chance(&rng, 50);
    pthread_barrier_wait(&round_barrier);
    if (!more)
      break;
    pthread_barrier_wait(&round_barrier);
    check_sleep_us((long)rng_below(&rng, 300));
    /* Either order: the exporter frees and destroys first, or the imported
     * pool goes first. */
    if (!ipc_imported_first) {
      CHECK_OK(tp_free_async(p, s));
      CHECK_OK(tp_pool_destroy(pool));
    } else {
      CHECK_OK(tp_pool_destroy(ipc_imported));
      check_sleep_us((long)rng_below(&rng, 300));
      CHECK_OK(tp_free_async(p, s));
      CHECK_OK(tp_pool_destroy(pool));
    }
    pthread_barrier_wait(&round_barrier);
    /* Destroying an imported pool releases every pointer not yet freed
     * (the header), so in this order it goes only once the workers, which
     * read what they import, are done. */
    if (!ipc_imported_first)
      CHECK_OK(tp_pool_destroy(ipc_imported));
    close(ipc_fd);
    CHECK_OK(tp_stream_synchronize(s));
    rounds++;
  }
  stop_workers(w, WORKERS);
  pthread_barrier_destroy(&round_barrier);
  CHECK_OK(tp_stream_destroy(s));
  printf("   %ld exported pools destroyed under imports\n", rounds);
  leak_check();
}

/* ========================================================================
 * 7. Pools created, used and destroyed on several threads at once, while
 *    stream work writes into them: every pool's memory stays its own until
 *    its work is done, whatever address ranges the others reuse.
 * ======================================================================== */

/* Workers 0 and 1 create and destroy pools, using some; worker 2 keeps
 * writing into a block of a pool of its own, so that its stream work looks
 * addresses up while the others' ranges come and go. */
static void *churn_worker(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  tp_pool_props_t props = device_props(0);
  if (w->index == 2) {
    tp_pool_t pool = NULL;
    void *p = NULL;
    unsigned char got = 0;
    if (CHECK_OK(tp_pool_create(&pool, &props)) &&
        CHECK_OK(tp_malloc_from_pool_async(&p, 64 * KiB, pool, s))) {
      while (!atomic_load(&stop)) {
        unsigned char v = (unsigned char)(w->ops % 250 + 1);
        EXPECT(tp_memset_async(p, v, 64 * KiB, s), OK_);
        EXPECT(tp_memcpy_async(&got, (char *)p + 64 * KiB - 1, 1, s), OK_);
        EXPECT(tp_stream_synchronize(s), OK_);
        if (got != v && atomic_fetch_add(&reports, 1) < MAX_REPORTS)
          CHECK_FAIL("a block reads 0x%02x, expected 0x%02x", got, v);
        w->ops++;
      }
      CHECK_OK(tp_free_async(p, s));
    }
    CHECK_OK(tp_stream_synchronize(s));
    if (pool)
      CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(s));
    return NULL;
  }
  while (!atomic_load(&stop)) {
    tp_pool_t pool = NULL;
    if (!EXPECT(tp_pool_create(&pool, &props), OK_))
      break;
    if (rng_chance(&w->rng, 30)) {
      void *p = NULL;
      size_t size = small_or_medium(&w->rng);
      if (EXPECT(tp_malloc_from_pool_async(&p, size, pool, s), OK_)) {
        EXPECT(tp_memset_async(p, 0x3C, size, s), OK_);
        /* Half the time the pool goes first and waits for the free. */
        if (rng_chance(&w->rng, 50)) {
          EXPECT(tp_pool_destroy(pool), OK_);
          pool = NULL;
        }
        EXPECT(tp_free_async(p, s), OK_);
      }
    }
    if (pool)
      EXPECT(tp_pool_destroy(pool), OK_);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_pools_churn(void) {
  leak_baseline();
  worker w[WORKERS + 1];
  start_workers(w, WORKERS + 1, churn_worker);
  check_sleep_us((long)(case_seconds * 1e6));
  long ops = stop_workers(w, WORKERS + 1);
  printf("   %ld pools created and destroyed, or blocks written\n", ops);
  leak_check();
}

/* ========================================================================
 * 8. A stream destroyed while other threads queue work on it, allocate and
 *    free on it, and synchronize it: every call succeeds or answers
 *    INVALID_VALUE, and a block allocated on it is freed elsewhere when
 *    the stream went first, so that nothing stays in use.
 * ======================================================================== */

static _Atomic(tp_stream_t) stream_slot;
/* Each user's finished iterations: a new stream is made only once every
 * user has finished the iteration it may have begun with the old one, so
 * that no iteration's calls reach two streams through one handle value
 * (the platform may give a new stream the handle of one released). */
static atomic_long stream_user_iters[WORKERS];

static void count_host_func(void *arg) {
  atomic_fetch_add((atomic_long *)arg, 1);
}

static void *stream_user(void *arg) {
  worker *w = arg;
  tp_event_t ev = NULL;
  tp_stream_t mine = NULL;
  if (!CHECK_OK(tp_event_create(&ev)) ||
      !CHECK_OK(tp_stream_create(&mine, TP_STREAM_NON_BLOCKING)))
    return NULL;
  static atomic_long ran;
  while (!atomic_load(&stop)) {
    tp_stream_t s = atomic_load(&stream_slot);
    if (!s) {
      atomic_fetch_add(&stream_user_iters[w->index], 1);
      sched_yield();
      continue;
    }
    const unsigned any = OK_ | INVAL_ | NOTREADY_;
    switch (rng_below(&w->rng, 6)) {
    case 0: {
      void *p = NULL;
      size_t size = small_or_medium(&w->rng);
      tp_error_t err = tp_malloc_async(&p, size, s);
      if (!EXPECT(err, OK_ | INVAL_) || err != TP_SUCCESS)
        break;
      EXPECT(tp_memset_async(p, 0x5A, size, s), OK_ | INVAL_);
      err = tp_free_async(p, s);
      if (EXPECT(err, OK_ | INVAL_) && err == TP_ERROR_INVALID_VALUE) {
        /* The stream went first: its memset may still be queued, and only
         * a device synchronize orders another stream's free after it. */
        EXPECT(tp_device_synchronize(), OK_);
        EXPECT(tp_free_async(p, mine), OK_);
      }
      break;
    }
    case 1:
      EXPECT(tp_launch_host_func(s, count_host_func, &ran), OK_ | INVAL_);
      break;
    case 2:
      EXPECT(tp_event_record(ev, s), OK_ | INVAL_);
      EXPECT(tp_stream_wait_event(s, ev, 0), OK_ | INVAL_);
      break;
    case 3: EXPECT(tp_stream_query(s), any); break;
    case 4: EXPECT(tp_stream_synchronize(s), OK_ | INVAL_); break;
    default: {
      tp_capture_status_t st;
      EXPECT(tp_stream_is_capturing(s, &st), OK_ | INVAL_);
      break;
    }
    }
    w->ops++;
    atomic_fetch_add(&stream_user_iters[w->index], 1);
  }
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(mine));
  return NULL;
}

static void test_stream_destroyed(void) {
  leak_baseline();
  tp_pool_t def = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&def, 0));
  worker w[WORKERS];
  check_rng rng = {seed + 8};
  start_workers(w, WORKERS, stream_user);
  long made = 0;
  double end = check_now_s() + case_seconds;
  while (check_now_s() < end) {
    tp_stream_t s = NULL;
    unsigned flags = rng_chance(&rng, 50) ? TP_STREAM_NON_BLOCKING : 0;
    if (!CHECK_OK(tp_stream_create(&s, flags)))
      break;
    made++;
    atomic_store(&stream_slot, s);
    check_sleep_us((long)rng_below(&rng, 400));
    /* Destroyed while still published half the time: calls that read the
     * handle after this find it gone. */
    if (rng_chance(&rng, 50))
      atomic_store(&stream_slot, NULL);
    EXPECT(tp_stream_destroy(s), OK_);
    atomic_store(&stream_slot, NULL);
    for (int i = 0; i < WORKERS; i++) {
      long seen = atomic_load(&stream_user_iters[i]);
      while (atomic_load(&stream_user_iters[i]) == seen)
        sched_yield();
    }
    check_sleep_us((long)rng_below(&rng, 100));
  }
  long ops = stop_workers(w, WORKERS);
  uint64_t used = 1;
  CHECK_OK(tp_pool_get_attribute(def, TP_POOL_ATTR_USED_MEM_CURRENT, &used));
  CHECK_EQ_U64(used, 0);
  printf("   %ld streams destroyed under %ld calls\n", made, ops);
  leak_check();
}

/* ========================================================================
 * 9. Graphs destroyed while other threads instantiate them, and execs
 *    destroyed while another thread launches them (one launcher an exec,
 *    as CUDA asks): refused or done whole, never a graph freed under a
 *    call.
 * ======================================================================== */

static _Atomic(tp_graph_t) graph_slot;
static _Atomic(tp_graph_exec_t) exec_slot;

static void *graph_user(void *arg) {
  worker *w = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  while (!atomic_load(&stop)) {
    if (w->index == 0) { /* the one launcher */
      tp_graph_exec_t x = atomic_load(&exec_slot);
      if (x)
        EXPECT(tp_graph_launch(x, s), OK_ | INVAL_);
      else
        sched_yield();
    } else {
      tp_graph_t g = atomic_load(&graph_slot);
      tp_graph_exec_t x = NULL;
      tp_error_t err = g ? tp_graph_instantiate(&x, g, 0) : TP_SUCCESS;
      if (EXPECT(err, OK_ | INVAL_) && x)
        EXPECT(tp_graph_exec_destroy(x), OK_);
      if (!g)
        sched_yield();
    }
    if (rng_chance(&w->rng, 10))
      EXPECT(tp_stream_synchronize(s), OK_);
    w->ops++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void nothing(void *arg) {
  (void)arg;
}

static void test_graph_destroyed(void) {
  leak_baseline();
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *buf = NULL;
  REQUIRE_OK(tp_malloc_async(&buf, 4 * KiB, s));
  worker w[WORKERS];
  check_rng rng = {seed + 9};
  start_workers(w, WORKERS, graph_user);
  long rounds = 0;
  double end = check_now_s() + case_seconds;
  while (check_now_s() < end) {
    tp_graph_t g = NULL;
    tp_graph_exec_t x = NULL;
    if (!CHECK_OK(tp_stream_begin_capture(s, TP_CAPTURE_MODE_RELAXED)))
      break;
    EXPECT(tp_memset_async(buf, 0x11, 4 * KiB, s), OK_);
    EXPECT(tp_launch_host_func(s, nothing, NULL), OK_);
    if (!CHECK_OK(tp_stream_end_capture(s, &g)))
      break;
    if (!CHECK_OK(tp_graph_instantiate(&x, g, 0)))
      break;
    atomic_store(&graph_slot, g);
    atomic_store(&exec_slot, x);
    check_sleep_us((long)rng_below(&rng, 300));
    /* Either goes first; the handles stay published while they go. */
    if (rng_chance(&rng, 50)) {
      EXPECT(tp_graph_destroy(g), OK_);
      EXPECT(tp_graph_exec_destroy(x), OK_);
    } else {
      EXPECT(tp_graph_exec_destroy(x), OK_);
      EXPECT(tp_graph_destroy(g), OK_);
    }
    check_sleep_us((long)rng_below(&rng, 100));
    atomic_store(&graph_slot, NULL);
    atomic_store(&exec_slot, NULL);
    rounds++;
  }
  long ops = stop_workers(w, WORKERS);
  CHECK_OK(tp_free_async(buf, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
  printf("   %ld graphs and execs destroyed under %ld calls\n", rounds, ops);
  leak_check();
}

/* ========================================================================
 * 10. A pointer freed by its exporter while another pool holds it is freed
 *     once: the importer's release, which finishes that free on the
 *     exporter's thread, races the application freeing the pointer again,
 *     and every second free answers INVALID_VALUE (a fuzz input found one
 *     that succeeded, and gave the block to the pool a second time).
 * ======================================================================== */

static void test_export_double_free(void) {
  leak_baseline();
  tp_stream_t s = NULL, s2 = NULL;
  tp_pool_t pool = NULL, imported = NULL;
  int fd = -1;
  tp_pool_props_t props = device_props(TP_HANDLE_POSIX_FD);
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&s2, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_pool_create(&pool, &props));
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(&imported, FD_HANDLE(fd),
                                                  TP_HANDLE_POSIX_FD, 0));
  check_rng rng = {seed + 10};
  long rounds = 0, tries = 0;
  double end = check_now_s() + case_seconds;
  while (check_now_s() < end && atomic_load(&reports) == 0) {
    size_t size = rng_chance(&rng, 50) ? (size_t)rng_range(&rng, 1, 4 * KiB)
                                       : (size_t)rng_range(&rng, 64 * KiB, MiB);
    void *p = NULL, *q = NULL;
    tp_pool_ptr_export_data_t rec;
    if (!CHECK_OK(tp_malloc_from_pool_async(&p, size, pool, s)) ||
        !CHECK_OK(tp_pool_export_pointer(&rec, p)) ||
        !CHECK_OK(tp_pool_import_pointer(&q, imported, &rec)))
      break;
    /* The exporter's free keeps the block while the import holds it; the
     * import's free releases it once s2 reaches it. */
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_free_async(q, s2));
    uint64_t used = 1;
    double give_up = check_now_s() + 10.0;
    while (used && check_now_s() < give_up) {
      EXPECT(tp_free_async(p, s), INVAL_);
      CHECK_OK(
          tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &used));
      tries++;
    }
    CHECK_EQ_U64(used, 0);
    EXPECT(tp_free_async(p, s), INVAL_);
    rounds++;
  }
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_synchronize(s2));
  CHECK_OK(tp_pool_destroy(imported));
  close(fd);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_stream_destroy(s2));
  printf("   %ld exported pointers freed again %ld times while their "
         "release was on its way\n",
         rounds, tries);
  leak_check();
}

/* ======================================================================== */

typedef struct soak_case {
  const char *name;
  void (*fn)(void);
  /* Why the case runs on the host platform only; NULL: everywhere. */
  const char *host_only;
} soak_case;

/* On cuda a stream's handle is the driver's, and a call that begins after
 * the stream is gone passes it to the driver, where a destroyed stream is
 * undefined (it crashed in cuLaunchHostFunc on an H200); the host platform
 * knows its streams and answers INVALID_VALUE. */
#define DRIVER_HANDLES "a destroyed stream's handle is the driver's to judge"

static const soak_case cases[] = {
    {"current_pool_destroyed", test_current_pool_destroyed, NULL},
    {"pool_handle_destroyed", test_pool_handle_destroyed, NULL},
    {"event_destroyed", test_event_destroyed, NULL},
    {"free_races_destroy", test_free_races_destroy, NULL},
    {"set_current_races_destroy", test_set_current_races_destroy, NULL},
    {"ipc_races_destroy", test_ipc_races_destroy, NULL},
    {"pools_churn", test_pools_churn, NULL},
    {"stream_destroyed", test_stream_destroyed, DRIVER_HANDLES},
    {"graph_destroyed", test_graph_destroyed, NULL},
    {"export_double_free", test_export_double_free, NULL},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* Whether `name` is an entry of the comma-separated `list`. */
static bool listed(const char *list, const char *name) {
  size_t len = strlen(name);
  while (list && *list) {
    size_t n = strcspn(list, ",");
    if (n == len && strncmp(list, name, len) == 0)
      return true;
    list += n;
    if (*list == ',')
      list++;
  }
  return false;
}

int main(int argc, char **argv) {
  const char *only = NULL;
  int argi = 1;
  if (argc > 2 && strcmp(argv[1], "--case") == 0) {
    only = argv[2];
    argi = 3;
  }
  const char *seed_text = argi < argc ? argv[argi] : getenv("TP_SOAK_SEED");
  seed = seed_text && *seed_text ? strtoull(seed_text, NULL, 0) : DEFAULT_SEED;
  const char *secs = getenv("TP_SOAK_SECONDS");
  double total = secs && *secs ? strtod(secs, NULL) : 6.0;
  if (!(total > 0))
    total = 6.0;
  case_seconds = only ? total : total / (double)NCASES;
  const char *platform = tp_platform_name();
  REQUIRE_EXIT(platform != NULL);
  printf("test_soak: seed 0x%016" PRIx64 " (rerun with TP_SOAK_SEED=0x%" PRIx64
         "), %.1f s per case, platform %s\n",
         seed, seed, case_seconds, platform);
  fflush(stdout);
  /* The default pool and the legacy stream exist before any case, so that
   * the leak checks compare like with like. */
  tp_pool_t def = NULL;
  REQUIRE_OK_EXIT(tp_device_get_default_mem_pool(&def, 0));
  REQUIRE_OK_EXIT(tp_stream_synchronize(NULL));
  /* TP_SOAK_SKIP: comma-separated case names left out, reported as such
   * (for a case whose finding is open). */
  const char *skip = getenv("TP_SOAK_SKIP");
  int ran = 0;
  for (size_t i = 0; i < NCASES; i++) {
    if (only && strcmp(only, cases[i].name) != 0)
      continue;
    bool skipped = listed(skip, cases[i].name);
    if (skipped) {
      printf("== %s\n   %s: skipped (TP_SOAK_SKIP)\n", cases[i].name,
             cases[i].name);
      ran++;
      continue;
    }
    if (cases[i].host_only && !check_on_host()) {
      printf("== %s\n   %s: skipped on %s (%s)\n", cases[i].name, cases[i].name,
             platform, cases[i].host_only);
      ran++;
      continue;
    }
    atomic_store(&reports, 0);
    check_run_(cases[i].name, cases[i].fn);
    ran++;
  }
  if (!ran) {
    printf("no case named %s\n", only);
    return 2;
  }
  return check_done();
}
