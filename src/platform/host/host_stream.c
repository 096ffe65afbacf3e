/* Streams and events of the emulated device, above devices and memory. Each
 * stream is a worker thread that runs its queue of operations in order, with
 * the legacy default stream's implicit synchronisation; an event is a
 * position in one stream. A stream keeps the capture it takes part in for
 * host_capture.c without calling it: host_platform.c sends captured work
 * there before it reaches a queue. */
#include <pthread.h>

#include "platform/host/host_internal.h"

/* A position of a stream's work that an operation waits for; the op holds a
 * reference on the stream so that a destroyed stream outlives the wait. */
typedef struct dep {
  tp__pstream *s;
  uint64_t pos;
} dep;

typedef enum op_kind {
  OP_BARRIER, /* waits for its dependencies and does nothing else */
  OP_HOST_FUNC,
  OP_MEM, /* a memset (src NULL) or a memcpy */
  OP_JOB  /* work of the layers above, such as a graph launch */
} op_kind;

typedef struct op {
  struct op *next;
  op_kind kind;
  union {
    struct {
      void (*fn)(void *);
      void *arg;
    } host;
    struct {
      void *dst;
      const void *src;
      int value;
      size_t size;
    } mem;
    tp__host_job job;
  } u;
  size_t ndeps;
  dep deps[];
} op;

struct tp__pstream {
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* the worker sleeps here while the queue is empty */
  pthread_cond_t done_cv; /* waiters sleep here until `completed` advances */
  /* Under mu. */
  op *head, *tail;
  unsigned waiters; /* lets the worker skip the broadcast when nobody waits */
  bool idle;        /* lets a submitter skip the signal when the worker runs */
  bool started;     /* the worker thread starts with the first op */
  bool closing;
  /* Written under mu, read anywhere: positions count ops from 1, so a
   * stream that ran everything has completed == submitted. */
  _Atomic uint64_t submitted;
  _Atomic uint64_t completed;
  /* The position of the first op that faulted since the stream's last
   * synchronize, 0 when none: a synchronize reports it and clears it, an
   * event recorded at or after it reports it and leaves it. */
  _Atomic uint64_t fault_pos;
  /* The creator, the worker, events and deps each hold one. */
  _Atomic uint64_t refs;
  uint64_t uid;
  int device;
  unsigned flags;
  bool legacy;
  tp__pstream *prev, *next; /* the device's list, under its mu */
  /* The device's list of destroyed, drained streams whose fault no
   * synchronize has reported yet, under its mu. */
  tp__pstream *orphan_next;
  /* The stream's membership of a capture, NULL when it captures nothing:
   * host_capture.c's, which changes it under its lock. The stream only asks
   * whether there is one, so it keeps it untyped. */
  _Atomic(void *) member;
};

struct tp__pevent {
  tp__spin lock;
  int device;
  tp__pstream *s; /* NULL: never recorded, or known complete */
  uint64_t pos;
  /* Where capture_event_record put it in a capture, or NULL: kept for
   * host_capture.c, which reads and changes it under its lock. */
  void *recorded_in;
};

typedef struct host_device {
  pthread_mutex_t mu;
  /* Streams made by stream_create, kept until their worker has drained
   * them even after destroy, so that device and legacy synchronisation still
   * see their work. */
  tp__pstream *streams;
  size_t nstreams;
  size_t nblocking;
  tp__pstream legacy; /* holds one reference forever, so it is never freed */
  /* Destroyed streams that drained with a fault unreported, each holding
   * one reference: the next device synchronize reports and clears it. */
  tp__pstream *orphans;
  bool ready;
  /* Blocking streams of the device that take part in a capture: while
   * there is one, legacy-stream work goes to the capture code. */
  _Atomic uint32_t blocking_members;
} host_device;

static host_device devices[TP__HOST_MAX_DEVICES];
static _Atomic uint64_t next_uid = 1;

/* Workers of destroyed streams that have not exited yet. */
static pthread_mutex_t draining_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t draining_cv = PTHREAD_COND_INITIALIZER;
static unsigned draining;

