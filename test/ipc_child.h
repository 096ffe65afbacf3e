/* ipc_child.h: what the IPC test programs share. Each process of a test is
 * the same program: the test itself, or a helper started again in a mode
 * of its own (fork, then exec, so that a child never runs with a copy of
 * the parent's threads): an importer, an exporter (which a test can stop),
 * or a flood of importers. The test drives a child over a control
 * socketpair that carries commands, export records and descriptors
 * (SCM_RIGHTS). Memory is read and written through streams only, so that
 * the tests run on any platform. Header-only, like check.h: every test
 * program is one translation unit. */
#ifndef TP_TEST_IPC_CHILD_H
#define TP_TEST_IPC_CHILD_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "platform/host/host_testing.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define CHILD_TIMEOUT_MS 30000
/* How long a child waits for its next command. A test may spend long
 * between one child's commands while it starts others (test_ipc_limits'
 * 17 importers under a loaded ctest on an H100: 181 s), and a test that
 * died closes the socket, which ends the wait at once. */
#define CHILD_IDLE_MS 600000

/* ========================================================================
 * Helpers shared by both sides
 * ======================================================================== */

static inline tp_pool_t ipc_pool(int device) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, device, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  tp_pool_t pool = NULL;
  CHECK_OK(tp_pool_create(&pool, &props));
  return pool;
}

static inline uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static inline int attr_int(tp_pool_t pool, tp_pool_attr_t attr) {
  int v = -99;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static inline unsigned char pattern(uint64_t seed, size_t i) {
  return (unsigned char)(seed * 31 + i * 7 + (i >> 9));
}

/* Writes a pattern into device memory through `s`, and waits. */
static inline void fill(void *ptr, size_t size, uint64_t seed, tp_stream_t s) {
  unsigned char *buf = malloc(size);
  REQUIRE(buf);
  for (size_t i = 0; i < size; i++)
    buf[i] = pattern(seed, i);
  CHECK_OK(tp_memcpy_async(ptr, buf, size, s));
  CHECK_OK(tp_stream_synchronize(s));
  free(buf);
}

/* Whether device memory holds the pattern, read through `s`. */
static inline int holds(const void *ptr, size_t size, uint64_t seed,
                        tp_stream_t s) {
  unsigned char *buf = malloc(size);
  if (!buf)
    return 0;
  memset(buf, 0, size);
  int ok = CHECK_OK(tp_memcpy_async(buf, ptr, size, s)) &&
           CHECK_OK(tp_stream_synchronize(s));
  for (size_t i = 0; ok && i < size; i++)
    ok = buf[i] == pattern(seed, i);
  free(buf);
  return ok;
}

/* The control channel: one message per command or reply. */
enum {
  CMD_POOL = 1,    /* the pool's descriptor: import it */
  CMD_IMPORT,      /* import `rec` into `slot`; check contents when seed != 0 */
  CMD_IMPORT_FULL, /* import `rec` with the descriptor table full (it may
                      fail, with PLATFORM only), then as CMD_IMPORT */
  CMD_WRITE,       /* write pattern `seed` at [offset, offset + size) of slot */
  CMD_EXPECT,      /* importing `rec` must fail with `expect` */
  CMD_CORRUPT,     /* every byte of `rec` corrupted must be refused */
  CMD_FREE,        /* free `slot` on the stream and wait */
  CMD_FREE_HELD,   /* free `slot` behind a held stream, without waiting */
  CMD_OPEN,        /* let the held stream go, and wait for it */
  CMD_FREE_QUIET,  /* free `slot` and poll the stream until it is done,
                      without a synchronize (which would unmap) */
  CMD_FLOOD,       /* import the pool `size` times over, keeping every one;
                      reply: seed = imported, size = NOT_PERMITTED, offset =
                      any other answer */
  CMD_CHECK,       /* whether `slot` still holds `size` bytes of `seed` */
  CMD_MAKE,        /* exporter mode: allocate `size` bytes of pattern `seed`;
                      reply: the pool's descriptor and the block's record */
  CMD_DROP,        /* exporter mode: free block `slot` and wait */
  CMD_USED,        /* exporter mode: reply: size = the pool's used bytes */
  CMD_FORK,        /* fork a child that makes no call and only waits (a data
                      loader's worker, say); reply: seed = its pid */
  CMD_EXIT,
  CMD_REPLY
};

typedef struct ctl {
  int op;
  int status; /* replies: a tp_error_t */
  int slot;
  int expect;
  int loc_type, loc_id; /* CMD_POOL: the location the import must report */
  int grant;            /* CMD_POOL: a device to grant read-write, plus 1 */
  uint64_t seed, size, offset;
  tp_pool_ptr_export_data_t rec;
} ctl;

static inline int ctl_send(int sock, const ctl *c, int fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)c, sizeof *c};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    m.msg_control = u.buf;
    m.msg_controllen = sizeof u.buf;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
  }
  return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof *c ? 0 : -1;
}

