/* test_ipc: sharing pools between processes. This process exports; the
 * importers are this same program started again (ipc_child.h). Imports in
 * the same process and in others, contents, holds, chunks mapped after the
 * export, remapped chunks, killed importers, another user, and importers
 * on another device or one that cannot see the pool's device. */
#include "ipc_child.h"

/* ========================================================================
 * Tests
 * ======================================================================== */

/* A process may import its own pool: the pointer is another mapping of the
 * same bytes, and the holds work as across processes. */
static void test_same_process(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), imported = NULL;
  REQUIRE(pool);
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd); /* the caller's descriptor: the import needs it no more */
  void *a = NULL, *b = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 3 * MiB, pool, s));
  fill(a, 3 * MiB, 7, s);
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  CHECK(b != a);
  CHECK(holds(b, 3 * MiB, 7, s));
  fill(b, 1 * MiB, 8, s);
  CHECK(holds(a, 1 * MiB, 8, s));
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  /* The importer's mappings count as its chunk maps, as a pool's own do. */
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_CHUNK_MAPS), 2);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_CHUNK_UNMAPS), 0);
  CHECK_ERR(tp_pool_export_pointer(&rec, b), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((char *)b + 512, s), TP_ERROR_INVALID_VALUE);
  /* Imported twice: the same pointer, freed twice, and its bytes counted
   * once (used never above reserved). */
  void *b2 = NULL;
  CHECK_OK(tp_pool_import_pointer(&b2, imported, &rec));
  CHECK(b2 == b);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  CHECK_OK(tp_free_async(b2, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  CHECK(holds(b, 1 * MiB, 8, s));

  /* The exporter frees first: the block stays out of reuse (and counted as
   * used) until the importer's free has completed. */
  void *start = NULL;
  CHECK_OK(tp_pointer_get_attribute(&start, TP_POINTER_ATTR_RANGE_START_ADDR,
                                    (char *)a + 5));
  CHECK(start == a);
  CHECK_OK(tp_free_async(a, s));
  CHECK_ERR(tp_free_async(a, s), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  /* Freed here: no live allocation of this process's, though the importer
   * still holds it (tp_pointer_get_attribute). */
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_ERR(
      tp_pointer_get_attribute(&start, TP_POINTER_ATTR_RANGE_START_ADDR, a),
      TP_ERROR_INVALID_VALUE);
  void *c = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&c, 3 * MiB, pool, s));
  CHECK(c != a);
  CHECK_OK(tp_free_async(c, s));
  CHECK_OK(tp_free_async(b, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  /* A record of a freed allocation names nothing any more. */
  CHECK_ERR(tp_pool_import_pointer(&b, imported, &rec), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(imported, 0));
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_CHUNK_MAPS), 2);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_CHUNK_UNMAPS), 2);
  CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* A pool of host memory (a NUMA node) is shared the same way; its bytes
 * are the host's in both processes, so the CPU reads them directly. */
static void test_host_numa_pool(void) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_HOST_NUMA, 0, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  tp_pool_t pool = NULL, imported = NULL;
  tp_error_t err = tp_pool_create(&pool, &props);
  if (err == TP_ERROR_NOT_SUPPORTED) {
    printf("   skipped: this platform cannot export host memory\n");
    return;
  }
  REQUIRE_OK(err);
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  CHECK_EQ_INT(attr_int(imported, TP_POOL_ATTR_LOCATION_TYPE),
               TP_LOCATION_HOST_NUMA);
  CHECK_EQ_INT(attr_int(imported, TP_POOL_ATTR_LOCATION_ID), 0);
  void *a = NULL, *b = NULL;
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 100 * KiB, pool, s));
  REQUIRE_OK(tp_stream_synchronize(s));
  memset(a, 0x5A, 100 * KiB);
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  const unsigned char *q = b;
  CHECK(q[0] == 0x5A && q[100 * KiB - 1] == 0x5A);
  ((unsigned char *)b)[7] = 0xA5;
  CHECK(((unsigned char *)a)[7] == 0xA5);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Threads of one importer import and free at once, on streams of their
 * own, while the exporter frees the blocks and allocates and overwrites
 * new ones: a block a thread holds keeps its bytes, a block freed and not
 * held can no longer be imported, and every block comes back. */
