/* PyTorch's pluggable-allocator entry points (tp_torch_alloc, tp_torch_free)
 * with the signatures CUDAPluggableAllocator calls, their configuration from
 * the TIDEPOOL_TORCH_* variables, and the statistics, peak reset and trim
 * that the Python side (integrations/pytorch) reaches through ctypes. The
 * recording of TIDEPOOL_TORCH_TRACE is torch_trace.c's. */
#include <pthread.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api/api.h"
#include "common/guard.h"

/* ---- configuration -------------------------------------------------------
 */

static const struct {
  const char *env;
  tp_pool_attr_t attr;
} reuse_vars[3] = {
    {"TIDEPOOL_TORCH_REUSE_FOLLOW_EVENTS",
     TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES},
    {"TIDEPOOL_TORCH_REUSE_OPPORTUNISTIC",
     TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC},
    {"TIDEPOOL_TORCH_REUSE_INTERNAL_DEPS",
     TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES},
};

void tp__torch_read_config(tp__torch_config *cfg) {
  /* UINT64_MAX by default, as PyTorch's backend:cudaMallocAsync sets its
   * pool: a training loop frees and reallocates the same sizes every step,
   * and giving memory back at each synchronize would map it again. */
  cfg->release_threshold = UINT64_MAX;
  const char *name = "TIDEPOOL_TORCH_RELEASE_THRESHOLD";
  const char *s = getenv(name);
  if (s && strcasecmp(s, "max") == 0) {
    cfg->release_threshold = UINT64_MAX;
  } else {
    bool bad = false;
    uint64_t v = tp__env_size(name, UINT64_MAX, &bad);
    if (bad)
      tp__env_warn(name, "bytes with an optional K, M, G or T suffix, or max");
    else
      cfg->release_threshold = v;
  }
  /* 2.5% by default, where no variable says otherwise: once a training
   * loop's pool has reached its peak, the library's 1/256 still moves 10-20
   * chunks a step to gather room for the largest tensors, which cost 1.7%
   * and 3.2% of a GPT step in two of three runs on an H200; at 2.5% it
   * moves almost none, for about half a percent more memory
   * (bench/RESULTS.md, "Step times in lockstep").
   * TIDEPOOL_GROWTH_SLACK, every pool's starting slack, is left to rule
   * where the user set it to a valid value (the pool layer reports one that
   * is not, and ignores it: so does this default). */
  name = "TIDEPOOL_GROWTH_SLACK";
  bool bad = false;
  bool all_set = tp__env_count(name, UINT64_MAX, TP_GROWTH_SLACK_MAX, &bad) !=
                     UINT64_MAX &&
                 !bad;
  name = "TIDEPOOL_TORCH_GROWTH_SLACK";
  bad = false;
  cfg->growth_slack =
      tp__env_count(name, all_set ? UINT64_MAX : TP_TORCH_GROWTH_SLACK,
                    TP_GROWTH_SLACK_MAX, &bad);
  if (bad)
    tp__env_warn(name, "parts per million from 0 to 1000000");
  for (int i = 0; i < 3; i++) {
    cfg->reuse[i] = -1;
    s = getenv(reuse_vars[i].env);
    if (!s || !*s)
      continue;
    if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0)
      cfg->reuse[i] = s[0] - '0';
    else
      tp__env_warn(reuse_vars[i].env, "0 or 1");
  }
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static tp__torch_config config;
static pthread_mutex_t configure_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool configured[TP_MAX_DEVICES];

/* TIDEPOOL_TORCH_TIMING: the host time spent in the entry points. */
static atomic_bool timing;
static _Atomic uint64_t timed[4]; /* alloc ns, allocs, free ns, frees */

static void read_config_once(void) {
  tp__torch_read_config(&config);
  const char *t = getenv("TIDEPOOL_TORCH_TIMING");
  if (t && *t && strcmp(t, "0") != 0 && strcmp(t, "1") != 0)
    tp__env_warn("TIDEPOOL_TORCH_TIMING", "0 or 1");
  atomic_store_explicit(&timing, t && strcmp(t, "1") == 0,
                        memory_order_relaxed);
  tp__torch_trace_open();
}

/* Whether calls time themselves; the configuration is read first, so
 * that the process's first call is counted too. */
