/* Tests of the host platform through its ops table, without the core:
 * settings, stream order, legacy-stream semantics, events, memory and
 * chunks, access enforcement, fault injection and live counts. */
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>

#include "check.h"
#include "platform/host/host_internal.h"
#include "platform/host/host_testing.h"
#include "platform/platform.h"

#define MiB ((size_t)1 << 20)
#define GRAN (2 * MiB)

static const tp__platform_ops *P = &tp__host_platform;

/* ---- helpers: streams held by a flag, and a log of what ran ------------- */

/* A host function that blocks its stream until the flag is set. */
static void hold_fn(void *arg) {
  atomic_bool *open = arg;
  double deadline = check_now_s() + CHECK_GATE_TIMEOUT_S;
  while (!atomic_load(open) && check_now_s() < deadline)
    check_sleep_ms(1);
  if (!atomic_load(open))
    CHECK_FAIL("a held stream was never released");
}

/* Each host function of the log appends its tag, so a test sees the order
 * in which work of several streams ran. */
typedef struct run_log {
  atomic_int n;
  int tags[4096];
} run_log;

typedef struct log_entry {
  run_log *log;
  int tag;
} log_entry;

static void log_fn(void *arg) {
  log_entry *e = arg;
  int i = atomic_fetch_add(&e->log->n, 1);
  if (i < 4096)
    e->log->tags[i] = e->tag;
}

static int log_index(run_log *log, int tag) {
  int n = atomic_load(&log->n);
  for (int i = 0; i < n; i++)
    if (log->tags[i] == tag)
      return i;
  return -1;
}

static tp__pstream *stream_new(int device, unsigned flags) {
  tp__pstream *ps = NULL;
  tp_stream_t handle = NULL;
  uint64_t uid = 0;
  CHECK_OK(P->stream_create(device, flags, &ps, &handle, &uid));
  CHECK(handle != NULL && uid != 0);
  return ps;
}

static tp__pstream *legacy(int device) {
  tp__stream_desc d;
  CHECK_OK(P->stream_legacy(device, &d));
  return d.ps;
}

static tp__mem_kind device_kind(int device) {
  return (tp__mem_kind){.location = {TP_LOCATION_DEVICE, device, 0},
                        .type = TP_ALLOCATION_PINNED};
}

static void grant(tp__pres *res, size_t offset, size_t size, int device,
                  tp_access_flags_t flags) {
  tp_access_desc_t d = {{TP_LOCATION_DEVICE, device, 0}, flags};
  CHECK_OK(P->set_access(res, offset, size, &d, 1));
}

/* ---- configuration and devices ------------------------------------------ */

