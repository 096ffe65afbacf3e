/* conformance_reuse: which freed memory a stream may take, under each reuse
 * policy, as one table of scenarios (policies, how the free stands toward
 * the allocating stream, what the allocation must do) run by one function,
 * for small and large blocks alike. */
#include "conformance.h"

/* ========================================================================
 * Making reuse observable
 *
 * A pool with room to spare may answer a request from fresh memory rather
 * than from the block a test freed, so "the block was reused" is only an
 * observable rule when the freed block is the pool's only free memory. A
 * scenario therefore fills a pool capped by max_size with blocks of one
 * size, frees one of them (X), and asks again: the answer is X when a
 * policy allows reuse, and OUT_OF_MEMORY when none does (OOM_WAIT is off
 * unless the scenario is about it, so the pool may not wait on the host for
 * the pending free). The release threshold is UINT64_MAX so that no
 * synchronize unmaps X's memory.
 *
 * Whether a stream's work waits is seen through device work (a memset)
 * and tp_stream_query, not only through host functions: on cuda the host
 * functions of all streams run on one driver thread, which a held stream's
 * gate occupies, so no host function of another stream runs while a gate
 * is closed there.
 * ======================================================================== */

/* The reuse policies, as a scenario names them. */
enum {
  FOLLOW = 1,        /* TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES */
  OPPORTUNISTIC = 2, /* TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC */
  INTERNAL = 4,      /* TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES */
  ALL = 7,           /* the driver's default */
  OOM_WAIT = 8,      /* TP_POOL_ATTR_OOM_WAIT */
};

typedef struct full_pool {
  tp_pool_t pool;
  size_t size;
  void **blocks; /* live blocks; NULL where the test freed one */
  int n;
} full_pool_t;

/* Creates a capped pool with the given policies and fills it with blocks of
 * `size` on `filler`. Returns 0 (with a failure counted) when the pool
 * cannot be set up. */
