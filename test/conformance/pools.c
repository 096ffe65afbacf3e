/* conformance_pools: pools as objects: their attributes (defaults, what
 * writes keep, what is read-only, the properties read back), destroy, the
 * default and current pool of each location, and the max_size cap. */
#include "conformance.h"

/* ========================================================================
 * Attributes
 * ======================================================================== */

typedef struct attr_info {
  tp_pool_attr_t attr;
  const char *name;
  int is_u64;
} attr_info_t;

static const attr_info_t read_only_attrs[] = {
    {TP_POOL_ATTR_RESERVED_MEM_CURRENT, "RESERVED_MEM_CURRENT", 1},
    {TP_POOL_ATTR_USED_MEM_CURRENT, "USED_MEM_CURRENT", 1},
    {TP_POOL_ATTR_ALLOCATION_TYPE, "ALLOCATION_TYPE", 0},
    {TP_POOL_ATTR_EXPORT_HANDLE_TYPES, "EXPORT_HANDLE_TYPES", 0},
    {TP_POOL_ATTR_LOCATION_ID, "LOCATION_ID", 0},
    {TP_POOL_ATTR_LOCATION_TYPE, "LOCATION_TYPE", 0},
    {TP_POOL_ATTR_LOCALITY_DOMAIN_ID, "LOCALITY_DOMAIN_ID", 0},
    {TP_POOL_ATTR_MAX_POOL_SIZE, "MAX_POOL_SIZE", 1},
    {TP_POOL_ATTR_HW_DECOMPRESS_ENABLED, "HW_DECOMPRESS_ENABLED", 0},
    {TP_POOL_ATTR_CHUNK_MAPS, "CHUNK_MAPS", 1},
    {TP_POOL_ATTR_CHUNK_UNMAPS, "CHUNK_UNMAPS", 1},
    {TP_POOL_ATTR_CHUNK_SIZE, "CHUNK_SIZE", 1},
};

/* The read-only attributes refuse a write of their own current value (the
 * one write that could pass for harmless) and keep that value. */
static void check_read_only_attrs(tp_pool_t pool) {
  size_t n = sizeof read_only_attrs / sizeof read_only_attrs[0];
  for (size_t i = 0; i < n; i++) {
    const attr_info_t *a = &read_only_attrs[i];
    step("set read-only %s", a->name);
    if (a->is_u64) {
      uint64_t v = attr_u64(pool, a->attr);
      uint64_t w = v;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      w = v + 1;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      CHECK_EQ_U64(attr_u64(pool, a->attr), v);
    } else {
      int v = attr_int(pool, a->attr);
      int w = v;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      w = v + 1;
      CHECK_ERR(tp_pool_set_attribute(pool, a->attr, &w),
                TP_ERROR_INVALID_VALUE);
      CHECK_EQ_INT(attr_int(pool, a->attr), v);
    }
  }
  check_context(NULL);
}

static int is_power_of_two(uint64_t x) {
  return x && !(x & (x - 1));
}

/* Read-only attributes report the properties the pool was created with. */
static void check_props_read_back(tp_allocation_type_t type, tp_location_t loc,
                                  unsigned handles, size_t max_size) {
  tp_pool_props_t props = props_make(type, loc, handles, max_size);
  tp_pool_t pool = NULL;
  if (!CHECK_OK(tp_pool_create(&pool, &props)))
    return;
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_ALLOCATION_TYPE), type);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_EXPORT_HANDLE_TYPES), handles);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_TYPE), loc.type);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_ID), loc.id);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCALITY_DOMAIN_ID), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_HW_DECOMPRESS_ENABLED), 0);
  if (max_size)
    CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), max_size);
  CHECK(is_power_of_two(chunk_of(pool)));
  CHECK_OK(tp_pool_destroy(pool));
}

