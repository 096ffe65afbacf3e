/* What stream.c shares with event.c only: the legacy stream's bookkeeping
 * that an event record reads, and the registry's lookup by uid. */
#ifndef TP_STREAM_INTERNAL_H
#define TP_STREAM_INTERNAL_H

#include "stream/stream.h"

/* The device's legacy stream object, made on first use. */
tp_error_t tp__legacy_get(int device, tp__stream **out);
/* A field of a device's legacy bookkeeping once no operation is being
 * queued: the number of its last operation the platform took, or
 * (op_epoch) the legacy stream's epoch at that operation. */
uint64_t tp__legacy_settled(int device, bool op_epoch);
/* The registered stream with this uid, with a reference, or NULL. */
tp__stream *tp__stream_find_uid(uint64_t uid);

#endif /* TP_STREAM_INTERNAL_H */
