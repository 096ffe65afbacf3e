/* test_capture_chaos: seeded random captures checked against a small model.
 * Each round begins a capture on one of a few streams, forks other streams
 * into it through events, allocates, frees and writes graph memory and a
 * buffer on its members, joins some of them back, and ends it: the end must
 * succeed exactly when every fork's work flows into the origin (else
 * STREAM_CAPTURE_UNJOINED, as the driver answers; now and then the end is
 * tried on a fork first, which invalidates the capture, or from another
 * thread, which ends it without a graph unless it is relaxed). A graph that
 * ends well is instantiated and launched, and the buffer must then hold what
 * each stream wrote last; graph allocations it did not free outlive the launch
 * and are freed once afterwards. Pool memory freed during a capture is
 * refused, and the capture goes on. At the end the pool holds only the buffer
 * and graph memory goes back to zero. Threads (TP_CHAOS_THREADS, default 2)
 * run such rounds at once, each on streams of its own. Runs on host and on
 * cuda; TP_CHAOS_SEED or the first argument chooses the seed, TP_CHAOS_ROUNDS
 * the number of rounds. */
#include <pthread.h>
#include <stdbool.h>

#include "check.h"

#define NS 4         /* streams */
#define REGION 256   /* bytes of the buffer each stream writes */
#define MAXPTRS 64   /* graph allocations live in one capture */
#define MAXEVENTS 64 /* events made in one capture */
#define MAXNODES 256 /* work items the model follows in one capture */
#define WORDS (MAXNODES / 64)

/* The work a position comes after, as a set of the capture's work items. */
typedef struct nodeset {
  uint64_t w[WORDS];
} nodeset;

typedef struct gptr {
  void *p;
  int stream; /* where it was allocated, and is freed */
  size_t size;
} gptr;

typedef struct round_state {
  tp_stream_t *s;
  int origin;
  bool member[NS];
  nodeset pos[NS]; /* what each stream's next work comes after */
  int nnodes;      /* work items so far */
  unsigned char wrote[NS];
  bool has_write[NS];
  gptr ptrs[MAXPTRS];
  int nptrs;
  tp_event_t ev[MAXEVENTS];
  int nev;
  void *out;
  void *pool_ptr; /* pool memory allocated before the capture */
} round_state;

static uint64_t graph_used(void) {
  uint64_t v = UINT64_MAX;
  CHECK_OK(tp_device_get_graph_mem_attribute(
      0, TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v));
  return v;
}

/* An event recorded on `from` and waited on by `to`: `to` joins the capture
 * (or moves on), and what `from` did so far now comes before `to`'s next
 * work. */
static void link(round_state *r, int from, int to) {
  if (r->nev == MAXEVENTS)
    return;
  tp_event_t e = NULL;
  if (!CHECK_OK(tp_event_create(&e)))
    return;
  r->ev[r->nev++] = e;
  CHECK_OK(tp_event_record(e, r->s[from]));
  CHECK_OK(tp_stream_wait_event(r->s[to], e, 0));
  r->member[to] = true;
  for (int i = 0; i < WORDS; i++)
    r->pos[to].w[i] |= r->pos[from].w[i];
}

/* Whether the capture has room for one more work item. */
static bool room(const round_state *r) {
  return r->nnodes < MAXNODES;
}

/* A work item on stream m: a node of the graph, which comes after m's
 * position and before m's next work. */
static void work_on(round_state *r, int m) {
  int k = r->nnodes++;
  r->pos[m].w[k / 64] |= UINT64_C(1) << (k % 64);
}

/* The end succeeds when every work item comes before the origin's end. */
static bool all_joined(const round_state *r) {
  for (int k = 0; k < r->nnodes; k++)
    if (!((r->pos[r->origin].w[k / 64] >> (k % 64)) & 1))
      return false;
  return true;
}

static int pick_member(round_state *r, check_rng *rng) {
  int m;
  do
    m = (int)rng_below(rng, NS);
  while (!r->member[m]);
  return m;
}