static void test_attributes(void) {
  tp_pool_t pool = device_pool(64 * MiB);
  REQUIRE(pool != NULL);

  step("defaults of the read-write attributes");
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               1);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 1);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_GROWTH_SLACK), 3906);

  step("the read-write attributes keep what is written");
  set_u64(pool, TP_POOL_ATTR_GROWTH_SLACK, 25000);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_GROWTH_SLACK), 25000);
  set_u64(pool, TP_POOL_ATTR_GROWTH_SLACK, 1000000);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_GROWTH_SLACK), 1000000);
  uint64_t too_much = 1000001;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, &too_much),
            TP_ERROR_INVALID_VALUE);
  too_much = UINT64_MAX;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, &too_much),
            TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_GROWTH_SLACK), 1000000);
  set_u64(pool, TP_POOL_ATTR_GROWTH_SLACK, 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_GROWTH_SLACK), 0);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 0);
  set_int(pool, TP_POOL_ATTR_OOM_WAIT, 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_OOM_WAIT), 1);
  set_policies(pool, 0, 1, 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               0);
  set_policies(pool, 1, 0, 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES), 1);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES),
               1);
  set_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, (uint64_t)1 << 40);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RELEASE_THRESHOLD),
               (uint64_t)1 << 40);

  check_read_only_attrs(pool);

  step("read-only attributes match the props: device pool");
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_ALLOCATION_TYPE),
               TP_ALLOCATION_PINNED);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_EXPORT_HANDLE_TYPES), 0);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_DEVICE);
  CHECK_EQ_INT(attr_int(pool, TP_POOL_ATTR_LOCATION_ID), 0);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_MAX_POOL_SIZE), 64 * MiB);
  step("read-only attributes match the props: other pools");
  check_props_read_back(TP_ALLOCATION_PINNED, loc_device(0), 0, 32 * MiB);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD,
                        0);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_host(), 0, 16 * MiB);
  check_props_read_back(TP_ALLOCATION_PINNED, loc_numa(0), 0, 0);
  check_props_read_back(TP_ALLOCATION_MANAGED, loc_device(0), 0, 0);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
}

/* ========================================================================
 * Destroy
 * ======================================================================== */

static void test_destroy(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  tp_location_t dev0 = loc_device(0);

  step("destroy with a live allocation succeeds");
  void *p = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p, MiB, pool, s));
  CHECK_OK(tp_memset_async(p, 0x11, MiB, s));
  CHECK_OK(tp_pool_destroy(pool));

  /* The pool object stays alive behind its live allocation, so its handle
   * cannot have been recycled for another pool yet. */
  step("a destroyed handle is refused");
  uint64_t v = 0;
  void *q = NULL;
  CHECK_ERR(tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(&q, 64, pool, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_destroy(pool), TP_ERROR_INVALID_VALUE);
  v = 0;
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_trim_to(pool, 0), TP_ERROR_INVALID_VALUE);
  tp_access_flags_t flags;
  CHECK_ERR(tp_pool_get_access(&flags, pool, &dev0), TP_ERROR_INVALID_VALUE);
  tp_access_desc_t desc = {dev0, TP_ACCESS_READ_WRITE};
  CHECK_ERR(tp_pool_set_access(pool, &desc, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(0, pool), TP_ERROR_INVALID_VALUE);

  step("the live allocation stays usable until freed");
  CHECK_OK(tp_memset_async(p, 0x22, MiB, s));
  unsigned char *host = malloc(MiB);
  REQUIRE(host != NULL);
  read_back(host, p, MiB, s);
  CHECK(all_bytes(host, MiB, 0x22));
  free(host);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));

  step("a destroyed current pool stops being current");
  tp_pool_t def = default_pool();
  tp_pool_t cur = device_pool(0);
  if (cur) {
    tp_pool_t got = NULL;
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, cur));
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, cur);
    CHECK_OK(tp_pool_destroy(cur));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, def);
    got = NULL;
    CHECK_OK(tp_device_get_mem_pool(&got, 0));
    CHECK_EQ_PTR(got, def);
    /* And allocation follows: tp_malloc_async now uses the default pool. */
    uint64_t before = used_of(def);
    CHECK_OK(tp_malloc_async(&p, 1000, s));
    CHECK_EQ_U64(used_of(def), before + 1000);
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
  }

  step("a destroyed current host pool stops being current");
  tp_location_t host_loc = loc_host();
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, host_loc, 0, 0);
  tp_pool_t hp = NULL, host_def = NULL, got = NULL;
  CHECK_OK(tp_mem_get_default_pool(&host_def, &host_loc, TP_ALLOCATION_PINNED));
  if (CHECK_OK(tp_pool_create(&hp, &props))) {
    CHECK_OK(tp_mem_set_pool(&host_loc, TP_ALLOCATION_PINNED, hp));
    CHECK_OK(tp_pool_destroy(hp));
    CHECK_OK(tp_mem_get_pool(&got, &host_loc, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, host_def);
  }
  check_context(NULL);
  stream_done(s);
}