/* Waits up to timeout_ms for one message; -1 on timeout, end or error. */
static inline int ctl_recv(int sock, ctl *c, int *fd, int timeout_ms) {
  struct pollfd pf = {.fd = sock, .events = POLLIN};
  int r;
  do
    r = poll(&pf, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  if (r <= 0)
    return -1;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct iovec iov = {c, sizeof *c};
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = u.buf,
                     .msg_controllen = sizeof u.buf};
  if (fd)
    *fd = -1;
  ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  if (n != (ssize_t)sizeof *c)
    return -1;
  struct cmsghdr *h = CMSG_FIRSTHDR(&m);
  if (h && h->cmsg_type == SCM_RIGHTS) {
    int got;
    memcpy(&got, CMSG_DATA(h), sizeof got);
    if (fd)
      *fd = got;
    else
      close(got);
  }
  return 0;
}

/* ========================================================================
 * The importer: a helper mode of this program
 * ======================================================================== */

#define SLOTS 16
#define FLOOD_MAX 128

typedef struct importer {
  int sock;
  tp_stream_t s;
  tp_pool_t pool;
  void *ptr[SLOTS];
  gate_t gate;
  tp_pool_t flood[FLOOD_MAX];
  int nflood;
} importer;

/* Every corruption of one byte of a good record is refused, and maps
 * nothing: the imported pool reserves and uses no more than before. */
