/* Live memory: chunks whose free is still pending move in stream order.
 * With a stream held by a gate, a free on it stays pending; an allocation
 * on the same stream that needs new room takes those chunks at once, mapped
 * at the new place, while the old mapping stays valid for the work still
 * queued before the free. Checked by data (the queued work writes through
 * the old range after the move) and by the pool's figures. Every platform;
 * figures that depend on the chunk size are checked for 2 MiB chunks. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pool/pool_verify.h"

#define MiB (1u << 20)

static uint64_t attr(tp_pool_t pool, tp_pool_attr_t a) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, a, &v));
  return v;
}

/* Copies `size` bytes of device memory to the host and checks each is `v`. */
static int all_bytes(const void *dev, size_t size, unsigned char v,
                     tp_stream_t s) {
  unsigned char *host = malloc(size);
  if (!host)
    return 0;
  int ok = CHECK_OK(tp_memcpy_async(host, dev, size, s)) &&
           CHECK_OK(tp_stream_synchronize(s));
  for (size_t i = 0; ok && i < size; i++)
    if (host[i] != v) {
      CHECK_FAIL("byte %zu of %p is %#x, expected %#x", i, dev, host[i], v);
      ok = 0;
    }
  free(host);
  return ok;
}

static void fill(void *dev, size_t size, unsigned char v, tp_stream_t s) {
  CHECK_OK(tp_memset_async(dev, v, size, s));
}

static void walk_ok(tp_pool_t pool) {
  char why[256] = "";
  if (tp__pool_verify(pool, why, sizeof why) != 0)
    CHECK_FAIL("pool walk: %s", why);
}

static tp_pool_t pool_2mib(void) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return NULL;
  if (attr(pool, TP_POOL_ATTR_CHUNK_SIZE) != 2 * MiB) {
    printf("   (checked for 2 MiB chunks only)\n");
    CHECK_OK(tp_pool_destroy(pool));
    return NULL;
  }
  return pool;
}

static void test_pending_chunks_move_in_stream_order(void) {
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  tp_stream_t s, t;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&t, TP_STREAM_NON_BLOCKING));

  /* X fills chunks 0-3 and K chunk 4, so that X's range cannot grow in
   * place: a larger request must take a fresh range. */
  void *x, *k, *y, *z;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 8 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&k, 2 * MiB, pool, s));
  CHECK_OK(tp_memset_async(x, 0x11, 8 * MiB, s));
  CHECK_OK(tp_memset_async(k, 0x55, 2 * MiB, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 10 * MiB);

  /* The work queued before X's free writes through X's range after the
   * gate opens, long after X's chunks have moved. */
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_memset_async(x, 0x22, 8 * MiB, s));
  CHECK_OK(tp_free_async(x, s));
  uint64_t maps = attr(pool, TP_POOL_ATTR_CHUNK_MAPS);
  uint64_t unmaps = attr(pool, TP_POOL_ATTR_CHUNK_UNMAPS);

  /* Y on the same stream: the four pending chunks move under it and one is
   * made (the growth budget allows 1/64 above the 12 MiB peak). */
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 10 * MiB, pool, s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 12 * MiB);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_CHUNK_MAPS), maps + 5);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_CHUNK_UNMAPS), unmaps);
  CHECK((uintptr_t)y >= (uintptr_t)k + 2 * MiB ||
        (uintptr_t)y + 10 * MiB <= (uintptr_t)x);
  CHECK_OK(tp_memset_async(y, 0x33, 10 * MiB, s));

  /* Z on another stream, not ordered after X's free: X's chunks are not
   * its to take, held as they are. */
  REQUIRE_OK(tp_malloc_from_pool_async(&z, 10 * MiB, pool, t));
  CHECK_OK(tp_memset_async(z, 0x44, 10 * MiB, t));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 22 * MiB);

  release(&g);
  CHECK_OK(tp_stream_synchronize(s)); /* no ILLEGAL_ADDRESS: X's range held */
  CHECK_OK(tp_stream_synchronize(t));
  all_bytes(y, 10 * MiB, 0x33, s);
  all_bytes(z, 10 * MiB, 0x44, t);
  all_bytes(k, 2 * MiB, 0x55, s);
  /* The old mappings went at the synchronize, the chunks were never
   * counted twice. */
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_CHUNK_UNMAPS), unmaps + 4);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 22 * MiB);
  walk_ok(pool);

  CHECK_OK(tp_free_async(y, s));
  CHECK_OK(tp_free_async(k, s));
  CHECK_OK(tp_free_async(z, t));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_stream_destroy(t));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A pending chunk released while its old mapping still stands (the new
 * allocation freed and trimmed before the old free completed) stays
 * counted until the old mapping goes. */
