/* Which driver calls, made beside a capture, cost it its validity: for each
 * call, one made by another thread or by the capturing thread itself (on
 * another stream), in the thread's default capture mode and in relaxed
 * mode, during a global and during a thread-local capture. Prints, per
 * case, the call's answer, the capture's status after it and the end's
 * answer. Usage: capture_beside. Needs a GPU (the fake driver lacks some of
 * the calls). */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl_table.h"

/* The calls by cuda.h's names, which its macros turn into the versioned
 * symbols (cuMemAlloc is cuMemAlloc_v2), fields and strings alike. */
/* clang-format off */
#define CALLS(X)                       \
  X(cuCtxGetCurrent)                   \
  X(cuCtxSetCurrent)                   \
  X(cuCtxSynchronize)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceGetDefaultMemPool)         \
  X(cuDeviceGetGraphMemAttribute)      \
  X(cuDeviceGraphMemTrim)              \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuEventCreate)                     \
  X(cuEventDestroy)                    \
  X(cuEventQuery)                      \
  X(cuEventRecord)                     \
  X(cuEventSynchronize)                \
  X(cuGraphCreate)                     \
  X(cuGraphDestroy)                    \
  X(cuGraphExecDestroy)                \
  X(cuGraphInstantiate)                \
  X(cuGraphLaunch)                     \
  X(cuInit)                            \
  X(cuLaunchHostFunc)                  \
  X(cuMemAddressFree)                  \
  X(cuMemAddressReserve)               \
  X(cuMemAlloc)                        \
  X(cuMemAllocAsync)                   \
  X(cuMemCreate)                       \
  X(cuMemExportToShareableHandle)      \
  X(cuMemFree)                         \
  X(cuMemFreeAsync)                    \
  X(cuMemGetAllocationGranularity)     \
  X(cuMemGetInfo)                      \
  X(cuMemMap)                          \
  X(cuMemPoolTrimTo)                   \
  X(cuMemRelease)                      \
  X(cuMemSetAccess)                    \
  X(cuMemUnmap)                        \
  X(cuMemsetD8Async)                   \
  X(cuPointerGetAttribute)             \
  X(cuStreamBeginCapture)              \
  X(cuStreamCreate)                    \
  X(cuStreamDestroy)                   \
  X(cuStreamEndCapture)                \
  X(cuStreamGetId)                     \
  X(cuStreamIsCapturing)               \
  X(cuStreamQuery)                     \
  X(cuStreamSynchronize)               \
  X(cuStreamWaitEvent)                 \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuUserObjectCreate)                \
  X(cuUserObjectRelease)
/* clang-format on */
#define STR_(x) #x
#define STR(x) STR_(x)
#define FIELD(n) __typeof__(&n) n;
#define SYM(n) {&d.n, STR(n)},
static struct { CALLS(FIELD) } d;

static CUcontext ctx;
static CUdevice dev;
static CUstream sA, sB;
static CUevent evB;
static size_t gran;
static CUmemAllocationProp prop;
static CUmemGenericAllocationHandle h;
static CUdeviceptr va, pm, dbuf;
static CUmemoryPool defpool;

static void noop(void *a) {
  (void)a;
}

static void map_setup(void) {
  d.cuMemAddressReserve(&va, gran, 0, 0, 0);
  d.cuMemCreate(&h, gran, &prop, 0);
}
static void map_clean(void) {
  d.cuMemUnmap(va, gran);
  d.cuMemRelease(h);
  d.cuMemAddressFree(va, gran);
}
static void mapped_setup(void) {
  map_setup();
  d.cuMemMap(va, gran, 0, h, 0);
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                         CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  d.cuMemSetAccess(va, gran, &acc, 1);
}
static void none(void) {}
static void create_clean(void) {
  d.cuMemRelease(h);
}
static void create_setup(void) {
  d.cuMemCreate(&h, gran, &prop, 0);
}
static void reserve_setup(void) {
  d.cuMemAddressReserve(&va, gran, 0, 0, 0);
}
static void reserve_clean(void) {
  d.cuMemAddressFree(va, gran);
}
static void alloc_setup(void) {
  d.cuMemAlloc(&pm, 4096);
}

