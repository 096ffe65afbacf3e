/* Sharing pools between processes: the exporter's service thread and its
 * records of which exported blocks importers hold, and the importer's side,
 * which maps the exporter's chunks into a range of its own as imported
 * pointers need them and gives its holds back in stream order. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pool/pool.h"

/* ---- the protocol -----------------------------------------------------------
 * tp_pool_export_to_shareable_handle hands out one end of a SOCK_SEQPACKET
 * socketpair, the rendezvous; the pool's service thread keeps the other end.
 * Holding that descriptor is what lets a process map the pool. An importer
 * makes a socketpair of its own, its private channel, and sends one end over
 * the rendezvous (SCM_RIGHTS) together with its credentials
 * (SCM_CREDENTIALS, which the kernel checks: an unprivileged process can
 * claim only its own pid and user). The exporter serves only its own user.
 * SO_PEERCRED could not tell: on a socketpair it names the process that
 * made the pair, which is the exporter itself. Each importer thus has a
 * channel of its own, whose closing, however the importer ends, releases
 * everything it held.
 *
 * Over a private channel, strictly one request and its reply at a time,
 * every message is one struct wire:
 *   HELLO    exporter to importer, once, answering CONNECT: the pool's
 *            description or a refusal, with the descriptor that backs every
 *            chunk where the platform has one (host: the memfd).
 *   IMPORT   an export record. The exporter checks it (its pid, the pool's
 *            serial, the keyed check word, and that it names an exported
 *            allocation that is still live) and records a hold of the
 *            channel on the allocation. Reply IMPORTED.
 *   CHUNK    the index of a chunk inside a block the channel holds; reply
 *            CHUNK_INFO with what the platform needs to map it (an offset
 *            in the backing, or a descriptor of the chunk).
 *   RELEASE  drops one hold; no reply. The importer sends it once its
 *            stream-ordered free of the pointer has completed.
 *
 * Holds keep the exporter's memory still under the importer: a held block
 * is out of reuse even after the exporter frees it (that free is put off
 * until the last hold goes), so the chunks under it are neither moved nor
 * released. The importer maps a chunk only while it holds a block in it,
 * and orders its requests so that it never trusts a mapping across a gap
 * in its holds (see import_pointer). Chunks that no importer maps are the
 * exporter's to trim as it likes. */

#define WIRE_MAGIC 0x70697074u /* "tpip" */
#define WIRE_VERSION 1
enum {
  OP_CONNECT = 1,
  OP_HELLO,
  OP_IMPORT,
  OP_IMPORTED,
  OP_CHUNK,
  OP_CHUNK_INFO,
  OP_RELEASE
};

typedef struct wire {
  uint32_t magic;
  uint16_t version;
  uint16_t op;
  int32_t status;         /* replies: a tp_error_t */
  int32_t loc_type;       /* HELLO: the pool's location and allocation type */
  int32_t loc_id;         /* HELLO */
  int32_t alloc_type;     /* HELLO */
  uint64_t pid;           /* HELLO: the exporting process */
  uint64_t serial;        /* HELLO: the pool */
  uint64_t gran;          /* HELLO: the chunk size */
  uint64_t va_size;       /* HELLO: the pool's virtual range */
  uint64_t max_size;      /* HELLO */
  uint64_t offset;        /* IMPORTED, RELEASE: the allocation; CHUNK: a chunk
                             index; CHUNK_INFO: the chunk's place in the backing */
  uint64_t size;          /* IMPORTED */
  unsigned char data[64]; /* IMPORT: the record; HELLO: the device's uuid */
} wire;
_Static_assert(sizeof(wire) == 144, "a wire message has no padding");

/* The 64 bytes of an exported pointer: which process and pool, where in the
 * pool, how large, the nonce of that export, and a check word keyed with
 * the pool's secret, so that a corrupted or forged record is refused. */
typedef struct record {
  uint32_t magic;
  uint32_t version;
  uint64_t pid;
  uint64_t serial;
  uint64_t offset;
  uint64_t size;
  uint64_t nonce;
  uint64_t reserved;
  uint64_t check;
} record;
_Static_assert(sizeof(record) == sizeof(tp_pool_ptr_export_data_t),
               "an export record fills the driver's 64 bytes");
#define RECORD_MAGIC 0x31787074u /* "tpx1" */
#define RECORD_VERSION 2

/* How long an importer waits for the exporter to answer its CONNECT: a
 * descriptor that is no rendezvous must not hang the caller forever. */
#define HELLO_TIMEOUT_MS 30000

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Covers every byte before the check word. */
static uint64_t record_check(const record *r, uint64_t key) {
  uint64_t w[offsetof(record, check) / 8];
  memcpy(w, r, sizeof w);
  uint64_t h = key;
  for (size_t i = 0; i < sizeof w / 8; i++)
    h = mix(h ^ w[i]);
  return h;
}

static wire wire_make(uint16_t op) {
  wire w;
  memset(&w, 0, sizeof w);
  w.magic = WIRE_MAGIC;
  w.version = WIRE_VERSION;
  w.op = op;
  return w;
}

/* ---- messages ----------------------------------------------------------- */

/* Sends one message with, optionally, one descriptor and this process's
 * credentials. A peer that is gone is INVALID_VALUE: the pool it stood for
 * is gone too. */
