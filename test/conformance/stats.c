/* conformance_stats: what a pool reports and gives back: the statistics
 * (used, reserved, their high watermarks, chunk maps and unmaps), the
 * release threshold at each kind of synchronize, and tp_pool_trim_to. */
#include "conformance.h"

/* ========================================================================
 * Release threshold, at each kind of synchronize
 * ======================================================================== */

enum { SYNC_STREAM, SYNC_EVENT, SYNC_DEVICE, SYNC_KINDS };
static const char *const sync_names[SYNC_KINDS] = {"stream", "event", "device"};

/* Synchronizes the work queued on `s` by the given kind of call. */
static void sync_by(int kind, tp_stream_t s, tp_event_t ev) {
  switch (kind) {
  case SYNC_STREAM: CHECK_OK(tp_stream_synchronize(s)); break;
  case SYNC_EVENT:
    CHECK_OK(tp_event_record(ev, s));
    CHECK_OK(tp_event_synchronize(ev));
    break;
  default: CHECK_OK(tp_device_synchronize()); break;
  }
}

/* Allocates `n` blocks of `size` on `s` and frees them again, in stream
 * order, so that `n * size` bytes are free once the stream has run. */
static void churn(tp_pool_t pool, int n, size_t size, tp_stream_t s) {
  void *p[8] = {0};
  for (int i = 0; i < n && i < 8; i++)
    CHECK_OK(tp_malloc_from_pool_async(&p[i], size, pool, s));
  for (int i = 0; i < n && i < 8; i++)
    CHECK_OK(tp_free_async(p[i], s));
}

static void test_release_threshold(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && ev && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);
  const uint64_t t = 16 * MiB;

  for (int kind = 0; kind < SYNC_KINDS; kind++) {
    step("threshold 0, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
    void *small = NULL, *big = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&small, 1000, pool, s));
    CHECK_OK(tp_malloc_from_pool_async(&big, 8 * MiB, pool, s));
    CHECK(reserved_of(pool) >= 8 * MiB + 1000);
    CHECK_OK(tp_free_async(small, s));
    CHECK_OK(tp_free_async(big, s));
    sync_by(kind, s, ev);
    CHECK_EQ_U64(reserved_of(pool), 0);
    CHECK_EQ_U64(used_of(pool), 0);

    step("threshold 16 MiB, 64 MiB freed, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, t);
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), t);
    churn(pool, 4, 16 * MiB, s);
    sync_by(kind, s, ev);
    uint64_t r = reserved_of(pool);
    CHECK(r <= round_up(t, chunk));
    CHECK(r >= t);
    CHECK_EQ_U64(used_of(pool), 0);
    CHECK_OK(tp_pool_trim_to(pool, 0));
    CHECK_EQ_U64(reserved_of(pool), 0);

    /* "Hold onto" the threshold: a pool that had more keeps at least the
     * threshold, even where it is no multiple of a chunk. */
    step("threshold 3 MiB + 5, 64 MiB freed, %s synchronize", sync_names[kind]);
    const uint64_t odd = 3 * MiB + 5;
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, odd);
    churn(pool, 4, 16 * MiB, s);
    sync_by(kind, s, ev);
    r = reserved_of(pool);
    CHECK(r >= odd);
    CHECK(r <= round_up(odd, chunk));
    CHECK_OK(tp_pool_trim_to(pool, 0));
    CHECK_EQ_U64(reserved_of(pool), 0);

    step("threshold UINT64_MAX keeps all, %s synchronize", sync_names[kind]);
    set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
    void *p[4] = {0};
    for (int i = 0; i < 4; i++)
      CHECK_OK(tp_malloc_from_pool_async(&p[i], 16 * MiB, pool, s));
    uint64_t before = reserved_of(pool);
    CHECK(before >= 64 * MiB);
    for (int i = 0; i < 4; i++)
      CHECK_OK(tp_free_async(p[i], s));
    sync_by(kind, s, ev);
    CHECK_EQ_U64(reserved_of(pool), before);
    CHECK_OK(tp_pool_trim_to(pool, 0));
    CHECK_EQ_U64(reserved_of(pool), 0);
  }
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_event_destroy(ev));
  stream_done(s);
}

