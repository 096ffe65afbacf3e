/* The lag model's gates. Each replay stream (a lane) always ends with a
 * closed gate, so that an event the pool records is a position behind a
 * gate, never the moving end of a stream a worker is still running. A gate
 * that nothing was queued or recorded behind ("clean") may open without a
 * wait, or be pushed later instead of adding a new one; a gate with
 * something behind it ("dirty") is opened and then waited past, until the
 * stream's worker has entered the next gate. The pool's events are
 * positions on the platform's streams, so what they report only changes
 * while the replay waits, and every run sees the same completions. */
#include "lag.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "platform/host/host_testing.h"

/* How long a stream may take to reach its next gate before the replay gives
 * up: only a pool that waits on the host for held work (or a bug) takes
 * more than microseconds. */
#define STALL_SECONDS 60

typedef struct lane lane;

typedef struct gate {
  struct gate *next;
  lane *lane;
  uint64_t open_at; /* the operation before which it opens */
  bool dirty;       /* something was queued or recorded right behind it */
  bool open, entered, left; /* under the lane's mutex */
} gate;

struct lane {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tp_stream_t stream;
  uint16_t id;
  gate *head, *tail;   /* closed gates, in the stream's order */
  gate *opened, *last; /* opened gates whose host function may still run */
  gate *spare;         /* gates to reuse */
  uint64_t submitted;  /* precise: the stream's position after our pushes */
  bool wait;           /* lag_before: a dirty gate was opened */
};

struct lag_model {
  unsigned lag;
  bool precise;
  uint16_t n;
  lane *lanes;
  uint64_t quiet; /* precise: the platform's count after our last push */
};

static void gate_fn(void *arg) {
  gate *g = arg;
  lane *l = g->lane;
  pthread_mutex_lock(&l->mu);
  g->entered = true;
  pthread_cond_broadcast(&l->cv);
  while (!g->open)
    pthread_cond_wait(&l->cv, &l->mu);
  g->left = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static uint64_t platform_ops(void) {
  return tp__host_fault_ops(TP__HOST_FAULT_STREAM);
}

/* Moves opened gates that their worker has left to the spare list; lane
 * mutex held. Workers leave gates in order. */
static void reclaim(lane *l) {
  while (l->opened && l->opened->left) {
    gate *g = l->opened;
    l->opened = g->next;
    if (!l->opened)
      l->last = NULL;
    g->next = l->spare;
    l->spare = g;
  }
}

/* Queues a new closed gate at the end of the lane's stream. */
static int push_gate(lag_model *m, lane *l, uint64_t open_at, char *err,
                     size_t len) {
  pthread_mutex_lock(&l->mu);
  reclaim(l);
  gate *g = l->spare;
  if (g)
    l->spare = g->next;
  pthread_mutex_unlock(&l->mu);
  if (!g && !(g = malloc(sizeof *g))) {
    snprintf(err, len, "lag model: out of memory");
    return -1;
  }
  *g = (gate){.lane = l, .open_at = open_at};
  tp_error_t e = tp_launch_host_func(l->stream, gate_fn, g);
  if (e != TP_SUCCESS) {
    free(g);
    snprintf(err, len, "lag model: tp_launch_host_func on stream %u: %s", l->id,
             tp_error_name(e));
    return -1;
  }
  if (l->tail)
    l->tail->next = g;
  else
    l->head = g;
  l->tail = g;
  if (m->precise) {
    l->submitted = tp__host_stream_submitted(l->stream, 0);
    m->quiet = platform_ops();
  }
  return 0;
}

static void open_gate(lane *l, gate *g) {
  l->head = g->next;
  if (!l->head)
    l->tail = NULL;
  g->next = NULL;
  pthread_mutex_lock(&l->mu);
  g->open = true;
  pthread_cond_broadcast(&l->cv);
  if (l->last)
    l->last->next = g;
  else
    l->opened = g;
  l->last = g;
  pthread_mutex_unlock(&l->mu);
}

/* Waits until the lane's worker has entered gate g (or left it, when all is
 * to be left). */
static int wait_gate(lane *l, gate *g, bool left, char *err, size_t len) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += STALL_SECONDS;
  int rc = 0;
  pthread_mutex_lock(&l->mu);
  while (rc == 0 && !(left ? g->left : g->entered))
    rc = pthread_cond_timedwait(&l->cv, &l->mu, &until);
  bool done = left ? g->left : g->entered;
  pthread_mutex_unlock(&l->mu);
  if (done)
    return 0;
  snprintf(err, len,
           "lag model: stream %u did not reach its next gate in %d s (%s); "
           "did the pool wait on the host for work the model holds back?",
           l->id, STALL_SECONDS, rc == ETIMEDOUT ? "timed out" : strerror(rc));
  return -1;
}

