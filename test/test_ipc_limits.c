/* test_ipc_limits: what one process sharing a pool must not be able to do
 * to the other, and how a descriptor is passed. An importer that opens
 * channel after channel cannot take the exporter's descriptors; an
 * exporter that stops answering cannot hang an importer, whose releases
 * then wait in order for it to read again and whose timed-out import
 * holds nothing, while the exporter keeps the importer's holds; a
 * descriptor is taken by value, as the driver takes it. Children as in
 * test_ipc (ipc_child.h). */
#include "ipc_child.h"
#include <pthread.h>

#include <sys/socket.h>
#include <sys/un.h>

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
  /* Sockets that are no connected channel: one never connected, and one
   * that listens (sendmsg answers ENOTCONN, the caller's fault). */
  int lone = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  int listening = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "tp-ipc-limits-%d",
           (int)getpid()); /* abstract: nothing to clean up */
  REQUIRE(lone >= 0 && listening >= 0);
  REQUIRE(bind(listening, (struct sockaddr *)&addr, sizeof addr) == 0 &&
          listen(listening, 1) == 0);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)lone, TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK_ERR(tp_pool_import_from_shareable_handle(
                &imported, (void *)(uintptr_t)listening, TP_HANDLE_POSIX_FD, 0),
            TP_ERROR_INVALID_VALUE);
  CHECK(imported == NULL);
  close(lone);
  close(listening);
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

#define TOTAL_CHILDREN 17 /* 16 of them fill the process's 1024 channels */

/* The channels of every importer together are capped too: 1024 for the
 * exporting process, whoever asks. Sixteen importers fill them, 64 each;
 * a seventeenth gets none. Needs room for about 1,200 descriptors. */
static void test_channel_total(void) {
  struct rlimit old, wide;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  wide = old;
  if (wide.rlim_cur != RLIM_INFINITY && wide.rlim_cur < 2048)
    wide.rlim_cur = wide.rlim_max == RLIM_INFINITY || wide.rlim_max > 2048
                        ? 2048
                        : wide.rlim_max;
  if (wide.rlim_cur != RLIM_INFINITY && wide.rlim_cur < 1300) {
    printf("   skipped: %llu descriptors at most; this test needs 1300\n",
           (unsigned long long)wide.rlim_cur);
    return;
  }
  REQUIRE(setrlimit(RLIMIT_NOFILE, &wide) == 0);
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  props.max_size = 64 * MiB;
  tp_pool_t pool = NULL;
  REQUIRE_OK(tp_pool_create(&pool, &props));
  child ch[TOTAL_CHILDREN];
  uint64_t total = 0, refused = 0;
  int started = 0;
  for (int i = 0; i < TOTAL_CHILDREN; i++) {
    if (!CHECK(spawn(&ch[i], "flood", NULL) == 0))
      break;
    started++;
    int fd = -1;
    CHECK_OK(
        tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0));
    ctl q = {.op = CMD_FLOOD, .size = 64}, r;
    CHECK_OK(ask_reply(&ch[i], &q, fd, &r, NULL));
    close(fd);
    CHECK_EQ_U64(r.offset, 0);
    if (i < TOTAL_CHILDREN - 1)
      CHECK_EQ_U64(r.seed, 64);
    total += r.seed;
    refused += r.size;
  }
  printf("   %d importers: %llu channels, %llu refused\n", started,
         (unsigned long long)total, (unsigned long long)refused);
  CHECK_EQ_U64(total, 1024);
  CHECK_EQ_U64(refused, 64);
  for (int i = 0; i < started; i++)
    CHECK_EQ_INT(child_finish(&ch[i]), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
}

/* Starts an exporter child with one block of `size` bytes of pattern
 * `seed`: its record in *r, the pool's descriptor in *fd. False (the child
 * finished) when no descriptor came. */
static bool exporter_with_block(child *ex, size_t size, uint64_t seed, ctl *r,
                                int *fd) {
  REQUIRE_EXIT(spawn(ex, "exporter", NULL) == 0);
  ctl q = {.op = CMD_MAKE, .size = size, .seed = seed};
  *fd = -1;
  CHECK_OK(ask_reply(ex, &q, -1, r, fd));
  if (CHECK(*fd >= 0))
    return true;
  child_finish(ex);
  return false;
}

/* Starts an importer child whose waits end after `timeout_ms`, and makes it
 * import the pool behind `fd`. */
