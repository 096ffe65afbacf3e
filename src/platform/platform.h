/* The platform boundary: the one ops table through which the core and the
 * API layer reach the machine (the emulated device on host, the driver API on
 * cuda). Platform code reserves, maps, records, queries and waits; it holds no
 * allocation policy. Each op states its contract here. */
#ifndef TP_PLATFORM_H
#define TP_PLATFORM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hot.h"
#include "tidepool.h"

typedef struct tp__pstream tp__pstream; /* a platform stream */
typedef struct tp__pevent tp__pevent;   /* a platform event */
typedef struct tp__pres tp__pres; /* a virtual reservation and its backing */
typedef uint64_t tp__phys;        /* a physical chunk; 0 is never valid */
typedef struct tp__pgraph tp__pgraph; /* a captured graph */
typedef struct tp__pexec tp__pexec;   /* an executable graph */
/* A position in a capture's graph: a node, after which work ordered later
 * runs. 0 is the graph's start, before every node. */
typedef uintptr_t tp__pnode;

/* What another process needs to map one chunk (see share_chunk). */
typedef struct tp__chunk_share {
  uint64_t offset; /* where the chunk lies in the reservation's backing */
  int fd;          /* a descriptor of the chunk itself, or -1 */
} tp__chunk_share;

/* What kind of memory a reservation holds. location.type is DEVICE, HOST,
 * HOST_NUMA, or NONE (managed only); the core has validated it. */
typedef struct tp__mem_kind {
  tp_location_t location;
  tp_allocation_type_t type;
  unsigned handle_types; /* tp_handle_type_t bits the chunks must support */
} tp__mem_kind;

/* What the platform knows of a stream handle it did not create. */
typedef struct tp__stream_desc {
  tp__pstream *ps;
  uint64_t uid; /* unique for the process's life, never a reused value */
  int device;
  unsigned flags; /* TP_STREAM_NON_BLOCKING or 0 */
  int legacy;     /* 1: the device's legacy default stream */
  /* The handle names the calling thread's own stream (cuda's per-thread
   * default stream): from another thread it names that thread's. */
  bool thread_bound;
} tp__stream_desc;

