/* A host emulation of the CUDA driver, built as libcuda.so.1: devices and
 * primary contexts, streams run in order by a worker thread each, events,
 * VMM memory backed by memfd, and stream capture into replayable graphs. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

/* Its purpose is to run tidepool's cuda platform (src/platform/cuda) where
 * there is no GPU. It implements exactly the driver functions that platform
 * fetches through cuGetProcAddress, each exported under its real name as
 * well, for the tests that look a few up with dlsym. Types and result codes
 * are cuda.h's; where the documentation leaves an answer open, the fake gives
 * the one tidepool's notes record of an H200 with driver 580.
 *
 * Settings, read at cuInit: FAKE_CUDA_DEVICES (devices, default 1, at most
 * 16), FAKE_CUDA_DEVICE_MEMORY (bytes per device, K/M/G/T suffixes, default
 * 4G: cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY past it),
 * FAKE_CUDA_HOST_MEMORY (the same bound for pinned host memory made with
 * cuMemCreate, as the machine's RAM would be; unbounded by default) and
 * CUDA_VISIBLE_DEVICES (ordinals only).
 *
 * Memory outside VMM (cuMemAlloc and the driver's own stream-ordered
 * allocator, which tidepool's interposer passes calls on to) is emulated
 * simply; see its section. The per-thread default stream's variants
 * (_ptsz) are handed out for the calls that have them. The stream memory
 * operations tidepool-replay's lag model holds streams with are there
 * (cuStreamWaitValue32 with GEQ only, cuStreamWriteValue32, on host memory
 * of cuMemHostAlloc, which the device sees at the same address).
 *
 * Not emulated: kernels, contexts other than the primary ones, timing
 * events, graphs launched into a capture (refused), stream priorities, and
 * errors of the device itself (work touching unmapped memory faults the
 * process rather than the context). Potentially unsafe calls during a
 * capture are refused for queries and synchronizations only, not for VMM
 * calls; freeing a reservation that still has mappings is allowed. */

#define FK_API __attribute__((visibility("default")))

/* Enough devices for tidepool's multi-device tests; the special stream
 * encoding of the cuda platform allows far more. */
#define FK_MAX_DEVICES 16
/* The granularity an H200 reports for device memory. */
#define FK_GRAN ((size_t)2 << 20)
#define FK_DEFAULT_MEMORY ((size_t)4 << 30)

#define FK_MAGIC_STREAM 0x5354524du
#define FK_MAGIC_EVENT 0x4556454eu
#define FK_MAGIC_GRAPH 0x47524150u
#define FK_MAGIC_NODE 0x4e4f4445u
#define FK_MAGIC_EXEC 0x45584543u
#define FK_MAGIC_UOBJ 0x554f424au
#define FK_MAGIC_PHYS 0x50485953u

/* ---- global state -----------------------------------------------------------
 * One lock guards everything; work runs outside it. `progress` is broadcast
 * whenever a stream completes an item or a capture changes, and is what
 * synchronizing callers and waiting workers sleep on. */
static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress = PTHREAD_COND_INITIALIZER;
static atomic_int initialized;
static int ndev = 1;
static size_t dev_total[FK_MAX_DEVICES];
/* The machine's ordinal of each visible device (CUDA_VISIBLE_DEVICES). */
static int physical[FK_MAX_DEVICES];
static size_t dev_used[FK_MAX_DEVICES];
static size_t host_total = SIZE_MAX, host_used;
static unsigned long long next_stream_id = 0x1000;
static uint64_t next_capture_id = 1;

static void lock(void) {
  pthread_mutex_lock(&G);
}
static void unlock(void) {
  pthread_mutex_unlock(&G);
}

typedef struct fstream fstream;
typedef struct capture capture;

struct CUctx_st {
  int device;
  int retains;
  fstream *legacy; /* made on first use */
};
static struct CUctx_st ctxs[FK_MAX_DEVICES];
static _Thread_local struct CUctx_st *current;
/* One context deep: the replay pushes the primary context around its
 * calls and pops it after. */
static _Thread_local struct CUctx_st *pushed;
/* The thread's capture interaction mode (cuThreadExchangeStreamCaptureMode):
 * GLOBAL until changed, as in the driver. */
static _Thread_local CUstreamCaptureMode thread_mode =
    CU_STREAM_CAPTURE_MODE_GLOBAL;

/* ---- work -------------------------------------------------------------------
 * One unit of stream work; graph nodes carry the same description, and an
 * exec is an array of them in a topological order. */
enum { W_HOST, W_MEMSET, W_MEMCPY, W_WAIT, W_GRAPH, W_VALUE, W_NONE };

typedef struct fexec fexec;
typedef struct work {
  int kind;
  union {
    struct {
      CUhostFn fn;
      void *arg;
    } host;
    struct {
      unsigned char *p;
      unsigned char v;
      size_t n;
    } set;
    struct {
      void *dst;
      const void *src;
      size_t n;
    } cpy;
    struct {
      fstream *on;
      uint64_t seq;
    } wait;
    struct {
      volatile uint32_t *at;
      uint32_t v;
      bool wait; /* wait until *at >= v (GEQ), or write v */
    } value;
    fexec *exec;
  } u;
} work;

typedef struct item {
  work w;
  struct item *next;
} item;

/* A stream. Its handle is a slot that is handed out again once the stream is
 * destroyed, as the driver reuses handles; the stream itself is never freed,
 * since events and waits refer to positions in it by (stream, count). */
struct fstream {
  struct CUstream_st *slot;
  struct CUctx_st *ctx;
  unsigned flags;
  bool legacy, destroyed, worker;
  unsigned long long id;
  uint64_t enq, done; /* items queued and items completed, ever */
  item *head, *tail;
  pthread_cond_t cv;
  /* Capture: the capture the stream takes part in, and its dependency
   * set, which cuStreamGetCaptureInfo hands out until the next call. */
  capture *cap;
  CUgraphNode *deps;
  size_t ndeps, depcap;
  fstream *all_next;
};
static fstream *all_streams;

struct CUstream_st {
  uint32_t magic;
  fstream *s;
  struct CUstream_st *next_free;
};
static struct CUstream_st *free_slots;
/* The per-thread default stream of each device, made on first use. */
static _Thread_local fstream *per_thread[FK_MAX_DEVICES];
/* A thread's driver state ends with the thread, as the driver's does,
 * through a key made at cuInit: before any key a library that calls cuInit
 * makes later, so its destructor runs first (glibc runs them in the order
 * the keys were made). On an H200 (driver 580) such a library's destructor
 * found no current context, and every call on the per-thread stream or the
 * legacy stream answered INVALID_CONTEXT. */
static pthread_key_t thread_key;
static bool thread_key_made;
/* FAKE_CUDA_ENDED_THREAD=refuse (read as a thread ends): the ended thread
 * may not make a context current again either, a driver stricter than the
 * H200's may be. */
static _Thread_local bool thread_over;

struct CUevent_st {
  uint32_t magic;
  unsigned flags;
  struct CUctx_st *ctx;
  bool recorded;
  fstream *s;
  uint64_t seq;
  uint64_t cap_id; /* last recorded in this capture, 0 for none */
  CUgraphNode *nodes;
  size_t nnodes;
  struct CUevent_st *next_free;
};
static struct CUevent_st *free_events;

/* ---- graphs -------------------------------------------------------------- */
typedef struct uref {
  struct CUuserObject_st *obj;
  unsigned count;
} uref;

struct CUuserObject_st {
  uint32_t magic;
  unsigned refs;
  void *ptr;
  CUhostFn destroy;
  struct CUuserObject_st *next_dead;
};
/* Objects whose last reference went while the lock was held: their
 * destructors run once it is let go (run_dead). */
static struct CUuserObject_st *dead_objs;

struct CUgraphNode_st {
  uint32_t magic;
  CUgraphNodeType type;
  work w;
  struct CUgraph_st *g;
  bool captured; /* made by capturing stream work, not by the graph API */
  CUgraphNode *in, *out;
  size_t nin, capin, nout, capout;
};

struct CUgraph_st {
  uint32_t magic;
  CUgraphNode *nodes;
  size_t n, cap;
  uref *urefs;
  size_t nurefs;
};

struct fexec {
  uint32_t magic;
  work *w;
  size_t n;
  unsigned refs; /* the handle and each launch not yet done */
  uref *urefs;
  size_t nurefs;
  fstream *last_s; /* the previous launch, which the next one follows */
  uint64_t last_seq;
};

struct capture {
  uint64_t id;
  struct CUgraph_st *g;
  fstream *origin;
  CUstreamCaptureMode mode;
  pthread_t thread;
  bool invalid;
  bool to_graph; /* into the application's graph, which outlives it */
  fstream **streams;
  size_t n, cap;
  /* The captured ends of streams destroyed while they took part: each must
   * be joined back to the origin by the end, as a live stream's must. */
  CUgraphNode *left;
  size_t nleft, capleft;
  capture *next;
};
static capture *captures;

/* ---- helpers ------------------------------------------------------------- */

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return true;
  size_t c = *cap ? *cap * 2 : 8;
  while (c < need)
    c *= 2;
  void *p = realloc(*arr, c * elem);
  if (!p)
    return false;
  *arr = p;
  *cap = c;
  return true;
}

static size_t parse_size(const char *s, size_t dflt) {
  if (!s || !*s)
    return dflt;
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  switch (*end) {
  case 'k':
  case 'K': v <<= 10; break;
  case 'm':
  case 'M': v <<= 20; break;
  case 'g':
  case 'G': v <<= 30; break;
  case 't':
  case 'T': v <<= 40; break;
  default: break;
  }
  return v ? (size_t)v : dflt;
}

static void run_dead(void) {
  for (;;) {
    lock();
    struct CUuserObject_st *o = dead_objs;
    if (o)
      dead_objs = o->next_dead;
    unlock();
    if (!o)
      return;
    /* The driver runs destructors on a thread of its own; here the thread
     * that dropped the last reference runs it, once the lock is let go, so
     * that a destructor may call back in. */
    o->destroy(o->ptr);
    o->magic = 0;
    free(o);
  }
}

static void uobj_put(struct CUuserObject_st *o, unsigned n) {
  o->refs -= n;
  if (o->refs == 0) {
    o->next_dead = dead_objs;
    dead_objs = o;
  }
}

static void urefs_put(uref *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    uobj_put(r[i].obj, r[i].count);
}

/* ---- initialisation and devices ------------------------------------------ */

/* The thread's per-thread streams are destroyed (their queued work still
 * runs, and the legacy stream still waits for it) and it has no context. */
static void thread_ends(void *arg) {
  (void)arg;
  lock();
  for (int d = 0; d < FK_MAX_DEVICES; d++) {
    fstream *s = per_thread[d];
    if (!s)
      continue;
    s->destroyed = true;
    pthread_cond_signal(&s->cv);
    per_thread[d] = NULL;
  }
  current = NULL;
  pushed = NULL;
  const char *ended = getenv("FAKE_CUDA_ENDED_THREAD");
  thread_over = ended && strcmp(ended, "refuse") == 0;
  unlock();
  run_dead();
}

/* The thread has driver state that its end takes down. */
static void thread_touch(void) {
  if (thread_key_made && !pthread_getspecific(thread_key))
    (void)pthread_setspecific(thread_key, (void *)1);
}

FK_API CUresult CUDAAPI cuInit(unsigned int Flags) {
  if (Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  if (!atomic_load(&initialized)) {
    thread_key_made = pthread_key_create(&thread_key, thread_ends) == 0;
    const char *n = getenv("FAKE_CUDA_DEVICES");
    if (n && *n) {
      ndev = atoi(n);
      if (ndev < 0 || ndev > FK_MAX_DEVICES)
        ndev = 1;
    }
    /* CUDA_VISIBLE_DEVICES as the driver reads it: ordinals of the
     * machine's devices, up to the first that is not one. */
    for (int i = 0; i < FK_MAX_DEVICES; i++)
      physical[i] = i;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis) {
      int seen = 0;
      char *end;
      for (const char *p = vis; seen < ndev; p = end + 1) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= ndev || (*end && *end != ','))
          break;
        physical[seen++] = (int)v;
        if (!*end)
          break;
      }
      ndev = seen;
    }
    size_t mem =
        parse_size(getenv("FAKE_CUDA_DEVICE_MEMORY"), FK_DEFAULT_MEMORY);
    mem -= mem % FK_GRAN;
    for (int i = 0; i < FK_MAX_DEVICES; i++) {
      dev_total[i] = mem;
      ctxs[i].device = i;
    }
    host_total = parse_size(getenv("FAKE_CUDA_HOST_MEMORY"), SIZE_MAX);
    host_total -= host_total % FK_GRAN;
    atomic_store(&initialized, 1);
  }
  unlock();
  return ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

#define NEED_INIT()                                                            \
  do {                                                                         \
    if (!atomic_load(&initialized))                                            \
      return CUDA_ERROR_NOT_INITIALIZED;                                       \
  } while (0)

static bool valid_dev(CUdevice d) {
  return d >= 0 && d < ndev;
}

FK_API CUresult CUDAAPI cuDeviceGetCount(int *count) {
  NEED_INIT();
  if (!count)
    return CUDA_ERROR_INVALID_VALUE;
  *count = ndev;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  NEED_INIT();
  if (!device)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(ordinal))
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                             CUdevice dev) {
  NEED_INIT();
  if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  NEED_INIT();
  if (!bytes)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  *bytes = dev_total[dev];
  return CUDA_SUCCESS;
}

