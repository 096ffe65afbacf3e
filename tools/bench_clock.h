/* What the benchmark programs share to time calls: a monotonic clock in
 * nanoseconds and the comparison that sorts rounds for their median. */
#ifndef TP_BENCH_CLOCK_H
#define TP_BENCH_CLOCK_H

#include <time.h>

static inline double bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* For qsort of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#endif /* TP_BENCH_CLOCK_H */