static bool timing_on(void) {
  pthread_once(&config_once, read_config_once);
  return atomic_load_explicit(&timing, memory_order_relaxed);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void timed_add(int which, uint64_t t0) {
  atomic_fetch_add_explicit(&timed[which], now_ns() - t0, memory_order_relaxed);
  atomic_fetch_add_explicit(&timed[which + 1], 1, memory_order_relaxed);
}

/* Applies the configuration to the device's current pool, once. A failed
 * attempt leaves the device unconfigured, so that the next call retries. */
static tp_error_t configure(int device) {
  if (TP_LIKELY(
          atomic_load_explicit(&configured[device], memory_order_acquire)))
    return TP_SUCCESS;
  pthread_once(&config_once, read_config_once);
  pthread_mutex_lock(&configure_lock);
  tp_error_t err = TP_SUCCESS;
  if (!atomic_load_explicit(&configured[device], memory_order_relaxed)) {
    tp_pool_t pool = NULL;
    uint64_t threshold = config.release_threshold;
    err = tp_device_get_mem_pool(&pool, device);
    if (err == TP_SUCCESS)
      err = tp_pool_set_attribute(pool, TP_POOL_ATTR_RELEASE_THRESHOLD,
                                  &threshold);
    uint64_t slack = config.growth_slack;
    if (err == TP_SUCCESS && slack != UINT64_MAX)
      err = tp_pool_set_attribute(pool, TP_POOL_ATTR_GROWTH_SLACK, &slack);
    for (int i = 0; i < 3 && err == TP_SUCCESS; i++) {
      int on = config.reuse[i];
      if (on >= 0)
        err = tp_pool_set_attribute(pool, reuse_vars[i].attr, &on);
    }
    if (err == TP_SUCCESS)
      atomic_store_explicit(&configured[device], true, memory_order_release);
  }
  pthread_mutex_unlock(&configure_lock);
  return err;
}

/* ---- the calling thread's device -------------------------------------------
 * tidepool's per-thread current device decides which legacy stream NULL
 * means. tp_set_device would also make the device's context current, which
 * is the CUDA runtime's current device: PyTorch frees a tensor of device 1
 * while device 0 is current, and must find device 0 current afterwards. So
 * only tidepool's notion is switched, and put back on the way out. */

static tp_error_t enter(int device, int *saved) {
  /* A platform that did not start answers first, as for every call. */
  if (device < 0 || device >= TP_MAX_DEVICES) {
    TP_FORWARD(tp__api_init());
    return TP_ERROR_INVALID_DEVICE;
  }
  *saved = tp__current_device();
  /* Set before the thread's first initialisation, which makes the context
   * of the thread's current device current: `device` is PyTorch's current
   * device in every allocation. */
  tp__set_current_device(device);
  tp_error_t err = tp__api_init();
  if (err == TP_SUCCESS)
    err = tp__check_device(device);
  if (err == TP_SUCCESS)
    err = configure(device);
  if (err != TP_SUCCESS)
    tp__set_current_device(*saved);
  return err;
}

static void leave(int saved) {
  tp__set_current_device(saved);
}

/* PyTorch has no error channel from a pluggable allocator, so failures go to
 * stderr; the first few only, since a program that runs out of memory
 * tends to fail many allocations in a row. */
#define TORCH_REPORTS 8
static atomic_uint reports;

static void report(const char *what, tp_error_t err, ssize_t size, int device) {
  unsigned n = atomic_fetch_add_explicit(&reports, 1, memory_order_relaxed);
  if (n >= TORCH_REPORTS)
    return;
  /* A failure often ends the program soon after (a failed allocation
   * becomes an illegal address in PyTorch, and then an abort): the trace
   * so far goes to the file now, not at an exit that may never come. */
  tp__torch_trace_flush();
  char bytes[48] = "";
  if (size)
    snprintf(bytes, sizeof bytes, " of %lld bytes", (long long)size);
  fprintf(stderr, "tidepool: %s%s on device %d failed: %s (%s)%s\n", what,
          bytes, device, tp_error_name(err), tp_error_string(err),
          n + 1 == TORCH_REPORTS ? "; further failures are not reported" : "");
}

/* ---- PyTorch's capture hooks ------------------------------------------------
 * PyTorch's CUDAGraph calls its allocator's begin hook before each
 * cudaStreamBeginCapture and the end hook after the cudaStreamEndCapture
 * (and the pair around torch.cuda.use_mem_pool). Once integrations/pytorch
 * has installed them (tp_torch_announce_captures), an allocation or free
 * while no such pair is open asks the driver nothing about capture, as
 * PyTorch's own allocator, which looks for captures only inside its pairs.
 * A pair left open (a capture that failed to begin) keeps the question
 * asked, and keeps the legacy stream's frees deferred (torch_free). */
static atomic_bool announced;
static _Atomic uint32_t torch_captures;
/* Pairs ended so far: a free refused by a capture tries again where one
 * ended during the try (torch_free). */
static _Atomic uint64_t pair_ends;

static bool uncaptured(void) {
  return atomic_load_explicit(&announced, memory_order_acquire) &&
         !atomic_load_explicit(&torch_captures, memory_order_acquire);
}

/* Whether an announced pair is open. */
static bool announced_capture(void) {
  return atomic_load_explicit(&announced, memory_order_acquire) &&
         atomic_load_explicit(&torch_captures, memory_order_acquire);
}

/* ---- record_stream ---------------------------------------------------------
 * Tensor.record_stream(s) says that the tensor's memory is also used by the
 * work queued on s. Each pointer's recorded streams are kept until its
 * free, which makes the freeing stream wait for each of them (an event
 * recorded there) before the free is queued, as PyTorch's
 * backend:cudaMallocAsync does. A free of a pointer never recorded reads
 * one counter. */
/* A recorded stream: a handle, and the device whose legacy stream stands
 * for it where the handle is NULL (-1: the freeing thread's). */
typedef struct rec {
  void *stream;
  int device;
} rec;
typedef struct recorded {
  void *ptr;
  rec *streams;
  uint32_t n, cap;
} recorded;
static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;
static recorded *records;
static uint32_t nrecords, caprecords;
static _Atomic uint32_t nrecords_seen; /* nrecords, read without the lock */
static atomic_bool records_lost;       /* a record failed for want of memory */

/* `ptr`'s entry, or NULL; record_lock held. */
static recorded *records_find(void *ptr) {
  for (uint32_t i = 0; i < nrecords; i++)
    if (records[i].ptr == ptr)
      return &records[i];
  return NULL;
}

/* What `ptr` is to the pools: 1 a live allocation, -1 pool memory that is
 * no allocation now (freed, or inside one), 0 memory no pool holds (a
 * graph's, another allocator's) or of an imported pool. `device`, where
 * not NULL: the device whose memory a live allocation is, or -1. */
static int pool_live(void *ptr, int *device) {
  tp__guard_enter();
  tp__pool *p = tp__registry_find((uintptr_t)ptr);
  size_t live = 0;
  int r = !p || p->imported                                 ? 0
          : tp__pool_live_size(p, ptr, &live) == TP_SUCCESS ? 1
                                                            : -1;
  if (device)
    *device = r == 1 && p->props.location.type == TP_LOCATION_DEVICE
                  ? p->props.location.id
                  : -1;
  tp__guard_exit();
  return r;
}

/* What a stream handle PyTorch passes is: its device, and whether it names
 * the calling thread's own stream (cuda's per-thread default stream); with
 * `held`, the stream itself with a reference, so that a later call can
 * tell whether the program destroyed it without asking its handle. False,
 * with nothing written, where it cannot be told. */
static bool stream_facts(void *stream, int *device, bool *thread_bound,
                         tp__stream **held) {
  if (tp__api_init() != TP_SUCCESS)
    return false;
  tp__guard_enter();
  tp__stream *s = NULL;
  bool found = tp__stream_get((tp_stream_t)stream, &s) == TP_SUCCESS;
  if (found) {
    *device = s->device;
    *thread_bound = s->thread_bound;
    if (held) {
      tp__stream_ref(s);
      *held = s;
    }
  }
  tp__guard_exit();
  return found;
}

/* Takes out `ptr`'s recorded streams (NULL when none); record_lock held. */
static rec *records_take(void *ptr, uint32_t *n) {
  recorded *r = records_find(ptr);
  *n = 0;
  if (!r)
    return NULL;
  rec *streams = r->streams;
  *n = r->n;
  *r = records[--nrecords];
  atomic_store_explicit(&nrecords_seen, nrecords, memory_order_relaxed);
  return streams;
}

/* Where `stream`'s work goes now: 0 outside any capture, 1 to a capture,
 * -1 nowhere (the legacy stream while a blocking stream captures). Without
 * a capture announced, 0; a stream that cannot be asked (destroyed, say)
 * counts as outside, and the order with it is then tried. */
static int capture_side(void *stream) {
  if (uncaptured())
    return 0;
  tp_capture_status_t status = TP_CAPTURE_STATUS_NONE;
  tp_error_t err = tp_stream_is_capturing((tp_stream_t)stream, &status);
  if (err == TP_ERROR_STREAM_CAPTURE_IMPLICIT)
    return -1;
  return err == TP_SUCCESS && status != TP_CAPTURE_STATUS_NONE;
}

/* The device of a stream PyTorch names (NULL: the legacy stream of the
 * device current here), or `fallback` where it cannot be told. */
static int stream_device(void *stream, int fallback) {
  int d = fallback;
  bool bound;
  if (stream)
    (void)stream_facts(stream, &d, &bound, NULL);
  return d;
}

/* Takes out the streams recorded for `ptr` and adds them to `*streams`
 * (`*n` of them, malloc'd, which a deferred free brings along). Where they
 * cannot be joined for want of memory, every free waits for its whole
 * device from then on, as where a record is lost. */
static void records_claim(void *ptr, rec **streams, uint32_t *n) {
  if (TP_LIKELY(!atomic_load_explicit(&nrecords_seen, memory_order_relaxed)))
    return;
  uint32_t m;
  pthread_mutex_lock(&record_lock);
  rec *taken = records_take(ptr, &m);
  pthread_mutex_unlock(&record_lock);
  if (!m)
    return;
  if (!*n) {
    free(*streams);
    *streams = taken;
    *n = m;
    return;
  }
  rec *all = realloc(*streams, (*n + m) * sizeof *all);
  if (!all) {
    free(taken);
    if (!atomic_exchange(&records_lost, true))
      report("record_stream", TP_ERROR_OUT_OF_MEMORY, 0, tp__current_device());
    return;
  }
  memcpy(all + *n, taken, m * sizeof *taken);
  free(taken);
  *streams = all;
  *n += m;
}

/* Makes `stream` wait for the work queued so far on each of the `n`
 * streams recorded for the memory it frees; the device current.
 * STREAM_CAPTURE_UNSUPPORTED where a recorded stream captures and the free
 * does not: the work it queued before its capture cannot be waited for
 * without invalidating the capture, and the free must wait until it ends. */
static tp_error_t wait_recorded(const rec *streams, uint32_t n, void *stream) {
  if (TP_UNLIKELY(atomic_load_explicit(&records_lost, memory_order_relaxed)))
    TP_FORWARD(tp_device_synchronize());
  if (TP_LIKELY(!n))
    return TP_SUCCESS;
  tp_error_t err = TP_SUCCESS;
  int side = capture_side(stream);
  for (uint32_t i = 0; i < n && err == TP_SUCCESS; i++) {
    void *other_stream = streams[i].stream;
    int here = tp__current_device();
    int there = streams[i].device >= 0 ? streams[i].device
                                       : stream_device(other_stream, here);
    if (other_stream == stream && (stream || there == here))
      continue;
    /* The legacy stream is asked nothing during an announced pair: where a
     * blocking stream captures, the question would cost that capture its
     * validity, and an order with the legacy stream could not be queued.
     * The free waits for the pair's end instead. */
    if (!other_stream && announced_capture()) {
      if (side == 0)
        return TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      continue; /* a free in the capture: the legacy stream is outside */
    }
    /* An order between a capture and work outside it cannot be queued
     * (the attempt would invalidate the capture). A recorded stream outside
     * the capture of the free leaves nothing in the graph to wait for: the
     * graph's memory is reused only by the graph. */
    tp__set_current_device(there);
    int other = capture_side(other_stream);
    tp__set_current_device(here);
    if (side == 0 && other > 0)
      return TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (side < 0 || other != side)
      continue;
    /* The event is made on the recorded stream's device (the platform
     * enters that device's context for the call alone); the freeing stream
     * may wait on it from any device. */
    tp_event_t e = NULL;
    tp__set_current_device(there);
    err = tp_event_create(&e);
    if (err == TP_SUCCESS)
      err = tp_event_record(e, (tp_stream_t)other_stream);
    tp__set_current_device(here);
    if (err == TP_SUCCESS)
      err = tp_stream_wait_event((tp_stream_t)stream, e, 0);
    if (e)
      (void)tp_event_destroy(e);
    /* An order that cannot be queued is replaced, outside a capture, by
     * waiting for the recorded stream's work here, and failing that for the
     * device's: the memory is neither reused early nor lost. */
    if (err != TP_SUCCESS && side == 0) {
      tp__set_current_device(there);
      err = tp_stream_synchronize((tp_stream_t)other_stream);
      tp__set_current_device(here);
    }
    /* During an announced pair a device synchronize would cost a capture
     * under way its validity (global mode, say): the free waits for the
     * pair's end instead (a recorded stream destroyed since, say). */
    if (err != TP_SUCCESS && side == 0 && announced_capture())
      return TP_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (err != TP_SUCCESS && side == 0) {
      tp__set_current_device(there);
      err = tp_device_synchronize();
      tp__set_current_device(here);
    }
  }
  return err;
}

/* ---- entry points --------------------------------------------------------
 */

TP_API void *tp_torch_alloc(ssize_t size, int device, void *stream) {
  if (size <= 0) {
    if (size < 0)
      report("tp_torch_alloc", TP_ERROR_INVALID_VALUE, size, device);
    return NULL;
  }
  void *ptr = NULL;
  int saved;
  bool timed_call = timing_on();
  uint64_t t0 = TP_UNLIKELY(timed_call) ? now_ns() : 0;
  tp_error_t err = enter(device, &saved);
  if (err == TP_SUCCESS) {
    err = tp__malloc_async_as(&ptr, (size_t)size, (tp_stream_t)stream,
                              uncaptured());
    /* Recorded with the device current: NULL names its legacy stream. */
    if (err == TP_SUCCESS && TP_UNLIKELY(tp__torch_tracing()))
      tp__torch_trace("alloc", ptr, size, stream);
    leave(saved);
  }
  if (TP_UNLIKELY(timed_call))
    timed_add(0, t0);
  if (err != TP_SUCCESS) {
    report("tp_torch_alloc", err, size, device);
    return NULL;
  }
  return ptr;
}

static bool defer_free(void *ptr, ssize_t size, int device, void *stream,
                       rec *streams, uint32_t nstreams, tp__stream **held);

/* `traced`: the request is in the trace already (a deferred free).
 * `streams`: the `n` streams recorded for `ptr` that a deferred free brings
 * along (malloc'd, or NULL), which this call owns. `held`: a deferred
 * free's stream, with a reference this call owns (NULL for the legacy
 * stream and for a fresh free). */
static void torch_free(void *ptr, ssize_t size, int device, void *stream,
                       bool traced, rec *streams, uint32_t n,
                       tp__stream *held) {
  int saved;
  /* A deferred free was timed when PyTorch made it. */
  bool timed_call = !traced && timing_on();
  uint64_t t0 = TP_UNLIKELY(timed_call) ? now_ns() : 0;
  tp_error_t err = enter(device, &saved);
  if (err == TP_SUCCESS && !traced && TP_UNLIKELY(tp__torch_tracing()))
    tp__torch_trace("free_requested", ptr, size, stream);
  if (err == TP_SUCCESS) {
    /* The records go with the pointer even where the wait fails: the free
     * is then refused (only inside a capture, or where nothing could be
     * waited for), and the memory stays allocated rather than reused too
     * early. A free deferred past a capture keeps them: inside the capture
     * a stream outside it is not waited for, and the deferred free, made
     * outside, must wait for it before the memory goes back to the pool. */
    records_claim(ptr, &streams, &n);
    /* On the legacy stream while a blocking stream captures, the free
     * would be refused and would cost the capture its validity; so would
     * asking. During an announced capture such a free is deferred at once
     * (the capture may be of a non-blocking stream, and the free then
     * waits longer than it had to, never too little), also one deferred
     * before and made by a pair's end while another pair began. */
    bool deferred = !stream && announced_capture() &&
                    defer_free(ptr, size, device, stream, streams, n, &held);
    /* A deferred free whose stream the program destroyed before the pairs
     * ended: its handle is not asked (the driver may no longer know it).
     * The work is waited for with the whole device's, and the free made on
     * the legacy stream, or deferred again where a pair has begun since. */
    bool gone =
        held && atomic_load_explicit(&held->destroyed, memory_order_acquire);
    if (gone) {
      deferred = announced_capture() &&
                 defer_free(ptr, size, device, stream, streams, n, &held);
      if (!deferred && (err = tp_device_synchronize()) == TP_SUCCESS)
        err = tp__free_async_as(ptr, NULL, uncaptured());
    }
    while (!deferred && !gone) {
      uint64_t ends = atomic_load_explicit(&pair_ends, memory_order_acquire);
      err = wait_recorded(streams, n, stream);
      if (err == TP_SUCCESS)
        err = tp__free_async_as(ptr, (tp_stream_t)stream, uncaptured());
      /* Refused for a capture (a live allocation of before it freed inside
       * it, or a capture invalidated already), or waiting on one: made once
       * the pairs end. Where the last pair ended between the refusal and
       * the list's lock, the capture that refused it may be over, and the
       * free is tried again, as long as a pair ended during the try (the
       * next one may refuse it too, and close before the list's lock).
       * Where none ended, the refusal was a capture's outside any pair (or
       * the list could not grow), and stands. */
      if (err != TP_ERROR_INVALID_VALUE &&
          err != TP_ERROR_STREAM_CAPTURE_INVALIDATED &&
          err != TP_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
          err != TP_ERROR_STREAM_CAPTURE_IMPLICIT)
        break;
      deferred = defer_free(ptr, size, device, stream, streams, n, &held);
      if (deferred ||
          atomic_load_explicit(&pair_ends, memory_order_acquire) == ends)
        break;
    }
    if (deferred) {
      err = TP_SUCCESS;
      streams = NULL;
    }
    leave(saved);
  }
  free(streams);
  if (held)
    tp__stream_unref(held);
  if (TP_UNLIKELY(timed_call))
    timed_add(2, t0);
  if (err != TP_SUCCESS)
    report("tp_torch_free", err, size, device);
}

TP_API void tp_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  if (ptr)
    torch_free(ptr, size, device, stream, false, NULL, 0, NULL);
}