static int fp_make(full_pool_t *fp, size_t size, unsigned policies,
                   tp_stream_t filler) {
  memset(fp, 0, sizeof *fp);
  fp->size = size;
  uint64_t chunk = chunk_of(default_pool());
  if (!CHECK(chunk > 0 && chunk < ((uint64_t)1 << 40)))
    return 0;
  /* Room for at least eight blocks and two chunks: enough for the tests
   * to pick X and Y, few enough for small blocks to fill quickly. */
  uint64_t want =
      8 * (uint64_t)size > 2 * chunk ? 8 * (uint64_t)size : 2 * chunk;
  size_t cap = (size_t)round_up(want, chunk);
  fp->pool = device_pool(cap);
  if (!fp->pool)
    return 0;
  set_u64(fp->pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set_int(fp->pool, TP_POOL_ATTR_OOM_WAIT, !!(policies & OOM_WAIT));
  set_policies(fp->pool, !!(policies & FOLLOW), !!(policies & OPPORTUNISTIC),
               !!(policies & INTERNAL));
  int max_blocks = (int)(cap / size) + 1;
  fp->blocks = calloc((size_t)max_blocks, sizeof *fp->blocks);
  if (!CHECK(fp->blocks != NULL))
    return 0;
  for (;;) {
    void *p = NULL;
    tp_error_t err = tp_malloc_from_pool_async(&p, size, fp->pool, filler);
    if (err == TP_ERROR_OUT_OF_MEMORY)
      break;
    if (!CHECK_OK(err))
      return 0;
    if (fp->n == max_blocks) {
      /* More blocks than max_size holds: the cap is not enforced. */
      CHECK_FAIL("a pool capped at %zu bytes gave more than %d blocks of %zu",
                 cap, max_blocks, size);
      CHECK_OK(tp_free_async(p, filler));
      break;
    }
    fp->blocks[fp->n++] = p;
  }
  CHECK_EQ_U64(used_of(fp->pool), (uint64_t)fp->n * size);
  CHECK(reserved_of(fp->pool) <= cap);
  CHECK_OK(tp_stream_synchronize(filler));
  return CHECK(fp->n >= 3);
}

/* Frees block i on `s`; the caller keeps its address to recognise it. */
static void *fp_free(full_pool_t *fp, int i, tp_stream_t s) {
  void *x = fp->blocks[i];
  CHECK_OK(tp_free_async(x, s));
  fp->blocks[i] = NULL;
  return x;
}

/* Allocates on `s` and expects block i's address `x` back. */
static void fp_expect_reuse(full_pool_t *fp, int i, void *x, tp_stream_t s) {
  void *p = NULL;
  tp_error_t err = tp_malloc_from_pool_async(&p, fp->size, fp->pool, s);
  if (!check_err_(__FILE__, __LINE__, "allocating the freed block's size", err,
                  TP_SUCCESS))
    return;
  if (check_eq_ptr_(__FILE__, __LINE__, "the block given", "the freed block", p,
                    x))
    fp->blocks[i] = p;
  else
    CHECK_OK(tp_free_async(p, s));
}

/* Allocates on `s` and expects no memory, at once: the only free block may
 * not be reused by `s` yet, and without OOM_WAIT the pool may not wait for
 * it (a wait would last until the gate's own timeout). */
static void fp_expect_none(full_pool_t *fp, void *x, tp_stream_t s) {
  void *p = NULL;
  double t0 = check_now_s();
  tp_error_t err = tp_malloc_from_pool_async(&p, fp->size, fp->pool, s);
  CHECK(check_now_s() - t0 < 5.0);
  if (CHECK_ERR(err, TP_ERROR_OUT_OF_MEMORY) || err != TP_SUCCESS)
    return;
  CHECK_FAIL("got %p (%s), which the policies forbid", p,
             p == x ? "the freed block" : "memory beyond max_size");
  CHECK_OK(tp_free_async(p, s));
}

/* Frees what is still live on `s`, checks that the pool is empty, and
 * destroys it. */
static void fp_release(full_pool_t *fp, tp_stream_t s) {
  check_context(NULL);
  if (fp->blocks)
    for (int i = 0; i < fp->n; i++)
      if (fp->blocks[i])
        CHECK_OK(tp_free_async(fp->blocks[i], s));
  CHECK_OK(tp_device_synchronize());
  if (fp->pool) {
    CHECK_EQ_U64(used_of(fp->pool), 0);
    CHECK_OK(tp_pool_destroy(fp->pool));
  }
  free(fp->blocks);
  memset(fp, 0, sizeof *fp);
}

/* ========================================================================
 * The scenarios
 * ======================================================================== */

/* The streams a scenario names. A, B and C are non-blocking, outside the
 * legacy stream's order; BA and BB are blocking: the legacy stream NULL
 * waits for them and they wait for it. */
enum { A, B, C, BA, BB, NUL, NSTREAMS };
static const char *const stream_names[NSTREAMS] = {"A",  "B",  "C",
                                                   "BA", "BB", "NULL"};

/* How the free of X on `free_on` stands toward the allocation on
 * `alloc_on` when the allocation is made. */
typedef enum order {
  PENDING,        /* free_on is held, so the free has not run */
  EVENT_RECORDED, /* held; an event recorded after the free, not waited on */
  EVENT_WAITED,   /* held; alloc_on waits on an event recorded after it */
  NULL_WORK,      /* held; work on the legacy stream queued after the free */
  SYNCHRONIZED,   /* tp_stream_synchronize(free_on) has returned */
  WAITER_SYNCED,  /* C waited on an event recorded after the free, and
                   * tp_stream_synchronize(C) has returned */
  QUERIED,        /* tp_stream_query(free_on) saw it complete; no synchronize */
  COMPLETED,      /* the free has run, which only the test knows: a host
                   * function queued after it raised a flag (alloc_on
                   * looked once while it was pending; see run_scenario) */
  BEHIND_WORK,    /* not held, but behind 200 ms of work on free_on */
} order_t;

/* What the allocation must do. */
typedef enum expect {
  REUSE,            /* X, and alloc_on's work runs without waiting */
  REUSE_AFTER_DEP,  /* X, and alloc_on's work waits for the held free */
  REUSE_COMPLETED,  /* Y, a block freed and synchronized before X, rather
                     * than X: no dependency, so alloc_on's work runs */
  NO_REUSE,         /* OUT_OF_MEMORY at once */
  OTHER_MEMORY,     /* in a pool with room: memory disjoint from X */
  REUSE_AFTER_WAIT, /* X, the pool having waited on the host for the free */
} expect_t;

typedef struct scenario {
  const char *name;
  unsigned policies; /* FOLLOW | OPPORTUNISTIC | INTERNAL | OOM_WAIT */
  int free_on, alloc_on;
  order_t order;
  expect_t expect;
} scenario_t;

static const scenario_t scenarios[] = {
    /* All policies off: only stream order allows reuse, until a
     * synchronize makes the free known complete to every stream. */
    {"no policies, room to spare: B gets other memory", 0, A, B, PENDING,
     OTHER_MEMORY},
    {"no policies: A reuses its own pending free", 0, A, A, PENDING,
     REUSE_AFTER_DEP},
    {"no policies: B may not reuse A's pending free", 0, A, B, PENDING,
     NO_REUSE},
    {"no policies: B may not reuse A's completed, unsynchronized free", 0, A, B,
     COMPLETED, NO_REUSE},
    {"no policies: B reuses after tp_stream_synchronize(A)", 0, A, B,
     SYNCHRONIZED, REUSE},
    /* A synchronize covers the work its stream waited for: CUDA makes
     * every free it guarantees complete reusable by all streams. */
    {"no policies: B reuses after a synchronize of C, which waited for A", 0, A,
     B, WAITER_SYNCED, REUSE},
    /* A free is reusable by another stream once it has completed, whether
     * or not anyone synchronized. */
    {"opportunistic: not reused while A is held", OPPORTUNISTIC, A, B, PENDING,
     NO_REUSE},
    {"opportunistic: reused after tp_stream_synchronize(A)", OPPORTUNISTIC, A,
     B, SYNCHRONIZED, REUSE},
    {"opportunistic: reused once A's work completed, unsynced", OPPORTUNISTIC,
     A, B, QUERIED, REUSE},
    {"opportunistic: reused once A's free ran, unsynced and unqueried",
     OPPORTUNISTIC, A, B, COMPLETED, REUSE},
    /* A stream that waits on an event recorded after a free may reuse the
     * block, even though the free has not run; its work then waits. */
    {"follow events: no reuse before B waits on the event", FOLLOW, A, B,
     EVENT_RECORDED, NO_REUSE},
    {"follow events: reused after tp_stream_wait_event", FOLLOW, A, B,
     EVENT_WAITED, REUSE_AFTER_DEP},
    /* Another stream may take a pending block, and the pool makes that
     * stream wait for the free. */
    {"internal dependencies: B reuses while A is held", INTERNAL, A, B, PENDING,
     REUSE_AFTER_DEP},
    /* All policies on, as the driver: given a pending free on a held
     * stream and a completed free of the same size, a third stream gets
     * the one that needs no dependency. */
    {"all policies: C gets the completed block Y, not X", ALL, A, C, PENDING,
     REUSE_COMPLETED},
    {"all policies: X is reusable after A synchronized", ALL, A, C,
     SYNCHRONIZED, REUSE},
    {"all policies: with X the only block, B takes it and waits", ALL, A, B,
     PENDING, REUSE_AFTER_DEP},
    /* The legacy default stream, with FOLLOW_EVENT_DEPENDENCIES only: NULL
     * waits for every blocking stream and every blocking stream waits for
     * NULL, so those frees are followed without events; non-blocking
     * streams are outside that order. */
    {"legacy: NULL reuses a free of held blocking BA", FOLLOW, BA, NUL, PENDING,
     REUSE_AFTER_DEP},
    {"legacy: blocking BB reuses a free of held NULL", FOLLOW, NUL, BB, PENDING,
     REUSE_AFTER_DEP},
    {"legacy: NULL may not reuse a free of held non-blocking A", FOLLOW, A, NUL,
     PENDING, NO_REUSE},
    {"legacy: NULL reuses a non-blocking free once synchronized", FOLLOW, A,
     NUL, SYNCHRONIZED, REUSE},
    /* Two blocking streams meet only through work on NULL. */
    {"legacy: blocking BB may not reuse held BA's free alone", FOLLOW, BA, BB,
     PENDING, NO_REUSE},
    {"legacy: BB reuses it once NULL work follows BA's free", FOLLOW, BA, BB,
     NULL_WORK, REUSE_AFTER_DEP},
    /* With internal dependencies the pool would take the pending block
     * without waiting, so the policies that leave only the host wait are
     * run: opportunistic alone, and none (the wait is a host-side
     * synchronization, after which a free is reusable by every stream). */
    {"OOM_WAIT: a full pool recovers by waiting (opportunistic only)",
     OOM_WAIT | OPPORTUNISTIC, A, B, BEHIND_WORK, REUSE_AFTER_WAIT},
    {"OOM_WAIT: a full pool recovers by waiting (no policies)", OOM_WAIT, A, B,
     BEHIND_WORK, REUSE_AFTER_WAIT},
};

typedef struct streams {
  tp_stream_t filler;
  tp_stream_t s[NSTREAMS];
} streams_t;

/* Checks that work queued on `s` after the reuse of `x` waits while the
 * free's stream is held by `g`, and runs once it is released. */
static void expect_waits(void *x, size_t size, tp_stream_t s, gate_t *g) {
  atomic_int flag = 0;
  /* Only a stream that took X owes the free a wait; otherwise the failure
   * is already counted. */
  if (x) {
    CHECK_OK(tp_memset_async(x, 0, size, s));
    check_sleep_ms(50);
    CHECK_ERR(tp_stream_query(s), TP_ERROR_NOT_READY);
  }
  CHECK_OK(tp_launch_host_func(s, raise_flag_fn, &flag));
  check_sleep_ms(50);
  if (x)
    CHECK_EQ_INT(atomic_load(&flag), 0);
  release(g);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_INT(atomic_load(&flag), 1);
}

/* A pool with room to spare: whatever the policies, a stream that may not
 * reuse a pending free gets memory elsewhere. */
static void run_roomy(const scenario_t *sc, size_t size, const streams_t *st) {
  tp_stream_t fs = st->s[sc->free_on], as = st->s[sc->alloc_on];
  tp_pool_t roomy = device_pool(0);
  if (!roomy)
    return;
  set_u64(roomy, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set_policies(roomy, !!(sc->policies & FOLLOW),
               !!(sc->policies & OPPORTUNISTIC), !!(sc->policies & INTERNAL));
  gate_t g;
  void *x = NULL, *y = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&x, size, roomy, fs));
  CHECK_OK(hold_stream(fs, &g));
  CHECK_OK(tp_free_async(x, fs));
  if (CHECK_OK(tp_malloc_from_pool_async(&y, size, roomy, as))) {
    CHECK(y != x);
    CHECK(!ranges_overlap(x, size, y, size));
    CHECK_OK(tp_free_async(y, as));
  }
  release(&g);
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_destroy(roomy));
}

