/* conformance_streams_events: the stream runtime that tidepool's host
 * platform provides and its cuda platform maps onto the driver: ordering
 * through events, queries of held streams, memory work, the current device
 * per thread, and bad arguments. */
#include <pthread.h>

#include "conformance.h"

typedef struct observer {
  atomic_int *watched;
  atomic_int seen; /* the watched flag's value when the observer ran */
  atomic_int ran;
} observer_t;

static void observe_fn(void *arg) {
  observer_t *o = arg;
  atomic_store(&o->seen, atomic_load(o->watched));
  atomic_store(&o->ran, 1);
}

static void test_stream_runtime_order(void) {
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  REQUIRE(a && b && ev);
  gate_t g;

  step("queries answer NOT_READY while a stream is held");
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_ERR(tp_stream_query(a), TP_ERROR_NOT_READY);
  CHECK_OK(tp_event_record(ev, a));
  CHECK_ERR(tp_event_query(ev), TP_ERROR_NOT_READY);
  CHECK_OK(tp_stream_query(b));
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_OK(tp_stream_query(a));
  CHECK_OK(tp_event_query(ev));
  CHECK_OK(tp_event_synchronize(ev));

  step("an event never recorded has completed");
  tp_event_t fresh = event_new();
  if (fresh) {
    CHECK_OK(tp_event_query(fresh));
    CHECK_OK(tp_event_synchronize(fresh));
    CHECK_OK(tp_stream_wait_event(b, fresh, 0));
    CHECK_OK(tp_stream_synchronize(b));
    CHECK_OK(tp_event_destroy(fresh));
  }

  step("tp_stream_wait_event orders b after a's recorded work");
  atomic_int done_a = 0, done_b = 0;
  observer_t obs = {&done_a, 0, 0};
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_launch_host_func(a, raise_flag_fn, &done_a));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_wait_event(b, ev, 0));
  CHECK_OK(tp_launch_host_func(b, observe_fn, &obs));
  CHECK_OK(tp_launch_host_func(b, raise_flag_fn, &done_b));
  check_sleep_ms(50);
  CHECK_EQ_INT(atomic_load(&obs.ran), 0);
  CHECK_EQ_INT(atomic_load(&done_b), 0);
  CHECK_ERR(tp_stream_query(b), TP_ERROR_NOT_READY);
  release(&g);
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_INT(atomic_load(&obs.ran), 1);
  CHECK_EQ_INT(atomic_load(&obs.seen), 1);
  CHECK_EQ_INT(atomic_load(&done_b), 1);

  step("work recorded later does not hold an earlier wait");
  atomic_int late = 0;
  void *buf = NULL;
  REQUIRE_OK(tp_malloc_async(&buf, 4096, b));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_wait_event(b, ev, 0));
  REQUIRE_OK(hold_stream(a, &g));
  CHECK_OK(tp_launch_host_func(a, raise_flag_fn, &late));
  /* Device work, not a host function: on cuda the host functions of all
   * streams share one thread, which the held stream's gate occupies. */
  CHECK_OK(tp_memset_async(buf, 0x7E, 4096, b));
  CHECK_OK(check_poll_stream(b, 5000));
  CHECK_EQ_INT(atomic_load(&late), 0);
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_EQ_INT(atomic_load(&late), 1);
  CHECK_OK(tp_free_async(buf, b));
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(a);
  stream_done(b);
}

