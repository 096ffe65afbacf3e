/* example_ipc_producer_consumer: a producer process fills blocks of a
 * shareable pool on its stream and hands them to a consumer process, which
 * maps the same bytes, reads them on its own stream and frees them there.
 * The pool's descriptor travels over a Unix socket (SCM_RIGHTS), each block
 * as 64 bytes of export record. Runs on any platform. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tidepool.h"

#define BLOCKS 4
#define BLOCK_SIZE ((size_t)3 << 20)

/* What travels between the two for each block. */
typedef struct message {
  int index;
  size_t size;
  tp_pool_ptr_export_data_t record;
} message;

static int ok(tp_error_t rc, const char *who, const char *what) {
  if (rc != TP_SUCCESS)
    fprintf(stderr, "%s: %s failed: %s\n", who, what, tp_error_name(rc));
  return rc == TP_SUCCESS;
}

/* Sends a message, with a descriptor when fd >= 0. */
static int send_msg(int sock, const message *m, int fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)m, sizeof *m};
  struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    h.msg_control = u.buf;
    h.msg_controllen = sizeof u.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  return sendmsg(sock, &h, 0) == (ssize_t)sizeof *m;
}

/* Receives a message, and the descriptor that came with it (or -1). */
static int recv_msg(int sock, message *m, int *fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } u;
  struct iovec iov = {m, sizeof *m};
  struct msghdr h = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = u.buf,
                     .msg_controllen = sizeof u.buf};
  *fd = -1;
  if (recvmsg(sock, &h, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof *m)
    return 0;
  struct cmsghdr *c = CMSG_FIRSTHDR(&h);
  if (c && c->cmsg_type == SCM_RIGHTS)
    memcpy(fd, CMSG_DATA(c), sizeof *fd);
  return 1;
}

static int producer(int sock) {
  const char *me = "producer";
  tp_pool_props_t props;
  memset(&props, 0, sizeof props);
  props.alloc_type = TP_ALLOCATION_PINNED;
  props.location = (tp_location_t){TP_LOCATION_DEVICE, 0, 0};
  props.handle_types = TP_HANDLE_POSIX_FD;
  tp_pool_t pool = NULL;
  tp_stream_t s = NULL;
  tp_event_t filled = NULL;
  int fd = -1;
  if (!ok(tp_pool_create(&pool, &props), me, "tp_pool_create") ||
      !ok(tp_stream_create(&s, TP_STREAM_NON_BLOCKING), me,
          "tp_stream_create") ||
      !ok(tp_event_create(&filled), me, "tp_event_create") ||
      !ok(tp_pool_export_to_shareable_handle(&fd, pool, TP_HANDLE_POSIX_FD, 0),
          me, "tp_pool_export_to_shareable_handle"))
    return 1;
  message m = {.index = -1};
  if (!send_msg(sock, &m, fd))
    return 1;
  close(fd); /* the consumer has its own copy now */
  printf("%s: %s platform, pool exported\n", me, tp_platform_name());

  void *block[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    /* Allocate and fill in stream order; the record goes out only once
     * the fill has completed: imported memory must not be touched before
     * the exporter's allocation (and here, its contents) are done. */
    if (!ok(tp_malloc_from_pool_async(&block[i], BLOCK_SIZE, pool, s), me,
            "tp_malloc_from_pool_async") ||
        !ok(tp_memset_async(block[i], 'A' + i, BLOCK_SIZE, s), me,
            "tp_memset_async") ||
        !ok(tp_event_record(filled, s), me, "tp_event_record") ||
        !ok(tp_event_synchronize(filled), me, "tp_event_synchronize"))
      return 1;
    m = (message){.index = i, .size = BLOCK_SIZE};
    if (!ok(tp_pool_export_pointer(&m.record, block[i]), me,
            "tp_pool_export_pointer") ||
        !send_msg(sock, &m, -1))
      return 1;
    printf("%s: block %d filled with '%c', sent\n", me, i, 'A' + i);
  }
  /* The consumer answers once its own free of a block has completed; the
   * producer frees after it, as the rules ask. (Freeing earlier would be
   * safe with tidepool: a block a consumer holds is not reused.) */
  for (int n = 0; n < BLOCKS; n++) {
    if (!recv_msg(sock, &m, &fd) || m.index < 0 || m.index >= BLOCKS)
      return 1;
    if (!ok(tp_free_async(block[m.index], s), me, "tp_free_async"))
      return 1;
  }
  uint64_t used = 1;
  if (!ok(tp_stream_synchronize(s), me, "tp_stream_synchronize") ||
      !ok(tp_pool_get_attribute(pool, TP_POOL_ATTR_USED_MEM_CURRENT, &used), me,
          "tp_pool_get_attribute"))
    return 1;
  printf("%s: every block back, %llu bytes in use\n", me,
         (unsigned long long)used);
  if (!ok(tp_event_destroy(filled), me, "tp_event_destroy") ||
      !ok(tp_stream_destroy(s), me, "tp_stream_destroy") ||
      !ok(tp_pool_destroy(pool), me, "tp_pool_destroy"))
    return 1;
  return used == 0 ? 0 : 1;
}