/* Sets up one scenario in a full pool of blocks of `size`, makes the
 * allocation and checks what it did. */
static void run_scenario(const scenario_t *sc, size_t size,
                         const streams_t *st) {
  step("%zu B, %s (free on %s, allocate on %s)", size, sc->name,
       stream_names[sc->free_on], stream_names[sc->alloc_on]);
  if (sc->expect == OTHER_MEMORY) {
    run_roomy(sc, size, st);
    return;
  }
  tp_stream_t fs = st->s[sc->free_on], as = st->s[sc->alloc_on];
  full_pool_t fp;
  tp_event_t ev = NULL;
  gate_t g = {-1};
  if (!fp_make(&fp, size, sc->policies, st->filler))
    goto out;

  void *y = NULL;
  if (sc->expect == REUSE_COMPLETED) {
    y = fp_free(&fp, 1, st->filler);
    CHECK_OK(tp_stream_synchronize(st->filler));
  }
  int held = sc->order == PENDING || sc->order == EVENT_RECORDED ||
             sc->order == EVENT_WAITED || sc->order == NULL_WORK ||
             sc->order == COMPLETED || sc->order == WAITER_SYNCED;
  if (held && !CHECK_OK(hold_stream(fs, &g)))
    goto out;
  if (sc->order == BEHIND_WORK)
    CHECK_OK(tp_launch_host_func(fs, sleep_fn, (void *)(intptr_t)200));
  void *x = fp_free(&fp, 0, fs);
  switch (sc->order) {
  case EVENT_RECORDED:
  case EVENT_WAITED:
  case WAITER_SYNCED:
    ev = event_new();
    CHECK_OK(tp_event_record(ev, fs));
    if (sc->order == EVENT_WAITED)
      CHECK_OK(tp_stream_wait_event(as, ev, 0));
    if (sc->order == WAITER_SYNCED) {
      CHECK_OK(tp_stream_wait_event(st->s[C], ev, 0));
      release(&g);
      CHECK_OK(tp_stream_synchronize(st->s[C]));
    }
    break;
  case NULL_WORK: CHECK_OK(tp_memset_async(fp.blocks[1], 0, size, NULL)); break;
  case SYNCHRONIZED: CHECK_OK(tp_stream_synchronize(fs)); break;
  case QUERIED: CHECK_OK(check_poll_stream(fs, 5000)); break;
  case COMPLETED: {
    /* No query and no synchronize: only a policy that looks for completed
     * frees by itself can know that this one ran. tidepool dates frees with
     * platform events recorded lazily, at the first look for a pending
     * free, so alloc_on looks once while the free is held (and must get
     * nothing); the completed free is then found from that event. */
    atomic_int ran = 0;
    fp_expect_none(&fp, x, as);
    CHECK_OK(tp_launch_host_func(fs, raise_flag_fn, &ran));
    release(&g);
    double deadline = check_now_s() + 5.0;
    while (!atomic_load(&ran) && check_now_s() < deadline)
      check_sleep_us(200);
    /* Leaves the host function time to return before `ran` goes. */
    CHECK(atomic_load(&ran));
    check_sleep_ms(5);
    break;
  }
  default: break;
  }

  switch (sc->expect) {
  case REUSE:
    fp_expect_reuse(&fp, 0, x, as);
    if (fp.blocks[0]) {
      CHECK_OK(tp_memset_async(x, 0, size, as));
      CHECK_OK(check_poll_stream(as, 5000));
    }
    break;
  case REUSE_AFTER_DEP:
    fp_expect_reuse(&fp, 0, x, as);
    expect_waits(fp.blocks[0], size, as, &g);
    break;
  case REUSE_COMPLETED:
    /* Checked while the free's stream is still held. */
    fp_expect_reuse(&fp, 1, y, as);
    if (fp.blocks[1]) {
      CHECK_OK(tp_memset_async(y, 0, size, as));
      CHECK_OK(check_poll_stream(as, 5000));
    }
    break;
  case NO_REUSE: fp_expect_none(&fp, x, as); break;
  case REUSE_AFTER_WAIT:
    fp_expect_reuse(&fp, 0, x, as);
    /* No policy lets the stream take a pending block, so the free must
     * have completed before the allocation returned. */
    CHECK_OK(tp_stream_query(fs));
    break;
  default: CHECK_FAIL("scenario with no expectation"); break;
  }

out:
  release(&g);
  CHECK_OK(tp_device_synchronize());
  if (ev)
    CHECK_OK(tp_event_destroy(ev));
  fp_release(&fp, st->filler);
}

