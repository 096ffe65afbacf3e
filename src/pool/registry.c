/* The process-wide map from an address to the pool whose virtual range holds
 * it, read without a lock by every free. Pools reserve 1 GiB-aligned ranges,
 * so a table indexed by the address's gigabyte finds them. */
#include "pool/pool.h"

_Atomic(tp__pool *) tp__registry[1u << TP_REGISTRY_BITS];
static tp__mutex table_lock = TP_MUTEX_INIT(TP_RANK_ADDRESSES);

static void set_range(uintptr_t base, size_t size, tp__pool *value) {
  for (uintptr_t a = base; a < base + size;
       a += (uintptr_t)1 << TP_REGISTRY_SHIFT) {
    uint64_t g = (uint64_t)a >> TP_REGISTRY_SHIFT;
    if (g >> TP_REGISTRY_BITS)
      return;
    atomic_store_explicit(&tp__registry[g], value, memory_order_release);
  }
}

tp_error_t tp__registry_add(uintptr_t base, size_t size, tp__pool *p) {
  TP_RETURN_IF(base % ((uintptr_t)1 << TP_REGISTRY_SHIFT) != 0,
               TP_ERROR_INVALID_VALUE);
  if (size == 0)
    return TP_SUCCESS;
  /* Beyond the table: an odd platform. */
  TP_RETURN_IF(base + size < base || (uint64_t)(base + size - 1) >>
                                         TP_REGISTRY_SHIFT >> TP_REGISTRY_BITS,
               TP_ERROR_NOT_SUPPORTED);
  tp__mutex_lock(&table_lock);
  set_range(base, size, p);
  tp__mutex_unlock(&table_lock);
  return TP_SUCCESS;
}

void tp__registry_remove(uintptr_t base, size_t size) {
  tp__mutex_lock(&table_lock);
  set_range(base, size, NULL);
  tp__mutex_unlock(&table_lock);
}