/* A synchronize that covers the frees of a stream destroyed since still
 * releases them and makes them reusable by every stream: a device's with
 * no live stream left, and an event's recorded before the destroy. All
 * reuse policies off, so that only the synchronize can make the bytes
 * reusable. */
static void test_sync_after_stream_destroyed(void) {
  tp_pool_t probe = device_pool(0);
  REQUIRE(probe);
  uint64_t chunk = chunk_of(probe);
  CHECK_OK(tp_pool_destroy(probe));
  tp_pool_t pool = device_pool(2 * chunk);
  REQUIRE(pool);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  set_policies(pool, 0, 0, 0);

  step("device synchronize after the stream that freed was destroyed");
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(s);
  void *x = NULL, *y = NULL, *z = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&x, 2 * chunk, pool, s));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(reserved_of(pool), 0);

  step("event synchronize covering a destroyed stream's free");
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  tp_event_t ev = event_new();
  REQUIRE(a && b && ev);
  CHECK_OK(tp_malloc_from_pool_async(&x, chunk, pool, a));
  CHECK_OK(tp_malloc_from_pool_async(&y, chunk, pool, a));
  CHECK_OK(tp_free_async(x, a));
  CHECK_OK(tp_event_record(ev, a));
  CHECK_OK(tp_stream_destroy(a));
  CHECK_OK(tp_event_synchronize(ev));
  CHECK_EQ_U64(reserved_of(pool), chunk);
  CHECK_OK(tp_malloc_from_pool_async(&z, chunk, pool, b));
  CHECK(reserved_of(pool) <= 2 * chunk);
  CHECK_OK(tp_free_async(y, b));
  CHECK_OK(tp_free_async(z, b));
  stream_done(b);
  CHECK_OK(tp_event_destroy(ev));
  check_context(NULL);
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_OK(tp_pool_destroy(pool));
}

/* A synchronize of one stream releases what another stream freed once that
 * free is known complete (here by a query of its stream), not only what it
 * freed itself: reserved falls to the threshold at any synchronize. */
static void test_sync_releases_others_frees(void) {
  tp_pool_t pool = device_pool(0);
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  tp_stream_t b = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(pool && a && b);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, 0);
  void *x = NULL, *y = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&x, 8 * MiB, pool, a));
  CHECK_OK(tp_malloc_from_pool_async(&y, 1000, pool, a));
  CHECK_OK(tp_free_async(x, a));
  CHECK_OK(tp_free_async(y, a));
  double until = check_now_s() + 10;
  tp_error_t q;
  while ((q = tp_stream_query(a)) == TP_ERROR_NOT_READY &&
         check_now_s() < until)
    check_sleep_us(100);
  CHECK_OK(q);
  CHECK_OK(tp_stream_synchronize(b));
  CHECK_EQ_U64(reserved_of(pool), 0);
  stream_done(a);
  stream_done(b);
  CHECK_OK(tp_pool_destroy(pool));
}

/* ========================================================================
 * trim_to
 * ======================================================================== */

