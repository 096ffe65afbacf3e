/* The emulated devices, the bottom layer of the host platform: configuration
 * from the environment, device attributes, kinds of memory and their capacity
 * accounts, fault injection and live counts for tests. It calls no other
 * file of the platform; memory and streams both build on it. */
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "platform/host/host_internal.h"

int tp__host_devices;
uint64_t tp__host_capacity[TP__HOST_ACCOUNTS];
_Atomic uint64_t tp__host_charged[TP__HOST_ACCOUNTS];
tp__host_counts tp__host_counted;

/* Per kind: operations counted so far, and the count at which the armed one
 * falls (0: none). */
static _Atomic uint64_t fault_ops[TP__HOST_FAULT_KINDS];
static _Atomic uint64_t fault_at[TP__HOST_FAULT_KINDS];

/* Reads one setting; a value that does not parse or lies outside [min, max]
 * is reported on stderr, since the caller only sees INVALID_VALUE. */
static tp_error_t read_setting(const char *name, uint64_t fallback,
                               uint64_t min, uint64_t max, bool size,
                               const char *expect, uint64_t *out) {
  /* strtoull, under tp__env_size, would take "-1" for a huge size; a count
   * or a switch takes no suffix ("2b" is no number of devices). */
  const char *raw = getenv(name);
  bool bad = raw && *raw &&
             (!isdigit((unsigned char)*raw) ||
              (!size && raw[strspn(raw, "0123456789")] != '\0'));
  uint64_t v = tp__env_size(name, fallback, &bad);
  if (bad || v < min || v > max) {
    fprintf(stderr, "tidepool: %s=\"%s\" is invalid: expected %s\n", name, raw,
            expect);
    return TP_ERROR_INVALID_VALUE;
  }
  *out = v;
  return TP_SUCCESS;
}

/* TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE: graph memory handled as on cuda. */
static bool maps_at_capture;

bool tp__host_graph_maps_at_capture(void) {
  return maps_at_capture;
}

tp_error_t tp__host_configure(void) {
  uint64_t ndevices, device_mem, host_mem, late;
  TP_FORWARD(read_setting("TIDEPOOL_HOST_GRAPH_MAPS_AT_CAPTURE", 0, 0, 1, false,
                          "0 or 1", &late));
  maps_at_capture = late == 1;
  TP_FORWARD(read_setting("TIDEPOOL_HOST_DEVICES", 1, 1, TP__HOST_MAX_DEVICES,
                          false, "a number of devices from 1 to 16",
                          &ndevices));
  TP_FORWARD(read_setting("TIDEPOOL_HOST_DEVICE_MEMORY", (uint64_t)4 << 30,
                          TP__HOST_GRANULARITY, UINT64_MAX, true,
                          "a byte count of at least 2M, with an optional K, "
                          "M, G or T suffix",
                          &device_mem));
  TP_FORWARD(read_setting("TIDEPOOL_HOST_HOST_MEMORY", (uint64_t)16 << 30,
                          TP__HOST_GRANULARITY, UINT64_MAX, true,
                          "a byte count of at least 2M, with an optional K, "
                          "M, G or T suffix",
                          &host_mem));
  tp__host_devices = (int)ndevices;
  for (int d = 0; d < TP__HOST_MAX_DEVICES; d++)
    tp__host_capacity[d] = d < tp__host_devices ? device_mem : 0;
  tp__host_capacity[TP__HOST_ACCOUNT_HOST] = host_mem;
  return TP_SUCCESS;
}

tp_error_t tp__host_device_count(int *count) {
  TP_RETURN_IF(!count, TP_ERROR_INVALID_VALUE);
  *count = tp__host_devices;
  return TP_SUCCESS;
}

tp_error_t tp__host_device_attribute(int *value, tp_device_attr_t attr,
                                     int device) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  switch (attr) {
  case TP_DEVICE_ATTR_MEMORY_POOLS_SUPPORTED: *value = 1; break;
  case TP_DEVICE_ATTR_MEMORY_POOL_SUPPORTED_HANDLE_TYPES:
    *value = TP_HANDLE_POSIX_FD;
    break;
  case TP_DEVICE_ATTR_LOCALITY_DOMAIN_COUNT: *value = 1; break;
  case TP_DEVICE_ATTR_CONCURRENT_MANAGED_ACCESS: *value = 1; break;
  default: return TP_ERROR_INVALID_VALUE;
  }
  return TP_SUCCESS;
}

/* Host threads have no per-device context, so there is nothing to switch. */
tp_error_t tp__host_set_device(int device) {
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  return TP_SUCCESS;
}

