/* Where a pool's small blocks (up to 32 KiB) are: size classes, slabs of
 * one class carved from large blocks, their free bits, and the blocks that
 * left a stream cache before their free completed. Which of them a stream
 * may take is reuse.c's to decide. All under the pool lock, but for the
 * bytes-asked words, which allocations and frees touch without it. */
#ifndef TP_SLABS_H
#define TP_SLABS_H

#include "pool/blocks.h"

#define TP_SMALL_MAX (32u * 1024u) /* largest size served by slabs */
#define TP_NCLASSES 20
#define TP_SLAB_MAX_BLOCKS 128u

struct tp__slab {
  /* The first line: all that an allocation or a free reads here but the
   * block's bytes-asked word. Aligned beyond it so that a granule entry
   * holds the block's index beside the slab's address (tp__slab_entry). */
  _Alignas(2 * TP_SLAB_MAX_BLOCKS) uintptr_t base;
  uint64_t inv; /* 2^40 / bsize, rounded up: an index without a division */
  uint32_t cls, bsize, nblocks, nfree; /* nfree: bits set in `free` */
  tp__block *block;
  uint64_t free[2];      /* bit set: free and completed */
  tp__slab *next, *prev; /* the class's list of slabs with free bits */
  bool listed;
  uint64_t spare_since; /* the guard's stamp when it went spare */
  /* Bytes asked for per block; 0 when not used. In the descriptor itself,
   * so that a free reaches its word straight from the granule entry, one
   * dependent load fewer on the way to its exchange. */
  _Alignas(64) _Atomic uint32_t req[TP_SLAB_MAX_BLOCKS];
};
_Static_assert((TP_SLAB_MAX_BLOCKS & (TP_SLAB_MAX_BLOCKS - 1)) == 0 &&
                   TP_SLAB_MAX_BLOCKS <= 64 * 2,
               "a slab's blocks: a power of two, one bit each in `free`");

/* A small block that was freed and left a stream cache before completing. */
typedef struct tp__pending {
  tp__slab *slab;
  uint32_t idx;
  uint32_t hold; /* the slot of the tag's stream in the holds */
  tp__tag tag;
} tp__pending;

/* A stream that pending blocks' tags name, and how many name it: one
 * reference stands for all of them, so that a block's way through the
 * pending list takes no atomic operation (two a block were a fifth of an
 * allocation's time when 10,000 were made at once). A slot whose stream is
 * NULL is free. */
typedef struct tp__slab_hold {
  tp__stream *stream;
  uint32_t n;
} tp__slab_hold;

typedef struct tp__slabs {
  tp__heap *heap;
  tp__slab *partial[TP_NCLASSES]; /* slabs with free bits */
  tp__slab *spare, *spare_last;   /* oldest first */
  tp__pending *pending[TP_NCLASSES];
  uint32_t npending[TP_NCLASSES], cappending[TP_NCLASSES];
  tp__slab_hold *holds;
  uint32_t nholds, capholds, hold_last;
} tp__slabs;

/* The index of the block at `addr` in slab `s`, or -1 when `addr` is not
 * the start of one of its blocks. A multiplication by the precomputed
 * inverse stands in for the division: offsets stay below 2^22 and sizes
 * below 2^16, so the product's rounding error (under 2^-18) cannot cross an
 * integer that the true quotient's fraction (a multiple of 1/bsize, at
 * least 2^-15 from it) does not cross. */
static inline int64_t tp__slab_index(const tp__slab *s, uintptr_t addr) {
  uint64_t off = (uint64_t)(addr - s->base);
  if (addr < s->base || off >= (uint64_t)s->nblocks * s->bsize)
    return -1;
  uint64_t i = (off * s->inv) >> 40;
  return i * s->bsize == off ? (int64_t)i : -1;
}

/* The granule entry of block `idx` of slab `s`: the slab's address, the
 * index above its low bit, and the low bit that tells a slab from a large
 * block (space.h). A slab's blocks alone have entries, made with the slab
 * and cleared before it goes (slabs.c), so that an entry found at an
 * address says that a block starts there and which one: a free finds its
 * bytes-asked word without a division or a bounds check. */
static inline uintptr_t tp__slab_entry(const tp__slab *s, uint32_t idx) {
  return (uintptr_t)s | (uintptr_t)idx << 1 | 1u;
}
static inline tp__slab *tp__slab_of_entry(uintptr_t v) {
  return (tp__slab *)(v & ~(uintptr_t)(2 * TP_SLAB_MAX_BLOCKS - 1));
}
static inline uint32_t tp__slab_index_of_entry(uintptr_t v) {
  return (uint32_t)(v >> 1) & (TP_SLAB_MAX_BLOCKS - 1);
}

/* The same for an address known to start one of the slab's blocks (a
 * cached entry's): no check. */
static inline uint64_t tp__slab_index_of(const tp__slab *s, uintptr_t addr) {
  return ((uint64_t)(addr - s->base) * s->inv) >> 40;
}

/* The class of a size rounded to granules: a table lookup, on every small
 * allocation. */
extern const uint8_t tp__class_of_steps[TP_SMALL_MAX / TP_GRANULE + 1];
static inline unsigned tp__class_of(size_t rounded) {
  return tp__class_of_steps[rounded >> TP_GRANULE_SHIFT];
}
uint32_t tp__class_size(unsigned cls);
/* The bytes of the large block a slab of the class is carved from. */
size_t tp__slab_bytes(unsigned cls);

/* Free, completed blocks of the class, up to `want`, from one group of 16
 * neighbours (their bytes-asked words share a cache line, which then stays
 * with the stream that caches the group). Returns how many. */
uint32_t tp__slabs_take_ready(tp__slabs *ss, unsigned cls, tp__centry *out,
                              uint32_t want);
/* A pending block of the class the taker may take (see blocks.h), and
 * where the class's list is long, up to want - 1 more of the taker's own,
 * their tags kept in the entries. Returns how many. */
uint32_t tp__slabs_take_pending(tp__slabs *ss, unsigned cls, const tp__taker *t,
                                tp__centry *out, uint32_t want);
/* Carves a slab of the class from a large block shaped for it (taken with
 * tp__slab_bytes), whose tag its blocks inherit. On failure the block is
 * the caller's still. */
tp_error_t tp__slabs_make(tp__slabs *ss, unsigned cls, tp__block *b);
/* Gives back a small block that left a stream cache: completed ones go to
 * their slab, others to the class's pending list. */
void tp__slabs_put(tp__slabs *ss, unsigned cls, const tp__centry *e,
                   tp__stream *s);
/* Moves completed pending blocks to their slabs (polling markers when
 * `poll`) and, when `release_empty`, gives empty slabs back as large
 * blocks. */
void tp__slabs_settle(tp__slabs *ss, bool poll, bool release_empty);
bool tp__slabs_pending(const tp__slabs *ss);
/* Appends the tag of every pending block to tags[], with a reference each. */
void tp__slabs_pending_tags(const tp__slabs *ss, tp__tag **tags, uint32_t *n,
                            uint32_t *cap);
void tp__slabs_fini(tp__slabs *ss);
/* For the invariant walker: whether the holds count the pending blocks'
 * streams exactly. */
bool tp__slabs_holds_agree(const tp__slabs *ss);

#endif /* TP_SLABS_H */
