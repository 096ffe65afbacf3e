/* Memory of the emulated device: virtual reservations made with mmap, each
 * backed by a memfd whose 2 MiB pieces are its physical chunks, capacity
 * accounting per location, the access checks of stream memory work, and
 * reservations that map another process's memfd (sharing between
 * processes). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "platform/host/host_internal.h"

#define GRAN TP__HOST_GRANULARITY

typedef struct granule {
  tp__phys phys;  /* the chunk mapped here; 0 when unmapped */
  uint32_t read;  /* one bit per access location, see tp__host_location_index */
  uint32_t write; /* likewise */
} granule;

typedef struct chunk {
  uint32_t maps;      /* mappings of the chunk in its reservation */
  uint32_t next_free; /* the free list: index + 1 of the next, 0 ends it */
  bool live;
  bool released; /* released while mapped: freed at its last unmap */
} chunk;

struct tp__pres {
  uintptr_t base;
  size_t size;
  int fd;
  int account;
  unsigned handle_types;
  /* Maps another process's memfd: its chunks are that process's memory,
   * never charged, punched or reused here. */
  bool imported;
  /* Map, unmap and set_access take it for writing; stream memory work holds
   * it for reading while it checks access and touches the memory, so that
   * what it checked stays true until it is done. */
  pthread_rwlock_t map_lock;
  granule *granules; /* under map_lock */
  size_t nmapped;    /* under map_lock */
  /* Taken after map_lock where both are needed. */
  pthread_mutex_t chunk_mu;
  chunk *chunks;
  uint32_t nchunks, chunk_cap;
  uint32_t free_head; /* freed chunks, reused first: index + 1, or 0 */
  off_t file_size;
};

/* Every reservation, sorted by base, so that stream memory work can find
 * the reservations a range touches. Memory work holds it for reading while
 * it runs, which keeps those reservations alive. */
static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;
static tp__pres **registry;
static uint32_t registry_n, registry_cap;

static bool charge(int account) {
  uint64_t cap = tp__host_capacity[account];
  _Atomic uint64_t *held = &tp__host_charged[account];
  uint64_t cur = atomic_load_explicit(held, memory_order_relaxed);
  do {
    if (cur > cap || cap - cur < GRAN)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      held, &cur, cur + GRAN, memory_order_relaxed, memory_order_relaxed));
  return true;
}

static void uncharge(int account) {
  atomic_fetch_sub_explicit(&tp__host_charged[account], GRAN,
                            memory_order_relaxed);
}

/* Makes a range inaccessible again while keeping it reserved: munmap would
 * give the addresses back to the process, where any later mmap could land. */
static bool protect_none(uintptr_t at, size_t len) {
  return mmap((void *)at, len, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
              0) != MAP_FAILED;
}

static bool range_ok(const tp__pres *r, size_t offset, size_t bytes) {
  return offset % GRAN == 0 && bytes % GRAN == 0 && bytes > 0 &&
         offset <= r->size && bytes <= r->size - offset;
}

/* ---- reservations ------------------------------------------------------ */

static tp__pres *res_alloc(size_t size, int account) {
  tp__pres *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->fd = -1;
  r->account = account;
  r->granules = calloc(size / GRAN, sizeof(granule));
  if (r->granules && pthread_rwlock_init(&r->map_lock, NULL) == 0) {
    if (pthread_mutex_init(&r->chunk_mu, NULL) == 0)
      return r;
    pthread_rwlock_destroy(&r->map_lock);
  }
  free(r->granules);
  free(r);
  return NULL;
}

/* Frees a reservation at any stage of its construction. */
static void res_free(tp__pres *r) {
  if (r->base)
    munmap((void *)r->base, r->size);
  if (r->fd >= 0)
    close(r->fd);
  pthread_mutex_destroy(&r->chunk_mu);
  pthread_rwlock_destroy(&r->map_lock);
  free(r->chunks);
  free(r->granules);
  free(r);
}

/* Reserves size + align bytes and trims both ends, which leaves an aligned
 * range of exactly `size`. */