static inline void corrupt_all(importer *im,
                               const tp_pool_ptr_export_data_t *good) {
  uint64_t reserved = attr_u64(im->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT);
  uint64_t used = attr_u64(im->pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  static const unsigned char masks[] = {0x01, 0x80, 0xff};
  for (size_t i = 0; i < sizeof good->reserved; i++) {
    for (size_t k = 0; k < sizeof masks; k++) {
      tp_pool_ptr_export_data_t bad = *good;
      bad.reserved[i] ^= masks[k];
      void *q = NULL;
      if (!CHECK_ERR(tp_pool_import_pointer(&q, im->pool, &bad),
                     TP_ERROR_INVALID_VALUE))
        printf("   byte %zu ^ 0x%02x was accepted\n", i, masks[k]);
      CHECK(q == NULL);
    }
  }
  check_rng rng = {42};
  for (int t = 0; t < 64; t++) {
    tp_pool_ptr_export_data_t bad;
    for (size_t i = 0; i < sizeof bad.reserved; i++)
      bad.reserved[i] = (unsigned char)rng_next(&rng);
    if (t == 0)
      memset(&bad, 0, sizeof bad);
    if (t == 1)
      memset(&bad, 0xff, sizeof bad);
    void *q = NULL;
    CHECK_ERR(tp_pool_import_pointer(&q, im->pool, &bad),
              TP_ERROR_INVALID_VALUE);
  }
  CHECK_EQ_U64(attr_u64(im->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), reserved);
  CHECK_EQ_U64(attr_u64(im->pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  /* The channel still works: the good record imports. */
  void *q = NULL;
  if (CHECK_OK(tp_pool_import_pointer(&q, im->pool,
                                      (tp_pool_ptr_export_data_t *)good)))
    CHECK_OK(tp_free_async(q, im->s));
  CHECK_OK(tp_stream_synchronize(im->s));
}

/* What an imported pool may not do, and the attributes it reports. */
static inline void imported_rules(importer *im, const ctl *c) {
  void *q = NULL;
  CHECK_ERR(tp_malloc_from_pool_async(&q, 4096, im->pool, im->s),
            TP_ERROR_INVALID_VALUE);
  tp_location_t loc = {TP_LOCATION_DEVICE, 0, 0};
  CHECK_ERR(tp_mem_set_pool(&loc, TP_ALLOCATION_PINNED, im->pool),
            TP_ERROR_INVALID_VALUE);
  int fd = -1;
  CHECK_ERR(
      tp_pool_export_to_shareable_handle(&fd, im->pool, TP_HANDLE_POSIX_FD, 0),
      TP_ERROR_INVALID_VALUE);
  CHECK_EQ_INT(attr_int(im->pool, TP_POOL_ATTR_EXPORT_HANDLE_TYPES), 0);
  CHECK_EQ_INT(attr_int(im->pool, TP_POOL_ATTR_ALLOCATION_TYPE),
               TP_ALLOCATION_PINNED);
  CHECK_EQ_INT(attr_int(im->pool, TP_POOL_ATTR_LOCATION_TYPE), c->loc_type);
  CHECK_EQ_INT(attr_int(im->pool, TP_POOL_ATTR_LOCATION_ID), c->loc_id);
  CHECK_EQ_U64(attr_u64(im->pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
}

/* CMD_FORK's child: it waits, for a minute at most, doing nothing that a
 * child of a threaded process may not. */
static inline pid_t fork_sleeper(void) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    for (;;)
      pause();
  }
  return pid;
}

/* Imports c->rec while this process's descriptor table is full: where the
 * exporter must pass a chunk's descriptor, the call fails for want of one
 * (PLATFORM), and nothing is held; with room again the channel serves the
 * next import (it took a dropped descriptor for an exporter out of step,
 * and answered INVALID_VALUE to every later import). */
static inline void import_full(importer *im, ctl *c) {
  struct rlimit old, low;
  REQUIRE_EXIT(getrlimit(RLIMIT_NOFILE, &old) == 0);
  int top = -1, got;
  DIR *d = opendir("/proc/self/fd");
  REQUIRE_EXIT(d != NULL);
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.' && (got = atoi(e->d_name)) > top)
      top = got;
  closedir(d);
  low = old;
  low.rlim_cur = (rlim_t)top + 1;
  REQUIRE_EXIT(setrlimit(RLIMIT_NOFILE, &low) == 0);
  int filler[256], n = 0;
  while (n < 256 && (got = dup(0)) >= 0)
    filler[n++] = got;
  CHECK(got < 0 && errno == EMFILE);
  void *q = NULL;
  tp_error_t err = tp_pool_import_pointer(&q, im->pool, &c->rec);
  for (int i = 0; i < n; i++)
    close(filler[i]);
  REQUIRE_EXIT(setrlimit(RLIMIT_NOFILE, &old) == 0);
  if (err == TP_SUCCESS) {
    CHECK_OK(tp_free_async(q, im->s));
    CHECK_OK(tp_stream_synchronize(im->s));
  } else {
    CHECK_ERR(err, TP_ERROR_PLATFORM);
    CHECK(q == NULL);
  }
}

static inline tp_error_t serve_one(importer *im, ctl *c, int fd) {
  void *q = NULL;
  if (c->op == CMD_IMPORT_FULL) {
    import_full(im, c);
    c->op = CMD_IMPORT; /* the table has room again */
  }
  switch (c->op) {
  case CMD_POOL: {
    tp_error_t err = tp_pool_import_from_shareable_handle(
        &im->pool, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0);
    close(fd);
    if (err == TP_SUCCESS)
      imported_rules(im, c);
    if (err == TP_SUCCESS && c->grant) {
      tp_access_desc_t d = {{TP_LOCATION_DEVICE, c->grant - 1, 0},
                            TP_ACCESS_READ_WRITE};
      err = tp_pool_set_access(im->pool, &d, 1);
    }
    return err;
  }
  case CMD_IMPORT: {
    tp_error_t err = tp_pool_import_pointer(&q, im->pool, &c->rec);
    if (err != TP_SUCCESS)
      return err;
    im->ptr[c->slot] = q;
    if (c->seed && !holds(q, c->size, c->seed, im->s))
      return TP_ERROR_ILLEGAL_ADDRESS; /* the contents differ */
    return TP_SUCCESS;
  }
  case CMD_CHECK:
    return holds(im->ptr[c->slot], c->size, c->seed, im->s)
               ? TP_SUCCESS
               : TP_ERROR_ILLEGAL_ADDRESS;
  case CMD_WRITE:
    fill((char *)im->ptr[c->slot] + c->offset, c->size, c->seed, im->s);
    return TP_SUCCESS;
  case CMD_EXPECT:
    CHECK_ERR(tp_pool_import_pointer(&q, im->pool, &c->rec),
              (tp_error_t)c->expect);
    CHECK(q == NULL);
    return TP_SUCCESS;
  case CMD_CORRUPT: corrupt_all(im, &c->rec); return TP_SUCCESS;
  case CMD_FREE:
    CHECK_OK(tp_free_async(im->ptr[c->slot], im->s));
    /* A second free of the same pointer, or an interior one, is refused. */
    CHECK_ERR(tp_free_async(im->ptr[c->slot], im->s), TP_ERROR_INVALID_VALUE);
    return tp_stream_synchronize(im->s);
  case CMD_FREE_HELD:
    CHECK_OK(hold_stream(im->s, &im->gate));
    return tp_free_async(im->ptr[c->slot], im->s);
  case CMD_OPEN: release(&im->gate); return tp_stream_synchronize(im->s);
  case CMD_FREE_QUIET:
    CHECK_OK(tp_free_async(im->ptr[c->slot], im->s));
    return check_poll_stream(im->s, CHILD_TIMEOUT_MS);
  default: return TP_ERROR_INVALID_VALUE;
  }
}

/* Opens channel after channel to one exporter, as an importer that never
 * stops would, and counts the answers into the reply. */
static inline void flood(importer *im, ctl *c, int fd, ctl *r) {
  for (uint64_t i = 0; i < c->size; i++) {
    tp_pool_t pool = NULL;
    tp_error_t err = tp_pool_import_from_shareable_handle(
        &pool, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0);
    if (err == TP_SUCCESS && im->nflood < FLOOD_MAX)
      im->flood[im->nflood++] = pool;
    else if (err == TP_SUCCESS)
      CHECK_OK(tp_pool_destroy(pool));
    r->seed += err == TP_SUCCESS;
    r->size += err == TP_ERROR_NOT_PERMITTED;
    r->offset += err != TP_SUCCESS && err != TP_ERROR_NOT_PERMITTED;
  }
  close(fd);
}

static inline int importer_main(const char *mode, int sock) {
  check_context(mode);
  bool other_user = strcmp(mode, "other-user") == 0;
  /* Become another user before anything else: a process of another user
   * holding the pool's descriptor must still be refused. */
  if (other_user &&
      (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) {
    printf("importer: cannot become user 65534: %s\n", strerror(errno));
    _exit(3);
  }
  importer im = {.sock = sock, .gate = {-1}};
  /* An importer whose current device is 1 makes its stream there. */
  if (strcmp(mode, "importer-dev1") == 0)
    REQUIRE_OK_EXIT(tp_set_device(1));
  /* The refused importer needs no stream: it should be refused before it
   * touches a device. */
  if (!other_user)
    REQUIRE_OK_EXIT(tp_stream_create(&im.s, TP_STREAM_NON_BLOCKING));
  for (;;) {
    ctl c;
    int fd = -1;
    if (ctl_recv(sock, &c, &fd, CHILD_IDLE_MS) != 0) {
      CHECK_FAIL("no command from the exporter");
      break;
    }
    ctl r;
    memset(&r, 0, sizeof r);
    r.op = CMD_REPLY;
    if (c.op == CMD_EXIT) {
      for (int i = 0; i < im.nflood; i++)
        CHECK_OK(tp_pool_destroy(im.flood[i]));
      if (im.pool)
        CHECK_OK(tp_pool_destroy(im.pool));
      if (im.s)
        CHECK_OK(tp_stream_destroy(im.s));
      r.status = check_failure_count();
      ctl_send(sock, &r, -1);
      break;
    }
    if (c.slot < 0 || c.slot >= SLOTS)
      c.slot = 0;
    if (c.op == CMD_FLOOD)
      flood(&im, &c, fd, &r);
    else if (c.op == CMD_FORK)
      r.seed = (uint64_t)fork_sleeper();
    else
      r.status = (int)serve_one(&im, &c, fd);
    if (ctl_send(sock, &r, -1) != 0)
      break;
  }
  int rc = check_failure_count() ? 1 : 0;
  fflush(stdout);
  /* After setuid the leak checker cannot attach to this process. */
  if (other_user)
    _exit(rc);
  return rc;
}

/* An exporter in a process of its own, which a test can stop (SIGSTOP):
 * it makes one pool of device 0 and blocks in it on command. */
static inline int exporter_main(int sock) {
  check_context("exporter");
  tp_stream_t s = NULL;
  tp_pool_t pool = NULL;
  void *blocks[SLOTS];
  int nblocks = 0;
  REQUIRE_OK_EXIT(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  for (;;) {
    ctl c, r;
    if (ctl_recv(sock, &c, NULL, CHILD_IDLE_MS) != 0) {
      CHECK_FAIL("no command from the test");
      break;
    }
    memset(&r, 0, sizeof r);
    r.op = CMD_REPLY;
    int fd = -1;
    if (c.op == CMD_MAKE && nblocks < SLOTS) {
      if (!pool)
        pool = ipc_pool(0);
      void *b = NULL;
      tp_error_t err = pool ? tp_malloc_from_pool_async(&b, c.size, pool, s)
                            : TP_ERROR_INVALID_VALUE;
      if (err == TP_SUCCESS) {
        blocks[nblocks++] = b;
        fill(b, c.size, c.seed, s);
        err = tp_pool_export_pointer(&r.rec, b);
      }
      if (err == TP_SUCCESS)
        err = tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD,
                                                 0);
      r.status = (int)err;
    } else if (c.op == CMD_DROP && c.slot < nblocks && blocks[c.slot]) {
      tp_error_t err = tp_free_async(blocks[c.slot], s);
      blocks[c.slot] = NULL;
      r.status = (int)(err == TP_SUCCESS ? tp_stream_synchronize(s) : err);
    } else if (c.op == CMD_USED) {
      r.size = pool ? attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT) : 0;
    } else if (c.op == CMD_FORK) {
      r.seed = (uint64_t)fork_sleeper();
    } else if (c.op == CMD_EXIT) {
      for (int i = 0; i < nblocks; i++)
        if (blocks[i])
          CHECK_OK(tp_free_async(blocks[i], s));
      CHECK_OK(tp_stream_synchronize(s));
      if (pool)
        CHECK_OK(tp_pool_destroy(pool));
      CHECK_OK(tp_stream_destroy(s));
      r.status = check_failure_count();
      ctl_send(sock, &r, -1);
      break;
    } else {
      r.status = TP_ERROR_INVALID_VALUE;
    }
    int sent = ctl_send(sock, &r, fd);
    if (fd >= 0)
      close(fd);
    if (sent != 0)
      break;
  }
  return check_failure_count() ? 1 : 0;
}

/* ========================================================================
 * The exporter's side: children and commands
 * ======================================================================== */

typedef struct child {
  pid_t pid;
  int sock;
} child;

/* Starts this program as an importer in `mode`; `env` (or NULL) is one
 * NAME=value that replaces the variable of that name. */
static inline int spawn(child *c, const char *mode, const char *env) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return -1;
  char fdarg[16];
  snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
  char *argv[] = {"test_ipc", "--importer", (char *)mode, fdarg, NULL};
  extern char **environ;
  size_t n = 0;
  while (environ[n])
    n++;
  char **envp = calloc(n + 2, sizeof *envp);
  if (!envp)
    return -1;
  size_t k = 0, name = env ? (size_t)(strchr(env, '=') - env) + 1 : 0;
  for (size_t i = 0; i < n; i++)
    if (!env || strncmp(environ[i], env, name) != 0)
      envp[k++] = environ[i];
  if (env)
    envp[k++] = (char *)env;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    /* Only async-signal-safe calls until exec: the parent has threads. */
    fcntl(sv[1], F_SETFD, 0);
    execve("/proc/self/exe", argv, envp);
    _exit(127);
  }
  free(envp);
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    return -1;
  }
  c->pid = pid;
  c->sock = sv[0];
  return 0;
}