/* Distinct per device and the same in every process, as a real device's. */
FK_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  NEED_INIT();
  if (!uuid)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  memcpy(uuid->bytes, "fake-cuda-dev-\0\0", 16);
  uuid->bytes[15] = (char)(physical[dev] + 1);
  return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------ */

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx,
                                                 CUdevice dev) {
  NEED_INIT();
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  lock();
  ctxs[dev].retains++;
  unlock();
  *pctx = &ctxs[dev];
  return CUDA_SUCCESS;
}

static bool valid_ctx(CUcontext c) {
  return c >= &ctxs[0] && c < &ctxs[ndev] &&
         ((uintptr_t)c - (uintptr_t)ctxs) % sizeof ctxs[0] == 0;
}

FK_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  NEED_INIT();
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  *pctx = current;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  NEED_INIT();
  if ((ctx && !valid_ctx(ctx)) || thread_over)
    return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  if (ctx)
    thread_touch();
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
  NEED_INIT();
  if (!device)
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  *device = current->device;
  return CUDA_SUCCESS;
}

/* ---- streams: making them and their workers ------------------------------ */

static void *worker_main(void *arg);

static fstream *stream_new(struct CUctx_st *ctx, unsigned flags, bool legacy) {
  fstream *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->ctx = ctx;
  s->flags = flags;
  s->legacy = legacy;
  s->id = next_stream_id++;
  pthread_cond_init(&s->cv, NULL);
  s->all_next = all_streams;
  all_streams = s;
  return s;
}

static fstream *legacy_of(struct CUctx_st *ctx) {
  if (!ctx->legacy)
    ctx->legacy = stream_new(ctx, 0, true);
  return ctx->legacy;
}

/* Resolves a handle (held lock). NULL and CU_STREAM_LEGACY are the current
 * context's legacy stream, as the legacy-stream entry points mean them. */
static CUresult stream_of(CUstream h, fstream **out) {
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    if (!current)
      return CUDA_ERROR_INVALID_CONTEXT;
    fstream **pt = &per_thread[current->device];
    if (h == CU_STREAM_PER_THREAD && !*pt) {
      *pt = stream_new(current, 0, false);
      thread_touch();
    }
    *out = h == CU_STREAM_PER_THREAD ? *pt : legacy_of(current);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (h->magic != FK_MAGIC_STREAM || !h->s)
    return CUDA_ERROR_INVALID_HANDLE;
  *out = h->s;
  return CUDA_SUCCESS;
}

static bool blocking(const fstream *s) {
  return !(s->flags & CU_STREAM_NON_BLOCKING);
}

static bool pending(const fstream *s) {
  return s->done < s->enq;
}

static CUresult push(fstream *s, const work *w) {
  item *it = malloc(sizeof *it);
  if (!it)
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (!s->worker) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, worker_main, s);
    pthread_attr_destroy(&a);
    if (rc != 0) {
      free(it);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->worker = true;
  }
  it->w = *w;
  it->next = NULL;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->enq++;
  pthread_cond_signal(&s->cv);
  return CUDA_SUCCESS;
}

static CUresult push_wait(fstream *s, fstream *on, uint64_t seq) {
  work w = {.kind = W_WAIT, .u.wait = {on, seq}};
  return push(s, &w);
}

/* The legacy stream's implicit synchronization: its work waits for all
 * work queued before it on the context's blocking streams, and theirs for
 * its. Put in front of work (or an event's position) on s. */
static CUresult implicit_waits(fstream *s) {
  if (!blocking(s))
    return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  if (s->legacy) {
    for (fstream *t = all_streams; t && r == CUDA_SUCCESS; t = t->all_next)
      if (t != s && t->ctx == s->ctx && blocking(t) && pending(t))
        r = push_wait(s, t, t->enq);
  } else if (s->ctx->legacy && pending(s->ctx->legacy)) {
    r = push_wait(s, s->ctx->legacy, s->ctx->legacy->enq);
  }
  return r;
}

static void run_work(const work *w);

static void *worker_main(void *arg) {
  fstream *s = arg;
  lock();
  for (;;) {
    while (!s->head && !s->destroyed)
      pthread_cond_wait(&s->cv, &G);
    if (!s->head)
      break;
    item *it = s->head;
    if (it->w.kind == W_WAIT) {
      while (it->w.u.wait.on->done < it->w.u.wait.seq)
        pthread_cond_wait(&progress, &G);
    } else {
      unlock();
      run_work(&it->w);
      lock();
    }
    s->head = it->next;
    if (!s->head)
      s->tail = NULL;
    s->done++;
    if (it->w.kind == W_GRAPH) {
      fexec *e = it->w.u.exec;
      if (--e->refs == 0) {
        urefs_put(e->urefs, e->nurefs);
        free(e->urefs);
        free(e->w);
        e->magic = 0;
        free(e);
      }
    }
    free(it);
    pthread_cond_broadcast(&progress);
    if (dead_objs) {
      unlock();
      run_dead();
      lock();
    }
  }
  s->worker = false;
  unlock();
  return NULL;
}

/* ---- capture state ------------------------------------------------------- */

static capture *capture_find(uint64_t id) {
  for (capture *c = captures; c; c = c->next)
    if (c->id == id)
      return c;
  return NULL;
}

static void invalidate(capture *c) {
  c->invalid = true;
  pthread_cond_broadcast(&progress);
}

static void graph_free(struct CUgraph_st *g);

/* Ends a capture for all its streams; its graph goes unless kept. */
static void capture_end(capture *c, bool keep_graph) {
  for (size_t i = 0; i < c->n; i++) {
    c->streams[i]->cap = NULL;
    c->streams[i]->ndeps = 0;
  }
  capture **pp = &captures;
  while (*pp != c)
    pp = &(*pp)->next;
  *pp = c->next;
  if (!keep_graph && !c->to_graph)
    graph_free(c->g);
  free(c->streams);
  free(c->left);
  free(c);
}

static bool set_deps(fstream *s, const CUgraphNode *nodes, size_t n) {
  if (!grow((void **)&s->deps, &s->depcap, n, sizeof *nodes))
    return false;
  if (n)
    memmove(s->deps, nodes, n * sizeof *nodes);
  s->ndeps = n;
  return true;
}

static bool add_deps(fstream *s, const CUgraphNode *nodes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bool have = false;
    for (size_t j = 0; j < s->ndeps && !have; j++)
      have = s->deps[j] == nodes[i];
    if (have)
      continue;
    if (!grow((void **)&s->deps, &s->depcap, s->ndeps + 1, sizeof *nodes))
      return false;
    s->deps[s->ndeps++] = nodes[i];
  }
  return true;
}

/* Whether a blocking stream of the legacy stream's context captures: the
 * legacy stream then may not be used, since its implicit synchronization
 * would reach into the capture. */
static bool implicit_conflict(const fstream *s, bool invalidate_them) {
  if (!s->legacy)
    return false;
  bool found = false;
  for (fstream *t = all_streams; t; t = t->all_next)
    if (t->cap && t->ctx == s->ctx && blocking(t)) {
      found = true;
      if (invalidate_them)
        invalidate(t->cap);
    }
  return found;
}

/* Whether this thread is barred from a potentially unsafe call (a query or
 * a synchronization) by the capture interaction rules of
 * cuThreadExchangeStreamCaptureMode; the captures that bar it are
 * invalidated, as the driver does. */