#define RACE_BLOCKS 32
#define RACE_THREADS 4

typedef struct race {
  tp_pool_t imported;
  tp_pool_ptr_export_data_t rec[RACE_BLOCKS];
  uint64_t seed;
  atomic_int *freeing; /* the exporter has begun to free */
} race;

/* Copies bytes [from, to) were read into; they are checked once the
 * stream has run. */
static void race_check(const unsigned char *got, const int *want, int from,
                       int to) {
  for (int i = from; i < to; i++)
    if (want[i] >= 0)
      CHECK_EQ_INT(got[i], want[i]);
}

#define RACE_ROUNDS 200

static void *race_thread(void *arg) {
  race *r = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  check_rng rng = {r->seed};
  unsigned char got[RACE_ROUNDS];
  int want[RACE_ROUNDS], checked = 0;
  for (int i = 0; i < RACE_ROUNDS; i++) {
    int k = (int)rng_below(&rng, RACE_BLOCKS);
    void *q = NULL;
    want[i] = -1;
    tp_error_t err = tp_pool_import_pointer(&q, r->imported, &r->rec[k]);
    if (err == TP_ERROR_INVALID_VALUE && atomic_load(r->freeing))
      continue; /* freed by the exporter, and held by nobody */
    if (!CHECK_OK(err))
      break;
    want[i] = pattern((uint64_t)k + 1, 0);
    CHECK_OK(tp_memcpy_async(&got[i], q, 1, s));
    CHECK_OK(tp_free_async(q, s));
    if (atomic_load(r->freeing) || rng_chance(&rng, 20)) {
      CHECK_OK(tp_stream_synchronize(s));
      race_check(got, want, checked, i + 1);
      checked = i + 1;
    }
  }
  CHECK_OK(tp_stream_synchronize(s));
  race_check(got, want, checked, RACE_ROUNDS);
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_concurrent_imports(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  race r[RACE_THREADS];
  void *blocks[RACE_BLOCKS], *fresh[RACE_BLOCKS];
  size_t sizes[RACE_BLOCKS];
  atomic_int freeing = 0;
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &r[0].imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  uint64_t total = 0;
  for (int k = 0; k < RACE_BLOCKS; k++) {
    size_t size = (k % 4 == 0 ? 3 * MiB : 8 * KiB) + (size_t)k * 512;
    REQUIRE_OK(tp_malloc_from_pool_async(&blocks[k], size, pool, s));
    fill(blocks[k], 512, (uint64_t)k + 1, s);
    REQUIRE_OK(tp_pool_export_pointer(&r[0].rec[k], blocks[k]));
    sizes[k] = size;
    total += size;
  }
  r[0].freeing = &freeing;
  pthread_t t[RACE_THREADS];
  for (int i = 0; i < RACE_THREADS; i++) {
    r[i] = r[0];
    r[i].seed = (uint64_t)i + 1;
    REQUIRE(pthread_create(&t[i], NULL, race_thread, &r[i]) == 0);
  }
  check_sleep_ms(2);
  atomic_store(&freeing, 1);
  for (int k = 0; k < RACE_BLOCKS; k++)
    CHECK_OK(tp_free_async(blocks[k], s));
  for (int k = 0; k < RACE_BLOCKS; k++) {
    CHECK_OK(tp_malloc_from_pool_async(&fresh[k], sizes[k], pool, s));
    CHECK_OK(tp_memset_async(fresh[k], 0xEE, sizes[k], s));
  }
  for (int i = 0; i < RACE_THREADS; i++)
    pthread_join(t[i], NULL);
  CHECK_EQ_U64(attr_u64(r[0].imported, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_EQ_U64(wait_used(pool, total), total);
  for (int k = 0; k < RACE_BLOCKS; k++)
    CHECK_OK(tp_free_async(fresh[k], s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(r[0].imported));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Threads of one process that each import the pool, import a pointer,
 * free it and destroy their import, over and over: an import may be given
 * the range another thread's import has just let go of, and each pointer's
 * free must still find its own pool (a destroy once took a newer import's
 * entry out of the address table, and its frees then failed). */
#define CHURN_THREADS 4
#define CHURN_ROUNDS 150
typedef struct churn {
  int fd;
  tp_pool_ptr_export_data_t rec;
  atomic_int failures;
} churn;

static void *churn_thread(void *arg) {
  churn *c = arg;
  tp_stream_t s = NULL;
  if (tp_stream_create(&s, TP_STREAM_NON_BLOCKING) != TP_SUCCESS) {
    atomic_fetch_add(&c->failures, 1);
    return NULL;
  }
  for (int i = 0; i < CHURN_ROUNDS; i++) {
    tp_pool_t imported = NULL;
    void *q = NULL;
    tp_error_t err = tp_pool_import_from_shareable_handle(
        &imported, (void *)(uintptr_t)c->fd, TP_HANDLE_POSIX_FD, 0);
    if (err == TP_SUCCESS)
      err = tp_pool_import_pointer(&q, imported, &c->rec);
    if (err == TP_SUCCESS)
      err = tp_free_async(q, s);
    if (err == TP_SUCCESS)
      err = tp_stream_synchronize(s);
    if (err != TP_SUCCESS)
      fprintf(stderr, "churn round %d: %s\n", i, tp_error_name(err));
    if (imported && tp_pool_destroy(imported) != TP_SUCCESS)
      err = TP_ERROR_INVALID_VALUE;
    if (err != TP_SUCCESS)
      atomic_fetch_add(&c->failures, 1);
  }
  (void)tp_stream_destroy(s);
  return NULL;
}

static void test_import_churn(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  churn c = {.fd = -1};
  void *a = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 64 * KiB, pool, s));
  REQUIRE_OK(tp_stream_synchronize(s));
  REQUIRE_OK(tp_pool_export_pointer(&c.rec, a));
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&c.fd, pool, TP_HANDLE_POSIX_FD, 0));
  pthread_t t[CHURN_THREADS];
  for (int i = 0; i < CHURN_THREADS; i++)
    REQUIRE(pthread_create(&t[i], NULL, churn_thread, &c) == 0);
  for (int i = 0; i < CHURN_THREADS; i++)
    pthread_join(t[i], NULL);
  close(c.fd);
  CHECK_EQ_INT(atomic_load(&c.failures), 0);
  /* Every import's hold has gone: the exporter's own allocation is all
   * that is used. */
  CHECK_EQ_U64(wait_used(pool, 64 * KiB), 64 * KiB);
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An exporter that destroys its pool while an importer holds a block keeps
 * the pool until the importer lets go. */
static void test_destroy_while_held(void) {
  tp__host_live before, after;
  tp__host_live_get(&before);
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), imported = NULL;
  REQUIRE(pool);
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  void *a = NULL, *b = NULL;
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 64 * KiB, pool, s));
  fill(a, 64 * KiB, 3, s);
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(holds(b, 64 * KiB, 3, s)); /* still the importer's */
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_pool_destroy(imported));
  /* The pool goes at a synchronize after the release reached it. */
  double deadline = check_now_s() + 10.0;
  do {
    CHECK_OK(tp_device_synchronize());
    tp__host_live_get(&after);
  } while (check_on_host() && after.reservations != before.reservations &&
           check_now_s() < deadline && (check_sleep_ms(1), 1));
  if (check_on_host()) {
    CHECK_EQ_U64(after.reservations, before.reservations);
    CHECK_EQ_U64(after.chunks, before.chunks);
    CHECK_EQ_U64(after.mapped_chunks, before.mapped_chunks);
  }
  CHECK_OK(tp_stream_destroy(s));
}

