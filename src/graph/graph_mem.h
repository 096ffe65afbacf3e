/* Graph memory: the allocations that captured graphs own, apart from every
 * pool. A graph's allocations get addresses at capture in ranges of its
 * own (segments), fixed for the graph's life and never reused within it;
 * what the graph reuses is physical memory: the chunk under a granule of
 * addresses whose allocations were all freed before a later allocation (in
 * the graph's order) is mapped again under that allocation's granules.
 * The ranges are backed while the graph is held (host: while an exec of it
 * lives; cuda: from capture until the driver releases the graph and its
 * execs), so that a launch makes no allocator call. Chunks a graph gives
 * back stay with their device for reuse by other graphs until trim.
 *
 * What it owns: per device, arenas (large virtual reservations in which
 * segments are carved, with a cache of unmapped chunks each) and the four
 * accounts of the graph memory attributes (used: chunks under graphs;
 * reserved: those and the cached ones); per graph, its segments, the
 * chunk of each granule, its allocations, and the liveness of those that
 * outlive a launch. It reaches the machine only through the platform's
 * reserve, chunk, map, access, event and capture ops, and knows nothing
 * of pools.
 *
 * Locking: one mutex guards all of it (graph memory is touched at capture,
 * instantiation, launch, trim and by frees of allocations that outlived a
 * launch, none of them a fast path; a launch of a graph whose allocations
 * all die inside it takes no lock at all). The platform's release
 * callbacks take no lock: they push onto a lock-free list that the next
 * call under the mutex applies. Platform calls that may run those
 * callbacks synchronously (graph and exec destruction) are made without
 * the mutex. */
#ifndef TP_GRAPH_MEM_H
#define TP_GRAPH_MEM_H

#include <stdbool.h>

#include "common/common.h"
#include "platform/platform.h"

#define TP__GMEM_MAX_DEVICES 16

typedef struct tp__gmem tp__gmem;

/* What an allocation is made of: pinned memory of `device`, with the
 * access each device has to it (the pool's list; the own device always
 * reads and writes). */
typedef struct tp__gmem_kind {
  int device;
  tp_access_flags_t access[TP__GMEM_MAX_DEVICES];
} tp__gmem_kind;

/* An allocation of `size` bytes in the graph that the capture `capture_id`
 * on ps builds, at an address fixed for the graph's life. The first call
 * of a capture ties the graph's memory to the graph (capture_attach) and,
 * where the platform maps at capture, maps as the plan grows. With `mark`,
 * the allocation's position on ps is marked (capture_point), so that the
 * end of the capture finds a forked stream that allocated and did not join
 * back. Errors: OUT_OF_MEMORY, INVALID_VALUE, the platform's. */
tp_error_t tp__gmem_malloc(tp__pstream *ps, uint64_t capture_id,
                           const tp__gmem_kind *kind, size_t size, bool mark,
                           void **ptr);

/* A free captured on ps, in capture `capture_id`: `ptr` must be an
 * allocation of this capture not yet freed in it, or one of another graph
 * that outlives its launches (freed at each launch of this graph).
 * INVALID_VALUE for anything else, changing nothing. */
tp_error_t tp__gmem_free_captured(tp__pstream *ps, uint64_t capture_id,
                                  void *ptr);

/* A free outside capture on ps: *claimed when `ptr` is a graph allocation,
 * which must then be live (INVALID_VALUE otherwise). A pointer outside
 * every arena is told apart without a lock, in a few loads: the cost every
 * free outside capture pays. */
tp_error_t tp__gmem_free(tp__pstream *ps, int device, void *ptr, bool *claimed);

/* The graph memory of a capture, or NULL when it allocated and freed
 * nothing. Valid while the capture's graph lives. */
tp__gmem *tp__gmem_of_capture(uint64_t capture_id);

/* The graph memory tied to the platform's graph `pg` (one whose capture
 * the application ended itself), or NULL: the newest such, since the
 * platform may give a destroyed graph's handle to a new one. Valid while
 * that graph or an exec of it lives. */
