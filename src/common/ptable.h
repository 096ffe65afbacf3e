/* A table of pointers to objects, found by a 64-bit key that each object
 * carries (a handle, an id): open addressing with linear probing and
 * tombstones, so that a lookup costs the same with a hundred thousand
 * objects as with ten. Several objects may share a key. Not thread-safe:
 * its owner's lock covers it. */
#ifndef TP_PTABLE_H
#define TP_PTABLE_H

#include "common/common.h"

typedef uint64_t (*tp__ptable_key)(const void *obj);

typedef struct tp__ptable {
  void **slot;
  size_t cap, used, live; /* used: live entries and tombstones */
  tp__ptable_key key;
} tp__ptable;

#define TP_PTABLE_INIT(key_fn)                                                 \
  { NULL, 0, 0, 0, (key_fn) }

/* Makes room for one more object: a table that would pass half full, live
 * entries and tombstones together, is rebuilt at most a quarter full.
 * False, the table as it was, where memory runs out. */
bool tp__ptable_room(tp__ptable *t);
/* Puts obj in, after tp__ptable_room said yes. */
void tp__ptable_put(tp__ptable *t, void *obj);
/* Takes obj out; false where it was not in. */
bool tp__ptable_drop(tp__ptable *t, const void *obj);
/* The objects keyed `key`, one a call, in no particular order: *at starts
 * at SIZE_MAX, and NULL follows the last. */
void *tp__ptable_next(const tp__ptable *t, uint64_t key, size_t *at);

#endif /* TP_PTABLE_H */