typedef struct tp__platform_ops {
  const char *name; /* "host" or "cuda" */

  /* ---- process and devices ---------------------------------------------
   * init: called once, before any other op. NO_DEVICE (or PLATFORM) when the
   * platform cannot work here; the caller then reports or falls back. */
  tp_error_t (*init)(void);
  tp_error_t (*device_count)(int *count);
  /* The attributes of tidepool.h's tp_device_attr_t; device already valid. */
  tp_error_t (*device_attribute)(int *value, tp_device_attr_t attr, int device);
  /* Make `device` current on the calling thread (cuda: its primary context).
   * Cheap when already current; the API layer calls it before device work. */
  tp_error_t (*set_device)(int device);
  /* Chunk granularity (bytes, a power of two) and capacity (bytes of
   * physical memory that kind can ever hold) of a kind of memory.
   * NOT_SUPPORTED for handle types or allocation types the platform lacks,
   * INVALID_DEVICE for locations that do not exist. */
  tp_error_t (*mem_query)(const tp__mem_kind *kind, size_t *granularity,
                          uint64_t *capacity);

  /* ---- streams ----------------------------------------------------------
   * stream_create: a stream on `device` with TP_STREAM_* flags. *handle is
   * the value the user sees as tp_stream_t (never NULL); the platform
   * guarantees that no other live stream has the same handle value.
   * *uid is unique for the life of the process. */
  tp_error_t (*stream_create)(int device, unsigned flags, tp__pstream **ps,
                              tp_stream_t *handle, uint64_t *uid);
  /* Destroys a stream made by stream_create. Work already queued still runs,
   * and events recorded on it still complete. */
  tp_error_t (*stream_destroy)(tp__pstream *ps);
  /* The legacy default stream of a device (the stream NULL means while that
   * device is current). Never fails once init succeeded, but for a bad
   * device. */
  tp_error_t (*stream_legacy)(int device, tp__stream_desc *desc);
  /* A stream handle the platform made outside stream_create (cuda: any
   * CUstream). INVALID_VALUE where the handle is not a stream. uid 0 where
   * the platform cannot ask the stream its identity now (cuda: while it
   * captures): the stream is then known by its handle, and its flags are
   * unknown (0). */
  tp_error_t (*stream_adopt)(tp_stream_t handle, tp__stream_desc *desc);
  /* The cheap question asked on every call that names a stream adopted
   * before: its capture status and, when it does not capture, its uid, by
   * which the core tells a live stream from a new one that took a destroyed
   * one's handle. `ask_capture` false: the caller knows that nothing
   * captures, and the status is not asked (NONE). Any error sends the core
   * the full way (stream_adopt). NULL where every stream is the core's own
   * (host). */
  tp_error_t (*stream_identify)(tp_stream_t handle, bool ask_capture,
                                uint64_t *uid, tp_capture_status_t *status);
  tp_error_t (*stream_synchronize)(tp__pstream *ps); /* or ILLEGAL_ADDRESS */
  tp_error_t (*stream_query)(tp__pstream *ps);       /* SUCCESS / NOT_READY */
  /* The allocator's own question, whether ps has run all its work: as
   * stream_query, but NOT_READY while ps captures (or the legacy stream is
   * implicated in a capture), never disturbing the capture. A capture that
   * another thread begins meanwhile must not be invalidated by it (cuda
   * can only narrow that window: the driver's query of a capturing stream
   * invalidates it, and the driver tells no one when a capture begins). */
  tp_error_t (*stream_poll)(tp__pstream *ps);
  /* Whether ps, a stream of another's adopted with `uid`, is that stream
   * still, for the calling thread: false only where the platform is sure
   * that its handle now names another stream, or none (its owner destroyed
   * it), or, for a thread-bound one, that the calling thread's is another;
   * asking ps or recording on it would then answer for someone else. Never
   * disturbs a capture (a capturing stream is taken as itself). NULL where
   * every stream is the core's own (host). */
  bool (*stream_named)(tp__pstream *ps, uint64_t uid);
  /* Whether stream_query, stream_poll and stream_synchronize of a device's
   * legacy stream also cover the work its blocking streams queued before
   * (host: they answer as an action there would wait). Where not (cuda,
   * whose documentation promises only the stream's own work), a free on
   * the legacy stream, which follows that work, is known complete only
   * through a marker, an action on the legacy stream; and a free on a
   * blocking stream, which follows the legacy stream's earlier work, once
   * the legacy stream too is seen idle or through a marker there. */
  bool legacy_covers_blocking;
  tp_error_t (*stream_wait_event)(tp__pstream *ps, tp__pevent *ev);
  tp_error_t (*memset_async)(tp__pstream *ps, void *ptr, int value,
                             size_t size);
  tp_error_t (*memcpy_async)(tp__pstream *ps, void *dst, const void *src,
                             size_t size);
  tp_error_t (*launch_host_func)(tp__pstream *ps, void (*fn)(void *),
                                 void *arg);
  /* Waits for all work of every stream of the device. */
  tp_error_t (*device_synchronize)(int device);

  /* ---- events (also the core's free markers) ----------------------------
   * An event belongs to a device; it may be recorded on that device's
   * streams. An event never recorded has completed. Query and synchronize
   * answer ILLEGAL_ADDRESS once work the event covers has faulted, as
   * CUDA's do: that work has finished all the same
   * (tp__pevent_finished). */
  tp_error_t (*event_create)(int device, tp__pevent **ev);
  tp_error_t (*event_destroy)(tp__pevent *ev);
  tp_error_t (*event_record)(tp__pevent *ev, tp__pstream *ps);
  tp_error_t (*event_query)(tp__pevent *ev); /* SUCCESS / NOT_READY */
  tp_error_t (*event_synchronize)(tp__pevent *ev);
  /* The same for a wait of tidepool's own (a last resort before OUT_OF_
   * MEMORY): the calling thread's capture mode does not bar it, so that it
   * neither fails nor invalidates a capture of this thread or another's. */
  tp_error_t (*event_wait)(tp__pevent *ev);

  /* ---- memory -----------------------------------------------------------
   * reserve: a virtual range of `size` bytes aligned to `align` (both
   * multiples of the granularity), inaccessible until mapped. */
  tp_error_t (*reserve)(const tp__mem_kind *kind, size_t size, size_t align,
                        tp__pres **res, uintptr_t *base);
  /* Releases the range; everything in it must be unmapped first. */
  tp_error_t (*unreserve)(tp__pres *res);
  /* One physical chunk of the granularity for this reservation's kind.
   * OUT_OF_MEMORY when the location's capacity is exhausted. A chunk may be
   * mapped, unmapped and mapped again anywhere in its reservation, also at
   * several places at once (graph memory does so); its contents survive
   * the move. */
  tp_error_t (*chunk_create)(tp__pres *res, tp__phys *phys);
  tp_error_t (*chunk_release)(tp__pres *res, tp__phys phys);
  /* Maps n chunks at consecutive granules starting at `offset` bytes into the
   * reservation. Access for the new range is none until set_access. */
  tp_error_t (*map)(tp__pres *res, size_t offset, const tp__phys *phys,
                    size_t n);
  tp_error_t (*unmap)(tp__pres *res, size_t offset, size_t n);
  /* Sets the access of each listed location (devices; host for host
   * memory) to a mapped range; locations not listed keep theirs. */
  tp_error_t (*set_access)(tp__pres *res, size_t offset, size_t size,
                           const tp_access_desc_t *list, size_t count);

  /* ---- sharing between processes -----------------------------------------
   * The exporting process describes its chunks; the importing process maps
   * them into a reservation of its own. Descriptors handed out belong to the
   * caller, who closes them once they have travelled (SCM_RIGHTS).
   *
   * share_reservation: a descriptor that backs every chunk of a reservation
   * made for TP_HANDLE_POSIX_FD (host: its memfd), sent once to each
   * importer; -1 where each chunk travels with a descriptor of its own
   * (cuda). */
  tp_error_t (*share_reservation)(tp__pres *res, int *fd);
  /* What an importer needs to map chunk `phys`, mapped in `res`: its offset
   * in the reservation's backing, or a descriptor of its own. NOT_SUPPORTED
   * for chunks made without TP_HANDLE_POSIX_FD. */
  tp_error_t (*share_chunk)(tp__pres *res, tp__phys phys,
                            tp__chunk_share *share);
  /* As reserve, for another process's chunks: `fd` is the descriptor its
   * share_reservation gave (or -1), which the reservation owns from now on,
   * on failure too. The kind names a location of this process. */
  tp_error_t (*reserve_imported)(const tp__mem_kind *kind, size_t size,
                                 size_t align, int fd, tp__pres **res,
                                 uintptr_t *base);
  /* A chunk of another process, from its share_chunk description, for a
   * reservation made by reserve_imported; share->fd is consumed, on failure
   * too. It maps, unmaps and releases like a chunk of chunk_create, but
   * releasing it never frees the exporter's memory. */
  tp_error_t (*chunk_import)(tp__pres *res, const tp__chunk_share *share,
                             tp__phys *phys);
  /* An identity of the device that every process on the machine sees the
   * same (cuda: its UUID), whatever ordinal the device has there. */
  tp_error_t (*device_uuid)(int device, unsigned char uuid[16]);

  /* ---- stream capture and graphs -----------------------------------------
   * The rules and errors are CUDA's stream capture (see tidepool.h). A
   * stream joins a capture by waiting on an event recorded in it; the work
   * queued on a capturing stream is recorded, not run, except what the ops
   * above do for the core: event_record marks the stream's real position
   * (the work queued before the capture), stream_wait_event makes it wait
   * for real work. While a stream captures, memset_async, memcpy_async and
   * launch_host_func record graph nodes; stream_synchronize and
   * stream_query fail with STREAM_CAPTURE_UNSUPPORTED and invalidate the
   * capture; on the legacy stream of a device where a blocking stream
   * captures, they fail with STREAM_CAPTURE_IMPLICIT and invalidate that
   * capture; device_synchronize fails with STREAM_CAPTURE_UNSUPPORTED where
   * a capture's mode forbids it.
   *
   * graph_maps_at_capture: true where graphs may be instantiated and
   * launched behind tidepool's back (cuda: the application's own
   * cuGraphLaunch), so that a graph's memory must be mapped while it is
   * captured and held until capture_attach's release; false where tidepool
   * sees every exec (host), and maps at instantiation. Fixed once init has
   * succeeded (host: TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE=1 takes cuda's way,
   * for tests). */
  bool (*graph_maps_at_capture)(void);
  /* Where the platform sees every capture begin and end (host), the number
   * of captures under way, read before each allocation and free so that
   * none asks capture_status while nothing captures; NULL where a capture
   * may begin unseen (cuda: the application's own cuStreamBeginCapture),
   * and capture_status is asked every time unless the captures are counted
   * for the platform (common/seen.h). */
  const _Atomic uint32_t *captures_active;
  tp_error_t (*capture_begin)(tp__pstream *ps, tp_capture_mode_t mode);
  /* Ends the capture begun on ps; *graph is NULL on failure. The graph may
   * differ from the one captured in nodes that do no work (cuda removes the
   * empty nodes of capture_point, joining what came before each to what
   * came after), never in the order of the work. *id is the capture this
   * end met, asked at the end itself, so that ends racing on one stream
   * each know their own (0 where none was under way, or the platform no
   * longer tells it: cuda, for an invalidated capture). */
  tp_error_t (*capture_end)(tp__pstream *ps, tp__pgraph **graph, uint64_t *id);
  /* The question asked on every allocation: cheap. *id identifies the
   * capture for the life of the process (0 when none). STREAM_CAPTURE_
   * IMPLICIT for the legacy stream while a blocking stream of its device
   * captures. */
  tp_error_t (*capture_status)(tp__pstream *ps, tp_capture_status_t *status,
                               uint64_t *id);
  /* Tidepool refused work on ps under the capture rules: invalidate the
   * capture CUDA would (ps's own; for the legacy stream, the blocking
   * captures of its device). SUCCESS where a capture was under way (valid
   * or invalidated) at the moment of the invalidation, ILLEGAL_STATE where
   * none was: a capture that ended just before is not touched, and the
   * caller, who saw it under way, must not refuse in its name. */
  tp_error_t (*capture_invalidate)(tp__pstream *ps);
  /* Marks the current position of the capturing stream ps: adds an empty
   * node after all the work captured on it so far, which becomes the
   * stream's position. A node of its own, even where the stream's work ends
   * in one node: a stream forked from that node must not appear to follow
   * what this one does after it. `id` is the capture the caller found ps
   * in: ILLEGAL_STATE, nothing added, where ps has moved on to another
   * (another thread ended its capture and began a new one). */
  tp_error_t (*capture_point)(tp__pstream *ps, uint64_t id, tp__pnode *node);
  /* For each of n positions of ps's capture, whether work captured on ps
   * from now on is ordered after it: out[i] = 1 or 0. */
  tp_error_t (*capture_follows)(tp__pstream *ps, const tp__pnode *nodes,
                                size_t n, unsigned char *out);
  /* Ties release(arg) to the graph that ps's capture makes: it is called
   * once that graph and every exec made from it are destroyed and their
   * launches have completed, or once the capture fails. It runs on any
   * thread and must not call the platform or tidepool (cuda's user-object
   * destructor rule). *tie names the tie for capture_detach; *graph is
   * the graph being captured, the handle its capture's end will give.
   * ILLEGAL_STATE, nothing tied, where ps is no longer in capture `id`
   * (as capture_point). */
  tp_error_t (*capture_attach)(tp__pstream *ps, uint64_t id,
                               void (*release)(void *), void *arg, void **tie,
                               tp__pgraph **graph);
  /* Undoes capture_attach for a graph that capture_end returned, whose
   * execs and launches tidepool therefore sees: its release will not be
   * called, and neither the graph nor its execs carry the tie any more
   * (cuda: the user object goes, which the driver would otherwise track at
   * every launch). On failure the tie stays as it was. */
  tp_error_t (*capture_detach)(tp__pgraph *graph, void *tie);
  /* Event record and wait inside captures: an event recorded on a
   * capturing stream holds its position in the capture; a stream that
   * waits on it joins the capture (or, capturing already, depends on that
   * position). STREAM_CAPTURE_MERGE for two captures,
   * STREAM_CAPTURE_INVALIDATED for an invalidated one, CAPTURED_EVENT for
   * an event whose capture has ended. */
  tp_error_t (*capture_event_record)(tp__pevent *ev, tp__pstream *ps);
  tp_error_t (*capture_event_wait)(tp__pstream *ps, tp__pevent *ev);
  /* An exec of a graph; release(arg) (may be NULL) is called, on any
   * thread, once the exec is destroyed and its launches have completed.
   * flags as tp_graph_instantiate's. */
  tp_error_t (*graph_instantiate)(tp__pgraph *graph, unsigned long long flags,
                                  void (*release)(void *), void *arg,
                                  tp__pexec **exec);
  /* Queues one run of the exec on ps, after the exec's earlier launches. */
  tp_error_t (*graph_launch)(tp__pexec *exec, tp__pstream *ps);
  tp_error_t (*graph_exec_destroy)(tp__pexec *exec);
  tp_error_t (*graph_destroy)(tp__pgraph *graph);
} tp__platform_ops;

/* The platforms compiled into this library. Where the build found no CUDA
 * toolkit headers, tp__cuda_platform is a stub whose init answers NO_DEVICE. */
extern const tp__platform_ops tp__host_platform;
extern const tp__platform_ops tp__cuda_platform;

/* The platform of this process, chosen once (see tp_platform_name); NULL
 * until tp__platform_init succeeded. */
/* The chosen platform's ops (select.c), kept in the hot line. */
#define tp__platform (tp__hot.platform)

/* Chooses and initialises the platform; thread-safe, idempotent. */
tp_error_t tp__platform_init(void);

/* Platform code reports its own failures through this: it keeps the code and
 * name for tp_get_last_platform_error and returns TP_ERROR_PLATFORM. */
tp_error_t tp__platform_fail(int code, const char *name);

/* Whether an event's query or synchronize answer says its work has
 * finished: faulted work has. */
static inline bool tp__pevent_finished(tp_error_t err) {
  return err == TP_SUCCESS || err == TP_ERROR_ILLEGAL_ADDRESS;
}

#endif /* TP_PLATFORM_H */
