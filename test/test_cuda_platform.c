/* test_cuda_platform: the cuda platform's ops called directly, below the
 * allocator core: devices, streams (created, adopted, legacy, per-thread),
 * events, host functions, and the VMM memory ops. Skips without a GPU. */
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"
#include "platform/platform.h"

static const tp__platform_ops *P = &tp__cuda_platform;
static int device_count;

/* ---- a few raw driver calls, to make objects tidepool did not make ------
 * The test does not see cuda.h, so it declares what it needs: CUresult is
 * an int-sized enum and CUstream and CUcontext are pointers. */
typedef int (*raw_stream_create_fn)(void **stream, unsigned flags);
typedef int (*raw_stream_destroy_fn)(void *stream);
typedef int (*raw_ctx_get_current_fn)(void **ctx);
static raw_stream_create_fn raw_stream_create;
static raw_stream_destroy_fn raw_stream_destroy;
static raw_ctx_get_current_fn raw_ctx_get_current;

/* dlsym's object pointer becomes a function pointer by copying its bytes,
 * which ISO C allows where a cast is not. */
static void raw_symbol(void *lib, const char *name, void *fn_out) {
  void *sym = lib ? dlsym(lib, name) : NULL;
  memcpy(fn_out, &sym, sizeof sym);
}

static void raw_driver_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  raw_symbol(lib, "cuStreamCreate", &raw_stream_create);
  raw_symbol(lib, "cuStreamDestroy_v2", &raw_stream_destroy);
  raw_symbol(lib, "cuCtxGetCurrent", &raw_ctx_get_current);
}

/* The calling thread's current context, or NULL (also when unknown). */
static void *current_ctx(void) {
  void *ctx = NULL;
  if (!raw_ctx_get_current || raw_ctx_get_current(&ctx) != 0)
    return NULL;
  return ctx;
}

/* ---- holding a stream with a host function -------------------------------
 * Holds live in static slots: a test that stops early returns while the
 * driver's callback thread may still be reading its hold. */
#define HOLDS 8
#define HOLD_TIMEOUT_S 30.0

typedef struct hold {
  atomic_int in_use;
  atomic_int open;
  atomic_int entered;
} hold_t;
static hold_t holds[HOLDS];

static void hold_fn(void *arg) {
  hold_t *h = arg;
  atomic_store(&h->entered, 1);
  double deadline = check_now_s() + HOLD_TIMEOUT_S;
  while (!atomic_load(&h->open)) {
    if (check_now_s() > deadline) {
      CHECK_FAIL("a held stream was never released");
      break;
    }
    check_sleep_us(100);
  }
  atomic_store(&h->in_use, 0);
}

static hold_t *hold(tp__pstream *ps) {
  for (int i = 0; i < HOLDS; i++) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&holds[i].in_use, &expect, 1))
      continue;
    atomic_store(&holds[i].open, 0);
    atomic_store(&holds[i].entered, 0);
    if (CHECK_OK(P->launch_host_func(ps, hold_fn, &holds[i])))
      return &holds[i];
    atomic_store(&holds[i].in_use, 0);
    return NULL;
  }
  CHECK_FAIL("all hold slots are in use");
  return NULL;
}

static void unhold(hold_t *h) {
  if (h)
    atomic_store(&h->open, 1);
}

static void unhold_all(void) {
  for (int i = 0; i < HOLDS; i++)
    atomic_store(&holds[i].open, 1);
}

/* ---- tests --------------------------------------------------------------- */

