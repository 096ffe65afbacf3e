/* The replay's model of a device that runs behind the host: work queued on a
 * replay stream completes only once the replay has issued `lag` further
 * operations. Each stream is held by gates (host functions that wait on a
 * flag); the replay opens them as it goes and waits until the stream has
 * actually passed them, so that when the pool learns of a completion never
 * depends on thread timing. */
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
 * stream). `precise`: the host platform's hooks tell which stream an
 * operation of the pool queued work on; without them (cuda) every gate is
 * assumed to matter, which is slower but as deterministic, and only one
 * stream is supported (the driver runs host functions of all streams on one
 * thread, so a held stream would hold the others). */
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

#endif /* TP_REPLAY_LAG_H */
