/* fuzz_api: a model-based fuzzer of tidepool's public API on the host
 * platform, or on the cuda platform over the fake driver (below). The input
 * bytes are a program of API calls (pools, streams, events, gates that hold
 * streams, allocation and free on many streams, policies, thresholds, trims,
 * access, bad input, IPC records), and after every call a small model of
 * include/tidepool.h's promises is checked: no overlap of live blocks, no
 * reuse before a free's work completed unless a policy allows it, block
 * contents intact, exact used figures, reserved at least used, reserved down
 * to the threshold at a synchronize, every error code, and nothing left
 * behind once everything is destroyed.
 *
 * The entry point is LLVMFuzzerTestOneInput; libFuzzer drives it (TP_FUZZ=ON
 * with clang), and fuzz_replay.c runs the corpus through it in every build.
 * A finding prints the program that led to it and aborts. TP_FUZZ_TRACE=1
 * prints every call as it runs; TP_FUZZ_SKIP=name,... looks past findings
 * still open (findings/README.md names them).
 *
 * With TIDEPOOL_PLATFORM=cuda in the environment it runs on the cuda
 * platform instead, over the fake driver (test/fake_cuda, found through
 * LD_LIBRARY_PATH) with the same two devices of 32 MiB; it refuses a real
 * driver, whose devices the model does not describe. There the access faults
 * of op_fault are left out (on a GPU they end the context) and the leak
 * checks count the fake's objects instead of the host platform's. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fuzz_api.h"
#include "platform/host/host_internal.h"
#include "platform/host/host_testing.h"
#include "tidepool.h"

#define KiB ((size_t)1 << 10)
/* A descriptor as tp_pool_import_from_shareable_handle takes it: by value,
 * cast to a pointer, as the driver does. */
#define FD_HANDLE(fd) ((void *)(uintptr_t)(fd))
#define MiB ((size_t)1 << 20)

/* The emulated machine: two devices of 32 MiB, so that out-of-memory and
 * peer access are reachable in a few calls. */
#define NDEV 2
#define DEVICE_MEMORY (32 * MiB)
#define DEVICE_MEMORY_TEXT "32M"

#define MAX_STREAMS                                                            \
  24 /* model streams per input, the two legacy ones first                     \
      */
#define MAX_LIVE_STREAMS 6
#define MAX_POOLS 16 /* model pools per input, the two default ones first */
#define MAX_LIVE_POOLS 6
#define MAX_BLOCKS 48
#define MAX_IMPORTS 16
#define MAX_EVENTS 8
#define MAX_ITEMS 2048
#define MAX_DEPS (MAX_STREAMS + 2)
#define MAX_GATES 48
#define MAX_FREED 512
#define MAX_HF 1024 /* host functions in flight */
#define LOG_LINES 256
#define DEADLOCK_S 10.0
#define SELF_OPEN_S 0.02

/* ========================================================================
 * Failure reporting: the program so far, then abort, which libFuzzer
 * records as a crash with the input that led to it.
 * ======================================================================== */

/* Whether the fuzzer runs on the cuda platform over the fake driver. */
static bool on_cuda;

static char log_lines[LOG_LINES][160];
static unsigned log_n;
static int trace_on;
/* Findings still open that a run looks past (TP_FUZZ_SKIP, parse_skip). */
static unsigned skip_mask;
enum { SKIP_LATE_WAIT = 0 };

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(log_lines[log_n % LOG_LINES], sizeof log_lines[0], fmt, ap);
  va_end(ap);
  if (trace_on)
    fprintf(stderr, "  %4u %s\n", log_n, log_lines[log_n % LOG_LINES]);
  log_n++;
}

static void dump_log(void) {
  unsigned from = log_n > LOG_LINES ? log_n - LOG_LINES : 0;
  fprintf(stderr, "---- the calls of this input (last %u of %u) ----\n",
          log_n - from, log_n);
  for (unsigned i = from; i < log_n; i++)
    fprintf(stderr, "  %4u %s\n", i, log_lines[i % LOG_LINES]);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)))
__attribute__((noreturn));
static void fail(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dump_log();
  fprintf(stderr, "FUZZ FINDING: %s\n", msg);
  fflush(stderr);
  abort();
}

static void expect_err(tp_error_t got, tp_error_t want, const char *what) {
  if (got != want)
    fail("%s returned %s, the header says %s", what, tp_error_name(got),
         tp_error_name(want));
}

static void expect_ok(tp_error_t got, const char *what) {
  expect_err(got, TP_SUCCESS, what);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ========================================================================
 * The watchdog: a call the model says cannot block, blocked for
 * DEADLOCK_S, is a finding; a call that may wait on the host for pending
 * frees (allocation with TP_POOL_ATTR_OOM_WAIT, an imported pool's destroy)
 * gets every closed gate opened after SELF_OPEN_S, and the model learns it.
 * ======================================================================== */

enum { CALL_NONE = 0, CALL_NO_WAIT = 1, CALL_MAY_WAIT = 2 };
static atomic_int call_kind;
static _Atomic double call_start;
static const char *_Atomic call_name;

/* A gate's shared state, recycled only once its host function has left. */
typedef struct gate_rt {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open, left, self_opened;
} gate_rt;
static gate_rt gates_rt[MAX_GATES];
static atomic_int gates_rt_busy[MAX_GATES];

static void gate_rt_open(gate_rt *g, bool self) {
  pthread_mutex_lock(&g->mu);
  if (!g->open) {
    g->open = 1;
    g->self_opened = self;
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
}

/* Held by the watchdog while it looks at the call and opens gates, and by
 * call_end: once a call has ended, the watchdog opens nothing more, so the
 * model learns every gate it opened (gates_sync_self_opened). Without it a
 * gate opened a moment after the call ended stayed closed in the model,
 * which then expected waits that could no longer happen (an input failing
 * one run in six to twenty: "s4 must wait ... but tp_stream_query says
 * TP_SUCCESS"). */
static pthread_mutex_t watchdog_mu = PTHREAD_MUTEX_INITIALIZER;

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&watchdog_mu);
    int kind = atomic_load(&call_kind);
    double since = now_s() - atomic_load(&call_start);
    if (kind == CALL_MAY_WAIT && since > SELF_OPEN_S) {
      for (int i = 0; i < MAX_GATES; i++)
        if (atomic_load(&gates_rt_busy[i]))
          gate_rt_open(&gates_rt[i], true);
    } else if (kind == CALL_NO_WAIT && since > DEADLOCK_S) {
      fail("%s has been blocked for %.0f s although the model says nothing "
           "it waits for is held",
           atomic_load(&call_name), since);
    }
    pthread_mutex_unlock(&watchdog_mu);
  }
  return NULL;
}

static void call_begin(int kind, const char *name) {
  atomic_store(&call_name, name);
  atomic_store(&call_start, now_s());
  atomic_store(&call_kind, kind);
}

static void call_end(void) {
  pthread_mutex_lock(&watchdog_mu);
  atomic_store(&call_kind, CALL_NONE);
  pthread_mutex_unlock(&watchdog_mu);
}

/* ========================================================================
 * Host functions: gates, and writes and checks of block contents in
 * stream order. A check that finds wrong bytes records the first failure,
 * which the main thread reports after the call it is in.
 * ======================================================================== */

static void gate_fn(void *arg) {
  gate_rt *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  g->left = 1;
  pthread_mutex_unlock(&g->mu);
  atomic_store(&gates_rt_busy[g - gates_rt], 0);
}

enum { HF_WRITE = 1, HF_CHECK = 2 };
typedef struct hf_rec {
  atomic_int busy;
  int kind;
  unsigned char *p;
  size_t size;
  unsigned char val;
  int block;
  unsigned op;
  int pool;
  unsigned gen, pgen;
} hf_rec;
/* Per block slot and per pool: bumped when the model stops knowing the
 * bytes of a block, or of every block a pool has had (freed ones with
 * checks queued included), which calls off the checks already queued. */
static atomic_uint block_gen[MAX_BLOCKS];
static atomic_uint pool_gen[MAX_POOLS];
static hf_rec hfs[MAX_HF];
static unsigned hf_next;

static pthread_mutex_t async_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int async_failed;
static char async_msg[512];

/* The first offset in [0, size) where p differs from val, or size. Large
 * blocks are sampled: their first and last 4 KiB and one byte per 4 KiB. */
static size_t find_bad(const unsigned char *p, size_t size, unsigned char val) {
  if (size <= 256 * KiB) {
    for (size_t i = 0; i < size; i++)
      if (p[i] != val)
        return i;
    return size;
  }
  for (size_t i = 0; i < 4 * KiB; i++)
    if (p[i] != val || p[size - 1 - i] != val)
      return p[i] != val ? i : size - 1 - i;
  for (size_t i = 4 * KiB; i < size; i += 4 * KiB - 1)
    if (p[i] != val)
      return i;
  return size;
}

static void hf_fn(void *arg) {
  hf_rec *h = arg;
  if (h->kind == HF_WRITE) {
    memset(h->p, h->val, h->size);
  } else if (atomic_load(&block_gen[h->block]) == h->gen &&
             atomic_load(&pool_gen[h->pool]) == h->pgen) {
    size_t bad = find_bad(h->p, h->size, h->val);
    if (bad < h->size) {
      pthread_mutex_lock(&async_mu);
      if (!atomic_load(&async_failed)) {
        snprintf(async_msg, sizeof async_msg,
                 "block %d (%p, %zu bytes), checked in stream order after "
                 "call %u: byte %zu is 0x%02x, expected 0x%02x",
                 h->block, (void *)h->p, h->size, h->op, bad, h->p[bad],
                 h->val);
        atomic_store(&async_failed, 1);
      }
      pthread_mutex_unlock(&async_mu);
    }
  }
  atomic_store(&h->busy, 0);
}

static hf_rec *hf_take(void) {
  for (unsigned k = 0; k < MAX_HF; k++) {
    hf_rec *h = &hfs[(hf_next + k) % MAX_HF];
    int expect = 0;
    if (atomic_compare_exchange_strong(&h->busy, &expect, 1)) {
      hf_next = (hf_next + k + 1) % MAX_HF;
      return h;
    }
  }
  return NULL;
}

static void check_async(void) {
  if (atomic_load(&async_failed)) {
    pthread_mutex_lock(&async_mu);
    char msg[512];
    memcpy(msg, async_msg, sizeof msg);
    pthread_mutex_unlock(&async_mu);
    fail("%s", msg);
  }
}

/* ========================================================================
 * The model
 * ======================================================================== */

/* Work queued on streams, as positions: an item completes when the items
 * it depends on have (its stream's previous item, the legacy stream's
 * implicit ordering, an event it waits for) and, for a gate, when the gate
 * opens. Items are what the model knows of stream order. */
typedef struct mitem {
  int stream; /* -1: a virtual item that belongs to no stream */
  int gate;   /* model gate, or -1 */
  int ndeps;
  int deps[MAX_DEPS];
  uint32_t event_edges; /* bit i: deps[i] came through an event */
  /* Bit i: deps[i] perhaps holds: a wait for an event whose work may have
   * completed queues nothing on the host platform, and so takes none of
   * the legacy stream's implicit dependencies. Such an edge can hold a
   * stream (synchronizes open its gates) and order it (reuse checks allow
   * it), but cannot prove it held (blocked_dfs and done_dfs skip it). */
  uint32_t maybe_edges;
  bool done; /* known complete: a synchronize or query said so */
  /* A position, not work: a free is no operation on its stream, so later
   * work waits for it on no stream; it completes when its deps have. */
  bool virt;
  int mem_pool, mem_pool2; /* pools a memset or memcpy touches, or -1 */
  unsigned stamp;
} mitem;

typedef struct mstream {
  tp_stream_t h; /* NULL for the legacy streams */
  int device;
  bool legacy, blocking, live;
  int tail;           /* the last item, or -1 */
  int fault;          /* 0: none, 1: an access fault is pending, 2: perhaps */
  uint32_t fault_gen; /* synchronizes that reported (cleared) its faults */
} mstream;

typedef struct mgate {
  int slot, stream, item;
  bool open;
} mgate;

typedef struct mevent {
  tp_event_t h;
  bool live;
  int device;
  int item; /* the recorded position, or -1 */
  /* The stream recorded on, its fault state then and its fault_gen: the
   * event reports that fault until the stream's synchronize does. */
  int stream, fault;
  uint32_t fault_gen;
} mevent;

typedef struct mpool {
  tp_pool_t h;
  bool live, is_default, imported, exportable;
  int exporter; /* imported: the exporting model pool */
  int device;   /* device of a device pool, else -1 */
  int loc_type; /* tp_location_type_t */
  int alloc_type;
  uint64_t max_size;
  uint64_t chunk;
  int follow, opp, internal, oom_wait;
  uint64_t threshold;
  tp_access_flags_t access[NDEV];
  uint64_t used; /* exact */
  uint64_t held; /* freed by the exporter, perhaps still held */
  uint64_t high_lo, high_hi;
} mpool;

typedef struct mblock {
  bool live; /* between its malloc and its free */
  bool held; /* freed by the exporter while an importer holds it */
  /* An importer let it go by destroying its pool while it was live: the
   * release may not have reached the exporter by its free. */
  bool release_in_flight;
  unsigned char *p;
  size_t size;
  int pool;
  int owner;         /* the stream its work is ordered on */
  int last_item;     /* the last item that touched it, or -1 */
  unsigned char val; /* its bytes, 0 when unknown */
  bool has_rec;
  tp_pool_ptr_export_data_t rec;
  int holds;     /* live imports */
  int free_item; /* held: the exporter's free */
  int hold_items[MAX_IMPORTS];
  int nhold_items;
} mblock;

typedef struct mimport {
  bool live;
  void *q;
  int block, ipool;
} mimport;

typedef struct mfreed {
  uintptr_t lo, hi;
  int pool, item, hold_item;
  /* The pool allowed opportunistic reuse at some time since the free: it
   * may have found the free complete then, and that stays known. */
  bool polled;
} mfreed;

static struct model {
  int cur_dev;
  int current[NDEV]; /* the current pool of each device */
  mstream streams[MAX_STREAMS];
  int nstreams;
  mpool pools[MAX_POOLS];
  int npools;
  mblock blocks[MAX_BLOCKS];
  mimport imports[MAX_IMPORTS];
  mevent events[MAX_EVENTS];
  int nevents;
  mgate gates[MAX_GATES];
  int ngates;
  mfreed freed[MAX_FREED];
  int nfreed;
  bool dev_fault_maybe[NDEV];
  unsigned char next_val;
  unsigned op;
  tp_event_t handoff[NDEV]; /* the fuzzer's own events for ordering */
  tp_stream_t dead_streams[8];
  int ndead_streams;
  tp_event_t dead_events[8];
  int ndead_events;
  uintptr_t dead_ptrs[16];
  int ndead_ptrs;
} M;

static mitem items[MAX_ITEMS];
static int nitems;
static unsigned stamp_now;

static tp_pool_t default_pool[NDEV];

/* The fake's count of its live objects (fake_cuda.c's fake_cuda_live). */
typedef void (*fake_live_fn)(unsigned long long *, unsigned long long *,
                             unsigned long long *, unsigned long long *,
                             unsigned long long *, int);
static fake_live_fn fake_live;
static unsigned char wild_buf[256];
static struct {
  uint32_t magic;
  int state;
  void *pool, *next;
} forged_pool = {0x7470706cu, 1, wild_buf, NULL};

/* ---- items -------------------------------------------------------------- */

/* The items a new op on stream s would wait for. */
static int next_deps(int s, int *out) {
  const mstream *m = &M.streams[s];
  int n = 0;
  if (m->tail >= 0)
    out[n++] = m->tail;
  if (m->legacy) {
    for (int t = 0; t < M.nstreams; t++) {
      const mstream *o = &M.streams[t];
      if (t != s && !o->legacy && o->blocking && o->device == m->device &&
          o->tail >= 0 && n < MAX_DEPS - 2)
        out[n++] = o->tail;
    }
  } else if (m->blocking) {
    const mstream *l = &M.streams[m->device];
    if (l->tail >= 0)
      out[n++] = l->tail;
  }
  return n;
}

