#pragma once
// Warpgroup-level control for warp-specialised Hopper kernels: named barriers between subsets of
// the CTA's warps and register re-balancing between warpgroups (setmaxnreg, sm_90a).
// Inline PTX only (NVRTC-clean).
#include "common/types.cuh"

namespace mj {
namespace sm90 {

// Named barriers 1..15 (0 is __syncthreads). `threads` counts every thread that arrives or
// syncs on the barrier in one phase (a multiple of 32; whole warps take part).
MJ_DEVICE void named_bar_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Signals without waiting: the producer side of a one-way hand-off.
MJ_DEVICE void named_bar_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-thread register budget changes; every warp of the warpgroup executes the same one. Needs a
// register cap at kernel entry (__launch_bounds__(threads, 1)); N is a multiple of 8 in [24, 256].
template <int N>
MJ_DEVICE void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
MJ_DEVICE void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Orders this thread's earlier generic-proxy shared memory accesses (plain stores, stmatrix,
// cp.async data it has waited for) before later async-proxy accesses (wgmma operand reads).
MJ_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The acquire half of the same ordering (PTX ISA 8.6 uni-directional proxy fence, generic -> async,
// restricted to shared memory synchronised at cluster scope, which includes this CTA's), for stage
// data that landed through cp.async and its mbarrier completion (cp.async.mbarrier.arrive) which this
// thread has just waited on: it orders those writes before this thread's later wgmma operand reads.
// On sm_90a ptxas emits no instruction for it, as CUTLASS's cp.async GMMA mainloop uses no fence
// there at all; fence.proxy.async.shared::cta costs a MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S per wait.
// Not enough for plain st.shared / stmatrix data of other threads released by mbarrier.arrive:
// those need fence_proxy_async_smem (the prefill's fp8-decoding producer read stale tiles with this
// one).
MJ_DEVICE void fence_proxy_async_acquire_smem() {
  asm volatile("fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;\n" ::: "memory");
}

}  // namespace sm90
}  // namespace mj
