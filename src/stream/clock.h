/* Dependency clocks (stream.h's tp__clock): raising one entry, merging one
 * clock into another, as streams and events carry them. Not thread-safe: the
 * holder's lock guards a clock. */
#ifndef TP_CLOCK_H
#define TP_CLOCK_H

#include "stream/stream.h"

static inline uint64_t tp__clock_get(const tp__clock *c, uint64_t key) {
  for (uint32_t i = 0; i < c->n; i++)
    if (c->v[i].key == key)
      return c->v[i].value;
  return 0;
}

static inline bool tp__clock_raise(tp__clock *c, uint64_t key, uint64_t value) {
  for (uint32_t i = 0; i < c->n; i++) {
    if (c->v[i].key == key) {
      if (c->v[i].value < value)
        c->v[i].value = value;
      return true;
    }
  }
  if (!TP_ARRAY_ROOM(c->v, c->n, c->cap))
    return false;
  c->v[c->n++] = (tp__clock_entry){key, value};
  return true;
}

static inline bool tp__clock_merge(tp__clock *dst, const tp__clock *src) {
  for (uint32_t i = 0; i < src->n; i++)
    if (!tp__clock_raise(dst, src->v[i].key, src->v[i].value))
      return false;
  return true;
}

static inline void tp__clock_free(tp__clock *c) {
  free(c->v);
  *c = (tp__clock){0};
}

#endif /* TP_CLOCK_H */
