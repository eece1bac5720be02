#pragma once
// Shared-memory mbarriers (sm_80+ arrive/wait, sm_90 try_wait) addressed by their 32-bit shared
// address. Inline PTX only (NVRTC-clean).
//
// Phase protocol: a barrier initialised with count n completes a phase when n arrivals have
// landed; waiters pass `parity` = the phase number & 1 they wait for. A waiter on parity 1 of a
// fresh barrier passes at once (the phase "before" phase 0 counts as complete), which lets a
// producer wait on "slot free" barriers from its first iteration without a special case.
// arrive() has release semantics and the wait acquire semantics (CTA scope), so plain shared
// stores made before an arrive are visible to threads after their wait.
#include "common/types.cuh"

namespace mj {
namespace sm90 {

// 32-bit shared-window address of a generic pointer into shared memory.
MJ_DEVICE u32 smem_addr(const void* p) {
  u32 r;
  asm("{\n.reg .u64 a;\ncvta.to.shared.u64 a, %1;\ncvt.u32.u64 %0, a;\n}\n" : "=r"(r) : "l"(p));
  return r;
}

MJ_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the async proxy (cp.async arrivals, wgmma) as well.
MJ_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

MJ_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

// One arrival, triggered when every cp.async this thread issued before it has landed in shared
// memory. `.noinc`: the barrier's expected count already includes this arrival.
MJ_DEVICE void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

MJ_DEVICE bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

MJ_DEVICE void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// One arrival that also expects `bytes` more transaction bytes in the current phase (st.async or
// bulk copies completing on this barrier; they may land before or after it).
MJ_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

}  // namespace sm90
}  // namespace mj