static void test_stream_runtime_memory(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(s != NULL);
  const size_t n = 64 * KiB;
  unsigned char *src = malloc(n), *dst = malloc(n);
  void *p = NULL, *q = NULL;
  if (!CHECK(src && dst) || !CHECK_OK(tp_malloc_async(&p, n, s)) ||
      !CHECK_OK(tp_malloc_async(&q, n, s))) {
    free(src);
    free(dst);
    stream_done(s);
    return;
  }

  step("memset, then copy back to the host");
  CHECK_OK(tp_memset_async(p, 0xA5, n, s));
  memset(dst, 0, n);
  read_back(dst, p, n, s);
  CHECK(all_bytes(dst, n, 0xA5));

  step("host to pool, pool to pool, pool to host");
  for (size_t i = 0; i < n; i++)
    src[i] = (unsigned char)(i * 7 + 3);
  CHECK_OK(tp_memcpy_async(p, src, n, s));
  CHECK_OK(tp_memcpy_async(q, p, n, s));
  memset(dst, 0, n);
  read_back(dst, q, n, s);
  CHECK(memcmp(dst, src, n) == 0);

  step("a partial memset touches only its range");
  CHECK_OK(tp_memset_async((char *)q + 100, 0, 200, s));
  read_back(dst, q, n, s);
  CHECK(all_bytes(dst + 100, 200, 0));
  CHECK(memcmp(dst, src, 100) == 0);
  CHECK(memcmp(dst + 300, src + 300, n - 300) == 0);

  step("the legacy default stream carries memory work too");
  CHECK_OK(tp_memset_async(p, 0x3C, n, NULL));
  CHECK_OK(tp_memcpy_async(dst, p, n, NULL));
  CHECK_OK(tp_stream_synchronize(NULL));
  CHECK(all_bytes(dst, n, 0x3C));

  step("size 0 with NULL pointers does nothing");
  CHECK_OK(tp_memset_async(NULL, 0, 0, s));
  CHECK_OK(tp_memcpy_async(NULL, NULL, 0, s));
  check_context(NULL);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_free_async(q, s));
  free(src);
  free(dst);
  stream_done(s);
}

typedef struct device_probe {
  int count;
  int initial;    /* the new thread's device before it sets one */
  int after;      /* after tp_set_device(count - 1) */
  tp_error_t err; /* of that tp_set_device */
} device_probe_t;

static void *device_thread(void *arg) {
  device_probe_t *d = arg;
  d->initial = -1;
  tp_get_device(&d->initial);
  d->err = tp_set_device(d->count - 1);
  d->after = -1;
  tp_get_device(&d->after);
  return NULL;
}

static void test_stream_runtime_bad_arguments(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  REQUIRE(s && ev);
  unsigned char buf[64];
  tp_stream_t t = NULL;

  step("stream and event creation");
  CHECK_ERR(tp_stream_create(NULL, TP_STREAM_DEFAULT), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_create(&t, 2), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_create(&t, 0x80000001u), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_create(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_destroy(NULL), TP_ERROR_INVALID_VALUE);

  step("events");
  CHECK_ERR(tp_stream_wait_event(s, ev, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_stream_wait_event(s, NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_record(NULL, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_query(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_synchronize(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_event_destroy(NULL), TP_ERROR_INVALID_VALUE);

  step("host functions and memory work");
  CHECK_ERR(tp_launch_host_func(s, NULL, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memset_async(NULL, 0, 16, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(NULL, buf, 16, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_memcpy_async(buf, NULL, 16, s), TP_ERROR_INVALID_VALUE);

  step("devices");
  int count = -1, dev = -1;
  CHECK_ERR(tp_get_device_count(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_get_device(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_get_device_count(&count));
  CHECK(count >= 1);
  CHECK_ERR(tp_set_device(-1), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_set_device(count), TP_ERROR_INVALID_DEVICE);
  CHECK_OK(tp_get_device(&dev));
  CHECK_EQ_INT(dev, 0);
  CHECK_OK(tp_set_device(0));

  step("the current device is per thread");
  device_probe_t probe = {count, -1, -1, TP_ERROR_PLATFORM};
  pthread_t th;
  if (CHECK_EQ_INT(pthread_create(&th, NULL, device_thread, &probe), 0)) {
    pthread_join(th, NULL);
    CHECK_EQ_INT(probe.initial, 0);
    CHECK_OK(probe.err);
    CHECK_EQ_INT(probe.after, count - 1);
    dev = -1;
    CHECK_OK(tp_get_device(&dev));
    CHECK_EQ_INT(dev, 0);
  }
  check_context(NULL);
  CHECK_OK(tp_event_destroy(ev));
  stream_done(s);
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_stream_runtime_order),
      CONFORMANCE_TEST(test_stream_runtime_memory),
      CONFORMANCE_TEST(test_stream_runtime_bad_arguments),
  };
  return conformance_main(argc, argv, "streams_events", tests,
                          CONFORMANCE_COUNT(tests));
}