static tp_error_t range_open(tp__pres *r, size_t size, size_t align) {
  size_t len = size + align;
  void *raw = mmap(NULL, len, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TP_RETURN_IF(raw == MAP_FAILED && errno == ENOMEM, TP_ERROR_OUT_OF_MEMORY);
  TP_RETURN_IF(raw == MAP_FAILED, tp__platform_fail(errno, "mmap"));
  uintptr_t start = (uintptr_t)raw;
  uintptr_t base = (uintptr_t)tp__align_up(start, align);
  uintptr_t end = base + size;
  if ((base > start && munmap(raw, base - start) != 0) ||
      (start + len > end && munmap((void *)end, start + len - end) != 0)) {
    int code = errno;
    munmap(raw, len);
    return tp__platform_fail(code, "munmap");
  }
  r->base = base;
  r->size = size;
  return TP_SUCCESS;
}

/* The range and the memfd behind it. */
static tp_error_t res_open(tp__pres *r, size_t size, size_t align) {
  TP_FORWARD(range_open(r, size, align));
  r->fd = memfd_create("tidepool", MFD_CLOEXEC);
  TP_RETURN_IF(r->fd < 0, tp__platform_fail(errno, "memfd_create"));
  TP_RETURN_IF(ftruncate(r->fd, (off_t)size) != 0,
               tp__platform_fail(errno, "ftruncate"));
  r->file_size = (off_t)size;
  return TP_SUCCESS;
}

/* The first reservation that ends after `addr`. */
static size_t registry_find(uintptr_t addr) {
  size_t lo = 0, hi = registry_n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (registry[mid]->base + registry[mid]->size <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static tp_error_t registry_add(tp__pres *r) {
  pthread_rwlock_wrlock(&registry_lock);
  bool room = TP_ARRAY_ROOM(registry, registry_n, registry_cap);
  if (room) {
    size_t i = registry_find(r->base);
    memmove(&registry[i + 1], &registry[i],
            (registry_n - i) * sizeof *registry);
    registry[i] = r;
    registry_n++;
  }
  pthread_rwlock_unlock(&registry_lock);
  return room ? TP_SUCCESS : TP_ERROR_OUT_OF_MEMORY;
}

/* Removes r itself: its range is still mapped, so no other reservation
 * can hold the same addresses meanwhile (the fuzzer's F-C: removed after
 * the munmap, the entry found could be a new reservation's). */
static void registry_remove(tp__pres *r) {
  pthread_rwlock_wrlock(&registry_lock);
  size_t i = registry_find(r->base);
  if (i < registry_n && registry[i] == r) {
    memmove(&registry[i], &registry[i + 1],
            (registry_n - i - 1) * sizeof *registry);
    registry_n--;
  }
  pthread_rwlock_unlock(&registry_lock);
}

tp_error_t tp__host_reserve(const tp__mem_kind *kind, size_t size, size_t align,
                            tp__pres **res, uintptr_t *base) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_MEMORY),
               TP_ERROR_OUT_OF_MEMORY);
  TP_RETURN_IF(!res || !base, TP_ERROR_INVALID_VALUE);
  int account;
  TP_FORWARD(tp__host_account_of(kind, &account));
  align = align ? align : GRAN;
  TP_RETURN_IF(size == 0 || size % GRAN || align % GRAN ||
                   (align & (align - 1)),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(size > SIZE_MAX - align, TP_ERROR_OUT_OF_MEMORY);
  tp__pres *r = res_alloc(size, account);
  TP_RETURN_IF(!r, TP_ERROR_OUT_OF_MEMORY);
  tp_error_t err = res_open(r, size, align);
  if (err == TP_SUCCESS)
    err = registry_add(r);
  if (err != TP_SUCCESS) {
    res_free(r);
    return err;
  }
  r->handle_types = kind->handle_types;
  atomic_fetch_add(&tp__host_counted.reservations, 1);
  *res = r;
  *base = r->base;
  return TP_SUCCESS;
}

/* Chunks still alive go with the memfd, so their capacity is given back
 * (an imported reservation's chunks were never charged here). */
tp_error_t tp__host_unreserve(tp__pres *res) {
  TP_RETURN_IF(!res, TP_ERROR_INVALID_VALUE);
  pthread_rwlock_rdlock(&res->map_lock);
  size_t mapped = res->nmapped;
  pthread_rwlock_unlock(&res->map_lock);
  TP_RETURN_IF(mapped, TP_ERROR_INVALID_VALUE);
  registry_remove(res);
  if (munmap((void *)res->base, res->size) != 0) {
    int e = errno;
    /* The range stays reserved, and so stays known. */
    (void)registry_add(res);
    return tp__platform_fail(e, "munmap");
  }
  res->base = 0;
  for (uint32_t i = 0; i < res->nchunks && !res->imported; i++) {
    if (res->chunks[i].live) {
      uncharge(res->account);
      atomic_fetch_sub(&tp__host_counted.chunks, 1);
    }
  }
  /* Linux frees the descriptor even when close reports an error, so
   * res_free's close cannot leave anything behind to retry. */
  res_free(res);
  atomic_fetch_sub(&tp__host_counted.reservations, 1);
  return TP_SUCCESS;
}

int tp__host_res_fd(tp__pres *res) {
  return res->fd;
}

/* ---- chunks -------------------------------------------------------------
 * Chunk k (tp__phys k + 1) is the piece of the memfd at k times the
 * granularity. The memfd is sparse: only chunks written to hold memory. */

/* Makes room for one more chunk index, growing the memfd when the chunks
 * outnumber the granules of the reservation. Under chunk_mu. */
static tp_error_t chunk_grow(tp__pres *r) {
  TP_RETURN_IF(!TP_ARRAY_ROOM(r->chunks, r->nchunks, r->chunk_cap),
               TP_ERROR_OUT_OF_MEMORY);
  off_t need = (off_t)(((size_t)r->nchunks + 1) * GRAN);
  if (need > r->file_size) {
    off_t size = 2 * r->file_size > need ? 2 * r->file_size : need;
    TP_RETURN_IF(ftruncate(r->fd, size) != 0,
                 tp__platform_fail(errno, "ftruncate"));
    r->file_size = size;
  }
  return TP_SUCCESS;
}

/* Under chunk_mu. */
static tp_error_t chunk_take(tp__pres *r, size_t *index) {
  TP_RETURN_IF(!charge(r->account), TP_ERROR_OUT_OF_MEMORY);
  if (r->free_head) {
    *index = r->free_head - 1;
    r->free_head = r->chunks[*index].next_free;
  } else {
    tp_error_t err = chunk_grow(r);
    if (err != TP_SUCCESS) {
      uncharge(r->account);
      return err;
    }
    *index = r->nchunks++;
  }
  r->chunks[*index] = (chunk){.live = true};
  return TP_SUCCESS;
}

/* Punches the chunk out of the memfd, so that its memory really goes back
 * to the system, and makes its index reusable. An imported chunk is only
 * forgotten: its memory is the exporter's. Under chunk_mu. */
static tp_error_t chunk_free(tp__pres *r, size_t index) {
  if (r->imported) {
    r->chunks[index] = (chunk){0};
    return TP_SUCCESS;
  }
  TP_RETURN_IF(fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         (off_t)(index * GRAN), (off_t)GRAN) != 0,
               tp__platform_fail(errno, "fallocate"));
  r->chunks[index] = (chunk){.next_free = r->free_head};
  r->free_head = (uint32_t)index + 1;
  uncharge(r->account);
  atomic_fetch_sub(&tp__host_counted.chunks, 1);
  return TP_SUCCESS;
}