static void test_init_settings(void) {
  setenv("TIDEPOOL_HOST_DEVICES", "0", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_DEVICES", "17", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_DEVICES", "two", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_DEVICES", "2", 1);
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "64Q", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "1M", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_DEVICE_MEMORY", "64M", 1);
  setenv("TIDEPOOL_HOST_HOST_MEMORY", "-1", 1);
  CHECK_ERR(P->init(), TP_ERROR_INVALID_VALUE);
  setenv("TIDEPOOL_HOST_HOST_MEMORY", "32MiB", 1);
  CHECK_OK(P->init());
  CHECK_OK(P->init());
}

static void test_devices(void) {
  int n = 0, v = 0;
  CHECK_OK(P->device_count(&n));
  CHECK_EQ_U64(n, 2);
  CHECK_OK(P->device_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 1));
  CHECK_EQ_U64(v, 1);
  CHECK_OK(P->device_attribute(
      &v, TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0));
  CHECK_EQ_U64(v, TP_HANDLE_POSIX_FD);
  CHECK_OK(P->device_attribute(&v, TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT, 0));
  CHECK_EQ_U64(v, 1);
  CHECK_OK(
      P->device_attribute(&v, TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS, 0));
  CHECK_EQ_U64(v, 1);
  CHECK_ERR(P->device_attribute(&v, (tp_device_attr_t)99, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->set_device(1));
  CHECK_ERR(P->set_device(2), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(P->set_device(-1), TP_ERROR_INVALID_DEVICE);

  size_t gran = 0;
  uint64_t cap = 0;
  tp__mem_kind k = device_kind(1);
  CHECK_OK(P->mem_query(&k, &gran, &cap));
  CHECK_EQ_U64(gran, GRAN);
  CHECK_EQ_U64(cap, 64 * MiB);
  k.handle_types = TP_HANDLE_POSIX_FD;
  CHECK_OK(P->mem_query(&k, &gran, &cap));
  k.handle_types = TP_HANDLE_FABRIC;
  CHECK_ERR(P->mem_query(&k, &gran, &cap), TP_ERROR_NOT_SUPPORTED);
  k = device_kind(2);
  CHECK_ERR(P->mem_query(&k, &gran, &cap), TP_ERROR_INVALID_DEVICE);
  k = (tp__mem_kind){.location = {TP_LOCATION_HOST, 0, 0},
                     .type = TP_ALLOCATION_PINNED};
  CHECK_OK(P->mem_query(&k, &gran, &cap));
  CHECK_EQ_U64(cap, 32 * MiB);
  k.location.type = TP_LOCATION_HOST_NUMA;
  CHECK_OK(P->mem_query(&k, &gran, &cap));
  CHECK_EQ_U64(cap, 32 * MiB);
  k.location.id = 1;
  CHECK_ERR(P->mem_query(&k, &gran, &cap), TP_ERROR_INVALID_DEVICE);
  k = (tp__mem_kind){.location = {TP_LOCATION_NONE, 0, 0},
                     .type = TP_ALLOCATION_MANAGED};
  CHECK_OK(P->mem_query(&k, &gran, &cap));
  CHECK_EQ_U64(cap, 64 * MiB);
}

/* ---- streams ---------------------------------------------------------------
 */

static void test_stream_identity(void) {
  tp__pstream *a, *b;
  tp_stream_t ha, hb;
  uint64_t ua, ub;
  CHECK_OK(P->stream_create(0, 0, &a, &ha, &ua));
  CHECK_OK(P->stream_create(0, TP_STREAM_NON_BLOCKING, &b, &hb, &ub));
  CHECK(ha != NULL && hb != NULL && ha != hb && ua != ub);
  CHECK_ERR(P->stream_create(0, 2, &a, &ha, &ua), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(P->stream_create(2, 0, &a, &ha, &ua), TP_ERROR_INVALID_DEVICE);
  tp__stream_desc d0, d1, again;
  CHECK_OK(P->stream_legacy(0, &d0));
  CHECK_OK(P->stream_legacy(1, &d1));
  CHECK_OK(P->stream_legacy(0, &again));
  CHECK(d0.ps == again.ps && d0.uid == again.uid);
  CHECK(d0.legacy && d1.legacy && d0.device == 0 && d1.device == 1);
  CHECK(d0.uid != 0 && d0.uid != d1.uid && d0.uid != ua && d0.uid != ub);
  CHECK_ERR(P->stream_legacy(2, &d0), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(P->stream_adopt(ha, &d0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(P->stream_destroy(d1.ps), TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->stream_destroy(a));
  CHECK_OK(P->stream_destroy(b));
}

static void test_stream_order(void) {
  static run_log log;
  static log_entry entries[2000];
  static unsigned char a[4096], b[4096];
  tp__pstream *s = stream_new(0, 0);
  memset(a, 0, sizeof a);
  for (int i = 0; i < 2000; i++) {
    entries[i] = (log_entry){&log, i};
    CHECK_OK(P->launch_host_func(s, log_fn, &entries[i]));
    if (i == 1000) {
      CHECK_OK(P->memset_async(s, a, 1, sizeof a));
      CHECK_OK(P->memcpy_async(s, b, a, sizeof b));
      CHECK_OK(P->memset_async(s, a, 2, sizeof a));
    }
  }
  CHECK_OK(P->stream_synchronize(s));
  CHECK_OK(P->stream_query(s));
  CHECK_EQ_U64(atomic_load(&log.n), 2000);
  int in_order = 1;
  for (int i = 0; i < 2000; i++)
    in_order &= log.tags[i] == i;
  CHECK(in_order);
  CHECK(a[0] == 2 && a[4095] == 2 && b[0] == 1 && b[4095] == 1);
  CHECK_OK(P->stream_destroy(s));
}

static void test_held_stream(void) {
  atomic_bool open = false;
  tp__pstream *s = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__pevent *ev, *never;
  CHECK_OK(P->event_create(0, &ev));
  CHECK_OK(P->event_create(0, &never));
  CHECK_OK(P->event_query(never));
  CHECK_OK(P->event_synchronize(never));
  CHECK_OK(P->event_record(ev, s)); /* an empty stream: already complete */
  CHECK_OK(P->event_query(ev));
  CHECK_OK(P->launch_host_func(s, hold_fn, &open));
  CHECK_OK(P->event_record(ev, s));
  check_sleep_ms(10);
  CHECK_ERR(P->event_query(ev), TP_ERROR_NOT_READY);
  CHECK_ERR(P->stream_query(s), TP_ERROR_NOT_READY);
  CHECK_OK(P->event_query(never));
  atomic_store(&open, true);
  CHECK_OK(P->event_synchronize(ev));
  CHECK_OK(P->event_query(ev));
  CHECK_OK(P->stream_query(s));
  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->event_destroy(never));
  CHECK_OK(P->stream_destroy(s));
}

/* An op queued on the legacy stream waits for the blocking streams' earlier
 * work, and a blocking stream's later op waits for the legacy stream's. */
static void test_legacy_blocking(void) {
  run_log log = {0};
  log_entry first = {&log, 1}, second = {&log, 2}, third = {&log, 3};
  atomic_bool open = false;
  tp__pstream *s = stream_new(0, 0), *l = legacy(0);
  tp__pevent *ev;
  CHECK_OK(P->event_create(0, &ev));

  CHECK_OK(P->launch_host_func(s, hold_fn, &open));
  CHECK_OK(P->launch_host_func(s, log_fn, &first));
  CHECK_OK(P->launch_host_func(l, log_fn, &second));
  CHECK_OK(P->event_record(ev, l)); /* covers s's held work too */
  CHECK_OK(P->launch_host_func(s, log_fn, &third));
  check_sleep_ms(10);
  CHECK_EQ_U64(atomic_load(&log.n), 0);
  CHECK_ERR(P->stream_query(l), TP_ERROR_NOT_READY);
  CHECK_ERR(P->event_query(ev), TP_ERROR_NOT_READY);
  atomic_store(&open, true);
  CHECK_OK(P->stream_synchronize(s));
  CHECK_EQ_U64(atomic_load(&log.n), 3);
  CHECK(log.tags[0] == 1 && log.tags[1] == 2 && log.tags[2] == 3);
  CHECK_OK(P->event_query(ev));

  /* The other way: the legacy stream held, a blocking stream waits. */
  atomic_store(&open, false);
  atomic_store(&log.n, 0);
  CHECK_OK(P->launch_host_func(l, hold_fn, &open));
  CHECK_OK(P->launch_host_func(s, log_fn, &first));
  CHECK_OK(P->event_record(ev, s));
  check_sleep_ms(10);
  CHECK_EQ_U64(atomic_load(&log.n), 0);
  CHECK_ERR(P->stream_query(s), TP_ERROR_NOT_READY);
  CHECK_ERR(P->event_query(ev), TP_ERROR_NOT_READY);
  atomic_store(&open, true);
  CHECK_OK(P->event_synchronize(ev));
  CHECK_EQ_U64(atomic_load(&log.n), 1);
  CHECK_OK(P->device_synchronize(0));
  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->stream_destroy(s));
}

/* Non-blocking streams neither wait for the legacy stream nor make it wait,
 * and a blocking stream of another device is not involved either. */
static void test_legacy_non_blocking(void) {
  run_log log = {0};
  log_entry nb = {&log, 1}, leg = {&log, 2}, other = {&log, 3};
  atomic_bool open = false;
  tp__pstream *n = stream_new(0, TP_STREAM_NON_BLOCKING), *l = legacy(0);
  tp__pstream *o = stream_new(1, 0);

  CHECK_OK(P->launch_host_func(l, hold_fn, &open));
  CHECK_OK(P->launch_host_func(n, log_fn, &nb));
  CHECK_OK(P->launch_host_func(o, log_fn, &other));
  CHECK_OK(P->stream_synchronize(n));
  CHECK_OK(P->stream_synchronize(o));
  CHECK_EQ_U64(atomic_load(&log.n), 2);
  atomic_store(&open, true);
  CHECK_OK(P->stream_synchronize(l));

  atomic_store(&open, false);
  CHECK_OK(P->launch_host_func(n, hold_fn, &open));
  CHECK_OK(P->launch_host_func(o, hold_fn, &open));
  CHECK_OK(P->launch_host_func(l, log_fn, &leg));
  CHECK_OK(P->stream_synchronize(l));
  CHECK_EQ_U64(atomic_load(&log.n), 3);
  CHECK_ERR(P->stream_query(n), TP_ERROR_NOT_READY);
  atomic_store(&open, true);
  CHECK_OK(P->device_synchronize(0));
  CHECK_OK(P->device_synchronize(1));
  CHECK_OK(P->stream_query(n));
  CHECK_OK(P->stream_query(o));
  CHECK_OK(P->stream_destroy(n));
  CHECK_OK(P->stream_destroy(o));
}

static void test_stream_wait_event(void) {
  run_log log = {0};
  log_entry before = {&log, 1}, after = {&log, 2};
  atomic_bool open = false;
  tp__pstream *a = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__pstream *b = stream_new(1, TP_STREAM_NON_BLOCKING);
  tp__pstream *c = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__pevent *ev;
  CHECK_OK(P->event_create(0, &ev));
  CHECK_OK(P->stream_wait_event(b, ev)); /* never recorded: no wait */
  CHECK_OK(P->launch_host_func(a, hold_fn, &open));
  CHECK_OK(P->launch_host_func(a, log_fn, &before));
  CHECK_OK(P->event_record(ev, a));
  CHECK_OK(P->stream_wait_event(b, ev));
  /* Recording again elsewhere does not change the wait already queued. */
  CHECK_OK(P->event_record(ev, c));
  CHECK_OK(P->event_query(ev));
  CHECK_OK(P->launch_host_func(b, log_fn, &after));
  check_sleep_ms(10);
  CHECK_EQ_U64(atomic_load(&log.n), 0);
  CHECK_ERR(P->stream_query(b), TP_ERROR_NOT_READY);
  atomic_store(&open, true);
  CHECK_OK(P->stream_synchronize(b));
  CHECK_EQ_U64(atomic_load(&log.n), 2);
  CHECK(log_index(&log, 1) == 0 && log_index(&log, 2) == 1);
  /* An event of one device may not be recorded on another's stream. */
  CHECK_ERR(P->event_record(ev, b), TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->stream_destroy(a));
  CHECK_OK(P->stream_destroy(b));
  CHECK_OK(P->stream_destroy(c));
}

/* Destroy returns at once; the queued work still runs, and an event
 * recorded on the stream still completes. */
static void test_stream_destroy_drains(void) {
  run_log log = {0};
  log_entry e = {&log, 7};
  atomic_bool open = false;
  tp__pstream *s = stream_new(0, 0);
  tp__pevent *ev;
  CHECK_OK(P->event_create(0, &ev));
  CHECK_OK(P->launch_host_func(s, hold_fn, &open));
  for (int i = 0; i < 10; i++)
    CHECK_OK(P->launch_host_func(s, log_fn, &e));
  CHECK_OK(P->event_record(ev, s));
  CHECK_OK(P->stream_destroy(s));
  CHECK_ERR(P->event_query(ev), TP_ERROR_NOT_READY);
  atomic_store(&open, true);
  CHECK_OK(P->event_synchronize(ev));
  CHECK_EQ_U64(atomic_load(&log.n), 10);
  CHECK_OK(P->event_destroy(ev));
  tp__host_quiesce();
}

/* ---- memory ----------------------------------------------------------------
 */

static uint64_t file_blocks(tp__pres *res) {
  struct stat st;
  CHECK(fstat(tp__host_res_fd(res), &st) == 0);
  return (uint64_t)st.st_blocks;
}

static void test_memory_map_remap(void) {
  tp__mem_kind k = device_kind(0);
  tp__pres *res;
  uintptr_t base;
  tp__host_live live;
  CHECK_OK(P->reserve(&k, 16 * MiB, 32 * MiB, &res, &base));
  CHECK(base % (32 * MiB) == 0);
  CHECK_ERR(P->reserve(&k, 3 * MiB, GRAN, &res, &base), TP_ERROR_INVALID_VALUE);
  tp__phys c[2];
  CHECK_OK(P->chunk_create(res, &c[0]));
  CHECK_OK(P->chunk_create(res, &c[1]));
  CHECK(c[0] != 0 && c[1] != 0 && c[0] != c[1]);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], 4 * MiB);
  CHECK_EQ_U64(live.chunks, 2);

  CHECK_OK(P->map(res, 0, c, 2));
  CHECK_ERR(P->map(res, 2 * MiB, c, 1), TP_ERROR_INVALID_VALUE); /* mapped */
  CHECK_ERR(P->map(res, 16 * MiB, c, 1), TP_ERROR_INVALID_VALUE);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.mapped_chunks, 2);
  char *p = (char *)base;
  memset(p, 0xab, 2 * GRAN);
  strcpy(p + GRAN, "second chunk");

  /* Move the second chunk to the end of the range: its contents follow. */
  CHECK_OK(P->unmap(res, GRAN, 1));
  CHECK_ERR(P->unmap(res, GRAN, 1), TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->map(res, 14 * MiB, &c[1], 1));
  CHECK(strcmp(p + 14 * MiB, "second chunk") == 0);
  CHECK((unsigned char)p[14 * MiB + GRAN - 1] == 0xab);
  CHECK((unsigned char)p[GRAN - 1] == 0xab);

  /* Released chunks give their memory back to the system. */
  uint64_t blocks = file_blocks(res);
  CHECK(blocks >= 2 * GRAN / 512);
  CHECK_OK(P->unmap(res, 0, 1));
  CHECK_OK(P->unmap(res, 14 * MiB, 1));
  CHECK_OK(P->chunk_release(res, c[0]));
  CHECK_ERR(P->chunk_release(res, c[0]), TP_ERROR_INVALID_VALUE);
  CHECK(file_blocks(res) <= blocks - GRAN / 512);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], 2 * MiB);

  /* A released chunk's place in the memfd is the next one handed out. */
  tp__phys again;
  CHECK_OK(P->chunk_create(res, &again));
  CHECK_EQ_U64(again, c[0]);

  /* Released while mapped: freed when its mapping goes. */
  CHECK_OK(P->map(res, 0, &again, 1));
  CHECK_OK(P->chunk_release(res, again));
  CHECK_ERR(P->map(res, GRAN, &again, 1), TP_ERROR_INVALID_VALUE);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], 4 * MiB);
  CHECK_ERR(P->unreserve(res), TP_ERROR_INVALID_VALUE); /* still mapped */
  CHECK_OK(P->unmap(res, 0, 1));
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], 2 * MiB);

  CHECK_OK(P->chunk_release(res, c[1]));
  CHECK_OK(P->unreserve(res));
}