/* `op` on the current pool of `device`. A pool that another thread
 * destroys after it was found answers INVALID_VALUE; then the call takes
 * the pool current by now, as an allocation does (alloc.c), while the one
 * it found no longer answers. */
static tp_error_t
on_current_pool(int device, tp_error_t (*op)(tp_pool_t, void *), void *arg) {
  for (int tries = 0;; tries++) {
    tp_pool_t pool = NULL;
    uint64_t probe;
    TP_FORWARD(tp_device_get_mem_pool(&pool, device));
    tp_error_t err = op(pool, arg);
    if (err != TP_ERROR_INVALID_VALUE || tries == 100 ||
        tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                              &probe) == TP_SUCCESS)
      return err;
  }
}

static tp_error_t read_stats(tp_pool_t pool, void *arg) {
  static const tp_pool_attr_t attrs[4] = {
      TP_POOL_ATTR_RESERVED_MEM_CURRENT, TP_POOL_ATTR_RESERVED_MEM_HIGH,
      TP_POOL_ATTR_USED_MEM_CURRENT, TP_POOL_ATTR_USED_MEM_HIGH};
  uint64_t *v = arg;
  for (int i = 0; i < 4; i++)
    TP_FORWARD(tp_pool_get_attribute(pool, attrs[i], &v[i]));
  return TP_SUCCESS;
}