static void reuse_scenarios(size_t size) {
  streams_t st;
  memset(&st, 0, sizeof st);
  st.filler = stream_new(TP_STREAM_NON_BLOCKING);
  st.s[A] = stream_new(TP_STREAM_NON_BLOCKING);
  st.s[B] = stream_new(TP_STREAM_NON_BLOCKING);
  st.s[C] = stream_new(TP_STREAM_NON_BLOCKING);
  st.s[BA] = stream_new(TP_STREAM_DEFAULT);
  st.s[BB] = stream_new(TP_STREAM_DEFAULT);
  st.s[NUL] = NULL;
  if (st.filler && st.s[A] && st.s[B] && st.s[C] && st.s[BA] && st.s[BB]) {
    size_t n = sizeof scenarios / sizeof scenarios[0];
    for (size_t i = 0; i < n; i++) {
      int before = check_failure_count();
      run_scenario(&scenarios[i], size, &st);
      release_all_gates();
      check_context(NULL);
      printf("   %s: %zu B, %s\n",
             check_failure_count() == before ? "ok  " : "FAIL", size,
             scenarios[i].name);
    }
  }
  check_context(NULL);
  stream_done(st.filler);
  for (int i = 0; i < NSTREAMS; i++)
    if (i != NUL)
      stream_done(st.s[i]);
}