/* The live, unreleased chunk `phys` names, or NULL. Under chunk_mu. */
static chunk *chunk_of(tp__pres *r, tp__phys phys) {
  if (phys == 0 || phys > r->nchunks)
    return NULL;
  chunk *c = &r->chunks[phys - 1];
  return c->live && !c->released ? c : NULL;
}

tp_error_t tp__host_chunk_create(tp__pres *res, tp__phys *phys) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_MEMORY),
               TP_ERROR_OUT_OF_MEMORY);
  TP_RETURN_IF(!res || !phys || res->imported, TP_ERROR_INVALID_VALUE);
  size_t index = 0;
  pthread_mutex_lock(&res->chunk_mu);
  tp_error_t err = chunk_take(res, &index);
  pthread_mutex_unlock(&res->chunk_mu);
  TP_FORWARD(err);
  atomic_fetch_add(&tp__host_counted.chunks, 1);
  *phys = (tp__phys)index + 1;
  return TP_SUCCESS;
}

/* As the driver's cuMemRelease: a chunk still mapped is freed when its last
 * mapping goes. */
tp_error_t tp__host_chunk_release(tp__pres *res, tp__phys phys) {
  TP_RETURN_IF(!res, TP_ERROR_INVALID_VALUE);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&res->chunk_mu);
  chunk *c = chunk_of(res, phys);
  if (!c)
    err = TP_ERROR_INVALID_VALUE;
  else if (c->maps)
    c->released = true;
  else
    err = chunk_free(res, phys - 1);
  pthread_mutex_unlock(&res->chunk_mu);
  return err;
}

