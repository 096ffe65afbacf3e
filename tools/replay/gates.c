/* The two kinds of gates behind gates.h. Both number a stream's gates in the
 * order they are queued, which is the order the stream reaches them: a host
 * function counts the gates it has entered, a memory operation writes the
 * number of the gate it stands before. */
#include "gates.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Memory-operation gates give each stream two words, each on a cache line
 * of its own: the host writes `open`, the device writes `reached`. */
#define WORD_STRIDE 16 /* 64 bytes */
#define OPEN_WORD 0
#define REACHED_WORD 8

typedef struct gate_lane {
  tp_stream_t stream;
  uint64_t pushed; /* the number of the last gate queued */
  /* Host functions: counts under mu, the gate functions and the host
   * waiting on cv. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t opened, entered, left;
  /* Memory operations. */
  _Atomic uint32_t *open, *reached;
} gate_lane;

struct gates {
  uint16_t n;
  gate_lane *lanes;
  const gate_memops *memops; /* NULL: host functions */
  void *ctx;
  _Atomic uint32_t *words;
};

static bool has_reached(uint32_t word, uint64_t value) {
  return (int32_t)(word - (uint32_t)value) >= 0;
}

/* A host function gate: the stream's thread enters it (its number is one
 * more than the last entered, host functions running in stream order),
 * waits until the host opens it, and leaves. */
static void gate_fn(void *arg) {
  gate_lane *l = arg;
  pthread_mutex_lock(&l->mu);
  uint64_t me = ++l->entered;
  pthread_cond_broadcast(&l->cv);
  while (l->opened < me)
    pthread_cond_wait(&l->cv, &l->mu);
  l->left = me;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

int gates_start(gates **out, const tp_stream_t *streams, uint16_t n,
                const gate_memops *memops, char *err, size_t len) {
  *out = NULL;
  gates *g = calloc(1, sizeof *g);
  gate_lane *lanes = calloc(n ? n : 1, sizeof *lanes);
  if (!g || !lanes) {
    free(g);
    free(lanes);
    snprintf(err, len, "out of memory");
    return -1;
  }
  g->n = n;
  g->lanes = lanes;
  g->memops = memops;
  if (memops &&
      memops->alloc(&g->ctx, &g->words, (size_t)(n ? n : 1) * WORD_STRIDE, err,
                    len) != 0) {
    free(lanes);
    free(g);
    return -1;
  }
  for (uint16_t s = 0; s < n; s++) {
    gate_lane *l = &lanes[s];
    l->stream = streams[s];
    if (memops) {
      l->open = &g->words[(size_t)s * WORD_STRIDE + OPEN_WORD];
      l->reached = &g->words[(size_t)s * WORD_STRIDE + REACHED_WORD];
    } else {
      pthread_mutex_init(&l->mu, NULL);
      pthread_cond_init(&l->cv, NULL);
    }
  }
  *out = g;
  return 0;
}

int gates_push(gates *g, uint16_t s, uint64_t *seq, char *err, size_t len) {
  gate_lane *l = &g->lanes[s];
  uint64_t next = l->pushed + 1;
  if (!g->memops) {
    tp_error_t e = tp_launch_host_func(l->stream, gate_fn, l);
    if (e != TP_SUCCESS) {
      snprintf(err, len, "tp_launch_host_func on stream %u: %s", s,
               tp_error_name(e));
      return -1;
    }
    l->pushed = next;
    *seq = next;
    return 0;
  }
  /* The number first, so that the host learns the stream got here while
   * the gate still holds it. The number is used up once written: a wait
   * that fails to queue leaves a gate that holds nothing. */
  if (g->memops->write(g->ctx, l->stream, l->reached, (uint32_t)next, err,
                       len) != 0)
    return -1;
  l->pushed = next;
  if (g->memops->wait(g->ctx, l->stream, l->open, (uint32_t)next, err, len) !=
      0)
    return -1;
  *seq = next;
  return 0;
}

void gates_open(gates *g, uint16_t s, uint64_t seq) {
  gate_lane *l = &g->lanes[s];
  if (g->memops) {
    /* Release: the device may see the gate open only after what the host
     * did before opening it. */
    atomic_store_explicit(l->open, (uint32_t)seq, memory_order_release);
    if (g->memops->changed)
      g->memops->changed(g->ctx);
    return;
  }
  pthread_mutex_lock(&l->mu);
  if (l->opened < seq)
    l->opened = seq;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Polls a word the device writes. A stream gets to its next gate within
 * microseconds unless something holds it, so the poll spins first, then
 * yields, and after a millisecond sleeps between looks. */
static int poll_word(_Atomic uint32_t *word, uint64_t value, int seconds) {
  double start = 0;
  bool napping = false;
  for (unsigned i = 0;; i++) {
    if (has_reached(atomic_load_explicit(word, memory_order_acquire), value))
      return 0;
    if (i < 256)
      continue;
    if (i == 256)
      start = now_s();
    if (napping) {
      struct timespec nap = {0, 50000};
      nanosleep(&nap, NULL);
      if (now_s() - start > seconds)
        return GATES_STALLED;
      continue;
    }
    sched_yield();
    if ((i & 63) == 0 && now_s() - start > 1e-3)
      napping = true;
  }
}

/* Waits on a host function gate's counts until *count reaches value. */
static int wait_count(gate_lane *l, const uint64_t *count, uint64_t value,
                      int seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += seconds;
  int rc = 0;
  pthread_mutex_lock(&l->mu);
  while (rc == 0 && *count < value)
    rc = pthread_cond_timedwait(&l->cv, &l->mu, &until);
  bool done = *count >= value;
  pthread_mutex_unlock(&l->mu);
  return done ? 0 : GATES_STALLED;
}

int gates_reached(gates *g, uint16_t s, uint64_t seq, int seconds) {
  gate_lane *l = &g->lanes[s];
  if (g->memops)
    return poll_word(l->reached, seq, seconds);
  return wait_count(l, &l->entered, seq, seconds);
}

int gates_stop(gates *g, int seconds, uint16_t *stuck, char *err, size_t len) {
  if (!g)
    return 0;
  /* Every stream is let go before any is waited for: a stream may wait for
   * another's work (a stream wait the pool queued). A memory-operation
   * stream then writes one number past its last gate, which the host waits
   * for; no operation on the words is left queued after it. */
  int rc = 0;
  for (uint16_t s = 0; s < g->n; s++) {
    gate_lane *l = &g->lanes[s];
    if (g->memops && rc == 0 &&
        g->memops->write(g->ctx, l->stream, l->reached,
                         (uint32_t)(l->pushed + 1), err, len) != 0) {
      *stuck = s;
      rc = -1;
    }
    gates_open(g, s, l->pushed);
  }
  for (uint16_t s = 0; rc == 0 && s < g->n; s++) {
    gate_lane *l = &g->lanes[s];
    rc = g->memops ? poll_word(l->reached, l->pushed + 1, seconds)
                   : wait_count(l, &l->left, l->pushed, seconds);
    if (rc != 0)
      *stuck = s;
  }
  if (rc != 0)
    return rc;
  for (uint16_t s = 0; !g->memops && s < g->n; s++) {
    pthread_cond_destroy(&g->lanes[s].cv);
    pthread_mutex_destroy(&g->lanes[s].mu);
  }
  if (g->memops)
    g->memops->release(g->ctx, g->words);
  free(g->lanes);
  free(g);
  return 0;
}