static CUresult op_stream_query(void) {
  return d.cuStreamQuery(sB);
}
static CUresult op_stream_sync(void) {
  return d.cuStreamSynchronize(sB);
}
static CUresult op_event_query(void) {
  return d.cuEventQuery(evB);
}
static CUresult op_event_sync(void) {
  return d.cuEventSynchronize(evB);
}
static CUresult op_event_record(void) {
  return d.cuEventRecord(evB, sB);
}
static CUresult op_event_cd(void) {
  CUevent e;
  CUresult r = d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  return r ? r : d.cuEventDestroy(e);
}
static CUresult op_event_rec_destroy(void) {
  CUevent e;
  CUresult r = d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  r = r ? r : d.cuEventRecord(e, sB);
  return r ? r : d.cuEventDestroy(e);
}
static CUresult op_stream_cd(void) {
  CUstream s;
  CUresult r = d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  return r ? r : d.cuStreamDestroy(s);
}
static CUresult op_is_capturing(void) {
  CUstreamCaptureStatus st;
  return d.cuStreamIsCapturing(sB, &st);
}
static CUresult op_get_id(void) {
  unsigned long long id;
  return d.cuStreamGetId(sB, &id);
}
static CUresult op_mem_create(void) {
  return d.cuMemCreate(&h, gran, &prop, 0);
}
static CUresult op_reserve(void) {
  return d.cuMemAddressReserve(&va, gran, 0, 0, 0);
}
static CUresult op_map(void) {
  return d.cuMemMap(va, gran, 0, h, 0);
}
static CUresult op_set_access(void) {
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                         CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  return d.cuMemSetAccess(va, gran, &acc, 1);
}
static CUresult op_unmap(void) {
  return d.cuMemUnmap(va, gran);
}
static CUresult op_release(void) {
  return d.cuMemRelease(h);
}
static CUresult op_addr_free(void) {
  return d.cuMemAddressFree(va, gran);
}
static CUresult op_host_func(void) {
  return d.cuLaunchHostFunc(sB, noop, 0);
}
static CUresult op_wait_event(void) {
  return d.cuStreamWaitEvent(sB, evB, 0);
}
static CUresult op_ctx_sync(void) {
  return d.cuCtxSynchronize();
}
static CUresult op_malloc_async(void) {
  CUdeviceptr p;
  CUresult r = d.cuMemAllocAsync(&p, 4096, sB);
  return r ? r : d.cuMemFreeAsync(p, sB);
}
static CUresult op_mem_info(void) {
  size_t f, t;
  return d.cuMemGetInfo(&f, &t);
}
static CUresult op_memset(void) {
  return d.cuMemsetD8Async(dbuf, 1, 4096, sB);
}
static CUresult op_pool_trim(void) {
  return d.cuMemPoolTrimTo(defpool, 0);
}
static CUresult op_gm_attr(void) {
  unsigned long long v;
  return d.cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
                                        &v);
}
static CUresult op_gm_trim(void) {
  return d.cuDeviceGraphMemTrim(dev);
}
static CUresult op_mem_alloc(void) {
  CUdeviceptr p;
  CUresult r = d.cuMemAlloc(&p, 4096);
  return r ? r : d.cuMemFree(p);
}
static CUresult op_mem_free(void) {
  return d.cuMemFree(pm);
}
static void uo_free(void *p) {
  (void)p;
}
static CUresult op_user_object(void) {
  CUuserObject o;
  CUresult r = d.cuUserObjectCreate(&o, NULL, uo_free, 1,
                                    CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  return r ? r : d.cuUserObjectRelease(o, 1);
}
static CUresult op_granularity(void) {
  size_t g;
  return d.cuMemGetAllocationGranularity(&g, &prop,
                                         CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}
static CUresult op_ptr_attr(void) {
  CUcontext c;
  return d.cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, dbuf);
}
static CUresult op_ctx_get_set(void) {
  CUcontext c;
  CUresult r = d.cuCtxGetCurrent(&c);
  return r ? r : d.cuCtxSetCurrent(c);
}
static CUresult op_graph_small(void) {
  CUgraph g;
  CUgraphExec x;
  CUresult r = d.cuGraphCreate(&g, 0);
  r = r ? r : d.cuGraphInstantiate(&x, g, 0);
  r = r ? r : d.cuGraphLaunch(x, sB);
  if (!r)
    d.cuGraphExecDestroy(x);
  d.cuGraphDestroy(g);
  return r;
}
static CUresult op_export(void) {
  int fd = -1;
  CUresult r = d.cuMemExportToShareableHandle(
      &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return r;
}

typedef struct {
  const char *name;
  void (*setup)(void);
  CUresult (*op)(void);
  void (*clean)(void);
} probe;
static const probe probes[] = {
    {"d.cuStreamQuery(other)", none, op_stream_query, none},
    {"d.cuStreamSynchronize(other)", none, op_stream_sync, none},
    {"d.cuEventQuery(other's)", none, op_event_query, none},
    {"d.cuEventSynchronize(other's)", none, op_event_sync, none},
    {"d.cuEventRecord(other)", none, op_event_record, none},
    {"cuEventCreate+Destroy", none, op_event_cd, none},
    {"cuEventCreate+Record+Destroy", none, op_event_rec_destroy, none},
    {"cuStreamCreate+Destroy", none, op_stream_cd, none},
    {"d.cuStreamIsCapturing(other)", none, op_is_capturing, none},
    {"d.cuStreamGetId(other)", none, op_get_id, none},
    {"cuMemCreate", none, op_mem_create, create_clean},
    {"cuMemAddressReserve", none, op_reserve, reserve_clean},
    {"cuMemMap", map_setup, op_map, map_clean},
    {"cuMemSetAccess", map_setup, op_set_access, map_clean},
    {"cuMemUnmap", mapped_setup, op_unmap, map_clean},
    {"cuMemRelease", create_setup, op_release, none},
    {"cuMemAddressFree", reserve_setup, op_addr_free, none},
    {"cuMemExportToShareableHandle", create_setup, op_export, create_clean},
    {"d.cuLaunchHostFunc(other)", none, op_host_func, none},
    {"d.cuStreamWaitEvent(other)", none, op_wait_event, none},
    {"cuCtxSynchronize", none, op_ctx_sync, none},
    {"cuMemAllocAsync+FreeAsync(other)", none, op_malloc_async, none},
    {"cuMemGetInfo", none, op_mem_info, none},
    {"d.cuMemsetD8Async(other)", none, op_memset, none},
    {"d.cuMemPoolTrimTo(default)", none, op_pool_trim, none},
    {"cuDeviceGetGraphMemAttribute", none, op_gm_attr, none},
    {"cuDeviceGraphMemTrim", none, op_gm_trim, none},
    {"cuMemAlloc+cuMemFree", none, op_mem_alloc, none},
    {"cuMemFree", alloc_setup, op_mem_free, none},
    {"cuUserObjectCreate+Release", none, op_user_object, none},
    {"cuMemGetAllocationGranularity", none, op_granularity, none},
    {"cuPointerGetAttribute", none, op_ptr_attr, none},
    {"cuCtxGetCurrent+SetCurrent", none, op_ctx_get_set, none},
    {"empty graph inst+launch(other)", none, op_graph_small, none},
};

typedef struct {
  const probe *p;
  int relaxed;
  CUresult r;
} job;

static void run_op(job *j) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (j->relaxed)
    d.cuThreadExchangeStreamCaptureMode(&m);
  j->r = j->p->op();
  if (j->relaxed)
    d.cuThreadExchangeStreamCaptureMode(&m);
}
static void *thread_main(void *a) {
  d.cuCtxSetCurrent(ctx);
  run_op(a);
  return NULL;
}

int main(void) {
  static const dl_sym syms[] = {CALLS(SYM)};
  const char *missing =
      dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]);
  if (missing) {
    fprintf(stderr, "libcuda.so.1 lacks %s\n",
            *missing ? missing : "(library)");
    return 1;
  }
  d.cuInit(0);
  d.cuDeviceGet(&dev, 0);
  d.cuDevicePrimaryCtxRetain(&ctx, dev);
  d.cuCtxSetCurrent(ctx);
  d.cuStreamCreate(&sA, CU_STREAM_NON_BLOCKING);
  d.cuStreamCreate(&sB, CU_STREAM_NON_BLOCKING);
  d.cuEventCreate(&evB, CU_EVENT_DISABLE_TIMING);
  d.cuMemAlloc(&dbuf, 1 << 20);
  d.cuDeviceGetDefaultMemPool(&defpool, dev);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  d.cuMemGetAllocationGranularity(&gran, &prop,
                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  printf("%-36s %-8s %-7s %5s %7s %5s\n", "call", "thread", "mode", "ret",
         "status", "end");
  int modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                 CU_STREAM_CAPTURE_MODE_THREAD_LOCAL};
  for (int cm = 0; cm < 2; cm++) {
    printf("== capture mode %s\n", cm == 0 ? "GLOBAL" : "THREAD_LOCAL");
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
      for (int same = 0; same < 2; same++) {
        for (int relaxed = 0; relaxed < 2; relaxed++) {
          const probe *p = &probes[i];
          d.cuEventRecord(evB, sB);
          d.cuStreamSynchronize(sB);
          p->setup();
          job j = {p, relaxed, 0};
          CUresult b = d.cuStreamBeginCapture(sA, modes[cm]);
          d.cuMemsetD8Async(dbuf, 2, 16, sA);
          if (same) {
            run_op(&j);
          } else {
            pthread_t t;
            pthread_create(&t, NULL, thread_main, &j);
            pthread_join(t, NULL);
          }
          CUstreamCaptureStatus st = 9;
          d.cuStreamIsCapturing(sA, &st);
          CUgraph g = NULL;
          CUresult e = d.cuStreamEndCapture(sA, &g);
          if (g)
            d.cuGraphDestroy(g);
          d.cuCtxSynchronize();
          p->clean();
          printf("%-36s %-8s %-7s %5d %7d %5d%s%s\n", p->name,
                 same ? "same" : "other", relaxed ? "relaxed" : "default",
                 (int)j.r, (int)st, (int)e, b ? " (begin failed)" : "",
                 st != CU_STREAM_CAPTURE_STATUS_ACTIVE ? "  <-- INVALIDATED"
                                                       : "");
        }
      }
    }
  }
  printf("DONE\n");
  return 0;
}