static bool unsafe_barred(void) {
  if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return false;
  bool barred = false;
  /* An invalidated capture is still an ongoing sequence until it ends
   * (CUDA's documents bar unsafe calls during "an ongoing capture
   * sequence"), and keeps barring them, as the host platform does. */
  for (capture *c = captures; c; c = c->next) {
    if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
      continue;
    bool mine = pthread_equal(c->thread, pthread_self());
    if (mine || (thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                 c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      if (!c->invalid)
        invalidate(c);
      barred = true;
    }
  }
  return barred;
}

/* ---- graph nodes --------------------------------------------------------- */

static bool edge_add(CUgraphNode from, CUgraphNode to) {
  if (!grow((void **)&from->out, &from->capout, from->nout + 1,
            sizeof(CUgraphNode)) ||
      !grow((void **)&to->in, &to->capin, to->nin + 1, sizeof(CUgraphNode)))
    return false;
  from->out[from->nout++] = to;
  to->in[to->nin++] = from;
  return true;
}

static bool has_edge(CUgraphNode from, CUgraphNode to) {
  for (size_t i = 0; i < from->nout; i++)
    if (from->out[i] == to)
      return true;
  return false;
}

static bool node_ok(CUgraphNode n) {
  return n && n->magic == FK_MAGIC_NODE;
}

static CUresult node_new(struct CUgraph_st *g, CUgraphNodeType type,
                         const work *w, const CUgraphNode *deps, size_t ndeps,
                         CUgraphNode *out) {
  for (size_t i = 0; i < ndeps; i++)
    if (!node_ok(deps[i]) || deps[i]->g != g)
      return CUDA_ERROR_INVALID_VALUE;
  CUgraphNode n = calloc(1, sizeof *n);
  if (!n || !grow((void **)&g->nodes, &g->cap, g->n + 1, sizeof n)) {
    free(n);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  n->magic = FK_MAGIC_NODE;
  n->type = type;
  n->g = g;
  if (w)
    n->w = *w;
  else
    n->w.kind = W_NONE;
  for (size_t i = 0; i < ndeps; i++)
    if (!has_edge(deps[i], n) && !edge_add(deps[i], n)) {
      free(n->in);
      free(n);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  g->nodes[g->n++] = n;
  *out = n;
  return CUDA_SUCCESS;
}

static void list_remove(CUgraphNode *arr, size_t *n, CUgraphNode v) {
  for (size_t i = 0; i < *n; i++)
    if (arr[i] == v) {
      arr[i] = arr[--*n];
      return;
    }
}

static void node_free(CUgraphNode n) {
  for (size_t i = 0; i < n->nin; i++)
    list_remove(n->in[i]->out, &n->in[i]->nout, n);
  for (size_t i = 0; i < n->nout; i++)
    list_remove(n->out[i]->in, &n->out[i]->nin, n);
  list_remove(n->g->nodes, &n->g->n, n);
  free(n->in);
  free(n->out);
  n->magic = 0;
  free(n);
}

static void graph_free(struct CUgraph_st *g) {
  while (g->n)
    node_free(g->nodes[g->n - 1]);
  free(g->nodes);
  urefs_put(g->urefs, g->nurefs);
  free(g->urefs);
  g->magic = 0;
  free(g);
}

/* ---- stream work --------------------------------------------------------- */

/* Resolves the stream of an enqueueing call and applies the capture rules:
 * *cap_out is the capture the work goes into, or NULL for real work. */
static CUresult enqueue_begin(CUstream h, fstream **out, capture **cap_out) {
  CUresult r = stream_of(h, out);
  if (r != CUDA_SUCCESS)
    return r;
  *cap_out = NULL;
  if (implicit_conflict(*out, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  capture *c = (*out)->cap;
  if (c && c->invalid)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  *cap_out = c;
  return CUDA_SUCCESS;
}

static CUresult submit(CUstream h, const work *w, CUgraphNodeType type) {
  fstream *s;
  capture *c;
  lock();
  CUresult r = enqueue_begin(h, &s, &c);
  if (r == CUDA_SUCCESS && c) {
    CUgraphNode n = NULL;
    r = node_new(c->g, type, w, s->deps, s->ndeps, &n);
    if (r == CUDA_SUCCESS) {
      n->captured = true;
      set_deps(s, &n, 1);
    }
  } else if (r == CUDA_SUCCESS) {
    r = implicit_waits(s);
    if (r == CUDA_SUCCESS)
      r = push(s, w);
  }
  unlock();
  return r;
}

/* Where a mapping of the fake's VMM memory is found, memory is checked for
 * access by the device; other addresses are taken as host memory. */
static bool access_ok(uintptr_t p, size_t n, int device, bool write);
static bool in_reserved(uintptr_t p);

static int ctx_device_for(fstream *s) {
  return current ? current->device : s->ctx->device;
}

FK_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc,
                                        size_t N, CUstream hStream) {
  NEED_INIT();
  if (N == 0)
    return CUDA_SUCCESS;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  bool ok = r == CUDA_SUCCESS &&
            access_ok((uintptr_t)dstDevice, N, s->ctx->device, true);
  unlock();
  if (r != CUDA_SUCCESS)
    return r;
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  work w = {.kind = W_MEMSET,
            .u.set = {(unsigned char *)(uintptr_t)dstDevice, uc, N}};
  return submit(hStream, &w, CU_GRAPH_NODE_TYPE_MEMSET);
}

/* The driver checks both pointers against the thread's current context,
 * not the stream's (see tidepool's cuda_stream.c): so does the fake. */
FK_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                                      size_t ByteCount, CUstream hStream) {
  NEED_INIT();
  if (ByteCount == 0)
    return CUDA_SUCCESS;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  bool ok = false;
  if (r == CUDA_SUCCESS) {
    int d = ctx_device_for(s);
    ok = access_ok((uintptr_t)dst, ByteCount, d, true) &&
         access_ok((uintptr_t)src, ByteCount, d, false);
  }
  unlock();
  if (r != CUDA_SUCCESS)
    return r;
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  work w = {.kind = W_MEMCPY,
            .u.cpy = {(void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                      ByteCount}};
  return submit(hStream, &w, CU_GRAPH_NODE_TYPE_MEMCPY);
}

FK_API CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn,
                                         void *userData) {
  NEED_INIT();
  if (!fn)
    return CUDA_ERROR_INVALID_VALUE;
  work w = {.kind = W_HOST, .u.host = {fn, userData}};
  return submit(hStream, &w, CU_GRAPH_NODE_TYPE_HOST);
}

static void run_work(const work *w) {
  switch (w->kind) {
  case W_HOST: w->u.host.fn(w->u.host.arg); break;
  case W_MEMSET: memset(w->u.set.p, w->u.set.v, w->u.set.n); break;
  case W_MEMCPY: memmove(w->u.cpy.dst, w->u.cpy.src, w->u.cpy.n); break;
  case W_GRAPH:
    for (size_t i = 0; i < w->u.exec->n; i++)
      run_work(&w->u.exec->w[i]);
    break;
  case W_VALUE:
    if (!w->u.value.wait)
      __atomic_store_n(w->u.value.at, w->u.value.v, __ATOMIC_RELEASE);
    while (w->u.value.wait &&
           __atomic_load_n(w->u.value.at, __ATOMIC_ACQUIRE) < w->u.value.v)
      usleep(50);
    break;
  default: break;
  }
}

/* ---- stream memory operations and host memory the device maps ------------
 * What tidepool-replay's lag model uses to hold a stream: a wait on a word
 * of host memory (GEQ only), and a write of it. Host memory allocated here
 * is the device's at the same address, as with unified addressing. */
FK_API CUresult CUDAAPI cuStreamWaitValue32(CUstream hStream, CUdeviceptr addr,
                                            cuuint32_t value,
                                            unsigned int flags) {
  NEED_INIT();
  if (!addr || addr % 4 || flags != CU_STREAM_WAIT_VALUE_GEQ)
    return CUDA_ERROR_INVALID_VALUE;
  work w = {.kind = W_VALUE,
            .u.value = {(volatile uint32_t *)(uintptr_t)addr, value, true}};
  return submit(hStream, &w, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}

FK_API CUresult CUDAAPI cuStreamWriteValue32(CUstream hStream, CUdeviceptr addr,
                                             cuuint32_t value,
                                             unsigned int flags) {
  NEED_INIT();
  if (!addr || addr % 4 ||
      (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
    return CUDA_ERROR_INVALID_VALUE;
  work w = {.kind = W_VALUE,
            .u.value = {(volatile uint32_t *)(uintptr_t)addr, value, false}};
  return submit(hStream, &w, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
}

FK_API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize,
                                       unsigned int Flags) {
  NEED_INIT();
  (void)Flags;
  if (!pp || !bytesize)
    return CUDA_ERROR_INVALID_VALUE;
  *pp = calloc(1, bytesize);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FK_API CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p,
                                                  unsigned int Flags) {
  NEED_INIT();
  if (!pdptr || !p || Flags)
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemFreeHost(void *p) {
  NEED_INIT();
  free(p);
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  NEED_INIT();
  if (!valid_ctx(ctx) || thread_over)
    return CUDA_ERROR_INVALID_CONTEXT;
  pushed = current;
  current = ctx;
  thread_touch();
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  NEED_INIT();
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx)
    *pctx = current;
  current = pushed;
  pushed = NULL;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  NEED_INIT();
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  lock();
  CUresult r = ctxs[dev].retains ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (ctxs[dev].retains)
    ctxs[dev].retains--;
  unlock();
  return r;
}

/* ---- streams: the API ---------------------------------------------------- */

FK_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  NEED_INIT();
  if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  lock();
  struct CUstream_st *slot = free_slots;
  if (slot)
    free_slots = slot->next_free;
  else
    slot = calloc(1, sizeof *slot);
  fstream *s = slot ? stream_new(current, Flags, false) : NULL;
  if (!s) {
    if (slot) {
      slot->next_free = free_slots;
      free_slots = slot;
    }
    unlock();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  slot->magic = FK_MAGIC_STREAM;
  slot->s = s;
  s->slot = slot;
  unlock();
  *phStream = slot;
  return CUDA_SUCCESS;
}

/* The stream's work still runs; its worker leaves once it is drained. A
 * stream destroyed while it captures takes the capture down with it. */
FK_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  NEED_INIT();
  if (!hStream || hStream == CU_STREAM_LEGACY ||
      hStream == CU_STREAM_PER_THREAD)
    return CUDA_ERROR_INVALID_HANDLE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS) {
    if (s->cap) {
      capture *c = s->cap;
      /* The origin's destroy ends its capture; a stream that joined one
       * leaves it, its work staying in the graph (CUDA's graphMemoryNodes
       * sample destroys such a stream, joined back, before the end). */
      if (c->origin == s) {
        capture_end(c, false);
      } else {
        for (size_t i = 0; i < s->ndeps; i++)
          if (s->deps[i]->captured && grow((void **)&c->left, &c->capleft,
                                           c->nleft + 1, sizeof *c->left))
            c->left[c->nleft++] = s->deps[i];
        for (size_t i = 0; i < c->n; i++)
          if (c->streams[i] == s)
            c->streams[i] = c->streams[--c->n];
        s->cap = NULL;
      }
    }
    s->destroyed = true;
    s->slot = NULL;
    hStream->s = NULL;
    hStream->next_free = free_slots;
    free_slots = hStream;
    pthread_cond_signal(&s->cv);
  }
  unlock();
  run_dead();
  return r;
}

/* The driver refuses a stream's id, device and flags while it captures, and
 * invalidates the capture (seen on an H200; see tidepool's cuda_stream.c). */
static CUresult stream_question(CUstream h, fstream **s) {
  CUresult r = stream_of(h, s);
  if (r == CUDA_SUCCESS && (*s)->cap) {
    invalidate((*s)->cap);
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return r;
}

/* A test's hook: run once, outside the lock, right after the next
 * successful cuStreamGetId of `stream` has read the id, so that a test can
 * let the stream's owner act between a caller's question and what the
 * caller does with the answer (a destroy, a new stream on the handle), which
 * a real driver allows at any moment. Not a driver function. */
static struct {
  CUstream stream;
  void (*fn)(void *);
  void *arg;
} after_get_id;

FK_API void fake_cuda_after_next_get_id(CUstream stream, void (*fn)(void *),
                                        void *arg) {
  lock();
  after_get_id.stream = stream;
  after_get_id.fn = fn;
  after_get_id.arg = arg;
  unlock();
}

/* How many times the process asked a stream's id, for the tests of calls
 * that should ask none. */
static _Atomic unsigned long long id_questions;

FK_API unsigned long long fake_cuda_id_questions(void) {
  return atomic_load(&id_questions);
}

FK_API CUresult CUDAAPI cuStreamGetId(CUstream hStream,
                                      unsigned long long *streamId) {
  atomic_fetch_add(&id_questions, 1);
  NEED_INIT();
  if (!streamId)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_question(hStream, &s);
  if (r == CUDA_SUCCESS)
    *streamId = s->id;
  void (*fn)(void *) = NULL;
  void *arg = NULL;
  if (r == CUDA_SUCCESS && after_get_id.fn && after_get_id.stream == hStream) {
    fn = after_get_id.fn;
    arg = after_get_id.arg;
    after_get_id.fn = NULL;
  }
  unlock();
  if (fn)
    fn(arg);
  return r;
}

FK_API CUresult CUDAAPI cuStreamGetFlags(CUstream hStream,
                                         unsigned int *flags) {
  NEED_INIT();
  if (!flags)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_question(hStream, &s);
  if (r == CUDA_SUCCESS)
    *flags = s->flags;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice *device) {
  NEED_INIT();
  if (!device)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_question(hStream, &s);
  if (r == CUDA_SUCCESS)
    *device = s->ctx->device;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  NEED_INIT();
  if (!pctx)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS)
    *pctx = s->ctx;
  unlock();
  return r;
}

/* The checks of a query or synchronization of a stream: not the capturing
 * stream itself, not the legacy stream while a blocking stream captures, and
 * not while the thread's capture mode bars unsafe calls. */
static CUresult sync_begin(CUstream h, fstream **s) {
  CUresult r = stream_of(h, s);
  if (r != CUDA_SUCCESS)
    return r;
  if ((*s)->cap) {
    invalidate((*s)->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (implicit_conflict(*s, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (unsafe_barred())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  NEED_INIT();
  lock();
  fstream *s;
  CUresult r = sync_begin(hStream, &s);
  if (r == CUDA_SUCCESS && pending(s))
    r = CUDA_ERROR_NOT_READY;
  unlock();
  return r;
}

/* How many context, stream and event synchronizes the process made, for
 * the interposer's tests that the application's are the only ones. */
static _Atomic unsigned long long ctx_syncs, stream_syncs, event_syncs;

FK_API unsigned long long fake_cuda_event_syncs(void) {
  return atomic_load(&event_syncs);
}

FK_API unsigned long long fake_cuda_ctx_syncs(void) {
  return atomic_load(&ctx_syncs);
}

FK_API unsigned long long fake_cuda_stream_syncs(void) {
  return atomic_load(&stream_syncs);
}

FK_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  atomic_fetch_add(&stream_syncs, 1);
  NEED_INIT();
  lock();
  fstream *s;
  CUresult r = sync_begin(hStream, &s);
  if (r == CUDA_SUCCESS) {
    uint64_t target = s->enq;
    while (s->done < target)
      pthread_cond_wait(&progress, &G);
  }
  unlock();
  run_dead();
  return r;
}

FK_API CUresult CUDAAPI cuCtxSynchronize(void) {
  atomic_fetch_add(&ctx_syncs, 1);
  NEED_INIT();
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  lock();
  CUresult r =
      unsafe_barred() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
  /* Whatever the modes: a capture of the context, any thread's, is
   * invalidated and the call refused, even from a thread in relaxed mode
   * (H100, driver 580, .device's unsafe-call probe of 2026-12-06). */
  for (capture *c = captures; c; c = c->next)
    if (c->origin->ctx == current) {
      invalidate(c);
      r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  /* Every stream's work queued before the call; a stream keeps counting
   * after it, so its count now is the target. */
  for (fstream *s = all_streams; s && r == CUDA_SUCCESS; s = s->all_next) {
    if (s->ctx != current)
      continue;
    uint64_t target = s->enq;
    while (s->done < target)
      pthread_cond_wait(&progress, &G);
  }
  unlock();
  run_dead();
  return r;
}

/* ---- events -------------------------------------------------------------- */

static bool event_ok(CUevent e) {
  return e && e->magic == FK_MAGIC_EVENT;
}

FK_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  NEED_INIT();
  unsigned known =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!phEvent || (Flags & ~known))
    return CUDA_ERROR_INVALID_VALUE;
  if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  lock();
  /* Destroyed events are kept and handed out again, as the driver reuses
   * handles: a stale handle then names a live event, never freed memory. */
  CUevent e = free_events;
  if (e)
    free_events = e->next_free;
  else
    e = calloc(1, sizeof *e);
  unlock();
  if (!e)
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUgraphNode *keep = e->nodes;
  *e = (struct CUevent_st){
      .magic = FK_MAGIC_EVENT, .flags = Flags, .ctx = current, .nodes = keep};
  *phEvent = e;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_HANDLE;
  if (event_ok(hEvent)) {
    hEvent->magic = 0;
    hEvent->next_free = free_events;
    free_events = hEvent;
    r = CUDA_SUCCESS;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  NEED_INIT();
  lock();
  fstream *s;
  capture *c;
  CUresult r = event_ok(hEvent) ? enqueue_begin(hStream, &s, &c)
                                : CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS && s->ctx != hEvent->ctx)
    r = CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS && c) {
    /* A record in a capture is no node: it names the stream's position in
     * the graph, for waits to join. */
    size_t cap = hEvent->nnodes;
    if (!grow((void **)&hEvent->nodes, &cap, s->ndeps, sizeof(CUgraphNode)))
      r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
      if (s->ndeps)
        memcpy(hEvent->nodes, s->deps, s->ndeps * sizeof(CUgraphNode));
      hEvent->nnodes = s->ndeps;
      hEvent->cap_id = c->id;
    }
  } else if (r == CUDA_SUCCESS) {
    r = implicit_waits(s);
    if (r == CUDA_SUCCESS) {
      hEvent->cap_id = 0;
      hEvent->recorded = true;
      hEvent->s = s;
      hEvent->seq = s->enq;
    }
  }
  unlock();
  return r;
}

static bool event_done(CUevent e) {
  return !e->recorded || e->s->done >= e->seq;
}

/* An event last recorded in a capture has no completion to ask about, and
 * asking costs that capture its validity (an H100, driver 580: a query of
 * an event recorded in a global capture, in relaxed mode, and the capture's
 * end answered INVALIDATED). */
static CUresult event_sync_begin(CUevent e) {
  if (!event_ok(e))
    return CUDA_ERROR_INVALID_HANDLE;
  if (e->cap_id) {
    capture *c = capture_find(e->cap_id);
    if (c)
      invalidate(c);
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (unsafe_barred())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  NEED_INIT();
  lock();
  CUresult r = event_sync_begin(hEvent);
  if (r == CUDA_SUCCESS && !event_done(hEvent))
    r = CUDA_ERROR_NOT_READY;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  atomic_fetch_add(&event_syncs, 1);
  NEED_INIT();
  lock();
  CUresult r = event_sync_begin(hEvent);
  if (r == CUDA_SUCCESS) {
    fstream *s = hEvent->s;
    uint64_t seq = hEvent->seq;
    while (hEvent->recorded && s->done < seq)
      pthread_cond_wait(&progress, &G);
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                          unsigned int Flags) {
  NEED_INIT();
  if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r =
      event_ok(hEvent) ? stream_of(hStream, &s) : CUDA_ERROR_INVALID_HANDLE;
  if (r == CUDA_SUCCESS && implicit_conflict(s, true))
    r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (r != CUDA_SUCCESS) {
    unlock();
    return r;
  }
  capture *own = s->cap;
  if (hEvent->cap_id) {
    /* The event marks a position in a capture: waiting joins it. An ended
     * capture, or an invalidated one joined from outside, is a bad
     * argument (an H200's answers, in tidepool's test_capture.c). */
    capture *c = capture_find(hEvent->cap_id);
    if (!c)
      r = CUDA_ERROR_INVALID_VALUE;
    else if (own && own != c) {
      invalidate(own);
      invalidate(c);
      r = CUDA_ERROR_STREAM_CAPTURE_MERGE;
    } else if (c->invalid)
      r = own ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
              : CUDA_ERROR_INVALID_VALUE;
    else if (own) {
      r = add_deps(s, hEvent->nodes, hEvent->nnodes) ? CUDA_SUCCESS
                                                     : CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!grow((void **)&c->streams, &c->cap, c->n + 1,
                     sizeof *c->streams) ||
               !set_deps(s, hEvent->nodes, hEvent->nnodes)) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      c->streams[c->n++] = s;
      s->cap = c;
    }
  } else if (own) {
    /* Waiting on work outside the capture is refused, and costs the
     * capture; an event never recorded has nothing to wait for. */
    if (own->invalid)
      r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (hEvent->recorded) {
      invalidate(own);
      r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
  } else if (!event_done(hEvent)) {
    r = implicit_waits(s);
    if (r == CUDA_SUCCESS)
      r = push_wait(s, hEvent->s, hEvent->seq);
  }
  unlock();
  return r;
}

/* ---- capture ------------------------------------------------------------- */

FK_API CUresult CUDAAPI
cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  NEED_INIT();
  if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

/* A capture into `into` (the application's graph), or into a new graph. */
static CUresult begin_capture(CUstream hStream, struct CUgraph_st *into,
                              CUstreamCaptureMode mode) {
  if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS && s->legacy)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  else if (r == CUDA_SUCCESS && s->cap)
    r = CUDA_ERROR_ILLEGAL_STATE;
  capture *c = NULL;
  struct CUgraph_st *g = NULL;
  if (r == CUDA_SUCCESS) {
    c = calloc(1, sizeof *c);
    g = into ? into : calloc(1, sizeof *g);
    if (!c || !g ||
        !grow((void **)&c->streams, &c->cap, 1, sizeof *c->streams)) {
      free(c);
      if (!into)
        free(g);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (r == CUDA_SUCCESS) {
    g->magic = FK_MAGIC_GRAPH;
    c->id = next_capture_id++;
    c->g = g;
    c->to_graph = into != NULL;
    c->origin = s;
    c->mode = mode;
    c->thread = pthread_self();
    c->streams[c->n++] = s;
    c->next = captures;
    captures = c;
    s->cap = c;
    s->ndeps = 0;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream,
                                             CUstreamCaptureMode mode) {
  NEED_INIT();
  return begin_capture(hStream, NULL, mode);
}

/* Whether a node is n itself or comes before one of `from`. */
static bool reaches(const CUgraphNode *from, size_t nfrom, CUgraphNode n,
                    int depth) {
  for (size_t i = 0; i < nfrom; i++) {
    if (from[i] == n)
      return true;
    if (depth < 100000 && reaches(from[i]->in, from[i]->nin, n, depth + 1))
      return true;
  }
  return false;
}

/* A stream that joined the capture and whose last captured work the origin
 * stream has not joined back. Only nodes captured from stream work count:
 * the driver does not count nodes added through the graph API. */
static bool unjoined(const capture *c) {
  const fstream *o = c->origin;
  for (size_t i = 0; i < c->n; i++) {
    const fstream *t = c->streams[i];
    if (t == o)
      continue;
    for (size_t j = 0; j < t->ndeps; j++)
      if (t->deps[j]->captured && !reaches(o->deps, o->ndeps, t->deps[j], 0))
        return true;
  }
  for (size_t j = 0; j < c->nleft; j++)
    if (!reaches(o->deps, o->ndeps, c->left[j], 0))
      return true;
  return false;
}

FK_API CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  NEED_INIT();
  if (!phGraph)
    return CUDA_ERROR_INVALID_VALUE;
  *phGraph = NULL;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  capture *c = r == CUDA_SUCCESS ? s->cap : NULL;
  if (r == CUDA_SUCCESS && !c)
    r = CUDA_ERROR_ILLEGAL_STATE;
  if (r == CUDA_SUCCESS && c->origin != s) {
    invalidate(c);
    r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  } else if (r == CUDA_SUCCESS) {
    if (c->invalid)
      r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (unjoined(c))
      r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
             !pthread_equal(c->thread, pthread_self()))
      r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (r == CUDA_SUCCESS)
      *phGraph = c->g;
    capture_end(c, r == CUDA_SUCCESS);
    pthread_cond_broadcast(&progress);
  }
  unlock();
  run_dead();
  return r;
}

/* How many capture questions (cuStreamIsCapturing, cuStreamGetCaptureInfo)
 * the process asked, for the tests of calls that should ask none. */
static _Atomic unsigned long long capture_questions;

FK_API unsigned long long fake_cuda_capture_questions(void) {
  return atomic_load(&capture_questions);
}

FK_API CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream,
                                            CUstreamCaptureStatus *status) {
  atomic_fetch_add(&capture_questions, 1);
  NEED_INIT();
  if (!status)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS && implicit_conflict(s, false))
    r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (r == CUDA_SUCCESS)
    *status = !s->cap           ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->cap->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuStreamGetCaptureInfo(
    CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
    cuuint64_t *id_out, CUgraph *graph_out,
    const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out,
    size_t *numDependencies_out) {
  atomic_fetch_add(&capture_questions, 1);
  NEED_INIT();
  if (!captureStatus_out)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS && implicit_conflict(s, false))
    r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (r == CUDA_SUCCESS) {
    capture *c = s->cap;
    *captureStatus_out = !c           ? CU_STREAM_CAPTURE_STATUS_NONE
                         : c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    bool active = c && !c->invalid;
    /* The driver names no id once a capture is invalidated (an H200,
     * bench/RESULTS.md). */
    if (id_out)
      *id_out = active ? c->id : 0;
    if (graph_out)
      *graph_out = active ? c->g : NULL;
    if (dependencies_out)
      *dependencies_out = active ? s->deps : NULL;
    if (edgeData_out)
      *edgeData_out = NULL; /* all edges are default ones */
    if (numDependencies_out)
      *numDependencies_out = active ? s->ndeps : 0;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI
cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode *dependencies,
                                  const CUgraphEdgeData *dependencyData,
                                  size_t numDependencies, unsigned int flags) {
  NEED_INIT();
  (void)dependencyData;
  if (flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES ||
      (numDependencies && !dependencies))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  CUresult r = stream_of(hStream, &s);
  if (r == CUDA_SUCCESS && !s->cap)
    r = CUDA_ERROR_ILLEGAL_STATE;
  else if (r == CUDA_SUCCESS && s->cap->invalid)
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  for (size_t i = 0; r == CUDA_SUCCESS && i < numDependencies; i++)
    if (!node_ok(dependencies[i]) || dependencies[i]->g != s->cap->g)
      r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    bool ok = flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES
                  ? set_deps(s, dependencies, numDependencies)
                  : add_deps(s, dependencies, numDependencies);
    r = ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  unlock();
  return r;
}

/* ---- graphs: the API ----------------------------------------------------- */

static bool graph_ok(CUgraph g) {
  return g && g->magic == FK_MAGIC_GRAPH;
}

FK_API CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
  NEED_INIT();
  if (!phGraph || flags)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUgraph_st *g = calloc(1, sizeof *g);
  if (!g)
    return CUDA_ERROR_OUT_OF_MEMORY;
  g->magic = FK_MAGIC_GRAPH;
  *phGraph = g;
  return CUDA_SUCCESS;
}

/* Into the graph's roots only: the fake takes no dependencies. */
FK_API CUresult CUDAAPI cuStreamBeginCaptureToGraph(
    CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
    const CUgraphEdgeData *dependencyData, size_t numDependencies,
    CUstreamCaptureMode mode) {
  NEED_INIT();
  (void)dependencies;
  (void)dependencyData;
  if (!graph_ok(hGraph))
    return CUDA_ERROR_INVALID_VALUE;
  if (numDependencies)
    return CUDA_ERROR_NOT_SUPPORTED;
  return begin_capture(hStream, hGraph, mode);
}

FK_API CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode *phGraphNode,
                                            CUgraph hGraph,
                                            const CUgraphNode *dependencies,
                                            size_t numDependencies) {
  NEED_INIT();
  if (!phGraphNode || !graph_ok(hGraph) || (numDependencies && !dependencies))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = node_new(hGraph, CU_GRAPH_NODE_TYPE_EMPTY, NULL, dependencies,
                        numDependencies, phGraphNode);
  unlock();
  return r;
}

/* The driver's convention for node lists: NULL asks for the count; else as
 * many as *n are copied, the rest of the array zeroed, and *n set to the
 * number copied. */
static CUresult node_list(CUgraphNode *src, size_t nsrc, CUgraphNode *out,
                          CUgraphEdgeData *edges, size_t *n) {
  if (!n)
    return CUDA_ERROR_INVALID_VALUE;
  if (!out) {
    *n = nsrc;
    return CUDA_SUCCESS;
  }
  size_t k = nsrc < *n ? nsrc : *n;
  for (size_t i = 0; i < *n; i++) {
    out[i] = i < k ? src[i] : NULL;
    if (edges)
      memset(&edges[i], 0, sizeof edges[i]);
  }
  *n = k;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode hNode,
                                                   CUgraphNode *dependencies,
                                                   CUgraphEdgeData *edgeData,
                                                   size_t *numDependencies) {
  NEED_INIT();
  lock();
  CUresult r = node_ok(hNode) ? node_list(hNode->in, hNode->nin, dependencies,
                                          edgeData, numDependencies)
                              : CUDA_ERROR_INVALID_VALUE;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphNodeGetDependentNodes(
    CUgraphNode hNode, CUgraphNode *dependentNodes, CUgraphEdgeData *edgeData,
    size_t *numDependentNodes) {
  NEED_INIT();
  lock();
  CUresult r = node_ok(hNode)
                   ? node_list(hNode->out, hNode->nout, dependentNodes,
                               edgeData, numDependentNodes)
                   : CUDA_ERROR_INVALID_VALUE;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphAddDependencies(CUgraph hGraph,
                                               const CUgraphNode *from,
                                               const CUgraphNode *to,
                                               const CUgraphEdgeData *edgeData,
                                               size_t numDependencies) {
  NEED_INIT();
  (void)edgeData;
  if (!graph_ok(hGraph) || (numDependencies && (!from || !to)))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = CUDA_SUCCESS;
  /* All checked first: an edge that exists, a node of another graph or a
   * node joined to itself fails the call with nothing added. */
  for (size_t i = 0; i < numDependencies && r == CUDA_SUCCESS; i++)
    if (!node_ok(from[i]) || !node_ok(to[i]) || from[i]->g != hGraph ||
        to[i]->g != hGraph || from[i] == to[i] || has_edge(from[i], to[i]))
      r = CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < numDependencies && r == CUDA_SUCCESS; i++)
    if (!edge_add(from[i], to[i]))
      r = CUDA_ERROR_OUT_OF_MEMORY;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes,
                                        size_t *numNodes) {
  NEED_INIT();
  lock();
  CUresult r = graph_ok(hGraph)
                   ? node_list(hGraph->nodes, hGraph->n, nodes, NULL, numNodes)
                   : CUDA_ERROR_INVALID_VALUE;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode,
                                           CUgraphNodeType *type) {
  NEED_INIT();
  if (!node_ok(hNode) || !type)
    return CUDA_ERROR_INVALID_VALUE;
  *type = hNode->type;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hNode) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (node_ok(hNode)) {
    node_free(hNode);
    r = CUDA_SUCCESS;
  }
  unlock();
  return r;
}

/* Graph memory: the fake's graphs never allocate (tidepool's do, through
 * the interposer), so its own figures are 0; the highs reset only to 0. */
FK_API CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device,
                                                     CUgraphMem_attribute attr,
                                                     void *value) {
  NEED_INIT();
  if (!valid_dev(device))
    return CUDA_ERROR_INVALID_DEVICE;
  if (!value || attr < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT ||
      attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
    return CUDA_ERROR_INVALID_VALUE;
  *(cuuint64_t *)value = 0;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device,
                                                     CUgraphMem_attribute attr,
                                                     void *value) {
  NEED_INIT();
  if (!valid_dev(device))
    return CUDA_ERROR_INVALID_DEVICE;
  bool high = attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH ||
              attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
  return value && high && *(cuuint64_t *)value == 0 ? CUDA_SUCCESS
                                                    : CUDA_ERROR_INVALID_VALUE;
}

FK_API CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  NEED_INIT();
  return valid_dev(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FK_API CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (graph_ok(hGraph)) {
    graph_free(hGraph);
    r = CUDA_SUCCESS;
  }
  unlock();
  run_dead();
  return r;
}

/* ---- user objects -------------------------------------------------------- */

static bool uobj_ok(CUuserObject o) {
  return o && o->magic == FK_MAGIC_UOBJ;
}

FK_API CUresult CUDAAPI cuUserObjectCreate(CUuserObject *object_out, void *ptr,
                                           CUhostFn destroy,
                                           unsigned int initialRefcount,
                                           unsigned int flags) {
  NEED_INIT();
  if (!object_out || !destroy || initialRefcount == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return CUDA_ERROR_INVALID_VALUE;
  CUuserObject o = calloc(1, sizeof *o);
  if (!o)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *o = (struct CUuserObject_st){.magic = FK_MAGIC_UOBJ,
                                .refs = initialRefcount,
                                .ptr = ptr,
                                .destroy = destroy};
  *object_out = o;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuUserObjectRelease(CUuserObject object,
                                            unsigned int count) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (uobj_ok(object) && count > 0 && count <= object->refs) {
    uobj_put(object, count);
    r = CUDA_SUCCESS;
  }
  unlock();
  run_dead();
  return r;
}

FK_API CUresult CUDAAPI cuGraphRetainUserObject(CUgraph graph,
                                                CUuserObject object,
                                                unsigned int count,
                                                unsigned int flags) {
  NEED_INIT();
  if (!graph_ok(graph) || count == 0 || flags > CU_GRAPH_USER_OBJECT_MOVE)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = uobj_ok(object) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  size_t i = 0;
  while (r == CUDA_SUCCESS && i < graph->nurefs &&
         graph->urefs[i].obj != object)
    i++;
  if (r == CUDA_SUCCESS && i == graph->nurefs) {
    uref *u = realloc(graph->urefs, (i + 1) * sizeof *u);
    if (!u)
      r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
      graph->urefs = u;
      u[i] = (uref){object, 0};
      graph->nurefs++;
    }
  }
  if (r == CUDA_SUCCESS) {
    graph->urefs[i].count += count;
    /* MOVE takes over the caller's references; otherwise new ones. */
    if (flags != CU_GRAPH_USER_OBJECT_MOVE)
      object->refs += count;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph graph,
                                                 CUuserObject object,
                                                 unsigned int count) {
  NEED_INIT();
  if (!graph_ok(graph) || count == 0)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < graph->nurefs; i++) {
    if (graph->urefs[i].obj != object || graph->urefs[i].count < count)
      continue;
    graph->urefs[i].count -= count;
    if (graph->urefs[i].count == 0)
      graph->urefs[i] = graph->urefs[--graph->nurefs];
    uobj_put(object, count);
    r = CUDA_SUCCESS;
    break;
  }
  unlock();
  run_dead();
  return r;
}

/* ---- execs --------------------------------------------------------------- */

static bool exec_ok(CUgraphExec e) {
  return e && ((fexec *)(void *)e)->magic == FK_MAGIC_EXEC;
}

/* The exec is the graph's work in a topological order (Kahn's), which a
 * launch runs one after another: an order the graph allows. */
FK_API CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec,
                                                    CUgraph hGraph,
                                                    unsigned long long flags) {
  NEED_INIT();
  unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                             CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (!phGraphExec || !graph_ok(hGraph) || (flags & ~known))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  size_t n = hGraph->n;
  fexec *e = calloc(1, sizeof *e);
  work *w = calloc(n ? n : 1, sizeof *w);
  size_t *indeg = calloc(n ? n : 1, sizeof *indeg);
  CUgraphNode *queue = calloc(n ? n : 1, sizeof *queue);
  uref *u = calloc(hGraph->nurefs ? hGraph->nurefs : 1, sizeof *u);
  CUresult r =
      e && w && indeg && queue && u ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  size_t head = 0, tail = 0, nw = 0;
  if (r == CUDA_SUCCESS) {
    /* In-degrees by position in the graph's array, found by a scan: graphs
     * here are small. */
    for (size_t i = 0; i < n; i++) {
      indeg[i] = hGraph->nodes[i]->nin;
      if (!indeg[i])
        queue[tail++] = hGraph->nodes[i];
    }
    while (head < tail) {
      CUgraphNode v = queue[head++];
      if (v->w.kind != W_NONE)
        w[nw++] = v->w;
      for (size_t k = 0; k < v->nout; k++)
        for (size_t i = 0; i < n; i++)
          if (hGraph->nodes[i] == v->out[k] && --indeg[i] == 0)
            queue[tail++] = hGraph->nodes[i];
    }
    if (tail != n)
      r = CUDA_ERROR_INVALID_VALUE; /* a cycle */
  }
  if (r == CUDA_SUCCESS) {
    e->magic = FK_MAGIC_EXEC;
    e->w = w;
    e->n = nw;
    e->refs = 1;
    e->urefs = u;
    e->nurefs = hGraph->nurefs;
    for (size_t i = 0; i < hGraph->nurefs; i++) {
      u[i] = hGraph->urefs[i];
      u[i].obj->refs += u[i].count;
    }
    *phGraphExec = (CUgraphExec)(void *)e;
  } else {
    free(e);
    free(w);
    free(u);
  }
  free(indeg);
  free(queue);
  unlock();
  return r;
}

/* The flags as cuGraphInstantiateWithFlags takes them (an upload is work
 * the fake has none of), and the result said. */
FK_API CUresult CUDAAPI
cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                             CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  NEED_INIT();
  if (!params)
    return CUDA_ERROR_INVALID_VALUE;
  unsigned long long flags =
      params->flags & ~(unsigned long long)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  CUresult r = cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
  params->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                         : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

/* A launch follows the exec's previous launch, wherever that ran, as the
 * driver orders launches of one exec. Launching into a capture (a child
 * graph node) is not emulated. */
FK_API CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec,
                                      CUstream hStream) {
  NEED_INIT();
  lock();
  fstream *s;
  capture *c;
  fexec *e = (fexec *)(void *)hGraphExec;
  CUresult r = exec_ok(hGraphExec) ? enqueue_begin(hStream, &s, &c)
                                   : CUDA_ERROR_INVALID_VALUE;
  /* Refused in any capture, an invalidated one too (an H100, driver 580). */
  if (r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (r == CUDA_SUCCESS && c) {
    invalidate(c);
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (r == CUDA_SUCCESS)
    r = implicit_waits(s);
  if (r == CUDA_SUCCESS && e->last_s && e->last_s != s &&
      e->last_s->done < e->last_seq)
    r = push_wait(s, e->last_s, e->last_seq);
  if (r == CUDA_SUCCESS) {
    work w = {.kind = W_GRAPH, .u.exec = e};
    e->refs++;
    r = push(s, &w);
    if (r != CUDA_SUCCESS)
      e->refs--;
  }
  if (r == CUDA_SUCCESS) {
    e->last_s = s;
    e->last_seq = s->enq;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (exec_ok(hGraphExec)) {
    fexec *e = (fexec *)(void *)hGraphExec;
    /* Launches in flight keep it until they are done (worker_main). */
    if (--e->refs == 0) {
      urefs_put(e->urefs, e->nurefs);
      free(e->urefs);
      free(e->w);
      e->magic = 0;
      free(e);
    } else {
      e->magic = FK_MAGIC_EXEC ^ 1u; /* the handle is gone */
    }
    r = CUDA_SUCCESS;
  }
  unlock();
  run_dead();
  return r;
}

/* ---- virtual memory ---------------------------------------------------------
 * Physical memory comes from files made with memfd_create, so that two
 * mappings of one allocation share bytes: each exportable allocation has a
 * file of its own (its exported descriptor), the others are ranges of one
 * sparse arena file per location, which keeps the descriptor count low.
 * Mappings are MAP_SHARED|MAP_FIXED over PROT_NONE reservations, made
 * readable and writable by cuMemSetAccess. */

typedef struct phys {
  uint32_t magic;
  int fd;
  off_t off;
  size_t size;
  int loc; /* device ordinal, or -1 for host memory */
  bool own_fd, exportable, imported, released;
  unsigned maps;
  struct phys *next;
} phys;
static phys *all_phys;

typedef struct arena {
  bool open;
  int fd;
  off_t size, next;
  off_t *free_offs; /* released granule-sized ranges, for reuse */
  size_t nfree, capfree;
} arena;
static arena arenas[FK_MAX_DEVICES + 1]; /* the last is the host's */

typedef struct resv {
  uintptr_t base;
  size_t size;
} resv;
static resv *resvs;
static size_t nresvs, capresvs;

/* Host access is bit FK_HOST_BIT of a mapping's masks. */
#define FK_HOST_BIT FK_MAX_DEVICES
typedef struct mapping {
  uintptr_t va;
  size_t size;
  phys *ph;
  uint32_t rd, wr;
} mapping;
static mapping *maps;
static size_t nmaps, capmaps;

static bool in_reserved(uintptr_t p) {
  for (size_t i = 0; i < nresvs; i++)
    if (p >= resvs[i].base && p - resvs[i].base < resvs[i].size)
      return true;
  return false;
}

/* The index of the first mapping that ends after p. */
static size_t map_lower(uintptr_t p) {
  size_t lo = 0, hi = nmaps;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (maps[mid].va + maps[mid].size <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static bool access_ok(uintptr_t p, size_t n, int device, bool write) {
  if (!in_reserved(p) && !in_reserved(p + n - 1))
    return true;
  uint32_t bit = 1u << device;
  uintptr_t at = p, end = p + n;
  for (size_t i = map_lower(p); at < end; i++) {
    if (i >= nmaps || maps[i].va > at)
      return false;
    if (!((write ? maps[i].wr : maps[i].rd | maps[i].wr) & bit))
      return false;
    at = maps[i].va + maps[i].size;
  }
  return true;
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *loc) {
  if (!prop)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED &&
      prop->type != CU_MEM_ALLOCATION_TYPE_MANAGED)
    return CUDA_ERROR_INVALID_VALUE;
  switch (prop->location.type) {
  case CU_MEM_LOCATION_TYPE_DEVICE:
    if (!valid_dev(prop->location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    *loc = prop->location.id;
    break;
  case CU_MEM_LOCATION_TYPE_HOST: *loc = -1; break;
  case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    if (prop->location.id != 0)
      return CUDA_ERROR_INVALID_VALUE;
    *loc = -1;
    break;
  case CU_MEM_LOCATION_TYPE_NONE:
    if (prop->type != CU_MEM_ALLOCATION_TYPE_MANAGED)
      return CUDA_ERROR_INVALID_VALUE;
    *loc = -1;
    break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  unsigned known =
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
  if ((unsigned)prop->requestedHandleTypes & ~known)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t *granularity, const CUmemAllocationProp *prop,
    CUmemAllocationGranularity_flags option) {
  NEED_INIT();
  int loc;
  if (!granularity || option > CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_prop(prop, &loc);
  if (r == CUDA_SUCCESS)
    *granularity = FK_GRAN;
  return r;
}

FK_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                            size_t alignment, CUdeviceptr addr,
                                            unsigned long long flags) {
  NEED_INIT();
  (void)addr; /* a hint, which the fake does not follow */
  if (!ptr || size == 0 || size % FK_GRAN || flags ||
      (alignment & (alignment - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  if (alignment < FK_GRAN)
    alignment = FK_GRAN;
  size_t span = size + alignment;
  if (span < size)
    return CUDA_ERROR_OUT_OF_MEMORY;
  void *m = mmap(NULL, span, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t base = ((uintptr_t)m + alignment - 1) & ~(uintptr_t)(alignment - 1);
  if (base > (uintptr_t)m)
    munmap(m, base - (uintptr_t)m);
  uintptr_t end = (uintptr_t)m + span;
  if (end > base + size)
    munmap((void *)(base + size), end - (base + size));
  lock();
  CUresult r = CUDA_SUCCESS;
  if (!grow((void **)&resvs, &capresvs, nresvs + 1, sizeof *resvs))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  else
    resvs[nresvs++] = (resv){base, size};
  unlock();
  if (r != CUDA_SUCCESS)
    munmap((void *)base, size);
  else
    *ptr = (CUdeviceptr)base;
  return r;
}

/* What the fake tells of a pointer: of a reserved range only, as a driver
 * tells of its virtual memory (the range, no pool); of anything else,
 * nothing (INVALID_VALUE). */
static bool resv_of(CUdeviceptr ptr, resv *out) {
  lock();
  bool found = false;
  for (size_t i = 0; i < nresvs && !found; i++)
    if (ptr >= resvs[i].base && ptr - resvs[i].base < resvs[i].size) {
      *out = resvs[i];
      found = true;
    }
  unlock();
  return found;
}

FK_API CUresult CUDAAPI cuPointerGetAttribute(void *data,
                                              CUpointer_attribute attribute,
                                              CUdeviceptr ptr) {
  NEED_INIT();
  resv r;
  if (!data || !resv_of(ptr, &r))
    return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    *(CUdeviceptr *)data = r.base;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    *(size_t *)data = r.size;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    *(CUmemoryPool *)data = NULL;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
    return CUDA_SUCCESS;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
}

FK_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                               CUpointer_attribute *attributes,
                                               void **data, CUdeviceptr ptr) {
  NEED_INIT();
  if (!attributes || !data)
    return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < numAttributes; i++) {
    CUresult r = cuPointerGetAttribute(data[i], attributes[i], ptr);
    if (r != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase,
                                                size_t *psize,
                                                CUdeviceptr dptr) {
  NEED_INIT();
  resv r;
  if (!resv_of(dptr, &r))
    return CUDA_ERROR_NOT_FOUND;
  if (pbase)
    *pbase = r.base;
  if (psize)
    *psize = r.size;
  return CUDA_SUCCESS;
}

static void phys_put(phys *p);

/* A range freed with mappings still in it loses them, as the driver would
 * not allow; the fake is lenient there. */
FK_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  NEED_INIT();
  lock();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < nresvs; i++) {
    if (resvs[i].base != (uintptr_t)ptr || resvs[i].size != size)
      continue;
    size_t k = map_lower((uintptr_t)ptr);
    while (k < nmaps && maps[k].va < (uintptr_t)ptr + size) {
      phys_put(maps[k].ph);
      memmove(&maps[k], &maps[k + 1], (nmaps - k - 1) * sizeof *maps);
      nmaps--;
    }
    resvs[i] = resvs[--nresvs];
    munmap((void *)(uintptr_t)ptr, size);
    r = CUDA_SUCCESS;
    break;
  }
  unlock();
  return r;
}

static bool arena_take(arena *a, size_t size, off_t *off) {
  if (!a->open) {
    int fd = memfd_create("fake-cuda-arena", MFD_CLOEXEC);
    if (fd < 0)
      return false;
    a->fd = fd;
    a->open = true;
  }
  if (size == FK_GRAN && a->nfree) {
    *off = a->free_offs[--a->nfree];
    return true;
  }
  if (a->next + (off_t)size > a->size) {
    off_t want = a->size ? a->size * 2 : (off_t)1 << 32;
    while (want < a->next + (off_t)size)
      want *= 2;
    if (ftruncate(a->fd, want) != 0)
      return false;
    a->size = want;
  }
  *off = a->next;
  a->next += (off_t)size;
  return true;
}

static void arena_give(arena *a, off_t off, size_t size) {
  /* The pages go back to the system; the range is reused for a later
   * allocation of the same size. */
  (void)fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off,
                  (off_t)size);
  if (size == FK_GRAN &&
      grow((void **)&a->free_offs, &a->capfree, a->nfree + 1, sizeof(off_t)))
    a->free_offs[a->nfree++] = off;
}

static arena *arena_of(int loc) {
  return &arenas[loc < 0 ? FK_MAX_DEVICES : loc];
}

static void phys_put(phys *p) {
  if (p->maps)
    p->maps--;
  if (p->maps || !p->released)
    return;
  if (p->loc >= 0 && !p->imported)
    dev_used[p->loc] -= p->size;
  else if (!p->imported)
    host_used -= p->size;
  if (p->own_fd)
    close(p->fd);
  else
    arena_give(arena_of(p->loc), p->off, p->size);
  phys **pp = &all_phys;
  while (*pp != p)
    pp = &(*pp)->next;
  *pp = p->next;
  p->magic = 0;
  free(p);
}

static phys *phys_of(CUmemGenericAllocationHandle h) {
  for (phys *p = all_phys; p; p = p->next)
    if ((CUmemGenericAllocationHandle)(uintptr_t)p == h && !p->released)
      return p;
  return NULL;
}

FK_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle,
                                    size_t size,
                                    const CUmemAllocationProp *prop,
                                    unsigned long long flags) {
  NEED_INIT();
  int loc = -1;
  if (!handle || size == 0 || size % FK_GRAN || flags)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_prop(prop, &loc);
  if (r != CUDA_SUCCESS)
    return r;
  /* As the H200's driver 580: VMM makes no managed memory, and no
   * shareable memory at the plain host location; fabric handles need IMEX,
   * which is absent. */
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST &&
      prop->requestedHandleTypes)
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  bool exportable =
      prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  phys *p = calloc(1, sizeof *p);
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (phys){.magic = FK_MAGIC_PHYS,
              .size = size,
              .loc = loc,
              .exportable = exportable,
              .fd = -1};
  lock();
  if (loc >= 0 ? dev_total[loc] - dev_used[loc] < size
               : host_total - host_used < size)
    r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS && exportable) {
    p->fd = memfd_create("fake-cuda-chunk", MFD_CLOEXEC);
    p->own_fd = true;
    if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0)
      r = CUDA_ERROR_OUT_OF_MEMORY;
  } else if (r == CUDA_SUCCESS) {
    arena *a = arena_of(loc);
    if (!arena_take(a, size, &p->off))
      r = CUDA_ERROR_OUT_OF_MEMORY;
    p->fd = a->fd;
  }
  if (r == CUDA_SUCCESS) {
    if (loc >= 0)
      dev_used[loc] += size;
    else
      host_used += size;
    p->next = all_phys;
    all_phys = p;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
  } else {
    if (p->own_fd && p->fd >= 0)
      close(p->fd);
    free(p);
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  NEED_INIT();
  lock();
  phys *p = phys_of(handle);
  if (p) {
    /* Mappings keep the memory until they go, as in the driver. */
    p->released = true;
    p->maps++;
    phys_put(p);
  }
  unlock();
  return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle,
                                 unsigned long long flags) {
  NEED_INIT();
  uintptr_t va = (uintptr_t)ptr;
  if (flags || size == 0 || va % FK_GRAN || size % FK_GRAN || offset % FK_GRAN)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  phys *p = phys_of(handle);
  CUresult r = p && offset <= p->size && size <= p->size - offset
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  /* Inside one reservation and over nothing mapped. */
  bool inside = false;
  for (size_t i = 0; r == CUDA_SUCCESS && i < nresvs && !inside; i++)
    inside = va >= resvs[i].base && va - resvs[i].base < resvs[i].size &&
             size <= resvs[i].size - (va - resvs[i].base);
  if (r == CUDA_SUCCESS && !inside)
    r = CUDA_ERROR_INVALID_VALUE;
  size_t k = map_lower(va);
  if (r == CUDA_SUCCESS && k < nmaps && maps[k].va < va + size)
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS &&
      !grow((void **)&maps, &capmaps, nmaps + 1, sizeof *maps))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS &&
      mmap((void *)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd,
           p->off + (off_t)offset) == MAP_FAILED)
    r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS) {
    memmove(&maps[k + 1], &maps[k], (nmaps - k) * sizeof *maps);
    maps[k] = (mapping){va, size, p, 0, 0};
    nmaps++;
    p->maps++;
  }
  unlock();
  return r;
}

/* The range may hold several mappings but may not cut one, and must be
 * mapped throughout. */
FK_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  NEED_INIT();
  uintptr_t va = (uintptr_t)ptr;
  if (size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  size_t k = map_lower(va), j = k;
  uintptr_t at = va;
  while (j < nmaps && maps[j].va == at && at < va + size) {
    at = maps[j].va + maps[j].size;
    j++;
  }
  CUresult r = at == va + size && k < nmaps && maps[k].va == va
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    if (mmap((void *)va, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
             0) == MAP_FAILED)
      r = CUDA_ERROR_UNKNOWN;
  }
  if (r == CUDA_SUCCESS) {
    for (size_t i = k; i < j; i++)
      phys_put(maps[i].ph);
    memmove(&maps[k], &maps[j], (nmaps - j) * sizeof *maps);
    nmaps -= j - k;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                       const CUmemAccessDesc *desc,
                                       size_t count) {
  NEED_INIT();
  uintptr_t va = (uintptr_t)ptr;
  if (!desc || count == 0 || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  uint32_t set = 0, rd = 0, wr = 0;
  for (size_t i = 0; i < count; i++) {
    uint32_t bit;
    if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      if (!valid_dev(desc[i].location.id))
        return CUDA_ERROR_INVALID_DEVICE;
      bit = 1u << desc[i].location.id;
    } else if (desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST ||
               desc[i].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
      bit = 1u << FK_HOST_BIT;
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
    set |= bit;
    switch (desc[i].flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
    case CU_MEM_ACCESS_FLAGS_PROT_READ: rd |= bit; break;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: wr |= bit; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  lock();
  size_t k = map_lower(va), j = k;
  uintptr_t at = va;
  while (j < nmaps && maps[j].va <= at && at < va + size) {
    at = maps[j].va + maps[j].size;
    j++;
  }
  CUresult r = at >= va + size && k < nmaps && maps[k].va <= va
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  for (size_t i = k; r == CUDA_SUCCESS && i < j; i++) {
    maps[i].rd = (maps[i].rd & ~set) | rd;
    maps[i].wr = (maps[i].wr & ~set) | wr;
    /* The host runs every device's work, so the pages are as open as the
     * most any device or the host got. */
    int prot = maps[i].wr   ? PROT_READ | PROT_WRITE
               : maps[i].rd ? PROT_READ
                            : PROT_NONE;
    if (mprotect((void *)maps[i].va, maps[i].size, prot) != 0)
      r = CUDA_ERROR_UNKNOWN;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemExportToShareableHandle(
    void *shareableHandle, CUmemGenericAllocationHandle handle,
    CUmemAllocationHandleType handleType, unsigned long long flags) {
  NEED_INIT();
  if (!shareableHandle || flags ||
      handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  phys *p = phys_of(handle);
  CUresult r = p && p->own_fd ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      r = CUDA_ERROR_OUT_OF_MEMORY;
    else
      *(int *)shareableHandle = fd;
  }
  unlock();
  return r;
}

/* The descriptor's value comes in place of a pointer; the driver keeps a
 * reference of its own and the caller may close theirs. */
FK_API CUresult CUDAAPI cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle *handle, void *osHandle,
    CUmemAllocationHandleType shHandleType) {
  NEED_INIT();
  int fd = (int)(intptr_t)osHandle;
  struct stat st;
  if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 ||
      (size_t)st.st_size % FK_GRAN)
    return CUDA_ERROR_INVALID_VALUE;
  phys *p = calloc(1, sizeof *p);
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (phys){.magic = FK_MAGIC_PHYS,
              .fd = own,
              .size = (size_t)st.st_size,
              .loc = 0,
              .own_fd = true,
              .exportable = true,
              .imported = true};
  lock();
  p->next = all_phys;
  all_phys = p;
  unlock();
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
  return CUDA_SUCCESS;
}

/* ---- memory outside VMM: cuMemAlloc and the stream-ordered allocator -------
 * What a program calls directly, and what reaches the driver through
 * tidepool's interposer when tidepool does not answer (a pointer or a pool
 * tidepool did not make). Each allocation is an anonymous mapping of its
 * own, charged to its device's memory as cuMemCreate's are. Pools have the
 * driver's attributes and figures but keep no memory: a block goes back when
 * its stream reaches the free, as a driver's pool with a release threshold
 * of 0 would give it back at the next synchronization. Not emulated:
 * allocations and frees in a capture (graph memory nodes; refused with
 * CUDA_ERROR_NOT_SUPPORTED), pools of host or managed memory, and pools
 * shared between processes (CUDA_ERROR_NOT_SUPPORTED). */

#define FK_MAGIC_POOL 0x504f4f4cu
#define FK_PAGE ((size_t)4096)

struct CUmemPoolHandle_st {
  uint32_t magic;
  int device;
  bool is_default;
  size_t max_size;
  int follow, opportunistic, internal; /* the reuse policies */
  cuuint64_t threshold;
  cuuint64_t reserved, reserved_high, used, used_high;
  CUmemAccess_flags access[FK_MAX_DEVICES];
  struct CUmemPoolHandle_st *all_next;
};
/* Every pool ever made: a destroyed one stays, unusable, for the blocks it
 * gave out, which may be freed after it. */
static struct CUmemPoolHandle_st *all_pools;
static struct CUmemPoolHandle_st *default_pools[FK_MAX_DEVICES];
static struct CUmemPoolHandle_st *current_pools[FK_MAX_DEVICES];

typedef struct dmem {
  uintptr_t base;
  size_t size, charged;
  int device;
  struct CUmemPoolHandle_st *pool; /* NULL for cuMemAlloc's */
  bool freeing;                    /* a stream-ordered free is queued */
  struct dmem *next;
} dmem;
static dmem *dmems;

static bool pool_ok(CUmemoryPool p) {
  return p && p->magic == FK_MAGIC_POOL;
}

static struct CUmemPoolHandle_st *pool_new(int device) {
  struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->magic = FK_MAGIC_POOL;
  p->device = device;
  p->follow = p->opportunistic = p->internal = 1;
  p->access[device] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  p->all_next = all_pools;
  all_pools = p;
  return p;
}

/* The device's default and current pools (held lock); NULL when out of
 * memory. */
static struct CUmemPoolHandle_st *default_pool(int device) {
  if (!default_pools[device]) {
    default_pools[device] = pool_new(device);
    if (default_pools[device])
      default_pools[device]->is_default = true;
  }
  return default_pools[device];
}

static struct CUmemPoolHandle_st *current_pool(int device) {
  return current_pools[device] ? current_pools[device] : default_pool(device);
}

static dmem *dmem_find(uintptr_t base) {
  for (dmem *d = dmems; d; d = d->next)
    if (d->base == base)
      return d;
  return NULL;
}

/* A new allocation of `size` bytes of `device` (held lock). */
static CUresult dmem_new(size_t size, int device,
                         struct CUmemPoolHandle_st *pool, dmem **out) {
  size_t charged = (size + FK_PAGE - 1) & ~(FK_PAGE - 1);
  if (charged < size || dev_total[device] - dev_used[device] < charged ||
      (pool && pool->max_size && pool->max_size - pool->reserved < charged))
    return CUDA_ERROR_OUT_OF_MEMORY;
  dmem *d = calloc(1, sizeof *d);
  void *m = d ? mmap(NULL, charged, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
              : MAP_FAILED;
  if (m == MAP_FAILED) {
    free(d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *d = (dmem){(uintptr_t)m, size, charged, device, pool, false, dmems};
  dmems = d;
  dev_used[device] += charged;
  if (pool) {
    pool->used += size;
    pool->reserved += charged;
    if (pool->used > pool->used_high)
      pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high)
      pool->reserved_high = pool->reserved;
  }
  *out = d;
  return CUDA_SUCCESS;
}

/* Gives an allocation back (held lock). */
static void dmem_release(dmem *d) {
  dmem **pp = &dmems;
  while (*pp != d)
    pp = &(*pp)->next;
  *pp = d->next;
  munmap((void *)d->base, d->charged);
  dev_used[d->device] -= d->charged;
  if (d->pool) {
    d->pool->used -= d->size;
    d->pool->reserved -= d->charged;
  }
  free(d);
}

/* The work of a stream-ordered free, run by the stream's worker. */
static void free_work(void *arg) {
  lock();
  dmem_release(arg);
  unlock();
}

FK_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  NEED_INIT();
  if (!dptr || bytesize == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!current)
    return CUDA_ERROR_INVALID_CONTEXT;
  lock();
  dmem *d = NULL;
  CUresult r = dmem_new(bytesize, current->device, NULL, &d);
  if (r == CUDA_SUCCESS)
    *dptr = (CUdeviceptr)d->base;
  unlock();
  return r;
}

/* cuMemFree waits for the context's work, as the driver synchronizes
 * before it frees; it takes stream-ordered allocations too. */
FK_API CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  NEED_INIT();
  if (!dptr)
    return CUDA_SUCCESS;
  lock();
  dmem *d = dmem_find((uintptr_t)dptr);
  CUresult r = d && !d->freeing ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    d->freeing = true;
    for (fstream *s = all_streams; s; s = s->all_next) {
      if (s->ctx != &ctxs[d->device] || s->cap)
        continue;
      uint64_t target = s->enq;
      while (s->done < target)
        pthread_cond_wait(&progress, &G);
    }
    dmem_release(d);
  }
  unlock();
  run_dead();
  return r;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t size,
                            struct CUmemPoolHandle_st *pool, bool from_pool,
                            CUstream h) {
  NEED_INIT();
  if (!dptr)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  fstream *s;
  capture *c;
  CUresult r = enqueue_begin(h, &s, &c);
  if (r == CUDA_SUCCESS && c)
    r = CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS && from_pool && !pool_ok(pool))
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && !from_pool) {
    pool = current_pool(s->ctx->device);
    if (!pool)
      r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS && size == 0) {
    *dptr = 0;
  } else if (r == CUDA_SUCCESS) {
    dmem *d = NULL;
    r = dmem_new(size, pool->device, pool, &d);
    if (r == CUDA_SUCCESS)
      *dptr = (CUdeviceptr)d->base;
  }
  unlock();
  return r;
}

/* The driver takes cuMemAlloc's memory too (an H200's answer in
 * test/conformance/driver_answers.txt); a pointer it did not give out, or
 * one whose free is already queued, is a bad value. */
static CUresult free_async(CUdeviceptr dptr, CUstream h) {
  NEED_INIT();
  lock();
  fstream *s;
  capture *c;
  CUresult r = enqueue_begin(h, &s, &c);
  if (r == CUDA_SUCCESS && c)
    r = CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS && dptr) {
    dmem *d = dmem_find((uintptr_t)dptr);
    r = d && !d->freeing ? implicit_waits(s) : CUDA_ERROR_INVALID_VALUE;
    work w = {.kind = W_HOST, .u.host = {free_work, d}};
    if (r == CUDA_SUCCESS)
      r = push(s, &w);
    if (r == CUDA_SUCCESS)
      d->freeing = true;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                        CUstream hStream) {
  return alloc_async(dptr, bytesize, NULL, false, hStream);
}

FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr,
                                                size_t bytesize,
                                                CUmemoryPool pool,
                                                CUstream hStream) {
  return alloc_async(dptr, bytesize, pool, true, hStream);
}

FK_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return free_async(dptr, hStream);
}

FK_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool,
                                        const CUmemPoolProps *poolProps) {
  NEED_INIT();
  if (!pool || !poolProps ||
      poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  if (poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!valid_dev(poolProps->location.id) ||
      ((unsigned)poolProps->handleTypes &
       ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  struct CUmemPoolHandle_st *p = pool_new(poolProps->location.id);
  if (p)
    p->max_size = poolProps->maxSize;
  unlock();
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *pool = p;
  return CUDA_SUCCESS;
}

/* A device whose current pool is destroyed goes back to its default. */
FK_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  NEED_INIT();
  lock();
  CUresult r = pool_ok(pool) && !pool->is_default ? CUDA_SUCCESS
                                                  : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    pool->magic = 0;
    for (int i = 0; i < FK_MAX_DEVICES; i++)
      if (current_pools[i] == pool)
        current_pools[i] = NULL;
  }
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool,
                                              CUmemPool_attribute attr,
                                              void *value) {
  NEED_INIT();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = pool_ok(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *(int *)value = pool->follow;
      break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *(int *)value = pool->opportunistic;
      break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *(int *)value = pool->internal;
      break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *(cuuint64_t *)value = pool->threshold;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *(cuuint64_t *)value = pool->reserved;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *(cuuint64_t *)value = pool->reserved_high;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *(cuuint64_t *)value = pool->used;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *(cuuint64_t *)value = pool->used_high;
      break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
  }
  unlock();
  return r;
}

/* The high marks may only be reset (to the current figure, with 0); the
 * current figures are read-only. */
FK_API CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool,
                                              CUmemPool_attribute attr,
                                              void *value) {
  NEED_INIT();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = pool_ok(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      pool->follow = *(int *)value != 0;
      break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      pool->opportunistic = *(int *)value != 0;
      break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      pool->internal = *(int *)value != 0;
      break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      pool->threshold = *(cuuint64_t *)value;
      break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*(cuuint64_t *)value != 0)
        r = CUDA_ERROR_INVALID_VALUE;
      else
        pool->reserved_high = pool->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*(cuuint64_t *)value != 0)
        r = CUDA_ERROR_INVALID_VALUE;
      else
        pool->used_high = pool->used;
      break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
  }
  unlock();
  return r;
}