static void test_devices(void) {
  REQUIRE_OK(P->device_count(&device_count));
  REQUIRE(device_count >= 1);
  printf("   %d device(s)\n", device_count);
  int v = -1;
  CHECK_OK(P->device_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 0));
  CHECK_EQ_INT(v, 1);
  CHECK_OK(P->device_attribute(
      &v, TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0));
  printf("   device 0 handle types: 0x%x\n", (unsigned)v);
  CHECK(v & TP_HANDLE_POSIX_FD);
  CHECK_OK(P->device_attribute(&v, TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT, 0));
  CHECK(v >= 1);
  CHECK_OK(
      P->device_attribute(&v, TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS, 0));
  CHECK_ERR(P->device_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED,
                                device_count),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(P->set_device(device_count), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(P->set_device(-1), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->set_device(0));
  void *ctx = current_ctx();
  CHECK(ctx != NULL);
  CHECK_OK(P->set_device(0));
  CHECK_EQ_PTR(current_ctx(), ctx);
  CHECK_OK(P->device_synchronize(0));
}

static void test_streams(void) {
  tp__pstream *ps[2];
  tp_stream_t h[2];
  uint64_t uid[2];
  REQUIRE_OK(P->stream_create(0, TP_STREAM_DEFAULT, &ps[0], &h[0], &uid[0]));
  REQUIRE_OK(
      P->stream_create(0, TP_STREAM_NON_BLOCKING, &ps[1], &h[1], &uid[1]));
  CHECK(h[0] != NULL && h[1] != NULL && h[0] != h[1]);
  CHECK(uid[0] != uid[1]);
  for (int i = 0; i < 2; i++) {
    tp__stream_desc d;
    CHECK_OK(P->stream_adopt(h[i], &d));
    CHECK_EQ_PTR(d.ps, ps[i]);
    CHECK_EQ_U64(d.uid, uid[i]);
    CHECK_EQ_INT(d.device, 0);
    CHECK_EQ_INT(d.flags, i ? TP_STREAM_NON_BLOCKING : 0);
    CHECK_EQ_INT(d.legacy, 0);
    CHECK_OK(P->stream_query(ps[i]));
    CHECK_OK(P->stream_synchronize(ps[i]));
  }
  tp__pstream *bad;
  tp_stream_t bad_h;
  uint64_t bad_uid;
  CHECK_ERR(P->stream_create(0, 7, &bad, &bad_h, &bad_uid),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(P->stream_create(device_count, 0, &bad, &bad_h, &bad_uid),
            TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->stream_destroy(ps[0]));
  CHECK_OK(P->stream_destroy(ps[1]));
}

/* A host function holds one stream: its work and an event recorded behind
 * it stay pending, a second stream made to wait on the event stays pending
 * too, and all of it completes once the hold opens. */
static void test_hold_and_events(void) {
  tp__pstream *s1, *s2;
  tp_stream_t h;
  uint64_t uid;
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s1, &h, &uid));
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s2, &h, &uid));
  tp__pevent *ev, *never;
  REQUIRE_OK(P->event_create(0, &ev));
  REQUIRE_OK(P->event_create(0, &never));
  CHECK_OK(P->event_query(never));
  CHECK_OK(P->event_synchronize(never));

  hold_t *g = hold(s1);
  REQUIRE(g != NULL);
  CHECK_ERR(P->stream_query(s1), TP_ERROR_NOT_READY);
  CHECK_OK(P->event_record(ev, s1));
  CHECK_ERR(P->event_query(ev), TP_ERROR_NOT_READY);
  static atomic_int s2_ran;
  atomic_store(&s2_ran, 0);
  CHECK_OK(P->stream_wait_event(s2, ev));
  CHECK_OK(P->launch_host_func(s2, check_set_flag, &s2_ran));
  check_sleep_ms(20);
  CHECK_ERR(P->stream_query(s2), TP_ERROR_NOT_READY);
  CHECK_EQ_INT(atomic_load(&s2_ran), 0);
  /* A stream waiting on an event that never was recorded does not wait. */
  CHECK_OK(P->stream_wait_event(s1, never));

  unhold(g);
  CHECK_OK(P->stream_synchronize(s1));
  CHECK_OK(P->stream_query(s1));
  CHECK_OK(P->event_synchronize(ev));
  CHECK_OK(P->event_query(ev));
  CHECK_OK(P->stream_synchronize(s2));
  CHECK_EQ_INT(atomic_load(&s2_ran), 1);

  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->event_destroy(never));
  CHECK_OK(P->stream_destroy(s1));
  CHECK_OK(P->stream_destroy(s2));
}