/* What a synchronize or query of stream s covers. The host platform's wait
 * for what an event recorded now would cover (next_deps): the legacy
 * stream's covers the blocking streams' work, a blocking stream's the legacy
 * stream's later work. CUDA documents only the stream's own operations (the
 * legacy semantics order actions queued, and a synchronize queues none), and
 * the fake driver waits for those alone; there only the tail is known done. */
static int sync_roots(int s, int *out) {
  if (!on_cuda)
    return next_deps(s, out);
  int n = 0;
  if (M.streams[s].tail >= 0)
    out[n++] = M.streams[s].tail;
  return n;
}

static bool items_full(void) {
  return nitems >= MAX_ITEMS;
}

/* A new item on stream s (or a virtual one, s < 0, waiting for deps). */
static int item_new(int s, int gate, const int *extra, int nextra,
                    bool extra_event) {
  mitem *it = &items[nitems];
  memset(it, 0, sizeof *it);
  it->stream = s;
  it->gate = gate;
  it->mem_pool = it->mem_pool2 = -1;
  if (s >= 0)
    it->ndeps = next_deps(s, it->deps);
  for (int i = 0; i < nextra && it->ndeps < MAX_DEPS; i++) {
    if (extra_event)
      it->event_edges |= 1u << it->ndeps;
    it->deps[it->ndeps++] = extra[i];
  }
  if (s >= 0)
    M.streams[s].tail = nitems;
  return nitems++;
}

/* A wait of stream s for an event recorded at item `ev` that has not been
 * seen to complete: its implicit dependencies perhaps hold (maybe_edges). */
static int item_wait(int s, int ev) {
  mitem *it = &items[nitems];
  memset(it, 0, sizeof *it);
  it->stream = s;
  it->gate = -1;
  it->mem_pool = it->mem_pool2 = -1;
  int deps[MAX_DEPS];
  int n = next_deps(s, deps);
  for (int k = 0; k < n; k++) {
    if (deps[k] != M.streams[s].tail)
      it->maybe_edges |= 1u << it->ndeps;
    it->deps[it->ndeps++] = deps[k];
  }
  it->event_edges |= 1u << it->ndeps;
  it->deps[it->ndeps++] = ev;
  M.streams[s].tail = nitems;
  return nitems++;
}

/* The position of a free on stream s: what work queued now on s would
 * wait for, without becoming work itself. */
static int item_pos(int s) {
  mitem *it = &items[nitems];
  memset(it, 0, sizeof *it);
  it->stream = s;
  it->gate = -1;
  it->mem_pool = it->mem_pool2 = -1;
  it->virt = true;
  it->ndeps = next_deps(s, it->deps);
  return nitems++;
}

/* A position reached once every one of `deps` is. */
static int item_pos_of(const int *deps, int n) {
  int i = item_new(-1, -1, deps, n, false);
  items[i].virt = true;
  return i;
}

/* Whether item i is known to have completed: marked so, or a position all
 * of whose dependencies are. */
static bool item_done(int i) {
  mitem *it = &items[i];
  if (it->done || !it->virt)
    return it->done;
  for (int k = 0; k < it->ndeps; k++)
    if (!item_done(it->deps[k]))
      return false;
  it->done = true;
  return true;
}

/* Whether the closure of roots holds a closed gate. */
static bool blocked_dfs(int i) {
  mitem *it = &items[i];
  if (it->stamp == stamp_now || it->done)
    return false;
  it->stamp = stamp_now;
  if (it->gate >= 0 && !M.gates[it->gate].open)
    return true;
  for (int k = 0; k < it->ndeps; k++)
    if (!(it->maybe_edges & (1u << k)) && blocked_dfs(it->deps[k]))
      return true;
  return false;
}

static bool roots_blocked(const int *roots, int n) {
  stamp_now++;
  for (int k = 0; k < n; k++)
    if (blocked_dfs(roots[k]))
      return true;
  return false;
}

static bool item_blocked(int i) {
  return i >= 0 && roots_blocked(&i, 1);
}

static bool stream_blocked(int s) {
  int roots[MAX_DEPS];
  int n = next_deps(s, roots);
  return roots_blocked(roots, n);
}

/* Whether `target` is in the closure of roots; through event edges only
 * when `events`. */
static bool reach_dfs(int i, int target, bool events) {
  if (i == target)
    return true;
  mitem *it = &items[i];
  if (it->stamp == stamp_now)
    return false;
  it->stamp = stamp_now;
  for (int k = 0; k < it->ndeps; k++) {
    if (!events && (it->event_edges & (1u << k)))
      continue;
    if (reach_dfs(it->deps[k], target, events))
      return true;
  }
  return false;
}

static bool stream_reaches(int s, int target, bool events) {
  int roots[MAX_DEPS];
  int n = next_deps(s, roots);
  stamp_now++;
  for (int k = 0; k < n; k++)
    if (reach_dfs(roots[k], target, events))
      return true;
  return false;
}

/* Whether work queued now on s is ordered after `target`: for a position,
 * after everything the position waits for. */
static bool stream_follows(int s, int target, bool events) {
  const mitem *t = &items[target];
  if (!t->virt)
    return stream_reaches(s, target, events);
  for (int k = 0; k < t->ndeps; k++)
    if (!stream_follows(s, t->deps[k], events))
      return false;
  return true;
}

static void gate_open(int g);

/* Opens every closed gate in the closure of roots. */
static void open_dfs(int i) {
  mitem *it = &items[i];
  if (it->stamp == stamp_now || it->done)
    return;
  it->stamp = stamp_now;
  if (it->gate >= 0 && !M.gates[it->gate].open)
    gate_open(it->gate);
  for (int k = 0; k < it->ndeps; k++)
    open_dfs(it->deps[k]);
}

static void open_roots(const int *roots, int n) {
  /* A stream can be made to wait for work queued after the free it needs
   * (fuzz_findings.c); with that finding skipped, a synchronize opens every
   * gate, so that such waits cannot hold it. */
  if ((skip_mask >> SKIP_LATE_WAIT) & 1)
    for (int g = 0; g < M.ngates; g++)
      gate_open(g);
  stamp_now++;
  for (int k = 0; k < n; k++)
    open_dfs(roots[k]);
}

/* The closure of roots has completed (a synchronize or query said so). A
 * closed gate inside it is a finding: the library said done too early. */
static void done_dfs(int i, const char *who) {
  mitem *it = &items[i];
  if (it->done)
    return;
  if (it->gate >= 0 && !M.gates[it->gate].open)
    fail("%s reported completion of work that waits for gate %d, which is "
         "still closed",
         who, it->gate);
  it->done = true;
  for (int k = 0; k < it->ndeps; k++)
    if (!(it->maybe_edges & (1u << k)))
      done_dfs(it->deps[k], who);
}

static void done_roots(const int *roots, int n, const char *who) {
  for (int k = 0; k < n; k++)
    done_dfs(roots[k], who);
}

/* ---- gates -------------------------------------------------------------- */

static void gate_open(int g) {
  mgate *m = &M.gates[g];
  if (m->open)
    return;
  m->open = true;
  gate_rt_open(&gates_rt[m->slot], false);
}

/* After a call that may have let the watchdog open gates. */
static void gates_sync_self_opened(void) {
  for (int g = 0; g < M.ngates; g++) {
    mgate *m = &M.gates[g];
    if (m->open)
      continue;
    gate_rt *rt = &gates_rt[m->slot];
    pthread_mutex_lock(&rt->mu);
    bool open = rt->open;
    pthread_mutex_unlock(&rt->mu);
    if (open) {
      m->open = true;
      logf_("  (gate %d opened by the watchdog during a host wait)", g);
    }
  }
}

/* ---- small helpers ------------------------------------------------------ */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static unsigned rd8(reader *r) {
  if (!r->n)
    return 0;
  r->n--;
  return *r->p++;
}

static unsigned rd16(reader *r) {
  unsigned a = rd8(r);
  return a | rd8(r) << 8;
}

static unsigned char next_val(void) {
  M.next_val = (unsigned char)(M.next_val % 254 + 1);
  return M.next_val;
}

static uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

/* Makes `dev` the calling thread's device, as a legacy stream needs. */
static void use_device(int dev) {
  if (M.cur_dev == dev)
    return;
  expect_ok(tp_set_device(dev), "tp_set_device");
  M.cur_dev = dev;
}

static tp_stream_t sh(int s) {
  if (M.streams[s].legacy)
    use_device(M.streams[s].device);
  return M.streams[s].h;
}

static const char *sname(int s) {
  static char buf[4][24];
  static int k;
  char *b = buf[k++ % 4];
  if (M.streams[s].legacy)
    snprintf(b, 24, "legacy%d", M.streams[s].device);
  else
    snprintf(b, 24, "s%d", s);
  return b;
}

/* A live stream chosen by a byte (the legacy streams included). */
static int pick_stream(reader *r) {
  int live[MAX_STREAMS] = {0}, n = 0;
  for (int s = 0; s < M.nstreams; s++)
    if (M.streams[s].live)
      live[n++] = s;
  return n ? live[rd8(r) % n] : 0;
}

static int pick_pool(reader *r, bool live_only, bool allow_imported) {
  int v[MAX_POOLS], n = 0;
  for (int p = 0; p < M.npools; p++)
    if ((!live_only || M.pools[p].live) &&
        (allow_imported || !M.pools[p].imported))
      v[n++] = p;
  return n ? v[rd8(r) % n] : -1;
}

static int pick_block(reader *r) {
  int v[MAX_BLOCKS], n = 0;
  for (int b = 0; b < MAX_BLOCKS; b++)
    if (M.blocks[b].live)
      v[n++] = b;
  unsigned k = rd8(r);
  return n ? v[k % n] : -1;
}

static int free_block_slot(void) {
  for (int b = 0; b < MAX_BLOCKS; b++)
    if (!M.blocks[b].live && !M.blocks[b].held)
      return b;
  return -1;
}

static int live_streams(void) {
  int n = 0;
  for (int s = 0; s < M.nstreams; s++)
    n += M.streams[s].live && !M.streams[s].legacy;
  return n;
}

static int live_created_pools(void) {
  int n = 0;
  for (int p = NDEV; p < M.npools; p++)
    n += M.pools[p].live;
  return n;
}

static int memory_of(int q);

static uint64_t capacity_of(const mpool *p) {
  (void)p;
  return DEVICE_MEMORY;
}

/* The physical bytes a pool may hold: whole chunks, as many as fit in
 * max_size (the header's tp_pool_props_t). */
static uint64_t limit_of(const mpool *p) {
  uint64_t cap = capacity_of(p);
  if (!p->max_size)
    return cap;
  uint64_t m = p->max_size / p->chunk * p->chunk;
  return m < cap ? m : cap;
}

static uint64_t attr_u64(int p, tp_pool_attr_t a, const char *name) {
  uint64_t v = 0;
  tp_error_t err = tp_pool_get_attribute(M.pools[p].h, a, &v);
  if (err != TP_SUCCESS)
    fail("tp_pool_get_attribute(pool %d, %s) returned %s", p, name,
         tp_error_name(err));
  return v;
}

/* ---- the statistics promises --------------------------------------------- */

static void check_pool_stats(int p) {
  mpool *m = &M.pools[p];
  uint64_t used =
      attr_u64(p, TP_POOL_ATTR_USED_MEM_CURRENT, "USED_MEM_CURRENT");
  uint64_t high = attr_u64(p, TP_POOL_ATTR_USED_MEM_HIGH, "USED_MEM_HIGH");
  uint64_t res =
      attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT");
  uint64_t resh =
      attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_HIGH, "RESERVED_MEM_HIGH");
  uint64_t lo = m->used, hi = m->used + m->held;
  if (used < lo || used > hi)
    fail("pool %d: USED_MEM_CURRENT is %" PRIu64 ", the live allocations "
         "add up to %" PRIu64 "%s",
         p, used, lo, hi != lo ? " (or up to the held bytes more)" : "");
  if (m->high_lo < lo)
    m->high_lo = lo;
  if (m->high_hi < hi)
    m->high_hi = hi;
  if (high < m->high_lo || high > m->high_hi)
    fail("pool %d: USED_MEM_HIGH is %" PRIu64 ", the model's peak is %" PRIu64
         " (one thread allocates, so it is exact)",
         p, high, m->high_lo);
  if (high < used)
    fail("pool %d: USED_MEM_HIGH %" PRIu64
         " is below USED_MEM_CURRENT %" PRIu64,
         p, high, used);
  if (res < used)
    fail("pool %d: RESERVED_MEM_CURRENT %" PRIu64
         " is below USED_MEM_CURRENT %" PRIu64,
         p, res, used);
  if (resh < res)
    fail("pool %d: RESERVED_MEM_HIGH %" PRIu64
         " is below RESERVED_MEM_CURRENT %" PRIu64,
         p, resh, res);
  if (!m->imported && res > limit_of(m))
    fail("pool %d: reserves %" PRIu64 " bytes, above its limit of %" PRIu64
         " (max_size %" PRIu64 ")",
         p, res, limit_of(m), m->max_size);
}

static void check_all_stats(void) {
  uint64_t per_dev[NDEV] = {0};
  for (int p = 0; p < M.npools; p++) {
    if (!M.pools[p].live)
      continue;
    check_pool_stats(p);
    int mem = on_cuda ? memory_of(p) : M.pools[p].device;
    if (mem >= 0 && !M.pools[p].imported)
      per_dev[mem] +=
          attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED");
  }
  for (int d = 0; d < NDEV; d++)
    if (per_dev[d] > DEVICE_MEMORY)
      fail("the live pools of device %d reserve %" PRIu64
           " bytes, more than its %zu",
           d, per_dev[d], DEVICE_MEMORY);
}

/* ---- overlap and reuse -------------------------------------------------- */

/* Fails when [lo, hi) overlaps a live or held block, or an imported
 * pointer other than earlier imports of the same block through the same
 * imported pool (`alias_block`, or -1), which map it at the same address. */
static void check_no_overlap(uintptr_t lo, uintptr_t hi, int alias_block,
                             int alias_pool) {
  for (int b = 0; b < MAX_BLOCKS; b++) {
    const mblock *o = &M.blocks[b];
    if (!(o->live || o->held))
      continue;
    uintptr_t olo = (uintptr_t)o->p, ohi = olo + o->size;
    if (olo < hi && lo < ohi)
      fail("[%#" PRIxPTR ", %#" PRIxPTR ") overlaps %s block %d [%#" PRIxPTR
           ", %#" PRIxPTR ")",
           lo, hi, o->live ? "live" : "exporter-freed but still held", b, olo,
           ohi);
  }
  for (int k = 0; k < MAX_IMPORTS; k++) {
    const mimport *o = &M.imports[k];
    if (!o->live || (o->block == alias_block && o->ipool == alias_pool))
      continue;
    uintptr_t olo = (uintptr_t)o->q, ohi = olo + M.blocks[o->block].size;
    if (olo < hi && lo < ohi)
      fail("[%#" PRIxPTR ", %#" PRIxPTR ") overlaps imported pointer %d", lo,
           hi, k);
  }
}

static void prune_freed(void) {
  int k = 0;
  for (int i = 0; i < M.nfreed; i++) {
    mfreed *f = &M.freed[i];
    bool done =
        item_done(f->item) && (f->hold_item < 0 || item_done(f->hold_item));
    if (!done)
      M.freed[k++] = *f;
  }
  M.nfreed = k;
}

static void add_freed(uintptr_t lo, size_t size, int pool, int item,
                      int hold_item) {
  if (M.nfreed == MAX_FREED)
    prune_freed();
  if (M.nfreed == MAX_FREED)
    fail("the model's table of pending frees is full");
  M.freed[M.nfreed++] =
      (mfreed){lo, lo + size, pool, item, hold_item, M.pools[pool].opp != 0};
}

/* A new block of pool p took [lo, hi), legally (check_reuse): the frees
 * recorded there have served their purpose. Whoever frees the block later
 * is ordered after its owner, and the owner after those frees, so a later
 * reuse answers to the later free alone (the fuzzer's
 * realloc-supersedes-free). The parts of a record outside [lo, hi) stay. */