static void test_memory_capacity(void) {
  /* Device 0 holds 64 MiB: 32 chunks, shared by all its reservations. */
  tp__mem_kind k = device_kind(0);
  tp__pres *r1, *r2;
  uintptr_t b1, b2;
  CHECK_OK(P->reserve(&k, 64 * MiB, GRAN, &r1, &b1));
  CHECK_OK(P->reserve(&k, 64 * MiB, GRAN, &r2, &b2));
  tp__phys c[33];
  for (int i = 0; i < 32; i++)
    CHECK_OK(P->chunk_create(i % 2 ? r2 : r1, &c[i]));
  CHECK_ERR(P->chunk_create(r1, &c[32]), TP_ERROR_OUT_OF_MEMORY);
  CHECK_ERR(P->chunk_create(r2, &c[32]), TP_ERROR_OUT_OF_MEMORY);
  /* Other locations have their own capacity. */
  tp__mem_kind k1 = device_kind(1);
  tp__pres *r3;
  uintptr_t b3;
  tp__phys c3;
  CHECK_OK(P->reserve(&k1, GRAN, GRAN, &r3, &b3));
  CHECK_OK(P->chunk_create(r3, &c3));
  CHECK_OK(P->chunk_release(r3, c3));
  CHECK_OK(P->unreserve(r3));
  CHECK_OK(P->chunk_release(r1, c[0]));
  CHECK_OK(P->chunk_create(r2, &c[0])); /* room again, in the other range */
  for (int i = 1; i < 32; i++)
    CHECK_OK(P->chunk_release(i % 2 ? r2 : r1, c[i]));
  /* Live chunks go with their reservation, and so does their charge. */
  CHECK_OK(P->unreserve(r1));
  CHECK_OK(P->unreserve(r2));
  tp__host_live live;
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], 0);
  CHECK_EQ_U64(live.chunks, 0);

  /* Host memory: 32 MiB. Managed memory without a location: device 0. */
  tp__mem_kind hk = {.location = {TP_LOCATION_HOST_NUMA, 0, 0},
                     .type = TP_ALLOCATION_PINNED};
  CHECK_OK(P->reserve(&hk, 64 * MiB, GRAN, &r1, &b1));
  for (int i = 0; i < 16; i++)
    CHECK_OK(P->chunk_create(r1, &c[i]));
  CHECK_ERR(P->chunk_create(r1, &c[16]), TP_ERROR_OUT_OF_MEMORY);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.host_bytes, 32 * MiB);
  CHECK_EQ_U64(live.device_bytes[0], 0);
  tp__mem_kind mk = {.location = {TP_LOCATION_NONE, 0, 0},
                     .type = TP_ALLOCATION_MANAGED};
  CHECK_OK(P->reserve(&mk, GRAN, GRAN, &r2, &b2));
  CHECK_OK(P->chunk_create(r2, &c[16]));
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.device_bytes[0], GRAN);
  CHECK_OK(P->chunk_release(r2, c[16]));
  CHECK_OK(P->unreserve(r2));
  for (int i = 0; i < 16; i++)
    CHECK_OK(P->chunk_release(r1, c[i]));
  CHECK_OK(P->unreserve(r1));
}