/* Events come back from the platform's free list; a new event must read as
 * completed even when the one it recycles was destroyed while pending. */
static void test_event_recycling(void) {
  enum { N = 300 };
  static tp__pevent *ev[N];
  tp__pstream *s;
  tp_stream_t h;
  uint64_t uid;
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s, &h, &uid));
  hold_t *g = hold(s);
  REQUIRE(g != NULL);
  for (int i = 0; i < N; i++) {
    REQUIRE_OK(P->event_create(0, &ev[i]));
    if (i % 2)
      CHECK_OK(P->event_record(ev[i], s));
  }
  for (int i = 0; i < N; i++)
    CHECK_OK(P->event_destroy(ev[i]));
  for (int i = 0; i < N; i++) {
    REQUIRE_OK(P->event_create(0, &ev[i]));
    CHECK_OK(P->event_query(ev[i]));
  }
  unhold(g);
  CHECK_OK(P->stream_synchronize(s));
  for (int i = 0; i < N; i++) {
    CHECK_OK(P->event_record(ev[i], s));
    CHECK_OK(P->event_synchronize(ev[i]));
    CHECK_OK(P->event_destroy(ev[i]));
  }
  CHECK_OK(P->stream_destroy(s));
}

static void *per_thread_uid(void *arg) {
  tp__stream_desc *d = arg;
  if (P->stream_adopt((tp_stream_t)(uintptr_t)2, d) != TP_SUCCESS)
    d->uid = 0;
  return NULL;
}

static void test_legacy_and_per_thread(void) {
  REQUIRE_OK(P->set_device(0));
  tp__stream_desc leg, d;
  REQUIRE_OK(P->stream_legacy(0, &leg));
  CHECK_EQ_INT(leg.legacy, 1);
  CHECK_EQ_INT(leg.device, 0);
  CHECK_EQ_INT(leg.flags, 0);
  CHECK_ERR(P->stream_legacy(device_count, &d), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->stream_adopt(NULL, &d));
  CHECK_EQ_U64(d.uid, leg.uid);
  CHECK_EQ_PTR(d.ps, leg.ps);
  CHECK_EQ_INT(d.legacy, 1);
  CHECK_OK(P->stream_adopt((tp_stream_t)(uintptr_t)1, &d));
  CHECK_EQ_U64(d.uid, leg.uid);
  CHECK_EQ_PTR(d.ps, leg.ps);
  CHECK_ERR(P->stream_destroy(leg.ps), TP_ERROR_INVALID_VALUE);

  static atomic_int ran;
  atomic_store(&ran, 0);
  CHECK_OK(P->launch_host_func(leg.ps, check_set_flag, &ran));
  CHECK_OK(P->stream_synchronize(leg.ps));
  CHECK_EQ_INT(atomic_load(&ran), 1);
  tp__pevent *ev;
  REQUIRE_OK(P->event_create(0, &ev));
  CHECK_OK(P->event_record(ev, leg.ps));
  CHECK_OK(P->event_synchronize(ev));

  tp__stream_desc pt;
  REQUIRE_OK(P->stream_adopt((tp_stream_t)(uintptr_t)2, &pt));
  CHECK_EQ_INT(pt.legacy, 0);
  CHECK_EQ_INT(pt.device, 0);
  CHECK(pt.uid != leg.uid);
  atomic_store(&ran, 0);
  CHECK_OK(P->stream_wait_event(pt.ps, ev));
  CHECK_OK(P->launch_host_func(pt.ps, check_set_flag, &ran));
  CHECK_OK(P->stream_synchronize(pt.ps));
  CHECK_EQ_INT(atomic_load(&ran), 1);
  CHECK_OK(P->event_destroy(ev));

  /* Another thread's per-thread stream is another stream. */
  tp__stream_desc other = {0};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, per_thread_uid, &other) == 0);
  pthread_join(t, NULL);
  CHECK(other.uid != 0);
  CHECK(other.uid != pt.uid);
  CHECK_EQ_INT(other.device, 0);
  CHECK_ERR(P->stream_adopt((tp_stream_t)(uintptr_t)3, &d),
            TP_ERROR_INVALID_VALUE);
}