static void test_reuse_small(void) {
  reuse_scenarios(1000);
}

static void test_reuse_large(void) {
  reuse_scenarios(4 * MiB);
}

/* Whether p is one of v[0..n). */
static int among(void *const *v, int n, const void *p) {
  for (int i = 0; i < n; i++)
    if (v[i] == p)
      return 1;
  return 0;
}

/* Bursts: two held streams each free many small blocks of one size, which
 * stay pending; a burst of allocations on one of them may take its own
 * frees (stream order), never the other's while no policy allows it, and
 * every block handed out is distinct from every live one. Freed blocks of
 * a burst leave the pool in batches (slabs.c), which must not sweep up the
 * other stream's frees with the taker's own. */
static void test_reuse_burst(void) {
  enum { N = 600 };
  const size_t size = 1000;
  tp_pool_t pool = device_pool(0);
  REQUIRE(pool != NULL);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  set_policies(pool, 0, 0, 0);
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  static void *va[N], *vb[N], *again[N];
  for (int i = 0; i < N; i++) {
    REQUIRE_OK(tp_malloc_from_pool_async(&va[i], size, pool, a));
    REQUIRE_OK(tp_malloc_from_pool_async(&vb[i], size, pool, b));
  }
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_OK(tp_stream_synchronize(b));
  gate_t ga, gb;
  REQUIRE_OK(hold_stream(a, &ga));
  REQUIRE_OK(hold_stream(b, &gb));
  /* Interleaved, so that the pool's pending blocks of the two streams lie
   * side by side. */
  for (int i = 0; i < N; i++) {
    CHECK_OK(tp_free_async(va[i], a));
    CHECK_OK(tp_free_async(vb[i], b));
  }
  int foreign = 0, twice = 0;
  for (int i = 0; i < N; i++) {
    if (!CHECK_OK(tp_malloc_from_pool_async(&again[i], size, pool, b)))
      break;
    foreign += among(va, N, again[i]);
    twice += among(again, i, again[i]);
  }
  if (foreign)
    CHECK_FAIL("%d of %d blocks allocated on b were a's pending frees", foreign,
               N);
  CHECK_EQ_INT(twice, 0);
  CHECK_EQ_U64(used_of(pool), (uint64_t)N * size);
  for (int i = 0; i < N; i++)
    CHECK_OK(tp_free_async(again[i], b));
  release(&ga);
  release(&gb);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_U64(used_of(pool), 0);
  stream_done(a);
  stream_done(b);
  CHECK_OK(tp_pool_destroy(pool));
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_reuse_small),
      CONFORMANCE_TEST(test_reuse_large),
      CONFORMANCE_TEST(test_reuse_burst),
  };
  return conformance_main(argc, argv, "reuse", tests, CONFORMANCE_COUNT(tests));
}
