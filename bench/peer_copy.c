/* Peer copies through pool memory: a pool of device 0 that grants device 1
 * access, read and written by copies queued on a stream of device 1, in
 * GB/s; on cuda beside the same copies through a driver pool
 * (cudaMallocAsync's) with the same access, in the same run. Needs two
 * devices (on the host platform: TIDEPOOL_HOST_DEVICES=2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dl_table.h"
#include "tidepool.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void ok(tp_error_t e, const char *what) {
  if (e != TP_SUCCESS) {
    fprintf(stderr, "peer_copy: %s: %s\n", what, tp_error_name(e));
    exit(1);
  }
}

/* Copies `size` bytes `reps` times from src to dst on `s`; GB/s counting
 * bytes read once and written once, as a copy moves them over the link. */
static double rate(void *dst, void *src, size_t size, int reps, tp_stream_t s) {
  ok(tp_memcpy_async(dst, src, size, s), "warm-up copy");
  ok(tp_stream_synchronize(s), "synchronize");
  double t0 = now_s();
  for (int i = 0; i < reps; i++)
    ok(tp_memcpy_async(dst, src, size, s), "copy");
  ok(tp_stream_synchronize(s), "synchronize");
  return (double)size * reps / (now_s() - t0) / 1e9;
}

/* The driver's pool, reached through dlopen (types as cuda.h lays them). */
typedef struct cu_pool_props {
  int alloc_type, handle_types;
  struct {
    int type, id;
  } location;
  void *win32;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
} cu_pool_props;
typedef struct cu_access {
  struct {
    int type, id;
  } location;
  int flags;
} cu_access;
static struct {
  int (*create)(void **, const cu_pool_props *);
  int (*set_access)(void *, const cu_access *, size_t);
  int (*alloc)(unsigned long long *, size_t, void *, void *);
  int (*free)(unsigned long long, void *);
  int (*destroy)(void *);
} cu;

static int load_driver(void) {
  const dl_sym syms[] = {{&cu.create, "cuMemPoolCreate"},
                         {&cu.set_access, "cuMemPoolSetAccess"},
                         {&cu.alloc, "cuMemAllocFromPoolAsync"},
                         {&cu.free, "cuMemFreeAsync"},
                         {&cu.destroy, "cuMemPoolDestroy"}};
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  int n = 0;
  ok(tp_get_device_count(&n), "tp_get_device_count");
  const char *platform = tp_platform_name();
  if (n < 2) {
    printf("peer_copy: %s platform, %d device(s): needs 2, nothing "
           "measured\n",
           platform, n);
    return 0;
  }
  tp_stream_t s1;
  ok(tp_set_device(1), "tp_set_device(1)");
  ok(tp_stream_create(&s1, TP_STREAM_NON_BLOCKING), "stream on device 1");
  tp_pool_t pool0, pool1;
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  ok(tp_pool_create(&pool0, &props), "pool of device 0");
  ok(tp_device_get_mem_pool(&pool1, 1), "pool of device 1");
  tp_access_desc_t grant = {{TP_LOCATION_DEVICE, 1, 0}, TP_ACCESS_READ_WRITE};
  ok(tp_pool_set_access(pool0, &grant, 1), "grant device 1");
  int driver = strcmp(platform, "cuda") == 0 && load_driver() == 0;
  void *dpool = NULL;
  if (driver) {
    cu_pool_props dp = {.alloc_type = 1, .location = {1, 0}};
    cu_access da = {{1, 1}, 3};
    driver = cu.create(&dpool, &dp) == 0 && cu.set_access(dpool, &da, 1) == 0;
  }
  printf("peer_copy: platform %s; copies on a stream of device 1 between a "
         "pool of device 0 (peer access granted) and device 1's pool\n",
         platform);
  printf("%10s %16s %16s %16s %16s\n", "size", "tidepool 0->1", "tidepool 1->0",
         "driver 0->1", "driver 1->0");
  for (size_t size = 16u << 20; size <= (quick ? 16u << 20 : 1u << 30);
       size *= 4) {
    int reps = (int)((quick ? 64u << 20 : 8u << 30) / size);
    void *remote = NULL, *local = NULL;
    ok(tp_malloc_from_pool_async(&remote, size, pool0, s1), "alloc peer");
    ok(tp_malloc_from_pool_async(&local, size, pool1, s1), "alloc local");
    ok(tp_memset_async(remote, 1, size, s1), "fill");
    double r01 = rate(local, remote, size, reps, s1);
    double r10 = rate(remote, local, size, reps, s1);
    double d01 = 0, d10 = 0;
    if (driver) {
      unsigned long long dr = 0;
      if (cu.alloc(&dr, size, dpool, s1) == 0) {
        d01 = rate(local, (void *)(uintptr_t)dr, size, reps, s1);
        d10 = rate((void *)(uintptr_t)dr, local, size, reps, s1);
        cu.free(dr, s1);
      }
    }
    char a[24], b[24];
    snprintf(a, sizeof a, driver ? "%.1f GB/s" : "-", d01);
    snprintf(b, sizeof b, driver ? "%.1f GB/s" : "-", d10);
    printf("%7zu MiB %11.1f GB/s %11.1f GB/s %16s %16s\n", size >> 20, r01, r10,
           a, b);
    ok(tp_free_async(remote, s1), "free");
    ok(tp_free_async(local, s1), "free");
    ok(tp_stream_synchronize(s1), "synchronize");
  }
  if (dpool)
    cu.destroy(dpool);
  ok(tp_stream_destroy(s1), "stream destroy");
  ok(tp_pool_destroy(pool0), "pool destroy");
  return 0;
}