/* ========================================================================
 * Default and current pools
 * ======================================================================== */

/* Gets the default pool twice and checks that it is one stable handle. */
static tp_pool_t stable_default(tp_location_t loc, tp_allocation_type_t type) {
  tp_pool_t a = NULL, b = NULL;
  CHECK_OK(tp_mem_get_default_pool(&a, &loc, type));
  CHECK_OK(tp_mem_get_default_pool(&b, &loc, type));
  CHECK(a != NULL);
  CHECK_EQ_PTR(a, b);
  /* Until something is made current, the current pool is the default. */
  tp_pool_t cur = NULL;
  CHECK_OK(tp_mem_get_pool(&cur, &loc, type));
  CHECK_EQ_PTR(cur, a);
  return a;
}

/* A pool made current before its location's default pool was ever asked
 * for stays current when the default is then asked for: making the default
 * once made it current too, and undid the set (tp_malloc_async then
 * allocated from the default pool). Runs first, before anything made a
 * default pool. */
static void test_set_before_default_made(void) {
  static const struct {
    tp_location_t loc;
    const char *name;
  } where[] = {{{TP_LOCATION_HOST_NUMA, 0, 0}, "host NUMA node 0"},
               {{TP_LOCATION_HOST, 0, 0}, "host"},
               {{TP_LOCATION_DEVICE, 0, 0}, "device 0"}};
  for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
    step("%s", where[i].name);
    tp_pool_props_t props =
        props_make(TP_ALLOCATION_PINNED, where[i].loc, TP_HANDLE_NONE, 0);
    tp_pool_t mine = NULL, def = NULL, got = NULL;
    if (!CHECK_OK(tp_pool_create(&mine, &props)))
      continue;
    CHECK_OK(tp_mem_set_pool(&where[i].loc, TP_ALLOCATION_PINNED, mine));
    CHECK_OK(
        tp_mem_get_default_pool(&def, &where[i].loc, TP_ALLOCATION_PINNED));
    CHECK(def != NULL && def != mine);
    CHECK_OK(tp_mem_get_pool(&got, &where[i].loc, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, mine);
    if (where[i].loc.type == TP_LOCATION_DEVICE) {
      got = NULL;
      CHECK_OK(tp_device_get_mem_pool(&got, 0));
      CHECK_EQ_PTR(got, mine);
      tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
      void *p = NULL;
      if (s && CHECK_OK(tp_malloc_async(&p, 1 << 20, s))) {
        CHECK_EQ_U64(attr_u64(mine, TP_POOL_ATTR_USED_MEM_CURRENT), 1 << 20);
        CHECK_EQ_U64(attr_u64(def, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
        CHECK_OK(tp_free_async(p, s));
        CHECK_OK(tp_stream_synchronize(s));
      }
      if (s)
        CHECK_OK(tp_stream_destroy(s));
    }
    CHECK_OK(tp_pool_destroy(mine));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &where[i].loc, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, def);
  }
}

static void test_default_and_current_pools(void) {
  tp_location_t dev0 = loc_device(0), host = loc_host(), numa0 = loc_numa(0),
                none = loc_none();
  int count = 0;
  CHECK_OK(tp_get_device_count(&count));
  REQUIRE(count >= 1);

  step("default pools exist and are stable");
  tp_pool_t dpin = stable_default(dev0, TP_ALLOCATION_PINNED);
  tp_pool_t dhost = stable_default(host, TP_ALLOCATION_PINNED);
  tp_pool_t dnuma = stable_default(numa0, TP_ALLOCATION_PINNED);
  tp_pool_t dman = stable_default(dev0, TP_ALLOCATION_MANAGED);
  tp_pool_t dnone = stable_default(none, TP_ALLOCATION_MANAGED);
  /* The managed defaults are checked where they exist, but the rest of
   * the test needs only the pinned ones. */
  REQUIRE(dpin && dhost && dnuma);
  tp_pool_t viadev = NULL;
  CHECK_OK(tp_device_get_default_mem_pool(&viadev, 0));
  CHECK_EQ_PTR(viadev, dpin);
  CHECK(dpin != dhost);
  CHECK(dpin != dman);

  step("default pools describe their location and type");
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_DEVICE);
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_LOCATION_ID), 0);
  CHECK_EQ_INT(attr_int(dpin, TP_POOL_ATTR_ALLOCATION_TYPE),
               TP_ALLOCATION_PINNED);
  CHECK_EQ_INT(attr_int(dhost, TP_POOL_ATTR_LOCATION_TYPE), TP_LOCATION_HOST);
  CHECK_EQ_INT(attr_int(dnuma, TP_POOL_ATTR_LOCATION_TYPE),
               TP_LOCATION_HOST_NUMA);
  CHECK_EQ_INT(attr_int(dnuma, TP_POOL_ATTR_LOCATION_ID), 0);
  if (dman)
    CHECK_EQ_INT(attr_int(dman, TP_POOL_ATTR_ALLOCATION_TYPE),
                 TP_ALLOCATION_MANAGED);
  if (dnone)
    CHECK_EQ_INT(attr_int(dnone, TP_POOL_ATTR_ALLOCATION_TYPE),
                 TP_ALLOCATION_MANAGED);

  tp_stream_t s = stream_new(TP_STREAM_DEFAULT);
  tp_pool_t mine = device_pool(0);
  REQUIRE(s && mine);
  step("tp_mem_set_pool makes tp_malloc_async use the pool");
  tp_pool_t got = NULL;
  CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, mine));
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, mine);
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, mine);
  uint64_t def_used = used_of(dpin);
  void *p = NULL, *q = NULL;
  CHECK_OK(tp_malloc_async(&p, 1000, s));
  CHECK_OK(tp_malloc_async(&q, 3000, NULL));
  CHECK_EQ_U64(used_of(mine), 4000);
  CHECK_EQ_U64(used_of(dpin), def_used);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_free_async(q, NULL));
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(used_of(mine), 0);

  step("tp_device_set_mem_pool / tp_device_get_mem_pool");
  CHECK_OK(tp_device_set_mem_pool(0, dpin));
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, dpin);
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, dpin);
  CHECK_OK(tp_device_set_mem_pool(0, mine));
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, mine);
  CHECK_OK(tp_malloc_async(&p, 2000, s));
  CHECK_EQ_U64(used_of(mine), 2000);
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, dpin));
  got = NULL;
  CHECK_OK(tp_device_get_mem_pool(&got, 0));
  CHECK_EQ_PTR(got, dpin);

  step("current pools are per location and type");
  tp_pool_props_t props = props_make(TP_ALLOCATION_PINNED, host, 0, 0);
  tp_pool_t hp = NULL;
  if (CHECK_OK(tp_pool_create(&hp, &props))) {
    CHECK_OK(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, hp));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &host, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, hp);
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, dpin);
    CHECK_ERR(tp_device_set_mem_pool(0, hp), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_mem_set_pool(&host, TP_ALLOCATION_PINNED, dhost));
    CHECK_OK(tp_pool_destroy(hp));
  }
  props = props_make(TP_ALLOCATION_MANAGED, dev0, 0, 0);
  tp_pool_t mp = NULL;
  if (CHECK_OK(tp_pool_create(&mp, &props))) {
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_MANAGED, mp));
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_MANAGED));
    CHECK_EQ_PTR(got, mp);
    got = NULL;
    CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
    CHECK_EQ_PTR(got, dpin);
    CHECK_ERR(tp_device_set_mem_pool(0, mp), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_mem_set_pool(&dev0, TP_ALLOCATION_MANAGED, dman));
    CHECK_OK(tp_pool_destroy(mp));
  }

  step("invalid device ids");
  tp_location_t bad = loc_device(count), neg = loc_device(-1);
  got = NULL;
  CHECK_ERR(tp_device_get_default_mem_pool(&got, -1), TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_default_mem_pool(&got, count),
            TP_ERROR_INVALID_DEVICE);
  /* The driver's current-pool calls answer INVALID_VALUE for a device that
   * does not exist, its default-pool call INVALID_DEVICE
   * (bench/edge_answers.cu, H200). */
  CHECK_ERR(tp_device_get_mem_pool(&got, count), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_mem_pool(&got, -1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(count, mine), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(-1, mine), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &bad, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_mem_get_pool(&got, &neg, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_DEVICE);
  CHECK_ERR(tp_device_get_attribute(&count,
                                    TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, -1),
            TP_ERROR_INVALID_DEVICE);

  step("NULL pointers");
  CHECK_ERR(tp_device_get_default_mem_pool(NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_mem_pool(NULL, 0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_set_mem_pool(0, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(NULL, &dev0, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, NULL, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(NULL, &dev0, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, NULL, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(NULL, TP_ALLOCATION_PINNED, dpin),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, TP_ALLOCATION_PINNED, NULL),
            TP_ERROR_INVALID_VALUE);
  got = NULL;
  CHECK_OK(tp_mem_get_pool(&got, &dev0, TP_ALLOCATION_PINNED));
  CHECK_EQ_PTR(got, dpin);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(mine));
  stream_done(s);
}

/* ========================================================================
 * max_size
 * ======================================================================== */

static void test_max_size(void) {
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(a != NULL);

  step("max_size 64 MiB: beyond fails and the pool stays usable");
  tp_pool_t pool = device_pool(64 * MiB);
  if (pool) {
    void *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(tp_malloc_from_pool_async(&x, 48 * MiB, pool, a));
    CHECK_ERR(tp_malloc_from_pool_async(&z, 32 * MiB, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&z, 64 * MiB + 1, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&z, SIZE_MAX, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK_OK(tp_malloc_from_pool_async(&y, 16 * MiB, pool, a));
    /* 64 MiB are in use, so not even a small block fits. */
    CHECK_ERR(tp_malloc_from_pool_async(&z, 1000, pool, a),
              TP_ERROR_OUT_OF_MEMORY);
    CHECK(reserved_of(pool) <= 64 * MiB);
    CHECK(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH) <= 64 * MiB);
    CHECK_OK(tp_free_async(x, a));
    CHECK_OK(tp_free_async(y, a));
    CHECK_OK(tp_stream_synchronize(a));
    CHECK_OK(tp_malloc_from_pool_async(&x, 64 * MiB, pool, a));
    CHECK_OK(tp_memset_async(x, 0, 64 * MiB, a));
    CHECK_OK(tp_free_async(x, a));
    CHECK_OK(tp_stream_synchronize(a));
    CHECK_EQ_U64(reserved_of(pool), 0);
    CHECK_OK(tp_pool_destroy(pool));
  }
  check_context(NULL);
  stream_done(a);
}

/* ========================================================================
 * What a pointer is
 * ======================================================================== */

/* The allocation that holds `p` at `off` bytes from its start: its start,
 * its size and its pool. */
static void check_range(void *p, size_t off, size_t size, tp_pool_t pool) {
  const char *at = (const char *)p + off;
  void *start = NULL;
  size_t got = 0;
  tp_pool_t of = NULL;
  CHECK_OK(
      tp_pointer_get_attribute(&start, TP_POINTER_ATTR_RANGE_START_ADDR, at));
  CHECK(start == p);
  CHECK_OK(tp_pointer_get_attribute(&got, TP_POINTER_ATTR_RANGE_SIZE, at));
  CHECK_EQ_U64(got, size);
  CHECK_OK(tp_pointer_get_attribute(&of, TP_POINTER_ATTR_MEMPOOL_HANDLE, at));
  CHECK(of == pool);
}

static void test_pointer_attributes(void) {
  tp_stream_t a = stream_new(TP_STREAM_NON_BLOCKING);
  REQUIRE(a != NULL);
  tp_pool_t def = default_pool(), pool = device_pool(0);
  REQUIRE(def != NULL && pool != NULL);
  /* Small ones (one granule, several granules), a large one over several
   * chunks and one that starts where another ends. */
  static const size_t sizes[] = {100, 3000, 70000, 5 * MiB + 123};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N] = {0}, *q[N] = {0};
  for (int i = 0; i < N; i++) {
    step("pointer attributes, %zu bytes", sizes[i]);
    CHECK_OK(tp_malloc_async(&p[i], sizes[i], a));
    CHECK_OK(tp_malloc_from_pool_async(&q[i], sizes[i], pool, a));
    if (!p[i] || !q[i])
      continue;
    check_range(p[i], 0, sizes[i], def);
    check_range(p[i], sizes[i] / 2 + 1, sizes[i], def);
    check_range(p[i], sizes[i] - 1, sizes[i], def);
    check_range(q[i], sizes[i] - 1, sizes[i], pool);
  }
  step("pointer attributes: bad input");
  size_t v = 0;
  int local = 0;
  CHECK_ERR(tp_pointer_get_attribute(NULL, TP_POINTER_ATTR_RANGE_SIZE, p[0]),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pointer_get_attribute(&v, TP_POINTER_ATTR_RANGE_SIZE, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pointer_get_attribute(&v, (tp_pointer_attr_t)9, p[0]),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pointer_get_attribute(&v, TP_POINTER_ATTR_RANGE_SIZE, &local),
            TP_ERROR_INVALID_VALUE);
  step("pointer attributes: a freed allocation is none");
  for (int i = 0; i < N; i++) {
    CHECK_OK(tp_free_async(p[i], a));
    CHECK_ERR(tp_pointer_get_attribute(&v, TP_POINTER_ATTR_RANGE_SIZE, p[i]),
              TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_free_async(q[i], a));
  }
  CHECK_OK(tp_stream_synchronize(a));
  CHECK_ERR(tp_pointer_get_attribute(&v, TP_POINTER_ATTR_RANGE_SIZE, q[N - 1]),
            TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_pool_destroy(pool));
  check_context(NULL);
  stream_done(a);
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_pointer_attributes),
      CONFORMANCE_TEST(test_set_before_default_made),
      CONFORMANCE_TEST(test_attributes),
      CONFORMANCE_TEST(test_destroy),
      CONFORMANCE_TEST(test_default_and_current_pools),
      CONFORMANCE_TEST(test_max_size),
  };
  return conformance_main(argc, argv, "pools", tests, CONFORMANCE_COUNT(tests));
}
