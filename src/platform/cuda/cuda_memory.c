/* Memory of the cuda platform, on the driver's virtual memory management:
 * kinds of memory and their granularity, reservations of virtual ranges,
 * physical chunks, mapping them with access rights, and chunks shared with
 * other processes as posix file descriptors. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "platform/cuda/cuda_internal.h"

/* A reservation remembers what its chunks are made of, so that every chunk
 * created for it has the same properties and granularity. */
struct tp__pres {
  CUdeviceptr base;
  size_t size;
  size_t gran;
  tp__mem_kind kind;
  CUmemAllocationProp prop;
  int ctx_device;   /* the device whose context the calls run in, or -1 */
  bool host_backed; /* a managed kind made of pinned host chunks */
};

/* Whether the driver creates managed VMM chunks at non-device locations;
 * per device, the answer is in the device's state. Same encoding. */
static atomic_int managed_elsewhere;

/* Whether cuMemUnmap takes a range made of several separate mappings.
 * cuda.h says only that a range may not cut a mapping, and the H200
 * measurements of docs/design.md unmapped 64 chunks in one call. One call is
 * made until a driver refuses it; from then on, one call per chunk. */
static atomic_int unmap_spans = 1;

static bool numa_node_exists(int id) {
  char path[64];
  if (access("/sys/devices/system/node", F_OK) != 0)
    return id == 0; /* no NUMA: the driver takes node 0 for the host */
  snprintf(path, sizeof path, "/sys/devices/system/node/node%d", id);
  return access(path, F_OK) == 0;
}

/* Translates a kind into the driver's allocation properties and the device
 * whose context its calls should run in (-1: any). */
static tp_error_t kind_prop(const tp__mem_kind *kind, CUmemAllocationProp *prop,
                            int *ctx_device) {
  *prop = (CUmemAllocationProp){0};
  *ctx_device = -1;
  switch (kind->type) {
  case TP_ALLOCATION_PINNED: prop->type = CU_MEM_ALLOCATION_TYPE_PINNED; break;
  case TP_ALLOCATION_MANAGED:
    prop->type = CU_MEM_ALLOCATION_TYPE_MANAGED;
    break;
  default: return TP_ERROR_INVALID_VALUE;
  }
  const tp_location_t *loc = &kind->location;
  switch (loc->type) {
  case TP_LOCATION_DEVICE:
    TP_RETURN_IF(loc->id < 0 || loc->id >= tp__cu_device_count,
                 TP_ERROR_INVALID_DEVICE);
    prop->location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, loc->id};
    *ctx_device = loc->id;
    break;
  case TP_LOCATION_HOST:
    prop->location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
    break;
  case TP_LOCATION_HOST_NUMA:
    TP_RETURN_IF(loc->id < 0 || !numa_node_exists(loc->id),
                 TP_ERROR_INVALID_DEVICE);
    prop->location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, loc->id};
    break;
  case TP_LOCATION_NONE:
    TP_RETURN_IF(kind->type != TP_ALLOCATION_MANAGED, TP_ERROR_INVALID_VALUE);
    prop->location = (CUmemLocation){CU_MEM_LOCATION_TYPE_NONE, 0};
    break;
  default: return TP_ERROR_INVALID_VALUE;
  }
  /* tp_handle_type_t's bits are the driver's CUmemAllocationHandleType
   * bits for the two types tidepool knows (asserted below). */
  TP_RETURN_IF(kind->handle_types &
                   ~(unsigned)(TP_HANDLE_POSIX_FD | TP_HANDLE_FABRIC),
               TP_ERROR_NOT_SUPPORTED);
  prop->requestedHandleTypes = (CUmemAllocationHandleType)kind->handle_types;
  return TP_SUCCESS;
}

