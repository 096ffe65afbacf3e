/* Replaying one trace through a fresh tidepool pool (one tidepool stream per
 * trace stream, held back by the lag model when the device runs behind),
 * once or several times in a row through the same pool: peak used and
 * reserved memory, their ratio, chunk maps and the replay's speed, of the
 * first pass and of the passes after it; and the lag distribution of a
 * recorded trace. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lag.h"
#include "pool/pool_verify.h"
#include "replay.h"
#include "tidepool.h"
#include "trace.h"

/* What an allocation of 0 bytes, which gives no pointer, is recorded as, so
 * that its free is not taken for the free of an allocation never made. */
static char zero_bytes;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t attr64(tp_pool_t pool, tp_pool_attr_t a) {
  uint64_t v = 0;
  (void)tp_pool_get_attribute(pool, a, &v);
  return v;
}

static void progress(const replay_options *o, const trace *t, size_t i,
                     bool done) {
  if (!o->progress)
    return;
  int width = 40, fill = (int)((double)i / (double)t->nops * width);
  fprintf(stderr, "\r%-28.28s [%.*s%*s] %3d%%", t->path, fill,
          "########################################", width - fill, "",
          (int)(100.0 * (double)i / (double)t->nops));
  if (done)
    fprintf(stderr, "\r%*s\r", width + 40, "");
}

/* What an allocation that failed says: where in the trace, and, for an
 * out-of-memory, how big the device is and how to make it bigger. */
static void alloc_failed(const trace *t, const trace_op *op, tp_error_t e,
                         tp_pool_t pool, char *err, size_t errlen) {
  char where[300];
  trace_where(t, op, where, sizeof where);
  const char *platform = tp_platform_name();
  const char *memory = getenv("TIDEPOOL_HOST_DEVICE_MEMORY");
  if (e == TP_ERROR_OUT_OF_MEMORY && platform && strcmp(platform, "host") == 0)
    snprintf(err, errlen,
             "%s: allocating %llu bytes on stream %u: %s: the pool holds "
             "%.1f MiB and the emulated device has "
             "TIDEPOOL_HOST_DEVICE_MEMORY=%s; set it higher to replay this "
             "trace",
             where, (unsigned long long)op->size, op->stream, tp_error_name(e),
             (double)attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) /
                 1048576.0,
             memory ? memory : "(unset)");
  else if (e == TP_ERROR_OUT_OF_MEMORY)
    snprintf(err, errlen,
             "%s: allocating %llu bytes on stream %u: %s: the pool holds "
             "%.1f MiB and the GPU has no more",
             where, (unsigned long long)op->size, op->stream, tp_error_name(e),
             (double)attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) /
                 1048576.0);
  else
    snprintf(err, errlen, "%s: allocating %llu bytes on stream %u: %s", where,
             (unsigned long long)op->size, op->stream, tp_error_name(e));
}

/* What every pass over one trace works on: the pool, its streams, and the
 * pointers that the trace's names stand for. */
typedef struct replay_run {
  const replay_options *o;
  const trace *t;
  tp_pool_t pool;
  tp_stream_t *streams;
  uint16_t nstreams;
  void **ptrs;
  bool on_host;
  /* TP_REPLAY_BREAKDOWN: the pool's makeup at its highest reservation over
   * every pass, which is where its ratio is made. */
  bool breakdown;
  uint64_t high, bd[8];
} replay_run;

/* The figures of one pass. */
typedef struct replay_pass_result {
  size_t ops, skipped_frees;
  uint64_t half_unmaps; /* the unmaps made before the pass's second half */
  double seconds;
} replay_pass_result;

/* One timed pass over the trace. It has a lag model of its own, since the
 * model counts the operations of a pass from 0 and must have let every
 * stream run free before the pool is drained. tl: where the pass samples
 * its timeline, or NULL. */
