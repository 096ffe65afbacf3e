/* Graph launches with allocations inside: one captured graph of
 * allocations, memsets, copies and frees, built three ways in one run and
 * launched many times each, its output checked byte for byte:
 *   tidepool  tp_stream_begin_capture, tp_malloc_async, tp_graph_launch;
 *   in-driver the driver's own capture and launch (cuStreamBeginCapture,
 *             cuGraphLaunch) around tidepool's allocations, as PyTorch uses
 *             them;
 *   driver    the same graph with the driver's memory nodes
 *             (cuMemAllocAsync during capture).
 * Four more tell apart what a graph launch costs (cuda only): the same
 * work on buffers allocated before the capture, with no memory nodes
 * (plain), with an empty node where each free was (+empty, as a capture
 * around tidepool's frees leaves them), with a user object retained by the
 * graph (+userobj, as tidepool ties graph memory to graphs it did not end),
 * and with both (+both).
 * It prints the host time of a launch call, the time per graph of
 * back-to-back launches, their ratios to the driver's, and the graph
 * memory each reserved (tidepool's TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH and
 * the driver's CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH). On the host platform
 * only the tidepool graph runs. The driver is reached through dlopen, with
 * the few types used laid out as cuda.h declares them. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dl_table.h"
#include "tidepool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define STEPS 8
#define SEGMENTS 10
#define OUT_BYTES (64 * KiB) /* what each step copies out */

typedef int cu_result;
typedef void *cu_stream;
typedef void *cu_graph;
typedef void *cu_exec;
typedef void *cu_node;
typedef void *cu_user_object;
typedef unsigned long long cu_ptr;
enum {
  CU_CAPTURE_GLOBAL = 0,
  CU_GRAPH_MEM_RESERVED_HIGH = 3,
  CU_GRAPH_MEM_USED_CURRENT = 0,
  CU_SET_CAPTURE_DEPENDENCIES = 1,
  CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1,
  CU_GRAPH_USER_OBJECT_MOVE = 1
};

static struct {
  cu_result (*device_get)(int *, int);
  cu_result (*begin)(cu_stream, int);
  cu_result (*end)(cu_stream, cu_graph *);
  cu_result (*instantiate)(cu_exec *, cu_graph, unsigned long long);
  cu_result (*launch)(cu_exec, cu_stream);
  cu_result (*exec_destroy)(cu_exec);
  cu_result (*graph_destroy)(cu_graph);
  cu_result (*alloc)(cu_ptr *, size_t, cu_stream);
  cu_result (*free)(cu_ptr, cu_stream);
  cu_result (*memset)(cu_ptr, unsigned char, size_t, cu_stream);
  cu_result (*memcpy)(cu_ptr, cu_ptr, size_t, cu_stream);
  cu_result (*sync)(cu_stream);
  cu_result (*mem_attr)(int, int, void *);
  cu_result (*trim)(int);
  cu_result (*error_name)(cu_result, const char **);
  cu_result (*capture_info)(cu_stream, int *, unsigned long long *, cu_graph *,
                            const cu_node **, const void **, size_t *);
  cu_result (*add_empty)(cu_node *, cu_graph, const cu_node *, size_t);
  cu_result (*update_deps)(cu_stream, cu_node *, const void *, size_t,
                           unsigned);
  cu_result (*user_object_create)(cu_user_object *, void *, void (*)(void *),
                                  unsigned, unsigned);
  cu_result (*retain_user_object)(cu_graph, cu_user_object, unsigned, unsigned);
} cu;