static void test_release_waits_for_the_old_mapping(void) {
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  tp_stream_t s, u;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  REQUIRE_OK(tp_stream_create(&u, TP_STREAM_NON_BLOCKING));
  void *x, *k, *y;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 8 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&k, 2 * MiB, pool, s));
  CHECK_OK(tp_stream_synchronize(s));
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_memset_async(x, 0x66, 8 * MiB, s));
  CHECK_OK(tp_free_async(x, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 10 * MiB, pool, s));
  /* Y is freed on another stream that waits for nothing: its free
   * completes at once in tidepool's eyes, though X's has not. */
  tp_event_t ev;
  REQUIRE_OK(tp_event_create(&ev));
  CHECK_OK(tp_free_async(y, u));
  CHECK_OK(tp_stream_synchronize(u));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  uint64_t held = attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  /* K's chunk and the four under X's old mapping stay. */
  CHECK(held >= 10 * MiB);
  release(&g);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_free_async(k, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  walk_ok(pool);
  CHECK_OK(tp_event_destroy(ev));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_stream_destroy(u));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A segment whose first block is free lends that chunk's physical memory
 * to a new block's last, partial chunk (HEAD): one chunk is mapped twice,
 * each side using bytes the other leaves free. Checked by data, by
 * reserved bytes, and by the sharing's end once the lender's side holds
 * only free bytes. A free still pending is never lent. */
