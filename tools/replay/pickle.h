/* A reader for the plain-data subset of Python's pickle format (protocols 2
 * to 5): dicts, lists, tuples, strings, bytes, ints, floats, None and bools,
 * with the memo that shares objects. PyTorch's memory snapshots are written
 * in this subset; class instances are read as opaque values. */
#ifndef TP_PICKLE_H
#define TP_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum pk_type {
  PK_NONE,
  PK_BOOL,
  PK_INT,
  PK_FLOAT,
  PK_STR, /* text, as the pickle's UTF-8 bytes */
  PK_BYTES,
  PK_LIST,
  PK_TUPLE,
  PK_DICT,
  PK_OBJECT /* a class instance or global: present, but not read */
} pk_type;

typedef struct pk_value pk_value;
struct pk_value {
  pk_type type;
  bool big; /* an int beyond int64_t: i is not meaningful */
  union {
    int64_t i; /* PK_INT; PK_BOOL: 0 or 1 */
    double f;
    struct {
      const char *s; /* not NUL-terminated */
      size_t n;
    } str; /* PK_STR, PK_BYTES */
    struct {
      pk_value **v;
      size_t n, cap;
    } list; /* PK_LIST, PK_TUPLE */
    struct {
      pk_value **kv; /* key i at 2i, its value at 2i + 1 */
      size_t n, cap;
      /* Dicts of more than a few keys: a hash table of their string keys
       * (1 + the index of the last pair with that key), so that pk_get
       * costs the same however many keys there are. */
      uint32_t *index;
    } dict;
  } u;
};

/* All values of one parse; freed together. */
typedef struct pk_doc pk_doc;

/* Parses a whole pickle held in buf (which must outlive the document:
 * strings point into it). On success *root is the pickled value. On failure
 * returns -1 with a reason naming the byte offset in err, or -2 where the
 * values would need more than `limit` bytes of memory: a pickle's opcodes
 * of one or two bytes each make a value of 40 bytes or push a pointer of
 * 8 (DUP, the memo's GET), so that a few MB of gzip'd pickle could ask for
 * tens of GiB. SIZE_MAX sets no limit. */
int pk_parse(const unsigned char *buf, size_t len, size_t limit, pk_doc **doc,
             pk_value **root, char *err, size_t errlen);
void pk_free(pk_doc *doc);
/* The bytes a parsed document holds (its values and their arrays, counted
 * as pk_parse counts them against its limit). */
size_t pk_bytes(const pk_doc *doc);

/* The value of a dict's string key (its last, where it was given twice),
 * or NULL (also when d is not a dict). */
const pk_value *pk_get(const pk_value *d, const char *key);
/* Whether a PK_STR value equals a C string. */
bool pk_str_is(const pk_value *v, const char *s);
/* A name for the value's type, for messages. */
const char *pk_type_name(const pk_value *v);

#endif /* TP_PICKLE_H */