static void consume_freed(int pool, uintptr_t lo, uintptr_t hi) {
  int split = 0; /* records that [lo, hi) cuts in two */
  for (int i = 0; i < M.nfreed; i++) {
    const mfreed *f = &M.freed[i];
    split += f->pool == pool && f->lo < lo && hi < f->hi;
  }
  if (M.nfreed + split > MAX_FREED)
    prune_freed();
  if (M.nfreed + split > MAX_FREED)
    fail("the model's table of pending frees is full");
  int n = M.nfreed;
  for (int i = 0; i < n; i++) {
    mfreed *f = &M.freed[i];
    if (f->pool != pool || !(f->lo < hi && lo < f->hi))
      continue;
    if (f->lo < lo && hi < f->hi) {
      M.freed[M.nfreed] = *f;
      M.freed[M.nfreed++].lo = hi;
    }
    if (f->lo < lo)
      f->hi = lo;
    else
      f->lo = hi < f->hi ? hi : f->hi;
  }
  int k = 0; /* records left empty go */
  for (int i = 0; i < M.nfreed; i++)
    if (M.freed[i].lo < M.freed[i].hi)
      M.freed[k++] = M.freed[i];
  M.nfreed = k;
}

/* Which of a wait's edges only perhaps hold (maybe edges: a reach crosses
 * them, a block or a completion does not). */
enum { WAIT_SURE = 0, MAYBE_FREE = 1, MAYBE_POS = 2 };

/* Stream s waits for the free at position `free_item` from now on. On a
 * legacy stream the library waits for a marker (an event) recorded there,
 * perhaps only now: it covers every free the legacy stream issued so far,
 * each of which waited for the device's blocking streams when it was
 * issued, and s is ordered after all of them (the stream's position now).
 * `maybe` says which of the two edges perhaps hold:
 *  - both, for a take the library may have made as complete or through a
 *    wait of its own (internal dependencies, or an order its clocks did not
 *    show), on which it may rely later;
 *  - the position only, for a blocking stream that takes a legacy free
 *    nothing holds: the library may know it complete (a marker it recorded
 *    after the free has completed, which the model cannot see) and make no
 *    wait, or wait on a marker recorded now. */
static void wait_for_free(int s, int free_item, unsigned maybe) {
  int deps[2] = {free_item, -1};
  static const unsigned edge[2] = {MAYBE_FREE, MAYBE_POS};
  int n = 1;
  int fs = items[free_item].stream;
  /* The library waits on a marker of the freeing stream: on the legacy
   * stream one recorded now, covering all its work so far; on another, the
   * first marker that covers the free, recorded when first needed, which
   * may cover the stream's later work too (the fuzzer's
   * internal-wait-covers-later). */
  if (fs >= 0 && M.streams[fs].live) {
    deps[n++] = item_pos(fs);
    if (!M.streams[fs].legacy)
      maybe |= MAYBE_POS;
  }
  int tail[MAX_DEPS];
  int base = next_deps(s, tail);
  int i = item_new(s, -1, deps, n, false);
  for (int k = base; k < items[i].ndeps; k++)
    if (maybe & edge[k - base])
      items[i].maybe_edges |= 1u << k;
}

/* A blocking stream's allocation in pool p, with FOLLOW_EVENT_DEPENDENCIES
 * on, may look at any of the pool's pending legacy frees of its device
 * while it searches (for a block, or for chunks to move), and the library's
 * answer to whether the stream follows such a free is a wait on a legacy
 * marker that covers it, made even where the stream then takes nothing
 * there: the stream perhaps follows each of them from now on (the fuzzer's
 * scan-waits-on-legacy-free). */
static void note_legacy_scan(int p, int s) {
  const mstream *st = &M.streams[s];
  if (!M.pools[p].follow || st->legacy || !st->blocking)
    return;
  for (int i = 0; i < M.nfreed; i++) {
    const mfreed *f = &M.freed[i];
    int fs = items[f->item].stream;
    if (f->pool == p && fs >= 0 && M.streams[fs].legacy &&
        M.streams[fs].device == st->device && !item_done(f->item))
      wait_for_free(s, f->item, MAYBE_FREE | MAYBE_POS);
  }
}

/* A new block [lo, hi) of pool p for stream s: every overlapping free that
 * has not completed must be ordered before s, or allowed by a policy; with
 * internal dependencies, s is made to wait, which the model then records.
 * Returns true when s must now wait. */
static bool check_reuse(int p, int s, uintptr_t lo, uintptr_t hi) {
  const mpool *m = &M.pools[p];
  bool waits = false;
  for (int i = 0; i < M.nfreed; i++) {
    mfreed *f = &M.freed[i];
    if (!(f->lo < hi && lo < f->hi))
      continue;
    if (f->hold_item >= 0 && item_blocked(f->hold_item))
      fail("pool %d gave [%#" PRIxPTR ", %#" PRIxPTR ") to %s while an "
           "importer's free of the block there has not completed (held)",
           p, lo, hi, sname(s));
    if (item_done(f->item))
      continue;
    bool blocked = item_blocked(f->item);
    if (f->pool != p) {
      if (blocked)
        fail("pool %d gave [%#" PRIxPTR ", %#" PRIxPTR ") to %s, memory "
             "that pool %d freed in work that has not completed (item %d)",
             p, lo, hi, sname(s), f->pool, f->item);
      continue;
    }
    if (stream_follows(s, f->item, false)) {
      /* The library's clocks may not show an order the model sees (through
       * a blocking stream's implicit wait for the legacy stream, say): it
       * may then have made the stream wait, on a marker that orders it
       * after later work of the freeing stream too, and rely on that. */
      if (m->internal || m->follow)
        wait_for_free(s, f->item, MAYBE_FREE | MAYBE_POS);
      continue;
    }
    /* A blocking stream takes a free of its device's legacy stream once a
     * legacy operation covers it, and the library records one (a marker)
     * where none does: the taker then waits for the free. */
    int fs = items[f->item].stream;
    if (m->follow && fs >= 0 && M.streams[fs].legacy && !M.streams[s].legacy &&
        M.streams[s].blocking && M.streams[s].device == M.streams[fs].device) {
      if (!blocked && M.streams[fs].live) {
        wait_for_free(s, f->item, MAYBE_POS);
        continue;
      }
      wait_for_free(s, f->item, WAIT_SURE);
      waits = true;
      continue;
    }
    bool by_event = stream_follows(s, f->item, true);
    if (by_event && m->follow) {
      /* As above: the library's clocks may miss the event's order and
       * make s wait instead (the fuzzer's event-order-internal-wait). */
      if (m->internal)
        wait_for_free(s, f->item, MAYBE_FREE | MAYBE_POS);
      continue;
    }
    if (!blocked) {
      /* Perhaps complete, but nothing told the pool so: taking it needs
       * the opportunistic policy, or a dependency (internal), or the wait
       * before out-of-memory. */
      if (m->opp || m->internal || m->oom_wait || f->polled) {
        if (m->internal)
          wait_for_free(s, f->item, MAYBE_FREE | MAYBE_POS);
        continue;
      }
      fail("pool %d gave [%#" PRIxPTR ", %#" PRIxPTR ") to %s, overlapping "
           "a free (item %d on %s) that no synchronize or query has shown "
           "complete, with ALLOW_OPPORTUNISTIC, INTERNAL_DEPENDENCIES%s and "
           "OOM_WAIT off",
           p, lo, hi, sname(s), f->item, sname(items[f->item].stream),
           by_event ? ", FOLLOW_EVENT_DEPENDENCIES" : "");
    }
    if (!m->internal)
      fail("pool %d gave [%#" PRIxPTR ", %#" PRIxPTR ") to %s, overlapping "
           "a free (item %d on %s) that has not completed and that %s "
           "follows %s, with INTERNAL_DEPENDENCIES off",
           p, lo, hi, sname(s), f->item, sname(items[f->item].stream), sname(s),
           by_event ? "only through an event (FOLLOW_EVENT_DEPENDENCIES off)"
                    : "in no way");
    /* Allowed, and s waits for the free from now on. */
    wait_for_free(s, f->item, WAIT_SURE);
    waits = true;
  }
  return waits;
}

/* ---- block contents ----------------------------------------------------- */

/* The model no longer knows block b's bytes. */
static void forget_contents(int b) {
  M.blocks[b].val = 0;
  atomic_fetch_add(&block_gen[b], 1);
}

/* Queues a write of a new value into block b on its owner stream: a memset
 * where the stream's device may write the pool's memory, else a host
 * function. */
static void write_block(int b, const char *why) {
  mblock *k = &M.blocks[b];
  int s = k->owner;
  const mpool *p = &M.pools[k->pool];
  int dev = M.streams[s].device;
  unsigned char v = next_val();
  bool direct = p->access[dev] == TP_ACCESS_READ_WRITE;
  if (direct) {
    expect_ok(tp_memset_async(k->p, v, k->size, sh(s)), "tp_memset_async");
    int it = item_new(s, -1, NULL, 0, false);
    items[it].mem_pool = k->pool;
    k->last_item = it;
  } else {
    hf_rec *h = hf_take();
    if (!h) {
      forget_contents(b);
      return;
    }
    *h = (hf_rec){.kind = HF_WRITE,
                  .p = k->p,
                  .size = k->size,
                  .val = v,
                  .block = b,
                  .op = M.op};
    atomic_store(&h->busy, 1);
    expect_ok(tp_launch_host_func(sh(s), hf_fn, h), "tp_launch_host_func");
    k->last_item = item_new(s, -1, NULL, 0, false);
  }
  k->val = v;
  logf_("  write 0x%02x into block %d on %s (%s, %s)", v, b, sname(s),
        direct ? "memset" : "host function", why);
}

static void check_block_async(int b) {
  mblock *k = &M.blocks[b];
  if (!k->val)
    return;
  hf_rec *h = hf_take();
  if (!h)
    return;
  *h = (hf_rec){.kind = HF_CHECK,
                .p = k->p,
                .size = k->size,
                .val = k->val,
                .block = b,
                .op = M.op,
                .pool = k->pool,
                .gen = atomic_load(&block_gen[b]),
                .pgen = atomic_load(&pool_gen[k->pool])};
  atomic_store(&h->busy, 1);
  expect_ok(tp_launch_host_func(sh(k->owner), hf_fn, h), "tp_launch_host_func");
  k->last_item = item_new(k->owner, -1, NULL, 0, false);
}

/* Orders stream `to` after everything block b's owner has queued, through
 * the fuzzer's own event, so that b may be used or freed on `to`. */
static void hand_off(int b, int to) {
  mblock *k = &M.blocks[b];
  int from = k->owner;
  if (from == to)
    return;
  const mstream *f = &M.streams[from];
  if (!f->live || (k->last_item >= 0 && items[k->last_item].done)) {
    k->owner = to;
    return;
  }
  tp_event_t e = M.handoff[f->device];
  expect_ok(tp_event_record(e, sh(from)), "tp_event_record (hand-off)");
  int rec = item_new(from, -1, NULL, 0, false);
  expect_ok(tp_stream_wait_event(sh(to), e, 0),
            "tp_stream_wait_event (hand-off)");
  item_wait(to, rec);
  k->owner = to;
}

/* ========================================================================
 * Operations
 * ======================================================================== */

static size_t rd_size(reader *r) {
  unsigned c = rd8(r) % 16;
  unsigned v = rd16(r);
  switch (c) {
  case 0: return 0;
  case 1:
  case 2:
  case 3: return 1 + v % 4096;
  case 4:
  case 5:
  case 6: return 1 + v % (32 * KiB);
  case 7:
  case 8: return 32 * KiB + (size_t)v * 16;
  case 9:
  case 10: return (size_t)(v % 64 + 1) * 64 * KiB;
  case 11: return (size_t)(v % 12 + 1) * MiB + v % 3 * 512;
  case 12: {
    static const size_t edge[] = {1,
                                  511,
                                  512,
                                  513,
                                  4096,
                                  32 * KiB,
                                  32 * KiB + 1,
                                  2 * MiB - 512,
                                  2 * MiB,
                                  2 * MiB + 1,
                                  4 * MiB,
                                  8 * MiB - 1,
                                  16 * MiB,
                                  DEVICE_MEMORY - 2 * MiB,
                                  DEVICE_MEMORY,
                                  DEVICE_MEMORY + 1};
    return edge[v % 16];
  }
  case 13: return 1 + v % 512;
  case 14: return (size_t)(v % 20 + 1) * MiB;
  default: {
    static const size_t huge[] = {SIZE_MAX,        SIZE_MAX - 511,
                                  SIZE_MAX / 2,    (size_t)1 << 40,
                                  (size_t)1 << 34, 64 * MiB};
    return huge[v % 6];
  }
  }
}

/* The device whose memory a pool's chunks take, or -1 (host memory): the
 * host platform places managed memory without a location on device 0; the
 * cuda platform makes managed pools of pinned host chunks wherever the
 * driver's VMM makes no managed memory, as the fake's does not. */
static int memory_of(int q) {
  const mpool *m = &M.pools[q];
  if (on_cuda && m->alloc_type == TP_ALLOCATION_MANAGED)
    return -1;
  if (m->loc_type == TP_LOCATION_NONE && m->alloc_type == TP_ALLOCATION_MANAGED)
    return 0;
  return m->device;
}

/* The model is empty enough that an allocation must succeed: everything
 * complete, the pool holding no block, and room on the device. */
static bool must_fit(int p, size_t size) {
  const mpool *m = &M.pools[p];
  if (m->used || m->held || size == 0)
    return false;
  for (int i = 0; i < nitems; i++)
    if (!item_done(i))
      return false;
  for (int b = 0; b < MAX_BLOCKS; b++)
    if ((M.blocks[b].live || M.blocks[b].held) && M.blocks[b].pool == p)
      return false;
  uint64_t need = align_up(size, m->chunk);
  if (need > limit_of(m) || m->device < 0 || memory_of(p) < 0)
    return false;
  uint64_t others = 0;
  for (int q = 0; q < M.npools; q++)
    if (q != p && M.pools[q].live && !M.pools[q].imported &&
        memory_of(q) == m->device)
      others += attr_u64(q, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED");
  /* Destroyed pools still waiting for their last free hold memory too. */
  for (int b = 0; b < MAX_BLOCKS; b++)
    if ((M.blocks[b].live || M.blocks[b].held) &&
        !M.pools[M.blocks[b].pool].live)
      return false;
  return need + others <= DEVICE_MEMORY;
}

static void op_malloc(reader *r, bool from_pool) {
  int s = pick_stream(r);
  size_t size = rd_size(r);
  int p;
  if (from_pool) {
    p = pick_pool(r, true, true);
    if (p < 0)
      return;
  } else {
    p = M.current[M.streams[s].device];
  }
  mpool *m = &M.pools[p];
  int b = free_block_slot();
  if (b < 0)
    return;
  bool may_wait = m->oom_wait != 0;
  bool fits = must_fit(p, size);
  void *ptr = (void *)1;
  logf_("%s(%zu, pool %d, %s)",
        from_pool ? "tp_malloc_from_pool_async" : "tp_malloc_async", size, p,
        sname(s));
  call_begin(may_wait ? CALL_MAY_WAIT : CALL_NO_WAIT, "tp_malloc_async");
  tp_error_t err = from_pool
                       ? tp_malloc_from_pool_async(&ptr, size, m->h, sh(s))
                       : tp_malloc_async(&ptr, size, sh(s));
  call_end();
  if (may_wait) {
    gates_sync_self_opened();
    /* The library may have waited on the host for the pool's pending frees
     * (OOM_WAIT), through markers that cover every free issued before on
     * those streams, other pools' too: a free that nothing holds may be
     * known complete from then on. */
    for (int i = 0; i < M.nfreed; i++)
      if (!item_blocked(M.freed[i].item))
        M.freed[i].polled = true;
  }
  logf_("  -> %s %p", tp_error_name(err), ptr);
  if (m->imported) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_malloc_from_pool_async from an imported pool");
    return;
  }
  if (size > 0)
    note_legacy_scan(p, s);
  if (size == 0) {
    expect_ok(err, "tp_malloc_async of 0 bytes");
    if (ptr != NULL)
      fail("an allocation of 0 bytes gave %p, not NULL", ptr);
    return;
  }
  if (size > limit_of(m)) {
    expect_err(err, TP_ERROR_OUT_OF_MEMORY,
               "an allocation larger than the pool's limit");
    return;
  }
  if (err == TP_ERROR_OUT_OF_MEMORY) {
    if (fits)
      fail("pool %d answered OUT_OF_MEMORY for %zu bytes, with nothing "
           "allocated or pending in it and room on the device",
           p, size);
    return;
  }
  expect_ok(err, "tp_malloc_async");
  uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
  if (lo % 512)
    fail("%p is not aligned to 512 bytes", ptr);
  check_no_overlap(lo, hi, -1, -1);
  bool waits = check_reuse(p, s, lo, hi);
  consume_freed(p, lo, hi);
  mblock *k = &M.blocks[b];
  memset(k, 0, sizeof *k);
  k->live = true;
  k->p = ptr;
  k->size = size;
  k->pool = p;
  k->owner = s;
  k->last_item = M.streams[s].tail;
  m->used += size;
  logf_("  block %d = [%p, +%zu)%s", b, ptr, size,
        waits ? ", the stream must now wait for a pending free" : "");
  write_block(b, "new block");
  if (waits && stream_blocked(s)) {
    /* The stream's work must not complete while the gate stays closed:
     * give it the time to, if nothing holds it. */
    double until = now_s() + 0.05;
    do {
      tp_error_t q = tp_stream_query(sh(s));
      if (q != TP_ERROR_NOT_READY)
        fail("block %d reuses memory whose free waits behind a closed gate, "
             "so %s must wait for it, but tp_stream_query says %s",
             b, sname(s), tp_error_name(q));
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    } while (now_s() < until);
  }
}