static void importer_of(child *im, int fd, int timeout_ms) {
  char env[64];
  snprintf(env, sizeof env, "TIDEPOOL_IPC_TIMEOUT_MS=%d", timeout_ms);
  REQUIRE_EXIT(spawn(im, "importer", env) == 0);
  ctl pq = {.op = CMD_POOL, .loc_type = TP_LOCATION_DEVICE, .loc_id = 0};
  CHECK_OK(ask(im, &pq, fd));
}

/* Stops a child for sure before the caller goes on: a signal takes a
 * moment. */
static void stop(child *c) {
  int st = 0;
  REQUIRE_EXIT(kill(c->pid, SIGSTOP) == 0);
  REQUIRE_EXIT(waitpid(c->pid, &st, WUNTRACED) == c->pid && WIFSTOPPED(st));
}

/* Every wait on an exporter ends: with the exporter stopped (SIGSTOP), an
 * importer's pool import and pointer import fail within its bound
 * (TIDEPOOL_IPC_TIMEOUT_MS, 500 ms here) instead of hanging, later imports
 * through that pool fail at once, and both sides end cleanly once the
 * exporter runs again. */
static void test_stopped_exporter(void) {
  child ex, im;
  ctl r;
  int fd;
  if (!exporter_with_block(&ex, MiB, 61, &r, &fd))
    return;
  importer_of(&im, fd, 500);
  ctl pq = {.op = CMD_POOL, .loc_type = TP_LOCATION_DEVICE, .loc_id = 0};
  ctl iq = {.op = CMD_IMPORT, .slot = 0, .seed = 61, .size = MiB, .rec = r.rec};
  CHECK_OK(ask(&im, &iq, -1));
  stop(&ex);
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

/* An exporter killed while a child it forked (one that makes no call of
 * tidepool's) lives on: an importer learns at once that it is gone, both
 * through its channel and through the pool's descriptor, rather than at
 * the end of its bound (20 s here), which the child's copies of the
 * exporter's sockets once made it wait. */
static void test_exporter_killed_with_forked_child(void) {
  child ex, im;
  ctl r;
  int fd;
  if (!exporter_with_block(&ex, MiB, 62, &r, &fd))
    return;
  importer_of(&im, fd, 20000);
  ctl iq = {.op = CMD_IMPORT, .slot = 0, .seed = 62, .size = MiB, .rec = r.rec};
  CHECK_OK(ask(&im, &iq, -1));
  ctl fq = {.op = CMD_FORK}, fr = {0};
  CHECK_OK(ask_reply(&ex, &fq, -1, &fr, NULL));
  pid_t sleeper = (pid_t)fr.seed;
  CHECK(sleeper > 0);
  kill(ex.pid, SIGKILL);
  CHECK(child_wait(&ex) == -1);
  iq.slot = 1;
  double t0 = check_now_s();
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  double ptr_s = check_now_s() - t0;
  ctl pq = {.op = CMD_POOL, .loc_type = TP_LOCATION_DEVICE, .loc_id = 0};
  t0 = check_now_s();
  CHECK_ERR(ask(&im, &pq, fd), TP_ERROR_INVALID_VALUE);
  double pool_s = check_now_s() - t0;
  printf("   exporter killed, its child alive: pointer import %.2f s, pool "
         "import %.2f s\n",
         ptr_s, pool_s);
  CHECK(ptr_s < 10.0);
  CHECK(pool_s < 10.0);
  if (sleeper > 0)
    kill(sleeper, SIGKILL);
  CHECK_OK(ask_slot(&im, CMD_FREE, 0));
  CHECK_EQ_INT(child_finish(&im), 0);
  close(fd);
}

/* The exporter's used bytes, once they equal `want` or after a second. */
static uint64_t exporter_used(child *ex, uint64_t want) {
  ctl q = {.op = CMD_USED}, r = {0};
  double until = check_now_s() + 1.0;
  do {
    if (!CHECK_OK(ask_reply(ex, &q, -1, &r, NULL)) || r.size == want)
      break;
    usleep(10000);
  } while (check_now_s() < until);
  return r.size;
}

/* An exporter that was only slow keeps what an importer holds. The
 * exporter frees a block the importer imported, then stops past the
 * importer's bound, so that a second import times out. Running again, the
 * exporter must still count the block as held (it once took the timeout's
 * closed channel as the importer gone, released its holds, and gave the
 * block's bytes to its next allocation while the importer still read
 * them); the importer's own free still releases it. */
static void test_slow_exporter_keeps_holds(void) {
  child ex, im;
  ctl r;
  int fd;
  if (!exporter_with_block(&ex, MiB, 71, &r, &fd))
    return;
  importer_of(&im, fd, 300);
  ctl iq = {.op = CMD_IMPORT, .slot = 0, .seed = 71, .size = MiB, .rec = r.rec};
  CHECK_OK(ask(&im, &iq, -1));
  CHECK_OK(ask_slot(&ex, CMD_DROP, 0));
  CHECK_EQ_U64(exporter_used(&ex, MiB), MiB);
  stop(&ex);
  iq.slot = 1;
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  REQUIRE(kill(ex.pid, SIGCONT) == 0);
  CHECK_EQ_U64(exporter_used(&ex, 0), MiB);
  ctl mq = {.op = CMD_MAKE, .size = MiB, .seed = 72}, mr;
  int fd2 = -1;
  CHECK_OK(ask_reply(&ex, &mq, -1, &mr, &fd2));
  if (fd2 >= 0)
    close(fd2);
  ctl cq = {.op = CMD_CHECK, .slot = 0, .size = MiB, .seed = 71};
  CHECK_OK(ask(&im, &cq, -1));
  /* Requests stay refused; the release still goes out. */
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  CHECK_OK(ask_slot(&im, CMD_FREE, 0));
  CHECK_EQ_U64(exporter_used(&ex, MiB), MiB);
  CHECK_EQ_INT(child_finish(&im), 0);
  CHECK_EQ_INT(child_finish(&ex), 0);
  close(fd);
}

/* A pointer import that timed out against a stopped exporter gave this
 * process no pointer, so the hold the exporter records once it serves the
 * request late must go back by itself: the exporter's blocks, freed,
 * return to it (they stayed held until the importer's pool went). */
static void test_timed_out_import_holds_nothing(void) {
  child ex, im;
  ctl r0, r1;
  int fd, fd1 = -1;
  if (!exporter_with_block(&ex, MiB, 81, &r0, &fd))
    return;
  ctl q1 = {.op = CMD_MAKE, .size = 2 * MiB, .seed = 82};
  CHECK_OK(ask_reply(&ex, &q1, -1, &r1, &fd1));
  if (fd1 >= 0)
    close(fd1);
  importer_of(&im, fd, 300);
  stop(&ex);
  ctl iq = {.op = CMD_IMPORT, .slot = 0, .size = 2 * MiB, .rec = r1.rec};
  CHECK_ERR(ask(&im, &iq, -1), TP_ERROR_INVALID_VALUE);
  REQUIRE(kill(ex.pid, SIGCONT) == 0);
  CHECK_OK(ask_slot(&ex, CMD_DROP, 0));
  CHECK_OK(ask_slot(&ex, CMD_DROP, 1));
  CHECK_EQ_U64(exporter_used(&ex, 0), 0);
  CHECK_EQ_INT(child_finish(&im), 0);
  CHECK_EQ_INT(child_finish(&ex), 0);
  close(fd);
}

/* Releases the exporter has no room for while it is stopped (more frees
 * than its socket queues) wait, and go once it reads again, with no
 * further call of this process: the frees never waited on the exporter,
 * and none is lost (they were, all of them after the first that could not
 * go out in time). */
enum { NB = 16, NI = 256 };

/* An exporter child with NB blocks of 64 KiB (patterns from `seed`), their
 * records in r[], and this process importing each block NI times into
 * p[][] through `*pool`: more imports than the exporter's socket queues
 * releases for. */
static void import_many(child *ex, uint64_t seed, ctl r[NB], tp_pool_t *pool,
                        void *p[NB][NI]) {
  REQUIRE(spawn(ex, "exporter", NULL) == 0);
  int fd = -1;
  for (int i = 0; i < NB; i++) {
    ctl q = {.op = CMD_MAKE, .size = 64 * KiB, .seed = seed + (uint64_t)i};
    int f = -1;
    CHECK_OK(ask_reply(ex, &q, -1, &r[i], &f));
    if (fd < 0)
      fd = f;
    else if (f >= 0)
      close(f);
  }
  REQUIRE_OK(tp_pool_import_from_shareable_handle(pool, (void *)(uintptr_t)fd,
                                                  TP_HANDLE_POSIX_FD, 0));
  close(fd);
  for (int i = 0; i < NB; i++)
    for (int k = 0; k < NI; k++)
      REQUIRE_OK(tp_pool_import_pointer(&p[i][k], *pool, &r[i].rec));
}

static void test_releases_wait_for_stopped_exporter(void) {
  child ex;
  ctl r[NB];
  tp_stream_t s = NULL;
  tp_pool_t pool = NULL;
  static void *p[NB][NI];
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  import_many(&ex, 90, r, &pool, p);
  for (int i = 0; i < NB; i++)
    CHECK_OK(ask_slot(&ex, CMD_DROP, i));
  CHECK_EQ_U64(exporter_used(&ex, NB * 64 * KiB), NB * 64 * KiB);
  stop(&ex);
  for (int i = 0; i < NB; i++)
    for (int k = 0; k < NI; k++)
      CHECK_OK(tp_free_async(p[i][k], s));
  double t0 = check_now_s();
  CHECK_OK(tp_stream_synchronize(s));
  double took = check_now_s() - t0;
  printf("   %d frees done %.3f s after the synchronize began\n", NB * NI,
         took);
  CHECK(took < 10.0); /* no release waited 30 s for the stopped exporter */
  REQUIRE(kill(ex.pid, SIGCONT) == 0);
  CHECK_EQ_U64(exporter_used(&ex, 0), 0);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_EQ_INT(child_finish(&ex), 0);
}

/* A thread whose import waits for a stopped exporter (for room to send,
 * then for the answer) holds no lock that a free needs: a free of an
 * imported pointer answers at once, and a stream whose only work is such a
 * free's release completes at once ("a release never waits"); they once
 * waited as long as the import, up to its bound. */
typedef struct waiting_import {
  tp_pool_t pool;
  tp_pool_ptr_export_data_t rec;
  tp_error_t err;
} waiting_import;

static void *import_thread(void *arg) {
  waiting_import *w = arg;
  void *p = NULL;
  w->err = tp_pool_import_pointer(&p, w->pool, &w->rec);
  if (w->err == TP_SUCCESS)
    (void)tp_free_async(p, NULL);
  return NULL;
}

static void test_frees_do_not_wait_for_an_import(void) {
  child ex;
  ctl r[NB];
  tp_stream_t s = NULL;
  tp_pool_t pool = NULL;
  static void *p[NB][NI];
  REQUIRE_OK(tp_stream_create(&s, TP_STREAM_NON_BLOCKING));
  import_many(&ex, 120, r, &pool, p);
  for (int i = 2; i < NB; i++)
    CHECK_OK(ask_slot(&ex, CMD_DROP, i));
  stop(&ex);
  /* All but two frees: their releases fill the stopped exporter's socket,
   * so that the import below waits for room to send first. */
  for (int i = 0; i < NB; i++)
    for (int k = 0; k < NI - (i == 0 ? 2 : 0); k++)
      CHECK_OK(tp_free_async(p[i][k], s));
  CHECK_OK(tp_stream_synchronize(s));
  waiting_import w = {.pool = pool, .rec = r[1].rec};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, import_thread, &w) == 0);
  usleep(300 * 1000); /* the import is waiting now */
  double t0 = check_now_s();
  CHECK_OK(tp_free_async(p[0][NI - 1], s));
  CHECK_OK(tp_stream_synchronize(s));
  double release_s = check_now_s() - t0;
  t0 = check_now_s();
  CHECK_OK(tp_free_async(p[0][NI - 2], NULL));
  double free_s = check_now_s() - t0;
  printf("   beside a waiting import: a free %.3f s, a stream's release "
         "%.3f s\n",
         free_s, release_s);
  CHECK(free_s < 1.0);
  CHECK(release_s < 1.0);
  REQUIRE(kill(ex.pid, SIGCONT) == 0);
  REQUIRE(pthread_join(t, NULL) == 0);
  /* The exporter read again well within the import's bound. */
  CHECK_OK(w.err);
  CHECK_OK(tp_device_synchronize());
  CHECK_EQ_U64(exporter_used(&ex, 2 * 64 * KiB), 2 * 64 * KiB);
  CHECK_OK(tp_pool_destroy(pool));
  CHECK_OK(tp_stream_destroy(s));
  CHECK_EQ_INT(child_finish(&ex), 0);
}

int main(int argc, char **argv) {
  int rc = 0;
  if (ipc_child_main(argc, argv, &rc))
    return rc;
  signal(SIGPIPE, SIG_IGN);
  printf("test_ipc_limits on the %s platform\n", tp_platform_name());
  RUN_TEST(test_handle_by_value);
  RUN_TEST(test_channel_limits);
  RUN_TEST(test_channel_total);
  RUN_TEST(test_stopped_exporter);
  RUN_TEST(test_exporter_killed_with_forked_child);
  RUN_TEST(test_slow_exporter_keeps_holds);
  RUN_TEST(test_timed_out_import_holds_nothing);
  RUN_TEST(test_releases_wait_for_stopped_exporter);
  RUN_TEST(test_frees_do_not_wait_for_an_import);
  return check_done();
}