static void test_raw_stream(void) {
  REQUIRE(raw_stream_create && raw_stream_destroy);
  REQUIRE_OK(P->set_device(0));
  void *raw = NULL;
  REQUIRE(raw_stream_create(&raw, 1 /* CU_STREAM_NON_BLOCKING */) == 0);
  tp__stream_desc d;
  CHECK_OK(P->stream_adopt((tp_stream_t)raw, &d));
  CHECK_EQ_INT(d.device, 0);
  CHECK_EQ_INT(d.flags, TP_STREAM_NON_BLOCKING);
  CHECK_EQ_INT(d.legacy, 0);
  CHECK(d.uid != 0);
  static atomic_int ran;
  atomic_store(&ran, 0);
  CHECK_OK(P->launch_host_func(d.ps, check_set_flag, &ran));
  CHECK_OK(P->stream_synchronize(d.ps));
  CHECK_EQ_INT(atomic_load(&ran), 1);
  tp__stream_desc again;
  CHECK_OK(P->stream_adopt((tp_stream_t)raw, &again));
  CHECK_EQ_U64(again.uid, d.uid);
  CHECK(raw_stream_destroy(raw) == 0);
}

/* The driver may hand out a destroyed stream's handle value again; the
 * identity must still be new. */
static void test_uid_after_destroy(void) {
  int repeats = 0;
  for (int i = 0; i < 16; i++) {
    tp__pstream *a, *b;
    tp_stream_t ha, hb;
    uint64_t ua, ub;
    REQUIRE_OK(P->stream_create(0, 0, &a, &ha, &ua));
    REQUIRE_OK(P->stream_destroy(a));
    REQUIRE_OK(P->stream_create(0, 0, &b, &hb, &ub));
    CHECK(ua != ub);
    tp__stream_desc d;
    CHECK_OK(P->stream_adopt(hb, &d));
    CHECK_EQ_U64(d.uid, ub);
    repeats += ha == hb;
    CHECK_OK(P->stream_destroy(b));
  }
  printf("   the handle value repeated %d of 16 times\n", repeats);
}

/* Fills `n` bytes of device memory on `s` and reads them back. */
static int device_bytes_are(tp__pstream *s, uintptr_t addr, size_t n,
                            unsigned char want) {
  unsigned char *buf = malloc(n);
  if (!CHECK(buf != NULL))
    return 0;
  memset(buf, ~want, n);
  int ok = CHECK_OK(P->memcpy_async(s, buf, (void *)addr, n)) &&
           CHECK_OK(P->stream_synchronize(s));
  size_t bad = n;
  for (size_t i = 0; ok && i < n && bad == n; i++)
    if (buf[i] != want)
      bad = i;
  if (ok && bad != n)
    CHECK_FAIL("byte %zu of %#lx is 0x%02x, expected 0x%02x", bad,
               (unsigned long)addr, buf[bad], want);
  free(buf);
  return ok && bad == n;
}

/* Reserve, create chunks, map, grant access, write, move a chunk to another
 * offset and find its contents there, then take everything down. */