/* Nothing is kept, so there is nothing to trim. */
FK_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool,
                                        size_t minBytesToKeep) {
  NEED_INIT();
  (void)minBytesToKeep;
  lock();
  CUresult r = pool_ok(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  unlock();
  return r;
}

/* The pool's own device keeps read-write access: anything else for it, or
 * a device that does not exist, is an invalid device (an H200's answers). */
FK_API CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool,
                                           const CUmemAccessDesc *map,
                                           size_t count) {
  NEED_INIT();
  if (!map && count)
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = pool_ok(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count && r == CUDA_SUCCESS; i++) {
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (unsigned)map[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      r = CUDA_ERROR_INVALID_VALUE;
    else if (!valid_dev(map[i].location.id) ||
             (map[i].location.id == pool->device &&
              map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
      r = CUDA_ERROR_INVALID_DEVICE;
  }
  for (size_t i = 0; i < count && r == CUDA_SUCCESS; i++)
    pool->access[map[i].location.id] = map[i].flags;
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags,
                                           CUmemoryPool memPool,
                                           CUmemLocation *location) {
  NEED_INIT();
  if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !valid_dev(location->id))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  CUresult r = pool_ok(memPool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    *flags = memPool->access[location->id];
  unlock();
  return r;
}

FK_API CUresult CUDAAPI cuMemPoolExportToShareableHandle(
    void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType handleType,
    unsigned long long flags) {
  (void)handle_out, (void)pool, (void)handleType, (void)flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI cuMemPoolImportFromShareableHandle(
    CUmemoryPool *pool_out, void *handle, CUmemAllocationHandleType handleType,
    unsigned long long flags) {
  (void)pool_out, (void)handle, (void)handleType, (void)flags;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI
cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr) {
  (void)shareData_out, (void)ptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI
cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                       CUmemPoolPtrExportData *shareData) {
  (void)ptr_out, (void)pool, (void)shareData;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FK_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out,
                                                  CUdevice dev) {
  NEED_INIT();
  if (!pool_out)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  lock();
  struct CUmemPoolHandle_st *p = default_pool(dev);
  unlock();
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *pool_out = p;
  return CUDA_SUCCESS;
}

/* A device that does not exist is a bad value for the get and set forms
 * (an H200's answers, through the runtime). */
FK_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  NEED_INIT();
  if (!pool || !valid_dev(dev))
    return CUDA_ERROR_INVALID_VALUE;
  lock();
  struct CUmemPoolHandle_st *p = current_pool(dev);
  unlock();
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *pool = p;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  NEED_INIT();
  lock();
  CUresult r = valid_dev(dev) && pool_ok(pool) && pool->device == dev
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    current_pools[dev] = pool;
  unlock();
  return r;
}

/* CUDA 13's forms, for device memory only. */
static CUresult device_location(const CUmemLocation *location,
                                CUmemAllocationType type, int *device) {
  if (!location || type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  if (location->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!valid_dev(location->id))
    return CUDA_ERROR_INVALID_VALUE;
  *device = location->id;
  return CUDA_SUCCESS;
}

FK_API CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out,
                                               CUmemLocation *location,
                                               CUmemAllocationType type) {
  NEED_INIT();
  int dev = 0;
  CUresult r = pool_out ? device_location(location, type, &dev)
                        : CUDA_ERROR_INVALID_VALUE;
  return r == CUDA_SUCCESS ? cuDeviceGetDefaultMemPool(pool_out, dev) : r;
}

FK_API CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool *pool,
                                        CUmemLocation *location,
                                        CUmemAllocationType type) {
  NEED_INIT();
  int dev = 0;
  CUresult r =
      pool ? device_location(location, type, &dev) : CUDA_ERROR_INVALID_VALUE;
  return r == CUDA_SUCCESS ? cuDeviceGetMemPool(pool, dev) : r;
}

FK_API CUresult CUDAAPI cuMemSetMemPool(CUmemLocation *location,
                                        CUmemAllocationType type,
                                        CUmemoryPool pool) {
  NEED_INIT();
  int dev = 0;
  CUresult r = device_location(location, type, &dev);
  return r == CUDA_SUCCESS ? cuDeviceSetMemPool(dev, pool) : r;
}

/* ---- more of the driver a program or a runtime asks for -------------------
 */

FK_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev,
                                                   unsigned int *flags,
                                                   int *active) {
  NEED_INIT();
  if (!flags || !active)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  lock();
  *flags = 0;
  *active = ctxs[dev].retains > 0;
  unlock();
  return CUDA_SUCCESS;
}

/* Priorities are not emulated: the stream is an ordinary one. */
FK_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream,
                                                   unsigned int flags,
                                                   int priority) {
  (void)priority;
  return cuStreamCreate(phStream, flags);
}

