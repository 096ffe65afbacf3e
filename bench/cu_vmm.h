/* The driver's virtual memory calls as the VMM probes (vmm_cost,
 * vmm_threads, launch_vs_vmm) reach them: through dlopen, so that they build
 * without libcuda and say so where there is no driver. */
#ifndef TP_BENCH_CU_VMM_H
#define TP_BENCH_CU_VMM_H

#include <cuda.h>

#include "dl_table.h"

typedef struct cu_vmm {
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                      unsigned long long);
  CUresult (*unreserve)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
                     const CUmemAllocationProp *, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} cu_vmm;

/* Fills *cu from libcuda.so.1: 0, or -1 where the library or a call is
 * missing. */
static inline int cu_vmm_load(cu_vmm *cu) {
  const dl_sym syms[] = {{&cu->init, "cuInit"},
                         {&cu->retain, "cuDevicePrimaryCtxRetain"},
                         {&cu->set, "cuCtxSetCurrent"},
                         {&cu->reserve, "cuMemAddressReserve"},
                         {&cu->unreserve, "cuMemAddressFree"},
                         {&cu->create, "cuMemCreate"},
                         {&cu->release, "cuMemRelease"},
                         {&cu->map, "cuMemMap"},
                         {&cu->unmap, "cuMemUnmap"},
                         {&cu->access, "cuMemSetAccess"}};
  return dl_table_load("libcuda.so.1", syms, sizeof syms / sizeof syms[0]) ? -1
                                                                           : 0;
}

#endif /* TP_BENCH_CU_VMM_H */
