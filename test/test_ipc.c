/* test_ipc: sharing pools between processes. This process exports; the
 * importers are this same program started again in a helper mode (fork,
 * then exec, so that a child never runs with a copy of the parent's
 * threads), driven over a control socketpair that carries the pool's
 * descriptor (SCM_RIGHTS) and export records. Memory is read and written
 * through streams only, so the test runs on any platform. */
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

/* ========================================================================
 * Helpers shared by both sides
 * ======================================================================== */

static tp_pool_t ipc_pool(int device) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, device, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  tp_pool_t pool = NULL;
  CHECK_OK(tp_pool_create(&pool, &props));
  return pool;
}

static uint64_t attr_u64(tp_pool_t pool, tp_pool_attr_t attr) {
  uint64_t v = 0;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static int attr_int(tp_pool_t pool, tp_pool_attr_t attr) {
  int v = -99;
  CHECK_OK(tp_pool_get_attribute(pool, attr, &v));
  return v;
}

static unsigned char pattern(uint64_t seed, size_t i) {
  return (unsigned char)(seed * 31 + i * 7 + (i >> 9));
}

/* Writes a pattern into device memory through `s`, and waits. */
static void fill(void *ptr, size_t size, uint64_t seed, tp_stream_t s) {
  unsigned char *buf = malloc(size);
  REQUIRE(buf);
  for (size_t i = 0; i < size; i++)
    buf[i] = pattern(seed, i);
  CHECK_OK(tp_memcpy_async(ptr, buf, size, s));
  CHECK_OK(tp_stream_synchronize(s));
  free(buf);
}

/* Whether device memory holds the pattern, read through `s`. */
static int holds(const void *ptr, size_t size, uint64_t seed, tp_stream_t s) {
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
  CMD_POOL = 1,   /* the pool's descriptor: import it */
  CMD_IMPORT,     /* import `rec` into `slot`; check contents when seed != 0 */
  CMD_WRITE,      /* write pattern `seed` at [offset, offset + size) of slot */
  CMD_EXPECT,     /* importing `rec` must fail with `expect` */
  CMD_CORRUPT,    /* every byte of `rec` corrupted must be refused */
  CMD_FREE,       /* free `slot` on the stream and wait */
  CMD_FREE_HELD,  /* free `slot` behind a held stream, without waiting */
  CMD_OPEN,       /* let the held stream go, and wait for it */
  CMD_FREE_QUIET, /* free `slot` and poll the stream until it is done,
                     without a synchronize (which would unmap) */
  CMD_FLOOD,      /* import the pool `size` times over, keeping every one;
                     reply: seed = imported, size = NOT_PERMITTED, offset =
                     any other answer */
  CMD_MAKE,       /* exporter mode: allocate `size` bytes of pattern `seed`;
                     reply: the pool's descriptor and the block's record */
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

static int ctl_send(int sock, const ctl *c, int fd) {
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

/* Waits for one message; -1 on timeout, end or error. */
static int ctl_recv(int sock, ctl *c, int *fd) {
  struct pollfd pf = {.fd = sock, .events = POLLIN};
  int r;
  do
    r = poll(&pf, 1, CHILD_TIMEOUT_MS);
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
static void corrupt_all(importer *im, const tp_pool_ptr_export_data_t *good) {
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
static void imported_rules(importer *im, const ctl *c) {
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

static tp_error_t serve_one(importer *im, ctl *c, int fd) {
  void *q = NULL;
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
static void flood(importer *im, ctl *c, int fd, ctl *r) {
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

static int importer_main(const char *mode, int sock) {
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
    if (ctl_recv(sock, &c, &fd) != 0) {
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
static int exporter_main(int sock) {
  check_context("exporter");
  tp_stream_t s = NULL;
  tp_pool_t pool = NULL;
  void *blocks[SLOTS];
  int nblocks = 0;
  REQUIRE_OK_EXIT(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  for (;;) {
    ctl c, r;
    if (ctl_recv(sock, &c, NULL) != 0) {
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
    } else if (c.op == CMD_EXIT) {
      for (int i = 0; i < nblocks; i++)
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
static int spawn(child *c, const char *mode, const char *env) {
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
static tp_error_t ask_reply(child *c, ctl *q, int fd, ctl *r, int *rfd) {
  if (ctl_send(c->sock, q, fd) != 0 || ctl_recv(c->sock, r, rfd) != 0 ||
      r->op != CMD_REPLY) {
    CHECK_FAIL("the child did not answer command %d", q->op);
    return TP_ERROR_NOT_READY;
  }
  return (tp_error_t)r->status;
}

static tp_error_t ask(child *c, ctl *q, int fd) {
  ctl r;
  return ask_reply(c, q, fd, &r, NULL);
}

static tp_error_t ask_import(child *c, int slot, const void *ptr, size_t size,
                             uint64_t seed) {
  ctl q = {.op = CMD_IMPORT, .slot = slot, .seed = seed, .size = size};
  if (!CHECK_OK(tp_pool_export_pointer(&q.rec, (void *)ptr)))
    return TP_ERROR_INVALID_VALUE;
  return ask(c, &q, -1);
}

static tp_error_t ask_slot(child *c, int op, int slot) {
  ctl q = {.op = op, .slot = slot};
  return ask(c, &q, -1);
}

/* Waits for the child's exit; its status, or -1. */
static int child_wait(child *c) {
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

static int child_finish(child *c) {
  ctl q = {.op = CMD_EXIT};
  CHECK_EQ_INT(ask(c, &q, -1), 0);
  return child_wait(c);
}

/* Polls the pool's bytes in use until they reach `want`: releases by an
 * importer arrive on the pool's service thread. */
static uint64_t wait_used(tp_pool_t pool, uint64_t want) {
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
static void start_importer(child *c, const char *mode, tp_pool_t pool,
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

/* ========================================================================
 * Tests
 * ======================================================================== */

/* A process may import its own pool: the pointer is another mapping of the
 * same bytes, and the holds work as across processes. */
static void test_same_process(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), imported = NULL;
  REQUIRE(pool);
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd); /* the caller's descriptor: the import needs it no more */
  void *a = NULL, *b = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 3 * MiB, pool, s));
  fill(a, 3 * MiB, 7, s);
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  CHECK(b != a);
  CHECK(holds(b, 3 * MiB, 7, s));
  fill(b, 1 * MiB, 8, s);
  CHECK(holds(a, 1 * MiB, 8, s));
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  CHECK_ERR(tp_pool_export_pointer(&rec, b), TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_free_async((char *)b + 512, s), TP_ERROR_INVALID_VALUE);

  /* The exporter frees first: the block stays out of reuse (and counted as
   * used) until the importer's free has completed. */
  CHECK_OK(tp_free_async(a, s));
  CHECK_ERR(tp_free_async(a, s), TP_ERROR_INVALID_VALUE);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 3 * MiB);
  void *c = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&c, 3 * MiB, pool, s));
  CHECK(c != a);
  CHECK_OK(tp_free_async(c, s));
  CHECK_OK(tp_free_async(b, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  /* A record of a freed allocation names nothing any more. */
  CHECK_ERR(tp_pool_import_pointer(&b, imported, &rec), TP_ERROR_INVALID_VALUE);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(imported, 0));
  CHECK_EQ_U64(attr_u64(imported, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* A pool of host memory (a NUMA node) is shared the same way; its bytes
 * are the host's in both processes, so the CPU reads them directly. */
static void test_host_numa_pool(void) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_HOST_NUMA, 0, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  tp_pool_t pool = NULL, imported = NULL;
  tp_error_t err = tp_pool_create(&pool, &props);
  if (err == TP_ERROR_NOT_SUPPORTED) {
    printf("   skipped: this platform cannot export host memory\n");
    return;
  }
  REQUIRE_OK(err);
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  CHECK_EQ_INT(attr_int(imported, TP_POOL_ATTR_LOCATION_TYPE),
               TP_LOCATION_HOST_NUMA);
  CHECK_EQ_INT(attr_int(imported, TP_POOL_ATTR_LOCATION_ID), 0);
  void *a = NULL, *b = NULL;
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 100 * KiB, pool, s));
  REQUIRE_OK(tp_stream_synchronize(s));
  memset(a, 0x5A, 100 * KiB);
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  const unsigned char *q = b;
  CHECK(q[0] == 0x5A && q[100 * KiB - 1] == 0x5A);
  ((unsigned char *)b)[7] = 0xA5;
  CHECK(((unsigned char *)a)[7] == 0xA5);
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(imported));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Threads of one importer import and free at once, on streams of their
 * own, while the exporter frees the blocks and allocates and overwrites
 * new ones: a block a thread holds keeps its bytes, a block freed and not
 * held can no longer be imported, and every block comes back. */
#define RACE_BLOCKS 32
#define RACE_THREADS 4

typedef struct race {
  tp_pool_t imported;
  tp_pool_ptr_export_data_t rec[RACE_BLOCKS];
  uint64_t seed;
  atomic_int *freeing; /* the exporter has begun to free */
} race;

/* Copies bytes [from, to) were read into; they are checked once the
 * stream has run. */
static void race_check(const unsigned char *got, const int *want, int from,
                       int to) {
  for (int i = from; i < to; i++)
    if (want[i] >= 0)
      CHECK_EQ_INT(got[i], want[i]);
}

#define RACE_ROUNDS 200

static void *race_thread(void *arg) {
  race *r = arg;
  tp_stream_t s = NULL;
  if (!CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING)))
    return NULL;
  check_rng rng = {r->seed};
  unsigned char got[RACE_ROUNDS];
  int want[RACE_ROUNDS], checked = 0;
  for (int i = 0; i < RACE_ROUNDS; i++) {
    int k = (int)rng_below(&rng, RACE_BLOCKS);
    void *q = NULL;
    want[i] = -1;
    tp_error_t err = tp_pool_import_pointer(&q, r->imported, &r->rec[k]);
    if (err == TP_ERROR_INVALID_VALUE && atomic_load(r->freeing))
      continue; /* freed by the exporter, and held by nobody */
    if (!CHECK_OK(err))
      break;
    want[i] = pattern((uint64_t)k + 1, 0);
    CHECK_OK(tp_memcpy_async(&got[i], q, 1, s));
    CHECK_OK(tp_free_async(q, s));
    if (atomic_load(r->freeing) || rng_chance(&rng, 20)) {
      CHECK_OK(tp_stream_synchronize(s));
      race_check(got, want, checked, i + 1);
      checked = i + 1;
    }
  }
  CHECK_OK(tp_stream_synchronize(s));
  race_check(got, want, checked, RACE_ROUNDS);
  CHECK_OK(tp_stream_destroy(s));
  return NULL;
}

static void test_concurrent_imports(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  race r[RACE_THREADS];
  void *blocks[RACE_BLOCKS], *fresh[RACE_BLOCKS];
  size_t sizes[RACE_BLOCKS];
  atomic_int freeing = 0;
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &r[0].imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  uint64_t total = 0;
  for (int k = 0; k < RACE_BLOCKS; k++) {
    size_t size = (k % 4 == 0 ? 3 * MiB : 8 * KiB) + (size_t)k * 512;
    REQUIRE_OK(tp_malloc_from_pool_async(&blocks[k], size, pool, s));
    fill(blocks[k], 512, (uint64_t)k + 1, s);
    REQUIRE_OK(tp_pool_export_pointer(&r[0].rec[k], blocks[k]));
    sizes[k] = size;
    total += size;
  }
  r[0].freeing = &freeing;
  pthread_t t[RACE_THREADS];
  for (int i = 0; i < RACE_THREADS; i++) {
    r[i] = r[0];
    r[i].seed = (uint64_t)i + 1;
    REQUIRE(pthread_create(&t[i], NULL, race_thread, &r[i]) == 0);
  }
  check_sleep_ms(2);
  atomic_store(&freeing, 1);
  for (int k = 0; k < RACE_BLOCKS; k++)
    CHECK_OK(tp_free_async(blocks[k], s));
  for (int k = 0; k < RACE_BLOCKS; k++) {
    CHECK_OK(tp_malloc_from_pool_async(&fresh[k], sizes[k], pool, s));
    CHECK_OK(tp_memset_async(fresh[k], 0xEE, sizes[k], s));
  }
  for (int i = 0; i < RACE_THREADS; i++)
    pthread_join(t[i], NULL);
  CHECK_EQ_U64(attr_u64(r[0].imported, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_EQ_U64(wait_used(pool, total), total);
  for (int k = 0; k < RACE_BLOCKS; k++)
    CHECK_OK(tp_free_async(fresh[k], s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(r[0].imported));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An exporter that destroys its pool while an importer holds a block keeps
 * the pool until the importer lets go. */
static void test_destroy_while_held(void) {
  tp__host_live before, after;
  tp__host_live_get(&before);
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), imported = NULL;
  REQUIRE(pool);
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  REQUIRE_OK(tp_pool_import_from_shareable_handle(
      &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0));
  close(fd);
  void *a = NULL, *b = NULL;
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 64 * KiB, pool, s));
  fill(a, 64 * KiB, 3, s);
  REQUIRE_OK(tp_pool_export_pointer(&rec, a));
  REQUIRE_OK(tp_pool_import_pointer(&b, imported, &rec));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK(holds(b, 64 * KiB, 3, s)); /* still the importer's */
  CHECK_OK(tp_free_async(b, s));
  CHECK_OK(tp_pool_destroy(imported));
  /* The pool goes at a synchronize after the release reached it. */
  double deadline = check_now_s() + 10.0;
  do {
    CHECK_OK(tp_device_synchronize());
    tp__host_live_get(&after);
  } while (check_on_host() && after.reservations != before.reservations &&
           check_now_s() < deadline && (check_sleep_ms(1), 1));
  if (check_on_host()) {
    CHECK_EQ_U64(after.reservations, before.reservations);
    CHECK_EQ_U64(after.chunks, before.chunks);
    CHECK_EQ_U64(after.mapped_chunks, before.mapped_chunks);
  }
  CHECK_OK(tp_stream_destroy(s));
}

/* Another process imports pointers with their contents, writes through
 * them, imports blocks carved from chunks mapped after the export, is
 * refused every corrupted, stale or foreign record, and frees in stream
 * order: a block it holds stays out of the exporter's reuse. */
static void test_across_processes(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0), other = ipc_pool(0);
  REQUIRE(pool && other);
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 4 * KiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&b, 3 * MiB, pool, s));
  fill(a, 4 * KiB, 11, s);
  fill(b, 3 * MiB, 12, s);
  child ch;
  start_importer(&ch, "importer", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, 4 * KiB, 11));
  CHECK_OK(ask_import(&ch, 1, b, 3 * MiB, 12));
  /* Writes of the importer are the exporter's bytes. */
  ctl w = {
      .op = CMD_WRITE, .slot = 1, .seed = 13, .offset = MiB, .size = 2 * MiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds((char *)b + MiB, 2 * MiB, 13, s));

  /* Chunks mapped after the export are reachable. */
  uint64_t maps = attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS);
  REQUIRE_OK(tp_malloc_from_pool_async(&c, 8 * MiB, pool, s));
  fill(c, 8 * MiB, 14, s);
  CHECK(attr_u64(pool, TP_POOL_ATTR_CHUNK_MAPS) > maps);
  CHECK_OK(ask_import(&ch, 2, c, 8 * MiB, 14));

  /* Corrupted, stale and foreign records are refused. */
  ctl q = {.op = CMD_CORRUPT};
  CHECK_OK(tp_pool_export_pointer(&q.rec, a));
  uint64_t used = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  CHECK_OK(ask(&ch, &q, -1));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  REQUIRE_OK(tp_malloc_from_pool_async(&d, 64 * KiB, pool, s));
  q = (ctl){.op = CMD_EXPECT, .expect = TP_ERROR_INVALID_VALUE};
  CHECK_OK(tp_pool_export_pointer(&q.rec, d));
  CHECK_OK(tp_free_async(d, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(ask(&ch, &q, -1));
  REQUIRE_OK(tp_malloc_from_pool_async(&e, 64 * KiB, other, s));
  CHECK_OK(tp_pool_export_pointer(&q.rec, e));
  CHECK_OK(ask(&ch, &q, -1));
  CHECK_OK(tp_free_async(e, s));

  /* The importer frees b behind a held stream; the exporter frees it too,
   * and must not hand its bytes out while the importer's free is pending. */
  used = attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT);
  CHECK_OK(ask_slot(&ch, CMD_FREE_HELD, 1));
  CHECK_OK(tp_free_async(b, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  void *b2 = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&b2, 3 * MiB, pool, s));
  CHECK(b2 != b);
  CHECK_OK(tp_free_async(b2, s));
  CHECK_OK(tp_stream_synchronize(s));
  check_sleep_ms(20);
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), used);
  CHECK_OK(ask_slot(&ch, CMD_OPEN, 0));
  CHECK_EQ_U64(wait_used(pool, used - 3 * MiB), used - 3 * MiB);

  /* Importer frees, then the exporter. The importer's release reaches the
   * exporter's service thread a moment after its free completed; a free
   * of the exporter's before that waits for it. */
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 2));
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_free_async(c, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_pool_destroy(other));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer releases a block but keeps its mapping (it has not
 * synchronised since); the exporter trims the chunk and makes it again over
 * other memory. A new import there maps it afresh: the old mapping would
 * show the old bytes. */
static void test_remapped_chunk(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *p0 = NULL, *x = NULL, *p2 = NULL, *g = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&p0, 2 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 2 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&p2, 2 * MiB, pool, s));
  fill(x, 2 * MiB, 41, s);
  child ch;
  start_importer(&ch, "importer", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, x, 2 * MiB, 41));
  CHECK_OK(ask_slot(&ch, CMD_FREE_QUIET, 0));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_free_async(p2, s));
  CHECK_EQ_U64(wait_used(pool, 2 * MiB), 2 * MiB);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 2 * MiB);
  REQUIRE_OK(tp_malloc_from_pool_async(&g, 2 * MiB, pool, s));
  fill(g, 2 * MiB, 44, s);
  CHECK_OK(ask_import(&ch, 1, g, 2 * MiB, 44));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 1));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(g, s));
  CHECK_OK(tp_free_async(p0, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* An importer killed while it holds blocks releases them when its channel
 * closes; the exporter keeps working and gets its memory back. */
static void test_importer_killed(void) {
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *x = NULL, *y = NULL;
  REQUIRE_OK(tp_malloc_from_pool_async(&x, 4 * MiB, pool, s));
  REQUIRE_OK(tp_malloc_from_pool_async(&y, 1 * KiB, pool, s));
  fill(x, 4 * MiB, 21, s);
  fill(y, 1 * KiB, 22, s);
  child ch;
  start_importer(&ch, "holder", pool, TP_LOCATION_DEVICE, 0, NULL, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, x, 4 * MiB, 21));
  CHECK_OK(ask_import(&ch, 1, y, 1 * KiB, 22));
  CHECK_OK(tp_free_async(x, s));
  CHECK_OK(tp_free_async(y, s));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_USED_MEM_CURRENT), 4 * MiB + KiB);
  void *x2 = NULL;
  CHECK_OK(tp_malloc_from_pool_async(&x2, 4 * MiB, pool, s));
  CHECK(x2 != x);
  kill(ch.pid, SIGKILL);
  CHECK(child_wait(&ch) == -1);
  CHECK_EQ_U64(wait_used(pool, 4 * MiB), 4 * MiB);
  /* The pool goes on: x's bytes are reusable, and another import works. */
  CHECK_OK(tp_free_async(x2, s));
  CHECK_OK(tp_stream_synchronize(s));
  tp_pool_t self = NULL;
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  CHECK_OK(tp_pool_import_from_shareable_handle(&self, (void *)(uintptr_t)fd,
                                                TP_HANDLE_POSIX_FD, 0));
  close(fd);
  void *z = NULL, *zi = NULL;
  tp_pool_ptr_export_data_t rec;
  CHECK_OK(tp_malloc_from_pool_async(&z, 2 * MiB, pool, s));
  fill(z, 2 * MiB, 23, s);
  CHECK_OK(tp_pool_export_pointer(&rec, z));
  if (self && CHECK_OK(tp_pool_import_pointer(&zi, self, &rec))) {
    CHECK(holds(zi, 2 * MiB, 23, s));
    CHECK_OK(tp_free_async(zi, s));
  }
  CHECK_OK(tp_stream_synchronize(s));
  if (self)
    CHECK_OK(tp_pool_destroy(self));
  CHECK_OK(tp_free_async(z, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_trim_to(pool, 0));
  CHECK_EQ_U64(attr_u64(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* A process of another user is refused, descriptor or not. */
static void test_other_user(void) {
  if (geteuid() != 0) {
    printf("   skipped: only root can start a process of another user\n");
    return;
  }
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  child ch;
  REQUIRE(spawn(&ch, "other-user", NULL) == 0);
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  ctl q = {.op = CMD_POOL};
  CHECK_ERR(ask(&ch, &q, fd), TP_ERROR_NOT_PERMITTED);
  close(fd);
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_pool_destroy(pool));
}

/* The environment that shows a child importer only the device this process
 * numbers 1: on cuda, CUDA_VISIBLE_DEVICES naming it. NULL where this
 * process's own list does not say which that is. */
static const char *only_device1(char *buf, size_t len) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !*v) {
    snprintf(buf, len, "CUDA_VISIBLE_DEVICES=1");
    return buf;
  }
  const char *comma = strchr(v, ',');
  if (!comma || !comma[1])
    return NULL;
  size_t n = strcspn(comma + 1, ",");
  snprintf(buf, len, "CUDA_VISIBLE_DEVICES=%.*s", (int)n, comma + 1);
  return buf;
}

