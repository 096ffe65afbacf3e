/* How the driver-level layer is reached: dlsym and dlvsym, interposed (the
 * entry points are in dl_entry_x86_64.S.in or dl_entry.c), hand out
 * tidepool's cuGetProcAddress when a program (a runtime linked statically,
 * which loads libcuda with dlopen) looks the driver's up in libcuda, and
 * tidepool's version of the allocator's entry points looked up by name;
 * tidepool's cuGetProcAddress then hands out tidepool's version of every entry
 * point of driver_alloc.c and driver_observe.c, and the driver's own function
 * for everything else. Lookups made from inside this library (tidepool's cuda
 * platform, the runtime-level layer) get the real answer. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "common/seen.h"
#include "dl.h"
#include "driver.h"

#if !defined(TP_PL_DL_DEFAULT)
#error "TP_PL_DL_DEFAULT (the C library's current version of dlsym) is unset"
#endif

/* ---- the C library's dlsym and dlvsym --------------------------------------
 * This library defines dlsym at every version the C library has (programs
 * linked against an older C library reference the older), and dlvsym at
 * the current one. The older dlvsym (TP_PL_DL_COMPAT) is the way to the C
 * library's functions: a reference to it finds no definition here. Where
 * the C library has one version only, dlvsym is not interposed, and that
 * one is the way. */
extern void *tp__pl_libc_dlvsym_ref(void *handle, const char *name,
                                    const char *version);
#if defined(TP_PL_DL_COMPAT)
__asm__(".symver tp__pl_libc_dlvsym_ref, dlvsym@" TP_PL_DL_COMPAT);
#else
__asm__(".symver tp__pl_libc_dlvsym_ref, dlvsym@" TP_PL_DL_DEFAULT);
#endif

_Atomic(tp__pl_dlsym_fn) tp__pl_libc_dlsym;
_Atomic(tp__pl_dlvsym_fn) tp__pl_libc_dlvsym;

TP_PL_EARLY tp__pl_dlvsym_fn tp__pl_real_dlvsym(void) {
  tp__pl_dlvsym_fn f = tp__pl_libc_dlvsym_ref;
  atomic_store_explicit(&tp__pl_libc_dlvsym, f, memory_order_release);
  return f;
}

TP_PL_EARLY tp__pl_dlsym_fn tp__pl_real_dlsym(void) {
  tp__pl_dlsym_fn f =
      atomic_load_explicit(&tp__pl_libc_dlsym, memory_order_acquire);
  if (!f) {
    /* A function's address from dlsym's object pointer, through a union
     * rather than memcpy, which a sanitizer intercepts. */
    union {
      void *obj;
      tp__pl_dlsym_fn fn;
    } pun = {tp__pl_libc_dlvsym_ref(RTLD_NEXT, "dlsym", TP_PL_DL_DEFAULT)};
    f = pun.fn;
    atomic_store_explicit(&tp__pl_libc_dlsym, f, memory_order_release);
  }
  return f;
}

/* ---- who is asking, and for what ---------------------------------------- */

static const char self_marker;

static bool is_self(const void *caller) {
  Dl_info mine, theirs;
  return dladdr(&self_marker, &mine) && dladdr(caller, &theirs) &&
         mine.dli_fbase == theirs.dli_fbase;
}

/* Whether `sym` lies in a libcuda (the driver, or a stand-in by that name):
 * a program's own function of a driver name is not the driver's. */
static bool in_driver(const void *sym) {
  Dl_info info;
  if (!dladdr(sym, &info) || !info.dli_fname)
    return false;
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  return strncmp(base, "libcuda.so", 10) == 0;
}

/* ---- the table -------------------------------------------------------------
 */

static _Atomic(tp__pl_fn) r_gpa_v1, r_gpa_v2;
static CUresult get_proc_v1(const char *symbol, void **pfn, int version,
                            cuuint64_t flags);
static CUresult get_proc_v2(const char *symbol, void **pfn, int version,
                            cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status);

static const tp__pl_drv_entry own_entries[] = {
    {"cuGetProcAddress", "cuGetProcAddress", 11030, false, false,
     (tp__pl_fn)get_proc_v1, &r_gpa_v1},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000, false, false,
     (tp__pl_fn)get_proc_v2, &r_gpa_v2},
};

static const struct {
  const tp__pl_drv_entry *entries;
  const size_t *count;
} tables[] = {
    {tp__pl_drv_alloc_entries, &tp__pl_drv_alloc_count},
    {tp__pl_drv_observe_entries, &tp__pl_drv_observe_count},
    {tp__pl_drv_graph_entries, &tp__pl_drv_graph_count},
};

