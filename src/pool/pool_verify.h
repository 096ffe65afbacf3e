/* The pool invariant walker and the breakdown of a pool's reserved bytes,
 * as tests and tools call them. Not public API. */
#ifndef TP_POOL_VERIFY_H
#define TP_POOL_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "tidepool.h"

/* Walks the pool under its lock: segments tile mapped chunks, free blocks
 * sit in the right bins, slabs' free bits and counts agree, granule entries
 * point at live allocations, reserved equals mapped chunks, and used equals
 * the bytes asked for by live allocations (so call it when no allocation or
 * free of this pool is in flight). Returns 0 when consistent, else nonzero
 * with a reason in why. */
int tp__pool_verify(tp_pool_t pool, char *why, size_t why_len);

/* Where a pool's reserved bytes went, for tuning: free completed, free
 * pending, cached large, rounding of large, slab bytes, rounding in slabs,
 * free slab blocks, small blocks held by caches or pending. */
void tp__pool_breakdown(tp_pool_t pool, uint64_t out[8]);

/* How many granule tables the pool's space holds (32 KiB of host memory
 * each on a GPU); 0 for an imported pool. */
size_t tp__pool_tables(tp_pool_t pool);

/* How many granule tables the process has allocated, all pools together;
 * a table taken from the stock of emptied slots' tables is not counted. */
size_t tp__space_tables_made(void);

#endif /* TP_POOL_VERIFY_H */