static void forget_ptr(uintptr_t p) {
  M.dead_ptrs[M.ndead_ptrs % 16] = p;
  M.ndead_ptrs++;
}

static void op_free(reader *r) {
  int b = pick_block(r);
  if (b < 0)
    return;
  mblock *k = &M.blocks[b];
  unsigned how = rd8(r);
  int s = k->owner;
  if (how % 3 == 1 || !M.streams[s].live)
    s = pick_stream(r);
  if (how & 8)
    check_block_async(b);
  hand_off(b, s);
  logf_("tp_free_async(block %d %p, %s)", b, (void *)k->p, sname(s));
  expect_ok(tp_free_async(k->p, sh(s)), "tp_free_async");
  int it = item_pos(s);
  mpool *m = &M.pools[k->pool];
  m->used -= k->size;
  k->live = false;
  forget_ptr((uintptr_t)k->p);
  if (k->holds > 0) {
    k->held = true;
    k->free_item = it;
    m->held += k->size;
    logf_("  block %d stays held by %d import(s)", b, k->holds);
    return;
  }
  int hold = -1;
  if (k->release_in_flight && !k->nhold_items) {
    /* The exporter counts the block as used until that release arrives
     * (op_quiesce waits for the figure to come down). */
    k->release_in_flight = false;
    m->held += k->size;
  }
  if (k->nhold_items) {
    hold = item_pos_of(k->hold_items, k->nhold_items);
    /* The importers' frees were issued, but their releases reach the
     * exporter only once their streams ran them and its thread read them:
     * until then it still counts the block as used (op_quiesce waits for
     * the figure to come down). */
    m->held += k->size;
  }
  add_freed((uintptr_t)k->p, k->size, k->pool, it, hold);
}

static void op_write(reader *r) {
  int b = pick_block(r);
  if (b < 0)
    return;
  unsigned how = rd8(r);
  if (how & 1) {
    int s = pick_stream(r);
    hand_off(b, s);
  }
  logf_("write block %d", b);
  write_block(b, "rewrite");
  if (how & 2)
    check_block_async(b);
}

static void op_check(reader *r) {
  int b = pick_block(r);
  if (b < 0)
    return;
  logf_("check block %d (0x%02x) on %s", b, M.blocks[b].val,
        sname(M.blocks[b].owner));
  check_block_async(b);
}

/* A memcpy between two blocks of the same owner stream. */
static void op_copy(reader *r) {
  int d = pick_block(r), s = pick_block(r);
  if (d < 0 || s < 0 || d == s)
    return;
  mblock *dst = &M.blocks[d], *src = &M.blocks[s];
  hand_off(s, dst->owner);
  int st = dst->owner, dev = M.streams[st].device;
  if (M.pools[dst->pool].access[dev] != TP_ACCESS_READ_WRITE ||
      M.pools[src->pool].access[dev] == TP_ACCESS_NONE)
    return;
  size_t n = dst->size < src->size ? dst->size : src->size;
  logf_("tp_memcpy_async(block %d <- block %d, %zu, %s)", d, s, n, sname(st));
  expect_ok(tp_memcpy_async(dst->p, src->p, n, sh(st)), "tp_memcpy_async");
  int it = item_new(st, -1, NULL, 0, false);
  items[it].mem_pool = dst->pool;
  items[it].mem_pool2 = src->pool;
  dst->last_item = src->last_item = it;
  if (n == dst->size)
    dst->val = src->val;
  else
    forget_contents(d);
}

/* The answer a synchronize should give for stream s's faults. */
static void expect_fault(tp_error_t err, int fault, bool maybe,
                         const char *what) {
  if (err == TP_SUCCESS && (fault != 1 || maybe))
    return;
  if (err == TP_ERROR_ILLEGAL_ADDRESS && (fault || maybe))
    return;
  fail("%s returned %s; the model expected %s", what, tp_error_name(err),
       fault == 1 ? "ILLEGAL_ADDRESS (an access fault is pending)" : "SUCCESS");
}

/* Synchronizes stream s, opening the gates it waits for first. */
static void sync_stream(int s, const char *why) {
  int roots[MAX_DEPS];
  int n = sync_roots(s, roots);
  open_roots(roots, n);
  logf_("tp_stream_synchronize(%s)%s%s", sname(s), why ? " " : "",
        why ? why : "");
  call_begin(CALL_NO_WAIT, "tp_stream_synchronize");
  tp_error_t err = tp_stream_synchronize(sh(s));
  call_end();
  mstream *m = &M.streams[s];
  expect_fault(err, m->fault, m->fault == 2, "tp_stream_synchronize");
  m->fault = 0;
  m->fault_gen++;
  done_roots(roots, n, "tp_stream_synchronize");
}

static void op_gate(reader *r) {
  int s = pick_stream(r);
  if (M.ngates == MAX_GATES)
    return;
  int slot = -1;
  for (int i = 0; i < MAX_GATES; i++) {
    int expect = 0;
    if (atomic_compare_exchange_strong(&gates_rt_busy[i], &expect, 1)) {
      slot = i;
      break;
    }
  }
  if (slot < 0)
    return;
  gate_rt *g = &gates_rt[slot];
  pthread_mutex_lock(&g->mu);
  g->open = g->left = g->self_opened = 0;
  pthread_mutex_unlock(&g->mu);
  logf_("gate %d on %s", M.ngates, sname(s));
  tp_error_t err = tp_launch_host_func(sh(s), gate_fn, g);
  if (err != TP_SUCCESS) {
    atomic_store(&gates_rt_busy[slot], 0);
    expect_ok(err, "tp_launch_host_func (gate)");
  }
  int gi = M.ngates++;
  M.gates[gi] = (mgate){slot, s, -1, false};
  M.gates[gi].item = item_new(s, gi, NULL, 0, false);
}

static void op_open(reader *r) {
  int closed[MAX_GATES], n = 0;
  for (int g = 0; g < M.ngates; g++)
    if (!M.gates[g].open)
      closed[n++] = g;
  if (!n)
    return;
  int g = closed[rd8(r) % n];
  logf_("open gate %d", g);
  gate_open(g);
}

static void op_stream_create(reader *r) {
  unsigned a = rd8(r);
  if (live_streams() >= MAX_LIVE_STREAMS || M.nstreams == MAX_STREAMS)
    return;
  int dev = (a >> 1) % NDEV;
  unsigned flags = a & 1 ? TP_STREAM_NON_BLOCKING : TP_STREAM_DEFAULT;
  use_device(dev);
  tp_stream_t h = NULL;
  logf_("tp_stream_create(%s) on device %d", flags ? "NON_BLOCKING" : "DEFAULT",
        dev);
  expect_ok(tp_stream_create(&h, flags), "tp_stream_create");
  int s = M.nstreams++;
  M.streams[s] = (mstream){h, dev, false, !flags, true, -1, 0, 0};
  logf_("  -> s%d", s);
}

static void op_stream_destroy(reader *r) {
  int s = pick_stream(r);
  mstream *m = &M.streams[s];
  if (m->legacy)
    return;
  /* Blocks whose work is ordered on s move to the device's legacy stream
   * first, so that they stay usable. */
  for (int b = 0; b < MAX_BLOCKS; b++)
    if (M.blocks[b].live && M.blocks[b].owner == s)
      hand_off(b, m->device);
  logf_("tp_stream_destroy(%s)", sname(s));
  expect_ok(tp_stream_destroy(m->h), "tp_stream_destroy");
  m->live = false;
  if (m->fault)
    M.dev_fault_maybe[m->device] = true;
  M.dead_streams[M.ndead_streams % 8] = m->h;
  M.ndead_streams++;
}

static void op_stream_sync(reader *r) {
  int s = pick_stream(r);
  bool query = rd8(r) & 1;
  int roots[MAX_DEPS];
  int n = sync_roots(s, roots);
  if (query) {
    bool blk = roots_blocked(roots, n);
    logf_("tp_stream_query(%s)%s", sname(s), blk ? " [held by a gate]" : "");
    tp_error_t err = tp_stream_query(sh(s));
    if (err == TP_SUCCESS)
      done_roots(roots, n, "tp_stream_query");
    else if (err != TP_ERROR_NOT_READY)
      fail("tp_stream_query returned %s", tp_error_name(err));
    return;
  }
  sync_stream(s, NULL);
}

static void sync_device(int d, const char *why) {
  int roots[MAX_STREAMS], n = 0;
  bool fault = false, maybe = M.dev_fault_maybe[d];
  for (int s = 0; s < M.nstreams; s++) {
    mstream *m = &M.streams[s];
    if (m->device != d)
      continue;
    if (m->tail >= 0)
      roots[n++] = m->tail;
    if (m->live) {
      fault |= m->fault == 1;
      maybe |= m->fault == 2;
    }
  }
  open_roots(roots, n);
  use_device(d);
  logf_("tp_device_synchronize() on device %d (%s)", d, why);
  call_begin(CALL_NO_WAIT, "tp_device_synchronize");
  tp_error_t err = tp_device_synchronize();
  call_end();
  expect_fault(err, fault ? 1 : 0, maybe, "tp_device_synchronize");
  for (int s = 0; s < M.nstreams; s++)
    if (M.streams[s].device == d) {
      M.streams[s].fault = 0;
      M.streams[s].fault_gen++;
    }
  M.dev_fault_maybe[d] = false;
  done_roots(roots, n, "tp_device_synchronize");
}

/* What an event's query or synchronize should say of faults: 1 when work
 * before its record faulted and its stream has not reported it since
 * (*maybe when that is uncertain: access changed under queued work, or the
 * stream was destroyed). */
static int event_fault(const mevent *m, bool *maybe) {
  *maybe = false;
  if (m->item < 0 || m->stream < 0 || !m->fault)
    return 0;
  const mstream *s = &M.streams[m->stream];
  if (s->fault_gen != m->fault_gen) {
    /* A destroyed stream's fault is reported by a device synchronize only
     * while its platform stream is still listed there, until its queued
     * work has run; once gone, no synchronize of it can report the fault,
     * and the event goes on answering ILLEGAL_ADDRESS (host: the fault
     * stays with the stream the event holds). */
    *maybe = !s->live;
    return 0;
  }
  *maybe = m->fault == 2 || s->fault == 2 || !s->live;
  return 1;
}

static void op_event(reader *r) {
  unsigned what = rd8(r) % 6;
  unsigned k = rd8(r);
  int live[MAX_EVENTS], n = 0;
  for (int e = 0; e < M.nevents; e++)
    if (M.events[e].live)
      live[n++] = e;
  if (what == 0 || !n) {
    if (n >= 4 || M.nevents == MAX_EVENTS)
      return;
    int dev = (int)(k % NDEV);
    use_device(dev);
    tp_event_t h = NULL;
    logf_("tp_event_create() on device %d", dev);
    expect_ok(tp_event_create(&h), "tp_event_create");
    M.events[M.nevents++] = (mevent){h, true, dev, -1, -1, 0, 0};
    return;
  }
  int e = live[k % n];
  mevent *m = &M.events[e];
  switch (what) {
  case 1: {
    int s = pick_stream(r);
    logf_("tp_event_record(event %d, %s)", e, sname(s));
    tp_error_t err = tp_event_record(m->h, sh(s));
    if (M.streams[s].device != m->device) {
      /* The driver refuses an event of another device. */
      expect_err(err, TP_ERROR_INVALID_VALUE,
                 "tp_event_record of an event of another device");
      return;
    }
    expect_ok(err, "tp_event_record");
    m->item = item_new(s, -1, NULL, 0, false);
    m->stream = s;
    m->fault = M.streams[s].fault;
    m->fault_gen = M.streams[s].fault_gen;
    return;
  }
  case 2: {
    int s = pick_stream(r);
    logf_("tp_stream_wait_event(%s, event %d)", sname(s), e);
    expect_ok(tp_stream_wait_event(sh(s), m->h, 0), "tp_stream_wait_event");
    if (m->item >= 0 && !items[m->item].done)
      item_wait(s, m->item);
    return;
  }
  case 3: {
    bool blk = item_blocked(m->item);
    logf_("tp_event_query(event %d)%s", e, blk ? " [held by a gate]" : "");
    tp_error_t err = tp_event_query(m->h);
    bool maybe = false;
    int must = event_fault(m, &maybe);
    if (m->item < 0) {
      expect_ok(err, "tp_event_query of an event never recorded");
    } else if (err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS) {
      expect_fault(err, must, maybe, "tp_event_query");
      done_roots(&m->item, 1, "tp_event_query");
    } else if (err != TP_ERROR_NOT_READY) {
      fail("tp_event_query returned %s", tp_error_name(err));
    }
    return;
  }
  case 4: {
    if (m->item >= 0)
      open_roots(&m->item, 1);
    logf_("tp_event_synchronize(event %d)", e);
    call_begin(CALL_NO_WAIT, "tp_event_synchronize");
    tp_error_t err = tp_event_synchronize(m->h);
    call_end();
    bool maybe = false;
    int must = event_fault(m, &maybe);
    expect_fault(err, must, maybe, "tp_event_synchronize");
    if (m->item >= 0)
      done_roots(&m->item, 1, "tp_event_synchronize");
    return;
  }
  default:
    logf_("tp_event_destroy(event %d)", e);
    expect_ok(tp_event_destroy(m->h), "tp_event_destroy");
    m->live = false;
    M.dead_events[M.ndead_events % 8] = m->h;
    M.ndead_events++;
    return;
  }
}

/* ---- pools -------------------------------------------------------------- */

static void pool_init_model(int p, tp_pool_t h, const tp_pool_props_t *pr,
                            bool is_default) {
  mpool *m = &M.pools[p];
  memset(m, 0, sizeof *m);
  m->h = h;
  m->live = true;
  m->is_default = is_default;
  m->exporter = -1;
  m->exportable = (pr->handle_types & TP_HANDLE_POSIX_FD) != 0;
  m->loc_type = pr->location.type;
  m->device = pr->location.type == TP_LOCATION_DEVICE ? pr->location.id : -1;
  m->alloc_type = pr->alloc_type;
  m->max_size = pr->max_size;
  m->follow = m->opp = m->internal = m->oom_wait = 1;
  m->threshold = 0;
  m->chunk = attr_u64(p, TP_POOL_ATTR_CHUNK_SIZE, "CHUNK_SIZE");
  for (int d = 0; d < NDEV; d++) {
    tp_location_t loc = {TP_LOCATION_DEVICE, d, 0};
    expect_ok(tp_pool_get_access(&m->access[d], h, &loc), "tp_pool_get_access");
  }
  if (m->device >= 0 && m->access[m->device] != TP_ACCESS_READ_WRITE)
    fail("a new pool's own device has access %d, not READ_WRITE",
         (int)m->access[m->device]);
}

