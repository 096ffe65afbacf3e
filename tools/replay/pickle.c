/* The pickle reader: a stack machine over the opcodes of protocols 2 to 5
 * that plain data uses, building values in chunks owned by one document.
 * Damaged input (truncation, an unknown opcode, a stack that does not add
 * up) ends the parse with the byte offset where it went wrong. */
#include "pickle.h"
#include "mix.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_VALUES 4096

typedef struct chunk {
  struct chunk *next;
  size_t used;
  pk_value v[CHUNK_VALUES];
} chunk;

struct pk_doc {
  chunk *chunks;
  size_t bytes; /* what the parse held at its end, for pk_bytes */
};

typedef struct parser {
  const unsigned char *buf;
  size_t len, at, op_at; /* op_at: where the current opcode began */
  pk_doc *doc;
  pk_value **stack;
  size_t n, cap;
  size_t *marks;
  size_t nmarks, capmarks;
  pk_value **memo;
  size_t nmemo, capmemo;
  size_t nvalues; /* made so far: no memo index of a real pickle exceeds it */
  /* The bytes of values, stack, memo and arrays allocated so far, against
   * the caller's limit: see pk_parse. */
  size_t held, limit;
  bool failed, over_limit;
  char *err;
  size_t errlen;
} parser;

/* Writes the reason of the first failure only: an allocation refused for
 * the limit says so, not the "out of memory" of the opcode that asked. */