TP_API tp_error_t tp_torch_stats(int device, uint64_t out[4]) {
  TP_RETURN_IF(!out, TP_ERROR_INVALID_VALUE);
  int saved;
  TP_FORWARD(enter(device, &saved));
  uint64_t v[4] = {0};
  tp_error_t err = on_current_pool(device, read_stats, v);
  /* Read one after another: a high read after its current moved up may be
   * below the current read; it was at least that. */
  for (int i = 0; i < 4; i += 2)
    if (v[i + 1] < v[i])
      v[i + 1] = v[i];
  leave(saved);
  if (err == TP_SUCCESS)
    memcpy(out, v, sizeof v);
  return err;
}

TP_API tp_error_t tp_torch_timing(uint64_t out[4]) {
  TP_RETURN_IF(!out, TP_ERROR_INVALID_VALUE);
  for (int i = 0; i < 4; i++)
    out[i] = atomic_load_explicit(&timed[i], memory_order_relaxed);
  return TP_SUCCESS;
}

static tp_error_t reset_peaks(tp_pool_t pool, void *arg) {
  (void)arg;
  uint64_t zero = 0;
  TP_FORWARD(
      tp_pool_set_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_HIGH, &zero));
  return tp_pool_set_attribute(pool, TP_POOL_ATTR_USED_MEM_HIGH, &zero);
}