/* Props from the input: mostly valid ones, of every location. */
static tp_pool_props_t rd_props(reader *r) {
  tp_pool_props_t pr;
  memset(&pr, 0, sizeof pr);
  unsigned a = rd8(r), b = rd8(r);
  pr.alloc_type = TP_ALLOCATION_PINNED;
  switch (a % 8) {
  case 0:
  case 1:
  case 2: pr.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0}; break;
  case 3: pr.location = (tp_location_t){TP_LOCATION_DEVICE, 1, 0}; break;
  case 4: pr.location = (tp_location_t){TP_LOCATION_HOST, 0, 0}; break;
  case 5: pr.location = (tp_location_t){TP_LOCATION_HOST_NUMA, 0, 0}; break;
  case 6:
    pr.alloc_type = TP_ALLOCATION_MANAGED;
    pr.location = (tp_location_t){TP_LOCATION_NONE, 0, 0};
    break;
  default:
    pr.alloc_type = TP_ALLOCATION_MANAGED;
    pr.location = (tp_location_t){TP_LOCATION_DEVICE, (int)(b % NDEV), 0};
    break;
  }
  if ((a >> 3) % 3 == 0 && pr.location.type == TP_LOCATION_DEVICE &&
      pr.alloc_type == TP_ALLOCATION_PINNED)
    pr.handle_types = TP_HANDLE_POSIX_FD;
  if (pr.alloc_type == TP_ALLOCATION_PINNED) {
    static const size_t sizes[] = {
        0,       0,    4 * MiB,  6 * MiB,        3 * MiB,  8 * MiB,
        2 * MiB, 1000, 16 * MiB, 12 * MiB + 512, 64 * MiB, 0};
    pr.max_size = sizes[(b >> 1) % 12];
  }
  return pr;
}

static void op_pool_create(reader *r) {
  tp_pool_props_t pr = rd_props(r);
  if (live_created_pools() >= MAX_LIVE_POOLS || M.npools == MAX_POOLS)
    return;
  tp_pool_t h = NULL;
  logf_("tp_pool_create(type %d, location %d/%d, handles %u, max %zu)",
        (int)pr.alloc_type, (int)pr.location.type, pr.location.id,
        pr.handle_types, pr.max_size);
  tp_error_t err = tp_pool_create(&h, &pr);
  if (err == TP_ERROR_OUT_OF_MEMORY)
    return; /* the virtual range could not be reserved */
  if (pr.max_size && pr.max_size < 2 * MiB) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_pool_create with a max_size below one chunk");
    return;
  }
  expect_ok(err, "tp_pool_create");
  int p = M.npools++;
  M.pools[p].h = h;
  pool_init_model(p, h, &pr, false);
  logf_("  -> pool %d", p);
  /* The pool reports what it was created with. */
  int v = -1;
  uint64_t u = 1;
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_ALLOCATION_TYPE, &v), "get");
  if (v != (int)pr.alloc_type)
    fail("ALLOCATION_TYPE %d, created with %d", v, (int)pr.alloc_type);
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_EXPORT_HANDLE_TYPES, &v),
            "get");
  if (v != (int)pr.handle_types)
    fail("EXPORT_HANDLE_TYPES %d, created with %u", v, pr.handle_types);
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_MAX_POOL_SIZE, &u), "get");
  if (u != pr.max_size)
    fail("MAX_POOL_SIZE %" PRIu64 ", created with %zu", u, pr.max_size);
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_RELEASE_THRESHOLD, &u),
            "get");
  if (u != 0)
    fail("a new pool's release threshold is %" PRIu64 ", not 0", u);
}

static void op_pool_destroy(reader *r) {
  int p = pick_pool(r, false, true);
  if (p < 0)
    return;
  mpool *m = &M.pools[p];
  logf_("tp_pool_destroy(pool %d%s)", p,
        m->is_default ? ", a default pool"
        : m->live     ? ""
                      : ", destroyed");
  if (m->is_default || !m->live) {
    expect_err(tp_pool_destroy(m->h), TP_ERROR_INVALID_VALUE,
               m->is_default ? "tp_pool_destroy of a default pool"
                             : "tp_pool_destroy of a destroyed pool");
    return;
  }
  call_begin(m->imported ? CALL_MAY_WAIT : CALL_NO_WAIT, "tp_pool_destroy");
  tp_error_t err = tp_pool_destroy(m->h);
  call_end();
  gates_sync_self_opened();
  expect_ok(err, "tp_pool_destroy");
  m->live = false;
  for (int d = 0; d < NDEV; d++)
    if (M.current[d] == p)
      M.current[d] = d;
  if (m->imported) {
    /* Its imports are released: queued frees waited for, the rest let
     * go. */
    for (int k = 0; k < MAX_IMPORTS; k++) {
      mimport *im = &M.imports[k];
      if (!im->live || im->ipool != p)
        continue;
      im->live = false;
      mblock *b = &M.blocks[im->block];
      b->holds--;
      /* The exporter's count of held bytes comes down once the release
       * reaches it; op_quiesce confirms it. */
      if (b->held && b->holds == 0) {
        b->held = false;
        add_freed((uintptr_t)b->p, b->size, b->pool, b->free_item, -1);
      } else if (b->live) {
        b->release_in_flight = true;
      }
    }
  }
}

static void op_set_current(reader *r) {
  int p = pick_pool(r, false, true);
  int d = (int)(rd8(r) % NDEV);
  if (p < 0)
    return;
  mpool *m = &M.pools[p];
  logf_("tp_device_set_mem_pool(%d, pool %d)", d, p);
  tp_error_t err = tp_device_set_mem_pool(d, m->h);
  bool ok = m->live && !m->imported && m->device == d &&
            m->loc_type == TP_LOCATION_DEVICE &&
            m->alloc_type == TP_ALLOCATION_PINNED;
  if (!ok) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_device_set_mem_pool with a pool of another kind, "
               "location or device, or a destroyed or imported one");
    return;
  }
  expect_ok(err, "tp_device_set_mem_pool");
  M.current[d] = p;
  tp_pool_t got = NULL;
  expect_ok(tp_device_get_mem_pool(&got, d), "tp_device_get_mem_pool");
  if (got != m->h)
    fail("tp_device_get_mem_pool gives another pool than the one just set");
}

static void op_attr(reader *r) {
  int p = pick_pool(r, true, false);
  if (p < 0)
    return;
  mpool *m = &M.pools[p];
  unsigned a = rd8(r), v = rd8(r);
  switch (a % 8) {
  case 0:
  case 1:
  case 2:
  case 3: {
    static const tp_pool_attr_t attrs[] = {
        TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, TP_POOL_ATTR_OOM_WAIT};
    int val = (v & 3) == 3 ? 7 : (int)(v & 1);
    logf_("tp_pool_set_attribute(pool %d, attr %d, %d)", p, (int)attrs[a % 4],
          val);
    expect_ok(tp_pool_set_attribute(m->h, attrs[a % 4], &val),
              "tp_pool_set_attribute");
    int *field[] = {&m->follow, &m->opp, &m->internal, &m->oom_wait};
    *field[a % 4] = val != 0;
    for (int i = 0; m->opp && i < M.nfreed; i++)
      if (M.freed[i].pool == p)
        M.freed[i].polled = true;
    int back = -1;
    expect_ok(tp_pool_get_attribute(m->h, attrs[a % 4], &back),
              "tp_pool_get_attribute");
    if (back != (val != 0))
      fail("reuse attribute %d reads %d after setting %d", (int)attrs[a % 4],
           back, val);
    return;
  }
  case 4:
  case 5: {
    static const uint64_t th[] = {0,       1,       2 * MiB,    3 * MiB,
                                  8 * MiB, 1 << 20, UINT64_MAX, 512};
    uint64_t t = th[v % 8];
    logf_("tp_pool_set_attribute(pool %d, RELEASE_THRESHOLD, %" PRIu64 ")", p,
          t);
    expect_ok(tp_pool_set_attribute(m->h, TP_POOL_ATTR_RELEASE_THRESHOLD, &t),
              "tp_pool_set_attribute(RELEASE_THRESHOLD)");
    m->threshold = t;
    /* The growth slack changes how much memory growth makes, never what
     * the model checks; the byte's top bits pick one now and then. */
    static const uint64_t slack[] = {0, 3906, 25000, 1000000};
    if (v >> 5 >= 4) {
      uint64_t g = slack[(v >> 5) - 4];
      logf_("tp_pool_set_attribute(pool %d, GROWTH_SLACK, %" PRIu64 ")", p, g);
      expect_ok(tp_pool_set_attribute(m->h, TP_POOL_ATTR_GROWTH_SLACK, &g),
                "tp_pool_set_attribute(GROWTH_SLACK)");
    }
    return;
  }
  case 6: {
    uint64_t zero = 0;
    logf_("reset USED_MEM_HIGH of pool %d", p);
    expect_ok(tp_pool_set_attribute(m->h, TP_POOL_ATTR_USED_MEM_HIGH, &zero),
              "reset USED_MEM_HIGH");
    uint64_t high = attr_u64(p, TP_POOL_ATTR_USED_MEM_HIGH, "USED_MEM_HIGH");
    if (high < m->used || high > m->used + m->held)
      fail("USED_MEM_HIGH after a reset is %" PRIu64
           ", not the current %" PRIu64,
           high, m->used);
    m->high_lo = m->used;
    m->high_hi = high;
    return;
  }
  default: {
    uint64_t zero = 0;
    logf_("reset RESERVED_MEM_HIGH of pool %d", p);
    expect_ok(
        tp_pool_set_attribute(m->h, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero),
        "reset RESERVED_MEM_HIGH");
    return;
  }
  }
}

static void op_trim(reader *r) {
  int p = pick_pool(r, true, true);
  if (p < 0)
    return;
  static const size_t keeps[] = {0, 1, 2 * MiB, 4 * MiB, 3 * MiB + 5, SIZE_MAX};
  size_t keep = keeps[rd8(r) % 6];
  mpool *m = &M.pools[p];
  uint64_t before =
      attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT");
  logf_("tp_pool_trim_to(pool %d, %zu)", p, keep);
  expect_ok(tp_pool_trim_to(m->h, keep), "tp_pool_trim_to");
  uint64_t after =
      attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT");
  if (after > before)
    fail("tp_pool_trim_to raised pool %d's reserved bytes from %" PRIu64
         " to %" PRIu64,
         p, before, after);
}

static void op_access(reader *r) {
  int p = pick_pool(r, true, false);
  if (p < 0)
    return;
  mpool *m = &M.pools[p];
  unsigned a = rd8(r);
  int d = (int)(a % NDEV);
  static const tp_access_flags_t fl[] = {TP_ACCESS_NONE, TP_ACCESS_READ,
                                         TP_ACCESS_READ_WRITE};
  tp_access_flags_t f = fl[(a >> 1) % 3];
  tp_access_desc_t desc = {{TP_LOCATION_DEVICE, d, 0}, f};
  bool own = m->device == d && f != TP_ACCESS_READ_WRITE;
  if (m->access[d] != f && !own) {
    /* Stream work of that device touching this pool, still queued, may now
     * fault or not: its stream's answer and the bytes of the blocks it
     * touches become uncertain, before the call, since the work may run as
     * soon as access changes; checks already queued are called off. */
    for (int i = 0; i < nitems; i++) {
      mitem *it = &items[i];
      if (it->done || (it->mem_pool != p && it->mem_pool2 != p) ||
          it->stream < 0 || M.streams[it->stream].device != d)
        continue;
      /* A destroyed stream's fault still shows at a device synchronize. */
      if (M.streams[it->stream].live)
        M.streams[it->stream].fault = 2;
      else
        M.dev_fault_maybe[d] = true;
      atomic_fetch_add(&pool_gen[it->mem_pool], 1);
      if (it->mem_pool2 >= 0)
        atomic_fetch_add(&pool_gen[it->mem_pool2], 1);
      for (int b = 0; b < MAX_BLOCKS; b++)
        if (M.blocks[b].live && (M.blocks[b].pool == it->mem_pool ||
                                 M.blocks[b].pool == it->mem_pool2))
          forget_contents(b);
    }
  }
  logf_("tp_pool_set_access(pool %d, device %d, %d)", p, d, (int)f);
  tp_error_t err = tp_pool_set_access(m->h, &desc, 1);
  if (own) {
    expect_err(err,
               f == TP_ACCESS_READ ? TP_ERROR_NOT_SUPPORTED
                                   : TP_ERROR_INVALID_DEVICE,
               "tp_pool_set_access reducing the pool's own device");
    return;
  }
  expect_ok(err, "tp_pool_set_access");
  m->access[d] = f;
  tp_access_flags_t back = TP_ACCESS_NONE;
  tp_location_t loc = {TP_LOCATION_DEVICE, d, 0};
  expect_ok(tp_pool_get_access(&back, m->h, &loc), "tp_pool_get_access");
  if (back != f)
    fail("tp_pool_get_access gives %d after setting %d", (int)back, (int)f);
}

/* A stream write into a block that the stream's device may not write:
 * TP_ERROR_ILLEGAL_ADDRESS at the next synchronize. */
static void op_fault(reader *r) {
  /* On a GPU such a write is an illegal address that ends the context for
   * good, and the fake refuses it; only the host platform reports it and
   * carries on, as the model expects. */
  if (on_cuda)
    return;
  int b = pick_block(r);
  if (b < 0)
    return;
  mblock *k = &M.blocks[b];
  int s = pick_stream(r);
  int dev = M.streams[s].device;
  if (M.pools[k->pool].access[dev] == TP_ACCESS_READ_WRITE)
    return;
  hand_off(b, s);
  logf_("tp_memset_async(block %d) on %s of device %d, which has no write "
        "access",
        b, sname(s), dev);
  expect_ok(tp_memset_async(k->p, 0xEE, k->size, sh(s)), "tp_memset_async");
  int it = item_new(s, -1, NULL, 0, false);
  items[it].mem_pool = k->pool;
  k->last_item = it;
  /* Whether a faulting write changed anything is not promised. */
  forget_contents(b);
  if (M.streams[s].fault == 0)
    M.streams[s].fault = 1;
}

/* ---- IPC ---------------------------------------------------------------- */

static void op_export_pointer(reader *r) {
  int b = pick_block(r);
  if (b < 0)
    return;
  mblock *k = &M.blocks[b];
  tp_pool_ptr_export_data_t rec;
  memset(&rec, 0, sizeof rec);
  logf_("tp_pool_export_pointer(block %d)", b);
  tp_error_t err = tp_pool_export_pointer(&rec, k->p);
  if (!M.pools[k->pool].exportable) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_pool_export_pointer of a pool without handle types");
    return;
  }
  expect_ok(err, "tp_pool_export_pointer");
  if (k->has_rec && memcmp(&rec, &k->rec, sizeof rec) != 0)
    fail("two exports of block %d gave different bytes", b);
  k->rec = rec;
  k->has_rec = true;
  if (k->size > 512) {
    logf_("tp_pool_export_pointer(block %d + 512)", b);
    expect_err(tp_pool_export_pointer(&rec, k->p + 512), TP_ERROR_INVALID_VALUE,
               "tp_pool_export_pointer of an interior pointer");
  }
}

