/* conformance_bad_input: every allocator entry point given bad input
 * answers with a clear error and leaves the pool as it was; and the error
 * codes' names and texts. */
#include <unistd.h>

#include "conformance.h"

/* ========================================================================
 * Error names
 * ======================================================================== */

static void test_error_names(void) {
  static const struct {
    tp_error_t code;
    const char *name;
    const char *text;
  } codes[] = {
#define TP_ERROR_ROW_(name, value, text) {name, #name, text},
      TP_ERROR_LIST(TP_ERROR_ROW_)
#undef TP_ERROR_ROW_
  };
  size_t n = sizeof codes / sizeof codes[0];
  CHECK_EQ_U64(n, 20);
  for (size_t i = 0; i < n; i++) {
    const char *name = tp_error_name(codes[i].code);
    const char *text = tp_error_string(codes[i].code);
    check_context(codes[i].name);
    if (CHECK(name != NULL))
      CHECK(strcmp(name, codes[i].name) == 0);
    if (CHECK(text != NULL))
      CHECK(strcmp(text, codes[i].text) == 0);
  }
  check_context("unknown error values");
  const tp_error_t unknown[] = {(tp_error_t)10, (tp_error_t)12345,
                                (tp_error_t)-1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *name = tp_error_name(unknown[i]);
    const char *text = tp_error_string(unknown[i]);
    if (CHECK(name != NULL))
      CHECK(strcmp(name, "TP_ERROR_UNKNOWN") == 0);
    if (CHECK(text != NULL))
      CHECK(text[0] != '\0');
  }
  check_context("platform");
  const char *platform = tp_platform_name();
  CHECK(platform &&
        (strcmp(platform, "host") == 0 || strcmp(platform, "cuda") == 0));
  int code = 0;
  const char *pname = NULL;
  CHECK_OK(tp_get_last_platform_error(NULL, NULL));
  CHECK_OK(tp_get_last_platform_error(&code, &pname));
  check_context(NULL);
}

/* ========================================================================
 * Bad input for every allocator entry point
 * ======================================================================== */