static void edge_start(bool peer) {
  int devices = 0;
  if (peer && (tp_get_device_count(&devices) != TP_SUCCESS || devices < 2)) {
    printf("   (access from a second device needs two devices)\n");
    return;
  }
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  tp_stream_t s, s1 = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  if (peer) {
    /* Every mapping, the second one of a shared chunk too, gets the
     * pool's access: device 1 writes through it. */
    tp_access_desc_t d1 = {{TP_LOCATION_DEVICE, 1, 0}, TP_ACCESS_READ_WRITE};
    REQUIRE_OK(tp_pool_set_access(pool, &d1, 1));
    REQUIRE_OK(tp_set_device(1));
    REQUIRE_OK(tp_stream_create(&s1, TP_STREAM_NON_BLOCKING));
    REQUIRE_OK(tp_set_device(0));
  }
  /* A in chunk 0 and B after it: chunks 0-1 hold [A 0.5][B 3.5] MiB. */
  void *a, *b, *c, *d;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, MiB / 2, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 7 * MiB / 2, pool, s));
  CHECK_EQ_U64((uintptr_t)b, (uintptr_t)a + MiB / 2);
  fill(b, 7 * MiB / 2, 0x55, s);

  /* While A's free is pending, its bytes are not lent: C (2.25 MiB) makes
   * two chunks of its own. */
  gate_t g;
  REQUIRE_OK(hold_stream(s, &g));
  CHECK_OK(tp_free_async(a, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&c, 9 * MiB / 4, pool, s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  release(&g);
  CHECK_OK(tp_free_async(c, s));
  CHECK_OK(tp_stream_synchronize(s));
  /* The synchronize gave C's two chunks back (threshold 0); A's free
   * start stays, completed, beside B. */
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);

  /* Now C's last quarter-MiB chunk shares chunk 0: 6 MiB, not 8. */
  uint64_t maps = attr(pool, TP_POOL_ATTR_CHUNK_MAPS);
  REQUIRE_OK(tp_malloc_from_pool_async(&c, 9 * MiB / 4, pool, s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 6 * MiB);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_CHUNK_MAPS), maps + 2);
  fill(c, 9 * MiB / 4, 0xaa, s);
  if (s1) {
    CHECK_OK(tp_stream_synchronize(s));
    fill(c, 9 * MiB / 4, 0xab, s1);
    CHECK_OK(tp_stream_synchronize(s1));
    all_bytes(c, 9 * MiB / 4, 0xab, s);
    all_bytes(b, 7 * MiB / 2, 0x55, s);
    fill(c, 9 * MiB / 4, 0xaa, s);
  }
  /* D takes the free bytes left in C's last chunk: those of chunk 0 that
   * neither A's old place nor B use. */
  REQUIRE_OK(tp_malloc_from_pool_async(&d, MiB / 4, pool, s));
  CHECK_EQ_U64((uintptr_t)d, (uintptr_t)c + 9 * MiB / 4);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 6 * MiB);
  fill(d, MiB / 4, 0x77, s);
  all_bytes(b, 7 * MiB / 2, 0x55, s);
  all_bytes(c, 9 * MiB / 4, 0xaa, s);
  all_bytes(d, MiB / 4, 0x77, s);
  walk_ok(pool);

  /* B's free leaves chunk 0's mapping with nothing in use: it goes, C and
   * D keep the memory through theirs, and chunk 1 goes back. */
  uint64_t unmaps = attr(pool, TP_POOL_ATTR_CHUNK_UNMAPS);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_CHUNK_UNMAPS), unmaps + 2);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  all_bytes(c, 9 * MiB / 4, 0xaa, s);
  all_bytes(d, MiB / 4, 0x77, s);
  walk_ok(pool);

  CHECK_OK(tp_free_async(c, s));
  CHECK_OK(tp_free_async(d, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  walk_ok(pool);
  CHECK_OK(tp_stream_destroy(s));
  if (s1)
    CHECK_OK(tp_stream_destroy(s1));
  CHECK_OK(tp_pool_destroy(pool));
}

static void test_edge_chunk_lends_its_free_start(void) {
  edge_start(false);
}

/* The same with the pool's memory open to a second device. */
static void test_edge_chunk_shared_with_peer_access(void) {
  edge_start(true);
}

/* The mirror case (TAIL): a segment whose last block is free lends its
 * chunk to the first chunk of a new block placed flush with the end of a
 * fresh range; the lender's side goes once its block is freed, and the
 * bytes it held come back as free memory on the other side. */
static void test_edge_chunk_lends_its_free_end(void) {
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  /* P in chunks 0-2, X in chunk 3 ([X 1.5][free 0.5]), V from X's end to
   * the end of chunk 4, W in chunk 5. P and V go, leaving X's chunk a
   * segment of its own, which W keeps from being extended far enough. */
  void *p, *x, *v, *w, *y, *x2;
  REQUIRE_OK(tp_malloc_from_pool_async(&p, 6 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 3 * MiB / 2, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&v, 5 * MiB / 2, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&w, 2 * MiB, pool, s));
  CHECK_EQ_U64((uintptr_t)x, (uintptr_t)p + 6 * MiB);
  CHECK_EQ_U64((uintptr_t)v, (uintptr_t)x + 3 * MiB / 2);
  CHECK_EQ_U64((uintptr_t)w, (uintptr_t)p + 10 * MiB);
  fill(x, 3 * MiB / 2, 0x11, s);
  CHECK_OK(tp_free_async(v, s));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);

  /* Y (4.25 MiB) goes to chunks 0-2, ending where X begins; its first
   * chunk shares X's: 8 MiB reserved, not 10. */
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 17 * MiB / 4, pool, s));
  CHECK_EQ_U64((uintptr_t)y + 17 * MiB / 4, (uintptr_t)x);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  fill(y, 17 * MiB / 4, 0x22, s);
  all_bytes(x, 3 * MiB / 2, 0x11, s);
  all_bytes(y, 17 * MiB / 4, 0x22, s);
  walk_ok(pool);

  /* X's free ends the sharing from its side; Y's first chunk then holds
   * 1.75 MiB of free memory, enough for X2 without growing. */
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  REQUIRE_OK(tp_malloc_from_pool_async(&x2, 3 * MiB / 2, pool, s));
  CHECK((uintptr_t)x2 + 3 * MiB / 2 <= (uintptr_t)y);
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  fill(x2, 3 * MiB / 2, 0x33, s);
  all_bytes(y, 17 * MiB / 4, 0x22, s);
  all_bytes(x2, 3 * MiB / 2, 0x33, s);
  walk_ok(pool);

  CHECK_OK(tp_free_async(y, s));
  CHECK_OK(tp_free_async(x2, s));
  CHECK_OK(tp_free_async(w, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  walk_ok(pool);
  CHECK_OK(tp_stream_destroy(s));
  CHECK_OK(tp_pool_destroy(pool));
}

/* A pool destroyed with a block live goes once the block's free completes;
 * here the free is issued on another device's legacy stream, which nothing
 * synchronizes. An allocation that then finds the device full must not
 * fail for that pool's memory: it asks the free's stream and finishes the
 * pool (the fuzzer's destroyed-pool-holds-device). On cuda the legacy
 * stream's own answer cannot show the free complete, and a marker recorded
 * only by that allocation was not done yet: it failed though the free had
 * completed long before; the marker now goes with the free. Checked with
 * 64 MiB devices, on the host platform and over the fake driver
 * (test_live_two_devices). */
static void test_full_device_finishes_destroyed_pool(void) {
  const char *platform = tp_platform_name();
  bool host = platform && strcmp(platform, "host") == 0;
  const char *mem =
      getenv(host ? "TIDEPOOL_HOST_DEVICE_MEMORY" : "FAKE_CUDA_DEVICE_MEMORY");
  int devices = 0;
  if (!mem || strcmp(mem, "64M") != 0 || !platform ||
      tp_get_device_count(&devices) != TP_SUCCESS || devices < 2) {
    printf("   (needs two emulated devices of 64 MiB)\n");
    return;
  }
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 32 * MiB, pool, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  REQUIRE_OK(tp_set_device(1));
  CHECK_OK(tp_free_async(x, NULL)); /* device 1's legacy stream */
  REQUIRE_OK(tp_set_device(0));
  check_sleep_ms(200); /* the free completes meanwhile */
  /* 48 MiB fit only once the destroyed pool's 32 MiB are back. */
  CHECK_OK(tp_malloc_async(&y, 48 * MiB, s));
  if (y)
    CHECK_OK(tp_free_async(y, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_destroy(s));
}

/* A pool destroyed with a block live and more memory freed, its release
 * threshold at the top, gives back that free memory at once: nothing can
 * allocate from it again, and nothing could trim it (its handle is dead).
 * The free memory stayed until the last block's free, and a device of
 * 64 MiB had no room for another pool's 30 MiB. With two emulated devices
 * of 64 MiB, as test_full_device_finishes_destroyed_pool. */
static void test_destroyed_pool_gives_back_free_memory(void) {
  const char *platform = tp_platform_name();
  bool host = platform && strcmp(platform, "host") == 0;
  const char *mem =
      getenv(host ? "TIDEPOOL_HOST_DEVICE_MEMORY" : "FAKE_CUDA_DEVICE_MEMORY");
  if (!mem || strcmp(mem, "64M") != 0) {
    printf("   (needs emulated devices of 64 MiB)\n");
    return;
  }
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  uint64_t keep = UINT64_MAX;
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &keep));
  tp_stream_t s;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  void *x = NULL, *y = NULL, *z = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 30 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 20 * MiB, pool, s));
  CHECK_OK(tp_free_async(y, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_malloc_async(&z, 30 * MiB, s));
  if (z)
    CHECK_OK(tp_free_async(z, s));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_device_synchronize());
  CHECK_OK(tp_stream_destroy(s));
}

