/* The exporting side of src/ipc/: which exported allocations importers
 * hold (so that the exporter's own free of one waits for them), the
 * pool's service thread that answers importers' channels, and the limits
 * on how many channels it serves.
 *
 * Locking: tp__ipc_export.lock guards the entries, the rendezvous list and
 * the flags; the channels (conns) are the service thread's alone, read and
 * changed by no other thread, and teardown touches them only after joining
 * it. The lock is taken before the pool's lock and a stream's spin lock,
 * never after either. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "ipc/wire.h"

/* Channels served by every exporting pool of this process. */
static _Atomic uint32_t channels_open;

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
  pid_t pid; /* the importing process, as the kernel vouched for it */
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

/* What an exported pool does beyond a pool of this process alone (see
 * pool/pool.h): the core asks it about every free of a watched allocation,
 * tells it of the destroy, and tears down only once it stopped. */
static tp_error_t export_free(tp__pool *p, uintptr_t addr, tp__stream *s,
                              bool *kept);
static void export_close(tp__pool *p);
static bool export_stop(tp__pool *p);
static void export_fini(tp__pool *p);
static const tp__pool_ops export_ops = {.free = export_free,
                                        .destroy = export_close,
                                        .stop = export_stop,
                                        .fini = export_fini};

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
  if (!TP_ARRAY_ROOM(x->entries, x->nentries, x->capentries))
    return NULL;
  uint32_t i = entry_index(x, offset);
  memmove(&x->entries[i + 1], &x->entries[i],
          (x->nentries - i) * sizeof *x->entries);
  x->nentries++;
  atomic_store_explicit(&p->watched, x->nentries, memory_order_release);
  x->entries[i] = (entry){.offset = offset};
  return &x->entries[i];
}

static void entry_remove(tp__pool *p, entry *e) {
  tp__ipc_export *x = p->exp;
  uint32_t i = (uint32_t)(e - x->entries);
  memmove(&x->entries[i], &x->entries[i + 1],
          (x->nentries - i - 1) * sizeof *x->entries);
  x->nentries--;
  atomic_store_explicit(&p->watched, x->nentries, memory_order_release);
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
  p->ops = &export_ops;
  return TP_SUCCESS;
}

/* The thread was stopped (or never started), and no thread can reach the
 * pool any more: a call that found it before its teardown may have been
 * waking the thread through `wake` until then. */
static void export_fini(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  if (!x)
    return;
  for (uint32_t i = 0; i < x->nentries; i++)
    if (x->entries[i].freed)
      tp__stream_unref(x->entries[i].tag.stream);
  for (uint32_t i = 0; i < x->nrv; i++)
    tp__ipc_fd_close(x->rv[i]);
  if (x->wake >= 0)
    close(x->wake);
  free(x->entries);
  free(x->rv);
  pthread_mutex_destroy(&x->lock);
  free(x);
  p->exp = NULL;
  atomic_store_explicit(&p->watched, 0, memory_order_relaxed);
}

/* Drops one hold on the allocation at `offset`; the last one of a block the
 * exporter already freed finishes that free. No lock held. The free is
 * finished under the export lock, and the entry goes after it: until then
 * the core sends every free of the pool here (`watched`), where a second
 * free of the pointer by the application waits for the lock and then finds
 * the block gone from the pool. The core takes no export lock, so export
 * lock, then pool lock, is the only order. */
static void release_hold(tp__pool *p, uint64_t offset) {
  tp__ipc_export *x = p->exp;
  pthread_mutex_lock(&x->lock);
  entry *e = entry_find(x, offset);
  if (e && e->holds && --e->holds == 0 && e->freed) {
    (void)tp__pool_free_tagged(p, (void *)(p->space.base + offset), e->tag);
    entry_remove(p, e);
  }
  pthread_mutex_unlock(&x->lock);
}

/* Closes a channel and releases everything it held: an importer that ends,
 * however it ends, holds nothing. */
static void conn_drop(tp__pool *p, uint32_t i) {
  tp__ipc_export *x = p->exp;
  conn c = x->conns[i];
  x->conns[i] = x->conns[--x->nconns];
  tp__ipc_fd_close(c.fd);
  atomic_fetch_sub(&channels_open, 1);
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
  if (!TP_ARRAY_ROOM(c->holds, c->nholds, c->capholds))
    return false;
  c->holds[c->nholds++] = (hold){offset, 1};
  return true;
}

/* Checks an export tp__ipc_record against the pool and records the channel's
 * hold on the allocation it names. */
