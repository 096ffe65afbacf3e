/* The lag model's schedule: which gate holds which work, and when each gate
 * opens. Each replay stream (a lane) always ends with a closed gate, so
 * that an event the pool records is a position behind a gate, never the
 * moving end of a stream that is still running. A gate that nothing was
 * queued or recorded behind ("clean") may open without a wait, or be pushed
 * later instead of adding a new one; a gate with something behind it
 * ("dirty") is opened and then waited past, until the stream has reached
 * the next gate. The pool's events are positions on the platform's
 * streams, so what they report only changes while the replay waits, and
 * every run sees the same completions. */
#include "lag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gates.h"
#include "platform/host/host_testing.h"

/* How long a stream may take to reach its next gate before the replay gives
 * up: only a pool that waits on the host for held work (or a bug) takes
 * more than microseconds. */
#define STALL_SECONDS 60

typedef struct gate {
  struct gate *next;
  uint64_t seq;     /* its number on its stream (gates.h) */
  uint64_t open_at; /* the operation before which it opens */
  bool dirty;       /* something was queued or recorded right behind it */
} gate;

typedef struct lane {
  uint16_t id;
  tp_stream_t stream;
  gate *head, *tail;  /* closed gates, in the stream's order */
  uint64_t submitted; /* precise: the stream's position after our pushes */
  bool wait;          /* lag_before: a dirty gate was opened */
  bool fresh; /* the tail came after the last operation: nothing behind it */
} lane;

struct lag_model {
  unsigned lag;
  bool precise;
  uint16_t n;
  lane *lanes;
  gate *spare; /* gate records to reuse */
  gates *gates;
  uint64_t quiet; /* precise: the platform's count after our last push */
};

static struct {
  const gate_memops *memops;
  bool conservative;
} testing;

void lag_testing(const struct gate_memops *memops, bool conservative) {
  testing.memops = memops;
  testing.conservative = conservative;
}

static uint64_t platform_ops(void) {
  return tp__host_fault_ops(TP__HOST_FAULT_STREAM);
}

/* Queues a new closed gate at the end of the lane's stream. */
static int push_gate(lag_model *m, lane *l, uint64_t open_at, char *err,
                     size_t len) {
  gate *g = m->spare;
  if (g)
    m->spare = g->next;
  else if (!(g = malloc(sizeof *g))) {
    snprintf(err, len, "lag model: out of memory");
    return -1;
  }
  char why[300];
  uint64_t seq;
  if (gates_push(m->gates, l->id, &seq, why, sizeof why) != 0) {
    g->next = m->spare;
    m->spare = g;
    snprintf(err, len, "lag model: %s", why);
    return -1;
  }
  *g = (gate){.seq = seq, .open_at = open_at};
  if (l->tail)
    l->tail->next = g;
  else
    l->head = g;
  l->tail = g;
  l->fresh = true;
  if (m->precise) {
    l->submitted = tp__host_stream_submitted(l->stream, 0);
    m->quiet = platform_ops();
  }
  return 0;
}

static void open_gate(lag_model *m, lane *l, gate *g) {
  l->head = g->next;
  if (!l->head)
    l->tail = NULL;
  gates_open(m->gates, l->id, g->seq);
  g->next = m->spare;
  m->spare = g;
}

/* Waits until the lane's stream has reached gate g. */
static int wait_gate(lag_model *m, lane *l, gate *g, char *err, size_t len) {
  if (gates_reached(m->gates, l->id, g->seq, STALL_SECONDS) == 0)
    return 0;
  snprintf(err, len,
           "lag model: stream %u did not reach its next gate in %d s; did "
           "the pool wait on the host for work the model holds back?",
           l->id, STALL_SECONDS);
  return -1;
}