/* A legacy-stream operation the platform refuses queues nothing, and so
 * orders no blocking stream after another. X's free on blocking stream A
 * stays pending behind a gate; the refused operation goes to the legacy
 * stream; blocking stream B, which follows A in no way, must not get X's
 * memory (with the reuse that would make B wait turned off). Counting the
 * refused operation as a legacy one handed X to B (the fuzzer's
 * legacy-op-refused, found as a data corruption). */
static void refused_legacy_op(tp_error_t (*refused)(void *), void *arg) {
  tp_pool_t pool = pool_2mib();
  if (!pool)
    return;
  int off = 0;
  CHECK_OK(tp_pool_set_attribute(
      pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                 &off));
  uint64_t keep = UINT64_MAX;
  CHECK_OK(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &keep));
  tp_stream_t a, b;
  REQUIRE_OK(tp_stream_create(&a, TP_STREAM_DEFAULT));
  REQUIRE_OK(tp_stream_create(&b, TP_STREAM_DEFAULT));

  void *x, *y;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 2 * MiB, pool, a));
  gate_t g;
  REQUIRE_OK(hold_stream(a, &g));
  fill(x, 2 * MiB, 0x11, a);
  CHECK_OK(tp_free_async(x, a));
  CHECK(refused(arg) != TP_SUCCESS);
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 2 * MiB, pool, b));
  CHECK((uintptr_t)y + 2 * MiB <= (uintptr_t)x ||
        (uintptr_t)x + 2 * MiB <= (uintptr_t)y);
  fill(y, 2 * MiB, 0x22, b);
  release(&g);
  CHECK_OK(tp_stream_synchronize(a));
  all_bytes(y, 2 * MiB, 0x22, b);
  CHECK_OK(tp_free_async(y, b));
  CHECK_OK(tp_stream_synchronize(b));
  walk_ok(pool);
  CHECK_OK(tp_stream_destroy(a));
  CHECK_OK(tp_stream_destroy(b));
  CHECK_OK(tp_pool_destroy(pool));
}