int lag_start(lag_model **out, unsigned lag, tp_stream_t *streams,
              uint16_t nstreams, bool precise, char *err, size_t errlen) {
  *out = NULL;
  if (!precise && nstreams > 1) {
    snprintf(err, errlen,
             "--lag with several streams needs the host platform (this "
             "trace has %u streams)",
             nstreams);
    return -1;
  }
  lag_model *m = calloc(1, sizeof *m);
  lane *lanes = calloc(nstreams ? nstreams : 1, sizeof *lanes);
  if (!m || !lanes) {
    free(m);
    free(lanes);
    snprintf(err, errlen, "lag model: out of memory");
    return -1;
  }
  m->lag = lag;
  m->precise = precise;
  m->n = nstreams;
  m->lanes = lanes;
  for (uint16_t s = 0; s < nstreams; s++) {
    lanes[s].stream = streams[s];
    lanes[s].id = s;
    pthread_mutex_init(&lanes[s].mu, NULL);
    pthread_cond_init(&lanes[s].cv, NULL);
  }
  *out = m;
  /* Every stream starts held, so that nothing the pool queues or records
   * ever lies at the moving end of a running stream. */
  for (uint16_t s = 0; s < nstreams; s++)
    if (push_gate(m, &lanes[s], 1, err, errlen) != 0)
      return -1;
  return 0;
}

/* Whatever the pool queued or recorded since our last push lies behind the
 * current last gate of some stream. Without the platform's count, assume it
 * always did. */
static void note_pool_work(lag_model *m) {
  if (m->precise && platform_ops() == m->quiet)
    return;
  for (uint16_t i = 0; i < m->n; i++)
    m->lanes[i].tail->dirty = true;
}

int lag_before(lag_model *m, uint64_t k, char *err, size_t errlen) {
  note_pool_work(m);
  /* All due gates open first, then the waits: a stream may be held by a
   * wait the pool queued on another stream's gate of the same moment. */
  bool any = false;
  for (uint16_t s = 0; s < m->n; s++) {
    lane *l = &m->lanes[s];
    l->wait = false;
    while (l->head->open_at <= k) {
      gate *g = l->head;
      if (g == l->tail) {
        /* A stream whose work is all due must still end with a closed
         * gate; one that nothing refers to can simply stay closed. */
        if (!g->dirty) {
          g->open_at = k + 1;
          break;
        }
        if (push_gate(m, l, k + 1, err, errlen) != 0)
          return -1;
      }
      l->wait |= g->dirty;
      any |= g->dirty;
      open_gate(l, g);
    }
  }
  for (uint16_t s = 0; any && s < m->n; s++)
    if (m->lanes[s].wait &&
        wait_gate(&m->lanes[s], m->lanes[s].head, false, err, errlen) != 0)
      return -1;
  return 0;
}

int lag_after(lag_model *m, uint64_t k, uint16_t s, bool alloc, char *err,
              size_t errlen) {
  lane *l = &m->lanes[s];
  note_pool_work(m);
  /* A stream wait the pool queued on this stream (an internal dependency
   * on another stream's free) runs only after that stream's work: hold
   * this stream's last gate until every other stream's last gate opens, so
   * that the wait never blocks a stream the replay waits on. */
  bool waited = m->precise
                    ? tp__host_stream_submitted(l->stream, 0) != l->submitted
                    : alloc && m->n > 1;
  if (waited)
    for (uint16_t i = 0; i < m->n; i++)
      if (m->lanes[i].tail->open_at > l->tail->open_at)
        l->tail->open_at = m->lanes[i].tail->open_at;
  uint64_t due = k + m->lag + 1;
  if (!l->tail->dirty) {
    if (l->tail->open_at < due)
      l->tail->open_at = due;
    return 0;
  }
  return push_gate(m, l, due, err, errlen);
}

int lag_stop(lag_model *m, char *err, size_t errlen) {
  if (!m)
    return 0;
  int rc = 0;
  char why[300];
  for (uint16_t s = 0; s < m->n; s++) {
    lane *l = &m->lanes[s];
    gate *last = l->tail;
    while (l->head)
      open_gate(l, l->head);
    if (last && wait_gate(l, last, true, why, sizeof why) != 0 && rc == 0) {
      snprintf(err, errlen, "%s", why);
      rc = -1;
    }
  }
  /* After a stall a gate may still be running: then nothing is freed under
   * its worker; the process is about to report the failure. */
  if (rc != 0)
    return rc;
  for (uint16_t s = 0; s < m->n; s++) {
    lane *l = &m->lanes[s];
    pthread_mutex_lock(&l->mu);
    reclaim(l);
    pthread_mutex_unlock(&l->mu);
    for (gate *g = l->spare, *next; g; g = next) {
      next = g->next;
      free(g);
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
  }
  free(m->lanes);
  free(m);
  return 0;
}