static tp_error_t wire_send(int sock, const wire *w, int fd, bool creds,
                            int flags) {
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
  ssize_t n;
  do
    n = sendmsg(sock, &m, flags | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  TP_RETURN_IF(n < 0 && (errno == EPIPE || errno == ECONNRESET),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(n < 0, tp__platform_fail(errno, "sendmsg"));
  TP_RETURN_IF((size_t)n != sizeof *w, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

typedef enum recv_result {
  RECV_OK,
  RECV_AGAIN, /* nothing queued (MSG_DONTWAIT) */
  RECV_EOF,   /* no bytes: the peer is gone, or sent an empty message */
  RECV_BAD,   /* not one of our messages; anything it carried is closed */
  RECV_ERROR  /* the system call failed; errno says why */
} recv_result;

/* Receives one message with at most one descriptor (*fd, else -1) and, on
 * a socket that passes them, the sender's credentials (*has_cred). */
static recv_result wire_recv(int sock, wire *w, int *fd, struct ucred *cred,
                             bool *has_cred, int flags) {
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
  do
    n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? RECV_AGAIN : RECV_ERROR;
  bool bad = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
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
    return RECV_EOF;
  bad = bad || (size_t)n != sizeof *w || w->magic != WIRE_MAGIC ||
        w->version != WIRE_VERSION;
  if (bad && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return bad ? RECV_BAD : RECV_OK;
}

/* ========================================================================
 * The exporting side
 * ======================================================================== */

/* An exported allocation, from its first export until it is freed and no
 * importer holds it any more. */
typedef struct entry {
  uint64_t offset, size, nonce;
  uint32_t holds; /* imports not yet released, over every channel */
  bool freed;     /* the exporter freed it while held: done at the release */
  tp__tag tag;    /* that free's tag, with a reference on its stream */
} entry;

typedef struct hold {
  uint64_t offset;
  uint32_t count;
} hold;

/* An importer's private channel. */
typedef struct conn {
  int fd;
  hold *holds;
  uint32_t nholds, capholds;
} conn;

struct tp__ipc_export {
  /* Guards everything but the thread's own fields. Taken before the pool
   * lock where both are needed, never after it. */
  pthread_mutex_t lock;
  entry *entries; /* sorted by offset */
  uint32_t nentries, capentries;
  uint64_t nonce;
  int *rv; /* our ends of the rendezvous sockets handed out */
  uint32_t nrv, caprv;
  bool closed;  /* the pool was destroyed: no new importers or imports */
  bool stop;    /* the service thread is to end */
  bool running; /* the service thread was started and not yet joined */
  pthread_t thread;
  int wake; /* an eventfd that interrupts the thread's poll */
  /* The thread's own: the private channels it serves. */
  conn *conns;
  uint32_t nconns, capconns;
};

/* The first entry at or after `offset`; lock held. */
static uint32_t entry_index(const tp__ipc_export *x, uint64_t offset) {
  uint32_t lo = 0, hi = x->nentries;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (x->entries[mid].offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static entry *entry_find(tp__ipc_export *x, uint64_t offset) {
  uint32_t i = entry_index(x, offset);
  return i < x->nentries && x->entries[i].offset == offset ? &x->entries[i]
                                                           : NULL;
}

static entry *entry_insert(tp__pool *p, uint64_t offset) {
  tp__ipc_export *x = p->exp;
  if (!TP_RESERVE(x->entries, x->nentries, x->capentries))
    return NULL;
  uint32_t i = entry_index(x, offset);
  memmove(&x->entries[i + 1], &x->entries[i],
          (x->nentries - i) * sizeof *x->entries);
  x->nentries++;
  atomic_store_explicit(&p->ipc_watch, x->nentries, memory_order_relaxed);
  x->entries[i] = (entry){.offset = offset};
  return &x->entries[i];
}

static void entry_remove(tp__pool *p, entry *e) {
  tp__ipc_export *x = p->exp;
  uint32_t i = (uint32_t)(e - x->entries);
  memmove(&x->entries[i], &x->entries[i + 1],
          (x->nentries - i - 1) * sizeof *x->entries);
  x->nentries--;
  atomic_store_explicit(&p->ipc_watch, x->nentries, memory_order_relaxed);
}

static void wake_thread(tp__ipc_export *x) {
  uint64_t one = 1;
  /* EAGAIN: the counter is already non-zero, so the thread wakes anyway. */
  if (write(x->wake, &one, sizeof one) < 0 && errno != EAGAIN)
    (void)tp__platform_fail(errno, "write");
}

tp_error_t tp__ipc_export_init(tp__pool *p) {
  tp__ipc_export *x = calloc(1, sizeof *x);
  TP_RETURN_IF(!x, TP_ERROR_OUT_OF_MEMORY);
  pthread_mutex_init(&x->lock, NULL);
  x->wake = -1;
  p->exp = x;
  return TP_SUCCESS;
}

/* The thread was stopped (or never started). */
void tp__ipc_export_free(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  if (!x)
    return;
  for (uint32_t i = 0; i < x->nentries; i++)
    if (x->entries[i].freed)
      tp__stream_unref(x->entries[i].tag.stream);
  for (uint32_t i = 0; i < x->nrv; i++)
    close(x->rv[i]);
  if (x->wake >= 0)
    close(x->wake);
  free(x->entries);
  free(x->rv);
  pthread_mutex_destroy(&x->lock);
  free(x);
  p->exp = NULL;
  atomic_store_explicit(&p->ipc_watch, 0, memory_order_relaxed);
}

/* Drops one hold on the allocation at `offset`; the last one of a block the
 * exporter already freed finishes that free. No lock held. */
static void release_hold(tp__pool *p, uint64_t offset) {
  tp__ipc_export *x = p->exp;
  bool finish = false;
  tp__tag tag = {0};
  pthread_mutex_lock(&x->lock);
  entry *e = entry_find(x, offset);
  if (e && e->holds && --e->holds == 0 && e->freed) {
    tag = e->tag;
    finish = true;
    entry_remove(p, e);
  }
  pthread_mutex_unlock(&x->lock);
  if (finish)
    (void)tp__pool_free_tagged(p, (void *)(p->space.base + offset), tag);
}

/* Closes a channel and releases everything it held: an importer that ends,
 * however it ends, holds nothing. */
static void conn_drop(tp__pool *p, uint32_t i) {
  tp__ipc_export *x = p->exp;
  conn c = x->conns[i];
  x->conns[i] = x->conns[--x->nconns];
  close(c.fd);
  for (uint32_t h = 0; h < c.nholds; h++)
    while (c.holds[h].count--)
      release_hold(p, c.holds[h].offset);
  free(c.holds);
}

static bool conn_add_hold(conn *c, uint64_t offset) {
  for (uint32_t i = 0; i < c->nholds; i++) {
    if (c->holds[i].offset == offset) {
      c->holds[i].count++;
      return true;
    }
  }
  if (!TP_RESERVE(c->holds, c->nholds, c->capholds))
    return false;
  c->holds[c->nholds++] = (hold){offset, 1};
  return true;
}

/* Checks an export record against the pool and records the channel's hold
 * on the allocation it names. */
static tp_error_t do_import(tp__pool *p, conn *c, const wire *q, wire *a) {
  tp__ipc_export *x = p->exp;
  record r;
  memcpy(&r, q->data, sizeof r);
  TP_RETURN_IF(r.magic != RECORD_MAGIC || r.version != RECORD_VERSION ||
                   r.pid != (uint64_t)getpid() || r.serial != p->serial ||
                   r.reserved != 0 ||
                   r.check != record_check(&r, p->export_key),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(r.offset % TP_GRANULE || r.offset >= p->space.va_size ||
                   r.size == 0 || r.size > p->space.va_size - r.offset,
               TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  size_t live = 0;
  pthread_mutex_lock(&x->lock);
  entry *e = entry_find(x, r.offset);
  /* The entry says the allocation is live (frees take this lock to remove
   * it); the registry must agree before anything is mapped. */
  if (x->closed || !e || e->freed || e->nonce != r.nonce || e->size != r.size ||
      tp__pool_live_size(p, (void *)(p->space.base + r.offset), &live) !=
          TP_SUCCESS ||
      live != r.size)
    err = TP_ERROR_INVALID_VALUE;
  else if (!conn_add_hold(c, r.offset))
    err = TP_ERROR_OUT_OF_MEMORY;
  else
    e->holds++;
  pthread_mutex_unlock(&x->lock);
  TP_FORWARD(err);
  a->offset = r.offset;
  a->size = r.size;
  return TP_SUCCESS;
}

/* What the importer needs to map chunk `index`, which must lie under a
 * block the channel holds: a hold is what keeps the chunk where it is. */
static tp_error_t do_chunk(tp__pool *p, conn *c, uint64_t index, wire *a,
                           int *fd) {
  tp__ipc_export *x = p->exp;
  TP_RETURN_IF(index >= p->space.nchunks, TP_ERROR_INVALID_VALUE);
  uint64_t lo = index * p->space.gran, hi = lo + p->space.gran;
  bool held = false;
  pthread_mutex_lock(&x->lock);
  for (uint32_t i = 0; i < c->nholds && !held; i++) {
    const entry *e = entry_find(x, c->holds[i].offset);
    held = e && e->offset < hi && e->offset + e->size > lo;
  }
  pthread_mutex_unlock(&x->lock);
  TP_RETURN_IF(!held, TP_ERROR_INVALID_VALUE);
  tp__chunk_share share = {0, -1};
  tp__mutex_lock(&p->lock);
  tp__phys phys = p->space.phys[index];
  tp_error_t err = phys ? tp__platform->share_chunk(p->space.res, phys, &share)
                        : TP_ERROR_INVALID_VALUE;
  tp__mutex_unlock(&p->lock);
  TP_FORWARD(err);
  a->offset = share.offset;
  *fd = share.fd;
  return TP_SUCCESS;
}

static void do_release(tp__pool *p, conn *c, uint64_t offset) {
  for (uint32_t i = 0; i < c->nholds; i++) {
    if (c->holds[i].offset != offset)
      continue;
    if (--c->holds[i].count == 0)
      c->holds[i] = c->holds[--c->nholds];
    release_hold(p, offset);
    return;
  }
  /* Not held by this channel: nothing to release. */
}

/* Serves every request queued on channel `i`. False when the channel is to
 * close: the importer went, or broke the protocol, or does not read its
 * replies (which are sent without waiting, so that one importer cannot
 * stall the others). */
static bool serve_conn(tp__pool *p, uint32_t i) {
  for (;;) {
    conn *c = &p->exp->conns[i];
    wire q;
    int fd = -1;
    recv_result r = wire_recv(c->fd, &q, &fd, NULL, NULL, MSG_DONTWAIT);
    if (r == RECV_AGAIN)
      return true;
    if (r != RECV_OK || fd >= 0) {
      if (fd >= 0)
        close(fd); /* importers send no descriptors here */
      return false;
    }
    if (q.op == OP_RELEASE) {
      do_release(p, c, q.offset);
      continue;
    }
    int out = -1;
    wire a;
    if (q.op == OP_IMPORT) {
      a = wire_make(OP_IMPORTED);
      a.status = (int32_t)do_import(p, c, &q, &a);
    } else if (q.op == OP_CHUNK) {
      a = wire_make(OP_CHUNK_INFO);
      a.status = (int32_t)do_chunk(p, c, q.offset, &a, &out);
    } else {
      return false;
    }
    tp_error_t err = wire_send(c->fd, &a, out, false, MSG_DONTWAIT);
    if (out >= 0)
      close(out);
    if (err != TP_SUCCESS)
      return false;
  }
}

/* The answer to a CONNECT: the pool's description, and the descriptor that
 * backs its chunks where the platform has one. */
static tp_error_t hello_make(tp__pool *p, wire *h, int *backing) {
  *h = wire_make(OP_HELLO);
  h->loc_type = (int32_t)p->props.location.type;
  h->loc_id = p->props.location.id;
  h->alloc_type = (int32_t)p->props.alloc_type;
  h->pid = (uint64_t)getpid();
  h->serial = p->serial;
  h->gran = p->space.gran;
  h->va_size = p->space.va_size;
  h->max_size = p->props.max_size;
  if (p->props.location.type == TP_LOCATION_DEVICE)
    TP_FORWARD(tp__platform->device_uuid(p->props.location.id, h->data));
  return tp__platform->share_reservation(p->space.res, backing);
}

/* A CONNECT: `priv` is the importer's end of its private channel, `u` its
 * credentials as the kernel vouches for them. */
static void serve_connect(tp__pool *p, const wire *q, int priv,
                          const struct ucred *u, bool has_cred) {
  tp__ipc_export *x = p->exp;
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(priv, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET) {
    close(priv); /* nothing we could answer on */
    return;
  }
  tp_error_t status = TP_SUCCESS;
  if (q->op != OP_CONNECT)
    status = TP_ERROR_INVALID_VALUE;
  else if (!has_cred || u->uid != geteuid())
    status = TP_ERROR_NOT_PERMITTED; /* another user's process */
  pthread_mutex_lock(&x->lock);
  if (status == TP_SUCCESS && x->closed)
    status = TP_ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&x->lock);
  if (status == TP_SUCCESS && !TP_RESERVE(x->conns, x->nconns, x->capconns))
    status = TP_ERROR_OUT_OF_MEMORY;
  wire h = wire_make(OP_HELLO);
  int backing = -1;
  if (status == TP_SUCCESS)
    status = hello_make(p, &h, &backing);
  h.status = (int32_t)status;
  tp_error_t err = wire_send(priv, &h, backing, false, MSG_DONTWAIT);
  if (backing >= 0)
    close(backing);
  if (status != TP_SUCCESS || err != TP_SUCCESS) {
    close(priv);
    return;
  }
  x->conns[x->nconns++] = (conn){.fd = priv};
}

/* Serves every CONNECT queued on a rendezvous socket. False when it is to
 * close: every copy of the exported descriptor was closed. */
static bool serve_rendezvous(tp__pool *p, int fd, short revents) {
  for (;;) {
    wire q;
    int priv = -1;
    struct ucred u;
    bool has_cred = false;
    recv_result r = wire_recv(fd, &q, &priv, &u, &has_cred, MSG_DONTWAIT);
    switch (r) {
    case RECV_OK:
      if (priv >= 0)
        serve_connect(p, &q, priv, &u, has_cred);
      break;
    case RECV_BAD: break; /* not ours; what it carried is closed */
    case RECV_AGAIN: return true;
    case RECV_EOF:
      /* No bytes: a hang-up, or an empty message, which must not close the
       * rendezvous. Without a hang-up seen, the next poll tells (the peer
       * may have gone since this one). */
      return !(revents & POLLHUP);
    default: return false;
    }
  }
}

/* Our end of a rendezvous goes; lock held. */
static void rendezvous_close(tp__ipc_export *x, int fd) {
  for (uint32_t i = 0; i < x->nrv; i++) {
    if (x->rv[i] == fd) {
      close(fd);
      x->rv[i] = x->rv[--x->nrv];
      return;
    }
  }
}

static void nap_ms(long ms) {
  struct timespec ts = {0, ms * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The service thread of an exporting pool: polls its rendezvous sockets
 * and private channels and answers them, until the pool's teardown stops
 * it. Only this thread closes those descriptors, so that no descriptor is
 * closed under a poll that still watches it. */
static void *serve(void *arg) {
  tp__pool *p = arg;
  tp__ipc_export *x = p->exp;
  struct pollfd *pf = NULL;
  uint32_t cap = 0;
  for (;;) {
    pthread_mutex_lock(&x->lock);
    while (x->closed && x->nrv)
      rendezvous_close(x, x->rv[0]);
    bool stop = x->stop;
    uint32_t nrv = x->nrv, n = 1 + nrv + x->nconns;
    bool room = n <= cap;
    if (!room) {
      struct pollfd *v = realloc(pf, n * sizeof *v);
      if (v) {
        pf = v;
        cap = n;
        room = true;
      }
    }
    if (room) {
      pf[0] = (struct pollfd){.fd = x->wake, .events = POLLIN};
      for (uint32_t i = 0; i < nrv; i++)
        pf[1 + i] = (struct pollfd){.fd = x->rv[i], .events = POLLIN};
      for (uint32_t i = 0; i < x->nconns; i++)
        pf[1 + nrv + i] =
            (struct pollfd){.fd = x->conns[i].fd, .events = POLLIN};
    }
    pthread_mutex_unlock(&x->lock);
    if (stop)
      break;
    if (!room || poll(pf, n, -1) < 0) {
      nap_ms(1); /* memory short, or a failed poll: try again shortly */
      continue;
    }
    uint64_t count;
    if ((pf[0].revents & POLLIN) && read(x->wake, &count, sizeof count) < 0 &&
        errno != EAGAIN)
      nap_ms(1);
    for (uint32_t i = 1; i <= nrv; i++) {
      if (pf[i].revents && !serve_rendezvous(p, pf[i].fd, pf[i].revents)) {
        pthread_mutex_lock(&x->lock);
        rendezvous_close(x, pf[i].fd);
        pthread_mutex_unlock(&x->lock);
      }
    }
    /* Channels are found by descriptor: serving one may drop another. */
    for (uint32_t i = 1 + nrv; i < n; i++) {
      if (!pf[i].revents)
        continue;
      for (uint32_t k = 0; k < x->nconns; k++) {
        if (x->conns[k].fd == pf[i].fd) {
          if (!serve_conn(p, k))
            conn_drop(p, k);
          break;
        }
      }
    }
  }
  pthread_mutex_lock(&x->lock);
  while (x->nrv)
    rendezvous_close(x, x->rv[0]);
  pthread_mutex_unlock(&x->lock);
  while (x->nconns)
    conn_drop(p, 0);
  free(x->conns);
  x->conns = NULL;
  x->capconns = 0;
  free(pf);
  return NULL;
}

/* Starts the service thread; lock held. Its signals are blocked, so that
 * the process's signals go to the threads of the program. */
static tp_error_t start_thread(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  if (x->wake < 0)
    x->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  TP_RETURN_IF(x->wake < 0, tp__platform_fail(errno, "eventfd"));
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&x->thread, NULL, serve, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  TP_RETURN_IF(rc != 0, tp__platform_fail(rc, "pthread_create"));
  x->running = true;
  return TP_SUCCESS;
}

tp_error_t tp__ipc_export_handle(tp__pool *p, int *fd) {
  tp__ipc_export *x = p->exp;
  int sv[2];
  TP_RETURN_IF(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0,
               tp__platform_fail(errno, "socketpair"));
  /* Set before the other end leaves this process, so that every CONNECT
   * arrives with its sender's credentials. */
  int one = 1;
  tp_error_t err = TP_SUCCESS;
  if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0)
    err = tp__platform_fail(errno, "setsockopt");
  pthread_mutex_lock(&x->lock);
  if (err == TP_SUCCESS && x->closed)
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && !TP_RESERVE(x->rv, x->nrv, x->caprv))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS && !x->running)
    err = start_thread(p);
  if (err == TP_SUCCESS)
    x->rv[x->nrv++] = sv[0];
  pthread_mutex_unlock(&x->lock);
  if (err != TP_SUCCESS) {
    close(sv[0]);
    close(sv[1]);
    return err;
  }
  wake_thread(x);
  *fd = sv[1];
  return TP_SUCCESS;
}

tp_error_t tp__ipc_export_pointer(tp__pool *p, void *ptr,
                                  tp_pool_ptr_export_data_t *data) {
  tp__ipc_export *x = p->exp;
  size_t size = 0;
  TP_FORWARD(tp__pool_live_size(p, ptr, &size));
  uint64_t offset = (uint64_t)((uintptr_t)ptr - p->space.base);
  pthread_mutex_lock(&x->lock);
  entry *e = entry_find(x, offset);
  /* A live allocation already exported keeps its nonce, so that every
   * record of it stays good; an entry of another size is left over from a
   * free that raced with an export, and makes way. */
  if (e && !e->freed && e->size != size)
    e->nonce = 0;
  if (!e)
    e = entry_insert(p, offset);
  if (e && !e->nonce) {
    e->size = size;
    e->nonce = ++x->nonce;
  }
  uint64_t nonce = e && !e->freed ? e->nonce : 0;
  pthread_mutex_unlock(&x->lock);
  TP_RETURN_IF(!e, TP_ERROR_OUT_OF_MEMORY);
  TP_RETURN_IF(!nonce, TP_ERROR_INVALID_VALUE); /* freed, still held */
  record r = {.magic = RECORD_MAGIC,
              .version = RECORD_VERSION,
              .pid = (uint64_t)getpid(),
              .serial = p->serial,
              .offset = offset,
              .size = size,
              .nonce = nonce};
  r.check = record_check(&r, p->export_key);
  memcpy(data, &r, sizeof r);
  return TP_SUCCESS;
}

tp_error_t tp__ipc_on_free(tp__pool *p, uintptr_t addr, tp__stream *s,
                           bool *kept) {
  tp__ipc_export *x = p->exp;
  *kept = false;
  TP_RETURN_IF(!x, TP_SUCCESS);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&x->lock);
  entry *e = entry_find(x, (uint64_t)(addr - p->space.base));
  if (e && e->freed) {
    err = TP_ERROR_INVALID_VALUE; /* freed already; importers hold it */
  } else if (e && !e->holds) {
    entry_remove(p, e); /* the free goes on as any other */
  } else if (e) {
    /* Stays out of reuse until the last importer releases it; the tag is
     * taken now, as the free would have taken it. */
    tp__spin_lock(&s->lock);
    e->tag = tp__stream_tag(s);
    tp__spin_unlock(&s->lock);
    tp__stream_ref(s);
    e->freed = true;
    *kept = true;
  }
  pthread_mutex_unlock(&x->lock);
  return err;
}

void tp__ipc_export_close(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  pthread_mutex_lock(&x->lock);
  x->closed = true;
  bool running = x->running;
  pthread_mutex_unlock(&x->lock);
  if (running)
    wake_thread(x);
}

bool tp__ipc_export_stop(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  pthread_mutex_lock(&x->lock);
  bool held = false;
  for (uint32_t i = 0; i < x->nentries && !held; i++)
    held = x->entries[i].holds > 0;
  /* The thread never stops itself: it would have to join itself. */
  bool self = x->running && pthread_equal(pthread_self(), x->thread);
  bool join = !held && !self && x->running;
  if (!held && !self) {
    x->closed = true;
    x->stop = true;
  }
  pthread_mutex_unlock(&x->lock);
  if (held || self)
    return false;
  if (join) {
    wake_thread(x);
    pthread_join(x->thread, NULL);
    pthread_mutex_lock(&x->lock);
    x->running = false;
    pthread_mutex_unlock(&x->lock);
  }
  return true;
}

/* ========================================================================
 * The importing side
 * ======================================================================== */

typedef struct imported {
  uint64_t offset, size;
  uint32_t count; /* imports of it not yet freed */
} imported;

typedef struct span {
  uint64_t offset, size;
} span;

struct tp__ipc_import {
  int fd; /* the private channel */
  uint64_t pid, serial, gran, va_size;
  tp__pres *res;
  uintptr_t base;
  size_t nchunks;
  bool host_pool;  /* host memory: the host's access comes with it */
  bool registered; /* in the registry, so that frees find the pool */
  /* Requests and replies, the tables below and the mappings. Taken before
   * the pool lock. */
  pthread_mutex_t mu;
  uint32_t *refs; /* per chunk: imports not yet released that lie in it */
  tp__phys *phys; /* per chunk: mapped here, or 0 */
  size_t *stale;  /* chunks whose count fell to 0, to unmap (room for all) */
  size_t nstale;
  imported *ptrs; /* sorted by offset */
  uint32_t nptrs, capptrs;
  /* Frees in flight: a host function queued on the freeing stream reports
   * each here when the stream reaches it. Held only for moments, never
   * across a driver call, since those functions run on the platform's own
   * threads. */
  pthread_mutex_t rel_mu;
  pthread_cond_t rel_cv;
  span *done; /* released, not yet taken out of the chunks' counts; room
                 for every pending one is made when its free is issued */
  uint32_t ndone, capdone;
  uint32_t pending; /* host functions queued and not yet run */
};

/* Every imported pool, for the settling after a synchronize. */
static pthread_mutex_t importers_lock = PTHREAD_MUTEX_INITIALIZER;
static tp__pool **importers;
static uint32_t nimporters, capimporters;
static _Atomic uint32_t importers_count;

static void importers_remove(tp__pool *p) {
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

static void import_free_state(tp__ipc_import *m) {
  if (m->res)
    (void)tp__platform->unreserve(m->res);
  if (m->fd >= 0)
    close(m->fd);
  free(m->refs);
  free(m->phys);
  free(m->stale);
  free(m->ptrs);
  free(m->done);
  pthread_mutex_destroy(&m->mu);
  pthread_mutex_destroy(&m->rel_mu);
  pthread_cond_destroy(&m->rel_cv);
  free(m);
}

static tp_error_t recv_reply(tp__ipc_import *m, uint16_t op, wire *a, int *fd) {
  recv_result r = wire_recv(m->fd, a, fd, NULL, NULL, 0);
  TP_RETURN_IF(r == RECV_ERROR, tp__platform_fail(errno, "recvmsg"));
  TP_RETURN_IF(r != RECV_OK, TP_ERROR_INVALID_VALUE); /* the exporter went */
  if (a->op != op && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  TP_RETURN_IF(a->op != op, TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

/* Access of this process's locations to a newly mapped chunk: the host's
 * for host memory, and every device the pool grants. mu held. */
static tp_error_t import_access(tp__pool *p, size_t offset, size_t size) {
  tp_access_desc_t list[TP_MAX_DEVICES + 1];
  size_t n = 0;
  if (p->imp->host_pool)
    list[n++] = (tp_access_desc_t){p->props.location, TP_ACCESS_READ_WRITE};
  for (int d = 0; d < TP_MAX_DEVICES; d++)
    if (p->space.access[d] != TP_ACCESS_NONE)
      list[n++] =
          (tp_access_desc_t){{TP_LOCATION_DEVICE, d, 0}, p->space.access[d]};
  return n ? tp__platform->set_access(p->imp->res, offset, size, list, n)
           : TP_SUCCESS;
}

static void reserved_move(tp__pool *p, int64_t delta) {
  uint64_t r =
      atomic_fetch_add(&p->space.reserved, (uint64_t)delta) + (uint64_t)delta;
  if (delta > 0)
    tp__atomic_max(&p->space.reserved_high, r);
}

/* Unmaps chunk c; mu held. A chunk the platform would not unmap stays
 * recorded, and is tried again before it is used again. */
static tp_error_t chunk_drop(tp__pool *p, size_t c) {
  tp__ipc_import *m = p->imp;
  TP_FORWARD(tp__platform->unmap(m->res, c * m->gran, 1));
  (void)tp__platform->chunk_release(m->res, m->phys[c]);
  m->phys[c] = 0;
  reserved_move(p, -(int64_t)m->gran);
  return TP_SUCCESS;
}

/* Takes the releases reported so far out of the chunks' counts. A chunk
 * that no import uses any more is listed stale, to be unmapped once rel_mu
 * is let go (no driver call under it). mu and rel_mu held. */
static void count_released(tp__ipc_import *m) {
  for (uint32_t i = 0; i < m->ndone; i++) {
    size_t c0 = m->done[i].offset / m->gran;
    size_t c1 = (m->done[i].offset + m->done[i].size - 1) / m->gran;
    /* A count falls to 0 once per call: the list cannot overflow. */
    for (size_t c = c0; c <= c1; c++)
      if (m->refs[c] && --m->refs[c] == 0)
        m->stale[m->nstale++] = c;
  }
  m->ndone = 0;
}

/* Unmaps the stale chunks; mu held. One the platform would not unmap stays
 * mapped with no count, and is unmapped before it is mapped again. */
static void drop_stale(tp__pool *p) {
  tp__ipc_import *m = p->imp;
  for (size_t i = 0; i < m->nstale; i++) {
    size_t c = m->stale[i];
    if (!m->refs[c] && m->phys[c])
      (void)chunk_drop(p, c);
  }
  m->nstale = 0;
}

/* Room in `done` for every release in flight and one more, so that a host
 * function never fails to report one; rel_mu held. */
static bool done_reserve(tp__ipc_import *m) {
  uint32_t need = m->ndone + m->pending + 1;
  if (need <= m->capdone)
    return true;
  uint32_t cap = m->capdone ? m->capdone : 16;
  while (cap < need)
    cap *= 2;
  span *v = realloc(m->done, cap * sizeof *v);
  if (!v)
    return false;
  m->done = v;
  m->capdone = cap;
  return true;
}

/* Gives one hold back: reports the release for the chunks' counts, then
 * tells the exporter. Runs as a host function on the freeing stream once
 * the stream reaches the free, or inline where none could be queued. */
static void release_run(tp__ipc_import *m, uint64_t offset, uint64_t size) {
  pthread_mutex_lock(&m->rel_mu);
  /* Reported before it is sent, so that an import that sees the exporter's
   * state after this release also sees the release (import_pointer). The
   * room was made by the free. */
  m->done[m->ndone++] = (span){offset, size};
  wire q = wire_make(OP_RELEASE);
  q.offset = offset;
  /* An exporter that is gone holds nothing: its failure is no matter. */
  (void)wire_send(m->fd, &q, -1, false, 0);
  if (--m->pending == 0)
    pthread_cond_broadcast(&m->rel_cv);
  pthread_mutex_unlock(&m->rel_mu);
}

typedef struct release_job {
  tp__ipc_import *m;
  uint64_t offset, size;
} release_job;

static void release_fn(void *arg) {
  release_job *j = arg;
  release_run(j->m, j->offset, j->size);
  free(j);
}

static uint32_t ptr_index(const tp__ipc_import *m, uint64_t offset) {
  uint32_t lo = 0, hi = m->nptrs;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (m->ptrs[mid].offset < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Asks the exporter for chunk c, which the channel holds a block in, and
 * maps it with this process's access; mu held. */
static tp_error_t map_one(tp__pool *p, size_t c) {
  tp__ipc_import *m = p->imp;
  if (m->phys[c]) /* left from before a gap in the holds: stale */
    TP_FORWARD(chunk_drop(p, c));
  wire q = wire_make(OP_CHUNK), a;
  q.offset = c;
  TP_FORWARD(wire_send(m->fd, &q, -1, false, 0));
  int fd = -1;
  TP_FORWARD(recv_reply(m, OP_CHUNK_INFO, &a, &fd));
  if (a.status != TP_SUCCESS && fd >= 0)
    close(fd);
  TP_RETURN_IF(a.status != TP_SUCCESS, (tp_error_t)a.status);
  tp__chunk_share share = {a.offset, fd};
  tp__phys phys = 0;
  TP_FORWARD(tp__platform->chunk_import(m->res, &share, &phys));
  tp_error_t err = tp__platform->map(m->res, c * m->gran, &phys, 1);
  if (err != TP_SUCCESS) {
    (void)tp__platform->chunk_release(m->res, phys);
    return err;
  }
  m->phys[c] = phys;
  reserved_move(p, (int64_t)m->gran);
  err = import_access(p, c * m->gran, m->gran);
  if (err != TP_SUCCESS) {
    (void)chunk_drop(p, c);
    return err;
  }
  m->refs[c] = 1;
  return TP_SUCCESS;
}

/* Maps the chunks under [offset, offset + size), which the channel holds,
 * and counts the import in each; mu held. */
static tp_error_t map_range(tp__pool *p, uint64_t offset, uint64_t size) {
  tp__ipc_import *m = p->imp;
  size_t c0 = offset / m->gran, c1 = (offset + size - 1) / m->gran;
  tp_error_t err = TP_SUCCESS;
  size_t c = c0;
  for (; c <= c1 && err == TP_SUCCESS; c++) {
    /* Counted already: a hold has kept it in place since it was mapped. */
    if (m->refs[c])
      m->refs[c]++;
    else
      err = map_one(p, c);
  }
  if (err == TP_SUCCESS)
    return TP_SUCCESS;
  /* c went one past the chunk that failed: undo the counts before it. */
  for (size_t k = c0; k + 1 < c; k++)
    if (--m->refs[k] == 0)
      (void)chunk_drop(p, k);
  return err;
}

tp_error_t tp__ipc_import_pointer(tp__pool *p,
                                  const tp_pool_ptr_export_data_t *data,
                                  void **ptr) {
  tp__ipc_import *m = p->imp;
  record r;
  memcpy(&r, data, sizeof r);
  /* A record of another pool or process, or an impossible one, is refused
   * here; the exporter checks the rest. */
  TP_RETURN_IF(r.magic != RECORD_MAGIC || r.version != RECORD_VERSION ||
                   r.pid != m->pid || r.serial != m->serial ||
                   r.offset % TP_GRANULE || r.offset >= m->va_size ||
                   r.size == 0 || r.size > m->va_size - r.offset,
               TP_ERROR_INVALID_VALUE);
  wire q = wire_make(OP_IMPORT), a;
  memcpy(q.data, &r, sizeof r);
  pthread_mutex_lock(&m->mu);
  /* The releases reported so far are taken, and the request sent, in one
   * stretch of rel_mu, and a host function reports a release and sends it
   * in one stretch too. So every release the exporter sees before this
   * import is in `done`, and a chunk still counted after it was held by the
   * exporter without a gap since it was mapped: its mapping is good. A
   * chunk whose count falls to zero is unmapped before the reply is read,
   * and mapped afresh if this import needs it. */
  pthread_mutex_lock(&m->rel_mu);
  count_released(m);
  tp_error_t err = wire_send(m->fd, &q, -1, false, 0);
  pthread_mutex_unlock(&m->rel_mu);
  drop_stale(p);
  int fd = -1;
  if (err == TP_SUCCESS)
    err = recv_reply(m, OP_IMPORTED, &a, &fd);
  if (fd >= 0)
    close(fd);
  if (err == TP_SUCCESS && a.status != TP_SUCCESS)
    err = (tp_error_t)a.status;
  if (err == TP_SUCCESS && (a.offset != r.offset || a.size != r.size))
    err = TP_ERROR_INVALID_VALUE;
  bool held = err == TP_SUCCESS;
  uint32_t i = ptr_index(m, r.offset);
  bool known = i < m->nptrs && m->ptrs[i].offset == r.offset;
  if (err == TP_SUCCESS && !known && !TP_RESERVE(m->ptrs, m->nptrs, m->capptrs))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS)
    err = map_range(p, r.offset, r.size);
  if (err == TP_SUCCESS && known) {
    m->ptrs[i].count++;
  } else if (err == TP_SUCCESS) {
    memmove(&m->ptrs[i + 1], &m->ptrs[i], (m->nptrs - i) * sizeof *m->ptrs);
    m->ptrs[i] = (imported){r.offset, r.size, 1};
    m->nptrs++;
  }
  if (err != TP_SUCCESS && held) {
    /* Give back the hold the exporter recorded. */
    pthread_mutex_lock(&m->rel_mu);
    wire rel = wire_make(OP_RELEASE);
    rel.offset = r.offset;
    (void)wire_send(m->fd, &rel, -1, false, 0);
    pthread_mutex_unlock(&m->rel_mu);
  }
  if (err == TP_SUCCESS) {
    int64_t used =
        atomic_fetch_add(&p->caches.base, (int64_t)r.size) + (int64_t)r.size;
    tp__atomic_max(&p->used_high, (uint64_t)used);
  }
  pthread_mutex_unlock(&m->mu);
  TP_FORWARD(err);
  *ptr = (void *)(p->space.base + r.offset);
  return TP_SUCCESS;
}

tp_error_t tp__ipc_import_free(tp__pool *p, uintptr_t addr, tp__stream *s) {
  tp__ipc_import *m = p->imp;
  uint64_t offset = (uint64_t)(addr - p->space.base);
  pthread_mutex_lock(&m->mu);
  uint32_t i = ptr_index(m, offset);
  bool known = i < m->nptrs && m->ptrs[i].offset == offset;
  pthread_mutex_lock(&m->rel_mu);
  bool room = known && done_reserve(m);
  if (room)
    m->pending++;
  pthread_mutex_unlock(&m->rel_mu);
  if (!room) {
    pthread_mutex_unlock(&m->mu);
    /* Not an imported pointer (or freed already), or no memory. */
    return known ? TP_ERROR_OUT_OF_MEMORY : TP_ERROR_INVALID_VALUE;
  }
  uint64_t size = m->ptrs[i].size;
  if (--m->ptrs[i].count == 0) {
    memmove(&m->ptrs[i], &m->ptrs[i + 1], (m->nptrs - i - 1) * sizeof *m->ptrs);
    m->nptrs--;
  }
  atomic_fetch_sub(&p->caches.base, (int64_t)size);
  /* The hold goes when the stream reaches the free, not before: work
   * queued ahead of it may still use the memory. */
  release_job *j = malloc(sizeof *j);
  tp_error_t err = TP_ERROR_OUT_OF_MEMORY;
  if (j) {
    *j = (release_job){m, offset, size};
    err = tp__platform->launch_host_func(s->ps, release_fn, j);
  }
  if (err != TP_SUCCESS) {
    /* No host function: wait for the stream here instead. */
    free(j);
    (void)tp__platform->stream_synchronize(s->ps);
    release_run(m, offset, size);
  }
  pthread_mutex_unlock(&m->mu);
  return TP_SUCCESS;
}

/* Unmaps what no import uses any more; mu held. */
static void import_settle(tp__pool *p) {
  pthread_mutex_lock(&p->imp->rel_mu);
  count_released(p->imp);
  pthread_mutex_unlock(&p->imp->rel_mu);
  drop_stale(p);
}

void tp__ipc_import_trim(tp__pool *p) {
  pthread_mutex_lock(&p->imp->mu);
  import_settle(p);
  pthread_mutex_unlock(&p->imp->mu);
}

void tp__ipc_settle(void) {
  if (!atomic_load_explicit(&importers_count, memory_order_relaxed))
    return;
  pthread_mutex_lock(&importers_lock);
  for (uint32_t i = 0; i < nimporters; i++) {
    tp__ipc_import *m = importers[i]->imp;
    /* A pool busy with an import settles at its next call instead. */
    if (pthread_mutex_trylock(&m->mu) != 0)
      continue;
    import_settle(importers[i]);
    pthread_mutex_unlock(&m->mu);
  }
  pthread_mutex_unlock(&importers_lock);
}

tp_error_t tp__ipc_import_set_access(tp__pool *p, const tp_access_desc_t *list,
                                     size_t n) {
  tp__ipc_import *m = p->imp;
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&m->mu);
  for (size_t c = 0; c < m->nchunks && err == TP_SUCCESS; c++)
    if (m->phys[c])
      err = tp__platform->set_access(m->res, c * m->gran, m->gran, list, n);
  tp__mutex_lock(&p->lock);
  for (size_t i = 0; err == TP_SUCCESS && i < n; i++)
    p->space.access[list[i].location.id] = list[i].flags;
  tp__mutex_unlock(&p->lock);
  pthread_mutex_unlock(&m->mu);
  return err;
}

void tp__ipc_import_destroy(tp__pool *p) {
  tp__ipc_import *m = p->imp;
  if (!m)
    return;
  importers_remove(p);
  pthread_mutex_lock(&m->mu);
  /* Frees still queued on streams report to this state: wait for them. */
  pthread_mutex_lock(&m->rel_mu);
  while (m->pending)
    pthread_cond_wait(&m->rel_cv, &m->rel_mu);
  pthread_mutex_unlock(&m->rel_mu);
  import_settle(p);
  /* Pointers never freed, and chunks the platform would not unmap before:
   * closing the channel releases the holds. */
  for (size_t c = 0; c < m->nchunks; c++)
    if (m->phys[c])
      (void)chunk_drop(p, c);
  pthread_mutex_unlock(&m->mu);
  if (m->registered)
    tp__registry_remove(p->space.base, p->space.va_size);
  import_free_state(m);
  p->imp = NULL;
}

/* Connects to the exporter over the rendezvous `fd` and reads its HELLO
 * into *h, with the backing descriptor in *backing; *chan is the private
 * channel. */
static tp_error_t import_connect(int fd, int *chan, wire *h, int *backing) {
  int type = 0;
  socklen_t len = sizeof type;
  TP_RETURN_IF(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
                   type != SOCK_SEQPACKET,
               TP_ERROR_INVALID_VALUE);
  int sv[2];
  TP_RETURN_IF(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0,
               tp__platform_fail(errno, "socketpair"));
  wire q = wire_make(OP_CONNECT);
  tp_error_t err = wire_send(fd, &q, sv[1], true, 0);
  close(sv[1]);
  struct pollfd pf = {.fd = sv[0], .events = POLLIN};
  int ready = 0;
  if (err == TP_SUCCESS) {
    do
      ready = poll(&pf, 1, HELLO_TIMEOUT_MS);
    while (ready < 0 && errno == EINTR);
    if (ready < 0)
      err = tp__platform_fail(errno, "poll");
    else if (ready == 0)
      err = TP_ERROR_INVALID_VALUE; /* no exporter answered */
  }
  recv_result r = RECV_OK;
  if (err == TP_SUCCESS)
    r = wire_recv(sv[0], h, backing, NULL, NULL, 0);
  if (err == TP_SUCCESS && r != RECV_OK)
    err = r == RECV_ERROR ? tp__platform_fail(errno, "recvmsg")
                          : TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && h->op != OP_HELLO)
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && h->status != TP_SUCCESS)
    err = (tp_error_t)h->status;
  if (err != TP_SUCCESS) {
    if (*backing >= 0)
      close(*backing);
    close(sv[0]);
    return err;
  }
  *chan = sv[0];
  return TP_SUCCESS;
}

/* The exporter's location as this process names it: its device by uuid, or
 * TP_LOCATION_INVISIBLE (id -2, as the driver's cudaInvalidDeviceId) where
 * that device is not one of this process's. */
static tp_error_t import_location(const wire *h, tp_location_t *loc,
                                  int *device) {
  *device = -1;
  *loc = (tp_location_t){(tp_location_type_t)h->loc_type, h->loc_id, 0};
  if (h->loc_type == TP_LOCATION_HOST_NUMA)
    return TP_SUCCESS;
  TP_RETURN_IF(h->loc_type != TP_LOCATION_DEVICE, TP_ERROR_NOT_SUPPORTED);
  int n = 0;
  TP_FORWARD(tp__platform->device_count(&n));
  for (int d = 0; d < n && d < TP_MAX_DEVICES && *device < 0; d++) {
    unsigned char uuid[16];
    if (tp__platform->device_uuid(d, uuid) == TP_SUCCESS &&
        memcmp(uuid, h->data, sizeof uuid) == 0)
      *device = d;
  }
  if (*device < 0)
    *loc = (tp_location_t){TP_LOCATION_INVISIBLE, -2, 0};
  else
    loc->id = *device;
  return TP_SUCCESS;
}

/* The importer's state for HELLO `h`: a range of the exporter's size in this
 * process, of the same chunk size. */
static tp_error_t import_state(const wire *h, int chan, int backing,
                               const tp__mem_kind *kind, tp__ipc_import **out) {
  tp__ipc_import *m = calloc(1, sizeof *m);
  if (!m) {
    if (backing >= 0)
      close(backing);
    close(chan);
    return TP_ERROR_OUT_OF_MEMORY;
  }
  m->fd = chan;
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->rel_mu, NULL);
  pthread_cond_init(&m->rel_cv, NULL);
  m->pid = h->pid;
  m->serial = h->serial;
  m->gran = h->gran;
  m->va_size = h->va_size;
  m->nchunks = (size_t)(h->va_size / h->gran);
  m->host_pool = h->loc_type == TP_LOCATION_HOST_NUMA;
  size_t gran = 0;
  uint64_t capacity = 0;
  tp_error_t err = tp__platform->mem_query(kind, &gran, &capacity);
  if (err == TP_SUCCESS && gran != h->gran)
    err = TP_ERROR_NOT_SUPPORTED; /* chunks this process cannot place */
  m->refs = calloc(m->nchunks, sizeof *m->refs);
  m->phys = calloc(m->nchunks, sizeof *m->phys);
  m->stale = calloc(m->nchunks, sizeof *m->stale);
  if (err == TP_SUCCESS && (!m->refs || !m->phys || !m->stale))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    err = tp__platform->reserve_imported(kind, (size_t)h->va_size,
                                         (size_t)1 << TP_REGISTRY_SHIFT,
                                         backing, &m->res, &m->base);
    backing = -1;
  }
  if (backing >= 0)
    close(backing);
  if (err != TP_SUCCESS) {
    import_free_state(m);
    return err;
  }
  *out = m;
  return TP_SUCCESS;
}

tp_error_t tp__ipc_import_pool(int fd, tp_pool_t *out) {
  int chan = -1, backing = -1;
  wire h;
  TP_FORWARD(import_connect(fd, &chan, &h, &backing));
  tp_location_t loc;
  int device = -1;
  tp_error_t err = import_location(&h, &loc, &device);
  /* Sizes the exporter's core would have made: a power-of-two chunk and a
   * range of whole gigabytes. */
  if (err == TP_SUCCESS &&
      (h.gran < TP_GRANULE || (h.gran & (h.gran - 1)) ||
       h.va_size % ((uint64_t)1 << TP_REGISTRY_SHIFT) || h.va_size == 0 ||
       h.va_size > SIZE_MAX || h.va_size % h.gran ||
       (h.alloc_type != TP_ALLOCATION_PINNED &&
        h.alloc_type != TP_ALLOCATION_MANAGED)))
    err = TP_ERROR_INVALID_VALUE;
  if (err != TP_SUCCESS) {
    if (backing >= 0)
      close(backing);
    close(chan);
    return err;
  }
  /* The range is reserved as memory of the device that holds the chunks,
   * or, where this process cannot see it, of the calling thread's device,
   * which is then the one given access. */
  if (device < 0 && loc.type == TP_LOCATION_INVISIBLE)
    device = tp__current_device();
  tp__mem_kind kind = {loc, (tp_allocation_type_t)h.alloc_type,
                       TP_HANDLE_POSIX_FD};
  if (loc.type == TP_LOCATION_INVISIBLE)
    kind.location = (tp_location_t){TP_LOCATION_DEVICE, device, 0};
  tp__ipc_import *m = NULL;
  TP_FORWARD(import_state(&h, chan, backing, &kind, &m));
  /* An imported pool exports nothing and reports the exporter's type,
   * size limit and (translated) location. */
  tp_pool_props_t props = {.alloc_type = (tp_allocation_type_t)h.alloc_type,
                           .location = loc,
                           .max_size = (size_t)h.max_size};
  tp_pool_t handle = NULL;
  err = tp__pool_new_imported(&props, &handle);
  if (err != TP_SUCCESS) {
    import_free_state(m);
    return err;
  }
  tp__pool *p = handle->pool;
  p->imp = m;
  p->space.base = m->base;
  p->space.gran = (size_t)m->gran;
  p->space.va_size = (size_t)m->va_size;
  if (device >= 0)
    p->space.access[device] = TP_ACCESS_READ_WRITE;
  /* In the registry, so that tp_free_async finds the pool. */
  err = tp__registry_add(p->space.base, p->space.va_size, p);
  m->registered = err == TP_SUCCESS;
  pthread_mutex_lock(&importers_lock);
  if (err == TP_SUCCESS && !TP_RESERVE(importers, nimporters, capimporters))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS) {
    importers[nimporters++] = p;
    atomic_store(&importers_count, nimporters);
  }
  pthread_mutex_unlock(&importers_lock);
  if (err != TP_SUCCESS) {
    (void)tp__pool_destroy(p);
    return err;
  }
  *out = handle;
  return TP_SUCCESS;
}
