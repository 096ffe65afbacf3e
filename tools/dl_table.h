/* Filling a table of function pointers from a library opened at run time,
 * as the benchmark and tool programs reach the CUDA driver without linking
 * it: by name with dlsym, or through the driver's cuGetProcAddress at a
 * given ABI version. Header-only. */
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

typedef struct dl_cu_sym {
  void *slot;       /* the address of a function pointer */
  const char *name; /* cuda.h's name, without a _v2 suffix */
  int version;      /* the CUDA version of the ABI wanted, as 11070 */
} dl_cu_sym;

/* Opens libcuda.so.1 and fills every slot through cuGetProcAddress (CUDA
 * 12.0 and later), each at its ABI version and in its legacy-stream form,
 * so that a NULL stream means the legacy default stream, as the names
 * dlsym finds mean it. Returns as dl_table_load, "cuGetProcAddress_v2"
 * where the driver is older. */
static inline const char *dl_table_load_cuda(const dl_cu_sym *syms, size_t n) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return "";
  void *sym = dlsym(h, "cuGetProcAddress_v2");
  if (!sym)
    return "cuGetProcAddress_v2";
  /* cuda.h: (symbol, pfn, cudaVersion, flags, symbolStatus), where flag
   * 1 is CU_GET_PROC_ADDRESS_LEGACY_STREAM and status 0 is success. */
  int (*get)(const char *, void **, int, unsigned long long, int *);
  memcpy(&get, &sym, sizeof sym);
  for (size_t i = 0; i < n; i++) {
    void *f = NULL;
    int status = -1;
    if (get(syms[i].name, &f, syms[i].version, 1, &status) != 0 ||
        status != 0 || !f)
      return syms[i].name;
    memcpy(syms[i].slot, &f, sizeof f);
  }
  return NULL;
}

#endif /* TP_DL_TABLE_H */