static void op_import_pool(reader *r) {
  int p = pick_pool(r, false, false);
  if (p < 0 || M.npools == MAX_POOLS || live_created_pools() >= MAX_LIVE_POOLS)
    return;
  mpool *m = &M.pools[p];
  int fd = -1;
  logf_("tp_pool_export_to_shareable_handle(pool %d)", p);
  tp_error_t err =
      tp_pool_export_to_shareable_handle(&fd, m->h, TP_HANDLE_POSIX_FD, 0);
  if (!m->live || !m->exportable) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_pool_export_to_shareable_handle of a destroyed pool or one "
               "without POSIX_FD");
    return;
  }
  expect_ok(err, "tp_pool_export_to_shareable_handle");
  tp_pool_t h = NULL;
  logf_("tp_pool_import_from_shareable_handle(fd of pool %d)", p);
  call_begin(CALL_NO_WAIT, "tp_pool_import_from_shareable_handle");
  err = tp_pool_import_from_shareable_handle(&h, FD_HANDLE(fd),
                                             TP_HANDLE_POSIX_FD, 0);
  call_end();
  close(fd);
  expect_ok(err, "tp_pool_import_from_shareable_handle");
  int q = M.npools++;
  mpool *im = &M.pools[q];
  memset(im, 0, sizeof *im);
  im->h = h;
  im->live = true;
  im->imported = true;
  im->exporter = p;
  im->device = -1;
  im->loc_type = m->loc_type;
  im->alloc_type = m->alloc_type;
  im->chunk = m->chunk;
  logf_("  -> pool %d (imported)", q);
  int v = -1;
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_EXPORT_HANDLE_TYPES, &v),
            "get");
  if (v != 0)
    fail("an imported pool reports export handle types %d", v);
  expect_ok(tp_pool_get_attribute(h, TP_POOL_ATTR_LOCATION_ID, &v), "get");
  if (v != m->device)
    fail("an imported pool of device %d reports location id %d", m->device, v);
  fd = -1;
  expect_err(tp_pool_export_to_shareable_handle(&fd, h, TP_HANDLE_POSIX_FD, 0),
             TP_ERROR_INVALID_VALUE,
             "tp_pool_export_to_shareable_handle of an "
             "imported pool");
}

/* Live imports of block `b` through imported pool `ip`. */
static int imports_of(int b, int ip) {
  int n = 0;
  for (int k = 0; k < MAX_IMPORTS; k++)
    n += M.imports[k].live && M.imports[k].block == b &&
         M.imports[k].ipool == ip;
  return n;
}

static void op_import_pointer(reader *r) {
  int ip = -1;
  for (int p = 0; p < M.npools; p++)
    if (M.pools[p].imported && M.pools[p].live && (ip < 0 || rd8(r) & 1))
      ip = p;
  int b = pick_block(r);
  unsigned how = rd8(r);
  if (ip < 0)
    return;
  /* Blocks freed by the exporter but still held can be imported again. */
  if (how & 4) {
    for (int k = 0; k < MAX_BLOCKS; k++)
      if (M.blocks[k].held)
        b = k;
  }
  if (b < 0 || !M.blocks[b].has_rec)
    return;
  int slot = -1;
  for (int k = 0; k < MAX_IMPORTS; k++)
    if (!M.imports[k].live) {
      slot = k;
      break;
    }
  if (slot < 0)
    return;
  mblock *k = &M.blocks[b];
  mpool *im = &M.pools[ip];
  tp_pool_ptr_export_data_t rec = k->rec;
  if (how & 2) {
    rec.reserved[(how >> 3) % 64] ^= (unsigned char)(1u << (how % 8));
    void *q = NULL;
    logf_("tp_pool_import_pointer(pool %d, corrupted record of block %d)", ip,
          b);
    expect_err(tp_pool_import_pointer(&q, im->h, &rec), TP_ERROR_INVALID_VALUE,
               "tp_pool_import_pointer of a corrupted record");
    return;
  }
  void *q = NULL;
  logf_("tp_pool_import_pointer(pool %d, block %d)", ip, b);
  call_begin(CALL_NO_WAIT, "tp_pool_import_pointer");
  tp_error_t err = tp_pool_import_pointer(&q, im->h, &rec);
  call_end();
  bool ours = im->exporter == k->pool && M.pools[k->pool].live;
  if (!ours || !k->live) {
    expect_err(err, TP_ERROR_INVALID_VALUE,
               "tp_pool_import_pointer of a record of another pool, of a "
               "destroyed exporter, or of a freed allocation");
    return;
  }
  expect_ok(err, "tp_pool_import_pointer");
  for (int j = 0; j < MAX_IMPORTS; j++) {
    const mimport *o = &M.imports[j];
    if (o->live && o->block == b && o->ipool == ip && o->q != q)
      fail("importing block %d twice gave %p and %p", b, o->q, q);
  }
  check_no_overlap((uintptr_t)q, (uintptr_t)q + k->size, b, ip);
  /* An allocation imported again is counted once in the pool's bytes. */
  if (!imports_of(b, ip))
    im->used += k->size;
  M.imports[slot] = (mimport){true, q, b, ip};
  k->holds++;
  logf_("  -> import %d = %p", slot, q);
}

static void op_free_import(reader *r) {
  int v[MAX_IMPORTS], n = 0;
  for (int k = 0; k < MAX_IMPORTS; k++)
    if (M.imports[k].live)
      v[n++] = k;
  if (!n)
    return;
  int k = v[rd8(r) % n];
  int s = pick_stream(r);
  mimport *im = &M.imports[k];
  mblock *b = &M.blocks[im->block];
  logf_("tp_free_async(import %d %p, %s)", k, im->q, sname(s));
  expect_ok(tp_free_async(im->q, sh(s)),
            "tp_free_async of an imported pointer");
  int it = item_new(s, -1, NULL, 0, false);
  im->live = false;
  mpool *ip = &M.pools[im->ipool];
  if (!imports_of(im->block, im->ipool))
    ip->used -= b->size;
  if (b->nhold_items < MAX_IMPORTS)
    b->hold_items[b->nhold_items++] = it;
  b->holds--;
  if (b->held && b->holds == 0) {
    b->held = false;
    int hold = item_pos_of(b->hold_items, b->nhold_items);
    add_freed((uintptr_t)b->p, b->size, b->pool, b->free_item, hold);
  }
}

/* ---- bad input ---------------------------------------------------------- */

/* A pool handle that names no live pool. */
static tp_pool_t wild_pool(unsigned k) {
  switch (k % 6) {
  case 0: return (tp_pool_t)(uintptr_t)0x1000;
  case 1: return (tp_pool_t)(void *)wild_buf;
  case 2: return M.nstreams > 2 ? (tp_pool_t)(void *)M.streams[2].h : NULL;
  case 3: return M.nevents ? (tp_pool_t)(void *)M.events[0].h : NULL;
  case 4: {
    for (int p = 0; p < M.npools; p++)
      if (!M.pools[p].live)
        return M.pools[p].h;
    return NULL;
  }
  default:
    /* User memory that starts like a live pool's handle (the magic word and
     * the live state of this version), as an attacker would forge it. */
    return (tp_pool_t)(void *)&forged_pool;
  }
}

static bool stream_handle_live(tp_stream_t h) {
  for (int s = 0; s < M.nstreams; s++)
    if (M.streams[s].live && M.streams[s].h == h)
      return true;
  return false;
}

static bool event_handle_live(tp_event_t h) {
  for (int e = 0; e < M.nevents; e++)
    if (M.events[e].live && M.events[e].h == h)
      return true;
  return h == M.handoff[0] || h == M.handoff[1];
}

static tp_stream_t wild_stream(unsigned k) {
  tp_stream_t h;
  switch (k % 5) {
  case 0: h = (tp_stream_t)(uintptr_t)0x1000; break;
  case 1: h = (tp_stream_t)(void *)wild_buf; break;
  case 2: h = (tp_stream_t)(void *)default_pool[0]; break;
  case 3: h = M.ndead_streams ? M.dead_streams[0] : NULL; break;
  default:
    /* On cuda tidepool hands a stream it does not know to the driver, for
     * which a value that is no handle is undefined: an event's handle is a
     * number, not memory, and the fake (as a GPU's driver would) reads
     * through it once it is past the values the platform keeps for the
     * special streams. There the variant is left out. */
    h = M.nevents && !on_cuda ? (tp_stream_t)(void *)M.events[0].h : NULL;
    break;
  }
  return h && !stream_handle_live(h) ? h : (tp_stream_t)(void *)wild_buf;
}

static tp_event_t wild_event(unsigned k) {
  tp_event_t h;
  switch (k % 4) {
  case 0: h = (tp_event_t)(uintptr_t)0x1000; break;
  case 1: h = (tp_event_t)(void *)wild_buf; break;
  case 2: h = (tp_event_t)(void *)default_pool[0]; break;
  default: h = M.ndead_events ? M.dead_events[0] : NULL; break;
  }
  return h && !event_handle_live(h) ? h : (tp_event_t)(void *)wild_buf;
}

/* Whether a pointer is the start of something the model holds. */
static bool ptr_is_live(uintptr_t p) {
  for (int b = 0; b < MAX_BLOCKS; b++)
    if ((M.blocks[b].live || M.blocks[b].held) && (uintptr_t)M.blocks[b].p == p)
      return true;
  for (int k = 0; k < MAX_IMPORTS; k++)
    if (M.imports[k].live && (uintptr_t)M.imports[k].q == p)
      return true;
  return false;
}