TP_API tp_error_t tp_torch_reset_peaks(int device) {
  int saved;
  TP_FORWARD(enter(device, &saved));
  tp_error_t err = on_current_pool(device, reset_peaks, NULL);
  leave(saved);
  return err;
}

static tp_error_t trim_to(tp_pool_t pool, void *arg) {
  return tp_pool_trim_to(pool, *(size_t *)arg);
}

TP_API tp_error_t tp_torch_trim(int device, size_t keep) {
  int saved;
  TP_FORWARD(enter(device, &saved));
  /* Trimming releases only frees known to have completed; PyTorch's own
   * synchronizations do not pass through tidepool, so wait here. */
  tp_error_t err = tp_device_synchronize();
  if (err == TP_SUCCESS)
    err = on_current_pool(device, trim_to, &keep);
  leave(saved);
  return err;
}

TP_API void tp_torch_record_stream(void *ptr, void *stream) {
  /* A record of pool memory that is no live allocation (freed already)
   * would wait in the list and attach to the next tensor given that
   * address. */
  int tensor_device = -1;
  if (!ptr || pool_live(ptr, &tensor_device) < 0)
    return;
  /* A thread's first call makes a device's context current: here the
   * tensor's, as an allocation or a free makes the device PyTorch names
   * current, rather than device 0's. */
  int saved = 0;
  bool entered =
      tensor_device >= 0 && enter(tensor_device, &saved) == TP_SUCCESS;
  /* A handle that names the calling thread's own stream (cuda's per-thread
   * default stream) would name the freeing thread's at the free. Such a
   * stream is a blocking one, so the legacy stream, which waits for every
   * blocking stream's work, stands for it. The stream's device is kept:
   * the free must find it even where the stream is destroyed by then. */
  int device = -1;
  bool bound = false;
  bool found = stream && stream_facts(stream, &device, &bound, NULL);
  if (found && bound)
    stream = NULL;
  rec want = {stream, found ? device : -1};
  pthread_mutex_lock(&record_lock);
  recorded *r = records_find(ptr);
  bool ok = true;
  if (!r && (ok = TP_ARRAY_ROOM(records, nrecords, caprecords))) {
    r = &records[nrecords++];
    *r = (recorded){.ptr = ptr};
    atomic_store_explicit(&nrecords_seen, nrecords, memory_order_relaxed);
  }
  bool known = false;
  for (uint32_t i = 0; ok && i < r->n && !known; i++)
    known = r->streams[i].stream == want.stream &&
            r->streams[i].device == want.device;
  if (ok && !known && (ok = TP_ARRAY_ROOM(r->streams, r->n, r->cap)))
    r->streams[r->n++] = want;
  pthread_mutex_unlock(&record_lock);
  /* PyTorch gives this hook no error channel, and a lost record would let
   * the memory be reused under the recorded stream's work: from here on
   * every free waits for the whole device instead. */
  if (!ok && !atomic_exchange(&records_lost, true))
    report("record_stream", TP_ERROR_OUT_OF_MEMORY, 0, tp__current_device());
  if (entered)
    leave(saved);
}