static tp_error_t stream_init(tp__pstream *s, int device, unsigned flags,
                              bool legacy) {
  int rc = pthread_mutex_init(&s->mu, NULL);
  TP_RETURN_IF(rc, tp__platform_fail(rc, "pthread_mutex_init"));
  rc = pthread_cond_init(&s->work_cv, NULL);
  if (rc == 0) {
    rc = pthread_cond_init(&s->done_cv, NULL);
    if (rc)
      pthread_cond_destroy(&s->work_cv);
  }
  if (rc) {
    pthread_mutex_destroy(&s->mu);
    return tp__platform_fail(rc, "pthread_cond_init");
  }
  atomic_init(&s->refs, 1);
  s->uid = atomic_fetch_add(&next_uid, 1);
  s->device = device;
  s->flags = flags;
  s->legacy = legacy;
  return TP_SUCCESS;
}

static void ref(tp__pstream *s) {
  atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

static void unref(tp__pstream *s) {
  if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
    return;
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static bool blocking(const tp__pstream *s) {
  return !(s->flags & TP_STREAM_NON_BLOCKING);
}

/* Reads submitted before completed: completed may then have passed the value
 * read, which only makes the answer fresher. */
static bool busy(tp__pstream *s) {
  uint64_t sub = atomic_load_explicit(&s->submitted, memory_order_acquire);
  return atomic_load_explicit(&s->completed, memory_order_acquire) < sub;
}

static void wait_pos(tp__pstream *s, uint64_t pos) {
  if (atomic_load_explicit(&s->completed, memory_order_acquire) >= pos)
    return;
  pthread_mutex_lock(&s->mu);
  s->waiters++;
  while (atomic_load_explicit(&s->completed, memory_order_relaxed) < pos)
    pthread_cond_wait(&s->done_cv, &s->mu);
  s->waiters--;
  pthread_mutex_unlock(&s->mu);
}

static op *op_alloc(size_t ndeps) {
  op *o = malloc(sizeof(op) + ndeps * sizeof(dep));
  if (o) {
    o->next = NULL;
    o->ndeps = 0;
    /* A barrier until its maker says otherwise: op_free reads the kind of
     * every op, also of one that never went on a stream (the fuzzer's
     * F-J). */
    o->kind = OP_BARRIER;
  }
  return o;
}

static void op_free(op *o) {
  for (size_t i = 0; i < o->ndeps; i++)
    unref(o->deps[i].s);
  if (o->kind == OP_JOB)
    o->u.job.drop(o->u.job.arg);
  free(o);
}

static void add_dep(op *o, tp__pstream *s, uint64_t pos) {
  ref(s);
  o->deps[o->ndeps++] = (dep){s, pos};
}

static void add_if_busy(op *o, tp__pstream *s) {
  uint64_t pos = atomic_load_explicit(&s->submitted, memory_order_acquire);
  if (atomic_load_explicit(&s->completed, memory_order_acquire) < pos)
    add_dep(o, s, pos);
}

/* An op with room for `extra` explicit dependencies, carrying the implicit
 * ones of the legacy stream's semantics: an op on the legacy stream waits
 * for the work already queued on every blocking stream of its device, and an
 * op on a blocking stream waits for the work already queued on the legacy
 * stream. Each position is read before the op is queued, so a wait always
 * points at work queued earlier and two streams can never wait on each
 * other's later work. */
static op *op_new(tp__pstream *s, op_kind kind, size_t extra) {
  host_device *dev = &devices[s->device];
  op *o;
  if (s->legacy) {
    pthread_mutex_lock(&dev->mu);
    o = op_alloc(dev->nblocking + extra);
    for (tp__pstream *t = dev->streams; o && t; t = t->next)
      if (blocking(t))
        add_if_busy(o, t);
    pthread_mutex_unlock(&dev->mu);
  } else if (blocking(s)) {
    o = op_alloc(1 + extra);
    if (o)
      add_if_busy(o, &dev->legacy);
  } else {
    o = op_alloc(extra);
  }
  if (o)
    o->kind = kind;
  return o;
}

/* Whether op_new would give an op on `s` an implicit dependency now. */
static bool implicit_busy(tp__pstream *s) {
  host_device *dev = &devices[s->device];
  if (!blocking(s))
    return false;
  if (!s->legacy)
    return busy(&dev->legacy);
  bool any = false;
  pthread_mutex_lock(&dev->mu);
  for (tp__pstream *t = dev->streams; t && !any; t = t->next)
    any = blocking(t) && busy(t);
  pthread_mutex_unlock(&dev->mu);
  return any;
}

static void unlink_stream(tp__pstream *s) {
  host_device *dev = &devices[s->device];
  pthread_mutex_lock(&dev->mu);
  /* A fault of a destroyed stream can no longer be reported by its own
   * synchronize: keep the stream for the device's next synchronize, which
   * reports the fault and clears it (its events answer ILLEGAL_ADDRESS
   * until then, as they do for a live stream until its synchronize). */
  if (atomic_load_explicit(&s->fault_pos, memory_order_acquire)) {
    ref(s);
    s->orphan_next = dev->orphans;
    dev->orphans = s;
  }
  if (s->prev)
    s->prev->next = s->next;
  else
    dev->streams = s->next;
  if (s->next)
    s->next->prev = s->prev;
  dev->nstreams--;
  dev->nblocking -= blocking(s);
  pthread_mutex_unlock(&dev->mu);
}

/* Notes a fault of the op the worker runs now, whose position is one past
 * what has completed; an earlier fault not yet reported stays. */
static void fault(tp__pstream *s) {
  uint64_t none = 0;
  uint64_t pos = atomic_load_explicit(&s->completed, memory_order_relaxed) + 1;
  atomic_compare_exchange_strong(&s->fault_pos, &none, pos);
}

static void run(tp__pstream *s, op *o) {
  for (size_t i = 0; i < o->ndeps; i++)
    wait_pos(o->deps[i].s, o->deps[i].pos);
  switch (o->kind) {
  case OP_BARRIER: break;
  case OP_HOST_FUNC: o->u.host.fn(o->u.host.arg); break;
  case OP_MEM:
    if (!tp__host_mem_run(s->device, o->u.mem.dst, o->u.mem.src, o->u.mem.value,
                          o->u.mem.size))
      fault(s);
    break;
  case OP_JOB:
    if (!o->u.job.run(o->u.job.arg))
      fault(s);
    break;
  }
}

static void *worker(void *arg) {
  tp__pstream *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->closing) {
      s->idle = true;
      pthread_cond_wait(&s->work_cv, &s->mu);
      s->idle = false;
    }
    op *o = s->head;
    if (!o)
      break;
    s->head = o->next;
    if (!s->head)
      s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    run(s, o);
    op_free(o);
    pthread_mutex_lock(&s->mu);
    uint64_t done = atomic_load_explicit(&s->completed, memory_order_relaxed);
    atomic_store_explicit(&s->completed, done + 1, memory_order_release);
    if (s->waiters)
      pthread_cond_broadcast(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  /* Only a destroyed stream gets here, with its queue drained. */
  unlink_stream(s);
  unref(s);
  pthread_mutex_lock(&draining_mu);
  if (--draining == 0)
    pthread_cond_broadcast(&draining_cv);
  pthread_mutex_unlock(&draining_mu);
  return NULL;
}

/* Called under s->mu. The thread is detached: a destroyed stream's worker
 * drains the queue and frees what it owns without anyone joining it. */
static tp_error_t start_worker(tp__pstream *s) {
  pthread_attr_t attr;
  int rc = pthread_attr_init(&attr);
  TP_RETURN_IF(rc, tp__platform_fail(rc, "pthread_attr_init"));
  rc = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  ref(s);
  if (rc == 0)
    rc = pthread_create(&thread, &attr, worker, s);
  pthread_attr_destroy(&attr);
  if (rc) {
    unref(s);
    return tp__platform_fail(rc, "pthread_create");
  }
  s->started = true;
  return TP_SUCCESS;
}

/* Queues `o` on `s`; on failure frees it. *pos receives its position. */
static tp_error_t push(tp__pstream *s, op *o, uint64_t *pos) {
  pthread_mutex_lock(&s->mu);
  tp_error_t err = s->started ? TP_SUCCESS : start_worker(s);
  if (TP_LIKELY(err == TP_SUCCESS)) {
    if (s->tail)
      s->tail->next = o;
    else
      s->head = o;
    s->tail = o;
    uint64_t p = atomic_load_explicit(&s->submitted, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->submitted, p, memory_order_release);
    if (s->idle)
      pthread_cond_signal(&s->work_cv);
    if (pos)
      *pos = p;
  }
  pthread_mutex_unlock(&s->mu);
  if (err != TP_SUCCESS)
    op_free(o);
  return err;
}

tp_error_t tp__host_streams_init(void) {
  for (int d = 0; d < tp__host_devices; d++) {
    host_device *dev = &devices[d];
    if (dev->ready)
      continue;
    int rc = pthread_mutex_init(&dev->mu, NULL);
    TP_RETURN_IF(rc, tp__platform_fail(rc, "pthread_mutex_init"));
    tp_error_t err = stream_init(&dev->legacy, d, 0, true);
    if (err != TP_SUCCESS) {
      pthread_mutex_destroy(&dev->mu);
      return err;
    }
    dev->ready = true;
  }
  return TP_SUCCESS;
}

/* A stream's handle is its uid, never reused, rather than its address,
 * which the next stream made after its destruction often gets: a destroyed
 * stream's handle must not name that one. */
static tp_stream_t handle_of(const tp__pstream *s) {
  return (tp_stream_t)(uintptr_t)(s->uid << 4);
}

tp_error_t tp__host_stream_create(int device, unsigned flags, tp__pstream **ps,
                                  tp_stream_t *handle, uint64_t *uid) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ps || !handle || !uid, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  TP_RETURN_IF(flags & ~TP_STREAM_NON_BLOCKING, TP_ERROR_INVALID_VALUE);
  tp__pstream *s = calloc(1, sizeof *s);
  TP_RETURN_IF(!s, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t err = stream_init(s, device, flags, false);
  if (err != TP_SUCCESS) {
    free(s);
    return err;
  }
  host_device *dev = &devices[device];
  pthread_mutex_lock(&dev->mu);
  s->next = dev->streams;
  if (s->next)
    s->next->prev = s;
  dev->streams = s;
  dev->nstreams++;
  dev->nblocking += blocking(s);
  pthread_mutex_unlock(&dev->mu);
  atomic_fetch_add(&tp__host_counted.streams, 1);
  *ps = s;
  *handle = handle_of(s);
  *uid = s->uid;
  return TP_SUCCESS;
}

/* Returns at once: a worker that has work left runs it, then unlinks and
 * frees the stream itself. */
tp_error_t tp__host_stream_destroy(tp__pstream *ps) {
  TP_RETURN_IF(!ps || ps->legacy, TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&ps->mu);
  bool started = ps->started;
  if (started) {
    pthread_mutex_lock(&draining_mu);
    draining++;
    pthread_mutex_unlock(&draining_mu);
  }
  ps->closing = true;
  if (ps->idle)
    pthread_cond_signal(&ps->work_cv);
  pthread_mutex_unlock(&ps->mu);
  if (!started)
    unlink_stream(ps);
  atomic_fetch_sub(&tp__host_counted.streams, 1);
  unref(ps);
  return TP_SUCCESS;
}

void tp__host_quiesce(void) {
  pthread_mutex_lock(&draining_mu);
  while (draining)
    pthread_cond_wait(&draining_cv, &draining_mu);
  pthread_mutex_unlock(&draining_mu);
}

uint64_t tp__host_stream_submitted(tp_stream_t stream, int device) {
  if (!stream)
    return device < 0 || device >= tp__host_devices
               ? 0
               : atomic_load_explicit(&devices[device].legacy.submitted,
                                      memory_order_acquire);
  uint64_t n = 0;
  for (int d = 0; d < tp__host_devices; d++) {
    pthread_mutex_lock(&devices[d].mu);
    for (tp__pstream *s = devices[d].streams; s; s = s->next)
      if (handle_of(s) == stream)
        n = atomic_load_explicit(&s->submitted, memory_order_acquire);
    pthread_mutex_unlock(&devices[d].mu);
  }
  return n;
}

tp_error_t tp__host_stream_legacy(int device, tp__stream_desc *desc) {
  TP_RETURN_IF(!desc, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  tp__pstream *s = &devices[device].legacy;
  *desc = (tp__stream_desc){
      .ps = s, .uid = s->uid, .device = device, .flags = 0, .legacy = 1};
  return TP_SUCCESS;
}

/* Every host stream comes from stream_create or stream_legacy, so a handle
 * the core has not registered is no stream at all. */
tp_error_t tp__host_stream_adopt(tp_stream_t handle, tp__stream_desc *desc) {
  (void)handle;
  (void)desc;
  return TP_ERROR_INVALID_VALUE;
}

/* Waits for what an event recorded now would cover: the stream's own work
 * and, through the legacy semantics, the work it implicitly waits for. */
tp_error_t tp__host_stream_synchronize(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  op *o = op_new(ps, OP_BARRIER, 1);
  TP_RETURN_IF(!o, TP_ERROR_OUT_OF_MEMORY);
  add_dep(o, ps, atomic_load_explicit(&ps->submitted, memory_order_acquire));
  for (size_t i = 0; i < o->ndeps; i++)
    wait_pos(o->deps[i].s, o->deps[i].pos);
  op_free(o);
  return atomic_exchange(&ps->fault_pos, 0) ? TP_ERROR_ILLEGAL_ADDRESS
                                            : TP_SUCCESS;
}

static tp_error_t ran_all(tp__pstream *ps) {
  return busy(ps) || implicit_busy(ps) ? TP_ERROR_NOT_READY : TP_SUCCESS;
}

tp_error_t tp__host_stream_query(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  return ran_all(ps);
}

/* Never refuses: a capture begun by another thread after the check only
 * sees this stream's positions read. */
tp_error_t tp__host_stream_poll(tp__pstream *ps) {
  TP_RETURN_IF(!ps, TP_ERROR_INVALID_VALUE);
  if (TP_UNLIKELY(tp__host_stream_capture_involved(ps)))
    return TP_ERROR_NOT_READY;
  return ran_all(ps);
}

tp_error_t tp__host_device_synchronize(int device) {
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  host_device *dev = &devices[device];
  pthread_mutex_lock(&dev->mu);
  op *o = op_alloc(dev->nstreams + 1);
  for (tp__pstream *t = dev->streams; o && t; t = t->next)
    add_dep(o, t, atomic_load_explicit(&t->submitted, memory_order_acquire));
  if (o)
    add_dep(o, &dev->legacy,
            atomic_load_explicit(&dev->legacy.submitted, memory_order_acquire));
  tp__pstream *orphans = o ? dev->orphans : NULL;
  if (o)
    dev->orphans = NULL;
  pthread_mutex_unlock(&dev->mu);
  TP_RETURN_IF(!o, TP_ERROR_OUT_OF_MEMORY);
  bool faulted = false;
  for (size_t i = 0; i < o->ndeps; i++) {
    wait_pos(o->deps[i].s, o->deps[i].pos);
    faulted |= atomic_exchange(&o->deps[i].s->fault_pos, 0) != 0;
  }
  op_free(o);
  while (orphans) {
    tp__pstream *s = orphans;
    orphans = s->orphan_next;
    faulted |= atomic_exchange(&s->fault_pos, 0) != 0;
    unref(s);
  }
  return faulted ? TP_ERROR_ILLEGAL_ADDRESS : TP_SUCCESS;
}

/* A stream wait on an event whose work has completed changes nothing, so it
 * queues nothing. */
tp_error_t tp__host_stream_wait_event(tp__pstream *ps, tp__pevent *ev) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ps || !ev, TP_ERROR_INVALID_VALUE);
  tp__spin_lock(&ev->lock);
  tp__pstream *s = ev->s;
  uint64_t pos = ev->pos;
  if (s && atomic_load_explicit(&s->completed, memory_order_acquire) < pos)
    ref(s);
  else
    s = NULL;
  tp__spin_unlock(&ev->lock);
  if (!s)
    return TP_SUCCESS;
  op *o = op_new(ps, OP_BARRIER, 1);
  if (!o) {
    unref(s);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  o->deps[o->ndeps++] = (dep){s, pos};
  return push(ps, o, NULL);
}

tp_error_t tp__host_stream_mem(tp__pstream *ps, void *dst, const void *src,
                               int value, size_t size) {
  op *o = op_new(ps, OP_MEM, 0);
  TP_RETURN_IF(!o, TP_ERROR_OUT_OF_MEMORY);
  o->u.mem.dst = dst;
  o->u.mem.src = src;
  o->u.mem.value = value;
  o->u.mem.size = size;
  return push(ps, o, NULL);
}

tp_error_t tp__host_stream_host_func(tp__pstream *ps, void (*fn)(void *),
                                     void *arg) {
  op *o = op_new(ps, OP_HOST_FUNC, 0);
  TP_RETURN_IF(!o, TP_ERROR_OUT_OF_MEMORY);
  o->u.host.fn = fn;
  o->u.host.arg = arg;
  return push(ps, o, NULL);
}

tp_error_t tp__host_event_create(int device, tp__pevent **ev) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ev, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  tp__pevent *e = calloc(1, sizeof *e);
  TP_RETURN_IF(!e, TP_ERROR_OUT_OF_MEMORY);
  e->device = device;
  atomic_fetch_add(&tp__host_counted.events, 1);
  *ev = e;
  return TP_SUCCESS;
}

tp_error_t tp__host_event_destroy(tp__pevent *ev) {
  TP_RETURN_IF(!ev, TP_ERROR_INVALID_VALUE);
  if (ev->s)
    unref(ev->s);
  free(ev);
  atomic_fetch_sub(&tp__host_counted.events, 1);
  return TP_SUCCESS;
}

/* Whether work that an event covers faulted: an op of its stream at or
 * before its position (CUDA's event calls report a fault of the work they
 * wait for). An event recorded on completed work keeps its stream only
 * while such a fault is unreported, so that it can report it. */
static bool covers_fault(const tp__pstream *s, uint64_t pos) {
  uint64_t f =
      s ? atomic_load_explicit(&s->fault_pos, memory_order_acquire) : 0;
  return f != 0 && f <= pos;
}

/* Records without waking the worker: the event is the stream's current
 * position. Only where the legacy semantics make the stream wait for other
 * work does a barrier op carry those waits into the position. */
tp_error_t tp__host_event_record(tp__pevent *ev, tp__pstream *ps) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_STREAM),
               tp__host_fault_fail());
  TP_RETURN_IF(!ev || !ps || ev->device != ps->device, TP_ERROR_INVALID_VALUE);
  uint64_t pos;
  if (TP_LIKELY(!implicit_busy(ps))) {
    pos = atomic_load_explicit(&ps->submitted, memory_order_acquire);
  } else {
    op *o = op_new(ps, OP_BARRIER, 0);
    TP_RETURN_IF(!o, TP_ERROR_OUT_OF_MEMORY);
    TP_FORWARD(push(ps, o, &pos));
  }
  tp__pstream *s = NULL;
  if (atomic_load_explicit(&ps->completed, memory_order_acquire) < pos ||
      covers_fault(ps, pos)) {
    s = ps;
    ref(s);
  }
  tp__spin_lock(&ev->lock);
  tp__pstream *old = ev->s;
  ev->s = s;
  ev->pos = pos;
  tp__spin_unlock(&ev->lock);
  if (old)
    unref(old);
  return TP_SUCCESS;
}