static void one_op(round_state *r, check_rng *rng) {
  int m = pick_member(r, rng);
  if (!room(r))
    return;
  switch (rng_below(rng, 7)) {
  case 0: { /* fork a stream in, or move one member behind another */
    int n = (int)rng_below(rng, NS);
    if (n != m && n != r->origin)
      link(r, m, n);
    break;
  }
  case 1: /* a fork joins the origin */
    if (m != r->origin)
      link(r, m, r->origin);
    break;
  case 2: { /* a graph allocation */
    if (r->nptrs == MAXPTRS)
      break;
    size_t size = rng_chance(rng, 50) ? (size_t)rng_range(rng, 1, 64 << 10)
                                      : (size_t)rng_range(rng, 1, 4 << 20);
    void *p = NULL;
    if (!CHECK_OK(tp_malloc_async(&p, size, r->s[m])))
      break;
    r->ptrs[r->nptrs++] = (gptr){p, m, size};
    work_on(r, m);
    break;
  }
  case 3: /* a graph allocation of this stream freed on it */
    for (int i = 0; i < r->nptrs; i++)
      if (r->ptrs[i].stream == m) {
        CHECK_OK(tp_free_async(r->ptrs[i].p, r->s[m]));
        r->ptrs[i] = r->ptrs[--r->nptrs];
        work_on(r, m);
        break;
      }
    break;
  case 4: { /* the stream writes its region of the buffer */
    unsigned char v = (unsigned char)rng_range(rng, 1, 255);
    CHECK_OK(tp_memset_async((char *)r->out + m * REGION, v, REGION, r->s[m]));
    r->wrote[m] = v;
    r->has_write[m] = true;
    work_on(r, m);
    break;
  }
  case 5: { /* pool memory may not be freed in a capture, which goes on */
    CHECK_ERR(tp_free_async(r->pool_ptr, r->s[m]), TP_ERROR_INVALID_VALUE);
    tp_capture_status_t st = TP_CAPTURE_STATUS_NONE;
    CHECK_OK(tp_stream_is_capturing(r->s[m], &st));
    CHECK_EQ_INT(st, TP_CAPTURE_STATUS_ACTIVE);
    break;
  }
  default: /* graph memory written where it was allocated */
    for (int i = 0; i < r->nptrs; i++)
      if (r->ptrs[i].stream == m) {
        size_t n = r->ptrs[i].size < 4096 ? r->ptrs[i].size : 4096;
        CHECK_OK(tp_memset_async(r->ptrs[i].p, 0x33, n, r->s[m]));
        work_on(r, m);
        break;
      }
    break;
  }
}

/* Copies the buffer out and checks the regions the graph wrote. */
static void check_buffer(const round_state *r, tp_stream_t s,
                         const unsigned char *expect, const bool *known) {
  unsigned char host[NS * REGION];
  CHECK_OK(tp_memcpy_async(host, r->out, sizeof host, s));
  CHECK_OK(tp_stream_synchronize(s));
  for (int m = 0; m < NS; m++) {
    if (!known[m])
      continue;
    for (int i = 0; i < REGION; i++)
      if (host[m * REGION + i] != expect[m]) {
        CHECK_FAIL("stream %d's region byte %d is 0x%02x, expected 0x%02x", m,
                   i, host[m * REGION + i], expect[m]);
        return;
      }
  }
}

typedef struct worker {
  uint64_t seed;
  int rounds;
  bool one_thread; /* global mode only then: see worker_main */
  int ended, unjoined, unmatched, launches, outlived, wrong_thread;
} worker;