TP_API void tp_torch_empty_cache(void) {
  for (int d = 0; d < TP_MAX_DEVICES; d++) {
    if (!atomic_load_explicit(&configured[d], memory_order_acquire))
      continue;
    tp_error_t err = tp_torch_trim(d, 0);
    if (err != TP_SUCCESS)
      report("torch.cuda.empty_cache", err, 0, d);
  }
}

/* ---- frees deferred past a capture ------------------------------------------
 * A free PyTorch makes, during a capture it announced, of a live pool
 * allocation (a tensor made before the capture) cannot join the graph, and
 * PyTorch never frees again: it is kept here and made on its stream once
 * the last announced capture has ended, as PyTorch's own
 * backend:cudaMallocAsync does. Where the list has no room, the free is
 * refused as before (reported). */
typedef struct deferred {
  void *ptr;
  ssize_t size;
  int device;
  void *stream;
  rec *streams; /* the streams recorded for ptr, to wait for */
  uint32_t nstreams;
  tp__stream *held; /* stream's, with a reference (NULL: the legacy one) */
} deferred;
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static deferred *deferreds;
static uint32_t ndeferred, capdeferred;

/* The pair count is read under the list's lock, under which the last
 * pair's end also takes the list: a free kept here is made by that end,
 * never left for a pair that may not come. *held: the stream's, with a
 * reference, which a kept free takes (*held becomes NULL); where NULL, one
 * is taken here. */
