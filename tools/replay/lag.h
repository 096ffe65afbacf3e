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

/* The lag of the replay when --lag is not given. One named place, since the
 * default is chosen from measurements of live runs (bench/RESULTS.md). */
#define REPLAY_DEFAULT_LAG 0u

typedef struct lag_model lag_model;

/* A model over the replay's streams (streams[0] may be NULL, the legacy
 * stream), any number of them, on either platform. On the host platform
 * the gates are host functions, on cuda stream memory operations (no
 * driver thread is held, so held streams never hold each other).
 *
 * `precise`: the host platform's hooks tell whether an operation of the
 * pool queued work on a stream. Without them (cuda, and the driver's pool)
 * the model assumes that every operation may have queued or recorded work
 * on every stream and that every allocation on one of several streams may
 * have queued a wait on the others: it waits for every stream at every
 * gate it opens and holds each operation's work behind a gate of its own,
 * so that the completions stay as deterministic, at more round trips. The
 * completions are those of the precise model but where an allocation that
 * queued no wait records work on its own stream that the pool later polls
 * (the conservative model then holds that work as long as any stream's);
 * test_replay_lag checks that both give the same figures. */
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
 * `memops` (a struct gate_memops of gates.h) with the conservative model,
 * as on cuda, whatever the platform and `precise`; NULL restores the
 * platform's own. Not thread-safe. */
struct gate_memops;
void lag_testing_memops(const struct gate_memops *memops);

#endif /* TP_REPLAY_LAG_H */