static void test_trim_to(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);

  step("trim_to(X) keeps at least X (CUDA's rule), at most X rounded up to "
       "the chunk");
  churn(pool, 4, 16 * MiB, s);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(reserved_of(pool) >= 64 * MiB);
  uint64_t unmaps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  const uint64_t keep = 20 * MiB + 1000;
  CHECK_OK(tp_pool_trim_to(pool, keep));
  uint64_t r = reserved_of(pool);
  CHECK(r <= round_up(keep, chunk));
  CHECK(r >= keep);
  CHECK(attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS) > unmaps0);

  step("trim_to(0) after completed frees releases everything");
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);

  step("trim_to keeps the memory of live allocations");
  void *live = NULL, *gone = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&live, 8 * MiB, pool, s));
  CHECK_OK(tp_memset_async(live, 0x5C, 8 * MiB, s));
  CHECK_OK(tp_malloc_from_pool_async(&gone, 32 * MiB, pool, s));
  CHECK_OK(tp_free_async(gone, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  uint64_t used = used_of(pool);
  r = reserved_of(pool);
  CHECK_EQ_U64(used, 8 * MiB);
  CHECK(r >= used);
  /* The 32 MiB freed block went; at most the live block's partial chunks
   * at either end may stay beyond its own bytes. */
  CHECK(r <= used + 2 * chunk);
  unsigned char *host = malloc(8 * MiB);
  REQUIRE(host != NULL);
  read_back(host, live, 8 * MiB, s);
  CHECK(all_bytes(host, 8 * MiB, 0x5C));
  free(host);

  step("trim_to keeps the memory of a free that is still pending");
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_free_async(live, s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK(reserved_of(pool) >= 8 * MiB);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

/* ========================================================================
 * Statistics
 * ======================================================================== */

static void test_statistics(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(64 * MiB);
  REQUIRE(s && pool);
  uint64_t chunk = chunk_of(pool);
  REQUIRE(chunk > 0);

  step("a fresh pool holds nothing");
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 0);

  step("used counts the bytes asked for; reserved whole chunks");
  void *a = NULL, *b = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&a, 1000, pool, s));
  CHECK_EQ_U64(used_of(pool), 1000);
  uint64_t r = reserved_of(pool);
  CHECK(r >= 1000);
  CHECK_EQ_U64(r % chunk, 0);

  step("high watermarks track the peak");
  CHECK_OK(tp_malloc_from_pool_async(&b, 3 * MiB, pool, s));
  uint64_t peak_used = 1000 + 3 * MiB;
  CHECK_EQ_U64(used_of(pool), peak_used);
  uint64_t peak_reserved = reserved_of(pool);
  CHECK(peak_reserved >= peak_used);
  CHECK_EQ_U64(peak_reserved % chunk, 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(used_of(pool), 1000);
  r = reserved_of(pool);
  CHECK(r >= 1000 && r < peak_reserved);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);

  step("a nonzero write to a watermark is refused and changes nothing");
  uint64_t v = 5;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);
  v = peak_used;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), peak_used);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), peak_reserved);

  step("resetting a watermark to 0 sets it to the current value");
  set_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH, 0);
  set_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 1000);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH), r);

  step("CHUNK_MAPS counts the chunks mapped as the pool grows");
  uint64_t maps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  uint64_t unmaps0 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  uint64_t r0 = reserved_of(pool);
  CHECK_OK(tp_malloc_from_pool_async(&b, 6 * MiB, pool, s));
  uint64_t maps1 = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  uint64_t r1 = reserved_of(pool);
  CHECK(maps1 > maps0);
  CHECK(r1 > r0);
  CHECK((maps1 - maps0) * chunk >= r1 - r0);
  step("CHUNK_UNMAPS counts the chunks released");
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(reserved_of(pool), 0);
  CHECK_EQ_U64(used_of(pool), 0);
  uint64_t unmaps1 = attr_u64(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  CHECK(unmaps1 > unmaps0);
  CHECK((unmaps1 - unmaps0) * chunk >= r1);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_HIGH), 6 * MiB + 1000);

  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_release_threshold),
      CONFORMANCE_TEST(test_sync_after_stream_destroyed),
      CONFORMANCE_TEST(test_sync_releases_others_frees),
      CONFORMANCE_TEST(test_trim_to),
      CONFORMANCE_TEST(test_statistics),
  };
  return conformance_main(argc, argv, "stats", tests, CONFORMANCE_COUNT(tests));
}
