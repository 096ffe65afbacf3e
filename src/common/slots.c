/* Tables of slots that are never freed (slots.h). */
#include "common/slots.h"

static char *slot_at(const tp__slots *t, uint64_t i) {
  char *c = atomic_load_explicit(&t->chunks[i / TP_SLOTS_CHUNK],
                                 memory_order_relaxed);
  return c + (i % TP_SLOTS_CHUNK) * t->size;
}

void *tp__slots_take(tp__slots *t) {
  if (tp__slots_full(t))
    return NULL;
  uint32_t c = (uint32_t)(t->taken / TP_SLOTS_CHUNK);
  if (c == atomic_load_explicit(&t->nchunks, memory_order_relaxed)) {
    void *v = calloc(TP_SLOTS_CHUNK, t->size);
    if (!v)
      return NULL;
    atomic_store_explicit(&t->chunks[c], v, memory_order_relaxed);
    atomic_store_explicit(&t->nchunks, c + 1, memory_order_release);
  }
  return slot_at(t, t->taken++);
}

bool tp__slots_known(const tp__slots *t, const void *p) {
  uint32_t n = atomic_load_explicit(&t->nchunks, memory_order_acquire);
  uintptr_t a = (uintptr_t)p;
  for (uint32_t i = 0; i < n; i++) {
    uintptr_t c =
        (uintptr_t)atomic_load_explicit(&t->chunks[i], memory_order_relaxed);
    if (a >= c && a - c < TP_SLOTS_CHUNK * t->size && (a - c) % t->size == 0)
      return true;
  }
  return false;
}

void *tp__slots_at(const tp__slots *t, uint64_t i) {
  if (i / TP_SLOTS_CHUNK >=
      atomic_load_explicit(&t->nchunks, memory_order_acquire))
    return NULL;
  return slot_at(t, i);
}
