/* The CUDA driver's own stream-ordered allocator as the replay's yardstick:
 * the same trace through cuMemAllocFromPoolAsync on a fresh driver pool of
 * device 0, in the same process and on the same streams, as many passes
 * through that pool as the tidepool replay made. libcuda is reached
 * through dlopen, as tidepool's cuda platform reaches it, so the tool builds
 * without the CUDA toolkit. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dl_table.h"
#include "lag.h"
#include "replay.h"

/* The few driver types used, laid out as cuda.h declares them. */
typedef int cu_result;
typedef void *cu_pool;
typedef void *cu_stream;
typedef unsigned long long cu_ptr;
typedef struct cu_pool_props {
  int alloc_type;
  int handle_types;
  struct {
    int type;
    int id;
  } location;
  void *win32_security;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
} cu_pool_props;
enum {
  CU_ALLOC_PINNED = 1,
  CU_LOCATION_DEVICE = 1,
  CU_POOL_RELEASE_THRESHOLD = 4,
  CU_POOL_RESERVED_HIGH = 6,
  CU_POOL_USED_HIGH = 8
};

static struct {
  cu_result (*pool_create)(cu_pool *, const cu_pool_props *);
  cu_result (*pool_destroy)(cu_pool);
  cu_result (*pool_set)(cu_pool, int, void *);
  cu_result (*pool_get)(cu_pool, int, void *);
  cu_result (*alloc)(cu_ptr *, size_t, cu_pool, cu_stream);
  cu_result (*free)(cu_ptr, cu_stream);
  cu_result (*ctx_sync)(void);
  cu_result (*error_name)(cu_result, const char **);
} cu;

static int load(char *err, size_t len) {
  const dl_sym syms[] = {{&cu.pool_create, "cuMemPoolCreate"},
                         {&cu.pool_destroy, "cuMemPoolDestroy"},
                         {&cu.pool_set, "cuMemPoolSetAttribute"},
                         {&cu.pool_get, "cuMemPoolGetAttribute"},
                         {&cu.alloc, "cuMemAllocFromPoolAsync"},
                         {&cu.free, "cuMemFreeAsync"},
                         {&cu.ctx_sync, "cuCtxSynchronize"},
                         {&cu.error_name, "cuGetErrorName"}};
  const char *missing =
      dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]);
  if (missing && !*missing)
    snprintf(err, len, "--against driver: libcuda.so.1 cannot be loaded");
  else if (missing)
    snprintf(err, len, "--against driver: libcuda lacks %s", missing);
  return missing ? -1 : 0;
}

