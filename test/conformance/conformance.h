/* conformance.h: what the conformance programs share, on top of check.h:
 * locations and pool properties, attribute readers, streams and events made
 * with their checks, a label per step, and the main that runs
 * a module's table of tests. Header-only: each module is one translation
 * unit, so everything here is static inline (unused helpers cost nothing). */
#ifndef TP_TEST_CONFORMANCE_H
#define TP_TEST_CONFORMANCE_H

#include <limits.h>
#include <stdarg.h>

#include "check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ========================================================================
 * Locations and properties
 * ======================================================================== */

static inline tp_location_t loc_device(int id) {
  tp_location_t loc = {TP_LOCATION_DEVICE, id, 0};
  return loc;
}

static inline tp_location_t loc_host(void) {
  tp_location_t loc = {TP_LOCATION_HOST, 0, 0};
  return loc;
}

static inline tp_location_t loc_numa(int node) {
  tp_location_t loc = {TP_LOCATION_HOST_NUMA, node, 0};
  return loc;
}

static inline tp_location_t loc_none(void) {
  tp_location_t loc = {TP_LOCATION_NONE, 0, 0};
  return loc;
}

/* Properties are zeroed first, as the manual asks, so that fields a test
 * does not name (usage) hold their documented default. */
static inline tp_pool_props_t props_make(tp_allocation_type_t type,
                                         tp_location_t loc,
                                         unsigned handle_types,
                                         size_t max_size) {
  tp_pool_props_t p;
  memset(&p, 0, sizeof p);
  p.alloc_type = type;
  p.location = loc;
  p.handle_types = handle_types;
  p.max_size = max_size;
  return p;
}

/* A pinned pool of device 0; NULL (with a failure counted) when creation
 * fails. */
static inline tp_pool_t device_pool(size_t max_size) {
  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_NONE, max_size);
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return NULL;
  CHECK(pool != NULL);
  return pool;
}

static inline tp_pool_t default_pool(void) {
  tp_pool_t pool = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&pool, 0));
  CHECK(pool != NULL);
  return pool;
}

/* An ordinal no device has: 5 as in the driver's row where that is unknown,
 * otherwise one past the machine's devices. */
static inline int unknown_device(void) {
  int count = 0;
  CHECK_OK(tp_get_device_count(&count));
  return count > 5 ? count + 5 : 5;
}

/* ========================================================================
 * Attributes
 * ======================================================================== */

/* Reads a uint64_t attribute. The value is prefilled with a pattern so that
 * an implementation that writes only four bytes is caught by the caller's
 * comparisons. */
static inline uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = UINT64_C(0xAAAAAAAAAAAAAAAA);
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

/* Reads an int attribute and checks that no more than an int was written:
 * the value types are part of the contract. */
static inline int attr_int(tp_pool_t pool, tp_pool_attr_t attr) {
  struct {
    int v;
    int guard;
  } w = {-12345, 0x5A5A5A5A};
  CHECK_OK(tp_pool_get_attribute(pool, attr, &w.v));
  CHECK_EQ_INT(w.guard, 0x5A5A5A5A);
  return w.v;
}

static inline void set_u64(tp_pool_t pool, tp_pool_attr_t attr, uint64_t v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static inline void set_int(tp_pool_t pool, tp_pool_attr_t attr, int v) {
  CHECK_OK(tp_pool_set_attribute(pool, attr, &v));
}

static inline void set_policies(tp_pool_t pool, int follow, int opportunistic,
                                int internal) {
  set_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, follow);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, opportunistic);
  set_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, internal);
}

static inline uint64_t reserved_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
}

static inline uint64_t used_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
}

static inline uint64_t chunk_of(tp_pool_t pool) {
  return attr_u64(pool, TP_POOL_ATTR_CHUNK_SIZE);
}

static inline uint64_t round_up(uint64_t x, uint64_t m) {
  return m ? (x + m - 1) / m * m : x;
}

/* ========================================================================
 * Streams, events and memory
 * ======================================================================== */

static inline tp_stream_t stream_new(unsigned flags) {
  tp_stream_t s = NULL;
  CHECK_OK(tp_stream_create(&s, flags));
  CHECK(s != NULL);
  return s;
}

/* Synchronizes and destroys a stream made by stream_new; NULL is skipped so
 * that cleanup paths can call it unconditionally. */
static inline void stream_done(tp_stream_t s) {
  if (!s)
    return;
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_stream_destroy(s));
}

static inline tp_event_t event_new(void) {
  tp_event_t ev = NULL;
  CHECK_OK(tp_event_create(&ev));
  CHECK(ev != NULL);
  return ev;
}

static inline int ranges_overlap(const void *a, size_t na, const void *b,
                                 size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* A host function that raises a flag: tests launch it to see when a
 * stream's work really runs. */
static inline void raise_flag_fn(void *arg) {
  atomic_store((atomic_int *)arg, 1);
}

/* A host function that keeps its stream busy for (intptr_t)arg
 * milliseconds without the test having to release it. */
static inline void sleep_fn(void *arg) {
  check_sleep_ms((long)(intptr_t)arg);
}

/* Copies `n` bytes of pool memory into `out`, through the stream (on every
 * platform) and, on host, also by direct dereference, which must agree. */
static inline void read_back(void *out, const void *pool_mem, size_t n,
                             tp_stream_t s) {
  CHECK_OK(tp_memcpy_async(out, pool_mem, n, s));
  CHECK_OK(tp_stream_synchronize(s));
  if (check_on_host())
    CHECK(memcmp(out, pool_mem, n) == 0);
}

static inline int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v)
      return 0;
  return 1;
}

/* ========================================================================
 * Labels and the program's main
 * ======================================================================== */

/* Labels the failures of the calling thread with the step being checked
 * (check.h prints the label with each failure). */
static _Thread_local char conformance_step_[192];
static inline void step(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static inline void step(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(conformance_step_, sizeof conformance_step_, fmt, ap);
  va_end(ap);
  check_context(conformance_step_);
}

typedef struct conformance_test {
  const char *name;
  void (*fn)(void);
} conformance_test_t;

#define CONFORMANCE_TEST(fn)                                                   \
  { #fn, fn }
#define CONFORMANCE_COUNT(table) (sizeof(table) / sizeof((table)[0]))

/* Runs a module's tests in order, or only those named on the command line
 * (to rerun one that failed), and returns the exit code: 0 when every check
 * held, 1 otherwise. */
static inline int conformance_main(int argc, char **argv, const char *module,
                                   const conformance_test_t *tests, size_t n) {
  const char *platform = tp_platform_name();
  printf("tidepool conformance: %s, on platform %s\n", module,
         platform ? platform : "(none)");
  REQUIRE_EXIT(platform != NULL);
  for (int a = 1; a < argc; a++) {
    size_t i = 0;
    while (i < n && strcmp(tests[i].name, argv[a]) != 0)
      i++;
    if (i == n)
      CHECK_FAIL("no test named %s in %s", argv[a], module);
  }
  for (size_t i = 0; i < n; i++) {
    int wanted = argc < 2;
    for (int a = 1; a < argc && !wanted; a++)
      wanted = strcmp(tests[i].name, argv[a]) == 0;
    if (wanted)
      check_run_(tests[i].name, tests[i].fn);
  }
  return check_done();
}

#endif /* TP_TEST_CONFORMANCE_H */