/* Memory work checks access when it runs, on the stream's device. */
static void test_access(void) {
  static unsigned char host[4096];
  tp__mem_kind k = device_kind(0);
  tp__pres *res;
  uintptr_t base;
  CHECK_OK(P->reserve(&k, 8 * MiB, GRAN, &res, &base));
  tp__phys c[2];
  CHECK_OK(P->chunk_create(res, &c[0]));
  CHECK_OK(P->chunk_create(res, &c[1]));
  CHECK_OK(P->map(res, 0, c, 2));
  unsigned char *p = (unsigned char *)base;
  tp__pstream *s0 = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__pstream *s1 = stream_new(1, TP_STREAM_NON_BLOCKING);

  /* Mapped memory starts with no access at all. */
  CHECK_OK(P->memset_async(s0, p, 7, 4096));
  CHECK_ERR(P->stream_synchronize(s0), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(P->stream_synchronize(s0)); /* reported once */
  CHECK(p[0] == 0);
  grant(res, 0, 4 * MiB, 0, TP_ACCESS_READ_WRITE);
  CHECK_OK(P->memset_async(s0, p, 7, 4096));
  CHECK_OK(P->memcpy_async(s0, p + GRAN, p, 4096)); /* within one range */
  CHECK_OK(P->stream_synchronize(s0));
  CHECK(p[0] == 7 && p[4095] == 7 && p[GRAN] == 7);

  /* Another device: nothing, then read only. */
  CHECK_OK(P->memcpy_async(s1, host, p, sizeof host));
  CHECK_ERR(P->stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK(host[0] == 0);
  grant(res, 0, 4 * MiB, 1, TP_ACCESS_READ);
  CHECK_OK(P->memcpy_async(s1, host, p, sizeof host));
  CHECK_OK(P->stream_synchronize(s1));
  CHECK(host[0] == 7);
  host[0] = 1;
  CHECK_OK(P->memcpy_async(s1, p, host, 16));
  CHECK_ERR(P->stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK(p[0] == 7);
  CHECK_OK(P->memset_async(s1, host, 3, 100)); /* plain host memory */
  CHECK_OK(P->stream_synchronize(s1));
  CHECK(host[99] == 3);

  /* A range running into an unmapped granule faults as a whole. */
  CHECK_OK(P->memset_async(s0, p + 4 * MiB - 16, 1, 32));
  CHECK_ERR(P->stream_synchronize(s0), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK(p[4 * MiB - 16] == 0);

  /* An event covering faulted work reports the fault, whether recorded
   * before or after the work ran, and leaves it to the stream's
   * synchronize; one recorded before the faulting op reports nothing. */
  tp__pevent *before, *after;
  CHECK_OK(P->event_create(1, &before));
  CHECK_OK(P->event_create(1, &after));
  atomic_bool gate = false;
  CHECK_OK(P->launch_host_func(s1, hold_fn, &gate));
  CHECK_OK(P->event_record(before, s1));
  CHECK_OK(P->memcpy_async(s1, p, host, 16)); /* device 1 reads only */
  CHECK_OK(P->event_record(after, s1));
  CHECK_ERR(P->event_query(after), TP_ERROR_NOT_READY);
  atomic_store(&gate, true);
  CHECK_ERR(P->event_synchronize(after), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_ERR(P->event_query(after), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(P->event_synchronize(before));
  CHECK_OK(P->event_query(before));
  CHECK_OK(P->event_record(after, s1)); /* the work has run by now */
  CHECK_ERR(P->event_synchronize(after), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_ERR(P->stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(P->event_synchronize(after)); /* reported, and cleared */
  CHECK_OK(P->event_record(after, s1));
  CHECK_OK(P->event_query(after));
  CHECK_OK(P->event_destroy(before));
  CHECK_OK(P->event_destroy(after));

  /* Revoked access; device_synchronize reports and clears the fault. */
  grant(res, 0, 4 * MiB, 0, TP_ACCESS_NONE);
  CHECK_OK(P->memset_async(s0, p, 1, 16));
  CHECK_ERR(P->device_synchronize(0), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(P->stream_synchronize(s0));
  CHECK_OK(P->device_synchronize(0));
  CHECK(p[0] == 7);

  /* What counts is the access when the work runs, not when it was queued. */
  atomic_bool open = false;
  CHECK_OK(P->launch_host_func(s0, hold_fn, &open));
  CHECK_OK(P->memset_async(s0, p, 9, 16));
  grant(res, 0, 4 * MiB, 0, TP_ACCESS_READ_WRITE);
  atomic_store(&open, true);
  CHECK_OK(P->stream_synchronize(s0));
  CHECK(p[0] == 9);
  atomic_store(&open, false);
  CHECK_OK(P->launch_host_func(s0, hold_fn, &open));
  CHECK_OK(P->memset_async(s0, p + GRAN, 5, 16));
  CHECK_OK(P->unmap(res, GRAN, 1));
  atomic_store(&open, true);
  CHECK_ERR(P->stream_synchronize(s0), TP_ERROR_ILLEGAL_ADDRESS);

  /* set_access checks every descriptor before it applies any. */
  tp_access_desc_t d[2] = {{{TP_LOCATION_DEVICE, 1, 0}, TP_ACCESS_READ_WRITE},
                           {{TP_LOCATION_DEVICE, 5, 0}, TP_ACCESS_READ}};
  CHECK_ERR(P->set_access(res, 0, GRAN, d, 2), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(P->memcpy_async(s1, p, host, 16)); /* device 1 still reads only */
  CHECK_ERR(P->stream_synchronize(s1), TP_ERROR_ILLEGAL_ADDRESS);
  d[1] = (tp_access_desc_t){{TP_LOCATION_HOST, 0, 0}, (tp_access_flags_t)2};
  CHECK_ERR(P->set_access(res, 0, GRAN, d, 2), TP_ERROR_INVALID_VALUE);
  d[1].flags = TP_ACCESS_READ_WRITE;
  CHECK_OK(P->set_access(res, 0, GRAN, d, 2));
  CHECK_ERR(P->set_access(res, 0, 4 * MiB, d, 2), TP_ERROR_INVALID_VALUE);
  CHECK_OK(P->memcpy_async(s1, p, host, 16));
  CHECK_OK(P->stream_synchronize(s1));
  CHECK(p[0] == 3); /* host[] was set to 3 above */

  CHECK_OK(P->unmap(res, 0, 1));
  CHECK_OK(P->chunk_release(res, c[0]));
  CHECK_OK(P->chunk_release(res, c[1]));
  CHECK_OK(P->unreserve(res));
  CHECK_OK(P->stream_destroy(s0));
  CHECK_OK(P->stream_destroy(s1));
}

/* ---- fault injection
 * --------------------------------------------------------- */

static void expect_injected(tp_error_t got, int line) {
  int code = 0;
  tp_get_last_platform_error(&code, NULL);
  if (got != TP_ERROR_PLATFORM || code != EIO)
    check_fail_(__FILE__, line,
                "expected an injected TP_ERROR_PLATFORM, got %s (code %d)",
                tp_error_name(got), code);
}

static void test_fault_memory(void) {
  tp__host_live live0, live;
  tp__host_live_get(&live0);
  tp__mem_kind k = device_kind(0);
  tp__pres *res = NULL;
  uintptr_t base;
  uint64_t ops = tp__host_fault_ops(TP__HOST_FAULT_MEMORY);
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 1);
  CHECK_ERR(P->reserve(&k, 8 * MiB, GRAN, &res, &base), TP_ERROR_OUT_OF_MEMORY);
  CHECK_EQ_U64(tp__host_fault_ops(TP__HOST_FAULT_MEMORY), ops + 1);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.reservations, live0.reservations);
  CHECK_OK(P->reserve(&k, 8 * MiB, GRAN, &res, &base));

  tp__phys c[3];
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 1);
  CHECK_ERR(P->chunk_create(res, &c[0]), TP_ERROR_OUT_OF_MEMORY);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.chunks, 0);
  CHECK_EQ_U64(live.device_bytes[0], 0);
  for (int i = 0; i < 3; i++)
    CHECK_OK(P->chunk_create(res, &c[i]));

  /* The second map fails and maps none of its chunks. */
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 2);
  CHECK_OK(P->map(res, 0, c, 1));
  expect_injected(P->map(res, GRAN, &c[1], 2), __LINE__);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.mapped_chunks, 1);
  CHECK_OK(P->map(res, GRAN, &c[1], 2));

  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 1);
  tp_access_desc_t d = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
  expect_injected(P->set_access(res, 0, 6 * MiB, &d, 1), __LINE__);
  tp__pstream *s = stream_new(0, TP_STREAM_NON_BLOCKING);
  CHECK_OK(P->memset_async(s, (void *)base, 1, 16));
  CHECK_ERR(P->stream_synchronize(s), TP_ERROR_ILLEGAL_ADDRESS);
  CHECK_OK(P->set_access(res, 0, 6 * MiB, &d, 1));

  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 1);
  expect_injected(P->unmap(res, 0, 3), __LINE__);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.mapped_chunks, 3);
  CHECK_OK(P->memset_async(s, (void *)base, 1, 6 * MiB));
  CHECK_OK(P->stream_synchronize(s));

  /* Arming 0 disarms. */
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 1);
  tp__host_fault_arm(TP__HOST_FAULT_MEMORY, 0);
  CHECK_OK(P->unmap(res, 0, 3));
  for (int i = 0; i < 3; i++)
    CHECK_OK(P->chunk_release(res, c[i]));
  CHECK_OK(P->unreserve(res));
  CHECK_OK(P->stream_destroy(s));
}