static void op_bad(reader *r) {
  unsigned what = rd8(r), k = rd8(r);
  int s = pick_stream(r);
  tp_stream_t st = sh(s);
  void *ptr = NULL;
  uint64_t u = 0;
  int iv = 0;
  const tp_error_t INV = TP_ERROR_INVALID_VALUE;
  switch (what % 24) {
  case 0: {
    tp_pool_t h = wild_pool(k);
    if (!h)
      return;
    logf_("bad: pool calls on a wild handle %p (variant %u)", (void *)h, k % 6);
    expect_err(tp_pool_get_attribute(h, TP_POOL_ATTR_USED_MEM_CURRENT, &u), INV,
               "tp_pool_get_attribute(wild pool)");
    expect_err(tp_pool_set_attribute(h, TP_POOL_ATTR_RELEASE_THRESHOLD, &u),
               INV, "tp_pool_set_attribute(wild pool)");
    expect_err(tp_pool_trim_to(h, 0), INV, "tp_pool_trim_to(wild pool)");
    expect_err(tp_malloc_from_pool_async(&ptr, 64, h, st), INV,
               "tp_malloc_from_pool_async(wild pool)");
    expect_err(tp_device_set_mem_pool(0, h), INV,
               "tp_device_set_mem_pool(wild pool)");
    tp_access_desc_t d = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
    expect_err(tp_pool_set_access(h, &d, 1), INV,
               "tp_pool_set_access(wild pool)");
    tp_access_flags_t f;
    expect_err(tp_pool_get_access(&f, h, &d.location), INV,
               "tp_pool_get_access(wild pool)");
    int fd = -1;
    expect_err(
        tp_pool_export_to_shareable_handle(&fd, h, TP_HANDLE_POSIX_FD, 0), INV,
        "tp_pool_export_to_shareable_handle(wild pool)");
    expect_err(tp_pool_destroy(h), INV, "tp_pool_destroy(wild pool)");
    return;
  }
  case 1: {
    tp_stream_t h = wild_stream(k);
    logf_("bad: stream calls on a wild handle %p (variant %u)", (void *)h,
          k % 5);
    expect_err(tp_malloc_async(&ptr, 64, h), INV,
               "tp_malloc_async(wild stream)");
    expect_err(tp_stream_synchronize(h), INV,
               "tp_stream_synchronize(wild stream)");
    expect_err(tp_stream_query(h), INV, "tp_stream_query(wild stream)");
    expect_err(tp_memset_async(wild_buf, 0, 16, h), INV,
               "tp_memset_async(wild stream)");
    expect_err(tp_event_record(M.handoff[0], h), INV,
               "tp_event_record(wild stream)");
    expect_err(tp_stream_destroy(h), INV, "tp_stream_destroy(wild stream)");
    int b = pick_block(r);
    if (b >= 0)
      expect_err(tp_free_async(M.blocks[b].p, h), INV,
                 "tp_free_async(block, wild stream)");
    return;
  }
  case 2: {
    tp_event_t h = wild_event(k);
    logf_("bad: event calls on a wild handle %p (variant %u)", (void *)h,
          k % 4);
    expect_err(tp_event_record(h, st), INV, "tp_event_record(wild event)");
    expect_err(tp_event_query(h), INV, "tp_event_query(wild event)");
    expect_err(tp_event_synchronize(h), INV,
               "tp_event_synchronize(wild event)");
    expect_err(tp_stream_wait_event(st, h, 0), INV,
               "tp_stream_wait_event(wild event)");
    expect_err(tp_event_destroy(h), INV, "tp_event_destroy(wild event)");
    return;
  }
  case 3: {
    /* Frees that must change nothing. */
    uintptr_t p = 0;
    const char *kind;
    int b = pick_block(r);
    switch (k % 7) {
    case 0:
      if (b < 0 || M.blocks[b].size <= 512)
        return;
      p = (uintptr_t)M.blocks[b].p + 512 * (1 + k / 7 % 4);
      if (p >= (uintptr_t)M.blocks[b].p + M.blocks[b].size)
        p = (uintptr_t)M.blocks[b].p + 512;
      kind = "an interior pointer";
      break;
    case 1:
      if (b < 0)
        return;
      p = (uintptr_t)M.blocks[b].p + 1 + k % 511;
      kind = "a misaligned interior pointer";
      break;
    case 2:
      if (!M.ndead_ptrs)
        return;
      p = M.dead_ptrs[k % (M.ndead_ptrs < 16 ? M.ndead_ptrs : 16)];
      kind = "a pointer already freed";
      break;
    case 3:
      p = (uintptr_t)&iv;
      kind = "a stack pointer";
      break;
    case 4:
      p = (uintptr_t)wild_buf;
      kind = "a heap pointer";
      break;
    case 5:
      p = 0x1000;
      kind = "a wild pointer";
      break;
    default:
      if (b < 0)
        return;
      p = (uintptr_t)M.blocks[b].p + M.blocks[b].size + 4096 * 256;
      kind = "a pointer past a block";
      break;
    }
    if (ptr_is_live(p))
      return;
    logf_("bad: tp_free_async(%#" PRIxPTR ", %s): %s", p, sname(s), kind);
    expect_err(tp_free_async((void *)p, st), INV, kind);
    return;
  }
  case 4:
    logf_("bad: allocation argument errors");
    expect_err(tp_malloc_async(NULL, 64, st), INV, "tp_malloc_async(NULL)");
    expect_err(tp_malloc_from_pool_async(NULL, 64, default_pool[0], st), INV,
               "tp_malloc_from_pool_async(NULL)");
    expect_ok(tp_free_async(NULL, st), "tp_free_async(NULL)");
    return;
  case 5: {
    int p = pick_pool(r, true, true);
    if (p < 0)
      return;
    static const int bad_attrs[] = {0, 16, 99, 105, -1, 1000};
    tp_pool_attr_t a = (tp_pool_attr_t)bad_attrs[k % 6];
    logf_("bad: pool %d attribute %d", p, (int)a);
    expect_err(tp_pool_get_attribute(M.pools[p].h, a, &u), INV,
               "tp_pool_get_attribute(unknown attribute)");
    expect_err(tp_pool_set_attribute(M.pools[p].h, a, &u), INV,
               "tp_pool_set_attribute(unknown attribute)");
    expect_err(tp_pool_get_attribute(M.pools[p].h,
                                     TP_POOL_ATTR_USED_MEM_CURRENT, NULL),
               INV, "tp_pool_get_attribute(value NULL)");
    expect_err(tp_pool_set_attribute(M.pools[p].h,
                                     TP_POOL_ATTR_RELEASE_THRESHOLD, NULL),
               INV, "tp_pool_set_attribute(value NULL)");
    static const tp_pool_attr_t ro[] = {
        TP_POOL_ATTR_RESERVED_MEM_CURRENT,  TP_POOL_ATTR_USED_MEM_CURRENT,
        TP_POOL_ATTR_ALLOCATION_TYPE,       TP_POOL_ATTR_EXPORT_HANDLE_TYPES,
        TP_POOL_ATTR_LOCATION_ID,           TP_POOL_ATTR_LOCATION_TYPE,
        TP_POOL_ATTR_LOCALITY_DOMAIN_ID,    TP_POOL_ATTR_MAX_POOL_SIZE,
        TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, TP_POOL_ATTR_CHUNK_MAPS,
        TP_POOL_ATTR_CHUNK_UNMAPS,          TP_POOL_ATTR_CHUNK_SIZE};
    u = 0;
    expect_err(tp_pool_set_attribute(M.pools[p].h, ro[k % 12], &u), INV,
               "tp_pool_set_attribute of a read-only attribute");
    u = 1 + k;
    expect_err(
        tp_pool_set_attribute(M.pools[p].h, TP_POOL_ATTR_USED_MEM_HIGH, &u),
        INV, "tp_pool_set_attribute(USED_MEM_HIGH, nonzero)");
    expect_err(
        tp_pool_set_attribute(M.pools[p].h, TP_POOL_ATTR_RESERVED_MEM_HIGH, &u),
        INV, "tp_pool_set_attribute(RESERVED_MEM_HIGH, nonzero)");
    return;
  }
  case 6: {
    tp_pool_props_t pr;
    memset(&pr, 0, sizeof pr);
    pr.alloc_type = TP_ALLOCATION_PINNED;
    pr.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
    tp_error_t want = INV;
    const char *kind;
    switch (k % 14) {
    case 0:
      memset(&pr, 0, sizeof pr);
      kind = "zeroed props";
      break;
    case 1:
      pr.alloc_type = (tp_allocation_type_t)77;
      kind = "type 77";
      break;
    case 2:
      pr.usage = 1;
      kind = "usage 1";
      break;
    case 3:
      pr.handle_types = 2;
      kind = "handle type 2";
      break;
    case 4:
      pr.alloc_type = TP_ALLOCATION_MANAGED;
      pr.max_size = 4 * MiB;
      kind = "managed with max_size";
      break;
    case 5:
      pr.alloc_type = TP_ALLOCATION_MANAGED;
      pr.handle_types = TP_HANDLE_POSIX_FD;
      kind = "managed with handle types";
      break;
    case 6:
      pr.location.type = (tp_location_type_t)99;
      kind = "location 99";
      break;
    case 7:
      pr.location.id = -1;
      kind = "device -1";
      break;
    case 8:
      pr.location.id = NDEV;
      kind = "device past the last";
      break;
    case 9:
      pr.location.type = TP_LOCATION_HOST;
      pr.handle_types = TP_HANDLE_POSIX_FD;
      kind = "host pool with handle types";
      break;
    case 10:
      pr.location.type = TP_LOCATION_HOST_NUMA_CURRENT;
      kind = "HOST_NUMA_CURRENT";
      break;
    case 11:
      pr.location.type = TP_LOCATION_HOST_NUMA;
      pr.location.id = -1;
      kind = "NUMA node -1";
      break;
    case 12:
      pr.handle_types = TP_HANDLE_FABRIC;
      want = TP_ERROR_NOT_SUPPORTED;
      kind = "fabric handles";
      break;
    default:
      pr.location.type = TP_LOCATION_NONE;
      kind = "pinned, no location";
      break;
    }
    tp_pool_t h = NULL;
    logf_("bad: tp_pool_create(%s)", kind);
    tp_error_t err = tp_pool_create(&h, &pr);
    if (err == TP_SUCCESS)
      (void)tp_pool_destroy(h);
    expect_err(err, want, kind);
    expect_err(tp_pool_create(NULL, &pr), INV, "tp_pool_create(NULL pool)");
    expect_err(tp_pool_create(&h, NULL), INV, "tp_pool_create(NULL props)");
    return;
  }
  case 7: {
    int p = pick_pool(r, true, true);
    if (p < 0)
      return;
    int d = (int)(k % NDEV);
    /* Every combination the pool does not match is refused. */
    tp_location_t loc = {TP_LOCATION_DEVICE, d, 0};
    const mpool *m = &M.pools[p];
    bool match =
        !m->imported && m->loc_type == TP_LOCATION_DEVICE && m->device == d;
    logf_("bad: tp_mem_set_pool(managed, device %d, pool %d)", d, p);
    tp_error_t err = tp_mem_set_pool(&loc, TP_ALLOCATION_MANAGED, m->h);
    if (match && m->alloc_type == TP_ALLOCATION_MANAGED) {
      expect_ok(err, "tp_mem_set_pool(managed)");
      tp_pool_t def = NULL;
      expect_ok(tp_mem_get_default_pool(&def, &loc, TP_ALLOCATION_MANAGED),
                "tp_mem_get_default_pool(managed)");
      expect_ok(tp_mem_set_pool(&loc, TP_ALLOCATION_MANAGED, def),
                "tp_mem_set_pool(managed default)");
    } else {
      expect_err(err, INV, "tp_mem_set_pool with a pool that does not match");
    }
    expect_err(tp_device_set_mem_pool(NDEV + 3, m->h), INV,
               "tp_device_set_mem_pool(bad device)");
    expect_err(tp_pool_destroy(default_pool[d]), INV,
               "tp_pool_destroy(default pool)");
    return;
  }
  case 8:
    logf_("bad: stream and event argument errors");
    expect_err(tp_stream_create(NULL, 0), INV, "tp_stream_create(NULL)");
    expect_err(tp_stream_create((tp_stream_t *)&ptr, 2), INV,
               "tp_stream_create(flags 2)");
    expect_err(tp_stream_destroy(NULL), INV, "tp_stream_destroy(NULL)");
    expect_err(tp_event_create(NULL), INV, "tp_event_create(NULL)");
    expect_err(tp_stream_wait_event(st, M.handoff[0], 1), INV,
               "tp_stream_wait_event(flags 1)");
    expect_err(tp_memset_async(NULL, 0, 16, st), INV, "tp_memset_async(NULL)");
    expect_err(tp_memcpy_async(NULL, wild_buf, 16, st), INV,
               "tp_memcpy_async(NULL)");
    expect_err(tp_launch_host_func(st, NULL, NULL), INV,
               "tp_launch_host_func(NULL)");
    return;
  case 9: {
    int p = pick_pool(r, true, false);
    if (p < 0)
      return;
    const mpool *m = &M.pools[p];
    tp_access_desc_t d = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
    tp_access_flags_t f = TP_ACCESS_NONE;
    logf_("bad: access argument errors on pool %d", p);
    d.flags = (tp_access_flags_t)2;
    expect_err(tp_pool_set_access(m->h, &d, 1), INV,
               "tp_pool_set_access(flags 2)");
    d.flags = TP_ACCESS_READ_WRITE;
    d.location.type = TP_LOCATION_HOST;
    expect_err(tp_pool_set_access(m->h, &d, 1), INV,
               "tp_pool_set_access(host location)");
    d.location = (tp_location_t){TP_LOCATION_DEVICE, NDEV + 1, 0};
    expect_err(tp_pool_set_access(m->h, &d, 1), TP_ERROR_INVALID_DEVICE,
               "tp_pool_set_access(bad device)");
    expect_err(tp_pool_set_access(m->h, NULL, 1), INV,
               "tp_pool_set_access(NULL, 1)");
    expect_ok(tp_pool_set_access(m->h, NULL, 0), "tp_pool_set_access(NULL, 0)");
    expect_err(tp_pool_get_access(&f, m->h, &d.location), INV,
               "tp_pool_get_access(bad device)");
    expect_err(tp_pool_get_access(NULL, m->h, &d.location), INV,
               "tp_pool_get_access(NULL)");
    /* A list with a bad entry applies none of it. */
    tp_access_desc_t two[2] = {
        {{TP_LOCATION_DEVICE, 1 - (m->device > 0), 0}, TP_ACCESS_READ},
        {{TP_LOCATION_DEVICE, 0, 0}, (tp_access_flags_t)5}};
    tp_access_flags_t before = TP_ACCESS_NONE, after = TP_ACCESS_NONE;
    expect_ok(tp_pool_get_access(&before, m->h, &two[0].location), "get");
    expect_err(tp_pool_set_access(m->h, two, 2), INV,
               "tp_pool_set_access with one bad entry");
    expect_ok(tp_pool_get_access(&after, m->h, &two[0].location), "get");
    if (before != after)
      fail("a refused tp_pool_set_access changed access from %d to %d",
           (int)before, (int)after);
    return;
  }
  case 10: {
    int b = pick_block(r);
    tp_pool_ptr_export_data_t rec;
    logf_("bad: export pointer argument errors");
    expect_err(tp_pool_export_pointer(NULL, b >= 0 ? M.blocks[b].p : wild_buf),
               INV, "tp_pool_export_pointer(NULL data)");
    expect_err(tp_pool_export_pointer(&rec, NULL), INV,
               "tp_pool_export_pointer(NULL)");
    expect_err(tp_pool_export_pointer(&rec, wild_buf), INV,
               "tp_pool_export_pointer(heap pointer)");
    for (int j = 0; j < MAX_IMPORTS; j++)
      if (M.imports[j].live)
        expect_err(tp_pool_export_pointer(&rec, M.imports[j].q), INV,
                   "tp_pool_export_pointer(imported pointer)");
    int fd = -1;
    int p = pick_pool(r, true, false);
    if (p >= 0) {
      expect_err(tp_pool_export_to_shareable_handle(&fd, M.pools[p].h,
                                                    TP_HANDLE_POSIX_FD, 1),
                 INV, "tp_pool_export_to_shareable_handle(flags 1)");
      expect_err(tp_pool_export_to_shareable_handle(NULL, M.pools[p].h,
                                                    TP_HANDLE_POSIX_FD, 0),
                 INV, "tp_pool_export_to_shareable_handle(NULL)");
      if (M.pools[p].exportable)
        expect_err(tp_pool_export_to_shareable_handle(&fd, M.pools[p].h,
                                                      TP_HANDLE_FABRIC, 0),
                   INV,
                   "tp_pool_export_to_shareable_handle(FABRIC) of a POSIX_FD "
                   "pool");
    }
    tp_pool_t h = NULL;
    fd = -1;
    expect_err(tp_pool_import_from_shareable_handle(&h, FD_HANDLE(fd),
                                                    TP_HANDLE_POSIX_FD, 0),
               INV, "tp_pool_import_from_shareable_handle(fd -1)");
    fd = 0;
    expect_err(tp_pool_import_from_shareable_handle(&h, FD_HANDLE(fd),
                                                    TP_HANDLE_FABRIC, 0),
               TP_ERROR_NOT_SUPPORTED,
               "tp_pool_import_from_shareable_handle(FABRIC)");
    return;
  }
  case 11: {
    logf_("bad: import pointer argument errors");
    tp_pool_ptr_export_data_t rec;
    memset(&rec, (int)k, sizeof rec);
    void *q = NULL;
    int p = pick_pool(r, true, true);
    if (p < 0)
      return;
    expect_err(tp_pool_import_pointer(&q, M.pools[p].h, &rec), INV,
               "tp_pool_import_pointer(forged record)");
    expect_err(tp_pool_import_pointer(NULL, M.pools[p].h, &rec), INV,
               "tp_pool_import_pointer(NULL)");
    expect_err(tp_pool_import_pointer(&q, M.pools[p].h, NULL), INV,
               "tp_pool_import_pointer(NULL record)");
    return;
  }
  case 12:
    logf_("bad: device argument errors");
    expect_err(tp_set_device(NDEV), TP_ERROR_INVALID_DEVICE,
               "tp_set_device(past the last)");
    expect_err(tp_set_device(-1), TP_ERROR_INVALID_DEVICE, "tp_set_device(-1)");
    expect_err(tp_get_device(NULL), INV, "tp_get_device(NULL)");
    expect_err(tp_get_device_count(NULL), INV, "tp_get_device_count(NULL)");
    expect_err(tp_device_get_attribute(&iv, (tp_device_attr_t)99, 0), INV,
               "tp_device_get_attribute(99)");
    expect_err(tp_device_get_attribute(
                   &iv, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, NDEV),
               TP_ERROR_INVALID_DEVICE, "tp_device_get_attribute(bad device)");
    iv = 0;
    expect_ok(tp_get_device_count(&iv), "tp_get_device_count");
    if (iv != NDEV)
      fail("tp_get_device_count gives %d, expected %d", iv, NDEV);
    return;
  case 13: {
    logf_("bad: default pool argument errors");
    tp_pool_t h = NULL;
    tp_location_t none = {TP_LOCATION_NONE, 0, 0};
    tp_location_t host = {TP_LOCATION_HOST, 0, 0};
    tp_location_t dev = {TP_LOCATION_DEVICE, NDEV + 5, 0};
    expect_err(tp_mem_get_default_pool(&h, &none, TP_ALLOCATION_PINNED), INV,
               "default pool of pinned with no location");
    expect_err(tp_mem_get_default_pool(&h, &host, TP_ALLOCATION_MANAGED), INV,
               "default pool of managed host memory");
    expect_err(tp_mem_get_default_pool(&h, &dev, TP_ALLOCATION_PINNED),
               TP_ERROR_INVALID_DEVICE, "default pool of a bad device");
    expect_err(tp_mem_get_default_pool(NULL, &host, TP_ALLOCATION_PINNED), INV,
               "tp_mem_get_default_pool(NULL)");
    expect_err(tp_mem_get_pool(&h, NULL, TP_ALLOCATION_PINNED), INV,
               "tp_mem_get_pool(NULL location)");
    expect_ok(tp_device_get_default_mem_pool(&h, 0),
              "tp_device_get_default_mem_pool");
    if (h != default_pool[0])
      fail("the default pool of device 0 changed");
    return;
  }
  case 14:
    /* As op_fault: on cuda a fault ends the context, and the fake driver
     * would write the address itself. */
    if (on_cuda)
      return;
    logf_("bad: tp_memset_async(wild address) on %s", sname(s));
    expect_ok(tp_memset_async((void *)(uintptr_t)0x1000, 0, 64, st),
              "tp_memset_async(wild address)");
    item_new(s, -1, NULL, 0, false);
    if (M.streams[s].fault == 0)
      M.streams[s].fault = 1;
    return;
  case 15: {
    int p = pick_pool(r, true, false);
    if (p < 0)
      return;
    static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 511, (size_t)1 << 50,
                                  DEVICE_MEMORY + 1};
    size_t size = huge[k % 4];
    logf_("bad: tp_malloc_from_pool_async(pool %d, %zu)", p, size);
    ptr = NULL;
    expect_err(tp_malloc_from_pool_async(&ptr, size, M.pools[p].h, st),
               TP_ERROR_OUT_OF_MEMORY, "an allocation larger than any pool");
    return;
  }
  default:
    /* Destroyed pools answer INVALID_VALUE to every call. */
    for (int p = 0; p < M.npools; p++) {
      if (M.pools[p].live)
        continue;
      logf_("bad: calls on destroyed pool %d", p);
      tp_pool_t h = M.pools[p].h;
      expect_err(tp_pool_get_attribute(h, TP_POOL_ATTR_USED_MEM_CURRENT, &u),
                 INV, "tp_pool_get_attribute(destroyed pool)");
      expect_err(tp_pool_trim_to(h, 0), INV, "tp_pool_trim_to(destroyed pool)");
      expect_err(tp_malloc_from_pool_async(&ptr, 64, h, st), INV,
                 "tp_malloc_from_pool_async(destroyed pool)");
      expect_err(tp_device_set_mem_pool(0, h), INV,
                 "tp_device_set_mem_pool(destroyed pool)");
      return;
    }
    return;
  }
}

/* ========================================================================
 * Quiescence: every gate open, every device synchronised; then the bytes
 * of every block are read directly, reserved memory must have fallen to
 * the threshold, and held bytes must have come back.
 * ======================================================================== */

static void settle_all(const char *why) {
  for (int g = 0; g < M.ngates; g++)
    gate_open(g);
  for (int d = 0; d < NDEV; d++)
    sync_device(d, why);
  check_async();
}

/* The chunks that live allocations of pool p keep; small blocks keep the
 * slab around them, up to 256 KiB either way. */
