/* The hash finalizer the trace readers' tables share (MurmurHash3's): each
 * bit of its input reaches every bit of its output, so that keys made to
 * collide under a plain multiplication spread over a table's slots. */
#ifndef TP_REPLAY_MIX_H
#define TP_REPLAY_MIX_H

#include <stdint.h>

static inline uint64_t tp_replay_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

#endif /* TP_REPLAY_MIX_H */