/* Only the default record; an external one (for a graph's event record
 * node) is not emulated. */
FK_API CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream,
                                               unsigned int flags) {
  if (flags == CU_EVENT_RECORD_EXTERNAL)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (flags != CU_EVENT_RECORD_DEFAULT)
    return CUDA_ERROR_INVALID_VALUE;
  return cuEventRecord(hEvent, hStream);
}

/* CUDA 13's form names its context; NULL is the current one. */
FK_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  NEED_INIT();
  if (ctx && !valid_ctx(ctx))
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx || ctx == current)
    return cuCtxSynchronize();
  struct CUctx_st *saved = current;
  current = ctx;
  CUresult r = cuCtxSynchronize();
  current = saved;
  return r;
}

FK_API CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice,
                                          size_t ByteCount, CUstream hStream) {
  return cuMemcpyAsync((CUdeviceptr)(uintptr_t)dstHost, srcDevice, ByteCount,
                       hStream);
}

FK_API CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice,
                                          const void *srcHost, size_t ByteCount,
                                          CUstream hStream) {
  return cuMemcpyAsync(dstDevice, (CUdeviceptr)(uintptr_t)srcHost, ByteCount,
                       hStream);
}

/* ---- the per-thread default stream's variants -------------------------------
 * What cuGetProcAddress hands out with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (and libcuda exports as
 * NAME_ptsz): the same call, where a NULL stream is the calling thread's
 * per-thread default stream rather than the legacy one. */

