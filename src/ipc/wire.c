/* The transport of src/ipc/: one message of the protocol (wire.h) at a
 * time over a SOCK_SEQPACKET socket, with a descriptor and credentials, and
 * waits bounded by a deadline; export records' check words. Stateless: no
 * lock, no allocation. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ipc/wire.h"

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t tp__ipc_record_check(const tp__ipc_record *r, uint64_t key) {
  uint64_t w[offsetof(tp__ipc_record, check) / 8];
  memcpy(w, r, sizeof w);
  uint64_t h = key;
  for (size_t i = 0; i < sizeof w / 8; i++)
    h = mix(h ^ w[i]);
  return h;
}

bool tp__ipc_record_sane(const tp__ipc_record *r, uint64_t va_size) {
  return r->magic == TP_RECORD_MAGIC && r->version == TP_RECORD_VERSION &&
         r->offset % TP_GRANULE == 0 && r->offset < va_size && r->size != 0 &&
         r->size <= va_size - r->offset;
}

tp_error_t tp__wire_status(int32_t status, bool hello) {
  switch (status) {
  case TP_SUCCESS:
  case TP_ERROR_INVALID_VALUE:
  case TP_ERROR_OUT_OF_MEMORY: return (tp_error_t)status;
  case TP_ERROR_PLATFORM:
    return tp__platform_fail(0, "the exporter's platform");
  case TP_ERROR_NOT_PERMITTED:
  case TP_ERROR_NOT_SUPPORTED:
    return hello ? (tp_error_t)status : TP_ERROR_INVALID_VALUE;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

/* ---- time ------------------------------------------------------------------
 */

static int timeout_ms = TP_IPC_TIMEOUT_MS;
static pthread_once_t timeout_once = PTHREAD_ONCE_INIT;

/* Read once: the variable is for a whole process (tests shorten it for an
 * importer they start). A value that is no positive number of milliseconds
 * leaves the default. */
static void timeout_read(void) {
  const char *s = getenv("TIDEPOOL_IPC_TIMEOUT_MS");
  if (!s || !*s)
    return;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  /* Longer than a day is taken as a day: the wait is still bounded. */
  const long day = 24L * 3600 * 1000;
  if (end && *end == '\0' && v > 0)
    timeout_ms = (int)(v > day || errno == ERANGE ? day : v);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t tp__ipc_deadline(void) {
  pthread_once(&timeout_once, timeout_read);
  return now_ms() + (uint64_t)timeout_ms;
}

/* Waits for `events` on sock until the deadline. 1: ready, 0: the deadline
 * passed, -1: poll failed (errno). */
int tp__wire_wait(int sock, short events, uint64_t deadline) {
  for (;;) {
    uint64_t now = now_ms();
    if (now >= deadline)
      return 0;
    uint64_t left = deadline - now;
    struct pollfd pf = {.fd = sock, .events = events};
    int r = poll(&pf, 1, left > 60000 ? 60000 : (int)left);
    if (r > 0)
      return 1;
    if (r < 0 && errno != EINTR)
      return -1;
  }
}

/* ---- messages ---------------------------------------------------------------
 */

tp_error_t tp__wire_send(int sock, const tp__wire *w, int fd, bool creds,
                         uint64_t deadline) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {(void *)w, sizeof *w};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0 || creds) {
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    size_t len = 0;
    if (fd >= 0) {
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof fd);
      memcpy(CMSG_DATA(c), &fd, sizeof fd);
      len += CMSG_SPACE(sizeof fd);
      c = CMSG_NXTHDR(&m, c);
    }
    if (creds) {
      struct ucred u = {getpid(), geteuid(), getegid()};
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_CREDENTIALS;
      c->cmsg_len = CMSG_LEN(sizeof u);
      memcpy(CMSG_DATA(c), &u, sizeof u);
      len += CMSG_SPACE(sizeof u);
    }
    m.msg_controllen = len;
  }
  /* Never blocking in sendmsg: a peer that stopped reading (or stopped
   * altogether) fills the socket, and the wait for room is bounded. */
  ssize_t n;
  for (;;) {
    n = sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0)
      break;
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      break;
    int ready = deadline ? tp__wire_wait(sock, POLLOUT, deadline) : 0;
    TP_RETURN_IF(ready < 0, tp__platform_fail(errno, "poll"));
    TP_RETURN_IF(ready == 0, TP_ERROR_INVALID_VALUE); /* no room in time */
  }
  /* A peer gone, or a descriptor that is no connected channel at all (a
   * socket never connected, one that listens): the handle's fault, not
   * the system's. */
  TP_RETURN_IF(n < 0 && (errno == EPIPE || errno == ECONNRESET ||
                         errno == ENOTCONN || errno == EDESTADDRREQ ||
                         errno == ENOTSOCK),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(n < 0, tp__platform_fail(errno, "sendmsg"));
  TP_RETURN_IF((size_t)n != sizeof *w, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

tp__recv_result tp__wire_recv(int sock, tp__wire *w, int *fd,
                              struct ucred *cred, bool *has_cred,
                              uint64_t deadline) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
  } ctl;
  struct iovec iov = {w, sizeof *w};
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl.buf,
                     .msg_controllen = sizeof ctl.buf};
  *fd = -1;
  if (has_cred)
    *has_cred = false;
  ssize_t n;
  for (;;) {
    n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0)
      break;
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return TP_RECV_ERROR;
    int ready = deadline ? tp__wire_wait(sock, POLLIN, deadline) : 0;
    if (ready < 0)
      return TP_RECV_ERROR;
    if (ready == 0)
      return TP_RECV_AGAIN;
  }
  bool bad = (m.msg_flags & MSG_TRUNC) != 0;
  /* A control part cut short with no descriptor received: where the
   * message is whole, the descriptor found no room here (EMFILE), which the
   * kernel reports so; a sender of more than our buffer holds gets some
   * through, and is refused below as one that sent too many. */
  bool dropped = (m.msg_flags & MSG_CTRUNC) != 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET)
      continue;
    if (c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int got;
        memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
        if (*fd < 0) {
          *fd = got;
        } else {
          bad = true;
          close(got);
        }
      }
    } else if (c->cmsg_type == SCM_CREDENTIALS && cred && has_cred &&
               c->cmsg_len >= CMSG_LEN(sizeof *cred)) {
      memcpy(cred, CMSG_DATA(c), sizeof *cred);
      *has_cred = true;
    }
  }
  if (!bad && n == 0 && *fd < 0)
    return TP_RECV_EOF;
  bad = bad || (size_t)n != sizeof *w || w->magic != TP_WIRE_MAGIC ||
        w->version != TP_WIRE_VERSION || (dropped && *fd >= 0);
  if (bad && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return bad ? TP_RECV_BAD : dropped ? TP_RECV_NOFD : TP_RECV_OK;
}

