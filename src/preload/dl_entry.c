/* The interposer's dlsym and dlvsym where no assembly entry exists (see
 * dl_entry_x86_64.S.in): a lookup with RTLD_NEXT or RTLD_DEFAULT is passed
 * on from here, so the C library takes the caller to be this library.
 * RTLD_NEXT then means after this library rather than after the caller:
 * the same answer whenever the caller's object comes before this library
 * (the program, or a preload listed earlier) and the symbol is not one this
 * library defines, but a library after it that looks up its own symbol's
 * next definition finds its own. RTLD_DEFAULT searches the global scope
 * without the caller's own dependencies when the caller was opened
 * RTLD_LOCAL. */
#include <dlfcn.h>

#include "dl.h"
#include "preload.h"

TP_PL_EXPORT void *tp__pl_dlsym_entry(void *handle, const char *name);
TP_PL_EARLY TP_PL_EXPORT void *tp__pl_dlsym_entry(void *handle,
                                                  const char *name) {
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
    return tp__pl_real_dlsym()(handle, name);
  return tp__pl_dlsym_from(handle, name, __builtin_return_address(0));
}
__asm__(".symver tp__pl_dlsym_entry, dlsym@@" TP_PL_DL_DEFAULT);

#if defined(TP_PL_DL_COMPAT)
TP_PL_EXPORT void *tp__pl_dlsym_compat_entry(void *handle, const char *name);
TP_PL_EARLY TP_PL_EXPORT void *tp__pl_dlsym_compat_entry(void *handle,
                                                         const char *name) {
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
    return tp__pl_real_dlsym()(handle, name);
  return tp__pl_dlsym_from(handle, name, __builtin_return_address(0));
}
__asm__(".symver tp__pl_dlsym_compat_entry, dlsym@" TP_PL_DL_COMPAT);

TP_PL_EXPORT void *tp__pl_dlvsym_entry(void *handle, const char *name,
                                       const char *version);
TP_PL_EARLY TP_PL_EXPORT void *
tp__pl_dlvsym_entry(void *handle, const char *name, const char *version) {
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT)
    return tp__pl_real_dlvsym()(handle, name, version);
  return tp__pl_dlvsym_from(handle, name, version, __builtin_return_address(0));
}
__asm__(".symver tp__pl_dlvsym_entry, dlvsym@@" TP_PL_DL_DEFAULT);
#endif