static CUstream pt(CUstream h) {
  return h ? h : CU_STREAM_PER_THREAD;
}

FK_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s);
FK_API CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s);
FK_API CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e,
                                               unsigned f);
FK_API CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s);
FK_API CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent e, CUstream s,
                                                    unsigned f);
FK_API CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn,
                                              void *arg);
FK_API CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v,
                                             size_t n, CUstream s);
FK_API CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr src,
                                           size_t n, CUstream s);
FK_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr src,
                                                  size_t n, CUstream s);
FK_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d,
                                                  const void *src, size_t n,
                                                  CUstream s);
FK_API CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream s,
                                                     CUstreamCaptureMode m);
FK_API CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
FK_API CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream s,
                                                 CUstreamCaptureStatus *st);
FK_API CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec e, CUstream s);
FK_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n,
                                             CUstream s);
FK_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);
FK_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n,
                                                     CUmemoryPool pool,
                                                     CUstream s);

CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) {
  return cuStreamSynchronize(pt(s));
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s) {
  return cuStreamQuery(pt(s));
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned f) {
  return cuStreamWaitEvent(pt(s), e, f);
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s) {
  return cuEventRecord(e, pt(s));
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent e, CUstream s,
                                             unsigned f) {
  return cuEventRecordWithFlags(e, pt(s), f);
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *arg) {
  return cuLaunchHostFunc(pt(s), fn, arg);
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n,
                                      CUstream s) {
  return cuMemsetD8Async(p, v, n, pt(s));
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr src, size_t n,
                                    CUstream s) {
  return cuMemcpyAsync(d, src, n, pt(s));
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr src, size_t n,
                                           CUstream s) {
  return cuMemcpyDtoHAsync(d, src, n, pt(s));
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *src,
                                           size_t n, CUstream s) {
  return cuMemcpyHtoDAsync(d, src, n, pt(s));
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream s,
                                              CUstreamCaptureMode m) {
  return cuStreamBeginCapture(pt(s), m);
}
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
  return cuStreamEndCapture(pt(s), g);
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream s,
                                          CUstreamCaptureStatus *st) {
  return cuStreamIsCapturing(pt(s), st);
}
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return cuGraphLaunch(e, pt(s));
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
  return cuMemAllocAsync(p, n, pt(s));
}
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return cuMemFreeAsync(p, pt(s));
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n,
                                              CUmemoryPool pool, CUstream s) {
  return cuMemAllocFromPoolAsync(p, n, pool, pt(s));
}