static int replay_pass(replay_run *run, replay_timeline *tl,
                       replay_pass_result *p, char *err, size_t errlen) {
  const replay_options *o = run->o;
  const trace *t = run->t;
  void **ptrs = run->ptrs;
  memset(p, 0, sizeof *p);
  char why[300];
  lag_model *lag = NULL;
  if (o->lag > 0 && lag_start(&lag, o->lag, run->streams, run->nstreams,
                              run->on_host, why, sizeof why) != 0) {
    snprintf(err, errlen, "%s: %s", t->path, why);
    return -1;
  }
  size_t step = t->nops / 4000 + 1;
  int rc = 0;
  double t0 = now_s();
  for (size_t i = 0; rc == 0 && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    if (i == t->nops / 2)
      p->half_unmaps = attr64(run->pool, TP_POOL_ATTR_CHUNK_UNMAPS);
    bool alloc = op->action == TRACE_ALLOC;
    if (op->action == TRACE_FREE && op->name != TRACE_NO_NAME &&
        ptrs[op->name] == &zero_bytes) {
      ptrs[op->name] = NULL; /* the free of an allocation of 0 bytes */
      continue;
    }
    bool issue = alloc || (op->action == TRACE_FREE &&
                           op->name != TRACE_NO_NAME && ptrs[op->name]);
    if (op->action == TRACE_FREE && !issue)
      p->skipped_frees++;
    if (!issue)
      continue;
    if (lag && lag_before(lag, p->ops, why, sizeof why) != 0) {
      snprintf(err, errlen, "%s: %s", t->path, why);
      rc = -1;
      break;
    }
    tp_error_t e;
    if (alloc) {
      e = tp_malloc_from_pool_async(&ptrs[op->name], (size_t)op->size,
                                    run->pool, run->streams[op->stream]);
      if (e != TP_SUCCESS) {
        alloc_failed(t, op, e, run->pool, err, errlen);
        rc = -1;
      } else if (op->size == 0) {
        ptrs[op->name] = &zero_bytes; /* NULL would read as never made */
      }
    } else {
      e = tp_free_async(ptrs[op->name], run->streams[op->stream]);
      ptrs[op->name] = NULL;
      if (e != TP_SUCCESS) {
        char where[300];
        trace_where(t, op, where, sizeof where);
        snprintf(err, errlen, "%s: free on stream %u: %s", where, op->stream,
                 tp_error_name(e));
        rc = -1;
      }
    }
    if (rc == 0 && lag &&
        lag_after(lag, p->ops, op->stream, alloc, why, sizeof why) != 0) {
      snprintf(err, errlen, "%s: %s", t->path, why);
      rc = -1;
    }
    p->ops++;
    if (tl && (i % step == 0 || i + 1 == t->nops))
      replay_timeline_add(tl, (double)i,
                          attr64(run->pool, TP_POOL_ATTR_USED_MEM_CURRENT),
                          attr64(run->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT));
    if ((i & 0xffff) == 0)
      progress(o, t, i, false);
    if (run->breakdown &&
        attr64(run->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) > run->high) {
      run->high = attr64(run->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
      tp__pool_breakdown(run->pool, run->bd);
    }
  }
  p->seconds = now_s() - t0;
  if (lag_stop(lag, why, sizeof why) != 0 && rc == 0) {
    snprintf(err, errlen, "%s: %s", t->path, why);
    rc = -1;
  }
  progress(o, t, t->nops, true);
  return rc;
}

/* Frees what a pass left live (on the legacy stream, as the end of a replay
 * always has), waits for the device and forgets the pointers, so that the
 * next pass, like the first, begins with nothing live and nothing pending
 * and the pool holds only what it kept. */
static void replay_drain(replay_run *run) {
  for (uint32_t n = 0; run->ptrs && n < run->t->nnames; n++) {
    if (run->ptrs[n] && run->ptrs[n] != &zero_bytes)
      (void)tp_free_async(run->ptrs[n], NULL);
    run->ptrs[n] = NULL;
  }
  (void)tp_device_synchronize();
}

int replay_trace(const replay_options *o, const trace *t, replay_result *r,
                 char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->allocs = t->nallocs;
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  tp_pool_t pool = NULL;
  tp_error_t e = tp_pool_create(&pool, &props);
  if (e != TP_SUCCESS) {
    snprintf(err, errlen, "%s: creating the pool: %s", t->path,
             tp_error_name(e));
    return -1;
  }
  uint64_t threshold = o->threshold;
  (void)tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &threshold);
  uint64_t slack = o->growth_slack;
  if (slack != UINT64_MAX &&
      (e = tp_pool_set_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, &slack)) !=
          TP_SUCCESS) {
    snprintf(err, errlen, "%s: setting the growth slack: %s", t->path,
             tp_error_name(e));
    (void)tp_pool_destroy(pool);
    return -1;
  }
  if (o->lag > 0) {
    /* Waiting on the host for frees that the model holds back would wait
     * for the replay itself. */
    int off = 0;
    (void)tp_pool_set_attribute(pool, TP_POOL_ATTR_OOM_WAIT, &off);
  }
  uint16_t nstreams = t->nstreams ? t->nstreams : 1;
  tp_stream_t *streams = calloc(nstreams, sizeof *streams);
  void **ptrs = calloc(t->nnames ? t->nnames : 1, sizeof *ptrs);
  int rc = streams && ptrs ? 0 : -1;
  if (rc)
    snprintf(err, errlen, "%s: out of memory", t->path);
  /* Stream 0 is the program's default stream: tidepool's legacy stream.
   * With a lag the others are non-blocking, as PyTorch's side streams are:
   * blocking ones would chain every stream's gates to the legacy stream's,
   * a synchronisation the recorded program did not have. Without a lag they
   * stay blocking, as the replay has always run them. */
  unsigned flags = o->lag > 0 ? TP_STREAM_NON_BLOCKING : TP_STREAM_DEFAULT;
  for (uint16_t s = 1; rc == 0 && s < nstreams; s++) {
    e = tp_stream_create(&streams[s], flags);
    if (e != TP_SUCCESS) {
      snprintf(err, errlen, "%s: creating stream %u: %s", t->path, s,
               tp_error_name(e));
      rc = -1;
    }
  }
  const char *platform = tp_platform_name();
  replay_run run = {.o = o,
                    .t = t,
                    .pool = pool,
                    .streams = streams,
                    .nstreams = nstreams,
                    .ptrs = ptrs,
                    .on_host = platform && strcmp(platform, "host") == 0,
                    .breakdown = getenv("TP_REPLAY_BREAKDOWN") != NULL};
  /* Options built without the field (0) replay once, as they always did. */
  unsigned passes = o->passes ? o->passes : 1;
  uint64_t maps_before_warm = 0, unmaps_before_warm = 0;
  for (unsigned k = 0; rc == 0 && k < passes; k++) {
    if (k == 1) {
      maps_before_warm = attr64(pool, TP_POOL_ATTR_CHUNK_MAPS);
      unmaps_before_warm = attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
    }
    replay_pass_result p;
    rc = replay_pass(&run, k == 0 ? o->timeline : NULL, &p, err, errlen);
    if (k == 0) {
      /* Read before the drain, as a replay of one pass always read them. */
      r->ops = p.ops;
      r->skipped_frees = p.skipped_frees;
      r->seconds = p.seconds;
      r->maps = attr64(pool, TP_POOL_ATTR_CHUNK_MAPS);
      r->unmaps = attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
      r->late_unmaps = r->unmaps - p.half_unmaps;
      r->peak_used = attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH);
      r->peak_reserved = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
    } else {
      r->warm_ops += p.ops;
      r->warm_seconds += p.seconds;
    }
    if (rc == 0 && k + 1 < passes)
      replay_drain(&run);
  }
  if (passes > 1) {
    r->warm_maps = attr64(pool, TP_POOL_ATTR_CHUNK_MAPS) - maps_before_warm;
    r->warm_unmaps =
        attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS) - unmaps_before_warm;
  }
  if (run.breakdown)
    fprintf(stderr,
            "%s at peak reserved %.1f MiB: free %.1f, free pending %.1f, "
            "cached %.1f, large rounding %.1f, slabs %.1f (rounding %.1f, "
            "free %.1f, held %.1f) MiB\n",
            t->path, (double)run.high / 1048576, (double)run.bd[0] / 1048576,
            (double)run.bd[1] / 1048576, (double)run.bd[2] / 1048576,
            (double)run.bd[3] / 1048576, (double)run.bd[4] / 1048576,
            (double)run.bd[5] / 1048576, (double)run.bd[6] / 1048576,
            (double)run.bd[7] / 1048576);
  r->growth_slack = attr64(pool, TP_POOL_ATTR_GROWTH_SLACK);
  r->ratio =
      r->peak_used ? (double)r->peak_reserved / (double)r->peak_used : 0.0;
  uint64_t all_used = attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH);
  r->all_peak_reserved = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
  r->all_ratio = all_used ? (double)r->all_peak_reserved / (double)all_used : 0;
  replay_drain(&run);
  if (rc == 0 && o->driver)
    rc = replay_driver(o, t, streams, o->driver, err, errlen);
  for (uint16_t s = 1; streams && s < nstreams; s++)
    if (streams[s])
      (void)tp_stream_destroy(streams[s]);
  (void)tp_pool_destroy(pool);
  free(streams);
  free(ptrs);
  return rc;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int replay_measure_lag(const trace *t, replay_lag_stats *out) {
  memset(out, 0, sizeof *out);
  if (!t->done)
    return -1;
  uint64_t *v = malloc((t->nops ? t->nops : 1) * sizeof *v);
  if (!v)
    return -1;
  double sum = 0;
  for (size_t i = 0; i < t->nops; i++) {
    if (t->done[i] < 0) {
      out->unknown++;
      continue;
    }
    v[out->known] = (uint64_t)(i - (size_t)t->done[i]);
    sum += (double)v[out->known++];
  }
  if (out->known) {
    qsort(v, out->known, sizeof *v, cmp_u64);
    out->median = v[out->known / 2];
    out->p90 = v[out->known * 9 / 10];
    out->p99 = v[out->known * 99 / 100];
    out->max = v[out->known - 1];
    out->mean = sum / (double)out->known;
  }
  free(v);
  return 0;
}