/* ---- mappings and access ----------------------------------------------- */

/* Under map_lock (write) and chunk_mu. */
static tp_error_t map_locked(tp__pres *r, size_t offset, const tp__phys *phys,
                             size_t n) {
  granule *g = &r->granules[offset / GRAN];
  for (size_t i = 0; i < n; i++)
    TP_RETURN_IF(g[i].phys || !chunk_of(r, phys[i]), TP_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < n; i++) {
    void *at = (void *)(r->base + offset + i * GRAN);
    if (mmap(at, GRAN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, r->fd,
             (off_t)((phys[i] - 1) * GRAN)) == MAP_FAILED) {
      int code = errno;
      /* Were the undo to fail too, the table still says unmapped and the
       * next map or unreserve replaces what is left. */
      if (i)
        protect_none(r->base + offset, i * GRAN);
      /* The kernel's limit on mappings (or its memory) is the device's
       * memory running out, as a driver would say. */
      TP_RETURN_IF(code == ENOMEM, TP_ERROR_OUT_OF_MEMORY);
      return tp__platform_fail(code, "mmap");
    }
  }
  for (size_t i = 0; i < n; i++) {
    g[i] = (granule){.phys = phys[i]};
    r->chunks[phys[i] - 1].maps++;
  }
  r->nmapped += n;
  atomic_fetch_add(&tp__host_counted.mapped_chunks, n);
  return TP_SUCCESS;
}

tp_error_t tp__host_map(tp__pres *res, size_t offset, const tp__phys *phys,
                        size_t n) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_MEMORY),
               tp__host_fault_fail());
  TP_RETURN_IF(!res || !phys || n > SIZE_MAX / GRAN, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!range_ok(res, offset, n * GRAN), TP_ERROR_INVALID_VALUE);
  pthread_rwlock_wrlock(&res->map_lock);
  pthread_mutex_lock(&res->chunk_mu);
  tp_error_t err = map_locked(res, offset, phys, n);
  pthread_mutex_unlock(&res->chunk_mu);
  pthread_rwlock_unlock(&res->map_lock);
  return err;
}

/* Under map_lock (write) and chunk_mu. */
static tp_error_t unmap_locked(tp__pres *r, size_t offset, size_t n) {
  granule *g = &r->granules[offset / GRAN];
  for (size_t i = 0; i < n; i++)
    TP_RETURN_IF(!g[i].phys, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!protect_none(r->base + offset, n * GRAN),
               tp__platform_fail(errno, "mmap"));
  for (size_t i = 0; i < n; i++) {
    size_t index = g[i].phys - 1;
    chunk *c = &r->chunks[index];
    /* A chunk whose deferred free fails stays charged and is never reused,
     * which keeps the accounting honest; unreserve gives it back. */
    if (--c->maps == 0 && c->released)
      (void)chunk_free(r, index);
    g[i] = (granule){0};
  }
  r->nmapped -= n;
  atomic_fetch_sub(&tp__host_counted.mapped_chunks, n);
  return TP_SUCCESS;
}