static tp_error_t do_import(tp__pool *p, conn *c, const tp__wire *q,
                            tp__wire *a) {
  tp__ipc_export *x = p->exp;
  tp__ipc_record r;
  memcpy(&r, q->data, sizeof r);
  TP_RETURN_IF(!tp__ipc_record_sane(&r, p->space.va_size) ||
                   r.pid != (uint64_t)getpid() || r.serial != p->serial ||
                   r.reserved != 0 ||
                   r.check != tp__ipc_record_check(&r, p->export_key),
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
  else if (e->holds == UINT32_MAX || !conn_add_hold(c, r.offset))
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
static tp_error_t do_chunk(tp__pool *p, conn *c, uint64_t index, tp__wire *a,
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

/* Serves the requests queued on channel `i`, up to a batch. False when the
 * channel is to
 * close: the importer went, or broke the protocol, or does not read its
 * replies (which are sent without waiting, so that one importer cannot
 * stall the others). */
static bool serve_conn(tp__pool *p, uint32_t i) {
  for (int served = 0; served < TP_IPC_BATCH; served++) {
    conn *c = &p->exp->conns[i];
    tp__wire q;
    int fd = -1;
    tp__recv_result r = tp__wire_recv(c->fd, &q, &fd, NULL, NULL, 0);
    if (r == TP_RECV_AGAIN)
      return true;
    if (r != TP_RECV_OK || fd >= 0) {
      if (fd >= 0)
        close(fd); /* importers send no descriptors here */
      return false;
    }
    if (q.op == TP_OP_RELEASE) {
      do_release(p, c, q.offset);
      continue;
    }
    int out = -1;
    tp__wire a;
    if (q.op == TP_OP_IMPORT) {
      a = tp__wire_make(TP_OP_IMPORTED);
      a.status = (int32_t)do_import(p, c, &q, &a);
    } else if (q.op == TP_OP_CHUNK) {
      a = tp__wire_make(TP_OP_CHUNK_INFO);
      a.status = (int32_t)do_chunk(p, c, q.offset, &a, &out);
    } else {
      return false;
    }
    tp_error_t err = tp__wire_send(c->fd, &a, out, false, 0);
    if (out >= 0)
      close(out);
    if (err != TP_SUCCESS)
      return false;
  }
  return true; /* more may be queued: the next poll tells */
}

/* The answer to a CONNECT: the pool's description, and the descriptor that
 * backs its chunks where the platform has one. */
static tp_error_t hello_make(tp__pool *p, tp__wire *h, int *backing) {
  *h = tp__wire_make(TP_OP_HELLO);
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

/* The descriptors this process has open, `fd` among them. Counted in
 * /proc; where that cannot be read, at least fd + 1 are open, since a new
 * descriptor takes the lowest free number. */
static uint64_t open_descriptors(int fd) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return errno == EMFILE || errno == ENFILE ? UINT64_MAX : (uint64_t)fd + 1;
  uint64_t n = 0;
  for (struct dirent *e = readdir(d); e; e = readdir(d))
    n += e->d_name[0] != '.';
  closedir(d);
  return n ? n - 1 : 0; /* the directory's own descriptor is not ours */
}

/* Takes one of the process's channels for importer `pid` unless that would
 * pass a limit (wire.h): the importer's channels to this pool, every
 * pool's channels together, or the descriptors the process keeps free for
 * its own use. `priv`, the channel, is already open. */
static bool channel_take(const tp__ipc_export *x, pid_t pid, int priv) {
  uint32_t mine = 0;
  for (uint32_t i = 0; i < x->nconns; i++)
    mine += x->conns[i].pid == pid;
  if (mine >= TP_IPC_CHANNELS_PER_IMPORTER)
    return false;
  if (atomic_fetch_add(&channels_open, 1) >= TP_IPC_CHANNELS_MAX) {
    atomic_fetch_sub(&channels_open, 1);
    return false;
  }
  struct rlimit rl;
  uint64_t open = 0;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      ((open = open_descriptors(priv)) > rl.rlim_cur ||
       rl.rlim_cur - open < TP_IPC_FD_RESERVE)) {
    atomic_fetch_sub(&channels_open, 1);
    return false;
  }
  return true;
}

/* A CONNECT: `priv` is the importer's end of its private channel, `u` its
 * credentials as the kernel vouches for them. */
static void serve_connect(tp__pool *p, const tp__wire *q, int priv,
                          const struct ucred *u, bool has_cred) {
  tp__ipc_export *x = p->exp;
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(priv, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET) {
    tp__ipc_fd_close(priv); /* nothing we could answer on */
    return;
  }
  tp_error_t status = TP_SUCCESS;
  if (q->op != TP_OP_CONNECT)
    status = TP_ERROR_INVALID_VALUE;
  else if (!has_cred || u->uid != geteuid())
    status = TP_ERROR_NOT_PERMITTED; /* another user's process */
  pthread_mutex_lock(&x->lock);
  if (status == TP_SUCCESS && x->closed)
    status = TP_ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&x->lock);
  if (status == TP_SUCCESS && !TP_ARRAY_ROOM(x->conns, x->nconns, x->capconns))
    status = TP_ERROR_OUT_OF_MEMORY;
  bool taken = status == TP_SUCCESS && channel_take(x, u->pid, priv);
  if (status == TP_SUCCESS && !taken)
    status = TP_ERROR_NOT_PERMITTED; /* as many channels as allowed */
  tp__wire h = tp__wire_make(TP_OP_HELLO);
  int backing = -1;
  if (status == TP_SUCCESS)
    status = hello_make(p, &h, &backing);
  h.status = (int32_t)status;
  tp_error_t err = tp__wire_send(priv, &h, backing, false, 0);
  if (backing >= 0)
    close(backing);
  if (status != TP_SUCCESS || err != TP_SUCCESS) {
    if (taken)
      atomic_fetch_sub(&channels_open, 1);
    tp__ipc_fd_close(priv);
    return;
  }
  x->conns[x->nconns++] = (conn){.fd = priv, .pid = u->pid};
}

/* Serves the CONNECTs queued on a rendezvous socket, up to a batch. False
 * when it is to close: every copy of the exported descriptor was closed. */
static bool serve_rendezvous(tp__pool *p, int fd, short revents) {
  for (int served = 0; served < TP_IPC_BATCH; served++) {
    tp__wire q;
    int priv = -1;
    struct ucred u;
    bool has_cred = false;
    /* Received and kept as one step (see tp__ipc_fd_begin); the receive
     * does not wait. */
    tp__ipc_fd_begin();
    tp__recv_result r = tp__wire_recv(fd, &q, &priv, &u, &has_cred, 0);
    if (priv >= 0)
      tp__ipc_fd_keep(priv);
    tp__ipc_fd_end();
    switch (r) {
    case TP_RECV_OK:
      if (priv >= 0)
        serve_connect(p, &q, priv, &u, has_cred);
      break;
    case TP_RECV_BAD: /* not ours; what it carried is closed */
    case TP_RECV_NOFD: /* a channel that found no room here: none made */ break;
    case TP_RECV_AGAIN: return true;
    case TP_RECV_EOF:
      /* No bytes: a hang-up, or an empty message, which must not close the
       * rendezvous. Without a hang-up seen, the next poll tells (the peer
       * may have gone since this one). */
      return !(revents & POLLHUP);
    default: return false;
    }
  }
  return true; /* more may be queued: the next poll tells */
}

/* Our end of a rendezvous goes; lock held. */
static void rendezvous_close(tp__ipc_export *x, int fd) {
  for (uint32_t i = 0; i < x->nrv; i++) {
    if (x->rv[i] == fd) {
      tp__ipc_fd_close(fd);
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
  TP_FORWARD(tp__ipc_socketpair(sv, false));
  /* Set before the other end leaves this process, so that every CONNECT
   * arrives with its sender's credentials. */
  int one = 1;
  tp_error_t err = TP_SUCCESS;
  if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0)
    err = tp__platform_fail(errno, "setsockopt");
  pthread_mutex_lock(&x->lock);
  if (err == TP_SUCCESS && x->closed)
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS && !TP_ARRAY_ROOM(x->rv, x->nrv, x->caprv))
    err = TP_ERROR_OUT_OF_MEMORY;
  if (err == TP_SUCCESS && !x->running)
    err = start_thread(p);
  if (err == TP_SUCCESS)
    x->rv[x->nrv++] = sv[0];
  pthread_mutex_unlock(&x->lock);
  if (err != TP_SUCCESS) {
    tp__ipc_fd_close(sv[0]);
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
   * tp__ipc_record of it stays good; an entry of another size is left over from
   * a free that raced with an export, and makes way. */
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
  tp__ipc_record r = {.magic = TP_RECORD_MAGIC,
                      .version = TP_RECORD_VERSION,
                      .pid = (uint64_t)getpid(),
                      .serial = p->serial,
                      .offset = offset,
                      .size = size,
                      .nonce = nonce};
  r.check = tp__ipc_record_check(&r, p->export_key);
  memcpy(data, &r, sizeof r);
  return TP_SUCCESS;
}

bool tp__ipc_export_freed(tp__pool *p, uintptr_t addr) {
  tp__ipc_export *x = p->exp;
  if (!x || !atomic_load_explicit(&p->watched, memory_order_acquire))
    return false;
  pthread_mutex_lock(&x->lock);
  const entry *e = entry_find(x, (uint64_t)(addr - p->space.base));
  bool freed = e && e->freed;
  pthread_mutex_unlock(&x->lock);
  return freed;
}

static tp_error_t export_free(tp__pool *p, uintptr_t addr, tp__stream *s,
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
    tp__blspin_lock(&s->lock);
    e->tag = tp__stream_tag(s);
    tp__blspin_unlock(&s->lock);
    tp__stream_ref(s);
    e->freed = true;
    *kept = true;
  }
  pthread_mutex_unlock(&x->lock);
  return err;
}

static void export_close(tp__pool *p) {
  tp__ipc_export *x = p->exp;
  pthread_mutex_lock(&x->lock);
  x->closed = true;
  bool running = x->running;
  pthread_mutex_unlock(&x->lock);
  if (running)
    wake_thread(x);
}

static bool export_stop(tp__pool *p) {
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