tp_error_t tp__host_location_index(const tp_location_t *location,
                                   unsigned *index) {
  switch (location->type) {
  case TP_LOCATION_DEVICE:
    TP_RETURN_IF(location->id < 0 || location->id >= tp__host_devices,
                 TP_ERROR_INVALID_DEVICE);
    *index = (unsigned)location->id;
    return TP_SUCCESS;
  case TP_LOCATION_HOST: *index = TP__HOST_ACCOUNT_HOST; return TP_SUCCESS;
  case TP_LOCATION_HOST_NUMA:
    TP_RETURN_IF(location->id != 0, TP_ERROR_INVALID_DEVICE);
    *index = TP__HOST_ACCOUNT_HOST;
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

tp_error_t tp__host_account_of(const tp__mem_kind *kind, int *account) {
  TP_RETURN_IF(!kind, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(kind->handle_types & ~(unsigned)TP_HANDLE_POSIX_FD,
               TP_ERROR_NOT_SUPPORTED);
  TP_RETURN_IF(kind->type != TP_ALLOCATION_PINNED &&
                   kind->type != TP_ALLOCATION_MANAGED,
               TP_ERROR_NOT_SUPPORTED);
  /* Managed memory without a preferred location lives on device 0. */
  if (kind->location.type == TP_LOCATION_NONE) {
    TP_RETURN_IF(kind->type != TP_ALLOCATION_MANAGED, TP_ERROR_INVALID_VALUE);
    *account = 0;
    return TP_SUCCESS;
  }
  unsigned index;
  TP_FORWARD(tp__host_location_index(&kind->location, &index));
  *account = (int)index;
  return TP_SUCCESS;
}

tp_error_t tp__host_mem_query(const tp__mem_kind *kind, size_t *granularity,
                              uint64_t *capacity) {
  int account;
  TP_FORWARD(tp__host_account_of(kind, &account));
  if (granularity)
    *granularity = TP__HOST_GRANULARITY;
  if (capacity)
    *capacity = tp__host_capacity[account];
  return TP_SUCCESS;
}

/* Emulated devices are numbered alike in every process of the machine that
 * configures them alike: device d is the same device everywhere. */
tp_error_t tp__host_device_uuid(int device, unsigned char uuid[16]) {
  TP_RETURN_IF(!uuid, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(device < 0 || device >= tp__host_devices,
               TP_ERROR_INVALID_DEVICE);
  static const char prefix[15] = "tidepool-host:";
  memcpy(uuid, prefix, sizeof prefix);
  uuid[15] = (unsigned char)device;
  return TP_SUCCESS;
}

void tp__host_fault_arm(tp__host_fault_kind kind, uint64_t nth) {
  if ((unsigned)kind >= TP__HOST_FAULT_KINDS)
    return;
  uint64_t at = nth ? atomic_load(&fault_ops[kind]) + nth : 0;
  atomic_store(&fault_at[kind], at);
}

uint64_t tp__host_fault_ops(tp__host_fault_kind kind) {
  if ((unsigned)kind >= TP__HOST_FAULT_KINDS)
    return 0;
  return atomic_load(&fault_ops[kind]);
}

bool tp__host_fault_fires(tp__host_fault_kind kind) {
  uint64_t n =
      atomic_fetch_add_explicit(&fault_ops[kind], 1, memory_order_relaxed) + 1;
  uint64_t at = atomic_load_explicit(&fault_at[kind], memory_order_relaxed);
  if (TP_LIKELY(at != n))
    return false;
  /* Only the thread that disarms it fails, so one armed fault fails once. */
  return atomic_compare_exchange_strong(&fault_at[kind], &at, 0);
}

tp_error_t tp__host_fault_fail(void) {
  return tp__platform_fail(EIO, "injected fault");
}

void tp__host_live_get(tp__host_live *out) {
  if (!out)
    return;
  memset(out, 0, sizeof *out);
  out->reservations = atomic_load(&tp__host_counted.reservations);
  out->chunks = atomic_load(&tp__host_counted.chunks);
  out->mapped_chunks = atomic_load(&tp__host_counted.mapped_chunks);
  out->streams = atomic_load(&tp__host_counted.streams);
  out->events = atomic_load(&tp__host_counted.events);
  for (int d = 0; d < TP__HOST_MAX_DEVICES; d++)
    out->device_bytes[d] = atomic_load(&tp__host_charged[d]);
  out->host_bytes = atomic_load(&tp__host_charged[TP__HOST_ACCOUNT_HOST]);
}
