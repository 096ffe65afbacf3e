/* The importer's channel to its exporter, the list of imported pools and
 * the mender thread (see channel.h): everything the importing side sends
 * and receives goes through here. */
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ipc/channel.h"

/* ---- the imported pools ---------------------------------------------------
 */

/* Every imported pool, for the settling after a synchronize and for the
 * mender. */
static pthread_mutex_t importers_lock = PTHREAD_MUTEX_INITIALIZER;
static tp__pool **importers;
static uint32_t nimporters, capimporters;
static _Atomic uint32_t importers_count;

void tp__importers_remove(tp__pool *p) {
  pthread_mutex_lock(&importers_lock);
  for (uint32_t i = 0; i < nimporters; i++) {
    if (importers[i] == p) {
      importers[i] = importers[--nimporters];
      atomic_store(&importers_count, nimporters);
      break;
    }
  }
  pthread_mutex_unlock(&importers_lock);
}

tp_error_t tp__importers_add(tp__pool *p) {
  pthread_mutex_lock(&importers_lock);
  bool room = TP_ARRAY_ROOM(importers, nimporters, capimporters);
  if (room) {
    importers[nimporters++] = p;
    atomic_store(&importers_count, nimporters);
  }
  pthread_mutex_unlock(&importers_lock);
  return room ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
}

void tp__importers_settle(void (*settle)(tp__pool *p)) {
  if (!atomic_load_explicit(&importers_count, memory_order_relaxed))
    return;
  pthread_mutex_lock(&importers_lock);
  for (uint32_t i = 0; i < nimporters; i++) {
    tp__ipc_import *m = importers[i]->imp;
    if (pthread_mutex_trylock(&m->mu) != 0)
      continue;
    settle(importers[i]);
    pthread_mutex_unlock(&m->mu);
  }
  pthread_mutex_unlock(&importers_lock);
}

static void mender_wake(void);

/* ---- the channel -------------------------------------------------------- */

/* The exporter is gone (the channel closed or failed): every later send
 * and receive fails at once. The descriptor stays open, since host
 * functions may be sending on it. */
void tp__chan_break(tp__ipc_import *m) {
  (void)shutdown(m->fd, SHUT_RDWR);
}

/* An exporter that did not answer in time, or answered out of step, may
 * only be slow: the channel is not closed, since its closing would make
 * the exporter give up this process's holds, and pointers imported before
 * would then read memory it gives to others. From then on no request is
 * sent (the call fails with INVALID_VALUE, as the header says); releases
 * still go, and a late reply is read when it comes (tp__chan_drain_late). */
void tp__chan_mute(tp__ipc_import *m) {
  atomic_store(&m->muted, true);
}

/* Sends one release if the channel has room now, without waiting. */
static bool release_now(tp__ipc_import *m, uint64_t offset) {
  tp__wire q = tp__wire_make(TP_OP_RELEASE);
  q.offset = offset;
  return tp__wire_send(m->fd, &q, -1, false, 0) == TP_SUCCESS;
}

/* Sends the releases that had to wait, in order, without waiting for room:
 * what does not go out now stays for the next try. rel_mu held. */
void tp__chan_flush(tp__ipc_import *m) {
  uint32_t sent = 0;
  while (sent < m->nunsent && release_now(m, m->unsent[sent]))
    sent++;
  if (!sent)
    return;
  memmove(m->unsent, m->unsent + sent, (m->nunsent - sent) * sizeof *m->unsent);
  m->nunsent -= sent;
}

/* Gives the exporter back one hold, after those still waiting, and never
 * waits for room: a host function on a stream sends it, and an exporter
 * that stopped reading must not stall that stream. Where even the list has
 * no room (memory short), the hold stays until the channel closes. rel_mu
 * held. */
void tp__chan_release(tp__ipc_import *m, uint64_t offset) {
  tp__chan_flush(m);
  if (m->nunsent == 0 && release_now(m, offset))
    return;
  if (TP_ARRAY_ROOM(m->unsent, m->nunsent, m->capunsent)) {
    m->unsent[m->nunsent++] = offset;
    mender_wake();
  }
}

/* Sends a request, after the releases issued before it. The wait for room
 * happens with mu and rel_mu let go: a stream's host function that reports
 * a release takes rel_mu, and a free of an imported pointer mu, and neither
 * may wait for an exporter that stopped reading. */
tp_error_t tp__chan_request(tp__ipc_import *m, const tp__wire *q,
                            void (*with)(tp__ipc_import *m)) {
  uint64_t deadline = tp__ipc_deadline();
  for (;;) {
    TP_RETURN_IF(atomic_load(&m->muted), TP_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&m->rel_mu);
    if (with)
      with(m);
    tp__chan_flush(m);
    errno = 0;
    tp_error_t err = tp__wire_send(m->fd, q, -1, false, 0);
    bool full = err == TP_ERROR_INVALID_VALUE &&
                (errno == EAGAIN || errno == EWOULDBLOCK);
    pthread_mutex_unlock(&m->rel_mu);
    if (!full) {
      if (err != TP_SUCCESS)
        tp__chan_mute(m);
      return err;
    }
    pthread_mutex_unlock(&m->mu);
    int ready = tp__wire_wait(m->fd, POLLOUT, deadline);
    pthread_mutex_lock(&m->mu);
    if (ready <= 0) {
      tp__chan_mute(m); /* no room in time */
      return ready < 0 ? tp__platform_fail(errno, "poll")
                       : TP_ERROR_INVALID_VALUE;
    }
  }
}

