/* The pool invariant walker as tests and tools call it. Not public API. */
#ifndef TP_POOL_VERIFY_H
#define TP_POOL_VERIFY_H

#include <stddef.h>

#include "tidepool.h"

/* Walks the pool under its lock: segments tile mapped chunks, free blocks
 * sit in the right bins, slabs' free bits and counts agree, granule entries
 * point at live allocations, reserved equals mapped chunks, and used equals
 * the bytes asked for by live allocations (so call it when no allocation or
 * free of this pool is in flight). Returns 0 when consistent, else nonzero
 * with a reason in why. */
int tp__pool_verify(tp_pool_t pool, char *why, size_t why_len);

#endif /* TP_POOL_VERIFY_H */