static const char *name_of(cu_result r) {
  const char *n = "CUDA_ERROR_UNKNOWN";
  cu.error_name(r, &n);
  return n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What every pass over one trace works on: the driver's pool, the tidepool
 * replay's streams, and the pointers that the trace's names stand for. */
typedef struct driver_run {
  const replay_options *o;
  const trace *t;
  cu_pool pool;
  tp_stream_t *streams;
  cu_ptr *ptrs;
} driver_run;

/* One timed pass over the trace, with a lag model of its own as the
 * tidepool replay's passes have (replay.c says why). */
static int driver_pass(driver_run *run, size_t *ops, double *seconds, char *err,
                       size_t len) {
  const replay_options *o = run->o;
  const trace *t = run->t;
  cu_ptr *ptrs = run->ptrs;
  *ops = 0;
  *seconds = 0;
  /* The same model of a device running behind as the tidepool replay had,
   * on the same streams, with the same gates (stream memory operations);
   * the driver's pool learns of completions through its own events, which
   * the gates hold as they hold tidepool's. The model is the conservative
   * one (lag.h), as tidepool's is on cuda: what the driver queues is out of
   * sight, so both pools run under the same schedule. */
  lag_model *lag = NULL;
  char why[300];
  if (o->lag > 0 &&
      lag_start(&lag, o->lag, run->streams, t->nstreams ? t->nstreams : 1,
                false, why, sizeof why) != 0) {
    snprintf(err, len, "%s: driver: %s", t->path, why);
    return -1;
  }
  int ret = 0;
  double t0 = now_s();
  for (size_t i = 0; ret == 0 && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    bool alloc = op->action == TRACE_ALLOC && op->size > 0;
    bool issue = alloc || (op->action == TRACE_FREE &&
                           op->name != TRACE_NO_NAME && ptrs[op->name]);
    if (!issue)
      continue;
    if (lag && lag_before(lag, *ops, why, sizeof why) != 0) {
      snprintf(err, len, "%s: driver: %s", t->path, why);
      ret = -1;
      break;
    }
    cu_result rc;
    if (alloc) {
      rc = cu.alloc(&ptrs[op->name], (size_t)op->size, run->pool,
                    (cu_stream)run->streams[op->stream]);
    } else {
      rc = cu.free(ptrs[op->name], (cu_stream)run->streams[op->stream]);
      ptrs[op->name] = 0;
    }
    if (rc) {
      char where[300];
      trace_where(t, op, where, sizeof where);
      snprintf(err, len, "%s: the driver's pool: %s", where, name_of(rc));
      ret = -1;
    } else if (lag &&
               lag_after(lag, *ops, op->stream, alloc, why, sizeof why)) {
      snprintf(err, len, "%s: driver: %s", t->path, why);
      ret = -1;
    }
    (*ops)++;
  }
  *seconds = now_s() - t0;
  if (lag_stop(lag, why, sizeof why) != 0 && ret == 0) {
    snprintf(err, len, "%s: driver: %s", t->path, why);
    ret = -1;
  }
  return ret;
}

/* Frees what a pass left live, waits for the device and forgets the
 * pointers: the next pass begins, as the first did, with nothing live. */
static void driver_drain(driver_run *run) {
  for (uint32_t n = 0; run->ptrs && n < run->t->nnames; n++) {
    if (run->ptrs[n])
      (void)cu.free(run->ptrs[n], NULL);
    run->ptrs[n] = 0;
  }
  (void)cu.ctx_sync();
}

int replay_driver(const replay_options *o, const trace *t, tp_stream_t *streams,
                  replay_result *r, char *err, size_t len) {
  memset(r, 0, sizeof *r);
  r->allocs = t->nallocs;
  if (!cu.alloc && load(err, len) != 0)
    return -1;
  cu_pool_props props = {.alloc_type = CU_ALLOC_PINNED,
                         .location = {CU_LOCATION_DEVICE, 0}};
  cu_pool pool = NULL;
  cu_result rc = cu.pool_create(&pool, &props);
  if (rc) {
    snprintf(err, len, "%s: cuMemPoolCreate: %s", t->path, name_of(rc));
    return -1;
  }
  /* As the anchors were measured: the pool keeps what it reserved. */
  uint64_t keep = UINT64_MAX;
  (void)cu.pool_set(pool, CU_POOL_RELEASE_THRESHOLD, &keep);
  cu_ptr *ptrs = calloc(t->nnames ? t->nnames : 1, sizeof *ptrs);
  int ret = ptrs ? 0 : -1;
  if (!ptrs)
    snprintf(err, len, "%s: out of memory", t->path);
  driver_run run = {o, t, pool, streams, ptrs};
  unsigned passes = o->passes ? o->passes : 1;
  for (unsigned k = 0; ret == 0 && k < passes; k++) {
    size_t ops;
    double seconds;
    ret = driver_pass(&run, &ops, &seconds, err, len);
    if (k == 0) {
      r->ops = ops;
      r->seconds = seconds;
      (void)cu.pool_get(pool, CU_POOL_USED_HIGH, &r->peak_used);
      (void)cu.pool_get(pool, CU_POOL_RESERVED_HIGH, &r->peak_reserved);
    } else {
      r->warm_ops += ops;
      r->warm_seconds += seconds;
    }
    if (ret == 0 && k + 1 < passes)
      driver_drain(&run);
  }
  r->ratio =
      r->peak_used ? (double)r->peak_reserved / (double)r->peak_used : 0.0;
  uint64_t all_used = 0;
  (void)cu.pool_get(pool, CU_POOL_USED_HIGH, &all_used);
  (void)cu.pool_get(pool, CU_POOL_RESERVED_HIGH, &r->all_peak_reserved);
  r->all_ratio = all_used ? (double)r->all_peak_reserved / (double)all_used : 0;
  driver_drain(&run);
  (void)cu.pool_destroy(pool);
  free(ptrs);
  return ret;
}