static bool defer_free(void *ptr, ssize_t size, int device, void *stream,
                       rec *streams, uint32_t nstreams, tp__stream **held) {
  if (!announced_capture() || pool_live(ptr, NULL) != 1)
    return false;
  tp__stream *h = *held;
  int there = -1;
  bool bound = false;
  if (!h && stream)
    (void)stream_facts(stream, &there, &bound, &h);
  /* The calling thread's own stream (cuda's per-thread default stream)
   * would be another thread's at the pair's end: the legacy stream, which
   * waits for every blocking stream's work, that one's too, stands for it,
   * as for a record (tp_torch_record_stream). */
  if (h && h->thread_bound) {
    stream = NULL;
    tp__stream_unref(h);
    h = *held = NULL;
  }
  pthread_mutex_lock(&deferred_lock);
  bool kept = announced_capture();
  for (uint32_t i = 0; i < ndeferred && kept; i++)
    kept = deferreds[i].ptr != ptr; /* freed twice: refused */
  kept = kept && TP_ARRAY_ROOM(deferreds, ndeferred, capdeferred);
  if (kept)
    deferreds[ndeferred++] =
        (deferred){ptr, size, device, stream, streams, nstreams, h};
  pthread_mutex_unlock(&deferred_lock);
  if (kept)
    *held = NULL;
  else if (h && h != *held)
    tp__stream_unref(h);
  return kept;
}