/* ---- descriptors a forked child closes ------------------------------------
 * Pages of slots, each a descriptor plus one (0: free), linked and never
 * freed, so that the child's handler, which runs with whatever locks the
 * parent's other threads held at the fork, walks them without a lock. A
 * descriptor is added once open and taken out before it is closed, so that
 * a slot never names a number that another part of the process reuses;
 * both steps are made whole before a fork copies the descriptor table
 * (the prepare handler waits for them), so that no child copies a
 * descriptor made but not yet kept, or taken out but not yet closed (a
 * review found both windows). A count of threads inside a step and a flag
 * rather than a lock: the child, whose thread id differs, could not unlock
 * a lock its parent's thread took. */

#define FD_PAGE 64
typedef struct fd_page {
  _Atomic int slot[FD_PAGE];
  _Atomic(struct fd_page *) next;
} fd_page;
static fd_page fd_first;
static pthread_once_t fd_once = PTHREAD_ONCE_INIT;

static _Atomic int fd_steps;
static atomic_bool fd_forking;
static _Thread_local int fd_mine; /* this thread's steps under way */

static void fd_register(void);

void tp__ipc_fd_begin(void) {
  /* The handlers stand before the first descriptor is made. */
  pthread_once(&fd_once, fd_register);
  for (;;) {
    while (atomic_load(&fd_forking))
      sched_yield();
    atomic_fetch_add(&fd_steps, 1);
    if (!atomic_load(&fd_forking)) {
      fd_mine++;
      return;
    }
    atomic_fetch_sub(&fd_steps, 1);
  }
}

void tp__ipc_fd_end(void) {
  fd_mine--;
  atomic_fetch_sub(&fd_steps, 1);
}

/* Waits for the steps under way, but not for one of the forking thread's
 * own (a fork from a signal handler that interrupted it, which would wait
 * for good), nor past a bound (a thread that cannot run meanwhile): in
 * those rare cases the child may copy one descriptor, as before. */
static void fd_prepare(void) {
  atomic_store(&fd_forking, true);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!fd_mine && atomic_load(&fd_steps)) {
    sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) >
        200000000L)
      break;
  }
}

static void fd_parent(void) {
  atomic_store(&fd_forking, false);
}

static void fd_forked_child(void) {
  atomic_store(&fd_steps, 0);
  atomic_store(&fd_forking, false);
  for (fd_page *g = &fd_first; g;
       g = atomic_load_explicit(&g->next, memory_order_acquire)) {
    for (int i = 0; i < FD_PAGE; i++) {
      int v = atomic_exchange_explicit(&g->slot[i], 0, memory_order_relaxed);
      if (v)
        (void)close(v - 1);
    }
  }
}

static void fd_register(void) {
  (void)pthread_atfork(fd_prepare, fd_parent, fd_forked_child);
}

static bool fd_put(fd_page *g, int v) {
  for (int i = 0; i < FD_PAGE; i++) {
    int free_slot = 0;
    if (atomic_compare_exchange_strong(&g->slot[i], &free_slot, v))
      return true;
  }
  return false;
}

void tp__ipc_fd_keep(int fd) {
  fd_page *g = &fd_first, *fresh = NULL;
  for (;;) {
    if (fd_put(g, fd + 1))
      break;
    fd_page *next = atomic_load(&g->next);
    if (next) {
      g = next;
      continue;
    }
    if (!fresh && !(fresh = calloc(1, sizeof *fresh)))
      return; /* left out of the set (wire.h) */
    atomic_init(&fresh->slot[0], fd + 1);
    if (atomic_compare_exchange_strong(&g->next, &next, fresh))
      return;
    atomic_store(&fresh->slot[0], 0); /* another page came first */
    g = next;
  }
  free(fresh);
}

static void fd_take_out(int fd) {
  for (fd_page *g = &fd_first; g; g = atomic_load(&g->next)) {
    for (int i = 0; i < FD_PAGE; i++) {
      int v = fd + 1;
      if (atomic_compare_exchange_strong(&g->slot[i], &v, 0))
        return;
    }
  }
}

void tp__ipc_fd_close(int fd) {
  tp__ipc_fd_begin();
  fd_take_out(fd);
  (void)close(fd);
  tp__ipc_fd_end();
}

tp_error_t tp__ipc_socketpair(int sv[2], bool both) {
  tp__ipc_fd_begin();
  int made = socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
  if (made == 0) {
    tp__ipc_fd_keep(sv[0]);
    if (both)
      tp__ipc_fd_keep(sv[1]);
  }
  tp__ipc_fd_end();
  TP_RETURN_IF(made != 0, tp__platform_fail(errno, "socketpair"));
  return TP_SUCCESS;
}