_Static_assert((int)TP_HANDLE_POSIX_FD ==
                       (int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
                   (int)TP_HANDLE_FABRIC == (int)CU_MEM_HANDLE_TYPE_FABRIC,
               "handle type bits differ from the driver's");

/* Memory calls run in relaxed capture mode (see tp__cu_scope_relax): a
 * pool that grows, or graph memory mapped during a capture, must not cost
 * the application its capture. */
static tp_error_t scope_for(int ctx_device, tp__cu_scope *scope) {
  if (ctx_device < 0) {
    TP_FORWARD(tp__cu_scope_enter_any(scope));
  } else {
    tp__cu_dev *d;
    TP_FORWARD(tp__cu_dev_get(ctx_device, &d));
    TP_FORWARD(tp__cu_scope_enter(d, scope));
  }
  tp__cu_scope_relax(scope);
  return TP_SUCCESS;
}

/* A device attribute that must be non-zero for the kind to work. */
static tp_error_t require(int device, CUdevice_attribute attr) {
  int v = 0;
  CUresult r = tp__cu.cuDeviceGetAttribute(&v, attr, tp__cu_devs[device].dev);
  return r == CUDA_SUCCESS && v ? TP_SUCCESS : TP_ERROR_NOT_SUPPORTED;
}

/* Checks what the driver's attributes say of the kind before asking it
 * for memory: unsupported handle types and locations are NOT_SUPPORTED. */
static tp_error_t kind_supported(const tp__mem_kind *kind) {
  unsigned handles = kind->handle_types;
  switch (kind->location.type) {
  case TP_LOCATION_DEVICE: {
    int dev = kind->location.id;
    TP_FORWARD(
        require(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED));
    if (handles & TP_HANDLE_POSIX_FD)
      TP_FORWARD(require(
          dev,
          CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
    if (handles & TP_HANDLE_FABRIC)
      TP_FORWARD(
          require(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED));
    return TP_SUCCESS;
  }
  case TP_LOCATION_HOST:
    /* The driver refuses every handle type for host-location chunks. */
    TP_RETURN_IF(handles != 0, TP_ERROR_NOT_SUPPORTED);
    return require(
        0, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  case TP_LOCATION_HOST_NUMA:
    /* Fabric export of host memory is left out until a machine with IMEX
     * can show how it behaves. */
    TP_RETURN_IF(handles & TP_HANDLE_FABRIC, TP_ERROR_NOT_SUPPORTED);
    return require(
        0, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  default:
    TP_RETURN_IF(handles != 0, TP_ERROR_NOT_SUPPORTED);
    return TP_SUCCESS;
  }
}

/* The driver's granularity of a kind; a kind the driver refuses is not
 * supported here. */
static tp_error_t granularity(const CUmemAllocationProp *prop, int ctx_device,
                              size_t *gran) {
  tp__cu_scope scope;
  TP_FORWARD(scope_for(ctx_device, &scope));
  CUresult r = tp__cu.cuMemGetAllocationGranularity(
      gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  tp__cu_scope_leave(&scope);
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED)
    return TP_ERROR_NOT_SUPPORTED;
  return tp__cu_error(r);
}

/* cuda.h documents CU_MEM_ALLOCATION_TYPE_MANAGED for memory pools only,
 * never for cuMemCreate. Rather than guess, the driver is asked once per
 * location with a real chunk: where it makes one, managed pools are built
 * of such chunks; where it refuses, managed kinds are NOT_SUPPORTED. */
static tp_error_t probe_managed(const CUmemAllocationProp *prop, int ctx_device,
                                size_t gran) {
  atomic_int *known =
      ctx_device >= 0 ? &tp__cu_devs[ctx_device].managed : &managed_elsewhere;
  int answer = atomic_load_explicit(known, memory_order_relaxed);
  if (answer)
    return answer > 0 ? TP_SUCCESS : TP_ERROR_NOT_SUPPORTED;
  tp__cu_scope scope;
  TP_FORWARD(scope_for(ctx_device, &scope));
  CUmemGenericAllocationHandle h = 0;
  CUresult r = tp__cu.cuMemCreate(&h, gran, prop, 0);
  if (r == CUDA_SUCCESS)
    r = tp__cu.cuMemRelease(h);
  tp__cu_scope_leave(&scope);
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
    atomic_store_explicit(known, -1, memory_order_relaxed);
    return TP_ERROR_NOT_SUPPORTED;
  }
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  atomic_store_explicit(known, 1, memory_order_relaxed);
  return TP_SUCCESS;
}

/* Managed memory as the driver's VMM cannot make it (it refuses
 * CU_MEM_ALLOCATION_TYPE_MANAGED in cuMemCreate, seen on the H200 with
 * driver 580): chunks of pinned host memory, mapped for the host and every
 * device. They are reachable from everywhere, as managed memory is, but
 * never migrate to a device. */
static tp_error_t resolve_managed(const tp__mem_kind *kind,
                                  CUmemAllocationProp *prop, int ctx_device,
                                  size_t *gran, bool *host_backed) {
  *host_backed = false;
  if (kind->type != TP_ALLOCATION_MANAGED)
    return TP_SUCCESS;
  tp_error_t err = probe_managed(prop, ctx_device, *gran);
  if (err != TP_ERROR_NOT_SUPPORTED)
    return err;
  CUmemAllocationProp host = *prop;
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
  TP_FORWARD(
      require(0, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED));
  TP_FORWARD(granularity(&host, ctx_device, gran));
  *prop = host;
  *host_backed = true;
  return TP_SUCCESS;
}

static uint64_t host_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

tp_error_t tp__cu_mem_query(const tp__mem_kind *kind, size_t *gran_out,
                            uint64_t *capacity) {
  CUmemAllocationProp prop;
  int ctx_device;
  TP_FORWARD(kind_prop(kind, &prop, &ctx_device));
  TP_FORWARD(kind_supported(kind));
  size_t gran = 0;
  TP_FORWARD(granularity(&prop, ctx_device, &gran));
  TP_RETURN_IF(gran == 0 || (gran & (gran - 1)) != 0, TP_ERROR_NOT_SUPPORTED);
  bool host_backed = false;
  TP_FORWARD(resolve_managed(kind, &prop, ctx_device, &gran, &host_backed));
  TP_RETURN_IF(gran == 0 || (gran & (gran - 1)) != 0, TP_ERROR_NOT_SUPPORTED);
  uint64_t cap = host_memory();
  if (kind->location.type == TP_LOCATION_DEVICE && !host_backed) {
    size_t total = 0;
    CUresult r = tp__cu.cuDeviceTotalMem(&total, tp__cu_devs[ctx_device].dev);
    TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
    cap = total;
  }
  *gran_out = gran;
  *capacity = cap;
  return TP_SUCCESS;
}

tp_error_t tp__cu_reserve(const tp__mem_kind *kind, size_t size, size_t align,
                          tp__pres **res_out, uintptr_t *base) {
  tp__pres *res = calloc(1, sizeof *res);
  TP_RETURN_IF(!res, TP_ERROR_OUT_OF_MEMORY);
  res->kind = *kind;
  tp_error_t err = kind_prop(kind, &res->prop, &res->ctx_device);
  if (err == TP_SUCCESS)
    err = granularity(&res->prop, res->ctx_device, &res->gran);
  if (err == TP_SUCCESS)
    err = resolve_managed(kind, &res->prop, res->ctx_device, &res->gran,
                          &res->host_backed);
  /* The driver wants a power-of-two alignment; the contract only promises
   * a multiple of the granularity. */
  if (err == TP_SUCCESS && (size == 0 || size % res->gran ||
                            align % res->gran || (align & (align - 1))))
    err = TP_ERROR_INVALID_VALUE;
  tp__cu_scope scope;
  if (err == TP_SUCCESS)
    err = scope_for(res->ctx_device, &scope);
  if (err != TP_SUCCESS) {
    free(res);
    return err;
  }
  CUresult r = tp__cu.cuMemAddressReserve(&res->base, size, align, 0, 0);
  tp__cu_scope_leave(&scope);
  if (r != CUDA_SUCCESS) {
    free(res);
    /* The arguments were checked above, so a refusal means the address
     * space has no such range left. */
    return r == CUDA_ERROR_INVALID_VALUE ? TP_ERROR_OUT_OF_MEMORY
                                         : tp__cu_error(r);
  }
  res->size = size;
  *res_out = res;
  *base = (uintptr_t)res->base;
  return TP_SUCCESS;
}

tp_error_t tp__cu_unreserve(tp__pres *res) {
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  CUresult r = tp__cu.cuMemAddressFree(res->base, res->size);
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  free(res);
  return TP_SUCCESS;
}

tp_error_t tp__cu_chunk_create(tp__pres *res, tp__phys *phys) {
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  CUmemGenericAllocationHandle h = 0;
  CUresult r = tp__cu.cuMemCreate(&h, res->gran, &res->prop, 0);
  tp__cu_scope_leave(&scope);
  /* A device may report fabric handles yet refuse them when the machine
   * grants no IMEX channel: that is the platform lacking the type. */
  if ((res->kind.handle_types & TP_HANDLE_FABRIC) &&
      (r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED))
    return TP_ERROR_NOT_SUPPORTED;
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  TP_RETURN_IF(h == 0, tp__platform_fail(0, "cuMemCreate returned handle 0"));
  *phys = (tp__phys)h;
  return TP_SUCCESS;
}

tp_error_t tp__cu_chunk_release(tp__pres *res, tp__phys phys) {
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  CUresult r = tp__cu.cuMemRelease((CUmemGenericAllocationHandle)phys);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

/* Whether n granules from offset lie inside the reservation. */
static bool in_range(const tp__pres *res, size_t offset, size_t n) {
  return offset % res->gran == 0 && offset <= res->size &&
         n <= (res->size - offset) / res->gran;
}

static CUresult unmap_each(const tp__pres *res, size_t offset, size_t n) {
  CUresult first = CUDA_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    CUresult r =
        tp__cu.cuMemUnmap(res->base + offset + i * res->gran, res->gran);
    if (first == CUDA_SUCCESS)
      first = r;
  }
  return first;
}

tp_error_t tp__cu_map(tp__pres *res, size_t offset, const tp__phys *phys,
                      size_t n) {
  TP_RETURN_IF(!in_range(res, offset, n), TP_ERROR_INVALID_VALUE);
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  CUresult r = CUDA_SUCCESS;
  size_t mapped = 0;
  while (mapped < n) {
    r = tp__cu.cuMemMap(res->base + offset + mapped * res->gran, res->gran, 0,
                        (CUmemGenericAllocationHandle)phys[mapped], 0);
    if (r != CUDA_SUCCESS)
      break;
    mapped++;
  }
  /* All or nothing: the chunks mapped before the failure go again. */
  if (r != CUDA_SUCCESS)
    (void)unmap_each(res, offset, mapped);
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

tp_error_t tp__cu_unmap(tp__pres *res, size_t offset, size_t n) {
  TP_RETURN_IF(!in_range(res, offset, n), TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(n == 0, TP_SUCCESS);
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  bool spans = atomic_load_explicit(&unmap_spans, memory_order_relaxed);
  if (n == 1 || spans)
    r = tp__cu.cuMemUnmap(res->base + offset, n * res->gran);
  if (r == CUDA_ERROR_INVALID_VALUE && n > 1) {
    if (spans)
      atomic_store_explicit(&unmap_spans, 0, memory_order_relaxed);
    r = unmap_each(res, offset, n);
  }
  tp__cu_scope_leave(&scope);
  return tp__cu_error(r);
}

static tp_error_t access_location(const tp_location_t *loc,
                                  CUmemLocation *out) {
  switch (loc->type) {
  case TP_LOCATION_DEVICE:
    TP_RETURN_IF(loc->id < 0 || loc->id >= tp__cu_device_count,
                 TP_ERROR_INVALID_DEVICE);
    *out = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, loc->id};
    return TP_SUCCESS;
  case TP_LOCATION_HOST:
    *out = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0};
    return TP_SUCCESS;
  case TP_LOCATION_HOST_NUMA:
    *out = (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, loc->id};
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

/* The access flags of tidepool.h are the driver's CU_MEM_ACCESS_FLAGS_PROT_*
 * values. */
_Static_assert((int)TP_ACCESS_NONE == (int)CU_MEM_ACCESS_FLAGS_PROT_NONE &&
                   (int)TP_ACCESS_READ == (int)CU_MEM_ACCESS_FLAGS_PROT_READ &&
                   (int)TP_ACCESS_READ_WRITE ==
                       (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
               "access flags differ from the driver's");

#define TP_CU_ACCESS_ON_STACK 16

tp_error_t tp__cu_set_access(tp__pres *res, size_t offset, size_t size,
                             const tp_access_desc_t *list, size_t count) {
  TP_RETURN_IF(size % res->gran || !in_range(res, offset, size / res->gran),
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(count == 0 || size == 0, TP_SUCCESS);
  CUmemAccessDesc on_stack[TP_CU_ACCESS_ON_STACK + 1];
  CUmemAccessDesc *desc = on_stack;
  if (count > TP_CU_ACCESS_ON_STACK) {
    desc = calloc(count + 1, sizeof *desc);
    TP_RETURN_IF(!desc, TP_ERROR_OUT_OF_MEMORY);
  }
  tp_error_t err = TP_SUCCESS;
  for (size_t i = 0; i < count && err == TP_SUCCESS; i++) {
    tp_access_flags_t f = list[i].flags;
    if (f != TP_ACCESS_NONE && f != TP_ACCESS_READ && f != TP_ACCESS_READ_WRITE)
      err = TP_ERROR_INVALID_VALUE;
    else
      err = access_location(&list[i].location, &desc[i].location);
    desc[i].flags = (CUmemAccess_flags)f;
  }
  /* Host-backed managed memory is the host's too, whatever the list says. */
  if (res->host_backed)
    desc[count++] = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_HOST, 0},
                                      CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  tp__cu_scope scope;
  if (err == TP_SUCCESS)
    err = scope_for(res->ctx_device, &scope);
  if (err == TP_SUCCESS) {
    CUresult r = tp__cu.cuMemSetAccess(res->base + offset, size, desc, count);
    tp__cu_scope_leave(&scope);
    err = tp__cu_error(r);
  }
  if (desc != on_stack)
    free(desc);
  return err;
}

/* ---- sharing between processes ------------------------------------------
 * Each chunk travels as a descriptor of its own (cuMemExportToShareableHandle
 * with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); nothing stands for the
 * whole reservation. An imported chunk is a handle of this process to the
 * exporter's memory: cuMemRelease drops this process's reference only. */

tp_error_t tp__cu_share_reservation(tp__pres *res, int *fd) {
  TP_RETURN_IF(!res || !fd, TP_ERROR_INVALID_VALUE);
  *fd = -1;
  return TP_SUCCESS;
}

tp_error_t tp__cu_share_chunk(tp__pres *res, tp__phys phys,
                              tp__chunk_share *share) {
  TP_RETURN_IF(!res || !share || !phys, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(!(res->kind.handle_types & TP_HANDLE_POSIX_FD) ||
                   !tp__cu.cuMemExportToShareableHandle,
               TP_ERROR_NOT_SUPPORTED);
  tp__cu_scope scope;
  TP_FORWARD(scope_for(res->ctx_device, &scope));
  int fd = -1;
  CUresult r = tp__cu.cuMemExportToShareableHandle(
      &fd, (CUmemGenericAllocationHandle)phys,
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  tp__cu_scope_leave(&scope);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  *share = (tp__chunk_share){.offset = 0, .fd = fd};
  return TP_SUCCESS;
}

/* The range is an ordinary reservation of the importer's kind: what makes
 * its chunks another process's is how they are made (chunk_import). */
tp_error_t tp__cu_reserve_imported(const tp__mem_kind *kind, size_t size,
                                   size_t align, int fd, tp__pres **res,
                                   uintptr_t *base) {
  if (fd >= 0)
    close(fd); /* chunks bring descriptors of their own here */
  return tp__cu_reserve(kind, size, align, res, base);
}

tp_error_t tp__cu_chunk_import(tp__pres *res, const tp__chunk_share *share,
                               tp__phys *phys) {
  int fd = share ? share->fd : -1;
  tp_error_t err = TP_SUCCESS;
  if (!res || !phys || fd < 0)
    err = TP_ERROR_INVALID_VALUE;
  else if (!tp__cu.cuMemImportFromShareableHandle)
    err = TP_ERROR_NOT_SUPPORTED;
  tp__cu_scope scope;
  if (err == TP_SUCCESS)
    err = scope_for(res->ctx_device, &scope);
  CUmemGenericAllocationHandle h = 0;
  if (err == TP_SUCCESS) {
    /* For posix descriptors the driver takes the descriptor's value in
     * place of a pointer, and keeps its own reference: ours is closed. */
    CUresult r = tp__cu.cuMemImportFromShareableHandle(
        &h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    tp__cu_scope_leave(&scope);
    err = tp__cu_error(r);
    if (err == TP_SUCCESS && h == 0)
      err = tp__platform_fail(0, "cuMemImportFromShareableHandle gave 0");
  }
  if (fd >= 0)
    close(fd);
  TP_FORWARD(err);
  *phys = (tp__phys)h;
  return TP_SUCCESS;
}

tp_error_t tp__cu_device_uuid(int device, unsigned char uuid[16]) {
  TP_RETURN_IF(!uuid, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__cu_device_count,
               TP_ERROR_INVALID_DEVICE);
  TP_RETURN_IF(!tp__cu.cuDeviceGetUuid, TP_ERROR_NOT_SUPPORTED);
  CUuuid u;
  CUresult r = tp__cu.cuDeviceGetUuid(&u, tp__cu_devs[device].dev);
  TP_RETURN_IF(r != CUDA_SUCCESS, tp__cu_error(r));
  _Static_assert(sizeof u.bytes == 16, "a CUuuid is 16 bytes");
  memcpy(uuid, u.bytes, sizeof u.bytes);
  return TP_SUCCESS;
}