static void round_trip(const tp__mem_kind *kind, tp__pstream *s,
                       const tp_access_desc_t *acc, size_t nacc,
                       int host_readable) {
  size_t g = 0;
  uint64_t cap = 0;
  REQUIRE_OK(P->mem_query(kind, &g, &cap));
  REQUIRE(g != 0 && (g & (g - 1)) == 0);
  CHECK(cap >= g);
  printf("   granularity %zu, capacity %llu\n", g, (unsigned long long)cap);
  tp__pres *res;
  uintptr_t base;
  REQUIRE_OK(P->reserve(kind, 4 * g, g, &res, &base));
  CHECK(base % g == 0);
  tp__phys phys[3];
  REQUIRE_OK(P->chunk_create(res, &phys[0]));
  REQUIRE_OK(P->chunk_create(res, &phys[1]));
  REQUIRE_OK(P->chunk_create(res, &phys[2]));
  CHECK(phys[0] && phys[1] && phys[2]);

  REQUIRE_OK(P->map(res, 0, phys, 2));
  REQUIRE_OK(P->set_access(res, 0, 2 * g, acc, nacc));
  CHECK_OK(P->memset_async(s, (void *)base, 0x11, g));
  CHECK_OK(P->memset_async(s, (void *)(base + g), 0x22, g));
  CHECK(device_bytes_are(s, base, g, 0x11));
  CHECK(device_bytes_are(s, base + g, g, 0x22));
  if (host_readable) {
    CHECK_EQ_INT(((volatile unsigned char *)base)[0], 0x11);
    CHECK_EQ_INT(((volatile unsigned char *)base)[2 * g - 1], 0x22);
  }

  /* Separate mappings unmapped by one call, then remapped elsewhere with
   * the second chunk first: the contents travel with the chunks. */
  CHECK_OK(P->unmap(res, 0, 2));
  tp__phys swapped[2] = {phys[1], phys[0]};
  REQUIRE_OK(P->map(res, 2 * g, swapped, 2));
  REQUIRE_OK(P->set_access(res, 2 * g, 2 * g, acc, nacc));
  CHECK(device_bytes_are(s, base + 2 * g, g, 0x22));
  CHECK(device_bytes_are(s, base + 3 * g, g, 0x11));

  /* All or nothing: the second granule of this map is taken, so the first
   * must come unmapped again, which a later map of it proves. */
  tp__phys clash[2] = {phys[2], phys[0]};
  CHECK(P->map(res, g, clash, 2) != TP_SUCCESS);
  CHECK_OK(P->map(res, g, &phys[2], 1));
  CHECK_OK(P->set_access(res, g, g, acc, nacc));
  CHECK_OK(P->memcpy_async(s, (void *)(base + g), (void *)(base + 3 * g), g));
  CHECK(device_bytes_are(s, base + g, g, 0x11));

  CHECK_ERR(P->map(res, 4 * g, phys, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(P->unmap(res, 3 * g, 2), TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->unmap(res, g, 3));
  for (int i = 0; i < 3; i++)
    CHECK_OK(P->chunk_release(res, phys[i]));
  CHECK_OK(P->unreserve(res));
}

static void test_device_memory(void) {
  tp__pstream *s;
  tp_stream_t h;
  uint64_t uid;
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s, &h, &uid));
  tp__mem_kind kind = {{TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_PINNED, 0};
  tp_access_desc_t acc[2] = {{{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE},
                             {{TP_LOCATION_DEVICE, 1, 0}, TP_ACCESS_READ}};
  round_trip(&kind, s, acc, 1, 0);
  if (device_count > 1) {
    printf("   again with device 1 granted read access\n");
    round_trip(&kind, s, acc, 2, 0);
  }
  kind.handle_types = TP_HANDLE_POSIX_FD;
  printf("   device memory exportable as posix fds\n");
  round_trip(&kind, s, acc, 1, 0);
  CHECK_OK(P->stream_destroy(s));
}

static void test_host_memory(void) {
  tp__pstream *s;
  tp_stream_t h;
  uint64_t uid;
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s, &h, &uid));
  size_t g;
  uint64_t cap;
  tp__mem_kind kind = {{TP_LOCATION_HOST, 0, 0}, TP_ALLOCATION_PINNED, 0};
  tp_access_desc_t acc[2] = {
      {{TP_LOCATION_HOST, 0, 0}, TP_ACCESS_READ_WRITE},
      {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE}};
  tp_error_t err = P->mem_query(&kind, &g, &cap);
  printf("   host memory: %s\n", tp_error_name(err));
  if (err == TP_SUCCESS)
    round_trip(&kind, s, acc, 2, 1);
  kind.handle_types = TP_HANDLE_POSIX_FD;
  CHECK_ERR(P->mem_query(&kind, &g, &cap), TP_ERROR_NOT_SUPPORTED);

  kind = (tp__mem_kind){
      {TP_LOCATION_HOST_NUMA, 0, 0}, TP_ALLOCATION_PINNED, TP_HANDLE_POSIX_FD};
  acc[0].location = (tp_location_t){TP_LOCATION_HOST_NUMA, 0, 0};
  err = P->mem_query(&kind, &g, &cap);
  printf("   host NUMA node 0 memory, posix fd: %s\n", tp_error_name(err));
  if (err == TP_SUCCESS)
    round_trip(&kind, s, acc, 2, 1);
  kind.location.id = 1 << 20;
  CHECK_ERR(P->mem_query(&kind, &g, &cap), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->stream_destroy(s));
}