/* Calls `visit` on every entry until it returns non-NULL. */
static const tp__pl_drv_entry *
find_entry(bool (*match)(const tp__pl_drv_entry *, const void *),
           const void *arg) {
  for (size_t i = 0; i < sizeof own_entries / sizeof own_entries[0]; i++)
    if (match(&own_entries[i], arg))
      return &own_entries[i];
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
    for (size_t i = 0; i < *tables[t].count; i++)
      if (match(&tables[t].entries[i], arg))
        return &tables[t].entries[i];
  return NULL;
}

/* 0 not filled, 1 filled, -1 the driver lacks what the layer needs. */
static _Atomic int filled;
static pthread_mutex_t fill_lock = PTHREAD_MUTEX_INITIALIZER;
static TP_TLS bool filling;

tp__pl_fn tp__pl_drv_by_name(const char *symbol) {
  void *handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!handle)
    return NULL;
  void *sym = tp__pl_real_dlsym()(handle, symbol);
  (void)dlclose(handle);
  tp__pl_fn fn = NULL;
  memcpy(&fn, &sym, sizeof fn);
  return fn;
}

/* A driver whose own references to its names go through the global scope
 * (a library built without -Bsymbolic) hands out the interposer's
 * definitions of the names it defines (driver_exports.txt) for its own:
 * then the driver's own function is the one its handle finds. */
static bool fill_entry(const tp__pl_drv_entry *e, const void *arg) {
  PFN_cuGetProcAddress_v12000 get_proc;
  memcpy(&get_proc, arg, sizeof get_proc);
  tp__pl_fn fn = tp__pl_drv_fetch(get_proc, e->name, e->version, e->per_thread);
  void *p;
  memcpy(&p, &fn, sizeof p);
  if (p && is_self(p))
    fn = tp__pl_drv_by_name(e->symbol);
  atomic_store_explicit(e->real, fn, memory_order_release);
  return false;
}

/* Fetches the driver's own function of every entry, once, with the
 * driver's cuGetProcAddress. A lookup the driver makes while this runs (on
 * this thread) gets the real answer. */
static bool fill(PFN_cuGetProcAddress_v12000 get_proc) {
  int state = atomic_load_explicit(&filled, memory_order_acquire);
  if (state != 0 || filling || !get_proc)
    return state > 0;
  pthread_mutex_lock(&fill_lock);
  if (atomic_load_explicit(&filled, memory_order_relaxed) == 0) {
    filling = true;
    bool ok = tp__pl_drv_load(get_proc);
    if (ok)
      (void)find_entry(fill_entry, &get_proc);
    filling = false;
    /* Nothing is handed out: the capture entries do not count begins. */
    if (!ok)
      tp__seen_unwatch("the driver's table could not be filled");
    atomic_store_explicit(&filled, ok ? 1 : -1, memory_order_release);
  }
  pthread_mutex_unlock(&fill_lock);
  return atomic_load_explicit(&filled, memory_order_acquire) > 0;
}

bool tp__pl_drv_fill_loaded(void) {
  if (atomic_load_explicit(&filled, memory_order_acquire) != 0)
    return atomic_load_explicit(&filled, memory_order_acquire) > 0;
  void *handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!handle)
    return false;
  PFN_cuGetProcAddress_v12000 get_proc = NULL;
  void *gp = tp__pl_real_dlsym()(handle, "cuGetProcAddress_v2");
  memcpy(&get_proc, &gp, sizeof get_proc);
  (void)dlclose(handle);
  return fill(get_proc);
}

/* Whether `e` may be handed out in this process. */
static bool usable(const tp__pl_drv_entry *e) {
  return tp__pl_drv_real(e->real) && (!e->host_only || tp__pl_host_requested());
}

typedef struct {
  const char *name;
  tp__pl_fn real;
} by_real;

static bool same_real(const tp__pl_drv_entry *e, const void *arg) {
  const by_real *want = arg;
  return tp__pl_drv_real(e->real) == want->real &&
         strcmp(e->name, want->name) == 0;
}

static bool same_symbol(const tp__pl_drv_entry *e, const void *arg) {
  return strcmp(e->symbol, (const char *)arg) == 0;
}

/* What cuGetProcAddress hands out for `symbol`, whose driver function is
 * *pfn: tidepool's version of the variant it is, or the driver's. */
static void substitute(const char *symbol, void **pfn) {
  if (!symbol || !pfn || !*pfn || filling)
    return;
  by_real want = {symbol, NULL};
  memcpy(&want.real, pfn, sizeof want.real);
  const tp__pl_drv_entry *e = find_entry(same_real, &want);
  if (e && usable(e))
    memcpy(pfn, &e->wrapper, sizeof *pfn);
}

/* ---- cuGetProcAddress ------------------------------------------------------
 */