tp_error_t tp__host_event_query(tp__pevent *ev) {
  TP_RETURN_IF(!ev, TP_ERROR_INVALID_VALUE);
  tp__spin_lock(&ev->lock);
  bool done = !ev->s || atomic_load_explicit(&ev->s->completed,
                                             memory_order_acquire) >= ev->pos;
  bool faulted = done && covers_fault(ev->s, ev->pos);
  tp__spin_unlock(&ev->lock);
  if (faulted)
    return TP_ERROR_ILLEGAL_ADDRESS;
  return done ? TP_SUCCESS : TP_ERROR_NOT_READY;
}

tp_error_t tp__host_event_synchronize(tp__pevent *ev) {
  TP_RETURN_IF(!ev, TP_ERROR_INVALID_VALUE);
  tp__spin_lock(&ev->lock);
  tp__pstream *s = ev->s;
  uint64_t pos = ev->pos;
  if (s)
    ref(s);
  tp__spin_unlock(&ev->lock);
  bool faulted = false;
  if (s) {
    wait_pos(s, pos);
    faulted = covers_fault(s, pos);
    unref(s);
  }
  return faulted ? TP_ERROR_ILLEGAL_ADDRESS : TP_SUCCESS;
}

/* ---- what the capture code above keeps on streams and events ------------
 */

