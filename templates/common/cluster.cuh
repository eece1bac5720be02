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

// The shared::cluster address (32-bit window) of shared address `addr` in the cluster's CTA `r`.
MJ_DEVICE u32 map_shared(u32 addr, u32 r) {
#if __CUDA_ARCH__ >= 900
  u32 out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(r));
  return out;
#else
  (void)r;
  asm volatile("trap;");
  return addr;
#endif
}

// 16 bytes stored into another CTA's shared memory (`addr`: shared::cluster), counted on that CTA's
// mbarrier `bar` (shared::cluster) as 16 transaction bytes when they have landed: the waiter on
// `bar` sees them once its phase completes (the barrier's expect_tx must cover them).
MJ_DEVICE void st_async_128(u32 addr, u32 v0, u32 v1, u32 v2, u32 v3, u32 bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
               "r"(v0), "r"(v1), "r"(v2), "r"(v3), "r"(bar)
               : "memory");
#else
  (void)addr, (void)v0, (void)v1, (void)v2, (void)v3, (void)bar;
  asm volatile("trap;");
#endif
}

// One arrival on another CTA's mbarrier (`bar`: shared::cluster), the form CUTLASS's cluster
// pipelines release a peer's stage with: the default release semantics at CTA scope. (The
// .release.cluster form costs a MEMBAR.ALL.GPU before every arrival; what it would order here,
// this thread's reads of the stage, completed before the arrival: wgmma reads waited for by
// wgmma.wait_group.)
MJ_DEVICE void mbar_arrive_remote(u32 bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
  (void)bar;
  asm volatile("trap;");
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