static void count_fn(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_fault_stream(void) {
  tp__host_live live0, live;
  tp__host_live_get(&live0);
  tp__pstream *s = NULL;
  tp_stream_t h;
  uint64_t uid;
  tp__pevent *ev = NULL;
  const tp__host_fault_kind K = TP__HOST_FAULT_STREAM;

  tp__host_fault_arm(K, 1);
  expect_injected(P->stream_create(0, 0, &s, &h, &uid), __LINE__);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.streams, live0.streams);
  CHECK_OK(P->stream_create(0, 0, &s, &h, &uid));
  tp__host_fault_arm(K, 1);
  expect_injected(P->event_create(0, &ev), __LINE__);
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.events, live0.events);
  CHECK_OK(P->event_create(0, &ev));

  atomic_bool open = false;
  atomic_int ran = 0;
  CHECK_OK(P->launch_host_func(s, hold_fn, &open));
  tp__host_fault_arm(K, 1);
  expect_injected(P->event_record(ev, s), __LINE__);
  CHECK_OK(P->event_query(ev)); /* still never recorded */
  tp__host_fault_arm(K, 1);
  expect_injected(P->launch_host_func(s, count_fn, &ran), __LINE__);
  static unsigned char buf[64];
  tp__host_fault_arm(K, 1);
  expect_injected(P->memset_async(s, buf, 1, sizeof buf), __LINE__);
  tp__host_fault_arm(K, 1);
  expect_injected(P->memcpy_async(s, buf, buf + 32, 32), __LINE__);
  CHECK_OK(P->event_record(ev, s));
  tp__pstream *w = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__host_fault_arm(K, 1);
  expect_injected(P->stream_wait_event(w, ev), __LINE__);
  CHECK_OK(P->launch_host_func(w, count_fn, &ran));
  CHECK_OK(P->stream_synchronize(w)); /* no wait was queued */
  CHECK_EQ_U64(atomic_load(&ran), 1);
  atomic_store(&open, true);
  CHECK_OK(P->stream_synchronize(s));
  CHECK_EQ_U64(atomic_load(&ran), 1);
  CHECK(buf[0] == 0);
  uint64_t ops = tp__host_fault_ops(K);
  CHECK_OK(P->launch_host_func(s, count_fn, &ran));
  CHECK_EQ_U64(tp__host_fault_ops(K), ops + 1);
  CHECK_OK(P->stream_synchronize(s));
  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->stream_destroy(s));
  CHECK_OK(P->stream_destroy(w));
}