/* Sends a command and returns the child's answer, its whole reply in *r
 * and the descriptor that came with it in *rfd (when asked for). */
static inline tp_error_t ask_reply(child *c, ctl *q, int fd, ctl *r, int *rfd) {
  if (ctl_send(c->sock, q, fd) != 0 ||
      ctl_recv(c->sock, r, rfd, CHILD_TIMEOUT_MS) != 0 || r->op != CMD_REPLY) {
    CHECK_FAIL("the child did not answer command %d", q->op);
    return TP_ERROR_NOT_READY;
  }
  return (tp_error_t)r->status;
}

static inline tp_error_t ask(child *c, ctl *q, int fd) {
  ctl r;
  return ask_reply(c, q, fd, &r, NULL);
}

static inline tp_error_t ask_import(child *c, int slot, const void *ptr,
                                    size_t size, uint64_t seed) {
  ctl q = {.op = CMD_IMPORT, .slot = slot, .seed = seed, .size = size};
  if (!CHECK_OK(tp_pool_export_pointer(&q.rec, (void *)ptr)))
    return TP_ERROR_INVALID_VALUE;
  return ask(c, &q, -1);
}

static inline tp_error_t ask_slot(child *c, int op, int slot) {
  ctl q = {.op = op, .slot = slot};
  return ask(c, &q, -1);
}

