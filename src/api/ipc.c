/* The entry points for sharing pools between processes: the seed's argument
 * checks of the five IPC functions (the driver's answers), then the core's
 * export and import (src/ipc/). */
#include <limits.h>
#include <sys/stat.h>

#include "api/api.h"
#include "common/guard.h"
#include "ipc/ipc.h"

static tp_error_t check_type(tp_handle_type_t type, unsigned flags) {
  TP_RETURN_IF(flags != 0, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(type != TP_HANDLE_POSIX_FD && type != TP_HANDLE_FABRIC,
               TP_ERROR_INVALID_VALUE);
  return TP_SUCCESS;
}

static tp_error_t export_handle(int *handle, tp_pool_t pool,
                                tp_handle_type_t type) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(p->imported || !(p->props.handle_types & (unsigned)type),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(type == TP_HANDLE_FABRIC, TP_ERROR_NOT_SUPPORTED);
  int fd = -1;
  TP_FORWARD(tp__ipc_export_handle(p, &fd));
  *handle = fd;
  return TP_SUCCESS;
}

/* Fabric handles would need a channel that crosses machines, where the
 * descriptor channel of posix-fd handles cannot go: no platform exports
 * pools through them yet. The calls below that reach a pool do so inside
 * the guard, as those of alloc.c and pools.c. */
TP_API tp_error_t tp_pool_export_to_shareable_handle(void *handle,
                                                     tp_pool_t pool,
                                                     tp_handle_type_t type,
                                                     unsigned flags) {
  TP_RETURN_IF(!handle, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(check_type(type, flags));
  return TP_GUARDED(export_handle(handle, pool, type));
}

/* As the driver's cuMemPoolImportFromShareableHandle, a posix descriptor
 * comes by value, cast to a pointer ((void *)(uintptr_t)fd): NULL is
 * descriptor 0, a valid one. */
TP_API tp_error_t tp_pool_import_from_shareable_handle(tp_pool_t *pool,
                                                       void *handle,
                                                       tp_handle_type_t type,
                                                       unsigned flags) {
  TP_RETURN_IF(!pool, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(check_type(type, flags));
  TP_RETURN_IF(type == TP_HANDLE_FABRIC, TP_ERROR_NOT_SUPPORTED);
  uintptr_t value = (uintptr_t)handle;
  TP_RETURN_IF(value > INT_MAX, TP_ERROR_INVALID_VALUE);
  int fd = (int)value;
  struct stat st;
  TP_RETURN_IF(fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode),
               TP_ERROR_INVALID_VALUE);
  return tp__ipc_import_pool(fd, pool);
}

static tp_error_t export_pointer(tp_pool_ptr_export_data_t *data, void *ptr) {
  tp__pool *p = tp__registry_find((uintptr_t)ptr);
  TP_RETURN_IF(!p || p->imported || !p->props.handle_types,
               TP_ERROR_INVALID_VALUE);
  return tp__ipc_export_pointer(p, ptr, data);
}

TP_API tp_error_t tp_pool_export_pointer(tp_pool_ptr_export_data_t *data,
                                         void *ptr) {
  TP_RETURN_IF(!data || !ptr, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(export_pointer(data, ptr));
}

static tp_error_t import_pointer(void **ptr, tp_pool_t pool,
                                 tp_pool_ptr_export_data_t *data) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(!p->imported, TP_ERROR_INVALID_VALUE);
  return tp__ipc_import_pointer(p, data, ptr);
}

TP_API tp_error_t tp_pool_import_pointer(void **ptr, tp_pool_t pool,
                                         tp_pool_ptr_export_data_t *data) {
  TP_RETURN_IF(!ptr || !data, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(import_pointer(ptr, pool, data));
}
