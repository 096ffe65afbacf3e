/* test_ipc_wire: an importer facing a lying exporter. A thread of this
 * program plays the exporter's side of the protocol (src/ipc/wire.h) by
 * hand and answers with descriptions no tidepool exporter would give: a
 * range of 2^62 bytes, impossible chunk sizes, unknown statuses, chunk
 * places past the range, replies out of step. Each must be refused with a
 * clear error, before the importer allocates or maps anything by it. */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "ipc/wire.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define FAKE_PID 4242u
#define FAKE_SERIAL 77u

/* What the fake exporter says. */
typedef struct script {
  tp__wire hello;    /* the answer to CONNECT */
  bool backing;      /* send a memfd with it (the host platform needs one) */
  uint64_t file;     /* that memfd's size */
  tp__wire imported; /* the answer to every IMPORT (op 0: echo the record) */
  tp__wire chunk;    /* the answer to every CHUNK */
} script;

/* The script and the count are shared with the test's thread, which
 * changes the script between imports: under `mu`. */
typedef struct fake {
  int rv; /* the exporter's end of the rendezvous */
  pthread_mutex_t mu;
  script sc;
  int requests; /* IMPORT and CHUNK requests seen */
} fake;

static tp__wire good_hello(void) {
  tp__wire h = tp__wire_make(TP_OP_HELLO);
  h.status = TP_SUCCESS;
  h.loc_type = TP_LOCATION_DEVICE;
  h.loc_id = 0;
  h.alloc_type = TP_ALLOCATION_PINNED;
  h.pid = FAKE_PID;
  h.serial = FAKE_SERIAL;
  h.gran = 2 * MiB;
  h.va_size = GiB;
  h.max_size = 0;
  /* data, the device's uuid, stays zero: no device of this process. */
  return h;
}

/* Serves one importer: its CONNECT, then its requests until it goes. */
static void *fake_run(void *arg) {
  fake *f = arg;
  tp__wire q;
  int chan = -1;
  uint64_t deadline = tp__ipc_deadline();
  if (tp__wire_recv(f->rv, &q, &chan, NULL, NULL, deadline) != TP_RECV_OK ||
      chan < 0) {
    CHECK_FAIL("the fake exporter got no CONNECT");
    return NULL;
  }
  int backing = -1;
  if (f->sc.backing) {
    backing = memfd_create("fake-exporter", MFD_CLOEXEC);
    if (backing < 0 || ftruncate(backing, (off_t)f->sc.file) != 0)
      CHECK_FAIL("memfd: %s", strerror(errno));
  }
  CHECK_OK(tp__wire_send(chan, &f->sc.hello, backing, false, deadline));
  if (backing >= 0)
    close(backing);
  for (;;) {
    int got = -1;
    tp__recv_result r = tp__wire_recv(chan, &q, &got, NULL, NULL, deadline);
    if (got >= 0)
      close(got);
    if (r != TP_RECV_OK)
      break; /* the importer closed the channel (or fell silent) */
    tp__wire a;
    pthread_mutex_lock(&f->mu);
    if (q.op == TP_OP_RELEASE) {
      pthread_mutex_unlock(&f->mu);
      continue; /* no answer */
    }
    if (q.op == TP_OP_IMPORT) {
      a = f->sc.imported;
      if (a.op == 0) {
        tp__ipc_record rec;
        memcpy(&rec, q.data, sizeof rec);
        a = tp__wire_make(TP_OP_IMPORTED);
        a.offset = rec.offset;
        a.size = rec.size;
      }
    } else {
      a = f->sc.chunk;
    }
    f->requests++;
    pthread_mutex_unlock(&f->mu);
    if (tp__wire_send(chan, &a, -1, false, deadline) != TP_SUCCESS)
      break;
  }
  close(chan);
  return NULL;
}

/* Imports a pool from a fake exporter following `sc`; returns what the
 * import answered, with the pool in *out (destroyed by the caller). */
static tp_error_t import_from(const script *sc, fake *f, pthread_t *t,
                              tp_pool_t *out) {
  int sv[2];
  if (!CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0))
    return TP_ERROR_NOT_READY;
  int one = 1;
  CHECK(setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == 0);
  *f = (fake){.rv = sv[0], .sc = *sc};
  pthread_mutex_init(&f->mu, NULL);
  if (!CHECK(pthread_create(t, NULL, fake_run, f) == 0))
    return TP_ERROR_NOT_READY;
  *out = NULL;
  tp_error_t err = tp_pool_import_from_shareable_handle(
      out, (void *)(uintptr_t)sv[1], TP_HANDLE_POSIX_FD, 0);
  close(sv[1]);
  return err;
}

static void finish(fake *f, pthread_t t, tp_pool_t pool) {
  if (pool)
    CHECK_OK(tp_pool_destroy(pool));
  pthread_join(t, NULL);
  pthread_mutex_destroy(&f->mu);
  close(f->rv);
}

/* Expects the import of a pool described by `h` to fail with `want`,
 * having reserved nothing. */
static void expect_refused(const char *what, tp__wire h, tp_error_t want) {
  check_context(what);
  script sc = {.hello = h, .backing = check_on_host(), .file = 4 * MiB};
  fake f;
  pthread_t t;
  tp_pool_t pool = NULL;
  CHECK_ERR(import_from(&sc, &f, &t, &pool), want);
  CHECK(pool == NULL);
  finish(&f, t, pool);
  check_context(NULL);
}

