/* The recording of TIDEPOOL_TORCH_TRACE: the PyTorch entry points'
 * allocations and frees written to a file that tidepool-replay reads, with
 * the optional completion column, guarded against a second process and
 * against fork(). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"

/* ---- recording ------------------------------------------------------------
 * With TIDEPOOL_TORCH_TRACE=FILE, every allocation and free goes to FILE in
 * the CSV format of traces/ (action,addr,size,stream), so that a real
 * workload can be replayed with tidepool-replay. Streams are numbered in
 * order of first use, the legacy default stream first.
 *
 * With TIDEPOOL_TORCH_TRACE_COMPLETION=K as well, a fifth column (done)
 * says how far the operation's stream had run when the operation was
 * issued: the index (from 0, in the file's order) of the newest operation i
 * of that stream such that all work queued on the stream before i was
 * issued had completed, or -1. An event is recorded on the stream at every
 * Kth of its operations, and the stream's outstanding events are queried,
 * oldest first, at each of its operations; so the column is what the host
 * could know at that moment, up to K operations of the stream late. */
#define TRACE_STREAMS 64
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
/* Whether trace_file is open, for the entry points' check without the
 * lock; trace() looks at trace_file again under it. */
atomic_bool tp__torch_trace_on;
static void *trace_streams[TRACE_STREAMS];
static int trace_nstreams = 1; /* 0: the legacy default stream (NULL) */
static int64_t trace_ops;      /* lines written so far */

/* An event and the device it was made on, which a spare one keeps: one
 * stream number may stand for streams of several devices (0 for each
 * device's legacy stream). */
typedef struct device_event {
  tp__pevent *pe;
  int device;
} device_event;

/* The completion column's state, per stream number; under trace_lock. */
typedef struct done_state {
  device_event *events; /* a ring of outstanding events, oldest first */
  int64_t *tags;        /* the operation each one was recorded at */
  size_t head, n, cap;
  uint64_t count; /* the stream's operations so far */
  int64_t done;   /* the newest operation known complete, or -1 */
} done_state;
static unsigned trace_every; /* K; 0: no completion column */
static bool done_column;     /* the file has it, even once it stopped */
static done_state trace_done[TRACE_STREAMS + 1];
static device_event *spares; /* events seen complete, for reuse */
static uint32_t nspare, capspare;

/* A write that failed (a full disk, say) ends the recording, reported
 * once, rather than leave a file that silently lacks operations; trace_lock
 * held. */
static void trace_broken(void) {
  fprintf(stderr,
          "tidepool: TIDEPOOL_TORCH_TRACE: writing failed; the recording "
          "stops here\n");
  (void)fclose(trace_file);
  trace_file = NULL;
  atomic_store_explicit(&tp__torch_trace_on, false, memory_order_relaxed);
}

/* fork() (a DataLoader worker, say) copies the FILE's buffer into the
 * child, whose exit, or whose refused calls (report flushes), would write
 * the parent's buffered lines into the shared file a second time. So the
 * buffer is written out before the fork, with trace_lock held so that no
 * line is half made, and the child closes its copy, empty then, and
 * records nothing: it may make no call (NOT_PERMITTED) anyway. */
static void trace_prepare(void) {
  pthread_mutex_lock(&trace_lock);
  if (trace_file && (fflush(trace_file) != 0 || ferror(trace_file)))
    trace_broken();
}

static void trace_parent(void) {
  pthread_mutex_unlock(&trace_lock);
}

static void trace_child(void) {
  if (trace_file)
    (void)fclose(trace_file);
  trace_file = NULL;
  atomic_store_explicit(&tp__torch_trace_on, false, memory_order_relaxed);
  pthread_mutex_unlock(&trace_lock);
}

/* The variable's path with each %p replaced by the process id and each %%
 * by %, in malloc'd memory (NULL when memory runs out). */
static char *trace_path(const char *spec) {
  size_t len = strlen(spec), room = len + 1;
  for (const char *c = spec; (c = strstr(c, "%p")) != NULL; c += 2)
    room += 20;
  char *path = malloc(room), *out = path;
  if (!path)
    return NULL;
  for (const char *c = spec; *c;) {
    if (c[0] == '%' && c[1] == 'p') {
      out += snprintf(out, room - (size_t)(out - path), "%ld", (long)getpid());
      c += 2;
    } else if (c[0] == '%' && c[1] == '%') {
      *out++ = '%';
      c += 2;
    } else {
      *out++ = *c++;
    }
  }
  *out = 0;
  return path;
}