/* One thread's rounds, on streams and a buffer of its own. */
static void *worker_main(void *arg) {
  worker *w = arg;
  check_rng rng = {w->seed};
  int rounds = w->rounds;
  tp_stream_t s[NS];
  for (int i = 0; i < NS; i++)
    if (!CHECK_OK(tp_stream_create(&s[i], TP_STREAM_NON_BLOCKING)))
      return NULL;
  void *out = NULL;
  if (!CHECK_OK(tp_malloc_async(&out, NS * REGION, s[0])) ||
      !CHECK_OK(tp_memset_async(out, 0, NS * REGION, s[0])) ||
      !CHECK_OK(tp_stream_synchronize(s[0])))
    return NULL;
  unsigned char expect[NS] = {0};
  bool known[NS] = {true, true, true, true};
  int ended = 0, unjoined = 0, unmatched = 0, launches = 0, outlived = 0;
  int wrong_thread = 0;
  for (int round = 0; round < rounds && check_failure_count() == 0; round++) {
    round_state r;
    memset(&r, 0, sizeof r);
    r.s = s;
    r.out = out;
    r.origin = (int)rng_below(&rng, NS);
    int pm = (int)rng_below(&rng, NS);
    if (!CHECK_OK(tp_malloc_async(&r.pool_ptr,
                                  (size_t)rng_range(&rng, 1, 3 << 20), s[pm])))
      break;
    r.member[r.origin] = true;
    /* A global capture refuses calls CUDA deems unsafe on every thread
     * (on cuda, a copy to pageable memory is one), so with other threads
     * at work only the thread-local and relaxed modes are drawn. */
    static const tp_capture_mode_t modes[3] = {TP_CAPTURE_MODE_THREAD_LOCAL,
                                               TP_CAPTURE_MODE_RELAXED,
                                               TP_CAPTURE_MODE_GLOBAL};
    tp_capture_mode_t mode = modes[rng_below(&rng, w->one_thread ? 3 : 2)];
    if (!CHECK_OK(tp_stream_begin_capture(s[r.origin], mode)))
      break;
    int ops = (int)rng_range(&rng, 1, 24);
    for (int i = 0; i < ops; i++)
      one_op(&r, &rng);
    /* What is still allocated is mostly freed where it was made; the rest
     * outlives the graph's launches (a fork that only allocated must join
     * back all the same). Then, most of the time, every fork joins the
     * origin. */
    int kept = 0;
    for (int i = 0; i < r.nptrs; i++) {
      if (rng_chance(&rng, 30)) {
        r.ptrs[kept++] = r.ptrs[i];
        continue;
      }
      CHECK_OK(tp_free_async(r.ptrs[i].p, s[r.ptrs[i].stream]));
      work_on(&r, r.ptrs[i].stream);
    }
    r.nptrs = kept;
    if (rng_chance(&rng, 70))
      for (int m = 0; m < NS; m++)
        if (r.member[m] && m != r.origin)
          link(&r, m, r.origin);
    bool expect_unjoined = !all_joined(&r);

    tp_graph_t graph = (tp_graph_t)&graph;
    int fork = -1;
    for (int m = 0; m < NS && rng_chance(&rng, 10); m++)
      if (r.member[m] && m != r.origin)
        fork = m;
    if (fork >= 0) {
      /* Ending on a stream that joined invalidates the capture. */
      CHECK_ERR(tp_stream_end_capture(s[fork], &graph),
                TP_ERROR_STREAM_CAPTURE_UNMATCHED);
      CHECK(graph == NULL);
      graph = (tp_graph_t)&graph;
      CHECK_ERR(tp_stream_end_capture(s[r.origin], &graph),
                TP_ERROR_STREAM_CAPTURE_INVALIDATED);
      CHECK(graph == NULL);
      unmatched++;
    } else if (rng_chance(&rng, 8) && mode != TP_CAPTURE_MODE_RELAXED) {
      /* Ended from another thread: the capture ends, with no graph; a fork
       * left unjoined is the answer then (the driver on an H200). */
      CHECK_ERR(check_end_capture_elsewhere(s[r.origin], &graph),
                expect_unjoined ? TP_ERROR_STREAM_CAPTURE_UNJOINED
                                : TP_ERROR_STREAM_CAPTURE_WRONG_THREAD);
      CHECK(graph == NULL);
      wrong_thread++;
    } else {
      /* A relaxed capture may be ended from any thread. */
      bool away = mode == TP_CAPTURE_MODE_RELAXED && rng_chance(&rng, 20);
      tp_error_t err = away ? check_end_capture_elsewhere(s[r.origin], &graph)
                            : tp_stream_end_capture(s[r.origin], &graph);
      if (expect_unjoined) {
        CHECK_ERR(err, TP_ERROR_STREAM_CAPTURE_UNJOINED);
        CHECK(graph == NULL);
        unjoined++;
      } else {
        CHECK_OK(err);
        CHECK(graph != NULL);
        ended++;
      }
    }
    for (int m = 0; m < NS; m++) {
      tp_capture_status_t st = TP_CAPTURE_STATUS_ACTIVE;
      CHECK_OK(tp_stream_is_capturing(s[m], &st));
      CHECK_EQ_INT(st, TP_CAPTURE_STATUS_NONE);
    }
    for (int i = 0; i < r.nev; i++)
      CHECK_OK(tp_event_destroy(r.ev[i]));
    if (graph && graph != (tp_graph_t)&graph && !expect_unjoined) {
      tp_graph_exec_t exec = NULL;
      unsigned long long flags =
          rng_chance(&rng, 50) ? TP_GRAPH_INSTANTIATE_AUTO_FREE_ON_LAUNCH : 0;
      if (CHECK_OK(tp_graph_instantiate(&exec, graph, flags))) {
        /* Allocations that outlive a launch must be freed before the next
         * one, unless the exec frees them itself at each launch. */
        int n = flags || r.nptrs == 0 ? (int)rng_range(&rng, 1, 3) : 1;
        tp_stream_t on = s[rng_below(&rng, NS)];
        for (int i = 0; i < n; i++)
          CHECK_OK(tp_graph_launch(exec, on));
        CHECK_OK(tp_stream_synchronize(on));
        launches += n;
        if (!flags && r.nptrs)
          CHECK_ERR(tp_graph_launch(exec, on), TP_ERROR_INVALID_VALUE);
        for (int i = 0; i < r.nptrs; i++) {
          CHECK_OK(tp_memset_async(r.ptrs[i].p, 0x44, 1, on));
          CHECK_OK(tp_free_async(r.ptrs[i].p, on));
          CHECK_ERR(tp_free_async(r.ptrs[i].p, on), TP_ERROR_INVALID_VALUE);
          outlived++;
        }
        CHECK_OK(tp_stream_synchronize(on));
        for (int m = 0; m < NS; m++)
          if (r.has_write[m])
            expect[m] = r.wrote[m];
        check_buffer(&r, on, expect, known);
        if (rng_chance(&rng, 50)) {
          CHECK_OK(tp_graph_exec_destroy(exec));
          CHECK_OK(tp_graph_destroy(graph));
        } else {
          CHECK_OK(tp_graph_destroy(graph));
          CHECK_OK(tp_graph_exec_destroy(exec));
        }
      } else {
        CHECK_OK(tp_graph_destroy(graph));
      }
    }
    /* The pool memory the capture could not free is freed now. */
    CHECK_OK(tp_free_async(r.pool_ptr, s[pm]));
    /* Pool work outside captures in between. */
    if (rng_chance(&rng, 30)) {
      void *p = NULL;
      int m = (int)rng_below(&rng, NS);
      if (CHECK_OK(
              tp_malloc_async(&p, (size_t)rng_range(&rng, 1, 8 << 20), s[m])))
        CHECK_OK(tp_free_async(p, s[m]));
    }
  }
  for (int m = 0; m < NS; m++)
    CHECK_OK(tp_stream_synchronize(s[m]));
  CHECK_OK(tp_free_async(out, s[0]));
  for (int m = 0; m < NS; m++) {
    CHECK_OK(tp_stream_synchronize(s[m]));
    CHECK_OK(tp_stream_destroy(s[m]));
  }
  w->ended = ended;
  w->unjoined = unjoined;
  w->unmatched = unmatched;
  w->wrong_thread = wrong_thread;
  w->launches = launches;
  w->outlived = outlived;
  return NULL;
}