/* Not a driver function: counts of the fake's live objects, so that a test
 * that runs tidepool on it (fuzz_api's cuda mode) can check that everything
 * it made was given back. Streams are those of cuStreamCreate that were not
 * destroyed; dev_bytes takes the physical bytes of the first n devices. */
FK_API void fake_cuda_live(unsigned long long *reservations,
                           unsigned long long *allocations,
                           unsigned long long *mappings,
                           unsigned long long *streams,
                           unsigned long long *dev_bytes, int n) {
  lock();
  *reservations = nresvs;
  *mappings = nmaps;
  unsigned long long k = 0;
  for (phys *p = all_phys; p; p = p->next)
    k++;
  *allocations = k;
  k = 0;
  for (fstream *s = all_streams; s; s = s->all_next)
    k += !s->destroyed && s->slot != NULL;
  *streams = k;
  for (int d = 0; d < n; d++)
    dev_bytes[d] = d < ndev ? dev_used[d] : 0;
  unlock();
}

/* ---- errors -------------------------------------------------------------- */

FK_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  if (!pStr)
    return CUDA_ERROR_INVALID_VALUE;
  static const struct {
    CUresult code;
    const char *name;
  } names[] = {
#define FK_NAME(c) {c, #c}
      FK_NAME(CUDA_SUCCESS),
      FK_NAME(CUDA_ERROR_INVALID_VALUE),
      FK_NAME(CUDA_ERROR_OUT_OF_MEMORY),
      FK_NAME(CUDA_ERROR_NOT_INITIALIZED),
      FK_NAME(CUDA_ERROR_NO_DEVICE),
      FK_NAME(CUDA_ERROR_INVALID_DEVICE),
      FK_NAME(CUDA_ERROR_INVALID_CONTEXT),
      FK_NAME(CUDA_ERROR_INVALID_HANDLE),
      FK_NAME(CUDA_ERROR_NOT_FOUND),
      FK_NAME(CUDA_ERROR_NOT_READY),
      FK_NAME(CUDA_ERROR_NOT_SUPPORTED),
      FK_NAME(CUDA_ERROR_NOT_PERMITTED),
      FK_NAME(CUDA_ERROR_ILLEGAL_STATE),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_MERGE),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
      FK_NAME(CUDA_ERROR_CAPTURED_EVENT),
      FK_NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
      FK_NAME(CUDA_ERROR_UNKNOWN),
