/* What the stream room's files share and no other room sees: the
 * registry's lookup (stream.c), and the order's legacy bookkeeping, markers
 * and the loss of a stream (order.c), which the registry and events use. */
#ifndef TP_STREAM_INTERNAL_H
#define TP_STREAM_INTERNAL_H

#include "stream/stream.h"

/* Uids that tidepool gave streams the platform could not name. */
#define TP_STREAM_UNNAMED (UINT64_C(1) << 62)

/* ---- stream.c: the registry */
/* The device's legacy stream object, made on first use. */
tp_error_t tp__legacy_get(int device, tp__stream **out);
/* The registered stream with this uid, with a reference, or NULL. */
tp__stream *tp__stream_find_uid(uint64_t uid);

/* ---- order.c */
/* Each device's legacy stream once made (stored by tp__legacy_get). */
extern _Atomic(tp__stream *) tp__legacy_streams[TP_MAX_DEVICES];
/* A field of a device's legacy bookkeeping once no operation is being
 * queued: the number of its last operation the platform took, or
 * (op_epoch) the legacy stream's epoch at that operation. */
uint64_t tp__legacy_settled(int device, bool op_epoch);
/* Records a marker covering everything issued on s so far; stream lock
 * held. NULL where the platform failed or s may no longer be asked. */
tp__marker *tp__stream_marker_record(tp__stream *s);
/* The last marker of a per-thread stream as its thread ends: on the stream
 * itself where the platform still answers for it there, else on its
 * device's legacy stream, else on that legacy stream when next wanted, from
 * another thread. Stream lock held. */
tp__marker *tp__stream_exit_marker(tp__stream *s);
/* Discards s's markers, recorded and spare, as s is freed. */
void tp__stream_markers_free(tp__stream *s);
/* Nothing more is asked of s or recorded on it; stream lock held. */
void tp__stream_lose(tp__stream *s);
/* Whether s may still be asked through its platform stream; one found
 * gone is lost. Stream lock held. */
bool tp__stream_still_named(tp__stream *s);

#endif /* TP_STREAM_INTERNAL_H */