/* Opens the recording at `path`. Two processes given the same file (the
 * ranks torchrun starts from one environment) would each truncate it and
 * write over the other's lines: a regular file is therefore locked
 * (flock, which goes with the open file, so that no other opening of the
 * file in this process releases it) before it is truncated, and a process
 * that finds it locked by another records nothing and says why. */
static FILE *trace_create(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    fprintf(stderr,
            "tidepool: TIDEPOOL_TORCH_TRACE=%s cannot be written (%s)\n", path,
            strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    int lock_err = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    if (lock_err == EWOULDBLOCK) {
      fprintf(stderr,
              "tidepool: TIDEPOOL_TORCH_TRACE=%s is being written by another "
              "process; this one (%ld) records nothing (a %%p in the path is "
              "replaced by each process's id)\n",
              path, (long)getpid());
      (void)close(fd);
      return NULL;
    }
    /* A file system without locks (some network ones) is still written
     * to, as before the lock, with a note that nothing guards it. */
    if (lock_err)
      fprintf(stderr,
              "tidepool: TIDEPOOL_TORCH_TRACE=%s cannot be locked (%s); "
              "recorded without the check against a second process\n",
              path, strerror(lock_err));
    if (ftruncate(fd, 0) != 0) {
      fprintf(stderr,
              "tidepool: TIDEPOOL_TORCH_TRACE=%s cannot be truncated (%s); "
              "nothing is recorded\n",
              path, strerror(errno));
      (void)close(fd);
      return NULL;
    }
  }
  FILE *f = fdopen(fd, "w");
  if (!f) {
    fprintf(stderr, "tidepool: TIDEPOOL_TORCH_TRACE=%s: %s\n", path,
            strerror(errno));
    (void)close(fd);
  }
  return f;
}

void tp__torch_trace_open(void) {
  const char *spec = getenv("TIDEPOOL_TORCH_TRACE");
  if (!spec || !*spec)
    return;
  bool bad = false;
  trace_every = (unsigned)tp__env_count("TIDEPOOL_TORCH_TRACE_COMPLETION", 0,
                                        1000000, &bad);
  if (bad)
    tp__env_warn("TIDEPOOL_TORCH_TRACE_COMPLETION",
                 "a count of operations, 1 to 1000000, or 0 for none");
  char *path = trace_path(spec);
  if (!path) {
    fprintf(stderr, "tidepool: TIDEPOOL_TORCH_TRACE: out of memory; nothing "
                    "is recorded\n");
    return;
  }
  trace_file = trace_create(path);
  if (!trace_file) {
    free(path);
    return;
  }
  if (pthread_atfork(trace_prepare, trace_parent, trace_child) != 0) {
    fprintf(stderr,
            "tidepool: TIDEPOOL_TORCH_TRACE=%s: out of memory; nothing is "
            "recorded\n",
            path);
    (void)fclose(trace_file);
    trace_file = NULL;
    free(path);
    return;
  }
  free(path);
  /* The last lines are written by the flush at exit, which reports no
   * error: a full disk would leave the file short of them in silence. So
   * they are written here, where a failure is reported; a line recorded
   * after this (a free in a later exit handler) is still written by the
   * C library's own flush. Where no handler can be set, the file is still
   * recorded, without that report. */
  (void)atexit(tp__torch_trace_flush);
  done_column = trace_every != 0;
  fputs(done_column ? "action,addr,size,stream,done\n"
                    : "action,addr,size,stream\n",
        trace_file);
  for (int i = 0; i <= TRACE_STREAMS; i++)
    trace_done[i].done = -1;
  atomic_store_explicit(&tp__torch_trace_on, true, memory_order_relaxed);
}

/* The completion column stops (the rest of the file says -1) at the first
 * failure of the platform, which is reported once. */
static void done_fail(const char *what, tp_error_t err) {
  fprintf(stderr,
          "tidepool: TIDEPOOL_TORCH_TRACE_COMPLETION: %s failed (%s); the "
          "done column says -1 from here on\n",
          what, tp_error_name(err));
  trace_every = 0;
  for (int i = 0; i <= TRACE_STREAMS; i++)
    trace_done[i].done = -1;
}