static int load_driver(void) {
  const dl_sym syms[] = {
      {&cu.device_get, "cuDeviceGet"},
      {&cu.begin, "cuStreamBeginCapture_v2"},
      {&cu.end, "cuStreamEndCapture"},
      {&cu.instantiate, "cuGraphInstantiateWithFlags"},
      {&cu.launch, "cuGraphLaunch"},
      {&cu.exec_destroy, "cuGraphExecDestroy"},
      {&cu.graph_destroy, "cuGraphDestroy"},
      {&cu.alloc, "cuMemAllocAsync"},
      {&cu.free, "cuMemFreeAsync"},
      {&cu.memset, "cuMemsetD8Async"},
      {&cu.memcpy, "cuMemcpyAsync"},
      {&cu.sync, "cuStreamSynchronize"},
      {&cu.mem_attr, "cuDeviceGetGraphMemAttribute"},
      {&cu.trim, "cuDeviceGraphMemTrim"},
      {&cu.error_name, "cuGetErrorName"},
      {&cu.capture_info, "cuStreamGetCaptureInfo_v3"},
      {&cu.add_empty, "cuGraphAddEmptyNode"},
      {&cu.update_deps, "cuStreamUpdateCaptureDependencies_v2"},
      {&cu.user_object_create, "cuUserObjectCreate"},
      {&cu.retain_user_object, "cuGraphRetainUserObject"}};
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

static int failures;

static void tp_ok(tp_error_t e, const char *what) {
  if (e != TP_SUCCESS) {
    fprintf(stderr, "graph_bench: %s: %s\n", what, tp_error_name(e));
    exit(1);
  }
}

static void cu_ok(cu_result r, const char *what) {
  if (r != 0) {
    const char *name = "?";
    cu.error_name(r, &name);
    fprintf(stderr, "graph_bench: %s: %s\n", what, name);
    exit(1);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Step i allocates size_of(i) bytes, fills them with value i + 1, copies
 * OUT_BYTES of them to out + i * OUT_BYTES and frees them after step i + 1
 * has allocated: two allocations are live at a time, so a graph that
 * reuses what it frees needs the two largest neighbours, not the sum. */
static size_t size_of(int i) {
  static const size_t sizes[STEPS] = {4 * MiB, 1 * MiB,   8 * MiB, 2 * MiB,
                                      6 * MiB, 512 * KiB, 3 * MiB, 5 * MiB};
  return sizes[i];
}

/* The graph through tidepool's calls; with drv_graph, captured with the
 * driver's own calls around them instead of tp_stream_begin_capture, and
 * with one more allocation that outlives the launches, in *keep, as a
 * graph's outputs do. */
static tp_graph_t capture_tp(tp_stream_t s, void *out, cu_graph *drv_graph,
                             void **keep) {
  if (drv_graph)
    cu_ok(cu.begin(s, CU_CAPTURE_GLOBAL), "cuStreamBeginCapture");
  else
    tp_ok(tp_stream_begin_capture(s, TP_CAPTURE_MODE_GLOBAL), "begin capture");
  void *prev = NULL;
  for (int i = 0; i < STEPS; i++) {
    void *p = NULL;
    tp_ok(tp_malloc_async(&p, size_of(i), s), "tp_malloc_async in capture");
    tp_ok(tp_memset_async(p, i + 1, size_of(i), s), "memset");
    tp_ok(tp_memcpy_async((char *)out + i * OUT_BYTES, p, OUT_BYTES, s),
          "memcpy");
    if (prev)
      tp_ok(tp_free_async(prev, s), "tp_free_async in capture");
    prev = p;
  }
  tp_ok(tp_free_async(prev, s), "tp_free_async in capture");
  if (keep) {
    tp_ok(tp_malloc_async(keep, MiB, s), "tp_malloc_async in capture");
    tp_ok(tp_memset_async(*keep, 0x5e, MiB, s), "memset");
  }
  tp_graph_t graph = NULL;
  if (drv_graph)
    cu_ok(cu.end(s, drv_graph), "cuStreamEndCapture");
  else
    tp_ok(tp_stream_end_capture(s, &graph), "end capture");
  return graph;
}

static cu_graph capture_driver(tp_stream_t s, cu_ptr out) {
  cu_ok(cu.begin(s, CU_CAPTURE_GLOBAL), "cuStreamBeginCapture");
  cu_ptr prev = 0;
  for (int i = 0; i < STEPS; i++) {
    cu_ptr p = 0;
    cu_ok(cu.alloc(&p, size_of(i), s), "cuMemAllocAsync in capture");
    cu_ok(cu.memset(p, (unsigned char)(i + 1), size_of(i), s), "memset");
    cu_ok(cu.memcpy(out + i * OUT_BYTES, p, OUT_BYTES, s), "memcpy");
    if (prev)
      cu_ok(cu.free(prev, s), "cuMemFreeAsync in capture");
    prev = p;
  }
  cu_ok(cu.free(prev, s), "cuMemFreeAsync in capture");
  cu_graph g = NULL;
  cu_ok(cu.end(s, &g), "cuStreamEndCapture");
  return g;
}

/* What the diagnostic graphs add to the plain work. */
enum { EXTRA_EMPTY = 1, EXTRA_USER_OBJECT = 2 };

/* An empty node after the capturing stream's work, which becomes its
 * position, as tidepool marks a free. */
static void add_empty_node(tp_stream_t s) {
  int status = 0;
  cu_graph g = NULL;
  const cu_node *deps = NULL;
  size_t n = 0;
  cu_ok(cu.capture_info(s, &status, NULL, &g, &deps, NULL, &n),
        "cuStreamGetCaptureInfo");
  cu_node e = NULL;
  cu_ok(cu.add_empty(&e, g, deps, n), "cuGraphAddEmptyNode");
  cu_ok(cu.update_deps(s, &e, NULL, 1, CU_SET_CAPTURE_DEPENDENCIES),
        "cuStreamUpdateCaptureDependencies");
}

static atomic_int user_objects_destroyed;

static void user_object_gone(void *arg) {
  (void)arg;
  atomic_fetch_add(&user_objects_destroyed, 1);
}

/* The same work on buffers allocated before the capture, with `extras`. */
static cu_graph capture_plain(tp_stream_t s, void *out, void *const *bufs,
                              int extras) {
  cu_ok(cu.begin(s, CU_CAPTURE_GLOBAL), "cuStreamBeginCapture");
  for (int i = 0; i < STEPS; i++) {
    cu_ptr p = (cu_ptr)(uintptr_t)bufs[i];
    cu_ok(cu.memset(p, (unsigned char)(i + 1), size_of(i), s), "memset");
    cu_ok(cu.memcpy((cu_ptr)(uintptr_t)out + i * OUT_BYTES, p, OUT_BYTES, s),
          "memcpy");
    if (i > 0 && (extras & EXTRA_EMPTY))
      add_empty_node(s);
  }
  if (extras & EXTRA_EMPTY)
    add_empty_node(s);
  if (extras & EXTRA_USER_OBJECT) {
    int status = 0;
    cu_graph g = NULL;
    cu_ok(cu.capture_info(s, &status, NULL, &g, NULL, NULL, NULL),
          "cuStreamGetCaptureInfo");
    cu_user_object obj = NULL;
    cu_ok(cu.user_object_create(&obj, NULL, user_object_gone, 1,
                                CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
          "cuUserObjectCreate");
    cu_ok(cu.retain_user_object(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE),
          "cuGraphRetainUserObject");
  }
  cu_graph g = NULL;
  cu_ok(cu.end(s, &g), "cuStreamEndCapture");
  return g;
}

/* Checks the output byte for byte, then clears it for the next segment. */
static void check_out(const char *name, void *out, tp_stream_t s) {
  size_t n = STEPS * OUT_BYTES;
  unsigned char *host = malloc(n);
  if (!host)
    exit(1);
  tp_ok(tp_memcpy_async(host, out, n, s), "copy out");
  tp_ok(tp_stream_synchronize(s), "synchronize");
  for (size_t i = 0; i < n; i++) {
    unsigned char want = (unsigned char)(i / OUT_BYTES + 1);
    if (host[i] != want) {
      fprintf(stderr, "graph_bench: %s: byte %zu is %u, expected %u\n", name, i,
              host[i], want);
      failures++;
      break;
    }
  }
  free(host);
  tp_ok(tp_memset_async(out, 0, n, s), "clear");
  tp_ok(tp_stream_synchronize(s), "synchronize");
}

typedef struct variant {
  const char *name;
  int use_tp_launch; /* tp_graph_launch, else cuGraphLaunch */
  tp_graph_exec_t tp_exec;
  cu_exec cu_exec;
  void *out;
  double call_s, wall_s;
  long launches;
} variant;

/* One segment of back-to-back launches, timed, then checked untimed. */
static void run_segment(variant *v, tp_stream_t s, int n) {
  double t0 = now_s(), in_calls = 0;
  for (int i = 0; i < n; i++) {
    double c0 = now_s();
    if (v->use_tp_launch)
      tp_ok(tp_graph_launch(v->tp_exec, s), "tp_graph_launch");
    else
      cu_ok(cu.launch(v->cu_exec, s), "cuGraphLaunch");
    in_calls += now_s() - c0;
  }
  tp_ok(tp_stream_synchronize(s), "synchronize");
  v->wall_s += now_s() - t0;
  v->call_s += in_calls;
  v->launches += n;
  check_out(v->name, v->out, s);
}

int main(int argc, char **argv) {
  long launches = 10000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      launches = 500;
    else if (strcmp(argv[i], "--launches") == 0 && i + 1 < argc)
      launches = strtol(argv[++i], NULL, 10);
  }
  if (launches < SEGMENTS)
    launches = SEGMENTS;
  const char *platform = tp_platform_name();
  if (!platform) {
    fprintf(stderr, "graph_bench: no platform\n");
    return 1;
  }
  int on_cuda = strcmp(platform, "cuda") == 0;
  if (on_cuda && load_driver() != 0) {
    fprintf(stderr, "graph_bench: cuda platform but libcuda lacks a symbol\n");
    return 1;
  }
  tp_stream_t s;
  tp_ok(tp_stream_create(&s, TP_STREAM_NON_BLOCKING), "stream");
  size_t out_bytes = STEPS * OUT_BYTES;

  enum { V_TP, V_MIXED, V_PLAIN, V_EMPTY, V_UOBJ, V_BOTH, V_DRIVER, NV };
  variant vs[NV] = {[V_TP] = {.name = "tidepool", .use_tp_launch = 1},
                    [V_MIXED] = {.name = "in-driver"},
                    [V_PLAIN] = {.name = "plain"},
                    [V_EMPTY] = {.name = "+empty"},
                    [V_UOBJ] = {.name = "+userobj"},
                    [V_BOTH] = {.name = "+both"},
                    [V_DRIVER] = {.name = "driver"}};
  int nv = on_cuda ? NV : 1;
  for (int k = 0; k < nv; k++) {
    tp_ok(tp_malloc_async(&vs[k].out, out_bytes, s), "output buffer");
    tp_ok(tp_memset_async(vs[k].out, 0, out_bytes, s), "clear");
  }
  void *bufs[STEPS] = {0};
  for (int i = 0; on_cuda && i < STEPS; i++)
    tp_ok(tp_malloc_async(&bufs[i], size_of(i), s), "plain buffer");
  tp_ok(tp_stream_synchronize(s), "synchronize");

  tp_graph_t tp_graph = capture_tp(s, vs[V_TP].out, NULL, NULL);
  tp_ok(tp_graph_instantiate(&vs[V_TP].tp_exec, tp_graph, 0), "instantiate");
  /* What one graph holds, before the in-driver graph holds as much. */
  uint64_t tp_reserved = 0, tp_used = 0;
  tp_ok(tp_device_get_graph_mem_attribute(
            0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &tp_reserved),
        "graph memory attribute");
  tp_ok(tp_device_get_graph_mem_attribute(0, TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
                                          &tp_used),
        "graph memory attribute");
  cu_graph graphs[NV] = {0};
  void *keep = NULL;
  if (on_cuda) {
    (void)capture_tp(s, vs[V_MIXED].out, &graphs[V_MIXED], &keep);
    graphs[V_PLAIN] = capture_plain(s, vs[V_PLAIN].out, bufs, 0);
    graphs[V_EMPTY] = capture_plain(s, vs[V_EMPTY].out, bufs, EXTRA_EMPTY);
    graphs[V_UOBJ] = capture_plain(s, vs[V_UOBJ].out, bufs, EXTRA_USER_OBJECT);
    graphs[V_BOTH] =
        capture_plain(s, vs[V_BOTH].out, bufs, EXTRA_EMPTY | EXTRA_USER_OBJECT);
    graphs[V_DRIVER] = capture_driver(s, (cu_ptr)(uintptr_t)vs[V_DRIVER].out);
    for (int k = V_MIXED; k < NV; k++)
      cu_ok(cu.instantiate(&vs[k].cu_exec, graphs[k], 0), "cuGraphInstantiate");
  }

  /* Warm up each, then alternate segments so that drift hits all alike. */
  for (int k = 0; k < nv; k++) {
    run_segment(&vs[k], s, 10);
    vs[k].call_s = vs[k].wall_s = 0;
    vs[k].launches = 0;
  }
  long per = launches / SEGMENTS;
  for (int seg = 0; seg < SEGMENTS; seg++)
    for (int k = 0; k < nv; k++)
      run_segment(&vs[k], s, (int)per);

  uint64_t tp_reserved_high = 0, drv_reserved = 0;
  tp_ok(tp_device_get_graph_mem_attribute(
            0, TP_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &tp_reserved_high),
        "graph memory attribute");
  if (on_cuda) {
    int dev = 0;
    cu_ok(cu.device_get(&dev, 0), "cuDeviceGet");
    cu_ok(cu.mem_attr(dev, CU_GRAPH_MEM_RESERVED_HIGH, &drv_reserved),
          "cuDeviceGetGraphMemAttribute");
  }

  printf("graph_bench: platform %s, %d steps (allocate, memset, copy out, "
         "free), %ld launches each, output checked byte for byte after "
         "every %ld\n",
         platform, STEPS, vs[0].launches, per);
  printf("%-10s %14s %14s %12s %12s\n", "graph", "launch call us",
         "per graph us", "call ratio", "graph ratio");
  const variant *ref = &vs[on_cuda ? V_DRIVER : V_TP];
  for (int k = 0; k < nv; k++) {
    double call = vs[k].call_s / (double)vs[k].launches * 1e6;
    double wall = vs[k].wall_s / (double)vs[k].launches * 1e6;
    double rc = ref->call_s > 0 ? vs[k].call_s / ref->call_s : 0;
    double rw = ref->wall_s > 0 ? vs[k].wall_s / ref->wall_s : 0;
    printf("%-10s %14.3f %14.3f %12.3f %12.3f\n", vs[k].name, call, wall, rc,
           rw);
  }
  if (on_cuda) {
    /* Per graph against the plain work: what each addition costs a launch. */
    double plain = vs[V_PLAIN].wall_s / (double)vs[V_PLAIN].launches;
    double r[NV];
    for (int k = 0; k < NV; k++)
      r[k] = plain > 0 ? vs[k].wall_s / (double)vs[k].launches / plain : 0;
    printf("per graph against plain: +empty %.3f, +userobj %.3f, +both %.3f, "
           "tidepool %.3f, in-driver %.3f, driver %.3f\n",
           r[V_EMPTY], r[V_UOBJ], r[V_BOTH], r[V_TP], r[V_MIXED], r[V_DRIVER]);
  }
  printf("graph memory reserved for one graph: tidepool %.1f MiB (used %.1f "
         "MiB; high %.1f MiB with %d graphs)",
         (double)tp_reserved / MiB, (double)tp_used / MiB,
         (double)tp_reserved_high / MiB, on_cuda ? 2 : 1);
  if (on_cuda)
    printf(", driver reserved high %.1f MiB, ratio %.3f",
           (double)drv_reserved / MiB,
           drv_reserved ? (double)tp_reserved / (double)drv_reserved : 0.0);
  printf("\n");

  /* The driver launched the in-driver graph behind tidepool's back: the
   * allocation that outlives its launches is freed once, not twice. */
  if (keep) {
    tp_error_t first = tp_free_async(keep, s);
    tp_error_t second = tp_free_async(keep, s);
    printf("freeing the in-driver graph's output: %s, then %s\n",
           tp_error_name(first), tp_error_name(second));
    if (first != TP_SUCCESS || second != TP_ERROR_INVALID_VALUE)
      failures++;
  }
  tp_ok(tp_graph_exec_destroy(vs[V_TP].tp_exec), "exec destroy");
  tp_ok(tp_graph_destroy(tp_graph), "graph destroy");
  for (int k = V_MIXED; k < nv; k++) {
    cu_ok(cu.exec_destroy(vs[k].cu_exec), "cuGraphExecDestroy");
    cu_ok(cu.graph_destroy(graphs[k]), "cuGraphDestroy");
  }
  for (int i = 0; on_cuda && i < STEPS; i++)
    tp_ok(tp_free_async(bufs[i], s), "free");
  tp_ok(tp_device_synchronize(), "device synchronize");
  /* Graph memory goes back once the driver has released the graphs (a
   * user object's destructor, which may run a moment later). */
  uint64_t used = UINT64_MAX;
  double deadline = now_s() + 5;
  do {
    tp_ok(tp_device_get_graph_mem_attribute(
              0, TP_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used),
          "graph memory attribute");
  } while (used != 0 && now_s() < deadline);
  printf("graph memory in use after the graphs were destroyed: %llu bytes\n",
         (unsigned long long)used);
  if (used != 0)
    failures++;
  tp_ok(tp_device_graph_mem_trim(0), "trim");
  for (int k = 0; k < nv; k++)
    tp_ok(tp_free_async(vs[k].out, s), "free");
  tp_ok(tp_stream_synchronize(s), "synchronize");
  tp_ok(tp_stream_destroy(s), "stream destroy");
  printf("graph_bench: %s\n", failures ? "CHECKS FAILED" : "all outputs right");
  return failures ? 1 : 0;
}