int main(int argc, char **argv) {
  const char *env = getenv("TP_CHAOS_SEED");
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0)
                  : env    ? strtoull(env, NULL, 0)
                           : UINT64_C(0xc4a05);
  const char *rounds_env = getenv("TP_CHAOS_ROUNDS");
  const char *threads_env = getenv("TP_CHAOS_THREADS");
  int rounds = rounds_env ? atoi(rounds_env) : 400;
  int nthreads = threads_env ? atoi(threads_env) : 2;
  if (nthreads < 1 || nthreads > 16)
    nthreads = 2;
  printf("test_capture_chaos on %s, seed 0x%" PRIx64
         ", %d rounds on each of %d threads\n",
         tp_platform_name(), seed, rounds, nthreads);
  tp_pool_t pool = NULL;
  REQUIRE_OK_EXIT(tp_device_get_mem_pool(&pool, 0));
  uint64_t used0 = 0;
  REQUIRE_OK_EXIT(
      tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &used0));
  worker w[16];
  pthread_t th[16];
  for (int t = 0; t < nthreads; t++) {
    w[t] = (worker){.seed = seed + (uint64_t)t * 0x9E3779B97F4A7C15ull,
                    .rounds = rounds,
                    .one_thread = nthreads == 1};
    REQUIRE_EXIT(pthread_create(&th[t], NULL, worker_main, &w[t]) == 0);
  }
  int ended = 0, unjoined = 0, unmatched = 0, launches = 0, outlived = 0;
  int wrong_thread = 0;
  for (int t = 0; t < nthreads; t++) {
    pthread_join(th[t], NULL);
    ended += w[t].ended;
    unjoined += w[t].unjoined;
    unmatched += w[t].unmatched;
    launches += w[t].launches;
    outlived += w[t].outlived;
    wrong_thread += w[t].wrong_thread;
  }
  uint64_t used = UINT64_MAX;
  CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &used));
  CHECK_EQ_U64(used, used0);
  CHECK_OK(tp_device_graph_mem_trim(0));
  /* On cuda the driver gives a graph's memory back when it runs the user
   * object's destructor, a little after the last launch completed. */
  double deadline = check_now_s() + 5.0;
  while (graph_used() != 0 && check_now_s() < deadline)
    check_sleep_ms(2);
  CHECK_EQ_U64(graph_used(), 0);
  printf("%d graphs launched %d times (%d allocations outlived them), %d "
         "unjoined ends, %d ended on a fork, %d from another thread\n",
         ended, launches, outlived, unjoined, unmatched, wrong_thread);
  CHECK(ended > 0 && unjoined > 0);
  return check_done();
}
