/* Tables of fixed-size slots that are never freed: the objects behind
 * public handles (pools, graphs, execs) live in them, so that any value a
 * caller passes can be checked without being dereferenced, and a destroyed
 * object's handle stays recognisable for as long as its slot is not given
 * to another (pools), or for good where the handle carries a generation
 * that the slot's reuse advances (graphs and execs, api/graph.c). */
#ifndef TP_SLOTS_H
#define TP_SLOTS_H

#include "common/common.h"

/* 4096 slots a chunk, chunks made as needed, 4M slots in all. */
#define TP_SLOTS_CHUNK 4096u
#define TP_SLOTS_MAX_CHUNKS 1024u

/* The size and count come first, so that a check reads the first chunks'
 * addresses from the same line. */
typedef struct tp__slots {
  size_t size; /* bytes a slot */
  _Atomic uint32_t nchunks;
  uint64_t taken; /* slots handed out so far, under the owner's lock */
  void *_Atomic chunks[TP_SLOTS_MAX_CHUNKS];
} tp__slots;
#define TP_SLOTS_INIT(type)                                                    \
  { .size = sizeof(type) }

/* A slot never used (all zeros); NULL when memory or slots run out, and
 * then the owner reuses its own (pools the oldest destroyed, graphs and
 * execs any free one, their handles carrying a generation). The owner
 * serialises the calls. */
void *tp__slots_take(tp__slots *t);
/* Whether every slot was handed out (tp__slots_take's NULL then means that,
 * not a shortage of memory). The owner's lock held. */
static inline bool tp__slots_full(const tp__slots *t) {
  return t->taken == (uint64_t)TP_SLOTS_MAX_CHUNKS * TP_SLOTS_CHUNK;
}
/* Whether `p` is the start of a slot of `t`, whatever it holds. Lock-free. */
bool tp__slots_known(const tp__slots *t, const void *p);
/* Slots are numbered in the order they were first taken: the one that
 * tp__slots_take just returned fresh is number `taken - 1`. Slot `i`, or
 * NULL when no slot of its chunk was taken yet (then nothing was stored in
 * it); any `i` may be asked. Lock-free. */
void *tp__slots_at(const tp__slots *t, uint64_t i);

#endif /* TP_SLOTS_H */
