/* Captures that tidepool saw begin, counted where the platform cannot count
 * them itself (cuda), so that an allocation asks the driver nothing about
 * capture while none is under way. Trusted only where every capture of the
 * process begins through calls that report here (tp__seen_watch). */
#ifndef TP_SEEN_H
#define TP_SEEN_H

#include "common/common.h"

/* Every capture of the process from now on begins through calls that
 * report here: the interposer, which sees every begin, or an application
 * that set TIDEPOOL_CAPTURES=tidepool. Takes effect for the platform
 * chosen after it (read once, as the platform is chosen);
 * TIDEPOOL_CAPTURES=ask overrides it. */
void tp__seen_watch(void);
/* A capture may begin, and a stream be destroyed, unseen from now on (the
 * interposer could not put its hooks in place, `why`): the count stays
 * above zero for good, every allocation asks, and streams of the program's
 * are asked their ids again. */
void tp__seen_unwatch(const char *why);
/* What the calls do now, for a report: whether captures are counted (as
 * decided when the platform was chosen, and not given up since; else every
 * allocation asks), whether streams of the program's are known without
 * asking their ids, and the reason the first tp__seen_unwatch gave (NULL
 * where none came). */
void tp__seen_state(bool *counted, bool *streams_seen, const char **why);
/* The count for the platform's hot line: NULL where captures are not
 * watched, and each allocation must ask. */
const _Atomic uint32_t *tp__seen_counter(void);

/* The capture lock: a begin or an end and its questions of the capture's
 * id (the interposer's, of the application's captures), and tidepool's
 * own work on a capture's graph (the cuda platform's), each hold it, so
 * that none meets a capture that another ends or begins halfway, and none
 * uses a graph that an end frees. Recursive: the runtime's begin and end
 * reach the driver's through the interposer again. Nothing that takes
 * another of tidepool's locks may be called under it. */
void tp__seen_capture_lock(void);
void tp__seen_capture_unlock(void);
/* Whether the calling thread holds it (an outer begin or end: the
 * runtime's around the driver's, or a driver's variant around another). */
bool tp__seen_capture_held(void);

/* A begin about to reach the driver: counted at once, so that a call
 * ordered after the begin finds it. */
void tp__seen_begin(void);
/* The begin's outcome: `ok` with the capture's id (0 where the driver did
 * not tell it: invalidated at once by another thread, or a driver without
 * the question; only an end that answers INVALIDATED takes such a capture
 * out), on the stream keyed `key` (a stream handle, mixed with the thread
 * for a per-thread stream). */
/* `one_stream`: the key names one stream (not the per-thread stream's,
 * which names one in each context of a thread), so that a capture still
 * listed under it is over (the stream began another), taken out, counted
 * no more. */
void tp__seen_began(bool ok, uint64_t key, uint64_t id, bool one_stream);
/* After an end on the stream keyed `key`: `before` the id of its capture
 * as the end began (0 where none or unknown), `after` whether the stream
 * still captures, `invalidated` whether the end answered that its capture
 * had been invalidated (the driver then tells no id). A capture stops
 * counting once the stream that began it is out of it (an end on a stream
 * that joined it leaves it counted). Returns the id of the capture taken
 * out, 0 for none: the one listed with `before`, or for an invalidated
 * capture the only one listed under `key` (none where two are: the
 * per-thread stream's key is the same in every context of a thread). */
uint64_t tp__seen_ended(uint64_t key, uint64_t before, bool after,
                        bool invalidated);

/* ---- streams of others ------------------------------------------------------
 * A stream tidepool did not make is told from a new one that took its
 * handle by asking the driver its id on every call, unless every stream
 * destruction of the process passes through calls that report here (the
 * interposer: stream destroys, and the context destroys and resets that
 * take streams with them). Each such call moves the generation before and
 * after the destruction: a stream found while the generation stays the same
 * is the one it was. */

/* Stream destructions are seen from now on (the interposer); read once, as
 * the platform is chosen. */
void tp__seen_watch_streams(void);
/* Whether they are (false under TIDEPOOL_CAPTURES=ask), for the platform's
 * hot line; the generation is the hot line's stream_gen, which tidepool's
 * own destructions move too. */
bool tp__seen_streams_watched(void);
/* Around a destruction that may end streams: before and after it. */
void tp__seen_streams_change(void);

#endif /* TP_SEEN_H */
