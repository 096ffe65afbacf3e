/* The allocator's enums and flags, from CUDA's values to tidepool's, shared
 * by the runtime-level and the driver-level layers: the runtime's enums are
 * the driver's, value for value, which the assertions below hold to. */
#include <cuda.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>

#include "preload.h"

_Static_assert((int)cudaMemLocationTypeDevice == CU_MEM_LOCATION_TYPE_DEVICE &&
                   (int)cudaMemLocationTypeHost == CU_MEM_LOCATION_TYPE_HOST &&
                   (int)cudaMemLocationTypeHostNuma ==
                       CU_MEM_LOCATION_TYPE_HOST_NUMA &&
                   (int)cudaMemLocationTypeHostNumaCurrent ==
                       CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
               "location types differ between the runtime and the driver");
_Static_assert((int)cudaMemAllocationTypePinned ==
                       CU_MEM_ALLOCATION_TYPE_PINNED &&
                   (int)cudaMemAllocationTypeManaged ==
                       CU_MEM_ALLOCATION_TYPE_MANAGED,
               "allocation types differ between the runtime and the driver");
_Static_assert((int)cudaMemHandleTypePosixFileDescriptor ==
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
                   (int)cudaMemHandleTypeFabric == CU_MEM_HANDLE_TYPE_FABRIC,
               "handle types differ between the runtime and the driver");
_Static_assert((int)cudaMemAccessFlagsProtRead ==
                       CU_MEM_ACCESS_FLAGS_PROT_READ &&
                   (int)cudaMemAccessFlagsProtReadWrite ==
                       CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
               "access flags differ between the runtime and the driver");
_Static_assert((int)cudaMemPoolReuseFollowEventDependencies ==
                       CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
                   (int)cudaMemPoolAttrUsedMemHigh ==
                       CU_MEMPOOL_ATTR_USED_MEM_HIGH,
               "pool attributes differ between the runtime and the driver");
_Static_assert(sizeof(struct cudaMemPoolPtrExportData) ==
                       sizeof(tp_pool_ptr_export_data_t) &&
                   sizeof(CUmemPoolPtrExportData) ==
                       sizeof(tp_pool_ptr_export_data_t),
               "the pointer export records differ in size");

bool tp__pl_location_in(int type, int id, tp_location_t *out) {
  *out = (tp_location_t){TP_LOCATION_INVALID, id, 0};
  switch (type) {
  case CU_MEM_LOCATION_TYPE_INVALID: out->type = TP_LOCATION_INVALID; break;
  case CU_MEM_LOCATION_TYPE_DEVICE: out->type = TP_LOCATION_DEVICE; break;
  case CU_MEM_LOCATION_TYPE_HOST: out->type = TP_LOCATION_HOST; break;
  case CU_MEM_LOCATION_TYPE_HOST_NUMA: out->type = TP_LOCATION_HOST_NUMA; break;
  case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
    out->type = TP_LOCATION_HOST_NUMA_CURRENT;
    break;
  default: return false;
  }
  return true;
}

bool tp__pl_alloc_type_in(int type, tp_allocation_type_t *out) {
  switch (type) {
  case CU_MEM_ALLOCATION_TYPE_INVALID: *out = TP_ALLOCATION_INVALID; break;
  case CU_MEM_ALLOCATION_TYPE_PINNED: *out = TP_ALLOCATION_PINNED; break;
  case CU_MEM_ALLOCATION_TYPE_MANAGED: *out = TP_ALLOCATION_MANAGED; break;
  default: return false;
  }
  return true;
}

bool tp__pl_handle_types_in(unsigned bits, unsigned *out) {
  *out = 0;
  if (bits & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    *out |= TP_HANDLE_POSIX_FD;
  if (bits & CU_MEM_HANDLE_TYPE_FABRIC)
    *out |= TP_HANDLE_FABRIC;
  return (bits & ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                             CU_MEM_HANDLE_TYPE_FABRIC)) == 0;
}

tp_handle_type_t tp__pl_handle_type_in(int type) {
  switch (type) {
  case CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: return TP_HANDLE_POSIX_FD;
  case CU_MEM_HANDLE_TYPE_FABRIC: return TP_HANDLE_FABRIC;
  default: return TP_HANDLE_NONE;
  }
}

bool tp__pl_import_foreign(const void *handle, int type) {
  intptr_t v = (intptr_t)handle;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || v < 0 ||
      v > INT_MAX || tp__pl_host_requested() || fcntl((int)v, F_GETFD) < 0)
    return false;
  int st = 0;
  socklen_t len = sizeof st;
  return getsockopt((int)v, SOL_SOCKET, SO_TYPE, &st, &len) != 0 ||
         st != SOCK_SEQPACKET;
}

bool tp__pl_access_in(int flags, tp_access_flags_t *out) {
  switch (flags) {
  case CU_MEM_ACCESS_FLAGS_PROT_NONE: *out = TP_ACCESS_NONE; break;
  case CU_MEM_ACCESS_FLAGS_PROT_READ: *out = TP_ACCESS_READ; break;
  case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: *out = TP_ACCESS_READ_WRITE; break;
  default: return false;
  }
  return true;
}

int tp__pl_access_out(tp_access_flags_t flags) {
  switch (flags) {
  case TP_ACCESS_READ: return CU_MEM_ACCESS_FLAGS_PROT_READ;
  case TP_ACCESS_READ_WRITE: return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  case TP_ACCESS_NONE: break;
  }
  return CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

bool tp__pl_attr_in(int attr, tp_pool_attr_t *out) {
  switch (attr) {
  case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    *out = TP_POOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
    break;
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    *out = TP_POOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC;
    break;
  case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    *out = TP_POOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
    break;
  case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    *out = TP_POOL_ATTR_RELEASE_THRESHOLD;
    break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    *out = TP_POOL_ATTR_RESERVED_MEM_CURRENT;
    break;
  case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    *out = TP_POOL_ATTR_RESERVED_MEM_HIGH;
    break;
  case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    *out = TP_POOL_ATTR_USED_MEM_CURRENT;
    break;
  case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *out = TP_POOL_ATTR_USED_MEM_HIGH; break;
  default: return false;
  }
  return true;
}