/* An importer that cannot see the pool's device reports it invisible, and
 * still reads and writes the memory from its own device. On the host
 * platform: a pool of device 1, and an importer with one emulated device; on
 * cuda: a pool of device 0, and an importer that sees only the GPU this
 * process numbers 1. */
static void test_invisible_device(void) {
  int n = 0;
  CHECK_OK(tp_get_device_count(&n));
  char env[128];
  const char *only = check_on_host() ? "TIDEPOOL_HOST_DEVICES=1"
                                     : only_device1(env, sizeof env);
  if (n < 2 || !only) {
    printf("   skipped: needs 2 devices (TIDEPOOL_HOST_DEVICES=2 on the "
           "host platform)\n");
    return;
  }
  int dev = check_on_host() ? 1 : 0;
  tp_stream_t s = NULL;
  CHECK_OK(tp_set_device(dev));
  CHECK_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  CHECK_OK(tp_set_device(0));
  tp_pool_t pool = ipc_pool(dev);
  REQUIRE(pool && s);
  void *a = NULL;
  const size_t size = 2 * MiB + 256 * KiB; /* two chunks */
  REQUIRE_OK(tp_malloc_from_pool_async(&a, size, pool, s));
  fill(a, size, 31, s);
  child ch;
  printf("   importer with %s\n", only);
  start_importer(&ch, "importer", pool, TP_LOCATION_INVISIBLE, -2, only, 0);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, size, 31));
  ctl w = {
      .op = CMD_WRITE, .slot = 0, .seed = 32, .offset = 0, .size = 64 * KiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds(a, 64 * KiB, 32, s));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Across devices: the exporter allocates on device 0; an importer whose
 * current device is 1 imports the pool (which it sees as device 0's),
 * grants its device access, reads the exporter's bytes through a stream of
 * device 1 and writes bytes the exporter then reads. */
static void test_importer_on_device1(void) {
  int n = 0;
  CHECK_OK(tp_get_device_count(&n));
  if (n < 2) {
    printf("   skipped: needs 2 devices (TIDEPOOL_HOST_DEVICES=2 on the "
           "host platform)\n");
    return;
  }
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  tp_pool_t pool = ipc_pool(0);
  REQUIRE(pool);
  void *a = NULL;
  const size_t size = 2 * MiB + 4 * KiB; /* two chunks */
  REQUIRE_OK(tp_malloc_from_pool_async(&a, size, pool, s));
  fill(a, size, 51, s);
  child ch;
  start_importer(&ch, "importer-dev1", pool, TP_LOCATION_DEVICE, 0, NULL, 2);
  REQUIRE(ch.pid > 0);
  CHECK_OK(ask_import(&ch, 0, a, size, 51));
  ctl w = {.op = CMD_WRITE,
           .slot = 0,
           .seed = 52,
           .offset = 2 * MiB,
           .size = 4 * KiB};
  CHECK_OK(ask(&ch, &w, -1));
  CHECK(holds((char *)a + 2 * MiB, 4 * KiB, 52, s));
  CHECK_OK(ask_slot(&ch, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(a, s));
  CHECK_EQ_U64(wait_used(pool, 0), 0);
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* The descriptor comes by value, (void *)(uintptr_t)fd, as the driver
 * takes it; NULL is descriptor 0. A pointer to a descriptor (the old
 * convention), a number that is no open descriptor, and descriptors that
 * are no exported pool's are refused without touching anything. */
static void test_handle_by_value(void) {
  tp_pool_t pool = ipc_pool(0), imported = NULL;
  REQUIRE(pool);
  int fd = -1;
  REQUIRE_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  CHECK_ERR(tp_pool_import_from_shareable_handle(&imported, &fd,
                                                 TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)INT_MAX, TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)-1, TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  int pv[2], sv[2];
  REQUIRE(pipe(pv) == 0);
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)pv[0], TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)sv[0], TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK(imported == NULL);
  close(pv[0]);
  close(pv[1]);
  close(sv[0]);
  close(sv[1]);
  if (CHECK_OK(tp_pool_import_from_shareable_handle(
          &imported, (void *)(uintptr_t)fd, TP_HANDLE_POSIX_FD, 0)))
    CHECK_OK(tp_pool_destroy(imported));
  /* Descriptor 0, given as NULL. */
  int saved = dup(0);
  REQUIRE(saved >= 0 && dup2(fd, 0) == 0);
  imported = NULL;
  tp_error_t err = tp_pool_import_from_shareable_handle(&imported, NULL,
                                                        TP_HANDLE_POSIX_FD, 0);
  dup2(saved, 0);
  close(saved);
  if (CHECK_OK(err))
    CHECK_OK(tp_pool_destroy(imported));
  close(fd);
  CHECK_OK(tp_pool_destroy(pool));
}

/* The descriptors this process has open. */
static uint64_t open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return 0;
  uint64_t n = 0;
  for (struct dirent *e = readdir(d); e; e = readdir(d))
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

/* An importer that opens channel after channel cannot take the exporter's
 * descriptors: one importing process gets 64 channels to a pool and is
 * refused the rest (NOT_PERMITTED), while the exporter still exports and
 * other processes still import; and an exporter short of descriptors keeps
 * 64 of them for itself, whoever asks. */
static void test_channel_limits(void) {
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  props.max_size = 64 * MiB; /* a small range for each of the imports */
  tp_pool_t pool = NULL, self = NULL;
  REQUIRE_OK(tp_pool_create(&pool, &props));
  tp_stream_t s = NULL;
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  child ch;
  REQUIRE(spawn(&ch, "flood", NULL) == 0);
  int fd = -1;
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  ctl q = {.op = CMD_FLOOD, .size = 100}, r;
  CHECK_OK(ask_reply(&ch, &q, fd, &r, NULL));
  close(fd);
  uint64_t during = open_fds();
  CHECK_EQ_U64(r.seed, 64);
  CHECK_EQ_U64(r.size, 36);
  CHECK_EQ_U64(r.offset, 0);
  /* The exporter goes on, and serves another process. */
  CHECK_OK(
      tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
  CHECK_OK(tp_pool_import_from_shareable_handle(&self, (void *)(uintptr_t)fd,
                                                TP_HANDLE_POSIX_FD, 0));
  close(fd);
  void *a = NULL, *b = NULL;
  tp_pool_ptr_export_data_t rec;
  REQUIRE_OK(tp_malloc_from_pool_async(&a, 8 * KiB, pool, s));
  fill(a, 8 * KiB, 71, s);
  CHECK_OK(tp_pool_export_pointer(&rec, a));
  if (self && CHECK_OK(tp_pool_import_pointer(&b, self, &rec))) {
    CHECK(holds(b, 8 * KiB, 71, s));
    CHECK_OK(tp_free_async(b, s));
  }
  CHECK_OK(tp_stream_synchronize(s));
  if (self)
    CHECK_OK(tp_pool_destroy(self));
  CHECK_EQ_INT(child_finish(&ch), 0);
  /* The service thread closes the channels once it sees them hang up. */
  double deadline = check_now_s() + 10.0;
  while (open_fds() + 64 > during && check_now_s() < deadline)
    check_sleep_ms(1);

  /* Short of descriptors: 72 free ones less the channels make the limit,
   * so a few channels pass and the exporter keeps its 64. */
  struct rlimit old, low;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  REQUIRE(spawn(&ch, "flood", NULL) == 0); /* before the limit falls */
  uint64_t open = open_fds();
  low = old;
  low.rlim_cur = open + 72;
  if (open == 0 ||
      (old.rlim_cur != RLIM_INFINITY && low.rlim_cur > old.rlim_cur)) {
    printf("   descriptor reserve: skipped (%llu open)\n",
           (unsigned long long)open);
  } else if (CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0)) {
    CHECK_OK(
        tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
    q = (ctl){.op = CMD_FLOOD, .size = 40};
    CHECK_OK(ask_reply(&ch, &q, fd, &r, NULL));
    close(fd);
    printf("   with %llu descriptors free: %llu channels, %llu refused\n",
           (unsigned long long)(low.rlim_cur - open),
           (unsigned long long)r.seed, (unsigned long long)r.size);
    CHECK(r.seed >= 1 && r.seed <= 12);
    CHECK_EQ_U64(r.seed + r.size, 40);
    /* The exporter's own use: another export. */
    int mine = -1;
    CHECK_OK(
        tp_pool_export_to_shareable_handle(&mine, pool, TP_HANDLE_POSIX_FD, 0));
    if (mine >= 0)
      close(mine);
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
  }
  CHECK_EQ_INT(child_finish(&ch), 0);
  CHECK_OK(tp_free_async(a, s));
  CHECK_OK(tp_stream_synchronize(s));
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
}

/* Every wait on an exporter ends: with the exporter stopped (SIGSTOP), an
 * importer's pool import and pointer import fail within its bound
 * (TIDEPOOL_IPC_TIMEOUT_MS, 500 ms here) instead of hanging, later imports
 * through that pool fail at once, and both sides end cleanly once the
 * exporter runs again. */
static void test_stopped_exporter(void) {
  child ex, im;
  REQUIRE(spawn(&ex, "exporter", NULL) == 0);
  ctl q = {.op = CMD_MAKE, .size = MiB, .seed = 61}, r;
  int fd = -1;
  CHECK_OK(ask_reply(&ex, &q, -1, &r, &fd));
  if (!CHECK(fd >= 0)) {
    child_finish(&ex);
    return;
  }
  REQUIRE(spawn(&im, "importer", "TIDEPOOL_IPC_TIMEOUT_MS=500") == 0);
  ctl pq = {.op = CMD_POOL, .loc_type = TP_LOCATION_DEVICE, .loc_id = 0};
  CHECK_OK(ask(&im, &pq, fd));
  ctl iq = {.op = CMD_IMPORT, .slot = 0, .seed = 61, .size = MiB, .rec = r.rec};
  CHECK_OK(ask(&im, &iq, -1));
  /* Stopped for sure before the importer asks: a signal takes a moment. */
  int st = 0;
  REQUIRE(kill(ex.pid, SIGSTOP) == 0);
  REQUIRE(waitpid(ex.pid, &st, WUNTRACED) == ex.pid && WIFSTOPPED(st));
  double t0 = check_now_s();
  CHECK_ERR(ask(&im, &pq, fd), TP_ERROR_INVALID_VALUE);
  double pool_s = check_now_s() - t0;
  iq.slot = 1;
  t0 = check_now_s();
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  double ptr_s = check_now_s() - t0;
  t0 = check_now_s();
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  double again_s = check_now_s() - t0;
  printf("   stopped exporter: pool import %.2f s, pointer import %.2f s, "
         "then %.3f s\n",
         pool_s, ptr_s, again_s);
  CHECK(pool_s < 10.0);
  CHECK(ptr_s < 10.0);
  CHECK(again_s < 0.4); /* no second wait: the channel is known gone */
  kill(ex.pid, SIGCONT);
  CHECK_OK(ask_slot(&im, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&im), 0);
  CHECK_EQ_INT(child_finish(&ex), 0);
  close(fd);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--importer") == 0)
    return strcmp(argv[2], "exporter") == 0
               ? exporter_main(atoi(argv[3]))
               : importer_main(argv[2], atoi(argv[3]));
  signal(SIGPIPE, SIG_IGN);
  printf("test_ipc on the %s platform\n", tp_platform_name());
  RUN_TEST(test_same_process);
  RUN_TEST(test_destroy_while_held);
  RUN_TEST(test_host_numa_pool);
  RUN_TEST(test_concurrent_imports);
  RUN_TEST(test_across_processes);
  RUN_TEST(test_remapped_chunk);
  RUN_TEST(test_importer_killed);
  RUN_TEST(test_other_user);
  RUN_TEST(test_invisible_device);
  RUN_TEST(test_importer_on_device1);
  RUN_TEST(test_handle_by_value);
  RUN_TEST(test_channel_limits);
  RUN_TEST(test_stopped_exporter);
  return check_done();
}