/* Fabric handles and managed chunks depend on the machine and the driver;
 * the test reports what they did and checks only that failures are the
 * documented ones. */
static void test_optional_memory(void) {
  size_t g;
  uint64_t cap;
  tp__mem_kind fab = {
      {TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_PINNED, TP_HANDLE_FABRIC};
  tp_error_t err = P->mem_query(&fab, &g, &cap);
  printf("   fabric query: %s\n", tp_error_name(err));
  CHECK(err == TP_SUCCESS || err == TP_ERROR_NOT_SUPPORTED);
  if (err == TP_SUCCESS) {
    tp__pres *res;
    uintptr_t base;
    REQUIRE_OK(P->reserve(&fab, g, g, &res, &base));
    tp__phys ph;
    err = P->chunk_create(res, &ph);
    printf("   fabric chunk: %s\n", tp_error_name(err));
    CHECK(err == TP_SUCCESS || err == TP_ERROR_NOT_SUPPORTED ||
          err == TP_ERROR_PLATFORM || err == TP_ERROR_OUT_OF_MEMORY);
    if (err == TP_SUCCESS)
      CHECK_OK(P->chunk_release(res, ph));
    CHECK_OK(P->unreserve(res));
  }

  tp__pstream *s;
  tp_stream_t h;
  uint64_t uid;
  REQUIRE_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &s, &h, &uid));
  tp_access_desc_t acc = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
  tp__mem_kind managed[2] = {
      {{TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_MANAGED, 0},
      {{TP_LOCATION_NONE, 0, 0}, TP_ALLOCATION_MANAGED, 0}};
  for (int i = 0; i < 2; i++) {
    err = P->mem_query(&managed[i], &g, &cap);
    printf("   managed, %s: %s\n", i ? "no location" : "device 0",
           tp_error_name(err));
    CHECK(err == TP_SUCCESS || err == TP_ERROR_NOT_SUPPORTED);
    if (err == TP_SUCCESS)
      round_trip(&managed[i], s, &acc, 1, 0);
  }
  CHECK_OK(P->stream_destroy(s));
}