tp__gmem *tp__gmem_of_graph(const tp__pgraph *pg);
/* The platform's graph `pg` is being destroyed by its owner: its handle no
 * longer names graph memory (the memory itself lives on with its execs). */
void tp__gmem_forget_graph(const tp__pgraph *pg);

/* Whether a graph's memory has allocations or frees (and so one exec at a
 * time). */
bool tp__gmem_has_allocations(const tp__gmem *gm);
/* The id of the capture that made gm: unique to it for the process's life,
 * where its address may serve another once it is freed. */
uint64_t tp__gmem_capture_id(const tp__gmem *gm);

/* Before instantiating a graph with memory: refuses a second exec
 * (NOT_SUPPORTED), and where the platform maps at instantiation, maps the plan
 * (OUT_OF_MEMORY, PLATFORM). *release and *arg receive what the platform
 * calls once the exec is gone (NULL where nothing is held per exec); an
 * instantiation that fails afterwards calls tp__gmem_instantiate_undo. */
tp_error_t tp__gmem_instantiate(tp__gmem *gm, void (**release)(void *),
                                void **arg);
void tp__gmem_instantiate_undo(tp__gmem *gm, void *arg);

/* tp_stream_end_capture returned the graph of gm: tidepool sees every exec
 * and launch of it from now on, so an allocation that outlives launches is
 * live only after tidepool's launches. Where the platform maps at capture,
 * gm's tie to the graph is detached (capture_detach), and tidepool says
 * when the graph goes: its handle destroyed (tp__gmem_graph_destroyed), no
 * exec alive, and the last launch of each destroyed exec completed
 * (tp__gmem_exec_finished). Nothing changes when the detach fails. */
void tp__gmem_adopt(tp__gmem *gm, tp__pgraph *graph);
/* tp_stream_end_capture failed for capture_id: its graph was never
 * launched, so none of its allocations outlives it. */
void tp__gmem_capture_failed(uint64_t capture_id);
/* An interposer saw the application's own end of capture_id (the
 * driver's): `ok`, it returned a graph, whose allocations that outlive it
 * another graph may free from now on, as CUDA lets a capture free the
 * outputs of a graph captured before, not yet instantiated; otherwise the
 * capture ended in failure, as above. Nothing for a capture in which
 * tidepool did not allocate. */
void tp__gmem_capture_ended(uint64_t capture_id, bool ok);
/* Whether tidepool must tell gm when the launches of a destroyed exec
 * complete (gm adopted and detached). */
bool tp__gmem_self_held(const tp__gmem *gm);
void tp__gmem_graph_destroyed(tp__gmem *gm);

/* tp_graph_exec_destroy of an exec of gm (the platform releases what it
 * holds later, through the release of tp__gmem_instantiate). `may_run`:
 * it was launched, and for a self-held gm tp__gmem_exec_finished follows
 * once its last launch completed. */
void tp__gmem_exec_destroyed(tp__gmem *gm, bool may_run);
void tp__gmem_exec_finished(tp__gmem *gm);

/* Launches `exec` of the graph whose memory is gm (NULL: none) on ps, a
 * stream of `device`, with the bookkeeping of allocations that outlive
 * launches: refuses a launch while one of them is live (unless auto_free),
 * orders the launch after their frees, and after it marks them live. */
tp_error_t tp__gmem_launch(tp__gmem *gm, tp__pexec *exec, bool auto_free,
                           tp__pstream *ps, int device);

/* Releases the cached chunks of the device's arenas. */
tp_error_t tp__gmem_trim(int device);

/* The four TP_GRAPH_MEM_ATTR_* accounts of a device (a valid one). */
tp_error_t tp__gmem_get_attr(int device, tp_graph_mem_attr_t attr,
                             uint64_t *value);
tp_error_t tp__gmem_reset_high(int device, tp_graph_mem_attr_t attr);

#endif /* TP_GRAPH_MEM_H */