tp_error_t tp__host_unmap(tp__pres *res, size_t offset, size_t n) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_MEMORY),
               tp__host_fault_fail());
  TP_RETURN_IF(!res || n > SIZE_MAX / GRAN, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!range_ok(res, offset, n * GRAN), TP_ERROR_INVALID_VALUE);
  pthread_rwlock_wrlock(&res->map_lock);
  pthread_mutex_lock(&res->chunk_mu);
  tp_error_t err = unmap_locked(res, offset, n);
  pthread_mutex_unlock(&res->chunk_mu);
  pthread_rwlock_unlock(&res->map_lock);
  return err;
}

tp_error_t tp__host_set_access(tp__pres *res, size_t offset, size_t size,
                               const tp_access_desc_t *list, size_t count) {
  TP_RETURN_IF(tp__host_fault_fires(TP__HOST_FAULT_MEMORY),
               tp__host_fault_fail());
  TP_RETURN_IF(!res || (count && !list), TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!range_ok(res, offset, size), TP_ERROR_INVALID_VALUE);
  /* Every descriptor is checked before any is applied; a location listed
   * twice takes its last flags. */
  uint32_t listed = 0, read = 0, write = 0;
  for (size_t i = 0; i < count; i++) {
    unsigned bit;
    TP_FORWARD(tp__host_location_index(&list[i].location, &bit));
    tp_access_flags_t flags = list[i].flags;
    TP_RETURN_IF(flags != TP_ACCESS_NONE && flags != TP_ACCESS_READ &&
                     flags != TP_ACCESS_READ_WRITE,
                 TP_ERROR_INVALID_VALUE);
    uint32_t b = (uint32_t)1 << bit;
    listed |= b;
    read = (read & ~b) | (flags & TP_ACCESS_READ ? b : 0);
    write = (write & ~b) | (flags == TP_ACCESS_READ_WRITE ? b : 0);
  }
  granule *g = &res->granules[offset / GRAN];
  size_t n = size / GRAN;
  tp_error_t err = TP_SUCCESS;
  pthread_rwlock_wrlock(&res->map_lock);
  for (size_t i = 0; i < n && err == TP_SUCCESS; i++)
    if (!g[i].phys)
      err = TP_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n && err == TP_SUCCESS; i++) {
    g[i].read = (g[i].read & ~listed) | read;
    g[i].write = (g[i].write & ~listed) | write;
  }
  pthread_rwlock_unlock(&res->map_lock);
  return err;
}

/* ---- stream memory work -------------------------------------------------- */

/* The reservations [lo, hi) of the registry that a range touches. */
typedef struct span {
  size_t lo, hi;
} span;

static span registry_span(uintptr_t addr, size_t size) {
  span s = {registry_find(addr), 0};
  s.hi = s.lo;
  while (s.hi < registry_n && registry[s.hi]->base < addr + size)
    s.hi++;
  return s;
}

static bool in_span(span s, size_t i) {
  return i >= s.lo && i < s.hi;
}

/* Under the reservation's map_lock. */
static bool granted(const tp__pres *r, uintptr_t addr, size_t size,
                    uint32_t bit, bool write) {
  uintptr_t lo = addr > r->base ? addr : r->base;
  uintptr_t hi =
      addr + size < r->base + r->size ? addr + size : r->base + r->size;
  for (size_t i = (lo - r->base) / GRAN; i <= (hi - 1 - r->base) / GRAN; i++) {
    const granule *g = &r->granules[i];
    if (!g->phys || !((write ? g->write : g->read) & bit))
      return false;
  }
  return true;
}

