/* What the replay tool's files share: options, per-trace results (of the
 * first pass and of the passes after it), the sampled timeline of used and
 * reserved bytes, and the writers of its SVG plot and Perfetto counter tracks.
 */
#ifndef TP_REPLAY_H
#define TP_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tidepool.h"
#include "trace.h"

typedef struct replay_sample {
  double x; /* operation index */
  uint64_t used, reserved;
} replay_sample;

typedef struct replay_timeline {
  replay_sample *v;
  size_t n, cap;
} replay_timeline;

typedef struct replay_options {
  uint64_t threshold;           /* the pool's release threshold */
  uint64_t growth_slack;        /* parts per million; UINT64_MAX: default */
  unsigned lag;                 /* operations the device runs behind */
  unsigned passes;              /* times the trace is replayed; 0 means 1 */
  bool progress;                /* a progress bar on stderr */
  replay_timeline *timeline;    /* NULL: no sampling */
  struct replay_result *driver; /* non-NULL: replay through the driver too */
} replay_options;

typedef struct replay_result {
  size_t allocs, ops, skipped_frees;
  uint64_t peak_used, peak_reserved, maps, unmaps;
  /* Unmaps in the trace's second half, where a training loop has warmed up:
   * the chunk moves its steady state still makes. */
  uint64_t late_unmaps;
  uint64_t growth_slack; /* the pool's, parts per million, as replayed */
  double ratio, seconds;
  /* Passes 2 and on, through the pool the first pass grew: its steady
   * state, which a training run repeating its steps spends its time in.
   * Every other figure is the first pass's alone, so that it compares with
   * a run of one pass; all_peak_reserved and all_ratio are over every
   * pass (a pool may reserve more in a later pass than in the first). */
  size_t warm_ops;
  uint64_t warm_maps, warm_unmaps; /* tidepool only */
  uint64_t all_peak_reserved;
  double warm_seconds, all_ratio;
} replay_result;

/* Replays one trace through a fresh pool of device 0, o->passes times in a
 * row through the same pool. Returns 0, or -1 with a message in err (an
 * allocation that fails names the trace's line or entry and the device's
 * size). The timeline samples the first pass only. */
int replay_trace(const replay_options *o, const trace *t, replay_result *r,
                 char *err, size_t errlen);

/* The same trace through the CUDA driver's own pool (cuda platform only),
 * on the streams the tidepool replay used (cast CUstreams), with the same
 * lag model and the same number of passes. */
int replay_driver(const replay_options *o, const trace *t, tp_stream_t *streams,
                  replay_result *r, char *err, size_t errlen);

/* The distribution of a recorded trace's lag: for each operation with a
 * known fifth column, the operations issued since the newest one of its
 * stream known complete. */
typedef struct replay_lag_stats {
  size_t known, unknown; /* operations with and without a known completion */
  uint64_t median, p90, p99, max;
  double mean;
} replay_lag_stats;
/* -1 when the trace has no fifth column. */
int replay_measure_lag(const trace *t, replay_lag_stats *out);

void replay_timeline_add(replay_timeline *tl, double x, uint64_t used,
                         uint64_t reserved);

/* The timelines of several traces: one chart each, stacked in one SVG, and
 * one process of counter tracks each in one Chrome trace-event file whose
 * time axis counts operations (1 us = 1 operation of the trace). */
typedef struct replay_chart {
  const char *title;
  const replay_timeline *tl;
} replay_chart;
int replay_write_svg(FILE *f, const replay_chart *charts, size_t n);
int replay_write_perfetto(FILE *f, const replay_chart *charts, size_t n);

/* s as the body of a JSON string: quotes, backslashes and control
 * characters escaped, bytes that are not UTF-8 replaced by U+FFFD. */
void replay_json_string(FILE *f, const char *s);

#endif /* TP_REPLAY_H */