static void test_bad_memory_arguments(void) {
  size_t g;
  uint64_t cap;
  tp__mem_kind kind = {{TP_LOCATION_DEVICE, 0, 0}, TP_ALLOCATION_PINNED, 0};
  kind.location.id = device_count;
  CHECK_ERR(P->mem_query(&kind, &g, &cap), TP_ERROR_INVALID_DEVICE);
  kind.location.id = 0;
  kind.handle_types = 2; /* a Windows handle type */
  CHECK_ERR(P->mem_query(&kind, &g, &cap), TP_ERROR_NOT_SUPPORTED);
  kind.handle_types = 0;
  REQUIRE_OK(P->mem_query(&kind, &g, &cap));
  tp__pres *res;
  uintptr_t base;
  CHECK_ERR(P->reserve(&kind, g, 3 * g, &res, &base), TP_ERROR_INVALID_VALUE);
  REQUIRE_OK(P->reserve(&kind, 2 * g, g, &res, &base));
  tp__phys ph;
  REQUIRE_OK(P->chunk_create(res, &ph));
  REQUIRE_OK(P->map(res, 0, &ph, 1));
  tp_access_desc_t acc = {{TP_LOCATION_DEVICE, 0, 0}, (tp_access_flags_t)2};
  CHECK_ERR(P->set_access(res, 0, g, &acc, 1), TP_ERROR_INVALID_VALUE);
  acc = (tp_access_desc_t){{TP_LOCATION_DEVICE, device_count, 0},
                           TP_ACCESS_READ_WRITE};
  CHECK_ERR(P->set_access(res, 0, g, &acc, 1), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->unmap(res, 0, 1));
  CHECK_OK(P->chunk_release(res, ph));
  CHECK_OK(P->unreserve(res));
}

/* Threads that never chose a device use streams, events and memory; the
 * platform must work for them and leave them without a current context. */
static void *worker(void *arg) {
  int choose = (int)(uintptr_t)arg % 2;
  if (choose)
    CHECK_OK(P->set_device(0));
  void *ctx_before = current_ctx();
  for (int i = 0; i < 100; i++) {
    tp__pstream *s;
    tp_stream_t h;
    uint64_t uid;
    tp__pevent *ev;
    if (!CHECK_OK(P->stream_create(0, 0, &s, &h, &uid)))
      break;
    CHECK_OK(P->event_create(0, &ev));
    CHECK_OK(P->event_record(ev, s));
    tp_error_t err = P->event_query(ev);
    CHECK(err == TP_SUCCESS || err == TP_ERROR_NOT_READY);
    CHECK_OK(P->event_synchronize(ev));
    tp__stream_desc d;
    CHECK_OK(P->stream_adopt(h, &d));
    CHECK_EQ_U64(d.uid, uid);
    CHECK_OK(P->stream_legacy(0, &d));
    CHECK_OK(P->event_destroy(ev));
    CHECK_OK(P->stream_destroy(s));
  }
  CHECK_EQ_PTR(current_ctx(), ctx_before);
  return NULL;
}

static void test_threads(void) {
  enum { T = 8 };
  pthread_t t[T];
  for (int i = 0; i < T; i++)
    REQUIRE(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) == 0);
  for (int i = 0; i < T; i++)
    pthread_join(t[i], NULL);
}

/* check.h's RUN_TEST opens its own gates only; a test that stops early
 * may leave one of this file's holds closed. */
#define RUN(fn)                                                                \
  do {                                                                         \
    RUN_TEST(fn);                                                              \
    unhold_all();                                                              \
  } while (0)

int main(void) {
  if (tp__cuda_platform.init() != TP_SUCCESS) {
    return check_skip("no cuda device");
  }
  raw_driver_load();
  RUN(test_devices);
  if (device_count < 1)
    return check_done();
  RUN(test_streams);
  RUN(test_hold_and_events);
  RUN(test_event_recycling);
  RUN(test_legacy_and_per_thread);
  RUN(test_raw_stream);
  RUN(test_uid_after_destroy);
  RUN(test_device_memory);
  RUN(test_bad_memory_arguments);
  RUN(test_optional_memory);
  RUN(test_threads);
  /* Last, because it reads host chunks through the CPU: should the driver
   * not make them readable, the crash costs no other result. */
  RUN(test_host_memory);
  return check_done();
}
