/* What the driver-level layer's files share: the description of a driver
 * entry point the interposer wraps, the driver functions the layer itself
 * calls, and the way into tidepool from a driver call (the calling thread's
 * context, CUresult codes). A runtime linked statically (libcudart_static:
 * CuPy, cuBLAS, programs built by nvcc) reaches the driver only through
 * cuGetProcAddress, which hook.c hands out in tidepool's version. */
#ifndef TP_PRELOAD_DRIVER_H
#define TP_PRELOAD_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "preload.h"

/* ---- wrapped entry points ------------------------------------------------
 * One variant of one driver function: the name cuGetProcAddress takes, the
 * name libcuda exports the variant under, the ABI version whose PFN type
 * the wrapper has, and whether it is the per-thread default stream (_ptsz)
 * variant. `real` is where the driver's own function is kept, filled before
 * the wrapper is first handed out. A variant is told apart from the others
 * of its name by the driver's pointer itself: cuGetProcAddress answers a
 * name, a version and flags with one of them, and the wrapper handed out
 * is the one whose real function that is. */
typedef struct tp__pl_drv_entry {
  const char *name;
  const char *symbol;
  int version;
  bool per_thread;
  bool host_only; /* handed out only with TIDEPOOL_PRELOAD=host */
  tp__pl_fn wrapper;
  _Atomic(tp__pl_fn) *real;
} tp__pl_drv_entry;

/* The entries of driver_alloc.c, driver_observe.c and driver_graph.c. */
extern const tp__pl_drv_entry tp__pl_drv_alloc_entries[];
extern const size_t tp__pl_drv_alloc_count;
extern const tp__pl_drv_entry tp__pl_drv_observe_entries[];
extern const size_t tp__pl_drv_observe_count;
extern const tp__pl_drv_entry tp__pl_drv_graph_entries[];
extern const size_t tp__pl_drv_graph_count;

/* The function kept in `slot`, or NULL. */
static inline tp__pl_fn tp__pl_drv_real(_Atomic(tp__pl_fn) *slot) {
  return atomic_load_explicit(slot, memory_order_acquire);
}

/* What a wrapper answers when the driver's own function is missing (which
 * cannot happen once the wrapper was handed out). */
#define TP_PL_DRV_NO_DRIVER CUDA_ERROR_NOT_FOUND

/* Calls the driver's function kept in `slot`, of PFN type `type`. */
#define TP_PL_DRV_CALL(slot, type, args)                                       \
  (tp__pl_drv_real(&(slot)) ? ((type)tp__pl_drv_real(&(slot)))args             \
                            : TP_PL_DRV_NO_DRIVER)

/* ---- the driver's functions the layer calls itself ------------------------
 * Fetched once through the driver's cuGetProcAddress, before any wrapper
 * is handed out. Returns false where the driver lacks one of them (the
 * layer then hands out nothing). */
bool tp__pl_drv_load(PFN_cuGetProcAddress_v12000 get_proc);
bool tp__pl_drv_loaded(void);

/* Fills every entry's driver function from the libcuda the process has
 * loaded, for a driver name called directly (driver_names: a library
 * linked against libcuda); false where there is none, or it lacks what
 * the layer needs. */
bool tp__pl_drv_fill_loaded(void);

/* The loaded libcuda's own function of that symbol, or NULL. */
tp__pl_fn tp__pl_drv_by_name(const char *symbol);

/* A driver name defined by the interposer (driver_exports.txt) for the
 * libraries that call it directly: the wrapper `call` once its driver
 * function is known; else (the interposer switched off, or the driver
 * lacking the variant) the driver's own `symbol`, after `unseen`, which
 * makes up for what the wrapper would have told tidepool. */
#define TP_PL_DRV_NAME(slot, call, unseen, type, symbol, args)                 \
  do {                                                                         \
    if (!tp__pl_switched_off() && tp__pl_drv_fill_loaded() &&                  \
        tp__pl_drv_real(&(slot)))                                              \
      return call;                                                             \
    tp__pl_fn own_ = tp__pl_drv_by_name(symbol);                               \
    unseen;                                                                    \
    return own_ ? ((type)own_)args : CUDA_ERROR_NOT_INITIALIZED;               \
  } while (0)

/* The driver's function `name` at ABI `version`, legacy or per-thread. */
tp__pl_fn tp__pl_drv_fetch(PFN_cuGetProcAddress_v12000 get_proc,
                           const char *name, int version, bool per_thread);

/* ---- calling into tidepool -------------------------------------------------
 * Where a driver call goes. */
enum {
  TP_PL_DRV_PASS,   /* to the driver, unremarked: tidepool is off or not yet
                       on, or the call came through the runtime-level layer */
  TP_PL_DRV_OTHER,  /* to the driver, counted as forwarded: no context is
                       current, or one other than its device's primary
                       context (tidepool's pools live in primary contexts) */
  TP_PL_DRV_OURS,   /* tidepool answers; its device is the context's */
  TP_PL_DRV_FAILED, /* tidepool could not follow the context: *err */
};

/* Decides where a call goes. `decide`: the mode may be decided now (calls
 * that allocate or make pools); calls that only observe leave an undecided
 * mode as it is, having nothing to tell tidepool yet. */
int tp__pl_drv_enter(bool decide, CUresult *err);

/* A call on tidepool's own object (a pool it made, a pointer it gave out)
 * that tp__pl_drv_enter sent to the driver (OTHER): the driver would take
 * tidepool's handle or pointer for one of its own and refuse it, and a free
 * would be lost. Answers OURS where tidepool can answer it in a primary
 * context, made current for the call: that of `stream`'s device where
 * `stream` (when `has_stream`) is a stream of a primary context, else, for
 * a call without a stream, that of tidepool's current device. The
 * caller's context is in *saved, to be put back with tp__pl_drv_ctx_restore
 * once tidepool answered. OTHER where the driver answers after all (a
 * stream of a context of the program's own, or a legacy or per-thread
 * stream, which names the current context's: none, or the program's own),
 * the caller's context current; FAILED with *err. */
int tp__pl_drv_own(bool has_stream, CUstream stream, CUcontext *saved,
                   CUresult *err);

/* Whether the driver captures `stream` (or cannot say); see
 * tp__pl_capturing. */
bool tp__pl_drv_capturing(CUstream stream, bool per_thread);

/* The id of the capture `stream` is in (0 where none, or the driver does
 * not say), and in *capturing whether it captures (true where the driver
 * cannot say). Asked only around a capture's begin and end. */
uint64_t tp__pl_drv_capture_id(CUstream stream, bool per_thread,
                               bool *capturing);

/* The ordinal of a CUdevice, or -1; and the reverse. */
int tp__pl_drv_ordinal(CUdevice dev);
bool tp__pl_drv_device(int ordinal, CUdevice *dev);

/* The driver's code for a tidepool error. */
CUresult tp__pl_drv_error(tp_error_t err);

/* tidepool's answer as the driver's, counted under `counter` and as a
 * driver-level call (and as failed where it failed). */
CUresult tp__pl_drv_answer(tp_error_t err, int counter);

/* Counts a call seen or forwarded at the driver level under `counter`. */
void tp__pl_drv_count(int counter);

/* The calling thread's current context, kept across work that may change
 * it (tidepool's first call on a thread makes device 0's primary context
 * current), and put back. */
CUcontext tp__pl_drv_ctx_save(void);
void tp__pl_drv_ctx_restore(CUcontext ctx);

#endif /* TP_PRELOAD_DRIVER_H */
