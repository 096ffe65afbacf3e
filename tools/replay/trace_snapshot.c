/* PyTorch memory snapshots (torch.cuda.memory._dump_snapshot): the pickled
 * dict whose 'device_traces' holds, per device, the allocator's events in
 * order. alloc, free_requested and free_completed become the trace's
 * operations; the segment events (segment_alloc/free, segment_map/unmap for
 * expandable segments) give what PyTorch's own allocator reserved over the
 * same trace. Other events (oom, snapshot) and keys (frames, time_us, ...)
 * are skipped. */
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "trace_internal.h"

/* A live segment; `older` chains the live segments at the same address
 * (only a damaged history has any), and the free slots. */
typedef struct segment {
  uint64_t addr, size;
  uint32_t older;
} segment;

#define NO_SEGMENT UINT32_MAX

/* What PyTorch's allocator held, from its segment events. Segments freed
 * without having been seen allocated (the history began later) are
 * ignored, so that both figures cover the same part of the run. A free
 * finds its segment by address in a hash table: a search of the live
 * segments made a history of n segments cost n^2 (200,000 segments freed
 * oldest first took 16 s). */
typedef struct user_reserved {
  segment *v;
  size_t n, cap;
  uint32_t unused; /* the first free slot of v, or NO_SEGMENT */
  trace_map *at;   /* address -> the newest live segment there */
  uint64_t now, peak;
  bool seen;
} user_reserved;

/* 0, or -1 with the reason in why. */
static int user_alloc(user_reserved *u, trace_limit *l, uint64_t addr,
                      uint64_t size, char *why, size_t len) {
  if (!u->at && !(u->at = trace_map_new()))
    return trace_failf(why, len, "out of memory");
  /* No device holds 2^64 bytes: a sum past it is a damaged snapshot, and
   * would wrap the figure printed beside the replay's. */
  if (size > UINT64_MAX - u->now)
    return trace_failf(why, len, "its segments add up past 2^64 bytes");
  int room = trace_map_room(&u->at, l);
  if (room != 0)
    return room == -2 ? trace_limit_fail(l, "its segments need", why, len)
                      : trace_failf(why, len, "out of memory");
  uint32_t i = u->unused;
  if (i == NO_SEGMENT) {
    if (u->n == u->cap) {
      size_t cap = u->cap ? u->cap * 2 : 64;
      if (cap >= TRACE_MAP_ABSENT)
        return trace_failf(why, len, "too many segments");
      if (!trace_charge(l, (cap - u->cap) * sizeof *u->v))
        return trace_limit_fail(l, "its segments need", why, len);
      segment *v = realloc(u->v, cap * sizeof *v);
      if (!v)
        return trace_failf(why, len, "out of memory");
      u->v = v;
      u->cap = cap;
    }
    i = (uint32_t)u->n++;
  } else {
    u->unused = u->v[i].older;
  }
  uint32_t *slot = trace_map_find(u->at, addr, true);
  u->v[i] =
      (segment){addr, size, *slot == TRACE_MAP_ABSENT ? NO_SEGMENT : *slot};
  *slot = i;
  u->now += size;
  if (u->now > u->peak)
    u->peak = u->now;
  return 0;
}

/* Frees the newest live segment at addr, if any. */
static void user_free(user_reserved *u, uint64_t addr) {
  uint32_t *slot = u->at ? trace_map_find(u->at, addr, false) : NULL;
  if (!slot)
    return;
  uint32_t i = *slot;
  u->now -= u->v[i].size;
  if (u->v[i].older != NO_SEGMENT)
    *slot = u->v[i].older;
  else
    trace_map_remove(slot);
  u->v[i].older = u->unused;
  u->unused = i;
}

/* An entry's integer field; -1 with a message when it is missing, not an
 * int, negative where it must not be, or beyond 64 bits. */
static int int_field(const pk_value *e, const char *key, bool may_be_negative,
                     int64_t *out, char *why, size_t len) {
  const pk_value *v = pk_get(e, key);
  if (!v)
    return trace_failf(why, len, "'%s' is missing", key);
  if (v->type != PK_INT)
    return trace_failf(why, len, "'%s' is a %s, not an int", key,
                       pk_type_name(v));
  if (v->big || (!may_be_negative && v->u.i < 0))
    return trace_failf(why, len, "'%s' is out of range", key);
  *out = v->u.i;
  return 0;
}

