// Whether the driver's VMM calls wait for the device: times cuMemCreate,
// cuMemMap, cuMemSetAccess, a second mapping of one handle, cuMemUnmap and
// cuMemRelease with the device idle and while a 200 ms spin kernel runs on
// another stream, and says whether the kernel still ran after them.
// Build and run on a GPU machine:
//   nvcc -O2 -o vmm_sync bench/vmm_sync.cu -lcuda && ./vmm_sync
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
static double now_ms(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
__global__ void spin(long long cycles){long long s=clock64();while(clock64()-s<cycles);}
#define OK(x) do{CUresult r=(x); if(r){printf("%s failed %d\n",#x,(int)r);return 1;}}while(0)
int main(){
  cudaFree(0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  long long cyc=(long long)clk*200; // 200 ms
  CUmemAllocationProp p={}; p.type=CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type=CU_MEM_LOCATION_TYPE_DEVICE; p.location.id=0;
  size_t g=2<<20; CUdeviceptr va; OK(cuMemAddressReserve(&va, 64*g, 0, 0, 0));
  CUmemAccessDesc ad={}; ad.location=p.location; ad.flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // a busy buffer the kernel does not touch, mapped at chunk 0
  CUmemGenericAllocationHandle h0, h1; OK(cuMemCreate(&h0,g,&p,0)); OK(cuMemMap(va,g,0,h0,0)); OK(cuMemSetAccess(va,g,&ad,1));
  for(int busy=0;busy<2;busy++){
    for(int rep=0;rep<2;rep++){
      if(busy){spin<<<1,1,0,s>>>(cyc);} cudaDeviceSynchronize(); if(busy){spin<<<1,1,0,s>>>(cyc);}
      double t0=now_ms(); OK(cuMemCreate(&h1,g,&p,0));
      double t1=now_ms(); OK(cuMemMap(va+g*(2+rep),g,0,h1,0));
      double t2=now_ms(); OK(cuMemSetAccess(va+g*(2+rep),g,&ad,1));
      double t3=now_ms(); OK(cuMemMap(va+g*(10+rep),g,0,h0,0)); OK(cuMemSetAccess(va+g*(10+rep),g,&ad,1)); // h0 twice
      double t4=now_ms(); OK(cuMemUnmap(va+g*(10+rep),g));
      double t5=now_ms(); OK(cuMemUnmap(va+g*(2+rep),g));
      double t6=now_ms(); OK(cuMemRelease(h1));
      double t7=now_ms(); cudaError_t q=cudaStreamQuery(s);
      printf("%s rep %d: create %.3f map %.3f access %.3f map+access(2nd mapping) %.3f unmap(2nd) %.3f unmap %.3f release %.3f ms; kernel still running after: %s\n",
        busy?"busy":"idle",rep,t1-t0,t2-t1,t3-t2,t4-t3,t5-t4,t6-t5,t7-t6, q==cudaErrorNotReady?"yes":"no");
      cudaDeviceSynchronize();
    }
  }
  return 0;
}