/* Whether the reservations of span `s` hold all of [addr, addr + size). */
static bool covered(span s, uintptr_t addr, size_t size) {
  uintptr_t at = addr;
  for (size_t i = s.lo; i < s.hi && at < addr + size; i++) {
    if (registry[i]->base > at)
      return false;
    at = registry[i]->base + registry[i]->size;
  }
  return at >= addr + size;
}

/* Copies or fills memory that no reservation holds (a host buffer, or an
 * address the process does not have) through the kernel, which answers
 * EFAULT for what is not there, so that a wild address faults the stream
 * instead of killing the process in a worker thread. Where the kernel
 * refuses the call itself (a sandbox that filters it), the memory is
 * touched directly, as before. */
static bool kernel_run(void *dst, const void *src, int value, size_t size) {
  enum { PATTERN = 4096, IOVS = 256 };
  unsigned char pattern[PATTERN];
  struct iovec local[IOVS], remote;
  if (!src)
    memset(pattern, value, sizeof pattern);
  for (size_t done = 0; done < size;) {
    size_t n = 0, bytes = 0;
    if (src) {
      local[0] = (struct iovec){(void *)((uintptr_t)src + done), size - done};
      n = 1;
      bytes = size - done;
    } else {
      for (; n < IOVS && done + bytes < size; n++) {
        size_t k =
            size - done - bytes < PATTERN ? size - done - bytes : PATTERN;
        local[n] = (struct iovec){pattern, k};
        bytes += k;
      }
    }
    remote = (struct iovec){(void *)((uintptr_t)dst + done), bytes};
    ssize_t got = process_vm_writev(getpid(), local, n, &remote, 1, 0);
    if (got < 0 && (errno == ENOSYS || errno == EPERM)) {
      if (src)
        memmove((char *)dst + done, (const char *)src + done, size - done);
      else
        memset((char *)dst + done, value, size - done);
      return true;
    }
    if (got <= 0)
      return false;
    done += (size_t)got;
  }
  return true;
}

bool tp__host_mem_run(int device, void *dst, const void *src, int value,
                      size_t size) {
  if (size == 0)
    return true;
  uint32_t bit = (uint32_t)1 << device;
  pthread_rwlock_rdlock(&registry_lock);
  span d = registry_span((uintptr_t)dst, size);
  span s = src ? registry_span((uintptr_t)src, size) : (span){d.lo, d.lo};
  size_t lo = d.lo < s.lo ? d.lo : s.lo;
  size_t hi = d.hi > s.hi ? d.hi : s.hi;
  /* Each reservation is locked once, in address order, even when source
   * and destination share it: a second read lock could wait behind a
   * writer queued after the first. */
  for (size_t i = lo; i < hi; i++)
    if (in_span(d, i) || in_span(s, i))
      pthread_rwlock_rdlock(&registry[i]->map_lock);
  bool ok = true;
  for (size_t i = d.lo; i < d.hi && ok; i++)
    ok = granted(registry[i], (uintptr_t)dst, size, bit, true);
  for (size_t i = s.lo; i < s.hi && ok; i++)
    ok = granted(registry[i], (uintptr_t)src, size, bit, false);
  bool inside = covered(d, (uintptr_t)dst, size) &&
                (!src || covered(s, (uintptr_t)src, size));
  if (ok && !inside)
    ok = kernel_run(dst, src, value, size);
  else if (ok && src)
    memmove(dst, src, size);
  else if (ok)
    memset(dst, value, size);
  for (size_t i = lo; i < hi; i++)
    if (in_span(d, i) || in_span(s, i))
      pthread_rwlock_unlock(&registry[i]->map_lock);
  pthread_rwlock_unlock(&registry_lock);
  return ok;
}

/* ---- sharing between processes ------------------------------------------
 * The exporter sends its memfd once; chunk k of it is the piece at k times
 * the granularity in both processes, so a chunk travels as its offset. */