/* Waits for the child's exit; its status, or -1. */
static inline int child_wait(child *c) {
  int status = 0;
  double deadline = check_now_s() + CHILD_TIMEOUT_MS / 1000.0;
  pid_t r;
  while ((r = waitpid(c->pid, &status, WNOHANG)) == 0 &&
         check_now_s() < deadline)
    check_sleep_ms(5);
  if (r == 0) {
    kill(c->pid, SIGKILL);
    waitpid(c->pid, &status, 0);
    CHECK_FAIL("the importer did not exit");
  }
  close(c->sock);
  return r > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline int child_finish(child *c) {
  ctl q = {.op = CMD_EXIT};
  CHECK_EQ_INT(ask(c, &q, -1), 0);
  return child_wait(c);
}

/* Polls the pool's bytes in use until they reach `want`: releases by an
 * importer arrive on the pool's service thread. */
static inline uint64_t wait_used(tp_pool_t pool, uint64_t want) {
  double deadline = check_now_s() + 10.0;
  uint64_t u;
  while ((u = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT)) != want &&
         check_now_s() < deadline)
    check_sleep_ms(1);
  return u;
}

/* Starts an importer and has it import `pool`, which must report the
 * location (loc_type, loc_id) there; `grant` is a device it then grants
 * read-write access, plus 1 (0: none). */
static inline void start_importer(child *c, const char *mode, tp_pool_t pool,
                                  int loc_type, int loc_id, const char *env,
                                  int grant) {
  c->pid = -1;
  if (!CHECK(spawn(c, mode, env) == 0))
    return;
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  ctl q = {
      .op = CMD_POOL, .loc_type = loc_type, .loc_id = loc_id, .grant = grant};
  CHECK_OK(ask(c, &q, fd));
  /* The importer has its own copy now; ours can go. */
  close(fd);
}

/* Runs this process as a child when argv says it is one: returns 1 with
 * its exit code in *rc, else 0. */
static inline int ipc_child_main(int argc, char **argv, int *rc) {
  if (argc != 4 || strcmp(argv[1], "--importer") != 0)
    return 0;
  *rc = strcmp(argv[2], "exporter") == 0
            ? exporter_main(atoi(argv[3]))
            : importer_main(argv[2], atoi(argv[3]));
  return 1;
}

#endif /* TP_TEST_IPC_CHILD_H */
