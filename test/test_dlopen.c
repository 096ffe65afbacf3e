/* The shared library loaded by dlopen after the program started, as
 * PyTorch's pluggable allocator and CuPy load it: it must load (its static
 * TLS comes out of glibc's small surplus for such libraries, so it must stay
 * small) and serve allocations on the loading thread and on a new one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "check.h"

typedef int (*malloc_fn)(void **, size_t, void *);
typedef int (*free_fn)(void *, void *);
typedef int (*sync_fn)(void *);
static malloc_fn lib_malloc;
static free_fn lib_free;
static sync_fn lib_sync;

static const char *lib_path;
static size_t tls_size;
static int found;

static int find_module(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  const char *base = strrchr(lib_path, '/');
  base = base ? base + 1 : lib_path;
  if (!info->dlpi_name || !strstr(info->dlpi_name, base))
    return 0;
  found = 1;
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_TLS)
      tls_size = info->dlpi_phdr[i].p_memsz;
  return 1;
}

/* A pair on the legacy stream, then a synchronize. */
static void *pair(void *arg) {
  (void)arg;
  void *p = NULL;
  CHECK_EQ_INT(lib_malloc(&p, 4096, NULL), 0);
  CHECK(p != NULL);
  CHECK_EQ_INT(lib_free(p, NULL), 0);
  CHECK_EQ_INT(lib_sync(NULL), 0);
  return NULL;
}

int main(void) {
  lib_path = getenv("TIDEPOOL_LIB");
  if (!lib_path || !*lib_path)
    return check_skip("TIDEPOOL_LIB names no library");
  void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(lib != NULL)) {
    printf("   dlopen: %s\n", dlerror());
    return check_done();
  }
  void *m = dlsym(lib, "tp_malloc_async"), *f = dlsym(lib, "tp_free_async"),
       *s = dlsym(lib, "tp_stream_synchronize");
  if (!CHECK(m && f && s))
    return check_done();
  memcpy(&lib_malloc, &m, sizeof m);
  memcpy(&lib_free, &f, sizeof f);
  memcpy(&lib_sync, &s, sizeof s);
  dl_iterate_phdr(find_module, NULL);
  CHECK(found);
  printf("   static TLS of the library: %zu bytes\n", tls_size);
  CHECK(tls_size <= 512);
  pair(NULL);
  pthread_t t;
  if (CHECK(pthread_create(&t, NULL, pair, NULL) == 0))
    pthread_join(t, NULL);
  /* Not closed: the library keeps its default pools until the process
   * ends, as a loaded allocator does (PyTorch never unloads one). */
  return check_done();
}