static CUresult get_proc_v1(const char *symbol, void **pfn, int version,
                            cuuint64_t flags) {
  CUresult r = TP_PL_DRV_CALL(r_gpa_v1, PFN_cuGetProcAddress_v11030,
                              (symbol, pfn, version, flags));
  if (r == CUDA_SUCCESS)
    substitute(symbol, pfn);
  return r;
}

static CUresult get_proc_v2(const char *symbol, void **pfn, int version,
                            cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
  CUresult r = TP_PL_DRV_CALL(r_gpa_v2, PFN_cuGetProcAddress_v12000,
                              (symbol, pfn, version, flags, status));
  if (r == CUDA_SUCCESS)
    substitute(symbol, pfn);
  return r;
}

/* The driver's own names of cuGetProcAddress, which a library linked
 * against libcuda calls directly (driver_exports.txt): tidepool's version,
 * whose answers are the wrappers; should the driver lack one, its own,
 * after which a capture or a destruction may go unseen. The first ABI's
 * name is the one cuda.h now maps to the second's. */
TP_PL_EXPORT CUresult CUDAAPI
cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
  TP_PL_DRV_NAME(r_gpa_v2, get_proc_v2(symbol, pfn, version, flags, status),
                 tp__seen_unwatch("cuGetProcAddress_v2 was called before the "
                                  "driver's table was filled"),
                 PFN_cuGetProcAddress_v12000, "cuGetProcAddress_v2",
                 (symbol, pfn, version, flags, status));
}

TP_PL_EXPORT CUresult CUDAAPI
gpa_v1_name(const char *symbol, void **pfn, int version,
            cuuint64_t flags) __asm__("cuGetProcAddress");
TP_PL_EXPORT CUresult CUDAAPI gpa_v1_name(const char *symbol, void **pfn,
                                          int version, cuuint64_t flags) {
  TP_PL_DRV_NAME(r_gpa_v1, get_proc_v1(symbol, pfn, version, flags),
                 tp__seen_unwatch("cuGetProcAddress was called before the "
                                  "driver's table was filled"),
                 PFN_cuGetProcAddress_v11030, "cuGetProcAddress",
                 (symbol, pfn, version, flags));
}

/* ---- dlsym and dlvsym ---------------------------------------------------- */

/* The driver's cuGetProcAddress, from the object `sym` (a driver function)
 * lies in, which the program has loaded (a handle with RTLD_NOLOAD loads
 * nothing and is given back). */
static PFN_cuGetProcAddress_v12000 driver_get_proc(const void *sym) {
  PFN_cuGetProcAddress_v12000 get_proc = NULL;
  Dl_info info;
  if (!dladdr(sym, &info) || !info.dli_fname)
    return NULL;
  void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle)
    return NULL;
  void *gp = tp__pl_real_dlsym()(handle, "cuGetProcAddress_v2");
  memcpy(&get_proc, &gp, sizeof get_proc);
  (void)dlclose(handle);
  return get_proc;
}

/* A symbol of the driver looked up by name: tidepool's version where it has
 * one. */
static void *wrap_symbol(const char *name, void *sym) {
  const tp__pl_drv_entry *e = find_entry(same_symbol, name);
  if (!e || filling || !in_driver(sym))
    return sym;
  bool ready = atomic_load_explicit(&filled, memory_order_acquire) > 0 ||
               fill(driver_get_proc(sym));
  if (!ready || !usable(e))
    return sym;
  void *out;
  memcpy(&out, &e->wrapper, sizeof out);
  return out;
}

/* Only the driver's names ("cu...") are looked at: everything else leaves
 * at once, on the path a sanitizer's runtime takes as it starts. */
TP_PL_EARLY static bool driver_name(const char *name) {
  return name && name[0] == 'c' && name[1] == 'u';
}

static void *driver_lookup(const char *name, void *sym, const void *caller) {
  if (is_self(caller) || tp__pl_switched_off())
    return sym;
  return wrap_symbol(name, sym);
}

TP_PL_EARLY void *tp__pl_dlsym_from(void *handle, const char *name,
                                    const void *caller) {
  void *sym = tp__pl_real_dlsym()(handle, name);
  if (!sym || !driver_name(name))
    return sym;
  return driver_lookup(name, sym, caller);
}

TP_PL_EARLY void *tp__pl_dlvsym_from(void *handle, const char *name,
                                     const char *version, const void *caller) {
  tp__pl_dlvsym_fn real =
      atomic_load_explicit(&tp__pl_libc_dlvsym, memory_order_acquire);
  void *sym = (real ? real : tp__pl_real_dlvsym())(handle, name, version);
  if (!sym || !driver_name(name))
    return sym;
  return driver_lookup(name, sym, caller);
}
