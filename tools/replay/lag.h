/* The replay's model of a device that runs behind the host: work queued on a
 * replay stream completes only once the replay has issued `lag` further
 * operations. Each stream is held by gates (gates.h); the replay opens them
 * as it goes and waits until the stream has actually passed them, so that
 * when the pool learns of a completion never depends on thread timing. */
#ifndef TP_REPLAY_LAG_H
#define TP_REPLAY_LAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tidepool.h"

/* The lag of the replay when --lag is not given, chosen from live runs on
 * an H200 (bench/RESULTS.md, "Calibrating the lag"): a stream of a PyTorch
 * training run was 15 operations behind the host on average (median 1,
 * p90 29 to 50), and replays at lags from 1 to 256 matched the live peak
 * reserved of three models within 0.75%. */
#define REPLAY_DEFAULT_LAG 16u

typedef struct lag_model lag_model;

/* A model over the replay's streams (streams[0] may be NULL, the legacy
 * stream), any number of them, on either platform. On the host platform
 * the gates are host functions, on cuda stream memory operations (no
 * driver thread is held, so held streams never hold each other).
 *
 * With several streams, each operation's work on each stream lies behind
 * a gate of its own, so that holding an allocation's stream wait (until
 * every stream's earlier work is due, the wait never blocking a stream the
 * replay waits on) holds back nothing that another stream's wait counts
 * on.
 *
 * `precise`: the host platform's hooks tell whether an operation of the
 * pool queued work on a stream. Without them (cuda, and the driver's pool,
 * whose work is out of sight) the model is conservative: it assumes that
 * every operation may have queued or recorded work on every stream, and
 * that every allocation on one of several streams may have queued a wait
 * on its own stream, so it waits for every stream at every gate it opens
 * (more round trips, as deterministic) and holds every such allocation's
 * work. On one stream the completions are the precise model's. On
 * several, an allocation's own work is held longer where it queued no
 * wait; the figures differ where that work is something the pool polls
 * later (tidepool records a free's marker lazily, when an operation first
 * asks whether the free is done). test_replay_lag checks both. */
int lag_start(lag_model **out, unsigned lag, tp_stream_t *streams,
              uint16_t nstreams, bool precise, char *err, size_t errlen);
/* Before the replay issues its operation k (counting from 0): opens the
 * gates that are due and waits until their streams have passed them. */
int lag_before(lag_model *m, uint64_t k, char *err, size_t errlen);
/* After operation k on stream s: holds the work it stands for. */
int lag_after(lag_model *m, uint64_t k, uint16_t s, bool alloc, char *err,
              size_t errlen);
/* Opens every gate, waits until every stream has passed them, and frees the
 * model. Call before the streams are destroyed. NULL is a no-op. */
int lag_stop(lag_model *m, char *err, size_t errlen);

/* For tests: from now on lag_start builds memory-operation gates over
 * `memops` (a struct gate_memops of gates.h; NULL: host functions), with
 * the conservative model where `conservative`, whatever the platform;
 * (NULL, false) restores the platform's own. Not thread-safe. */
struct gate_memops;
void lag_testing(const struct gate_memops *memops, bool conservative);

#endif /* TP_REPLAY_LAG_H */
