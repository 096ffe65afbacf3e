/* Gates for the lag model (lag.c): points on a stream that hold it until the
 * host opens them and that tell the host when the stream has reached them.
 * Two kinds: host functions that wait on a condition variable (the host
 * platform, where each stream has a thread of its own) and stream memory
 * operations that wait on a word of host memory the device polls (cuda,
 * where the driver may run the host functions of every stream on one
 * thread, so that one held stream would hold them all). */
#ifndef TP_REPLAY_GATES_H
#define TP_REPLAY_GATES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tidepool.h"

/* What the memory-operation gates need of a platform: streams that write a
 * 32-bit word of host memory, or wait until it reaches a value, in stream
 * order. Values compare cyclically: a word has reached v when
 * (int32_t)(word - v) >= 0, as cuStreamWaitValue32's GEQ compares. */
typedef struct gate_memops {
  const char *name;
  /* n zeroed words the streams can reach, valid until release; *ctx is
   * handed to the other functions. */
  int (*alloc)(void **ctx, _Atomic uint32_t **words, size_t n, char *err,
               size_t len);
  void (*release)(void *ctx, _Atomic uint32_t *words);
  /* Queues on s: once everything before it has run, *word = value, made
   * visible after that work's own effects. */
  int (*write)(void *ctx, tp_stream_t s, _Atomic uint32_t *word, uint32_t value,
               char *err, size_t len);
  /* Queues on s: the stream waits here until *word has reached value. */
  int (*wait)(void *ctx, tp_stream_t s, _Atomic uint32_t *word, uint32_t value,
              char *err, size_t len);
  /* The host has changed a word; NULL where the streams poll. */
  void (*changed)(void *ctx);
} gate_memops;

/* The CUDA driver's: cuStreamWriteValue32 and cuStreamWaitValue32 on
 * memory of cuMemHostAlloc mapped for the device, in device 0's primary
 * context (the one tidepool's cuda platform and the replay's streams use).
 * Streams that share a hardware queue (more of them than
 * CUDA_DEVICE_MAX_CONNECTIONS, 8 by default) would hold each other's work
 * behind a wait; bench/gpu_replay.sh allows 32. */
extern const gate_memops gate_memops_cuda;

typedef struct gates gates;

/* What gates_reached and gates_stop answer when a stream did not get there
 * in time (their other failures are -1 with a message). */
#define GATES_STALLED 1

/* Gates on n streams: host functions where memops is NULL (host platform
 * only), else memory operations. */
int gates_start(gates **out, const tp_stream_t *streams, uint16_t n,
                const gate_memops *memops, char *err, size_t len);
/* Queues a closed gate at the end of stream s. The gates of a stream are
 * numbered from 1 in the order they are pushed; *seq is this one's. */
int gates_push(gates *g, uint16_t s, uint64_t *seq, char *err, size_t len);
/* Opens the gates of stream s up to number seq (gates open in order). */
void gates_open(gates *g, uint16_t s, uint64_t seq);
/* Waits until stream s has reached its gate seq, that is until everything
 * queued on it before that gate has run: 0, or GATES_STALLED after
 * `seconds`. */
int gates_reached(gates *g, uint16_t s, uint64_t seq, int seconds);
/* Opens every gate, waits until every stream has run past its last one,
 * and frees g: 0; GATES_STALLED (*stuck: which stream) after `seconds`,
 * or -1 with a message, when g stays allocated, since its gates may still
 * run. */
int gates_stop(gates *g, int seconds, uint16_t *stuck, char *err, size_t len);

#endif /* TP_REPLAY_GATES_H */