static void test_lying_hello(void) {
  tp__wire h = good_hello();
  h.va_size = (uint64_t)1 << 62;
  expect_refused("a range of 2^62 bytes", h, TP_ERROR_INVALID_VALUE);
  h.va_size = TP_IPC_VA_MAX + GiB;
  expect_refused("a range past the address space", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.va_size = GiB + MiB;
  expect_refused("a range of no whole gigabytes", h, TP_ERROR_INVALID_VALUE);
  h.va_size = 0;
  expect_refused("an empty range", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.gran = (uint64_t)1 << 62;
  expect_refused("a chunk of 2^62 bytes", h, TP_ERROR_INVALID_VALUE);
  h.gran = 3 * MiB;
  expect_refused("a chunk of 3 MiB", h, TP_ERROR_INVALID_VALUE);
  h.gran = 0;
  expect_refused("a chunk of 0 bytes", h, TP_ERROR_INVALID_VALUE);
  h.gran = MiB; /* possible, just not this platform's */
  expect_refused("a chunk of another size", h, TP_ERROR_NOT_SUPPORTED);
  h = good_hello();
  h.max_size = 2 * GiB;
  expect_refused("a limit past the range", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.alloc_type = 99;
  expect_refused("an unknown allocation type", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.loc_type = 99;
  expect_refused("an unknown location", h, TP_ERROR_INVALID_VALUE);
  h.loc_type = TP_LOCATION_HOST_NUMA;
  h.loc_id = -5;
  expect_refused("a negative NUMA node", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.status = 123456;
  expect_refused("a status that is no error", h, TP_ERROR_INVALID_VALUE);
  h.status = TP_ERROR_NOT_PERMITTED;
  expect_refused("a refusal", h, TP_ERROR_NOT_PERMITTED);
  /* Errors the import does not document are no exporter's answer. */
  h.status = TP_ERROR_ILLEGAL_ADDRESS;
  expect_refused("an error no import answers", h, TP_ERROR_INVALID_VALUE);
  h.status = TP_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  expect_refused("a capture's error", h, TP_ERROR_INVALID_VALUE);
  h = good_hello();
  h.op = TP_OP_CHUNK_INFO;
  expect_refused("another message", h, TP_ERROR_INVALID_VALUE);
}

/* A pool the fake describes truthfully imports; then its replies lie. */
static void test_lying_replies(void) {
  script sc = {.hello = good_hello(), .backing = check_on_host()};
  /* A sparse backing far larger than the range: a chunk place inside the
   * file but past the range must still be refused. */
  sc.file = (uint64_t)1 << 52;
  sc.chunk = tp__wire_make(TP_OP_CHUNK_INFO);
  sc.chunk.offset = (uint64_t)1 << 51;
  fake f;
  pthread_t t;
  tp_pool_t pool = NULL;
  tp_error_t err = import_from(&sc, &f, &t, &pool);
  if (err == TP_ERROR_NOT_SUPPORTED || err == TP_ERROR_OUT_OF_MEMORY) {
    printf("   skipped: this platform cannot import the fake pool (%s)\n",
           tp_error_name(err));
    finish(&f, t, pool);
    return;
  }
  if (!CHECK_OK(err) || !pool) {
    finish(&f, t, pool);
    return;
  }
  uint64_t reserved = 1;
  CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                 &reserved));
  CHECK_EQ_U64(reserved, 0);
  tp__ipc_record rec = {.magic = TP_RECORD_MAGIC,
                        .version = TP_RECORD_VERSION,
                        .pid = FAKE_PID,
                        .serial = FAKE_SERIAL,
                        .offset = 0,
                        .size = 4096};
  tp_pool_ptr_export_data_t data;
  memcpy(&data, &rec, sizeof data);
  void *p = NULL;
  check_context("a chunk placed past the range");
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  CHECK(p == NULL);
  CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                 &reserved));
  CHECK_EQ_U64(reserved, 0);
  check_context("a chunk place off the chunk size");
  pthread_mutex_lock(&f.mu);
  f.sc.chunk.offset = 4096;
  pthread_mutex_unlock(&f.mu);
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  check_context("an import answered with a status that is no error");
  pthread_mutex_lock(&f.mu);
  f.sc.imported = tp__wire_make(TP_OP_IMPORTED);
  f.sc.imported.status = -7;
  pthread_mutex_unlock(&f.mu);
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  check_context("an import answered with an error it does not document");
  static const tp_error_t odd[] = {TP_ERROR_NOT_READY,
                                   TP_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                                   TP_ERROR_NOT_PERMITTED};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    pthread_mutex_lock(&f.mu);
    f.sc.imported.status = odd[i];
    pthread_mutex_unlock(&f.mu);
    CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  }
  check_context("an import answered for another allocation");
  pthread_mutex_lock(&f.mu);
  f.sc.imported.status = TP_SUCCESS;
  f.sc.imported.offset = 2 * MiB;
  f.sc.imported.size = 4096;
  pthread_mutex_unlock(&f.mu);
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  check_context("an import answered out of step");
  pthread_mutex_lock(&f.mu);
  int seen = f.requests;
  f.sc.imported = tp__wire_make(TP_OP_CHUNK_INFO);
  pthread_mutex_unlock(&f.mu);
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  /* After a reply out of step nothing more is trusted: the channel is
   * closed, and later imports fail without asking. */
  CHECK_ERR(tp_pool_import_pointer(&p, pool, &data), TP_ERROR_INVALID_VALUE);
  pthread_mutex_lock(&f.mu);
  CHECK(f.requests <= seen + 1);
  pthread_mutex_unlock(&f.mu);
  check_context(NULL);
  CHECK_OK(tp_pool_get_attribute(pool, TP_POOL_ATTR_RESERVED_MEM_CURRENT,
                                 &reserved));
  CHECK_EQ_U64(reserved, 0);
  finish(&f, t, pool);
}

int main(void) {
  printf("test_ipc_wire on the %s platform\n", tp_platform_name());
  RUN_TEST(test_lying_hello);
  RUN_TEST(test_lying_replies);
  return check_done();
}