static int entry(trace_builder *b, user_reserved *u, const pk_value *e,
                 uint64_t index, char *why, size_t len) {
  if (e->type != PK_DICT)
    return trace_failf(why, len, "a %s, not a dict", pk_type_name(e));
  const pk_value *action = pk_get(e, "action");
  if (!action || action->type != PK_STR)
    return trace_failf(why, len, "'action' is %s",
                       action ? "not a str" : "missing");
  static const struct {
    const char *name;
    int kind; /* 0..2: trace_action; 3: segment added; 4: segment removed */
  } kinds[] = {{"alloc", TRACE_ALLOC},
               {"free_requested", TRACE_FREE},
               {"free_completed", TRACE_COMPLETED},
               {"segment_alloc", 3},
               {"segment_map", 3},
               {"segment_free", 4},
               {"segment_unmap", 4}};
  int kind = -1;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && kind < 0; i++)
    if (pk_str_is(action, kinds[i].name))
      kind = (int)i;
  if (kind < 0)
    return 0; /* oom, snapshot, or an action of a later PyTorch */
  int64_t addr, size, stream = 0;
  if (int_field(e, "addr", false, &addr, why, len) ||
      int_field(e, "size", false, &size, why, len))
    return -1;
  if (kinds[kind].kind >= 3) {
    u->seen = true;
    if (kinds[kind].kind == 4) {
      /* An unmap of an expandable segment names the range it unmaps. */
      if (pk_str_is(action, "segment_unmap"))
        u->now -= (uint64_t)size < u->now ? (uint64_t)size : u->now;
      else
        user_free(u, (uint64_t)addr);
      return 0;
    }
    return user_alloc(u, b->limit, (uint64_t)addr, (uint64_t)size, why, len);
  }
  if (int_field(e, "stream", true, &stream, why, len))
    return -1;
  uint16_t id;
  if (tb_stream(b, (uint64_t)stream, &id) != 0)
    return trace_failf(why, len, "more than %d streams", TRACE_MAX_STREAMS - 1);
  return tb_add(b, (trace_action)kinds[kind].kind, (uint64_t)addr,
                (uint64_t)size, id, index, why, len);
}

int trace_read_snapshot(trace *t, const unsigned char *data, size_t len,
                        trace_limit *limit, char *err, size_t errlen) {
  char why[240];
  pk_doc *doc = NULL;
  pk_value *root = NULL;
  t->where_is = "entry";
  uint64_t left = limit->limit - limit->held;
  int prc = pk_parse(data, len, left < SIZE_MAX ? (size_t)left : SIZE_MAX, &doc,
                     &root, why, sizeof why);
  if (prc == -2) {
    char over[200];
    trace_limit_fail(limit, "its values need", over, sizeof over);
    /* why begins with the offset: "pickle byte N: ..." */
    return trace_failf(err, errlen, "%s: %.*s: %s", t->path,
                       (int)strcspn(why, ":"), why, over);
  }
  if (prc != 0)
    return trace_failf(err, errlen, "%s: a damaged or unreadable pickle: %s",
                       t->path, why);
  trace_charge(limit, pk_bytes(doc));
  int rc = 0;
  const pk_value *traces = pk_get(root, "device_traces");
  if (root->type != PK_DICT) {
    rc = trace_failf(err, errlen,
                     "%s: the pickle holds a %s, not the dict that "
                     "torch.cuda.memory._dump_snapshot writes",
                     t->path, pk_type_name(root));
  } else if (!traces) {
    rc = trace_failf(err, errlen,
                     "%s: a pickle without 'device_traces': not a PyTorch "
                     "memory snapshot",
                     t->path);
  } else if (traces->type != PK_LIST) {
    rc = trace_failf(err, errlen, "%s: 'device_traces' is a %s, not a list",
                     t->path, pk_type_name(traces));
  }
  /* The device with the most events; a snapshot of one process usually has
   * events on one device only. */
  size_t most = 0;
  for (size_t d = 0; rc == 0 && d < traces->u.list.n; d++) {
    const pk_value *dev = traces->u.list.v[d];
    if (dev->type != PK_LIST)
      rc = trace_failf(err, errlen,
                       "%s: device_traces[%zu] is a %s, not a "
                       "list",
                       t->path, d, pk_type_name(dev));
    else if (dev->u.list.n > 0) {
      t->devices++;
      if (dev->u.list.n > most) {
        most = dev->u.list.n;
        t->device = (int)d;
      }
    }
  }
  if (rc == 0 && most == 0)
    rc = trace_failf(err, errlen,
                     "%s: 'device_traces' holds no events: call "
                     "torch.cuda.memory._record_memory_history() before the "
                     "workload runs",
                     t->path);
  trace_builder b;
  user_reserved u = {.unused = NO_SEGMENT};
  if (rc == 0 && tb_init(&b, t, limit) != 0)
    rc = trace_failf(err, errlen, "%s: out of memory", t->path);
  else if (rc == 0) {
    const pk_value *dev = traces->u.list.v[t->device];
    for (size_t i = 0; rc == 0 && i < dev->u.list.n; i++)
      if (entry(&b, &u, dev->u.list.v[i], i, why, sizeof why) != 0)
        rc = trace_failf(err, errlen, "%s, device_traces[%d][%zu]: %s", t->path,
                         t->device, i, why);
    tb_fini(&b);
  }
  t->has_user = u.seen;
  t->user_peak_reserved = u.peak;
  free(u.v);
  trace_map_free(u.at);
  pk_free(doc);
  return rc;
}
