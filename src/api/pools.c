/* The pool entry points: the default and current pool of each location and
 * allocation type, pools' creation, attributes, trimming and access, with
 * arguments checked as the driver does. Allocation is alloc.c's. */
#include <string.h>

#include "api/api.h"
#include "api/pools.h"
#include "common/guard.h"
#include "ipc/ipc.h"
#include "pool/alloc.h"

/* ---- default and current pools --------------------------------------------
 * Keyed by location and type, in pools.h's slots. */

static tp__mutex slots_lock = TP_MUTEX_INIT(TP_RANK_SLOTS);
static tp_pool_t defaults[TP_POOL_SLOTS];
_Atomic(tp_pool_t) tp__current_pools[TP_POOL_SLOTS];

/* The slot of a location and type, or the error the driver gives for it. */
static tp_error_t slot_of(const tp_location_t *loc, tp_allocation_type_t type,
                          int *slot) {
  TP_RETURN_IF(!loc, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(type != TP_ALLOCATION_PINNED && type != TP_ALLOCATION_MANAGED,
               TP_ERROR_INVALID_VALUE);
  switch (loc->type) {
  case TP_LOCATION_DEVICE:
    TP_FORWARD(tp__check_device(loc->id));
    *slot = loc->id * 2 + (type == TP_ALLOCATION_MANAGED);
    return TP_SUCCESS;
  case TP_LOCATION_HOST:
    TP_RETURN_IF(type != TP_ALLOCATION_PINNED, TP_ERROR_INVALID_VALUE);
    *slot = TP_SLOT_HOST;
    return TP_SUCCESS;
  case TP_LOCATION_HOST_NUMA:
    TP_RETURN_IF(type != TP_ALLOCATION_PINNED || loc->id != 0,
                 TP_ERROR_INVALID_VALUE);
    *slot = TP_SLOT_HOST_NUMA;
    return TP_SUCCESS;
  case TP_LOCATION_NONE:
    TP_RETURN_IF(type != TP_ALLOCATION_MANAGED, TP_ERROR_INVALID_VALUE);
    *slot = TP_SLOT_MANAGED_NONE;
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

static tp_pool_props_t slot_props(int slot) {
  tp_pool_props_t props = {0};
  props.alloc_type = TP_ALLOCATION_PINNED;
  if (slot < TP_SLOT_HOST) {
    props.location = (tp_location_t){TP_LOCATION_DEVICE, slot / 2, 0};
    if (slot % 2)
      props.alloc_type = TP_ALLOCATION_MANAGED;
  } else if (slot == TP_SLOT_HOST) {
    props.location.type = TP_LOCATION_HOST;
  } else if (slot == TP_SLOT_HOST_NUMA) {
    props.location.type = TP_LOCATION_HOST_NUMA;
  } else {
    props.alloc_type = TP_ALLOCATION_MANAGED;
    props.location.type = TP_LOCATION_NONE;
  }
  return props;
}

tp_error_t tp__default_pool_of(int slot, tp_pool_t *out) {
  tp__mutex_lock(&slots_lock);
  tp_error_t err = TP_SUCCESS;
  if (!defaults[slot]) {
    tp_pool_props_t props = slot_props(slot);
    err = tp__pool_new(&props, true, &defaults[slot]);
    /* The default becomes current only where no pool was made current
     * before it was first asked for (a set, then a get of the default,
     * once undid the set). */
    tp_pool_t none = NULL;
    if (err == TP_SUCCESS)
      atomic_compare_exchange_strong(&tp__current_pools[slot], &none,
                                     defaults[slot]);
  }
  *out = defaults[slot];
  tp__mutex_unlock(&slots_lock);
  return err;
}

void tp__current_pools_forget(tp_pool_t pool) {
  tp__mutex_lock(&slots_lock);
  for (int i = 0; i < TP_POOL_SLOTS; i++) {
    tp_pool_t expect = pool;
    atomic_compare_exchange_strong(&tp__current_pools[i], &expect, defaults[i]);
  }
  tp__mutex_unlock(&slots_lock);
}

TP_API tp_error_t tp_mem_get_default_pool(tp_pool_t *pool,
                                          const tp_location_t *location,
                                          tp_allocation_type_t type) {
  TP_RETURN_IF(!pool, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  int slot;
  TP_FORWARD(slot_of(location, type, &slot));
  return tp__default_pool_of(slot, pool);
}

TP_API tp_error_t tp_mem_get_pool(tp_pool_t *pool,
                                  const tp_location_t *location,
                                  tp_allocation_type_t type) {
  TP_RETURN_IF(!pool, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  int slot;
  TP_FORWARD(slot_of(location, type, &slot));
  return tp__current_pool_of(slot, pool);
}

static bool same_location(const tp_location_t *a, const tp_location_t *b) {
  if (a->type != b->type)
    return false;
  return a->type == TP_LOCATION_HOST || a->type == TP_LOCATION_NONE ||
         a->id == b->id;
}

/* The pool is checked live and made current under slots_lock, which a
 * destroy takes once more after its pool stopped answering (pool_destroy):
 * a set that raced the destroy is then either refused or undone. */
static tp_error_t set_pool(int slot, const tp_location_t *location,
                           tp_allocation_type_t type, tp_pool_t pool) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(p->imported || p->props.alloc_type != type ||
                   !same_location(&p->props.location, location),
               TP_ERROR_INVALID_VALUE);
  tp__mutex_lock(&slots_lock);
  tp_error_t err = tp__pool_get_known(pool, &p);
  if (err == TP_SUCCESS)
    atomic_store_explicit(&tp__current_pools[slot], pool, memory_order_release);
  tp__mutex_unlock(&slots_lock);
  return err;
}

TP_API tp_error_t tp_mem_set_pool(const tp_location_t *location,
                                  tp_allocation_type_t type, tp_pool_t pool) {
  TP_FORWARD(tp__api_init());
  int slot;
  TP_FORWARD(slot_of(location, type, &slot));
  return TP_GUARDED(set_pool(slot, location, type, pool));
}

TP_API tp_error_t tp_device_get_default_mem_pool(tp_pool_t *pool, int device) {
  tp_location_t loc = {TP_LOCATION_DEVICE, device, 0};
  return tp_mem_get_default_pool(pool, &loc, TP_ALLOCATION_PINNED);
}

/* The driver's device forms of "the current pool" answer INVALID_VALUE for
 * a device that does not exist, where its default-pool form answers
 * INVALID_DEVICE (bench/edge_answers.cu on an H200). */
static tp_error_t device_form(tp_error_t err) {
  return err == TP_ERROR_INVALID_DEVICE ? TP_ERROR_INVALID_VALUE : err;
}

TP_API tp_error_t tp_device_set_mem_pool(int device, tp_pool_t pool) {
  tp_location_t loc = {TP_LOCATION_DEVICE, device, 0};
  return device_form(tp_mem_set_pool(&loc, TP_ALLOCATION_PINNED, pool));
}

TP_API tp_error_t tp_device_get_mem_pool(tp_pool_t *pool, int device) {
  tp_location_t loc = {TP_LOCATION_DEVICE, device, 0};
  return device_form(tp_mem_get_pool(pool, &loc, TP_ALLOCATION_PINNED));
}

/* ---- pools --------------------------------------------------------------- */

static tp_error_t check_props(const tp_pool_props_t *pr) {
  TP_RETURN_IF(!pr, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(pr->alloc_type != TP_ALLOCATION_PINNED &&
                   pr->alloc_type != TP_ALLOCATION_MANAGED,
               TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(pr->usage != 0, TP_ERROR_INVALID_VALUE);
  TP_RETURN_IF(pr->handle_types &
                   ~(unsigned)(TP_HANDLE_POSIX_FD | TP_HANDLE_FABRIC),
               TP_ERROR_INVALID_VALUE);
  bool managed = pr->alloc_type == TP_ALLOCATION_MANAGED;
  TP_RETURN_IF(managed && (pr->max_size != 0 || pr->handle_types),
               TP_ERROR_INVALID_VALUE);
  switch (pr->location.type) {
  case TP_LOCATION_DEVICE:
    TP_RETURN_IF(tp__check_device(pr->location.id) != TP_SUCCESS,
                 TP_ERROR_INVALID_VALUE);
    return TP_SUCCESS;
  case TP_LOCATION_HOST:
    /* The seed: host pools are not IPC-capable. */
    TP_RETURN_IF(pr->handle_types != 0, TP_ERROR_INVALID_VALUE);
    return TP_SUCCESS;
  case TP_LOCATION_HOST_NUMA:
    TP_RETURN_IF(pr->location.id < 0, TP_ERROR_INVALID_VALUE);
    return TP_SUCCESS;
  case TP_LOCATION_NONE:
    TP_RETURN_IF(!managed, TP_ERROR_INVALID_VALUE);
    return TP_SUCCESS;
  default: return TP_ERROR_INVALID_VALUE;
  }
}

TP_API tp_error_t tp_pool_create(tp_pool_t *pool,
                                 const tp_pool_props_t *props) {
  TP_RETURN_IF(!pool, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  TP_FORWARD(check_props(props));
  tp_pool_t made = NULL;
  tp_error_t err = tp__pool_new(props, false, &made);
  /* A NUMA node the platform does not have is a bad value here, as the
   * driver answers for an unknown device. */
  TP_RETURN_IF(err == TP_ERROR_INVALID_DEVICE, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(err);
  /* A pool with handle types can be shared with other processes. No other
   * thread has its handle yet. */
  tp__pool *p = NULL;
  if (props->handle_types && tp__pool_get(made, &p) == TP_SUCCESS &&
      (err = tp__ipc_export_init(p)) != TP_SUCCESS) {
    (void)tp__pool_destroy(p);
    return err;
  }
  *pool = made;
  return TP_SUCCESS;
}

/* Each entry point below that reaches a pool does so inside the guard
 * (common/guard.h), so that a pool destroyed by another thread meanwhile
 * stays readable until the call returns. */
static tp_error_t pool_destroy(tp_pool_t pool) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  TP_RETURN_IF(p->is_default, TP_ERROR_INVALID_VALUE);
  tp__current_pools_forget(pool);
  tp_error_t err = tp__pool_destroy(p);
  /* Again, now that the pool no longer answers: a set that found it live
   * after the first forget made it current meanwhile (set_pool). */
  tp__current_pools_forget(pool);
  return err;
}

TP_API tp_error_t tp_pool_destroy(tp_pool_t pool) {
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_destroy(pool));
}

static tp_error_t pool_attribute(tp_pool_t pool, tp_pool_attr_t attr,
                                 void *value, bool set) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  return set ? tp__pool_set_attr(p, attr, value)
             : tp__pool_get_attr(p, attr, value);
}

TP_API tp_error_t tp_pool_get_attribute(tp_pool_t pool, tp_pool_attr_t attr,
                                        void *value) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_attribute(pool, attr, value, false));
}

TP_API tp_error_t tp_pool_set_attribute(tp_pool_t pool, tp_pool_attr_t attr,
                                        void *value) {
  TP_RETURN_IF(!value, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_attribute(pool, attr, value, true));
}

static tp_error_t pool_trim(tp_pool_t pool, size_t keep) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  return tp__pool_trim(p, keep);
}

TP_API tp_error_t tp_pool_trim_to(tp_pool_t pool, size_t min_bytes_to_keep) {
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_trim(pool, min_bytes_to_keep));
}

static tp_error_t pool_get_access(tp_access_flags_t *flags, tp_pool_t pool,
                                  const tp_location_t *location) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  /* An unknown device is a bad value here, as the driver answers. */
  TP_RETURN_IF(location->type == TP_LOCATION_DEVICE &&
                   tp__check_device(location->id) != TP_SUCCESS,
               TP_ERROR_INVALID_VALUE);
  return tp__pool_get_access(p, location, flags);
}

