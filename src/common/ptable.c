/* The pointer table of common/ptable.h: the stream registry's indexes and
 * the event table use it. */
#include "common/ptable.h"

#include <stdlib.h>

#define TOMB ((void *)(uintptr_t)1)

/* The slot where the probe for `key` begins. The product's high half is
 * folded in: handles are multiples of their alignment, and their product
 * alone would leave the low bits of every home slot the same. */
static size_t home(const tp__ptable *t, uint64_t key) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 32)) & (t->cap - 1);
}

void tp__ptable_put(tp__ptable *t, void *obj) {
  size_t j = home(t, t->key(obj));
  while (t->slot[j] && t->slot[j] != TOMB)
    j = (j + 1) & (t->cap - 1);
  if (!t->slot[j])
    t->used++;
  t->slot[j] = obj;
  t->live++;
}

bool tp__ptable_room(tp__ptable *t) {
  if ((t->used + 1) * 2 <= t->cap)
    return true;
  size_t cap = 64;
  while (cap < (t->live + 1) * 4)
    cap *= 2;
  void **slot = calloc(cap, sizeof *slot);
  if (!slot)
    return false;
  tp__ptable old = *t;
  t->slot = slot;
  t->cap = cap;
  t->used = t->live = 0;
  for (size_t i = 0; i < old.cap; i++)
    if (old.slot[i] && old.slot[i] != TOMB)
      tp__ptable_put(t, old.slot[i]);
  free(old.slot);
  return true;
}

bool tp__ptable_drop(tp__ptable *t, const void *obj) {
  if (!t->cap)
    return false;
  for (size_t j = home(t, t->key(obj)); t->slot[j]; j = (j + 1) & (t->cap - 1))
    if (t->slot[j] == obj) {
      t->slot[j] = TOMB;
      t->live--;
      return true;
    }
  return false;
}

void *tp__ptable_next(const tp__ptable *t, uint64_t key, size_t *at) {
  if (!t->cap)
    return NULL;
  size_t j = *at == SIZE_MAX ? home(t, key) : (*at + 1) & (t->cap - 1);
  for (; t->slot[j]; j = (j + 1) & (t->cap - 1))
    if (t->slot[j] != TOMB && t->key(t->slot[j]) == key) {
      *at = j;
      return t->slot[j];
    }
  return NULL;
}
