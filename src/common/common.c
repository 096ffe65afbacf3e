/* Implementation of the shared helpers of common.h: failed-check reporting,
 * environment parsing and growable arrays. */
#include "common.h"
#include "common/hot.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

/* The epoch clock and the stream generation start at 1, so that 0 can mean
 * "outside" and "never seen". */
tp__hot_line tp__hot = {.guard_epoch = 1, .stream_gen = 1};

void tp__check_failed(const char *what, const char *file, int line) {
  fprintf(stderr, "tidepool: invariant violated at %s:%d: %s\n", file, line,
          what);
  abort();
}

uint64_t tp__env_size(const char *name, uint64_t fallback, bool *bad) {
  const char *s = getenv(name);
  if (!s || !*s)
    return fallback;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  /* errno: a number beyond 64 bits, which strtoull saturates. */
  if (end == s || !isdigit((unsigned char)*s) || errno) {
    *bad = true;
    return fallback;
  }
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    shift = 10;
    end++;
    break;
  case 'M':
    shift = 20;
    end++;
    break;
  case 'G':
    shift = 30;
    end++;
    break;
  case 'T':
    shift = 40;
    end++;
    break;
  default: break;
  }
  if ((*end == 'i' || *end == 'I') && shift)
    end++;
  if ((*end == 'B' || *end == 'b'))
    end++;
  if (*end != '\0' || (shift && v > (UINT64_MAX >> shift))) {
    *bad = true;
    return fallback;
  }
  return (uint64_t)v << shift;
}

uint64_t tp__env_count(const char *name, uint64_t fallback, uint64_t max,
                       bool *bad) {
  const char *s = getenv(name);
  if (!s || !*s)
    return fallback;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!isdigit((unsigned char)*s) || *end != '\0' || errno || v > max) {
    *bad = true;
    return fallback;
  }
  return v;
}

void tp__env_warn(const char *name, const char *expected) {
  fprintf(stderr, "tidepool: %s=\"%s\" is invalid (expected %s); ignored\n",
          name, getenv(name), expected);
}

bool tp__array_room(void **arr, uint32_t n, uint32_t *cap, size_t elem) {
  if (n < *cap)
    return true;
  uint32_t ncap = *cap ? *cap * 2 : 8;
  if (ncap <= *cap)
    return false;
  void *p = realloc(*arr, (size_t)ncap * elem);
  if (!p)
    return false;
  *arr = p;
  *cap = ncap;
  return true;
}