/* An event of device 1 recorded on device 0's legacy stream. */
static tp_error_t record_other_device(void *event) {
  return tp_event_record(event, NULL);
}

/* A memset whose range runs past the end of the address space. */
static tp_error_t memset_past_the_end(void *unused) {
  (void)unused;
  return tp_memset_async((void *)(uintptr_t)4096, 0, SIZE_MAX - 1024, NULL);
}

static void test_refused_legacy_op_orders_nothing(void) {
  refused_legacy_op(memset_past_the_end, NULL);
  int devices = 0;
  if (tp_get_device_count(&devices) != TP_SUCCESS || devices < 2) {
    printf("   (an event of another device needs two devices)\n");
    return;
  }
  tp_event_t other;
  REQUIRE_OK(tp_set_device(1));
  REQUIRE_OK(tp_event_create(&other));
  REQUIRE_OK(tp_set_device(0));
  refused_legacy_op(record_other_device, other);
  CHECK_OK(tp_event_destroy(other));
}

int main(void) {
  RUN_TEST(test_pending_chunks_move_in_stream_order);
  RUN_TEST(test_release_waits_for_the_old_mapping);
  RUN_TEST(test_edge_chunk_lends_its_free_start);
  RUN_TEST(test_edge_chunk_shared_with_peer_access);
  RUN_TEST(test_edge_chunk_lends_its_free_end);
  RUN_TEST(test_full_device_finishes_destroyed_pool);
  RUN_TEST(test_destroyed_pool_gives_back_free_memory);
  RUN_TEST(test_refused_legacy_op_orders_nothing);
  return check_done();
}
