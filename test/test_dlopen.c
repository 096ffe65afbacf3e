/* The shared library loaded by dlopen after the program started, as
 * PyTorch's pluggable allocator and CuPy load it: it must load (its static
 * TLS comes out of glibc's small surplus for such libraries, so it must stay
 * small) and serve allocations on the loading thread and on a new one. A
 * dlclose leaves it loaded: a thread that used it may end afterwards, and
 * loading it again costs no thread, descriptor or reservation. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

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

/* Entries of a /proc/self directory: the process's threads or descriptors. */
static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Opens the library and finds the three entry points. */
static void *load(void) {
  void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(lib != NULL)) {
    printf("   dlopen: %s\n", dlerror());
    return NULL;
  }
  void *m = dlsym(lib, "tp_malloc_async"), *f = dlsym(lib, "tp_free_async"),
       *s = dlsym(lib, "tp_stream_synchronize");
  if (!CHECK(m && f && s)) {
    dlclose(lib);
    return NULL;
  }
  memcpy(&lib_malloc, &m, sizeof m);
  memcpy(&lib_free, &f, sizeof f);
  memcpy(&lib_sync, &s, sizeof s);
  return lib;
}

/* A thread that makes a pair, then waits for `go` before it ends: its
 * thread-exit work runs after the library was closed. */
static atomic_int go, paired;
static void *pair_then_wait(void *arg) {
  pair(arg);
  atomic_store(&paired, 1);
  while (!atomic_load(&go))
    usleep(1000);
  return NULL;
}

/* dlclose while a thread that used the library lives, the thread ending
 * after it (its thread-exit destructors were the library's: a crash in an
 * unmapped library before), then load, use and close again: the threads,
 * descriptors and the process's memory stay as they were after the first
 * load (each cycle left a worker thread, a descriptor and a reservation
 * of the default pool before). */
static void test_close_and_reload(void) {
  void *lib = load();
  if (!lib)
    return;
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, pair_then_wait, NULL) == 0))
    return;
  while (!atomic_load(&paired))
    usleep(1000);
  CHECK_EQ_INT(dlclose(lib), 0);
  atomic_store(&go, 1);
  pthread_join(t, NULL);
  int threads = count_entries("/proc/self/task");
  int fds = count_entries("/proc/self/fd");
  for (int cycle = 0; cycle < 8; cycle++) {
    lib = load();
    if (!lib)
      return;
    pair(NULL);
    pthread_t u;
    if (CHECK(pthread_create(&u, NULL, pair, NULL) == 0))
      pthread_join(u, NULL);
    CHECK_EQ_INT(dlclose(lib), 0);
  }
  CHECK_EQ_INT(count_entries("/proc/self/task"), threads);
  CHECK_EQ_INT(count_entries("/proc/self/fd"), fds);
}

int main(void) {
  lib_path = getenv("TIDEPOOL_LIB");
  if (!lib_path || !*lib_path)
    return check_skip("TIDEPOOL_LIB names no library");
  void *lib = load();
  if (!lib)
    return check_done();
  dl_iterate_phdr(find_module, NULL);
  CHECK(found);
  printf("   static TLS of the library: %zu bytes\n", tls_size);
  CHECK(tls_size <= 512);
  pair(NULL);
  pthread_t t;
  if (CHECK(pthread_create(&t, NULL, pair, NULL) == 0))
    pthread_join(t, NULL);
  /* The last handle of this program goes in the test below. */
  CHECK_EQ_INT(dlclose(lib), 0);
  test_close_and_reload();
  return check_done();
}
