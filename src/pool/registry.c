/* The process-wide map from an address to the pool whose virtual range holds
 * it, read without a lock by every free. Pools reserve 1 GiB-aligned ranges,
 * so a two-level table indexed by the address's gigabyte finds them. */
#include "pool/pool.h"

#define L2_BITS TP_REGISTRY_L2_BITS
#define L1_BITS TP_REGISTRY_L1_BITS
#define L2_SIZE (1u << L2_BITS)
#define L1_SIZE (1u << L1_BITS)

typedef tp__registry_leaf leaf;

_Atomic(tp__registry_leaf *) tp__registry_root[L1_SIZE];
#define root tp__registry_root
static tp__mutex table_lock = TP_MUTEX_INIT(TP_RANK_ADDRESSES);

static bool split(uintptr_t addr, size_t *i1, size_t *i2) {
  uint64_t g = (uint64_t)addr >> TP_REGISTRY_SHIFT;
  if (g >> (L1_BITS + L2_BITS))
    return false;
  *i1 = (size_t)(g >> L2_BITS);
  *i2 = (size_t)(g & (L2_SIZE - 1));
  return true;
}

static void set_range(uintptr_t base, size_t size, tp__pool *value) {
  for (uintptr_t a = base; a < base + size;
       a += (uintptr_t)1 << TP_REGISTRY_SHIFT) {
    size_t i1, i2;
    if (!split(a, &i1, &i2))
      return;
    leaf *l = atomic_load_explicit(&root[i1], memory_order_acquire);
    atomic_store_explicit(&l->slot[i2], value, memory_order_release);
  }
}

tp_error_t tp__registry_add(uintptr_t base, size_t size, tp__pool *p) {
  TP_RETURN_IF(base % ((uintptr_t)1 << TP_REGISTRY_SHIFT) != 0,
               TP_ERROR_INVALID_VALUE);
  tp__mutex_lock(&table_lock);
  tp_error_t err = TP_SUCCESS;
  for (uintptr_t a = base; a < base + size && !err;
       a += (uintptr_t)1 << TP_REGISTRY_SHIFT) {
    size_t i1, i2;
    if (!split(a, &i1, &i2)) {
      err = TP_ERROR_NOT_SUPPORTED; /* beyond the table: an odd platform */
      break;
    }
    if (!atomic_load_explicit(&root[i1], memory_order_relaxed)) {
      leaf *l = calloc(1, sizeof *l);
      if (!l)
        err = TP_ERROR_OUT_OF_MEMORY;
      else
        atomic_store_explicit(&root[i1], l, memory_order_release);
    }
  }
  if (!err)
    set_range(base, size, p);
  tp__mutex_unlock(&table_lock);
  return err;
}

void tp__registry_remove(uintptr_t base, size_t size) {
  tp__mutex_lock(&table_lock);
  set_range(base, size, NULL);
  tp__mutex_unlock(&table_lock);
}
