/* Filling a table of function pointers from a library opened at run time,
 * as the benchmark and tool programs reach the CUDA driver without linking
 * it. Header-only. */
#ifndef TP_DL_TABLE_H
#define TP_DL_TABLE_H

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

typedef struct dl_sym {
  void *slot; /* the address of a function pointer */
  const char *name;
} dl_sym;

/* Opens `lib` and fills every slot; returns the name of the first symbol
 * missing, "" when the library itself is missing, or NULL on success. */
static inline const char *dl_table_load(const char *lib, const dl_sym *syms,
                                        size_t n) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return "";
  for (size_t i = 0; i < n; i++) {
    void *f = dlsym(h, syms[i].name);
    if (!f)
      return syms[i].name;
    /* ISO C has no cast from object to function pointer; copy the bits. */
    memcpy(syms[i].slot, &f, sizeof f);
  }
  return NULL;
}

#endif /* TP_DL_TABLE_H */
