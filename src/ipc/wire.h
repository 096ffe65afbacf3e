/* The protocol between an exporting and an importing process, private to
 * src/ipc/: the messages, the 64-byte export record, the limits every side
 * applies to what it reads, and the transport (wire.c) that moves messages
 * with a descriptor and credentials over Unix sockets, never waiting on a
 * peer past a deadline.
 *
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
 * every message is one tp__wire:
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
 * in its holds (see import.c and channel.c). Chunks that no importer maps are
 * the exporter's to trim as it likes.
 *
 * Neither side trusts the other's numbers: every size, index, status and
 * location read from the wire is checked against the limits below before it
 * sizes an allocation, indexes a table or reaches the caller. */
#ifndef TP_IPC_WIRE_H
#define TP_IPC_WIRE_H

#include <string.h>
#include <sys/socket.h>

#include "pool/pool.h"

#define TP_WIRE_MAGIC 0x70697074u /* "tpip" */
#define TP_WIRE_VERSION 1
enum {
  TP_OP_CONNECT = 1,
  TP_OP_HELLO,
  TP_OP_IMPORT,
  TP_OP_IMPORTED,
  TP_OP_CHUNK,
  TP_OP_CHUNK_INFO,
  TP_OP_RELEASE
};

typedef struct tp__wire {
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
} tp__wire;
_Static_assert(sizeof(tp__wire) == 144, "a wire message has no padding");

/* The 64 bytes of an exported pointer: which process and pool, where in the
 * pool, how large, the nonce of that export, and a check word keyed with
 * the pool's secret, so that a corrupted or forged record is refused. */
typedef struct tp__ipc_record {
  uint32_t magic;
  uint32_t version;
  uint64_t pid;
  uint64_t serial;
  uint64_t offset;
  uint64_t size;
  uint64_t nonce;
  uint64_t reserved;
  uint64_t check;
} tp__ipc_record;
_Static_assert(sizeof(tp__ipc_record) == sizeof(tp_pool_ptr_export_data_t),
               "an export record fills the driver's 64 bytes");
#define TP_RECORD_MAGIC 0x31787074u /* "tpx1" */
#define TP_RECORD_VERSION 2

/* ---- limits ----------------------------------------------------------------
 * What one exporting process serves: channels per importing process and per
 * pool, channels over all its pools, and descriptors it keeps free for its
 * own use (a channel costs the exporter one). A CONNECT beyond any of them
 * is answered NOT_PERMITTED and its channel closed at once. */
#define TP_IPC_CHANNELS_PER_IMPORTER 64
#define TP_IPC_CHANNELS_MAX 1024
#define TP_IPC_FD_RESERVE 64
/* Messages served from one channel or rendezvous before the service thread
 * turns to the others, so that one busy peer cannot starve the rest. */
#define TP_IPC_BATCH 32
/* How long a process waits for its peer: the exporter's answer to a CONNECT
 * or a request, room to send one. TIDEPOOL_IPC_TIMEOUT_MS overrides it. */
#define TP_IPC_TIMEOUT_MS 30000
/* The largest virtual range a pool can have: the whole of a 47-bit user
 * address space. A HELLO naming a larger one is refused before anything is
 * sized by it. */
#define TP_IPC_VA_MAX (UINT64_C(1) << 47)

/* ---- records ------------------------------------------------------------- */

/* The check word of a record: covers every byte before it, keyed. */
uint64_t tp__ipc_record_check(const tp__ipc_record *r, uint64_t key);

/* Whether a record is well formed for a pool of `va_size` bytes: magic,
 * version, a granule-aligned non-empty allocation inside the range. */
bool tp__ipc_record_sane(const tp__ipc_record *r, uint64_t va_size);

/* ---- transport ------------------------------------------------------------
 */

static inline tp__wire tp__wire_make(uint16_t op) {
  tp__wire w;
  memset(&w, 0, sizeof w);
  w.magic = TP_WIRE_MAGIC;
  w.version = TP_WIRE_VERSION;
  w.op = op;
  return w;
}

