/* tidepool-replay: replays allocation traces of real workloads through a
 * tidepool pool (one tidepool stream per trace stream) and reports peak used
 * and reserved memory, their ratio, chunk maps and the replay's speed. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "replay.h"
#include "tidepool.h"
#include "trace.h"

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

/* Where a pool's reserved bytes went, for tuning: free completed, free
 * pending, cached large, rounding of large, slab bytes, rounding in slabs,
 * free slab blocks, small blocks held by caches or pending. */
void tp__pool_breakdown(tp_pool_t pool, uint64_t out[8]);

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
  tp_stream_t *streams = calloc(t->nstreams ? t->nstreams : 1, sizeof *streams);
  void **ptrs = calloc(t->nnames ? t->nnames : 1, sizeof *ptrs);
  int rc = streams && ptrs ? 0 : -1;
  if (rc)
    snprintf(err, errlen, "%s: out of memory", t->path);
  /* Stream 0 is the program's default stream: tidepool's legacy stream. */
  for (uint16_t s = 1; rc == 0 && s < t->nstreams; s++) {
    e = tp_stream_create(&streams[s], TP_STREAM_DEFAULT);
    if (e != TP_SUCCESS) {
      snprintf(err, errlen, "%s: creating stream %u: %s", t->path, s,
               tp_error_name(e));
      rc = -1;
    }
  }
  size_t step = t->nops / 4000 + 1;
  bool breakdown = getenv("TP_REPLAY_BREAKDOWN") != NULL;
  uint64_t high = 0, bd[8] = {0};
  double t0 = now_s();
  for (size_t i = 0; rc == 0 && i < t->nops; i++) {
    const trace_op *op = &t->ops[i];
    if (op->action == TRACE_ALLOC) {
      e = tp_malloc_from_pool_async(&ptrs[op->name], (size_t)op->size, pool,
                                    streams[op->stream]);
      r->ops++;
      if (e != TP_SUCCESS) {
        snprintf(err, errlen, "%s: operation %zu: allocating %llu bytes: %s",
                 t->path, i + 2, (unsigned long long)op->size,
                 tp_error_name(e));
        rc = -1;
      }
    } else if (op->action == TRACE_FREE && op->name != UINT32_MAX &&
               ptrs[op->name]) {
      e = tp_free_async(ptrs[op->name], streams[op->stream]);
      ptrs[op->name] = NULL;
      r->ops++;
      if (e != TP_SUCCESS) {
        snprintf(err, errlen, "%s: operation %zu: free: %s", t->path, i + 2,
                 tp_error_name(e));
        rc = -1;
      }
    } else if (op->action == TRACE_FREE) {
      r->skipped_frees++;
    }
    if (o->timeline && (i % step == 0 || i + 1 == t->nops))
      replay_timeline_add(o->timeline, (double)i,
                          attr64(pool, TP_POOL_ATTR_USED_MEM_CURRENT),
                          attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT));
    if ((i & 0xffff) == 0)
      progress(o, t, i, false);
    if (breakdown && attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT) > high) {
      high = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
      tp__pool_breakdown(pool, bd);
    }
  }
  r->seconds = now_s() - t0;
  if (breakdown)
    fprintf(stderr,
            "%s at peak reserved %.1f MiB: free %.1f, free pending %.1f, "
            "cached %.1f, large rounding %.1f, slabs %.1f (rounding %.1f, "
            "free %.1f, held %.1f) MiB\n",
            t->path, (double)high / 1048576, (double)bd[0] / 1048576,
            (double)bd[1] / 1048576, (double)bd[2] / 1048576,
            (double)bd[3] / 1048576, (double)bd[4] / 1048576,
            (double)bd[5] / 1048576, (double)bd[6] / 1048576,
            (double)bd[7] / 1048576);
  progress(o, t, t->nops, true);
  r->peak_used = attr64(pool, TP_POOL_ATTR_USED_MEM_HIGH);
  r->peak_reserved = attr64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH);
  r->maps = attr64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  r->unmaps = attr64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  r->ratio =
      r->peak_used ? (double)r->peak_reserved / (double)r->peak_used : 0.0;
  for (uint32_t n = 0; ptrs && n < t->nnames; n++)
    if (ptrs[n])
      (void)tp_free_async(ptrs[n], NULL);
  (void)tp_device_synchronize();
  if (rc == 0 && o->driver)
    rc = replay_driver(t, (void *const *)streams, o->driver, err, errlen);
  for (uint16_t s = 1; streams && s < t->nstreams; s++)
    if (streams[s])
      (void)tp_stream_destroy(streams[s]);
  (void)tp_pool_destroy(pool);
  free(streams);
  free(ptrs);
  return rc;
}