/* Waits for the reply to a request, mu let go meanwhile (talk_mu keeps the
 * conversation this thread's). */
tp_error_t tp__chan_reply(tp__ipc_import *m, uint16_t op, tp__wire *a,
                          int *fd) {
  uint64_t deadline = tp__ipc_deadline();
  pthread_mutex_unlock(&m->mu);
  (void)tp__wire_wait(m->fd, POLLIN, deadline);
  pthread_mutex_lock(&m->mu);
  tp__recv_result r = tp__wire_recv(m->fd, a, fd, NULL, NULL, deadline);
  /* A chunk's descriptor that found no room here (this process's table
   * full) leaves the conversation in step: the call fails for want of a
   * descriptor, and the channel serves the next one. Other replies carry
   * none, so one dropped there was not wanted. */
  if (r == TP_RECV_NOFD && a->op == op) {
    TP_RETURN_IF(op == TP_OP_CHUNK_INFO, tp__platform_fail(EMFILE, "recvmsg"));
    r = TP_RECV_OK;
  }
  if (r == TP_RECV_EOF || r == TP_RECV_ERROR) {
    tp__chan_break(m); /* gone */
  } else if (r != TP_RECV_OK) {
    tp__chan_mute(m); /* silent past the deadline, or lying */
    m->reply_owed = r == TP_RECV_AGAIN;
    if (m->reply_owed)
      mender_wake();
  }
  /* An exporter that went with requests unread resets the channel: gone,
   * as one that closed it (the header's INVALID_VALUE). */
  TP_RETURN_IF(r == TP_RECV_ERROR && errno == ECONNRESET,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(r == TP_RECV_ERROR, tp__platform_fail(errno, "recvmsg"));
  TP_RETURN_IF(r != TP_RECV_OK, TP_ERROR_INVALID_VALUE);
  if (a->op != op && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  if (a->op != op)
    tp__chan_mute(m); /* out of step: no later reply could be trusted */
  TP_RETURN_IF(a->op != op, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

/* Reads the reply that did not come in time, if it has come now: one of an
 * import made a hold that no pointer here stands for, and it goes back.
 * mu held. */
void tp__chan_drain_late(tp__ipc_import *m) {
  if (!m->reply_owed)
    return;
  tp__wire a;
  int fd = -1;
  tp__recv_result r = tp__wire_recv(m->fd, &a, &fd, NULL, NULL, 0);
  if (fd >= 0)
    close(fd);
  if (r == TP_RECV_AGAIN)
    return;
  if (r == TP_RECV_NOFD) /* an import's reply carries no descriptor */
    r = TP_RECV_OK;
  m->reply_owed = false;
  if (r == TP_RECV_OK && a.op == TP_OP_IMPORTED &&
      tp__wire_status(a.status, false) == TP_SUCCESS) {
    pthread_mutex_lock(&m->rel_mu);
    tp__chan_release(m, a.offset);
    pthread_mutex_unlock(&m->rel_mu);
  }
}

/* ---- the mender -----------------------------------------------------------
 * An exporter that stopped reading and reads again gets the releases that
 * waited, and a late reply is read, even where this process makes no
 * further call: a thread of its own tries every 10 ms while any is left. */

static pthread_mutex_t mender_lock = PTHREAD_MUTEX_INITIALIZER;
static bool mender_running;
static uint64_t mender_wakes; /* under mender_lock */

/* One importer's turn; true while something is left. */
static bool mend_one(tp__pool *p) {
  tp__ipc_import *m = p->imp;
  if (pthread_mutex_trylock(&m->mu) != 0)
    return true;
  if (!m->dead)
    tp__chan_drain_late(m);
  pthread_mutex_lock(&m->rel_mu);
  tp__chan_flush(m);
  bool left = m->nunsent > 0 || (m->reply_owed && !m->dead);
  pthread_mutex_unlock(&m->rel_mu);
  pthread_mutex_unlock(&m->mu);
  return left;
}

/* Ends once a pass found nothing left and nothing woke it meanwhile. */
static void *mender_main(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&mender_lock);
    uint64_t seen = mender_wakes;
    pthread_mutex_unlock(&mender_lock);
    bool left = false;
    pthread_mutex_lock(&importers_lock);
    for (uint32_t i = 0; i < nimporters; i++)
      left |= mend_one(importers[i]);
    pthread_mutex_unlock(&importers_lock);
    pthread_mutex_lock(&mender_lock);
    bool done = !left && mender_wakes == seen;
    if (done)
      mender_running = false;
    pthread_mutex_unlock(&mender_lock);
    if (done)
      return NULL;
  }
}

/* Where the thread cannot be made, what waits goes at the next settle (a
 * synchronize) or when the pool's destruction closes the channel. */
static void mender_wake(void) {
  pthread_mutex_lock(&mender_lock);
  mender_wakes++;
  if (!mender_running) {
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) == 0) {
      (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      mender_running = pthread_create(&t, &attr, mender_main, NULL) == 0;
      pthread_attr_destroy(&attr);
    }
  }
  pthread_mutex_unlock(&mender_lock);
}
