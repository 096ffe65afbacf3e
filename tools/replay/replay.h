/* What the replay tool's files share: options, per-trace results, the
 * sampled timeline of used and reserved bytes, and the writers of its SVG
 * plot and Perfetto counter tracks. */
#ifndef TP_REPLAY_H
#define TP_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
  bool progress;                /* a progress bar on stderr */
  replay_timeline *timeline;    /* NULL: no sampling */
  struct replay_result *driver; /* non-NULL: replay through the driver too */
} replay_options;

typedef struct replay_result {
  size_t allocs, ops, skipped_frees;
  uint64_t peak_used, peak_reserved, maps, unmaps;
  double ratio, seconds;
} replay_result;

/* Replays one trace through a fresh pool of device 0. Returns 0, or -1 with
 * a message in err. */
int replay_trace(const replay_options *o, const trace *t, replay_result *r,
                 char *err, size_t errlen);

/* The same trace through the CUDA driver's own pool (cuda platform only),
 * on the streams the tidepool replay used (cast CUstreams). */
int replay_driver(const trace *t, void *const *streams, replay_result *r,
                  char *err, size_t errlen);

void replay_timeline_add(replay_timeline *tl, double x, uint64_t used,
                         uint64_t reserved);

/* The timeline as an SVG line chart, and as Chrome trace-event counters. */
int replay_write_svg(FILE *f, const char *title, const replay_timeline *tl);
int replay_write_perfetto(FILE *f, const char *name, const replay_timeline *tl);

#endif /* TP_REPLAY_H */