static uint64_t kept_bytes(int p) {
  const mpool *m = &M.pools[p];
  uint64_t idx[MAX_BLOCKS * 8];
  int n = 0;
  for (int b = 0; b < MAX_BLOCKS; b++) {
    const mblock *k = &M.blocks[b];
    if (!(k->live || k->held) || k->pool != p)
      continue;
    uintptr_t lo = (uintptr_t)k->p, hi = lo + k->size;
    if (k->size <= 32 * KiB) {
      lo = lo > 256 * KiB ? lo - 256 * KiB : 0;
      hi += 256 * KiB;
    }
    for (uintptr_t c = lo / m->chunk; c <= (hi - 1) / m->chunk; c++) {
      bool seen = false;
      for (int i = 0; i < n && !seen; i++)
        seen = idx[i] == c;
      if (!seen && n < MAX_BLOCKS * 8)
        idx[n++] = c;
    }
  }
  return (uint64_t)n * m->chunk;
}

static void op_quiesce(const char *why) {
  logf_("quiesce (%s)", why);
  settle_all(why);
  for (int b = 0; b < MAX_BLOCKS; b++) {
    mblock *k = &M.blocks[b];
    if (!(k->live || k->held) || !k->val)
      continue;
    size_t bad = find_bad(k->p, k->size, k->val);
    if (bad < k->size)
      fail("block %d [%p, +%zu) was overwritten: byte %zu is 0x%02x, "
           "expected 0x%02x",
           b, (void *)k->p, k->size, bad, k->p[bad], k->val);
  }
  for (int j = 0; j < MAX_IMPORTS; j++) {
    const mimport *im = &M.imports[j];
    const mblock *k = &M.blocks[im->block];
    if (!im->live || !k->val)
      continue;
    size_t bad = find_bad(im->q, k->size, k->val);
    if (bad < k->size)
      fail("import %d of block %d reads 0x%02x at byte %zu, the block holds "
           "0x%02x",
           j, im->block, ((unsigned char *)im->q)[bad], bad, k->val);
  }
  bool confirmed = false;
  for (int p = 0; p < M.npools; p++) {
    mpool *m = &M.pools[p];
    if (!m->live || m->imported)
      continue;
    /* Held bytes come back once every importer's free has completed. */
    if (m->held) {
      bool holding = false;
      for (int b = 0; b < MAX_BLOCKS; b++)
        holding |= M.blocks[b].held && M.blocks[b].pool == p;
      if (!holding) {
        double deadline = now_s() + 2.0;
        while (attr_u64(p, TP_POOL_ATTR_USED_MEM_CURRENT, "USED") != m->used &&
               now_s() < deadline) {
          struct timespec ts = {0, 1000 * 1000};
          nanosleep(&ts, NULL);
        }
        if (attr_u64(p, TP_POOL_ATTR_USED_MEM_CURRENT, "USED") != m->used)
          fail("pool %d still counts held bytes as used 2 s after every "
               "importer's free completed",
               p);
        m->held = 0;
        confirmed = true;
      }
    }
  }
  /* Released held blocks went back to their pools after the synchronize. */
  if (confirmed)
    settle_all(why);
  for (int p = 0; p < M.npools; p++) {
    mpool *m = &M.pools[p];
    if (!m->live || m->imported)
      continue;
    /* A synchronize brings reserved memory down to the threshold (whole
     * chunks holding at least that much), or to what live allocations
     * keep. */
    uint64_t res =
        attr_u64(p, TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT");
    uint64_t keep = kept_bytes(p);
    uint64_t held = m->threshold > UINT64_MAX - m->chunk
                        ? UINT64_MAX
                        : (m->threshold + m->chunk - 1) / m->chunk * m->chunk;
    uint64_t bound = keep > held ? keep : held;
    if (res > bound)
      fail("pool %d reserves %" PRIu64 " bytes after a synchronize with "
           "everything complete; its release threshold is %" PRIu64
           " and its live blocks keep at most %" PRIu64,
           p, res, m->threshold, keep);
  }
  prune_freed();
}

/* ========================================================================
 * One input
 * ======================================================================== */

/* The platform's live objects, for the checks that nothing is left. */
typedef struct live_counts {
  uint64_t reservations, chunks, mapped_chunks, streams;
  uint64_t device_bytes[NDEV];
} live_counts;

static void live_get(live_counts *out) {
  memset(out, 0, sizeof *out);
  if (on_cuda) {
    unsigned long long r, a, m, s, dev[NDEV];
    fake_live(&r, &a, &m, &s, dev, NDEV);
    *out = (live_counts){r, a, m, s, {0}};
    for (int d = 0; d < NDEV; d++)
      out->device_bytes[d] = dev[d];
    return;
  }
  /* The host platform's streams finish their last work (a destroyed
   * stream's drain) before its counts are read. */
  tp__host_quiesce();
  tp__host_live h;
  tp__host_live_get(&h);
  *out =
      (live_counts){h.reservations, h.chunks, h.mapped_chunks, h.streams, {0}};
  for (int d = 0; d < NDEV; d++)
    out->device_bytes[d] = h.device_bytes[d];
}

static live_counts live_base;
static bool live_base_set;

static void reset_default_pool(int d) {
  tp_pool_t h = default_pool[d];
  int one = 1;
  uint64_t zero = 0;
  expect_ok(tp_device_set_mem_pool(d, h), "tp_device_set_mem_pool(default)");
  static const tp_pool_attr_t flags[] = {
      TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
      TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
      TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, TP_POOL_ATTR_OOM_WAIT};
  for (int i = 0; i < 4; i++)
    expect_ok(tp_pool_set_attribute(h, flags[i], &one), "reset a policy");
  expect_ok(tp_pool_set_attribute(h, TP_POOL_ATTR_RELEASE_THRESHOLD, &zero),
            "reset the threshold");
  uint64_t slack = 3906;
  expect_ok(tp_pool_set_attribute(h, TP_POOL_ATTR_GROWTH_SLACK, &slack),
            "reset the growth slack");
  tp_access_desc_t other = {{TP_LOCATION_DEVICE, 1 - d, 0}, TP_ACCESS_NONE};
  expect_ok(tp_pool_set_access(h, &other, 1), "reset access");
  expect_ok(tp_pool_trim_to(h, 0), "trim a default pool");
  expect_ok(tp_pool_set_attribute(h, TP_POOL_ATTR_USED_MEM_HIGH, &zero),
            "reset USED_MEM_HIGH");
  expect_ok(tp_pool_set_attribute(h, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero),
            "reset RESERVED_MEM_HIGH");
}

static void begin_input(void) {
  memset(&M, 0, sizeof M);
  nitems = 0;
  log_n = 0;
  M.cur_dev = -1;
  use_device(0);
  for (int d = 0; d < NDEV; d++) {
    M.streams[d] = (mstream){NULL, d, true, true, true, -1, 0, 0};
    tp_pool_props_t pr;
    memset(&pr, 0, sizeof pr);
    pr.alloc_type = TP_ALLOCATION_PINNED;
    pr.location = (tp_location_t){TP_LOCATION_DEVICE, d, 0};
    reset_default_pool(d);
    pool_init_model(d, default_pool[d], &pr, true);
    M.pools[d].is_default = true;
    M.current[d] = d;
    use_device(d);
    expect_ok(tp_event_create(&M.handoff[d]), "tp_event_create (hand-off)");
  }
  M.nstreams = NDEV;
  M.npools = NDEV;
  use_device(0);
}

/* Frees and destroys everything, then checks that nothing is left. */
static void end_input(void) {
  op_quiesce("end of input");
  for (int k = 0; k < MAX_IMPORTS; k++) {
    mimport *im = &M.imports[k];
    if (!im->live)
      continue;
    expect_ok(tp_free_async(im->q, NULL), "tp_free_async(import) at the end");
    im->live = false;
  }
  for (int b = 0; b < MAX_BLOCKS; b++) {
    mblock *k = &M.blocks[b];
    if (!k->live)
      continue;
    expect_ok(tp_free_async(k->p, NULL), "tp_free_async at the end");
    k->live = false;
  }
  for (int p = 0; p < M.npools; p++) {
    mpool *m = &M.pools[p];
    if (m->live && !m->is_default) {
      call_begin(CALL_NO_WAIT, "tp_pool_destroy at the end");
      expect_ok(tp_pool_destroy(m->h), "tp_pool_destroy at the end");
      call_end();
      m->live = false;
    }
  }
  for (int e = 0; e < M.nevents; e++)
    if (M.events[e].live)
      expect_ok(tp_event_destroy(M.events[e].h), "tp_event_destroy at the end");
  for (int d = 0; d < NDEV; d++)
    expect_ok(tp_event_destroy(M.handoff[d]), "tp_event_destroy (hand-off)");
  for (int s = NDEV; s < M.nstreams; s++)
    if (M.streams[s].live) {
      expect_ok(tp_stream_destroy(M.streams[s].h),
                "tp_stream_destroy at the end");
      M.streams[s].live = false;
    }
  /* The pools destroyed with frees still queued go at a synchronize after
   * those frees completed, and exporters once their importers' releases
   * arrive: poll a while. */
  live_counts live;
  double deadline = now_s() + 5.0;
  for (;;) {
    for (int d = 0; d < NDEV; d++) {
      use_device(d);
      (void)tp_device_synchronize();
      expect_ok(tp_pool_trim_to(default_pool[d], 0), "trim a default pool");
    }
    live_get(&live);
    if (!live_base_set ||
        (live.chunks == live_base.chunks &&
         live.reservations == live_base.reservations) ||
        now_s() > deadline)
      break;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  use_device(0);
  check_async();
  for (int g = 0; g < MAX_GATES; g++)
    if (atomic_load(&gates_rt_busy[g]))
      fail("gate slot %d is still held after everything completed", g);
  if (live.chunks != live_base.chunks ||
      live.mapped_chunks != live_base.mapped_chunks)
    fail("%" PRIu64 " chunks (%" PRIu64 " mapped) are still held after every "
         "pool was destroyed and every block freed; %" PRIu64 " at the start",
         live.chunks, live.mapped_chunks, live_base.chunks);
  if (live.reservations != live_base.reservations)
    fail("%" PRIu64 " reservations are left after every pool was destroyed; "
         "%" PRIu64 " at the start",
         live.reservations, live_base.reservations);
  if (live.streams != live_base.streams)
    fail("%" PRIu64 " platform streams are left after every stream was "
         "destroyed; %" PRIu64 " at the start",
         live.streams, live_base.streams);
  for (int d = 0; d < NDEV; d++)
    if (live.device_bytes[d] != live_base.device_bytes[d])
      fail("device %d still holds %" PRIu64 " bytes after everything was "
           "freed and trimmed",
           d, live.device_bytes[d]);
}

typedef void (*op_fn)(reader *);

static void op_malloc_current(reader *r) {
  op_malloc(r, false);
}
static void op_malloc_pool(reader *r) {
  op_malloc(r, true);
}
static void op_quiesce_r(reader *r) {
  (void)r;
  op_quiesce("op");
}
static void op_device_sync(reader *r) {
  sync_device((int)(rd8(r) % NDEV), "op");
}
static void op_set_device(reader *r) {
  int d = (int)(rd8(r) % NDEV);
  logf_("tp_set_device(%d)", d);
  use_device(d);
  int got = -1;
  expect_ok(tp_get_device(&got), "tp_get_device");
  if (got != d)
    fail("tp_get_device gives %d after tp_set_device(%d)", got, d);
}

/* The opcode table: a byte picks an entry, so that frequent operations
 * have several. */
static const op_fn ops[] = {
    op_malloc_current,
    op_malloc_current,
    op_malloc_current,
    op_malloc_pool,
    op_malloc_pool,
    op_malloc_pool,
    op_free,
    op_free,
    op_free,
    op_free,
    op_write,
    op_check,
    op_copy,
    op_gate,
    op_gate,
    op_open,
    op_open,
    op_stream_create,
    op_stream_create,
    op_stream_destroy,
    op_stream_sync,
    op_stream_sync,
    op_device_sync,
    op_event,
    op_event,
    op_event,
    op_pool_create,
    op_pool_create,
    op_pool_destroy,
    op_set_current,
    op_attr,
    op_attr,
    op_trim,
    op_access,
    op_fault,
    op_bad,
    op_bad,
    op_export_pointer,
    op_import_pool,
    op_import_pointer,
    op_free_import,
    op_quiesce_r,
    op_set_device,
};
#define NOPS (sizeof ops / sizeof ops[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  begin_input();
  check_all_stats();
  while (r.n && !items_full()) {
    unsigned code = rd8(&r);
    M.op++;
    ops[code % NOPS](&r);
    check_async();
    check_all_stats();
  }
  end_input();
  return 0;
}

/* TP_FUZZ_SKIP: a comma-separated list of names of open findings
 * (findings/README.md) whose calls or checks are changed so that a run can
 * look past them. */
static const struct {
  const char *name;
  unsigned bit;
} skip_names[] = {{"latewait", SKIP_LATE_WAIT}};

static void parse_skip(void) {
  const char *s = getenv("TP_FUZZ_SKIP");
  while (s && *s) {
    size_t len = strcspn(s, ",");
    bool known = false;
    for (size_t i = 0; i < sizeof skip_names / sizeof skip_names[0]; i++)
      if (strlen(skip_names[i].name) == len &&
          strncmp(s, skip_names[i].name, len) == 0) {
        skip_mask |= 1u << skip_names[i].bit;
        known = true;
      }
    if (!known && len)
      fprintf(stderr, "fuzz_api: TP_FUZZ_SKIP names no finding \"%.*s\"\n",
              (int)len, s);
    s += len;
    if (*s == ',')
      s++;
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *want = getenv("TIDEPOOL_PLATFORM");
  on_cuda = want && strcmp(want, "cuda") == 0;
  if (on_cuda) {
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    setenv("FAKE_CUDA_DEVICE_MEMORY", DEVICE_MEMORY_TEXT, 1);
    setenv("FAKE_CUDA_HOST_MEMORY", DEVICE_MEMORY_TEXT, 1);
  } else {
    setenv("TIDEPOOL_PLATFORM", "host", 1);
  }
  setenv("TIDEPOOL_HOST_DEVICES", "2", 1);
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", DEVICE_MEMORY_TEXT, 1);
  setenv("TIDEPOOL_HOST_HOST_MEMORY", DEVICE_MEMORY_TEXT, 1);
  const char *t = getenv("TP_FUZZ_TRACE");
  trace_on = t && *t && *t != '0';
  parse_skip();
  for (int i = 0; i < MAX_GATES; i++) {
    pthread_mutex_init(&gates_rt[i].mu, NULL);
    pthread_cond_init(&gates_rt[i].cv, NULL);
  }
  memset(wild_buf, 0x5A, sizeof wild_buf);
  const char *name = tp_platform_name();
  if (!name || strcmp(name, on_cuda ? "cuda" : "host") != 0) {
    fprintf(stderr, "fuzz_api: the %s platform did not start\n",
            on_cuda ? "cuda" : "host");
    abort();
  }
  if (on_cuda) {
    /* The platform has loaded the driver by now; only the fake has this. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    *(void **)&fake_live = lib ? dlsym(lib, "fake_cuda_live") : NULL;
    if (!fake_live) {
      fprintf(stderr, "fuzz_api: the cuda mode runs on the fake driver only "
                      "(test/fake_cuda), which is not the one loaded\n");
      abort();
    }
  }
  /* Every default pool an input may touch exists before the first one, so
   * that the live platform objects after each input compare with these. */
  for (int d = 0; d < NDEV; d++) {
    tp_location_t loc = {TP_LOCATION_DEVICE, d, 0};
    tp_pool_t managed = NULL;
    expect_ok(tp_device_get_default_mem_pool(&default_pool[d], d),
              "tp_device_get_default_mem_pool");
    expect_ok(tp_mem_get_default_pool(&managed, &loc, TP_ALLOCATION_MANAGED),
              "tp_mem_get_default_pool(managed)");
    expect_ok(tp_set_device(d), "tp_set_device");
    expect_ok(tp_stream_synchronize(NULL), "tp_stream_synchronize(NULL)");
  }
  expect_ok(tp_set_device(0), "tp_set_device");
  live_get(&live_base);
  live_base_set = true;
  pthread_t w;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&w, &attr, watchdog, NULL) != 0)
    abort();
  pthread_attr_destroy(&attr);
  return 0;
}
