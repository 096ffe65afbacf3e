/* The entry points for sharing pools between processes: the checks of the
 * seed's five IPC functions and the channel an exported pool hands out.
 * Mapping another process's chunks through that channel is issue 6's work;
 * until then the pointer functions answer NOT_SUPPORTED for IPC pools. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"

static tp_error_t check_type(tp_handle_type_t type, unsigned flags) {
  TP_RETURN_IF(flags != 0, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(type != TP_HANDLE_POSIX_FD && type != TP_HANDLE_FABRIC,
               TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

TP_API tp_error_t tp_pool_export_to_shareable_handle(void *handle,
                                                     tp_pool_t pool,
                                                     tp_handle_type_t type,
                                                     unsigned flags) {
  TP_RETURN_IF(!handle, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(check_type(type, flags));
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(p->imported || !(p->props.handle_types & (unsigned)type),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(type == TP_HANDLE_FABRIC, TP_ERROR_NOT_SUPPORTED);
  /* The exported descriptor is one end of a channel; the pool keeps the
   * other, over which chunk descriptors will travel to importers. */
  int sv[2];
  TP_RETURN_IF(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0,
               tp__platform_fail(errno, "socketpair"));
  pthread_mutex_lock(&p->lock);
  if (p->channel >= 0)
    close(p->channel);
  p->channel = sv[0];
  pthread_mutex_unlock(&p->lock);
  *(int *)handle = sv[1];
  return TP_SUCCESS;
}

TP_API tp_error_t tp_pool_import_from_shareable_handle(tp_pool_t *pool,
                                                       void *handle,
                                                       tp_handle_type_t type,
                                                       unsigned flags) {
  TP_RETURN_IF(!pool || !handle, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(check_type(type, flags));
  TP_RETURN_IF(type == TP_HANDLE_FABRIC, TP_ERROR_NOT_SUPPORTED);
  struct stat st;
  int fd = *(int *)handle;
  TP_RETURN_IF(fd < 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode),
               TP_ERROR_INVALID_VALUE);
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  TP_RETURN_IF(mine < 0, tp__platform_fail(errno, "fcntl"));
  tp_error_t err = tp__pool_new_imported(mine, pool);
  if (err != TP_SUCCESS)
    close(mine);
  return err;
}

/* The 64 bytes of an exported pointer: which pool (by the exporter's pid
 * and the pool's serial), where in it, how large, and a keyed check word so
 * that a corrupted or forged record is refused. */
typedef struct export_record {
  uint32_t magic;
  uint32_t version;
  uint64_t pid;
  uint64_t pool_serial;
  uint64_t offset;
  uint64_t size;
  uint64_t reserved[2];
  uint64_t check;
} export_record;
_Static_assert(sizeof(export_record) == sizeof(tp_pool_ptr_export_data_t),
               "an export record fills the driver's 64 bytes");
#define EXPORT_MAGIC 0x31787074u /* "tpx1" */

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t record_check(const export_record *r, uint64_t key) {
  const uint64_t *w = (const uint64_t *)r;
  uint64_t h = key;
  for (size_t i = 0; i < offsetof(export_record, check) / 8; i++)
    h = mix(h ^ w[i]);
  return h;
}

TP_API tp_error_t tp_pool_export_pointer(tp_pool_ptr_export_data_t *data,
                                         void *ptr) {
  TP_RETURN_IF(!data || !ptr, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  tp__pool *p = tp__registry_find((uintptr_t)ptr);
  TP_RETURN_IF(!p || !p->props.handle_types, TP_ERROR_INVALID_VALUE);
  size_t size = 0;
  TP_FORWARD(tp__pool_live_size(p, ptr, &size));
  export_record r = {.magic = EXPORT_MAGIC,
                     .version = 1,
                     .pid = (uint64_t)getpid(),
                     .pool_serial = p->serial,
                     .offset = (uint64_t)((uintptr_t)ptr - p->base),
                     .size = size};
  r.check = record_check(&r, p->export_key);
  memcpy(data, &r, sizeof r);
  return TP_SUCCESS;
}

/* Mapping the exporter's memory needs the channel of issue 6; until then a
 * well-formed record is answered NOT_SUPPORTED and anything else
 * INVALID_VALUE. */
TP_API tp_error_t tp_pool_import_pointer(void **ptr, tp_pool_t pool,
                                         tp_pool_ptr_export_data_t *data) {
  TP_RETURN_IF(!ptr || !data, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(!p->imported, TP_ERROR_INVALID_VALUE);
  export_record r;
  memcpy(&r, data, sizeof r);
  TP_RETURN_IF(r.magic != EXPORT_MAGIC || r.version != 1 || r.size == 0 ||
                   r.reserved[0] || r.reserved[1],
               TP_ERROR_INVALID_VALUE);
  return TP_ERROR_NOT_SUPPORTED;
}
