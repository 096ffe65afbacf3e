/* Where a pool's large blocks are: block descriptors tiling each segment
 * (a maximal run of mapped chunks) in address order, the size-segregated
 * bins of free blocks with the tags that say which stream's free each one
 * still waits on, the best-fit search, and the mechanisms of growth and
 * release (which chunks move, which are made, which go back). Which free
 * memory a stream may take, and when to grow, is reuse.c's to decide. All
 * under the pool lock. */
#ifndef TP_BLOCKS_H
#define TP_BLOCKS_H

#include "pool/space.h"

#define TP_NBINS 512

typedef struct tp__slab tp__slab;

enum {
  TP_BLOCK_FREE = 0,   /* in the bins; may carry a tag */
  TP_BLOCK_USED = 1,   /* handed to the user */
  TP_BLOCK_CACHED = 2, /* held in a stream cache, or being handed out */
  TP_BLOCK_SLAB = 3,   /* carved into small blocks */
  TP_BLOCK_SHADOW = 4  /* bytes of a shared chunk the other mapping uses */
};

typedef struct tp__block {
  uintptr_t addr;
  size_t size;
  struct tp__block *prev, *next;   /* address neighbours in the segment */
  struct tp__block *fprev, *fnext; /* bin list, when free */
  tp__tag tag;                     /* when free or cached: where it was freed */
  _Atomic size_t req;              /* bytes asked for, when used */
  tp__slab *slab;                  /* when TP_BLOCK_SLAB */
  uint16_t bin;
  _Atomic uint8_t state; /* changes between USED and CACHED without the
                            pool lock; to and from FREE only under it */
} tp__block;

/* A freed block remembered with its free's position in its stream: what a
 * stream cache holds, and how blocks travel between the rooms. `owner` is
 * the block (large) or its slab (small). */
typedef struct tp__centry {
  uintptr_t addr;
  void *owner;
  uint64_t epoch, lseq;
} tp__centry;

/* The first and last block of the segment that starts or ends at a chunk. */
typedef struct tp__seg {
  tp__block *first, *last;
} tp__seg;

/* A physical chunk mapped at two chunks of the range, each an edge of its
 * segment: the `lo` mapping uses the chunk's first k bytes, the `hi` one the
 * rest, and each holds the other's bytes as a shadow block (grow.c). */
typedef struct tp__twin {
  size_t lo, hi;
  tp__block *slo, *shi; /* the shadows: [lo + k, lo + gran), [hi, hi + k) */
} tp__twin;

typedef struct tp__heap {
  tp__space *space;
  tp__seg *segs; /* per chunk of the space */
  tp__block *bins[TP_NBINS];
  uint64_t binmap[TP_NBINS / 64];
  tp__block *spare; /* recycled descriptors (type-stable memory) */
  /* The one stream that uses the pool, or NULL (the pool layer keeps it):
   * a completed free range may join a range pending on that stream, which
   * costs it nothing and no other stream anything. */
  const tp__stream *sole;
  /* The stream whose own allocation or free works on the heap now, or NULL
   * (a trim, a release at a synchronize): set and cleared under the pool
   * lock by the pool layer. Joins that date a range later than its own free
   * are made only for it (tags_join). */
  const tp__stream *joiner;
  tp__twin *twins;
  uint32_t ntwins, captwins;
  bool share; /* whether chunks may be shared (not in exported pools) */
} tp__heap;

/* Who takes a block, and what may be taken: blocks `a` may use now (their
 * free completed, was `a`'s, or, with `follow`, is ordered before `a`), or,
 * with `deps`, any, `a` being made to wait for the pending ones. */
typedef struct tp__taker {
  tp__stream *a;
  bool follow, deps;
} tp__taker;

tp_error_t tp__heap_init(tp__heap *h, tp__space *sp);
/* Frees every descriptor of a torn-down pool. */
void tp__heap_fini(tp__heap *h);

unsigned tp__bin_of(size_t size);
tp__block *tp__block_new(tp__heap *h);
void tp__block_recycle(tp__heap *h, tp__block *b);
/* Frees `b` into the bins with its tag, merging with free neighbours of
 * the same tag (or, untagged, with untagged ones). Returns the result. */
tp__block *tp__block_release(tp__heap *h, tp__block *b);

/* Best fit among free blocks the taker may take; the block comes out of the
 * bins shaped to `size`, tagged "after the work `a` has queued so far" when
 * its free was still pending (whoever hands part of it to another stream
 * must honour that), else untagged. */
tp__block *tp__heap_take(tp__heap *h, const tp__taker *t, size_t size);
/* A run of adjacent free blocks that together hold `size` though none does
 * alone (frees of several streams, or pending and completed ones), taken as
 * one block, tagged as above. */
tp__block *tp__heap_take_run(tp__heap *h, const tp__taker *t, size_t size);
/* Drops tags of completed frees (polling markers when `poll`) and merges
 * what then may. */
void tp__heap_settle(tp__heap *h, bool poll);
/* Whether a free block (or a ghost mapping) still waits on a free's
 * completion. */
bool tp__heap_pending(const tp__heap *h);
/* Appends the tag of every pending free block to tags[], with a stream
 * reference each. */
void tp__heap_pending_tags(const tp__heap *h, tp__tag **tags, uint32_t *n,
                           uint32_t *cap);

/* Maps memory for `size` bytes and returns them taken, as tp__heap_take
 * does: beside a segment's free edge the taker may use, where the chunks
 * there are unmapped, else in the lowest free run. Of the chunks needed, at
 * most `create` are made new; the others are wholly free chunks moved from
 * elsewhere: completed ones, and ones whose free is pending where the taker
 * may use it now (their old mappings stay until the free completed, space.h's
 * ghosts). More are made where too few can move. Where the block would end
 * (or start) inside a chunk of its own, that chunk may share the physical
 * memory of a segment's edge chunk whose free end covers those bytes
 * (tp__twin). OUT_OF_MEMORY when the limit or the platform says so. */
tp_error_t tp__heap_grow(tp__heap *h, const tp__taker *t, size_t size,
                         size_t create, tp__block **out);
/* Ends the sharing of chunks one of whose mappings holds nothing but free,
 * completed bytes: that mapping goes, and the other takes the shadow back
 * as free memory. Returns the first platform failure; a sharing it could not
 * end stays as it was. */
tp_error_t tp__heap_unshare(tp__heap *h);
/* Unmaps wholly free, completed chunks and gives them back until at most
 * `keep` bytes stay reserved. Returns the first platform failure; what
 * could not be released stays reserved. */
tp_error_t tp__heap_release(tp__heap *h, uint64_t keep);

/* ---- the heap's mechanics, shared by blocks.c and grow.c ---------------- */
void tp__bin_insert(tp__heap *h, tp__block *b);
void tp__bin_remove(tp__heap *h, tp__block *b);
/* Links a new block between the segments mapped beside it. */
void tp__seg_link(tp__heap *h, tp__block *b);
/* Splits `b` after `size` bytes; the new high part (same state and tag) or
 * NULL when no descriptor could be had (the block stays whole). */
tp__block *tp__block_split(tp__heap *h, tp__block *b, size_t size);
bool tp__block_is_free(const tp__block *b);
/* Merges `hi` into `lo` (adjacent, both out of the bins). */
void tp__block_merge(tp__heap *h, tp__block *lo, tp__block *hi);
bool tp__tag_pending(const tp__tag *t);
/* The tag a taken block keeps (blocks.c). */
void tp__block_retag(tp__stream *a, tp__tag *t, bool was_pending);

#endif /* TP_BLOCKS_H */