#undef FK_NAME
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].code == error) {
      *pStr = names[i].name;
      return CUDA_SUCCESS;
    }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress -------------------------------------------------------
 * Each entry point at the ABI version it first had: a caller asking for an
 * older version finds nothing, as from a driver without that variant. The
 * name is cuda.h's unversioned one; the function is whatever cuda.h maps it
 * to (cuStreamGetCaptureInfo is cuStreamGetCaptureInfo_v3). */

typedef void (*fk_fn)(void);
#define FK_PROC(name, version)                                                 \
  { #name, version, (fk_fn)name, NULL }
/* An entry point with a per-thread default stream variant. */
#define FK_PROC_PT(name, version, ptsz)                                        \
  { #name, version, (fk_fn)name, (fk_fn)ptsz }

FK_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn,
                                         int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *found);

/* CUDA 11.3's form, which a driver still exports under the name cuda.h now
 * maps to the _v2, and hands out for versions before 12.0. */
FK_API CUresult CUDAAPI
fk_get_proc_v1(const char *symbol, void **pfn, int cudaVersion,
               cuuint64_t flags) __asm__("cuGetProcAddress");

static const struct {
  const char *name;
  int version;
  fk_fn fn, ptsz;
} procs[] = {
    FK_PROC(cuGetErrorName, 6000),
    FK_PROC(cuInit, 2000),
    {"cuGetProcAddress", 11030, (fk_fn)fk_get_proc_v1, NULL},
    FK_PROC(cuGetProcAddress, 12000),
    FK_PROC(cuDeviceGet, 2000),
    FK_PROC(cuDeviceGetCount, 2000),
    FK_PROC(cuDeviceGetAttribute, 2000),
    FK_PROC(cuDeviceTotalMem, 3020),
    FK_PROC(cuDeviceGetUuid, 11040),
    FK_PROC(cuDevicePrimaryCtxRetain, 7000),
    FK_PROC(cuDevicePrimaryCtxRelease, 11000),
    FK_PROC(cuCtxPushCurrent, 4000),
    FK_PROC(cuCtxPopCurrent, 4000),
    FK_PROC(cuMemHostAlloc, 2020),
    FK_PROC(cuMemHostGetDevicePointer, 2020),
    FK_PROC(cuMemFreeHost, 2000),
    FK_PROC(cuStreamWaitValue32, 11070),
    FK_PROC(cuStreamWriteValue32, 11070),
    FK_PROC(cuCtxGetCurrent, 4000),
    FK_PROC(cuCtxSetCurrent, 4000),
    FK_PROC(cuCtxGetDevice, 2000),
    FK_PROC(cuCtxSynchronize, 2000),
    FK_PROC(cuStreamCreate, 2000),
    FK_PROC(cuStreamDestroy, 4000),
    FK_PROC(cuStreamGetId, 12000),
    FK_PROC(cuStreamGetFlags, 5050),
    FK_PROC(cuStreamGetCtx, 9020),
    FK_PROC(cuStreamGetDevice, 12080),
    FK_PROC_PT(cuStreamSynchronize, 2000, cuStreamSynchronize_ptsz),
    FK_PROC_PT(cuStreamQuery, 2000, cuStreamQuery_ptsz),
    FK_PROC_PT(cuStreamWaitEvent, 3020, cuStreamWaitEvent_ptsz),
    FK_PROC_PT(cuMemsetD8Async, 3020, cuMemsetD8Async_ptsz),
    FK_PROC_PT(cuMemcpyAsync, 4000, cuMemcpyAsync_ptsz),
    FK_PROC_PT(cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz),
    FK_PROC(cuEventCreate, 2000),
    FK_PROC(cuEventDestroy, 4000),
    FK_PROC_PT(cuEventRecord, 2000, cuEventRecord_ptsz),
    FK_PROC(cuEventQuery, 2000),
    FK_PROC(cuEventSynchronize, 2000),
    FK_PROC(cuMemGetAllocationGranularity, 10020),
    FK_PROC(cuMemAddressReserve, 10020),
    FK_PROC(cuPointerGetAttribute, 4000),
    FK_PROC(cuPointerGetAttributes, 7000),
    FK_PROC(cuMemGetAddressRange, 3020),
    FK_PROC(cuMemAddressFree, 10020),
    FK_PROC(cuMemCreate, 10020),
    FK_PROC(cuMemRelease, 10020),
    FK_PROC(cuMemMap, 10020),
    FK_PROC(cuMemUnmap, 10020),
    FK_PROC(cuMemSetAccess, 10020),
    FK_PROC(cuMemExportToShareableHandle, 10020),
    FK_PROC(cuMemImportFromShareableHandle, 10020),
    FK_PROC_PT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz),
    FK_PROC(cuStreamBeginCaptureToGraph, 12030),
    FK_PROC(cuGraphCreate, 10000),
    FK_PROC(cuGraphInstantiateWithParams, 12000),
    FK_PROC(cuThreadExchangeStreamCaptureMode, 10010),
    FK_PROC_PT(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz),
    FK_PROC_PT(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz),
    FK_PROC(cuStreamGetCaptureInfo, 12030),
    FK_PROC(cuStreamUpdateCaptureDependencies, 12030),
    FK_PROC(cuGraphAddEmptyNode, 10000),
    FK_PROC(cuGraphNodeGetDependencies, 12030),
    FK_PROC(cuGraphNodeGetDependentNodes, 12030),
    FK_PROC(cuGraphAddDependencies, 12030),
    FK_PROC(cuGraphGetNodes, 10000),
    FK_PROC(cuGraphNodeGetType, 10000),
    FK_PROC(cuGraphDestroyNode, 10000),
    FK_PROC(cuUserObjectCreate, 11030),
    FK_PROC(cuUserObjectRelease, 11030),
    FK_PROC(cuGraphRetainUserObject, 11030),
    FK_PROC(cuGraphReleaseUserObject, 11030),
    FK_PROC(cuGraphInstantiateWithFlags, 11040),
    FK_PROC_PT(cuGraphLaunch, 10000, cuGraphLaunch_ptsz),
    FK_PROC(cuGraphExecDestroy, 10000),
    FK_PROC(cuGraphDestroy, 10000),
    FK_PROC(cuDeviceGetGraphMemAttribute, 11040),
    FK_PROC(cuDeviceSetGraphMemAttribute, 11040),
    FK_PROC(cuDeviceGraphMemTrim, 11040),
    /* cuda.h's cuGraphInstantiate is cuGraphInstantiateWithFlags from 12.0
     * on; the older call is not emulated. */
    {"cuGraphInstantiate", 12000, (fk_fn)cuGraphInstantiateWithFlags, NULL},
    {"cuCtxSynchronize", 13000, (fk_fn)cuCtxSynchronize_v2, NULL},
    FK_PROC(cuDevicePrimaryCtxGetState, 7000),
    FK_PROC(cuStreamCreateWithPriority, 5050),
    FK_PROC_PT(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz),
    FK_PROC(cuMemAlloc, 3020),
    FK_PROC(cuMemFree, 3020),
    FK_PROC_PT(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2_ptsz),
    FK_PROC_PT(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2_ptsz),
    FK_PROC_PT(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz),
    FK_PROC_PT(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz),
    FK_PROC_PT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz),
    FK_PROC(cuMemPoolCreate, 11020),
    FK_PROC(cuMemPoolDestroy, 11020),
    FK_PROC(cuMemPoolGetAttribute, 11020),
    FK_PROC(cuMemPoolSetAttribute, 11020),
    FK_PROC(cuMemPoolSetAccess, 11020),
    FK_PROC(cuMemPoolGetAccess, 11020),
    FK_PROC(cuMemPoolTrimTo, 11020),
    FK_PROC(cuMemPoolExportToShareableHandle, 11020),
    FK_PROC(cuMemPoolImportFromShareableHandle, 11020),
    FK_PROC(cuMemPoolExportPointer, 11020),
    FK_PROC(cuMemPoolImportPointer, 11020),
    FK_PROC(cuDeviceGetDefaultMemPool, 11020),
    FK_PROC(cuDeviceGetMemPool, 11020),
    FK_PROC(cuDeviceSetMemPool, 11020),
    FK_PROC(cuMemGetDefaultMemPool, 13000),
    FK_PROC(cuMemGetMemPool, 13000),
    FK_PROC(cuMemSetMemPool, 13000),
};

FK_API CUresult CUDAAPI
cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                 cuuint64_t flags, CUdriverProcAddressQueryResult *found) {
  if (found)
    *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!symbol || !pfn ||
      (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
    return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  /* Of a name's entries, the newest the caller's version has. */
  bool named = false;
  size_t best = sizeof procs / sizeof procs[0];
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    if (strcmp(procs[i].name, symbol) != 0)
      continue;
    named = true;
    if (cudaVersion >= procs[i].version &&
        (best == sizeof procs / sizeof procs[0] ||
         procs[i].version > procs[best].version))
      best = i;
  }
  if (best == sizeof procs / sizeof procs[0]) {
    if (named && found)
      *found = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return CUDA_ERROR_NOT_FOUND;
  }
  fk_fn fn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
                     procs[best].ptsz
                 ? procs[best].ptsz
                 : procs[best].fn;
  memcpy(pfn, &fn, sizeof *pfn);
  if (found)
    *found = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

/* CUDA 11.3's form. */
CUresult CUDAAPI fk_get_proc_v1(const char *symbol, void **pfn, int cudaVersion,
                                cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