static void deferred_run(deferred *v, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    torch_free(v[i].ptr, v[i].size, v[i].device, v[i].stream, true,
               v[i].streams, v[i].nstreams, v[i].held);
  free(v);
}

/* Held while a pair's end makes the frees deferred past it. Each of them
 * reads whether a pair is open and, where none is, uses the legacy stream:
 * a pair begun between the two (another thread's) would have its capture
 * of a blocking stream invalidated by a free that tidepool, not the
 * program, made then. So a begin waits for the frees under way; those
 * that read after it see the pair open and are deferred again. */
static pthread_mutex_t deferred_run_lock = PTHREAD_MUTEX_INITIALIZER;

TP_API void tp_torch_capture_begin(void) {
  atomic_fetch_add_explicit(&torch_captures, 1, memory_order_acq_rel);
  pthread_mutex_lock(&deferred_run_lock);
  pthread_mutex_unlock(&deferred_run_lock);
}

TP_API void tp_torch_capture_end(void) {
  pthread_mutex_lock(&deferred_lock);
  uint32_t n = atomic_load_explicit(&torch_captures, memory_order_relaxed);
  /* Counted before the pair closes: a free that finds it closed (a read
   * without the lock, in defer_free) sees this end too. Ends are made one
   * at a time, under the lock; begins only add. */
  if (n)
    atomic_fetch_add_explicit(&pair_ends, 1, memory_order_acq_rel);
  while (n && !atomic_compare_exchange_weak_explicit(&torch_captures, &n, n - 1,
                                                     memory_order_acq_rel,
                                                     memory_order_relaxed)) {
  }
  deferred *v = NULL;
  uint32_t nv = 0;
  if (n == 1) {
    v = deferreds;
    nv = ndeferred;
    deferreds = NULL;
    ndeferred = capdeferred = 0;
  }
  pthread_mutex_unlock(&deferred_lock);
  pthread_mutex_lock(&deferred_run_lock);
  deferred_run(v, nv);
  pthread_mutex_unlock(&deferred_run_lock);
}

TP_API void tp_torch_announce_captures(void) {
  atomic_store_explicit(&announced, true, memory_order_release);
}
