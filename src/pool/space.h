/* A pool's address space: the virtual range reserved at creation, the
 * physical chunks mapped in it (one slot per chunk of the range), the access
 * every mapping gets, the bytes reserved, and the granule entries that
 * record live allocations. It knows nothing of blocks: blocks.c decides what
 * goes where. The pool lock guards everything here except the granule
 * entries and the counters, which a free reads without it. */
#ifndef TP_SPACE_H
#define TP_SPACE_H

#include "stream/stream.h"

#define TP_GRANULE 512u /* allocation step and minimum alignment */
#define TP_GRANULE_SHIFT 9

/* A chunk slot whose physical chunk moved while a free of its memory was
 * still pending: the old mapping stays until the free's work completed,
 * since that work may still reach the memory through it. The chunk is
 * mapped elsewhere meanwhile and counted once. */
typedef struct tp__ghost {
  size_t chunk;
  tp__phys phys;
  tp__tag tag;
  bool release; /* the chunk was released elsewhere: release at unmap */
} tp__ghost;

typedef struct tp__space {
  /* First what every free reads (the pool puts these on its first line). */
  uintptr_t base;
  /* Per chunk, allocated on first use: one entry per granule, the live
   * allocation that starts there (a block, or a slab with its low bit). */
  _Atomic(_Atomic uintptr_t *) *gtab;
  uint64_t limit;      /* physical bytes the space may hold */
  unsigned gran_shift; /* gran is 1 << gran_shift */
  /* Granules per chunk less one: a granule's place in its chunk's table
   * from the first line, where every free reads the rest. */
  uint32_t gmask;
  tp__pres *res;
  tp__mem_kind kind;
  size_t va_size, gran, nchunks;
  tp__phys *phys;    /* per chunk: the physical chunk mapped there, or 0 */
  uint64_t *mapbits; /* per chunk: mapped and part of a segment */
  /* One past the highest word of mapbits with a bit set: the segment walk
   * of each synchronize stops there rather than read the whole range (four
   * times the device's memory: on an 80 GiB card, 2,560 words and 1.9 us of
   * every synchronize through the interposer). */
  size_t mapwords;
  uint64_t *ghostbits; /* per chunk: mapped, waiting for a free (ghosts) */
  tp__ghost *ghosts;
  uint32_t nghosts, capghosts;
  size_t ntables; /* granule tables allocated (see tp__space_entry_make) */
  size_t nspare;  /* of them, those of unmapped slots */
  /* Chunks whose physical chunk another chunk maps too (blocks.h's twins):
   * the chunk goes back to the platform through that other mapping. */
  size_t *lent;
  uint32_t nlent, caplent;
  tp__phys *orphans; /* unmapped chunks the platform would not release yet */
  uint32_t norphans, caporphans;
  tp_access_flags_t access[TP_MAX_DEVICES];
  _Atomic uint64_t reserved, reserved_high;
  _Atomic uint64_t maps, unmaps;
} tp__space;

/* Reserves the virtual range (four times the limit, at least 1 GiB, in
 * 1 GiB-aligned steps); INVALID_VALUE where the platform gives another
 * alignment. */
tp_error_t tp__space_init(tp__space *sp, const tp__mem_kind *kind, size_t gran,
                          uint64_t limit);
/* Gives every chunk and the range back to the platform. The maps stay for
 * tp__space_free, once no thread can read them (a racing bad free may). */
void tp__space_fini(tp__space *sp);
void tp__space_free(tp__space *sp);

/* The granule entry of `addr` (inside the range), made on first use when
 * `create`; NULL when it does not exist (or memory is short). Every free
 * reads one, hence the shifts rather than divisions. */
_Atomic uintptr_t *tp__space_entry_make(tp__space *sp, uintptr_t addr);
static inline _Atomic uintptr_t *tp__space_entry(tp__space *sp, uintptr_t addr,
                                                 bool create) {
  size_t off = addr - sp->base;
  _Atomic uintptr_t *t = atomic_load_explicit(&sp->gtab[off >> sp->gran_shift],
                                              memory_order_acquire);
  if (TP_UNLIKELY(!t))
    return create ? tp__space_entry_make(sp, addr) : NULL;
  return &t[(off >> TP_GRANULE_SHIFT) & sp->gmask];
}

static inline size_t tp__space_chunk(const tp__space *sp, uintptr_t addr) {
  return (addr - sp->base) >> sp->gran_shift;
}
static inline uintptr_t tp__space_addr(const tp__space *sp, size_t chunk) {
  return sp->base + chunk * sp->gran;
}
static inline bool tp__space_mapped(const tp__space *sp, size_t c) {
  return (sp->mapbits[c / 64] >> (c % 64)) & 1;
}
static inline bool tp__space_occupied(const tp__space *sp, size_t c) {
  return ((sp->mapbits[c / 64] | sp->ghostbits[c / 64]) >> (c % 64)) & 1;
}
/* The first chunk at or after `from` that starts a segment (a maximal run
 * of mapped chunks), or nchunks; and the end of the segment at `start`. */
size_t tp__space_segment_next(const tp__space *sp, size_t from);
size_t tp__space_segment_end(const tp__space *sp, size_t start);
/* Whether chunks [c0, c0 + n) lie in the range, all unmapped (no ghost
 * either). */
bool tp__space_unmapped(const tp__space *sp, size_t c0, size_t n);
/* The lowest run of n such chunks. */
bool tp__space_first_run(const tp__space *sp, size_t n, size_t *c0);

/* A new physical chunk, counted as reserved; OUT_OF_MEMORY beyond the
 * limit or when the platform has no more. */
tp_error_t tp__space_create(tp__space *sp, tp__phys *phys);
/* Maps phys[0..n) at chunks [c0, c0 + n) with the space's access. On
 * failure nothing stays mapped and the chunks are still the caller's. */
tp_error_t tp__space_map(tp__space *sp, size_t c0, const tp__phys *phys,
                         size_t n);
/* Unmaps chunks [c0, c1), handing their physical chunks to phys[]. */
tp_error_t tp__space_unmap(tp__space *sp, size_t c0, size_t c1, tp__phys *phys);
/* Takes chunks [c0, c1) out of their segment while a free tagged `tag` of
 * their memory is pending, handing their physical chunks to phys[] to be
 * mapped elsewhere: the old mappings stay, as ghosts, until the free
 * completed. OUT_OF_MEMORY when the ghosts cannot be recorded. */
tp_error_t tp__space_detach(tp__space *sp, size_t c0, size_t c1, tp__phys *phys,
                            const tp__tag *tag);
/* Room for one more lent chunk (OUT_OF_MEMORY), then marking chunk `c` as
 * lent (its physical chunk is mapped at another chunk too, which releases
 * it) and unmarking it. */
tp_error_t tp__space_lend_room(tp__space *sp);
void tp__space_lend(tp__space *sp, size_t c);
void tp__space_unlend(tp__space *sp, size_t c);
/* Unmaps the ghosts whose frees completed (polling markers when `poll`). */
void tp__space_settle_ghosts(tp__space *sp, bool poll);
/* Gives unmapped chunks back to the platform. One it refuses stays
 * reserved, kept for the next try; returns the first failure. */
tp_error_t tp__space_release(tp__space *sp, const tp__phys *phys, size_t n);
/* Retries the chunks the platform refused before. */
tp_error_t tp__space_release_orphans(tp__space *sp);
/* Applies access descriptors to every mapped chunk and to later ones. */
tp_error_t tp__space_set_access(tp__space *sp, const tp_access_desc_t *list,
                                size_t n);

#endif /* TP_SPACE_H */