bool tp__host_stream_capture_involved(tp__pstream *ps) {
  return atomic_load_explicit(&ps->member, memory_order_acquire) ||
         (ps->legacy && tp__host_stream_blocking_captures(ps->device));
}

bool tp__host_stream_blocking_captures(int device) {
  return atomic_load_explicit(&devices[device].blocking_members,
                              memory_order_acquire) != 0;
}

void *tp__host_stream_member(tp__pstream *ps) {
  return atomic_load_explicit(&ps->member, memory_order_acquire);
}

/* The count goes up before the membership shows and down after it is gone,
 * so that a stream seen in a capture always finds its device counted. */
void tp__host_stream_join(tp__pstream *ps, void *member) {
  if (blocking(ps))
    atomic_fetch_add(&devices[ps->device].blocking_members, 1);
  atomic_store_explicit(&ps->member, member, memory_order_release);
}

void tp__host_stream_leave(tp__pstream *ps) {
  atomic_store_explicit(&ps->member, NULL, memory_order_release);
  if (blocking(ps))
    atomic_fetch_sub(&devices[ps->device].blocking_members, 1);
}

void *tp__host_event_capture(const tp__pevent *ev) {
  return ev->recorded_in;
}

void tp__host_event_set_capture(tp__pevent *ev, void *recorded_in) {
  ev->recorded_in = recorded_in;
}

void tp__host_stream_describe(const tp__pstream *ps, int *device, bool *legacy,
                              bool *is_blocking) {
  *device = ps->device;
  *legacy = ps->legacy;
  *is_blocking = blocking(ps);
}

void tp__host_stream_ref(tp__pstream *ps) {
  ref(ps);
}

void tp__host_stream_unref(tp__pstream *ps) {
  unref(ps);
}

/* Queues `job` on ps, ordered after `after` at position `after_pos` (NULL
 * for none). The op takes the job over: its drop runs when the op is done
 * with, also on failure. */
tp_error_t tp__host_stream_job(tp__pstream *ps, const tp__host_job *job,
                               tp__pstream *after, uint64_t after_pos,
                               uint64_t *pos) {
  op *o = op_new(ps, OP_JOB, after ? 1 : 0);
  if (!o) {
    job->drop(job->arg);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  o->u.job = *job;
  if (after &&
      atomic_load_explicit(&after->completed, memory_order_acquire) < after_pos)
    add_dep(o, after, after_pos);
  return push(ps, o, pos);
}
