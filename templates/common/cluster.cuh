#pragma once
// Thread-block clusters (sm_90+): the CTA's rank, the cluster's size, another CTA's shared memory
// (distributed shared memory) and the cluster-wide barrier. Kernels compiled for older targets
// include this header too; there a cluster is never launched (the host launches one only on
// sm_90 and newer), every CTA is rank 0 of 1, and the remaining functions trap.
#include "common/types.cuh"

namespace mj {
namespace cluster {

MJ_DEVICE u32 rank() {
#if __CUDA_ARCH__ >= 900
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  return 0;
#endif
}

MJ_DEVICE u32 size() {
#if __CUDA_ARCH__ >= 900
  u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
#else
  return 1;
#endif
}

// The generic address of `p`'s counterpart in the shared memory of the cluster's CTA `r`: plain
// loads, stores and atomics through it reach that CTA's shared memory. The target CTA must have
// started (a cluster barrier after launch) and must not exit while it is accessed.
template <class T>
MJ_DEVICE T* map_rank(T* p, u32 r) {
#if __CUDA_ARCH__ >= 900
  u64 out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<u64>(p)), "r"(r));
  return reinterpret_cast<T*>(out);
#else
  (void)r;
  asm volatile("trap;");
  return p;
#endif
}

// Every thread of every CTA of the cluster arrives, then waits for all: writes before it (to any
// CTA's shared memory) are visible to every thread after it (release / acquire). Also a barrier
// among the CTA's own threads. All threads must call it (.aligned).
MJ_DEVICE void sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#else
  __syncthreads();
#endif
}

}  // namespace cluster
}  // namespace mj