/* ---- concurrency (for the sanitizers)
 * ----------------------------------------- */

enum { WORKERS = 2, ROUNDS = 300 };
static tp__pevent *shared_events[WORKERS];
static atomic_int shared_count;

static void *stream_thread(void *arg) {
  int me = (int)(intptr_t)arg;
  unsigned char buf[256];
  tp__pstream *s = stream_new(me % 2, me ? TP_STREAM_NON_BLOCKING : 0);
  tp__pstream *l = legacy(me % 2);
  for (int i = 0; i < ROUNDS; i++) {
    CHECK_OK(P->launch_host_func(s, count_fn, &shared_count));
    CHECK_OK(P->memset_async(s, buf, i, sizeof buf));
    if (i % 16 == 0)
      CHECK_OK(P->launch_host_func(l, count_fn, &shared_count));
    if (me % 2 == 0)
      CHECK_OK(P->event_record(shared_events[me], s));
    CHECK_OK(P->stream_wait_event(s, shared_events[0]));
    tp_error_t q = P->event_query(shared_events[0]);
    CHECK(q == TP_SUCCESS || q == TP_ERROR_NOT_READY);
    if (i % 50 == 0)
      CHECK_OK(P->stream_synchronize(s));
  }
  CHECK_OK(P->stream_synchronize(s));
  CHECK(buf[0] == (unsigned char)(ROUNDS - 1));
  CHECK_OK(P->stream_destroy(s));
  return NULL;
}