tp_error_t tp__host_share_reservation(tp__pres *res, int *fd) {
  TP_RETURN_IF(!res || !fd || res->imported ||
                   !(res->handle_types & TP_HANDLE_POSIX_FD),
               TP_ERROR_INVALID_VALUE);
  *fd = fcntl(res->fd, F_DUPFD_CLOEXEC, 0);
  TP_RETURN_IF(*fd < 0, tp__platform_fail(errno, "fcntl"));
  return TP_SUCCESS;
}

tp_error_t tp__host_share_chunk(tp__pres *res, tp__phys phys,
                                tp__chunk_share *share) {
  TP_RETURN_IF(!res || !share || res->imported, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!(res->handle_types & TP_HANDLE_POSIX_FD),
               TP_ERROR_NOT_SUPPORTED);
  pthread_mutex_lock(&res->chunk_mu);
  bool live = chunk_of(res, phys) != NULL;
  pthread_mutex_unlock(&res->chunk_mu);
  TP_RETURN_IF(!live, TP_ERROR_INVALID_VALUE);
  *share = (tp__chunk_share){.offset = (phys - 1) * GRAN, .fd = -1};
  return TP_SUCCESS;
}

tp_error_t tp__host_reserve_imported(const tp__mem_kind *kind, size_t size,
                                     size_t align, int fd, tp__pres **res,
                                     uintptr_t *base) {
  struct stat st;
  int account = 0;
  tp_error_t err = TP_SUCCESS;
  align = align ? align : GRAN;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !res || !base ||
      size == 0 || size % GRAN || align % GRAN || (align & (align - 1)) ||
      size > SIZE_MAX - align)
    err = TP_ERROR_INVALID_VALUE;
  if (err == TP_SUCCESS)
    err = tp__host_account_of(kind, &account);
  tp__pres *r = err == TP_SUCCESS ? res_alloc(size, account) : NULL;
  if (err == TP_SUCCESS && !r)
    err = TP_ERROR_OUT_OF_MEMORY;
  if (!r) {
    if (fd >= 0)
      close(fd);
    return err;
  }
  r->fd = fd;
  r->imported = true;
  err = range_open(r, size, align);
  if (err == TP_SUCCESS)
    err = registry_add(r);
  if (err != TP_SUCCESS) {
    res_free(r);
    return err;
  }
  atomic_fetch_add(&tp__host_counted.reservations, 1);
  *res = r;
  *base = r->base;
  return TP_SUCCESS;
}

tp_error_t tp__host_chunk_import(tp__pres *res, const tp__chunk_share *share,
                                 tp__phys *phys) {
  int fd = share ? share->fd : -1;
  if (fd >= 0)
    close(fd); /* chunks travel as offsets here, never as descriptors */
  TP_RETURN_IF(!res || !share || !phys || !res->imported || fd >= 0,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(share->offset % GRAN || share->offset / GRAN >= UINT32_MAX,
               TP_ERROR_INVALID_VALUE);
  /* A chunk past the end of the file would fault when touched, not when
   * mapped: refuse it now. */
  struct stat st;
  TP_RETURN_IF(fstat(res->fd, &st) != 0, tp__platform_fail(errno, "fstat"));
  TP_RETURN_IF(st.st_size < 0 || share->offset + GRAN > (uint64_t)st.st_size,
               TP_ERROR_INVALID_VALUE);
  size_t index = (size_t)(share->offset / GRAN);
  tp_error_t err = TP_SUCCESS;
  pthread_mutex_lock(&res->chunk_mu);
  while (err == TP_SUCCESS && res->nchunks <= index) {
    if (!TP_ARRAY_ROOM(res->chunks, res->nchunks, res->chunk_cap))
      err = TP_ERROR_OUT_OF_MEMORY;
    else
      res->chunks[res->nchunks++] = (chunk){0};
  }
  if (err == TP_SUCCESS && res->chunks[index].live)
    err = TP_ERROR_INVALID_VALUE; /* already imported */
  if (err == TP_SUCCESS)
    res->chunks[index] = (chunk){.live = true};
  pthread_mutex_unlock(&res->chunk_mu);
  TP_FORWARD(err);
  *phys = (tp__phys)index + 1;
  return TP_SUCCESS;
}
