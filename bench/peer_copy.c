/* Peer copies through pool memory, side by side: GB/s of copies queued on a
 * stream of device 1 between a pool of device 0 (device 1 granted
 * read-write access) and a pool of device 1, in both directions, from
 * 16 MiB to 1 GiB; through tidepool's pools and, on cuda, through the
 * driver's own pools (cudaMallocAsync's) set up alike, in the same run and
 * by the same copy call, so that the pools are the only difference. Every
 * call is checked, and each copy's bytes are checked once per size. Needs
 * two devices (on the host platform: TIDEPOOL_HOST_DEVICES=2, which has no
 * driver to compare with). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dl_table.h"
#include "tidepool.h"

#define MiB ((size_t)1 << 20)
#define ROUNDS 5 /* each figure is the best of this many timed runs */

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

/* The driver's pools, reached through dlopen (types as cuda.h lays them
 * out: CUmemPoolProps, CUmemAccessDesc). */
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

static void cu_ok(int r, const char *what) {
  if (r != 0) {
    fprintf(stderr, "peer_copy: %s: CUresult %d\n", what, r);
    exit(1);
  }
}

static int load_driver(void) {
  const dl_sym syms[] = {{&cu.create, "cuMemPoolCreate"},
                         {&cu.set_access, "cuMemPoolSetAccess"},
                         {&cu.alloc, "cuMemAllocFromPoolAsync"},
                         {&cu.free, "cuMemFreeAsync"},
                         {&cu.destroy, "cuMemPoolDestroy"}};
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

/* A driver pool of `device`; device 1 is granted read-write access to a
 * pool of device 0, as tidepool's is. */
static void *driver_pool(int device) {
  cu_pool_props props = {.alloc_type = 1 /* PINNED */,
                         .location = {1 /* DEVICE */, device}};
  void *pool = NULL;
  cu_ok(cu.create(&pool, &props), "cuMemPoolCreate");
  if (device == 0) {
    cu_access a = {{1, 1}, 3 /* PROT_READWRITE */};
    cu_ok(cu.set_access(pool, &a, 1), "cuMemPoolSetAccess");
  }
  return pool;
}

/* Copies `size` bytes `reps` times from src to dst on `s`, best of ROUNDS;
 * GB/s of bytes copied. */
static double rate(void *dst, void *src, size_t size, int reps, tp_stream_t s) {
  ok(tp_memcpy_async(dst, src, size, s), "warm-up copy");
  ok(tp_stream_synchronize(s), "tp_stream_synchronize");
  double best = 0;
  for (int round = 0; round < ROUNDS; round++) {
    double t0 = now_s();
    for (int i = 0; i < reps; i++)
      ok(tp_memcpy_async(dst, src, size, s), "tp_memcpy_async");
    ok(tp_stream_synchronize(s), "tp_stream_synchronize");
    double gbs = (double)size * reps / (now_s() - t0) / 1e9;
    if (gbs > best)
      best = gbs;
  }
  return best;
}

/* Whether the last copy put `value` at dst's first and last 4 KiB. */
static int copied(const void *dst, size_t size, unsigned char value,
                  tp_stream_t s) {
  static unsigned char host[2][4096];
  ok(tp_memcpy_async(host[0], dst, sizeof host[0], s), "read back");
  ok(tp_memcpy_async(host[1], (const char *)dst + size - sizeof host[1],
                     sizeof host[1], s),
     "read back");
  ok(tp_stream_synchronize(s), "tp_stream_synchronize");
  for (size_t i = 0; i < sizeof host[0]; i++)
    if (host[0][i] != value || host[1][i] != value)
      return 0;
  return 1;
}

/* Both directions between a block of device 0 (`remote`) and one of
 * device 1 (`local`): out[0] is 0->1, out[1] is 1->0. */
static void both_ways(void *remote, void *local, size_t size, int reps,
                      tp_stream_t s, double out[2], const char *who) {
  ok(tp_memset_async(remote, 0x5a, size, s), "fill device 0's block");
  out[0] = rate(local, remote, size, reps, s);
  if (!copied(local, size, 0x5a, s)) {
    fprintf(stderr, "peer_copy: %s 0->1 copied the wrong bytes\n", who);
    exit(1);
  }
  ok(tp_memset_async(local, 0xa5, size, s), "fill device 1's block");
  out[1] = rate(remote, local, size, reps, s);
  if (!copied(remote, size, 0xa5, s)) {
    fprintf(stderr, "peer_copy: %s 1->0 copied the wrong bytes\n", who);
    exit(1);
  }
}

static void cell(char *buf, size_t len, double gbs, int have) {
  if (have)
    snprintf(buf, len, "%.1f", gbs);
  else
    snprintf(buf, len, "-");
}

static void ratio(char *buf, size_t len, double a, double b, int have) {
  if (have && b > 0)
    snprintf(buf, len, "%.3f", a / b);
  else
    snprintf(buf, len, "-");
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
  /* Copies are queued on a stream of device 1, with device 1 current. */
  tp_stream_t s1;
  ok(tp_set_device(1), "tp_set_device(1)");
  ok(tp_stream_create(&s1, TP_STREAM_NON_BLOCKING), "stream on device 1");
  tp_pool_t pool0, pool1;
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  ok(tp_pool_create(&pool0, &props), "tidepool pool of device 0");
  props.location.id = 1;
  ok(tp_pool_create(&pool1, &props), "tidepool pool of device 1");
  tp_access_desc_t grant = {{TP_LOCATION_DEVICE, 1, 0}, TP_ACCESS_READ_WRITE};
  ok(tp_pool_set_access(pool0, &grant, 1), "grant device 1");
  int driver = strcmp(platform, "cuda") == 0;
  if (driver && load_driver() != 0) {
    fprintf(stderr, "peer_copy: libcuda lacks the pool calls\n");
    return 1;
  }
  void *dpool0 = driver ? driver_pool(0) : NULL;
  void *dpool1 = driver ? driver_pool(1) : NULL;

  printf("peer_copy: platform %s; copies on a stream of device 1 between a "
         "pool of device 0 (device 1 granted access) and a pool of device 1; "
         "GB/s, best of %d; ratio = tidepool / driver\n",
         platform, ROUNDS);
  printf("%9s | %9s %9s %7s | %9s %9s %7s\n", "size", "tp 0->1", "drv 0->1",
         "ratio", "tp 1->0", "drv 1->0", "ratio");
  const size_t last = quick ? 16 * MiB : 1024 * MiB;
  const size_t per_round = quick ? 64 * MiB : (size_t)4 << 30;
  double worst = 0;
  for (size_t size = 16 * MiB; size <= last; size *= 4) {
    int reps = (int)(per_round / size);
    void *remote = NULL, *local = NULL;
    ok(tp_malloc_from_pool_async(&remote, size, pool0, s1), "alloc on 0");
    ok(tp_malloc_from_pool_async(&local, size, pool1, s1), "alloc on 1");
    double t[2], d[2] = {0, 0};
    both_ways(remote, local, size, reps, s1, t, "tidepool");
    ok(tp_free_async(remote, s1), "tp_free_async");
    ok(tp_free_async(local, s1), "tp_free_async");
    ok(tp_stream_synchronize(s1), "tp_stream_synchronize");
    if (driver) {
      unsigned long long r = 0, l = 0;
      cu_ok(cu.alloc(&r, size, dpool0, s1), "cuMemAllocFromPoolAsync on 0");
      cu_ok(cu.alloc(&l, size, dpool1, s1), "cuMemAllocFromPoolAsync on 1");
      both_ways((void *)(uintptr_t)r, (void *)(uintptr_t)l, size, reps, s1, d,
                "driver");
      cu_ok(cu.free(r, s1), "cuMemFreeAsync");
      cu_ok(cu.free(l, s1), "cuMemFreeAsync");
      ok(tp_stream_synchronize(s1), "tp_stream_synchronize");
    }
    char c[6][24];
    cell(c[0], sizeof c[0], t[0], 1);
    cell(c[1], sizeof c[1], d[0], driver);
    ratio(c[2], sizeof c[2], t[0], d[0], driver);
    cell(c[3], sizeof c[3], t[1], 1);
    cell(c[4], sizeof c[4], d[1], driver);
    ratio(c[5], sizeof c[5], t[1], d[1], driver);
    printf("%5zu MiB | %9s %9s %7s | %9s %9s %7s\n", size / MiB, c[0], c[1],
           c[2], c[3], c[4], c[5]);
    for (int k = 0; driver && k < 2; k++)
      if (d[k] > 0 && (worst == 0 || t[k] / d[k] < worst))
        worst = t[k] / d[k];
  }
  if (driver)
    printf("peer_copy: lowest ratio %.3f (goal: 0.97 or more)\n", worst);
  if (dpool0)
    cu_ok(cu.destroy(dpool0), "cuMemPoolDestroy");
  if (dpool1)
    cu_ok(cu.destroy(dpool1), "cuMemPoolDestroy");
  ok(tp_stream_destroy(s1), "tp_stream_destroy");
  ok(tp_pool_destroy(pool0), "tp_pool_destroy");
  ok(tp_pool_destroy(pool1), "tp_pool_destroy");
  return 0;
}