int lag_start(lag_model **out, unsigned lag, tp_stream_t *streams,
              uint16_t nstreams, bool precise, char *err, size_t errlen) {
  *out = NULL;
  const char *platform = tp_platform_name();
  bool on_host = platform && strcmp(platform, "host") == 0;
  const gate_memops *memops = on_host ? NULL : &gate_memops_cuda;
  if (testing.memops || testing.conservative) {
    memops = testing.memops;
    precise = precise && !testing.conservative;
  }
  if (precise && !on_host) {
    snprintf(err, errlen, "lag model: precise needs the host platform");
    return -1;
  }
  lag_model *m = calloc(1, sizeof *m);
  lane *lanes = calloc(nstreams ? nstreams : 1, sizeof *lanes);
  char why[300];
  if (!m || !lanes ||
      gates_start(&m->gates, streams, nstreams, memops, why, sizeof why) != 0) {
    if (m && lanes)
      snprintf(err, errlen, "lag model: %s", why);
    else
      snprintf(err, errlen, "lag model: out of memory");
    free(m);
    free(lanes);
    return -1;
  }
  m->lag = lag;
  m->precise = precise;
  m->n = nstreams;
  m->lanes = lanes;
  for (uint16_t s = 0; s < nstreams; s++) {
    lanes[s].stream = streams[s];
    lanes[s].id = s;
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
      open_gate(m, l, g);
    }
  }
  /* An operation's stream wait raises the gate in front of it (lag_after),
   * which must then hold that operation's work only: raising work of
   * earlier operations (markers recorded on this stream for another's
   * sake) could hold back what another stream's wait counts on. So with
   * several streams each stream that has work behind its last gate gets a
   * gate of its own for this operation, opening when that gate does. */
  for (uint16_t s = 0; m->n > 1 && s < m->n; s++) {
    lane *l = &m->lanes[s];
    if (!l->fresh && l->tail->dirty &&
        push_gate(m, l, l->tail->open_at, err, errlen) != 0)
      return -1;
  }
  for (uint16_t s = 0; any && s < m->n; s++)
    if (m->lanes[s].wait &&
        wait_gate(m, &m->lanes[s], m->lanes[s].head, err, errlen) != 0)
      return -1;
  return 0;
}

int lag_after(lag_model *m, uint64_t k, uint16_t s, bool alloc, char *err,
              size_t errlen) {
  lane *l = &m->lanes[s];
  for (uint16_t i = 0; i < m->n; i++)
    m->lanes[i].fresh = false;
  note_pool_work(m);
  /* A stream wait the pool queued (an internal dependency on another
   * stream's free) runs only after that stream's work: hold the gate in
   * front of it, which holds this operation's work only (lag_before), until
   * every stream's last gate opens, so that the wait never blocks a stream
   * the replay waits on. The precise model sees which streams got work
   * queued; the conservative one assumes an allocation queued a wait on
   * its own stream, where CUDA's pool and tidepool's put them. */
  uint64_t last = 0;
  for (uint16_t i = 0; i < m->n; i++)
    if (m->lanes[i].tail->open_at > last)
      last = m->lanes[i].tail->open_at;
  for (uint16_t i = 0; i < m->n; i++) {
    lane *w = &m->lanes[i];
    bool waited = m->precise
                      ? tp__host_stream_submitted(w->stream, 0) != w->submitted
                      : i == s && alloc && m->n > 1;
    if (waited && w->tail->open_at < last)
      w->tail->open_at = last;
  }
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
  for (uint16_t s = 0; s < m->n; s++)
    while (m->lanes[s].head)
      open_gate(m, &m->lanes[s], m->lanes[s].head);
  uint16_t stuck = 0;
  char why[300] = "";
  int rc = gates_stop(m->gates, STALL_SECONDS, &stuck, why, sizeof why);
  if (rc == GATES_STALLED)
    snprintf(err, errlen,
             "lag model: stream %u did not get past its last gate in %d s",
             stuck, STALL_SECONDS);
  else if (rc != 0)
    snprintf(err, errlen, "lag model: %s", why);
  /* After a stall a gate may still be running: then nothing is freed under
   * it; the process is about to report the failure. */
  if (rc != 0)
    return -1;
  for (gate *g = m->spare, *next; g; g = next) {
    next = g->next;
    free(g);
  }
  free(m->lanes);
  free(m);
  return 0;
}