static void bad_input_allocation(tp_stream_t s, tp_pool_t pool) {
  void *p = NULL;
  step("allocation: NULL out pointers");
  CHECK_ERR(tp_malloc_async(NULL, 1000, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(NULL, 1000, pool, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_from_pool_async(NULL, 0, pool, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_malloc_async(NULL, 0, s), TP_ERROR_INVALID_VALUE);
  step("allocation: no pool");
  CHECK_ERR(tp_malloc_from_pool_async(&p, 1000, NULL, s),
            TP_ERROR_INVALID_VALUE);

  step("allocation: sizes whose rounding overflows");
  const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 511,
                          SIZE_MAX / 2 + 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    p = (void *)&p;
    CHECK_ERR(tp_malloc_async(&p, sizes[i], s), TP_ERROR_OUT_OF_MEMORY);
    CHECK_ERR(tp_malloc_from_pool_async(&p, sizes[i], pool, s),
              TP_ERROR_OUT_OF_MEMORY);
  }
  step("allocation: size 0 from a pool");
  p = (void *)&p;
  CHECK_OK(tp_malloc_from_pool_async(&p, 0, pool, s));
  CHECK_EQ_PTR(p, NULL);
  /* After all those refusals, the pool still works and holds nothing. */
  CHECK_EQ_U64(used_of(pool), 0);
  if (CHECK_OK(tp_malloc_from_pool_async(&p, 1000, pool, s)))
    CHECK_OK(tp_free_async(p, s));
}

static void bad_input_free(tp_stream_t s, tp_pool_t pool) {
  step("free: pointers no pool gave out");
  int local = 0;
  static int global_var;
  CHECK_ERR(tp_free_async(&local, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async(&global_var, s), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((void *)(uintptr_t)0x1000, s),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((void *)(uintptr_t)UINTPTR_MAX, s),
            TP_ERROR_INVALID_VALUE);

  step("free: a block freed and synchronized, freed again");
  void *p = NULL;
  if (CHECK_OK(tp_malloc_from_pool_async(&p, 3 * MiB, pool, s))) {
    CHECK_ERR(tp_free_async((char *)p + MiB, s), TP_ERROR_INVALID_VALUE);
    CHECK_OK(tp_free_async(p, s));
    CHECK_OK(tp_stream_synchronize(s));
    CHECK_ERR(tp_free_async(p, s), TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_free_async((char *)p + 512, s), TP_ERROR_INVALID_VALUE);
  }
  /* A rejected free changes nothing: the pool's count is intact. */
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_EQ_U64(used_of(pool), 0);
}

static void bad_input_pool_create(void) {
  tp_pool_t pool = NULL;
  tp_pool_props_t props;
  step("create: NULL out pointer");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(NULL, &props), TP_ERROR_INVALID_VALUE);
  step("create: a zeroed struct has an invalid location");
  memset(&props, 0, sizeof props);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: unknown allocation types");
  props = props_make(TP_ALLOCATION_INVALID, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  props = props_make((tp_allocation_type_t)77, loc_device(0), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: unknown location type 99");
  tp_location_t loc99 = {(tp_location_type_t)99, 0, 0};
  props = props_make(TP_ALLOCATION_PINNED, loc99, 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: pinned with no location");
  props = props_make(TP_ALLOCATION_PINNED, loc_none(), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: device -1");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(-1), 0, 0);
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  step("create: usage != 0");
  props = props_make(TP_ALLOCATION_PINNED, loc_device(0), 0, 0);
  props.usage = 1;
  CHECK_ERR(tp_pool_create(&pool, &props), TP_ERROR_INVALID_VALUE);
  check_context(NULL);
}

static void bad_input_attributes(tp_pool_t pool) {
  uint64_t v = 0;
  step("attributes: no pool");
  CHECK_ERR(tp_pool_get_attribute(NULL, TP_POOL_ATTR_USED_MEM_CURRENT, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(NULL, TP_POOL_ATTR_RELEASE_THRESHOLD, &v),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_destroy(NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_trim_to(NULL, 0), TP_ERROR_INVALID_VALUE);
  step("attributes: unknown attributes");
  const int unknown[] = {0, 16, 99, 105, 999, -1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    v = 0;
    CHECK_ERR(tp_pool_get_attribute(pool, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_set_attribute(pool, (tp_pool_attr_t)unknown[i], &v),
              TP_ERROR_INVALID_VALUE);
  }
  step("attributes: NULL values");
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_OOM_WAIT, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, NULL),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_attribute(pool, TP_POOL_ATTR_CHUNK_SIZE, NULL),
            TP_ERROR_INVALID_VALUE);
}

static void bad_input_access(tp_pool_t pool) {
  tp_location_t dev0 = loc_device(0);
  tp_access_flags_t flags;
  tp_access_desc_t desc = {dev0, TP_ACCESS_READ_WRITE};
  step("access: NULL arguments");
  CHECK_ERR(tp_pool_get_access(NULL, pool, &dev0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&flags, NULL, &dev0), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_get_access(&flags, pool, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_access(NULL, &desc, 1), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_set_access(pool, NULL, 2), TP_ERROR_INVALID_VALUE);
  step("access: unknown flags");
  desc.flags = (tp_access_flags_t)4;
  CHECK_ERR(tp_pool_set_access(pool, &desc, 1), TP_ERROR_INVALID_VALUE);
}

static void bad_input_default_pools(tp_pool_t pool) {
  tp_location_t dev0 = loc_device(0);
  tp_location_t loc99 = {(tp_location_type_t)99, 0, 0};
  tp_pool_t got = NULL;
  step("current pools: unknown location type 99");
  CHECK_ERR(tp_mem_get_default_pool(&got, &loc99, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, &loc99, TP_ALLOCATION_PINNED),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&loc99, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
  step("current pools: unknown allocation types");
  CHECK_ERR(tp_mem_get_default_pool(&got, &dev0, (tp_allocation_type_t)77),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_default_pool(&got, &dev0, TP_ALLOCATION_INVALID),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_get_pool(&got, &dev0, (tp_allocation_type_t)77),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_mem_set_pool(&dev0, (tp_allocation_type_t)77, pool),
            TP_ERROR_INVALID_VALUE);
  step("current pools: host NUMA current has no pool");
  tp_location_t cur = {TP_LOCATION_HOST_NUMA_CURRENT, 0, 0};
  CHECK_ERR(tp_mem_set_pool(&cur, TP_ALLOCATION_PINNED, pool),
            TP_ERROR_INVALID_VALUE);
}

static void bad_input_device_attributes(void) {
  int count = 0, v = -1;
  CHECK_OK(tp_get_device_count(&count));
  step("device attributes: bad arguments");
  CHECK_ERR(
      tp_device_get_attribute(NULL, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_attribute(&v, (tp_device_attr_t)999, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_device_get_attribute(&v, (tp_device_attr_t)0, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, count),
      TP_ERROR_INVALID_DEVICE);
  step("device attributes: values");
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED, 0));
  CHECK_EQ_INT(v, 1);
  v = -1;
  CHECK_OK(tp_device_get_attribute(
      &v, TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0));
  CHECK(v >= 0 && (v & ~(TP_HANDLE_POSIX_FD | TP_HANDLE_FABRIC)) == 0);
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT, 0));
  CHECK(v >= 0);
  v = -1;
  CHECK_OK(
      tp_device_get_attribute(&v, TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS, 0));
  CHECK(v == 0 || v == 1);
}

static void bad_input_ipc(tp_stream_t s, tp_pool_t plain) {
  tp_pool_props_t props =
      props_make(TP_ALLOCATION_PINNED, loc_device(0), TP_HANDLE_POSIX_FD, 0);
  tp_pool_t ipc = NULL, imported = NULL;
  step("ipc: create an exportable pool");
  if (!CHECK_OK(tp_pool_create(&ipc, &props)))
    return;
  int fd = -1, local = 0;
  void *p = NULL, *q = NULL;
  tp_pool_ptr_export_data_t data;
  memset(&data, 0, sizeof data);

  step("ipc: export with bad arguments");
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(NULL, ipc, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(&fd, NULL, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_FABRIC, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_NONE, 0),
            TP_ERROR_INVALID_VALUE);

  step("ipc: export pointer with bad arguments");
  CHECK_OK(tp_malloc_from_pool_async(&p, 4096, ipc, s));
  CHECK_ERR(tp_pool_export_pointer(NULL, p), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, NULL), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, &local), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_export_pointer(&data, (char *)p + 512),
            TP_ERROR_INVALID_VALUE);

  step("ipc: import with bad arguments");
  if (CHECK_OK(tp_pool_export_to_shareable_handle(&fd, ipc, TP_HANDLE_POSIX_FD,
                                                  0))) {
    CHECK_ERR(tp_pool_import_from_shareable_handle(NULL, (void *)(uintptr_t)fd,
                                                   TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
    /* The descriptor comes by value: a pointer to it is no descriptor. */
    CHECK_ERR(tp_pool_import_from_shareable_handle(&imported, &fd,
                                                   TP_HANDLE_POSIX_FD, 0),
              TP_ERROR_INVALID_VALUE);
    imported = NULL;
    CHECK_OK(tp_pool_import_from_shareable_handle(
        &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  }
  step("ipc: import pointer with bad arguments");
  CHECK_OK(tp_pool_export_pointer(&data, p));
  tp_pool_ptr_export_data_t forged;
  memset(&forged, 0, sizeof forged);
  if (imported) {
    CHECK_ERR(tp_pool_import_pointer(NULL, imported, &data),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_import_pointer(&q, imported, NULL),
              TP_ERROR_INVALID_VALUE);
    CHECK_ERR(tp_pool_import_pointer(&q, imported, &forged),
              TP_ERROR_INVALID_VALUE);
  }
  CHECK_ERR(tp_pool_import_pointer(&q, NULL, &data), TP_ERROR_INVALID_VALUE);
  /* Only an imported pool maps another process's allocations. */
  CHECK_ERR(tp_pool_import_pointer(&q, plain, &data), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_pointer(&q, ipc, &data), TP_ERROR_INVALID_VALUE);

  check_context(NULL);
  if (imported)
    CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_free_async(p, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(ipc));
  if (fd >= 0)
    close(fd);
}

static void test_bad_input(void) {
  tp_stream_t s = stream_new(TP_STREAM_NON_BLOCKING);
  tp_pool_t pool = device_pool(0);
  REQUIRE(s && pool);
  bad_input_allocation(s, pool);
  bad_input_free(s, pool);
  bad_input_pool_create();
  bad_input_attributes(pool);
  bad_input_access(pool);
  bad_input_default_pools(pool);
  bad_input_device_attributes();
  bad_input_ipc(s, pool);
  check_context(NULL);
  CHECK_OK(tp_pool_destroy(pool));
  stream_done(s);
}

int main(int argc, char **argv) {
  static const conformance_test_t tests[] = {
      CONFORMANCE_TEST(test_error_names),
      CONFORMANCE_TEST(test_bad_input),
  };
  return conformance_main(argc, argv, "bad_input", tests,
                          CONFORMANCE_COUNT(tests));
}