/* Queries the stream's outstanding events, oldest first, and records a new
 * one every Kth operation; trace_lock held, the op's device current. */
static void done_update(int id, void *stream, int64_t op) {
  done_state *d = &trace_done[id];
  tp__stream *s = NULL;
  tp_error_t err = tp__stream_get((tp_stream_t)stream, &s);
  if (err != TP_SUCCESS) {
    done_fail("finding the stream", err);
    return;
  }
  while (d->n) {
    err = tp__platform->event_query(d->events[d->head].pe);
    if (err == TP_ERROR_NOT_READY)
      break;
    if (err != TP_SUCCESS) {
      done_fail("an event query", err);
      return;
    }
    d->done = d->tags[d->head];
    if (TP_ARRAY_ROOM(spares, nspare, capspare))
      spares[nspare++] = d->events[d->head];
    else
      (void)tp__platform->event_destroy(d->events[d->head].pe);
    d->head = (d->head + 1) % (d->cap ? d->cap : 1);
    d->n--;
  }
  if (d->count++ % trace_every != 0)
    return;
  if (d->n == d->cap) {
    /* Grow the ring, unrolling it so that it starts at 0. */
    size_t cap = d->cap ? d->cap * 2 : 16;
    device_event *ev = malloc(cap * sizeof *ev);
    int64_t *tags = malloc(cap * sizeof *tags);
    if (!ev || !tags) {
      free(ev);
      free(tags);
      done_fail("growing its ring", TP_ERROR_OUT_OF_MEMORY);
      return;
    }
    for (size_t i = 0; i < d->n; i++) {
      ev[i] = d->events[(d->head + i) % d->cap];
      tags[i] = d->tags[(d->head + i) % d->cap];
    }
    free(d->events);
    free(d->tags);
    d->events = ev;
    d->tags = tags;
    d->head = 0;
    d->cap = cap;
  }
  tp__pevent *pe = NULL;
  for (uint32_t i = nspare; i-- > 0 && !pe;)
    if (spares[i].device == s->device) {
      pe = spares[i].pe;
      spares[i] = spares[--nspare];
    }
  if (!pe && (err = tp__platform->event_create(s->device, &pe)) != TP_SUCCESS) {
    done_fail("creating an event", err);
    return;
  }
  err = tp__platform->event_record(pe, s->ps);
  if (err != TP_SUCCESS) {
    (void)tp__platform->event_destroy(pe);
    done_fail("recording an event", err);
    return;
  }
  size_t at = (d->head + d->n) % d->cap;
  d->events[at] = (device_event){pe, s->device};
  d->tags[at] = op;
  d->n++;
}

void tp__torch_trace(const char *action, void *ptr, ssize_t size,
                     void *stream) {
  pthread_mutex_lock(&trace_lock);
  if (!trace_file) {
    pthread_mutex_unlock(&trace_lock);
    return;
  }
  int id = 0;
  if (stream) {
    while (id < trace_nstreams && trace_streams[id] != stream)
      id++;
    if (id == trace_nstreams && id < TRACE_STREAMS)
      trace_streams[trace_nstreams++] = stream;
  }
  int64_t op = trace_ops++;
  if (done_column) {
    /* The column is read before this operation's own event is recorded:
     * it says what was known when the operation was issued. */
    if (trace_every)
      done_update(id, stream, op);
    fprintf(trace_file, "%s,%llu,%lld,%d,%lld\n", action,
            (unsigned long long)(uintptr_t)ptr, (long long)size, id,
            (long long)trace_done[id].done);
  } else {
    fprintf(trace_file, "%s,%llu,%lld,%d\n", action,
            (unsigned long long)(uintptr_t)ptr, (long long)size, id);
  }
  if (ferror(trace_file))
    trace_broken();
  pthread_mutex_unlock(&trace_lock);
}

void tp__torch_trace_flush(void) {
  pthread_mutex_lock(&trace_lock);
  if (trace_file && (fflush(trace_file) != 0 || ferror(trace_file)))
    trace_broken();
  pthread_mutex_unlock(&trace_lock);
}