/* A point in time (CLOCK_MONOTONIC, milliseconds) the timeout from now. */
uint64_t tp__ipc_deadline(void);

/* Waits for `events` (POLLIN, POLLOUT) on sock until the deadline (ms of
 * CLOCK_MONOTONIC, tp__ipc_deadline). 1: ready, 0: the deadline passed, -1:
 * poll failed (errno). */
int tp__wire_wait(int sock, short events, uint64_t deadline);
/* Sends one message with, optionally, one descriptor (fd >= 0, which stays
 * the caller's) and this process's credentials. Waits for room until
 * `deadline`, or not at all when it is 0. A peer that is gone, or does not
 * make room in time, is INVALID_VALUE: the pool it stood for is gone too;
 * with `deadline` 0, a full socket leaves errno EAGAIN (or EWOULDBLOCK). */
tp_error_t tp__wire_send(int sock, const tp__wire *w, int fd, bool creds,
                         uint64_t deadline);

typedef enum tp__recv_result {
  TP_RECV_OK,
  TP_RECV_AGAIN, /* nothing queued, or nothing before the deadline */
  TP_RECV_EOF,   /* no bytes: the peer is gone, or sent an empty message */
  TP_RECV_BAD,   /* not one of our messages; anything it carried is closed */
  TP_RECV_ERROR, /* the system call failed; errno says why */
  /* One of our messages, whole, but the descriptor it carried found no
   * room in this process (its descriptor table full): the kernel dropped
   * it. The conversation is still in step; the message is in *w. */
  TP_RECV_NOFD
} tp__recv_result;

/* Receives one message with at most one descriptor (*fd, else -1) and, on
 * a socket that passes them, the sender's credentials (*has_cred). Waits
 * for one until `deadline`, or not at all when it is 0. */
tp__recv_result tp__wire_recv(int sock, tp__wire *w, int *fd,
                              struct ucred *cred, bool *has_cred,
                              uint64_t deadline);

/* A status read from the wire as the error the importer's caller gets:
 * only those its entry point documents pass (NOT_PERMITTED and
 * NOT_SUPPORTED only in a HELLO), any other value is INVALID_VALUE (an
 * answer no exporter would give), and the exporter's PLATFORM says so in
 * the thread's platform detail. */
tp_error_t tp__wire_status(int32_t status, bool hello);

/* ---- descriptors a forked child closes ------------------------------------
 * A child that fork() makes holds a copy of every descriptor, though it may
 * make no call of tidepool's: a copy of a channel or a rendezvous would only
 * keep the peer from seeing this process go (an exporter kept a killed
 * importer's holds until the importer's forked helper exited). The sockets
 * that tie this process to another are therefore kept in a set that a
 * fork handler closes in the child. Where memory is short, a descriptor is
 * left out of the set: it works as before, and only a forked child keeps
 * its copy. */

/* Brackets the making (or receiving) of such descriptors and their
 * tp__ipc_fd_keep: a fork waits for the step to end, so that no child
 * copies a descriptor made but not kept yet. Short: nothing that waits on
 * a peer goes inside. */
void tp__ipc_fd_begin(void);
void tp__ipc_fd_end(void);
/* Adds `fd` (>= 0) to the set; inside tp__ipc_fd_begin/end. */
void tp__ipc_fd_keep(int fd);
/* Takes `fd` out of the set, if it is there, and closes it, as one step
 * that a fork waits for. */
void tp__ipc_fd_close(int fd);
/* A SOCK_SEQPACKET socketpair, close-on-exec, made and kept in the set as
 * one step: sv[0], and sv[1] too where `both` (where not, sv[1] is to
 * leave the process, and closing it is the caller's with close()).
 * Errors: PLATFORM. */
tp_error_t tp__ipc_socketpair(int sv[2], bool both);

#endif /* TP_IPC_WIRE_H */