static int fail(parser *p, const char *fmt, ...) {
  if (p->failed)
    return -1;
  p->failed = true;
  char why[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  snprintf(p->err, p->errlen, "pickle byte %zu: %s", p->op_at, why);
  return -1;
}

/* Counts `bytes` more against the limit; false, with the reason written,
 * past it. */
static bool charge(parser *p, size_t bytes) {
  if (bytes <= p->limit - p->held) {
    p->held += bytes;
    return true;
  }
  fail(p, "its values need more than %zu bytes of memory, the limit given",
       p->limit);
  p->over_limit = true;
  return false;
}

static pk_value *new_value(parser *p, pk_type type) {
  chunk *c = p->doc->chunks;
  if (!c || c->used == CHUNK_VALUES) {
    if (!charge(p, sizeof *c))
      return NULL;
    c = malloc(sizeof *c);
    if (!c)
      return NULL;
    c->next = p->doc->chunks;
    c->used = 0;
    p->doc->chunks = c;
  }
  pk_value *v = &c->v[c->used++];
  p->nvalues++;
  memset(v, 0, sizeof *v);
  v->type = type;
  return v;
}

/* Grows *arr (of `size`-byte elements) to hold at least n + 1. */
static bool reserve(parser *p, void **arr, size_t *cap, size_t n, size_t size) {
  if (n < *cap)
    return true;
  size_t c = *cap ? *cap * 2 : 8;
  if (c > SIZE_MAX / size || !charge(p, (c - *cap) * size))
    return false;
  void *a = realloc(*arr, c * size);
  if (!a)
    return false;
  *arr = a;
  *cap = c;
  return true;
}

static int push(parser *p, pk_value *v) {
  if (!v || !reserve(p, (void **)&p->stack, &p->cap, p->n, sizeof *p->stack))
    return fail(p, "out of memory");
  p->stack[p->n++] = v;
  return 0;
}

static int push_new(parser *p, pk_type type) {
  return push(p, new_value(p, type));
}

static pk_value *pop(parser *p) {
  size_t floor = p->nmarks ? p->marks[p->nmarks - 1] : 0;
  return p->n > floor ? p->stack[--p->n] : NULL;
}

static pk_value *top(parser *p) {
  size_t floor = p->nmarks ? p->marks[p->nmarks - 1] : 0;
  return p->n > floor ? p->stack[p->n - 1] : NULL;
}

/* Reads n bytes of argument; NULL when the file ends first. */
static const unsigned char *take(parser *p, size_t n) {
  if (n > p->len - p->at)
    return NULL;
  const unsigned char *s = p->buf + p->at;
  p->at += n;
  return s;
}

static uint64_t le(const unsigned char *s, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = v << 8 | s[i];
  return v;
}

static int list_add(parser *p, pk_value *list, pk_value *item) {
  if (!reserve(p, (void **)&list->u.list.v, &list->u.list.cap, list->u.list.n,
               sizeof(pk_value *)))
    return fail(p, "out of memory");
  list->u.list.v[list->u.list.n++] = item;
  return 0;
}

static int dict_set(parser *p, pk_value *d, pk_value *k, pk_value *v) {
  if (!reserve(p, (void **)&d->u.dict.kv, &d->u.dict.cap, d->u.dict.n,
               2 * sizeof(pk_value *)))
    return fail(p, "out of memory");
  /* A repeated key is appended, not searched for (a search per key made a
   * dict of n keys cost n^2: 200,000 keys took 81 s); pk_get reads the
   * last one, so that it replaces the value, as in Python. */
  d->u.dict.kv[2 * d->u.dict.n] = k;
  d->u.dict.kv[2 * d->u.dict.n++ + 1] = v;
  return 0;
}

/* ---- the index of a dict's keys ---------------------------------------------
 * A dict read by pk_get is searched from its last key; a snapshot's events
 * have a few keys each, but a dict of many keys that the memo shares among
 * many events made the search cost keys times events (a 690 KB pickle of
 * one dict of 50,000 keys shared by 50,000 events took 102 s). */

/* Dicts of at most this many keys are searched. */
#define INDEX_FROM 8

/* A hash of a key's bytes, seeded by where its table lies, so that keys
 * chosen to collide in one run do not in another. */
static uint64_t key_hash(const char *s, size_t n, uint64_t seed) {
  uint64_t h = seed ^ (n * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001B3ull;
  }
  return tp_replay_mix64(h);
}

static size_t index_slots(size_t n) {
  size_t c = 16;
  while (c < 2 * n)
    c *= 2;
  return c;
}

static uint64_t index_seed(const uint32_t *index) {
  return (uint64_t)(uintptr_t)index * 0x9E3779B97F4A7C15ull;
}

/* The slot of a key in the index: where it is, or the empty slot where it
 * would go. */
static uint32_t *index_slot(const pk_value *d, const char *key, size_t n) {
  uint32_t *index = d->u.dict.index;
  size_t mask = index_slots(d->u.dict.n) - 1;
  size_t i = (size_t)key_hash(key, n, index_seed(index)) & mask;
  for (;; i = (i + 1) & mask) {
    uint32_t e = index[i];
    if (e == 0)
      return &index[i];
    const pk_value *k = d->u.dict.kv[2 * (size_t)(e - 1)];
    if (k->u.str.n == n && memcmp(k->u.str.s, key, n) == 0)
      return &index[i];
  }
}

/* Indexes each dict of more than INDEX_FROM keys once the parse is done
 * (a dict may be filled at any time before). */
static int index_dicts(parser *p) {
  for (chunk *c = p->doc->chunks; c; c = c->next)
    for (size_t j = 0; j < c->used; j++) {
      pk_value *d = &c->v[j];
      if (d->type != PK_DICT || d->u.dict.n <= INDEX_FROM ||
          d->u.dict.n >= UINT32_MAX)
        continue;
      size_t slots = index_slots(d->u.dict.n);
      if (!charge(p, slots * sizeof(uint32_t)))
        return -1;
      d->u.dict.index = calloc(slots, sizeof(uint32_t));
      if (!d->u.dict.index)
        return fail(p, "out of memory");
      for (size_t i = 0; i < d->u.dict.n; i++) {
        const pk_value *k = d->u.dict.kv[2 * i];
        if (k->type == PK_STR)
          *index_slot(d, k->u.str.s, k->u.str.n) = (uint32_t)(i + 1);
      }
    }
  return 0;
}

/* The items above the topmost mark, which is removed. */
static int pop_mark(parser *p, size_t *from) {
  if (!p->nmarks)
    return fail(p, "no mark on the stack");
  *from = p->marks[--p->nmarks];
  return 0;
}

/* The value just under a mark that stood at `from`, which APPENDS and
 * SETITEMS fill; NULL when another mark is in between. */
static pk_value *under_mark(parser *p, size_t from) {
  size_t floor = p->nmarks ? p->marks[p->nmarks - 1] : 0;
  return from > floor ? p->stack[from - 1] : NULL;
}

static int string_op(parser *p, pk_type type, size_t lenbytes) {
  const unsigned char *s = take(p, lenbytes);
  if (!s)
    return fail(p, "the file ends inside a length");
  uint64_t n = le(s, lenbytes);
  const unsigned char *body = n <= p->len - p->at ? take(p, (size_t)n) : NULL;
  if (!body)
    return fail(p, "a string of %llu bytes runs past the end of the file",
                (unsigned long long)n);
  pk_value *v = new_value(p, type);
  if (v) {
    v->u.str.s = (const char *)body;
    v->u.str.n = (size_t)n;
  }
  return push(p, v);
}

static int int_op(parser *p, size_t nbytes, bool is_signed) {
  const unsigned char *s = take(p, nbytes);
  if (!s)
    return fail(p, "the file ends inside an int");
  uint64_t u = le(s, nbytes);
  pk_value *v = new_value(p, PK_INT);
  if (v)
    v->u.i =
        is_signed && nbytes == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
  return push(p, v);
}

/* LONG1 / LONG4: little-endian two's complement of n bytes. */
static int long_op(parser *p, size_t lenbytes) {
  const unsigned char *s = take(p, lenbytes);
  if (!s)
    return fail(p, "the file ends inside a length");
  uint64_t n = le(s, lenbytes);
  const unsigned char *b = n <= p->len - p->at ? take(p, (size_t)n) : NULL;
  if (!b)
    return fail(p, "an int of %llu bytes runs past the end of the file",
                (unsigned long long)n);
  pk_value *v = new_value(p, PK_INT);
  if (!v)
    return push(p, v);
  bool negative = n > 0 && (b[n - 1] & 0x80);
  /* Bytes beyond the eighth must only extend the sign. */
  for (size_t i = 8; i < n; i++)
    if (b[i] != (negative ? 0xff : 0x00))
      v->big = true;
  size_t k = n < 8 ? (size_t)n : 8;
  uint64_t u = negative ? UINT64_MAX : 0;
  for (size_t i = k; i-- > 0;)
    u = u << 8 | b[i];
  if (k < 8 && k > 0 && !negative)
    u &= (UINT64_C(1) << (8 * k)) - 1;
  /* Eight bytes whose top bit disagrees with the sign overflow int64_t. */
  if (n >= 8 && ((u >> 63) != 0) != negative)
    v->big = true;
  v->u.i = (int64_t)u;
  return push(p, v);
}

static int memo_put(parser *p, uint64_t idx) {
  pk_value *v = top(p);
  if (!v)
    return fail(p, "memo store with an empty stack");
  /* A pickler numbers what it stores in order, so an index beyond the
   * values made so far is damage; refusing it keeps a 9-byte file from
   * asking for gigabytes of memo (an index of 2^28 did). */
  if (idx > p->nvalues)
    return fail(p, "memo index %llu is out of range", (unsigned long long)idx);
  while (p->nmemo <= idx) {
    if (!reserve(p, (void **)&p->memo, &p->capmemo, p->nmemo, sizeof *p->memo))
      return fail(p, "out of memory");
    p->memo[p->nmemo++] = NULL;
  }
  p->memo[idx] = v;
  return 0;
}

static int memo_get(parser *p, uint64_t idx) {
  if (idx >= p->nmemo || !p->memo[idx])
    return fail(p, "memo index %llu was never stored", (unsigned long long)idx);
  return push(p, p->memo[idx]);
}

/* A tuple of the top n values (or of those above the mark, n = SIZE_MAX). */
static int tuple_op(parser *p, size_t n) {
  size_t from = 0;
  if (n == SIZE_MAX) {
    if (pop_mark(p, &from))
      return -1;
  } else {
    size_t floor = p->nmarks ? p->marks[p->nmarks - 1] : 0;
    if (p->n - floor < n)
      return fail(p, "a tuple of %zu with fewer values on the stack", n);
    from = p->n - n;
  }
  pk_value *t = new_value(p, PK_TUPLE);
  if (!t)
    return fail(p, "out of memory");
  for (size_t i = from; i < p->n; i++)
    if (list_add(p, t, p->stack[i]))
      return -1;
  p->n = from;
  return push(p, t);
}

static int step(parser *p, bool *stop) {
  p->op_at = p->at;
  const unsigned char *opp = take(p, 1);
  if (!opp)
    return fail(p, "the file ends without the STOP opcode (truncated?)");
  unsigned op = *opp;
  const unsigned char *a;
  pk_value *v, *k, *target;
  size_t from = 0;
  switch (op) {
  case 0x80: /* PROTO */
    if (!(a = take(p, 1)))
      return fail(p, "truncated PROTO");
    if (*a < 2 || *a > 5)
      return fail(p, "protocol %u is not one of 2 to 5", *a);
    return 0;
  case 0x95: /* FRAME: a length hint */
    return take(p, 8) ? 0 : fail(p, "truncated FRAME");
  case '.': *stop = true; return 0;
  case '(':
    if (!reserve(p, (void **)&p->marks, &p->capmarks, p->nmarks,
                 sizeof(size_t)))
      return fail(p, "out of memory");
    p->marks[p->nmarks++] = p->n;
    return 0;
  case '}': return push_new(p, PK_DICT);
  case ']': return push_new(p, PK_LIST);
  case ')': return push_new(p, PK_TUPLE);
  case 'N': return push_new(p, PK_NONE);
  case 0x88: /* NEWTRUE */
  case 0x89: /* NEWFALSE */
    v = new_value(p, PK_BOOL);
    if (v)
      v->u.i = op == 0x88;
    return push(p, v);
  case 'J': return int_op(p, 4, true);
  case 'K': return int_op(p, 1, false);
  case 'M': return int_op(p, 2, false);
  case 0x8a: return long_op(p, 1);
  case 0x8b: return long_op(p, 4);
  case 'G': { /* BINFLOAT: big-endian IEEE double */
    if (!(a = take(p, 8)))
      return fail(p, "truncated BINFLOAT");
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
      u = u << 8 | a[i];
    v = new_value(p, PK_FLOAT);
    if (v)
      memcpy(&v->u.f, &u, sizeof v->u.f);
    return push(p, v);
  }
  case 0x8c: return string_op(p, PK_STR, 1);   /* SHORT_BINUNICODE */
  case 'X': return string_op(p, PK_STR, 4);    /* BINUNICODE */
  case 0x8d: return string_op(p, PK_STR, 8);   /* BINUNICODE8 */
  case 'U': return string_op(p, PK_STR, 1);    /* SHORT_BINSTRING */
  case 'T': return string_op(p, PK_STR, 4);    /* BINSTRING */
  case 'C': return string_op(p, PK_BYTES, 1);  /* SHORT_BINBYTES */
  case 'B': return string_op(p, PK_BYTES, 4);  /* BINBYTES */
  case 0x8e: return string_op(p, PK_BYTES, 8); /* BINBYTES8 */
  case 0x94: /* MEMOIZE */ return memo_put(p, p->nmemo);
  case 'q':
    return (a = take(p, 1)) ? memo_put(p, *a) : fail(p, "truncated BINPUT");
  case 'r':
    return (a = take(p, 4)) ? memo_put(p, le(a, 4))
                            : fail(p, "truncated LONG_BINPUT");
  case 'h':
    return (a = take(p, 1)) ? memo_get(p, *a) : fail(p, "truncated BINGET");
  case 'j':
    return (a = take(p, 4)) ? memo_get(p, le(a, 4))
                            : fail(p, "truncated LONG_BINGET");
  case 'a': /* APPEND */
    v = pop(p);
    target = top(p);
    if (!v || !target || target->type != PK_LIST)
      return fail(p, "APPEND without a list and a value");
    return list_add(p, target, v);
  case 'e': /* APPENDS */
    if (pop_mark(p, &from))
      return -1;
    target = under_mark(p, from);
    if (!target || target->type != PK_LIST)
      return fail(p, "APPENDS without a list under the mark");
    for (size_t i = from; i < p->n; i++)
      if (list_add(p, target, p->stack[i]))
        return -1;
    p->n = from;
    return 0;
  case 's': /* SETITEM */
    v = pop(p);
    k = pop(p);
    target = top(p);
    if (!v || !k || !target || target->type != PK_DICT)
      return fail(p, "SETITEM without a dict, a key and a value");
    return dict_set(p, target, k, v);
  case 'u': /* SETITEMS */
    if (pop_mark(p, &from))
      return -1;
    target = under_mark(p, from);
    if (!target || target->type != PK_DICT || (p->n - from) % 2)
      return fail(p, "SETITEMS without a dict or with an odd count");
    for (size_t i = from; i < p->n; i += 2)
      if (dict_set(p, target, p->stack[i], p->stack[i + 1]))
        return -1;
    p->n = from;
    return 0;
  case 't': return tuple_op(p, SIZE_MAX);
  case 0x85: return tuple_op(p, 1);
  case 0x86: return tuple_op(p, 2);
  case 0x87: return tuple_op(p, 3);
  case 'l': /* LIST */
  case 'd': /* DICT */
    if (pop_mark(p, &from))
      return -1;
    v = new_value(p, op == 'l' ? PK_LIST : PK_DICT);
    if (!v)
      return fail(p, "out of memory");
    if (op == 'd' && (p->n - from) % 2)
      return fail(p, "DICT with an odd number of items");
    for (size_t i = from; i < p->n; i += op == 'l' ? 1 : 2)
      if (op == 'l' ? list_add(p, v, p->stack[i])
                    : dict_set(p, v, p->stack[i], p->stack[i + 1]))
        return -1;
    p->n = from;
    return push(p, v);
  case '0': /* POP */
    if (!pop(p) && pop_mark(p, &from))
      return fail(p, "POP of an empty stack");
    return 0;
  case '1': /* POP_MARK */
    if (pop_mark(p, &from))
      return -1;
    p->n = from;
    return 0;
  case '2': /* DUP */
    return (v = top(p)) ? push(p, v) : fail(p, "DUP of an empty stack");
  /* Objects: read as opaque, so that a snapshot carrying one somewhere the
   * replay does not look still loads. */
  case 'c': { /* GLOBAL: module\nname\n */
    for (int i = 0; i < 2; i++) {
      const void *nl = memchr(p->buf + p->at, '\n', p->len - p->at);
      if (!nl)
        return fail(p, "truncated GLOBAL");
      p->at = (size_t)((const unsigned char *)nl - p->buf) + 1;
    }
    return push_new(p, PK_OBJECT);
  }
  case 0x93: /* STACK_GLOBAL */
  case 'R':  /* REDUCE */
  case 0x81: /* NEWOBJ */
    if (!pop(p) || !pop(p))
      return fail(p, "object opcode 0x%02x with too few values", op);
    return push_new(p, PK_OBJECT);
  case 0x92: /* NEWOBJ_EX */
    if (!pop(p) || !pop(p) || !pop(p))
      return fail(p, "NEWOBJ_EX with too few values");
    return push_new(p, PK_OBJECT);
  case 'b': /* BUILD: the state goes; the object stays */
    if (!pop(p) || !top(p))
      return fail(p, "BUILD with too few values");
    return 0;
  default:
    if (op >= 0x20 && op < 0x7f)
      return fail(p, "opcode '%c' (0x%02x) is not part of plain data", op, op);
    return fail(p, "opcode 0x%02x is not part of plain data (damaged file?)",
                op);
  }
}

int pk_parse(const unsigned char *buf, size_t len, size_t limit, pk_doc **doc,
             pk_value **root, char *err, size_t errlen) {
  parser p = {
      .buf = buf, .len = len, .limit = limit, .err = err, .errlen = errlen};
  *doc = NULL;
  *root = NULL;
  p.doc = calloc(1, sizeof *p.doc);
  if (!p.doc) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  bool stop = false;
  int rc = 0;
  while (rc == 0 && !stop)
    rc = step(&p, &stop);
  if (rc == 0 && (p.n != 1 || p.nmarks))
    rc = fail(&p, "STOP with %zu values and %zu marks on the stack", p.n,
              p.nmarks);
  /* A snapshot is one pickle: what follows it would be dropped unseen. */
  if (rc == 0 && p.at != p.len)
    rc = fail(&p, "%zu bytes after the pickle's end", p.len - p.at);
  if (rc == 0) {
    p.op_at = p.len;
    rc = index_dicts(&p);
  }
  if (rc == 0)
    *root = p.stack[0];
  free(p.stack);
  free(p.marks);
  free(p.memo);
  if (rc != 0) {
    pk_free(p.doc);
    return p.over_limit ? -2 : -1;
  }
  p.doc->bytes = p.held;
  *doc = p.doc;
  return 0;
}

size_t pk_bytes(const pk_doc *doc) {
  return doc ? doc->bytes : 0;
}

void pk_free(pk_doc *doc) {
  if (!doc)
    return;
  for (chunk *c = doc->chunks, *next; c; c = next) {
    next = c->next;
    for (size_t i = 0; i < c->used; i++) {
      pk_value *v = &c->v[i];
      if (v->type == PK_LIST || v->type == PK_TUPLE) {
        free(v->u.list.v);
      } else if (v->type == PK_DICT) {
        free(v->u.dict.kv);
        free(v->u.dict.index);
      }
    }
    free(c);
  }
  free(doc);
}

bool pk_str_is(const pk_value *v, const char *s) {
  size_t n = strlen(s);
  return v && v->type == PK_STR && v->u.str.n == n &&
         memcmp(v->u.str.s, s, n) == 0;
}

const pk_value *pk_get(const pk_value *d, const char *key) {
  if (!d || d->type != PK_DICT)
    return NULL;
  if (d->u.dict.index) {
    uint32_t e = *index_slot(d, key, strlen(key));
    return e ? d->u.dict.kv[2 * (size_t)(e - 1) + 1] : NULL;
  }
  for (size_t i = d->u.dict.n; i-- > 0;)
    if (pk_str_is(d->u.dict.kv[2 * i], key))
      return d->u.dict.kv[2 * i + 1];
  return NULL;
}

const char *pk_type_name(const pk_value *v) {
  static const char *const names[] = {"None", "bool",  "int",  "float",
                                      "str",  "bytes", "list", "tuple",
                                      "dict", "object"};
  return v ? names[v->type] : "missing";
}