typedef struct remap_ctx {
  tp__pres *res;
  tp__phys chunk;
  atomic_bool stop;
} remap_ctx;

static void *remap_thread(void *arg) {
  remap_ctx *ctx = arg;
  tp_access_desc_t d = {{TP_LOCATION_DEVICE, 0, 0}, TP_ACCESS_READ_WRITE};
  size_t at = 0;
  while (!atomic_load(&ctx->stop)) {
    CHECK_OK(P->map(ctx->res, at, &ctx->chunk, 1));
    CHECK_OK(P->set_access(ctx->res, at, GRAN, &d, 1));
    CHECK_OK(P->unmap(ctx->res, at, 1));
    at = (at + GRAN) % (4 * MiB);
  }
  return NULL;
}

static void test_concurrency(void) {
  for (int i = 0; i < WORKERS; i++)
    CHECK_OK(P->event_create(i % 2, &shared_events[i]));
  tp__mem_kind k = device_kind(0);
  remap_ctx ctx = {0};
  uintptr_t base;
  CHECK_OK(P->reserve(&k, 4 * MiB, GRAN, &ctx.res, &base));
  CHECK_OK(P->chunk_create(ctx.res, &ctx.chunk));
  pthread_t threads[WORKERS], remapper;
  CHECK(pthread_create(&remapper, NULL, remap_thread, &ctx) == 0);
  for (int i = 0; i < WORKERS; i++)
    CHECK(pthread_create(&threads[i], NULL, stream_thread,
                         (void *)(intptr_t)i) == 0);
  /* Memory work racing with map and unmap either runs whole or faults. */
  tp__pstream *s = stream_new(0, TP_STREAM_NON_BLOCKING);
  for (int i = 0; i < 200; i++) {
    CHECK_OK(P->memset_async(s, (void *)base, i, GRAN + 64));
    tp_error_t err = P->stream_synchronize(s);
    CHECK(err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS);
  }
  for (int i = 0; i < WORKERS; i++)
    pthread_join(threads[i], NULL);
  atomic_store(&ctx.stop, true);
  pthread_join(remapper, NULL);
  CHECK_OK(P->device_synchronize(0));
  CHECK_OK(P->device_synchronize(1));
  CHECK_EQ_U64(atomic_load(&shared_count),
               WORKERS * (ROUNDS + ROUNDS / 16 + 1));
  CHECK_OK(P->stream_destroy(s));
  CHECK_OK(P->chunk_release(ctx.res, ctx.chunk));
  CHECK_OK(P->unreserve(ctx.res));
  for (int i = 0; i < WORKERS; i++)
    CHECK_OK(P->event_destroy(shared_events[i]));
}

