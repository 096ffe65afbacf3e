/* What the entry points of dlsym and dlvsym (dl_entry_x86_64.S.in, or
 * dl_entry.c elsewhere) share with hook.c: the C library's own functions,
 * and the lookups hook.c answers. A lookup with RTLD_NEXT or RTLD_DEFAULT
 * goes straight to the C library, whose answer depends on the caller's
 * object (after it, or in its scope), which it finds from its own return
 * address; a lookup in a given object comes to hook.c with the program's
 * return address. */
#ifndef TP_PRELOAD_DL_H
#define TP_PRELOAD_DL_H

#include <stdatomic.h>

typedef void *(*tp__pl_dlsym_fn)(void *, const char *);
typedef void *(*tp__pl_dlvsym_fn)(void *, const char *, const char *);

/* A sanitizer's runtime in the program looks up its interceptors with
 * dlsym as it starts, before its shadow memory is set up and before any
 * constructor runs: the functions on that path carry no sanitizer
 * instrumentation (clang's no_sanitize still lets ThreadSanitizer mark
 * function entry and exit, which its other attribute removes), take no lock
 * (two threads finding the same function race harmlessly) and call only the
 * C library. */
#define TP_PL_EARLY_NO_SANITIZE                                                \
  __attribute__((no_sanitize("address", "undefined", "thread")))
#if defined(__has_attribute)
#if __has_attribute(disable_sanitizer_instrumentation)
#define TP_PL_EARLY                                                            \
  TP_PL_EARLY_NO_SANITIZE __attribute__((disable_sanitizer_instrumentation))
#endif
#endif
#ifndef TP_PL_EARLY
#define TP_PL_EARLY TP_PL_EARLY_NO_SANITIZE
#endif

/* The C library's dlsym and dlvsym once found (NULL before), and the
 * functions that find them. */
extern _Atomic(tp__pl_dlsym_fn) tp__pl_libc_dlsym;
extern _Atomic(tp__pl_dlvsym_fn) tp__pl_libc_dlvsym;
tp__pl_dlsym_fn tp__pl_real_dlsym(void);
tp__pl_dlvsym_fn tp__pl_real_dlvsym(void);

/* A lookup in the object `handle` (from dlopen), made from `caller` (a
 * return address). */
void *tp__pl_dlsym_from(void *handle, const char *name, const void *caller);
void *tp__pl_dlvsym_from(void *handle, const char *name, const char *version,
                         const void *caller);

#endif /* TP_PRELOAD_DL_H */