static int consumer(int sock) {
  const char *me = "consumer";
  message m;
  int fd = -1;
  tp_pool_t pool = NULL;
  tp_stream_t s = NULL;
  if (!recv_msg(sock, &m, &fd) || fd < 0 ||
      !ok(tp_pool_import_from_shareable_handle(&pool, (void *)(uintptr_t)fd,
                                               TP_HANDLE_POSIX_FD, 0),
          me, "tp_pool_import_from_shareable_handle") ||
      !ok(tp_stream_create(&s, TP_STREAM_NON_BLOCKING), me, "tp_stream_create"))
    return 1;
  close(fd);
  unsigned char *host = malloc(BLOCK_SIZE);
  if (!host)
    return 1;
  int bad = 0;
  for (int n = 0; n < BLOCKS; n++) {
    void *p = NULL;
    if (!recv_msg(sock, &m, &fd) ||
        !ok(tp_pool_import_pointer(&p, pool, &m.record), me,
            "tp_pool_import_pointer"))
      return 1;
    /* Read the producer's bytes, then free in stream order behind the
     * read: the consumer's hold goes when its stream gets there. */
    if (!ok(tp_memcpy_async(host, p, m.size, s), me, "tp_memcpy_async") ||
        !ok(tp_free_async(p, s), me, "tp_free_async") ||
        !ok(tp_stream_synchronize(s), me, "tp_stream_synchronize"))
      return 1;
    size_t wrong = 0;
    for (size_t i = 0; i < m.size; i++)
      wrong += host[i] != (unsigned char)('A' + m.index);
    printf("%s: block %d at %p reads '%c' x %zu%s\n", me, m.index, p, host[0],
           m.size, wrong ? ", WRONG BYTES" : "");
    bad += wrong != 0;
    if (!send_msg(sock, &m, -1))
      return 1;
  }
  free(host);
  if (!ok(tp_stream_destroy(s), me, "tp_stream_destroy") ||
      !ok(tp_pool_destroy(pool), me, "tp_pool_destroy"))
    return 1;
  return bad ? 1 : 0;
}

int main(void) {
  /* The two processes part before either calls tidepool, so the consumer
   * starts clean without an exec. Lines go out whole, in time order. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    perror("socketpair");
    return 1;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    close(sv[0]);
    int rc = consumer(sv[1]);
    fflush(stdout);
    return rc;
  }
  close(sv[1]);
  int rc = producer(sv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  int consumer_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%s\n", rc == 0 && consumer_ok ? "both sides done" : "FAILED");
  return rc == 0 && consumer_ok ? 0 : 1;
}