/* Another process imports pointers with their contents, writes through
 * them, imports blocks carved from chunks mapped after the export, is
 * refused every corrupted, stale or foreign record, and frees in stream
 * order: a block it holds stays out of the exporter's reuse. */
static void test_across_processes(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), other = ipc_pool(0);
  REQUIRE(pool && other);
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 4 * KiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 3 * MiB, pool, s));
  fill(a, 4 * KiB, 11, s);
  fill(b, 3 * MiB, 12, s);
  child ch;
  start_importer(&ch, "importer", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, 4 * KiB, 11));
  CHECK_OK(ask_import(&ch, 1, b, 3 * MiB, 12));
  /* Writes of the importer are the exporter's bytes. */
  ctl w = {
      .op = CMD_WRITE, .slot = 1, .seed = 13, .offset = MiB, .size = 2 * MiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds((char *)b + MiB, 2 * MiB, 13, s));

  /* Chunks mapped after the export are reachable. */
  uint64_t maps = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  REQUIRE_OK(tp_malloc_from_pool_async(&c, 8 * MiB, pool, s));
  fill(c, 8 * MiB, 14, s);
  CHECK(attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS) > maps);
  CHECK_OK(ask_import(&ch, 2, c, 8 * MiB, 14));

  /* Corrupted, stale and foreign records are refused. */
  ctl q = {.op = CMD_CORRUPT};
  CHECK_OK(tp_pool_export_pointer(&q.rec, a));
  uint64_t used = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  CHECK_OK(ask(&ch, &q, -1));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  REQUIRE_OK(tp_malloc_from_pool_async(&d, 64 * KiB, pool, s));
  q = (ctl){.op = CMD_EXPECT, .expect = TP_ERROR_INVALID_VALUE};
  CHECK_OK(tp_pool_export_pointer(&q.rec, d));
  CHECK_OK(tp_free_async(d, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(ask(&ch, &q, -1));
  REQUIRE_OK(tp_malloc_from_pool_async(&e, 64 * KiB, other, s));
  CHECK_OK(tp_pool_export_pointer(&q.rec, e));
  CHECK_OK(ask(&ch, &q, -1));
  CHECK_OK(tp_free_async(e, s));

  /* The importer frees b behind a held stream; the exporter frees it too,
   * and must not hand its bytes out while the importer's free is pending. */
  used = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  CHECK_OK(ask_slot(&ch, CMD_FREE_HELD, 1));
  CHECK_OK(tp_free_async(b, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  void *b2 = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&b2, 3 * MiB, pool, s));
  CHECK(b2 != b);
  CHECK_OK(tp_free_async(b2, s));
  CHECK_OK(tp_stream_synchronize(s));
  check_sleep_ms(20);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  CHECK_OK(ask_slot(&ch, CMD_OPEN, 0));
  CHECK_EQ_U64(wait_used(pool, used - 3 * MiB), used - 3 * MiB);

  /* Importer frees, then the exporter. The importer's release reaches the
   * exporter's service thread a moment after its free completed; a free
   * of the exporter's before that waits for it. */
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 2));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_free_async(c, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_pool_destroy(other));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer releases a block but keeps its mapping (it has not
 * synchronised since); the exporter trims the chunk and makes it again over
 * other memory. A new import there maps it afresh: the old mapping would
 * show the old bytes. */