/* Not a check: the figures show that the fast paths stay cheap. */
static void report_speed(void) {
  enum { N = 100000 };
  atomic_int ran = 0;
  tp__pstream *s = stream_new(0, TP_STREAM_NON_BLOCKING);
  tp__pevent *ev;
  CHECK_OK(P->event_create(0, &ev));
  double t0 = check_now_s();
  for (int i = 0; i < N; i++)
    CHECK_OK(P->event_record(ev, s));
  double t1 = check_now_s();
  for (int i = 0; i < N; i++)
    CHECK_OK(P->launch_host_func(s, count_fn, &ran));
  CHECK_OK(P->stream_synchronize(s));
  double t2 = check_now_s();
  printf("   event_record %.0f ns; host func queued and run %.0f ns each\n",
         (t1 - t0) / N * 1e9, (t2 - t1) / N * 1e9);
  CHECK_EQ_U64(atomic_load(&ran), N);
  CHECK_OK(P->event_destroy(ev));
  CHECK_OK(P->stream_destroy(s));
}

static void test_live_counts_zero(void) {
  tp__host_quiesce();
  tp__host_live live;
  tp__host_live_get(&live);
  CHECK_EQ_U64(live.reservations, 0);
  CHECK_EQ_U64(live.chunks, 0);
  CHECK_EQ_U64(live.mapped_chunks, 0);
  CHECK_EQ_U64(live.streams, 0);
  CHECK_EQ_U64(live.events, 0);
  CHECK_EQ_U64(live.device_bytes[0], 0);
  CHECK_EQ_U64(live.device_bytes[1], 0);
  CHECK_EQ_U64(live.host_bytes, 0);
}

int main(void) {
  RUN_TEST(test_init_settings);
  if (check_failure_count())
    return check_done();
  RUN_TEST(test_devices);
  RUN_TEST(test_stream_identity);
  RUN_TEST(test_stream_order);
  RUN_TEST(test_held_stream);
  RUN_TEST(test_legacy_blocking);
  RUN_TEST(test_legacy_non_blocking);
  RUN_TEST(test_stream_wait_event);
  RUN_TEST(test_stream_destroy_drains);
  RUN_TEST(test_memory_map_remap);
  RUN_TEST(test_memory_capacity);
  RUN_TEST(test_access);
  RUN_TEST(test_fault_memory);
  RUN_TEST(test_fault_stream);
  RUN_TEST(test_concurrency);
  RUN_TEST(report_speed);
  RUN_TEST(test_live_counts_zero);
  return check_done();
}