TP_API tp_error_t tp_pool_get_access(tp_access_flags_t *flags, tp_pool_t pool,
                                     const tp_location_t *location) {
  TP_RETURN_IF(!flags || !location, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_get_access(flags, pool, location));
}

static tp_error_t pool_set_access(tp_pool_t pool,
                                  const tp_access_desc_t *desc_list,
                                  size_t count) {
  tp__pool *p;
  TP_FORWARD(tp__pool_get(pool, &p));
  for (size_t i = 0; i < count; i++) {
    const tp_access_desc_t *d = &desc_list[i];
    TP_RETURN_IF(d->flags != TP_ACCESS_NONE && d->flags != TP_ACCESS_READ &&
                     d->flags != TP_ACCESS_READ_WRITE,
                 TP_ERROR_INVALID_VALUE);
    TP_RETURN_IF(d->location.type != TP_LOCATION_DEVICE,
                 TP_ERROR_INVALID_VALUE);
    TP_FORWARD(tp__check_device(d->location.id));
    /* The own device keeps read-write. The driver refuses read-only there
     * as unsupported and none as a bad device. */
    bool own = p->props.location.type == TP_LOCATION_DEVICE &&
               d->location.id == p->props.location.id;
    TP_RETURN_IF(own && d->flags == TP_ACCESS_READ, TP_ERROR_NOT_SUPPORTED);
    TP_RETURN_IF(own && d->flags == TP_ACCESS_NONE, TP_ERROR_INVALID_DEVICE);
  }
  return tp__pool_set_access(p, desc_list, count);
}

TP_API tp_error_t tp_pool_set_access(tp_pool_t pool,
                                     const tp_access_desc_t *desc_list,
                                     size_t count) {
  TP_RETURN_IF(!desc_list && count, TP_ERROR_INVALID_VALUE);
  TP_FORWARD(tp__api_init());
  return TP_GUARDED(pool_set_access(pool, desc_list, count));
}