static void test_remapped_chunk(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *p0 = NULL, *x = NULL, *p2 = NULL, *g = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p0, 2 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 2 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&p2, 2 * MiB, pool, s));
  fill(x, 2 * MiB, 41, s);
  child ch;
  start_importer(&ch, "importer", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, x, 2 * MiB, 41));
  CHECK_OK(ask_slot(&ch, CMD_FREE_QUIET, 0));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_free_async(p2, s));
  CHECK_EQ_U64(wait_used(pool, 2 * MiB), 2 * MiB);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 2 * MiB);
  REQUIRE_OK(tp_malloc_from_pool_async(&g, 2 * MiB, pool, s));
  fill(g, 2 * MiB, 44, s);
  CHECK_OK(ask_import(&ch, 1, g, 2 * MiB, 44));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 1));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(g, s));
  CHECK_OK(tp_free_async(p0, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer whose descriptor table is full when a chunk's descriptor
 * comes: the import fails (on cuda over the fake driver, where chunks
 * travel as descriptors) and the next one, with room, succeeds with the
 * right contents; the exporter gets all its memory back. */
static void test_import_with_descriptors_full(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *x = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4 * MiB, pool, s));
  fill(x, 4 * MiB, 53, s);
  child ch;
  start_importer(&ch, "importer", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  ctl q = {.op = CMD_IMPORT_FULL, .slot = 0, .seed = 53, .size = 4 * MiB};
  REQUIRE_OK(tp_pool_export_pointer(&q.rec, x));
  CHECK_OK(ask(&ch, &q, -1));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(x, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer killed while it holds blocks releases them when its channel
 * closes; the exporter keeps working and gets its memory back. */
static void test_importer_killed(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 1 * KiB, pool, s));
  fill(x, 4 * MiB, 21, s);
  fill(y, 1 * KiB, 22, s);
  child ch;
  start_importer(&ch, "holder", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, x, 4 * MiB, 21));
  CHECK_OK(ask_import(&ch, 1, y, 1 * KiB, 22));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_free_async(y, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 4 * MiB + KiB);
  void *x2 = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&x2, 4 * MiB, pool, s));
  CHECK(x2 != x);
  kill(ch.pid, SIGKILL);
  CHECK(child_wait(&ch) == -1);
  CHECK_EQ_U64(wait_used(pool, 4 * MiB), 4 * MiB);
  /* The pool goes on: x's bytes are reusable, and another import works. */
  CHECK_OK(tp_free_async(x2, s));
  CHECK_OK(tp_stream_synchronize(s));
  tp_pool_t self = NULL;
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  CHECK_OK(tp_pool_import_from_shareable_handle(&self, (void *)(uintptr_t)fd,
                                                TP_HANDLE_POSIX_FD, 0));
  close(fd);
  void *z = NULL, *zi = NULL;
  tp_pool_ptr_export_data_t rec;
  CHECK_OK(tp_malloc_from_pool_async(&z, 2 * MiB, pool, s));
  fill(z, 2 * MiB, 23, s);
  CHECK_OK(tp_pool_export_pointer(&rec, z));
  if (self && CHECK_OK(tp_pool_import_pointer(&zi, self, &rec))) {
    CHECK(holds(zi, 2 * MiB, 23, s));
    CHECK_OK(tp_free_async(zi, s));
  }
  CHECK_OK(tp_stream_synchronize(s));
  if (self)
    CHECK_OK(tp_pool_destroy(self));
  CHECK_OK(tp_free_async(z, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer that forked a child which makes no call of tidepool's (a
 * data loader's worker) releases its holds when it is killed, though the
 * child lives on with copies of its descriptors: the child's copy of the
 * channel once kept the exporter from seeing the importer go, and the
 * block stayed held until the child exited. */
static void test_importer_killed_with_forked_child(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *x = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4 * MiB, pool, s));
  fill(x, 4 * MiB, 24, s);
  child ch;
  start_importer(&ch, "holder", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, x, 4 * MiB, 24));
  ctl q = {.op = CMD_FORK}, r = {0};
  CHECK_OK(ask_reply(&ch, &q, -1, &r, NULL));
  pid_t sleeper = (pid_t)r.seed;
  CHECK(sleeper > 0);
  CHECK_OK(tp_free_async(x, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 4 * MiB);
  kill(ch.pid, SIGKILL);
  CHECK(child_wait(&ch) == -1);
  CHECK(sleeper > 0 && kill(sleeper, 0) == 0); /* the child still lives */
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  if (sleeper > 0)
    kill(sleeper, SIGKILL);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* A process of another user is refused, descriptor or not. */
static void test_other_user(void) {
  if (geteuid() != 0) {
    printf("   skipped: only root can start a process of another user\n");
    return;
  }
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  child ch;
  REQUIRE(spawn(&ch, "other-user", NULL) == 0);
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  ctl q = {.op = CMD_POOL};
  CHECK_ERR(ask(&ch, &q, fd), TP_ERROR_NOT_PERMITTED);
  close(fd);
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_pool_destroy(pool));
}

/* The environment that shows a child importer only the device this process
 * numbers 1: on cuda, CUDA_VISIBLE_DEVICES naming it. NULL where this
 * process's own list does not say which that is. */
static const char *only_device1(char *buf, size_t len) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !*v) {
    snprintf(buf, len, "CUDA_VISIBLE_DEVICES=1");
    return buf;
  }
  const char *comma = strchr(v, ',');
  if (!comma || !comma[1])
    return NULL;
  size_t n = strcspn(comma + 1, ",");
  snprintf(buf, len, "CUDA_VISIBLE_DEVICES=%.*s", (int)n, comma + 1);
  return buf;
}

/* An importer that cannot see the pool's device reports it invisible, and
 * still reads and writes the memory from its own device. On the host
 * platform: a pool of device 1, and an importer with one emulated device; on
 * cuda: a pool of device 0, and an importer that sees only the GPU this
 * process numbers 1. */
static void test_invisible_device(void) {
  int n = 0;
  CHECK_OK(tp_get_device_count(&n));
  char env[128];
  const char *only = check_on_host() ? "TIDEPOOL_HOST_DEVICES=1"
                                     : only_device1(env, sizeof env);
  if (n < 2 || !only) {
    printf("   skipped: needs 2 devices (TIDEPOOL_HOST_DEVICES=2 on the "
           "host platform)\n");
    return;
  }
  int dev = check_on_host() ? 1 : 0;
  tp_stream_t s = NULL;
  CHECK_OK(tp_set_device(dev));
  CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  CHECK_OK(tp_set_device(0));
  tp_pool_t pool = ipc_pool(dev);
  REQUIRE(pool && s);
  void *a = NULL;
  const size_t size = 2 * MiB + 256 * KiB; /* two chunks */
  REQUIRE_OK(tp_malloc_from_pool_async(&a, size, pool, s));
  fill(a, size, 31, s);
  child ch;
  printf("   importer with %s\n", only);
  start_importer(&ch, "importer", pool, TP_LOCATION_INVISIBLE, -2, only, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, size, 31));
  ctl w = {
      .op = CMD_WRITE, .slot = 0, .seed = 32, .offset = 0, .size = 64 * KiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds(a, 64 * KiB, 32, s));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Across devices: the exporter allocates on device 0; an importer whose
 * current device is 1 imports the pool (which it sees as device 0's),
 * grants its device access, reads the exporter's bytes through a stream of
 * device 1 and writes bytes the exporter then reads. */
static void test_importer_on_device1(void) {
  int n = 0;
  CHECK_OK(tp_get_device_count(&n));
  if (n < 2) {
    printf("   skipped: needs 2 devices (TIDEPOOL_HOST_DEVICES=2 on the "
           "host platform)\n");
    return;
  }
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *a = NULL;
  const size_t size = 2 * MiB + 4 * KiB; /* two chunks */
  REQUIRE_OK(tp_malloc_from_pool_async(&a, size, pool, s));
  fill(a, size, 51, s);
  child ch;
  start_importer(&ch, "importer-dev1", pool, TP_LOCATION_DEVICE, 0, NULL, 2);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, size, 51));
  ctl w = {.op = CMD_WRITE,
           .slot = 0,
           .seed = 52,
           .offset = 2 * MiB,
           .size = 4 * KiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds((char *)a + 2 * MiB, 4 * KiB, 52, s));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}
int main(int argc, char **argv) {
  int rc = 0;
  if (ipc_child_main(argc, argv, &rc))
    return rc;
  signal(SIGPIPE, SIG_IGN);
  printf("test_ipc on the %s platform\n", tp_platform_name());
  RUN_TEST(test_same_process);
  RUN_TEST(test_destroy_while_held);
  RUN_TEST(test_host_numa_pool);
  RUN_TEST(test_concurrent_imports);
  RUN_TEST(test_import_churn);
  RUN_TEST(test_across_processes);
  RUN_TEST(test_remapped_chunk);
  RUN_TEST(test_import_with_descriptors_full);
  RUN_TEST(test_importer_killed);
  RUN_TEST(test_importer_killed_with_forked_child);
  RUN_TEST(test_other_user);
  RUN_TEST(test_invisible_device);
  RUN_TEST(test_importer_on_device1);
  return check_done();
}
