#pragma once
// Hopper (sm_90a) building blocks of the indexer's score kernels: their cp.async gathers with zero
// fill, the persistent scorer's TMA loads, and the names they use for the shared primitives of
// templates/common/ (mbarriers, the async-proxy fence, the fp8 warpgroup MMA, QGMMA in SASS, and
// its shared-memory descriptor).
#include "common/mbarrier.cuh"
#include "common/types.cuh"
#include "mla_indexer/args.h"
#include "mla_indexer/layout.h"
#include "common/warpgroup.cuh"
#include "common/wgmma.cuh"

namespace mj {
namespace indexer_sm90 {

MJ_DEVICE u32 smem_u32(const void* p) { return sm90::smem_addr(p); }

// ---- cp.async: global -> shared, `src_bytes` = 0 fills the destination with zeros ----------------
MJ_DEVICE void cp_async_16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// All 16 bytes, no zero fill: no source-size operand and no predicate to compute.
MJ_DEVICE void cp_async_16_full(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
MJ_DEVICE void cp_async_4_full(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
MJ_DEVICE void cp_async_4(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
MJ_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MJ_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- TMA (cp.async.bulk.tensor): one thread moves a whole box through the async proxy ---------
// `map` is the generic address of a CUtensorMap in the kernel's parameter space (a
// __grid_constant__ argument). The copy completes `bytes` of the box on the mbarrier `bar`: the
// whole box, also where it lies outside the tensor (those elements read as zeros).
MJ_DEVICE void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
MJ_DEVICE void tma_load_2d(u32 dst, const void* map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
MJ_DEVICE void tma_load_1d(u32 dst, const void* map, int c0, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(bar)
      : "memory");
}
// `p` unchanged, but opaque to the compiler: keeps a base address computed once in a register
// instead of folded into (and recomputed with) every address derived from it.
template <typename T>
MJ_DEVICE T* opaque_ptr(T* p) {
  asm("mov.b64 %0, %0;\n" : "+l"(p));
  return p;
}
// True in one lane of the (converged) warp: with it ptxas knows the TMA issue below is one lane's,
// and issues it without a per-lane loop.
MJ_DEVICE bool elect_one() {
  u32 pred = 0;
  asm volatile(
      "{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(pred));
  return pred != 0;
}
// Arrives on `bar` (one of its expected arrivals) and adds `bytes` to the transactions its current
// phase waits for: the phase completes when every arrival came and every byte landed.
using sm90::mbar_arrive_expect_tx;

// ---- shared primitives (templates/common/) ----------------------------------------------------
using sm90::fence_proxy_async_smem;
using sm90::mbar_arrive;
using sm90::mbar_arrive_cp_async;
using sm90::mbar_init;
using sm90::mbar_init_fence;
using sm90::mbar_wait;
using sm90::wgmma_commit;
using sm90::wgmma_fence;
using sm90::wgmma_m64n128k32_e4m3;
using sm90::wgmma_wait;

// Q tile and head weights of a CTA's BLOCK_Q token slots (both Hopper scorers), loaded by threads
// [0, nthreads) at thread index `tid`. Q: swizzled rows of 128 bytes, head h of slot s in row
// s * H + h; rows of invalid slots are zero-filled. Weights per slot as [quad][ii][2] with W_QUAD
// floats per quad: the H/4 weights one thread of a quad needs (heads 8 * ii + 2 * quad + {0, 1})
// are contiguous, read with 16-byte loads. Returns with the Q copies issued and committed (the
// caller waits, fences the async proxy and synchronises).
template <int BLOCK_Q, int H, int W_QUAD>
MJ_DEVICE void load_q_and_weights(const MlaIndexerScoresArgs& a, long long block_row0, u32 q_s, float* w_sm,
                                  int tid, int nthreads) {
  constexpr int kDepth = indexer::kDepth;
  // Rolled: the persistent scorer's producer warps call this once per work item at 32 registers,
  // where the addresses of unrolled iterations, hoisted out of the item loop, spilled.
#pragma unroll 1
  for (int c = tid; c < BLOCK_Q * H * 8; c += nthreads) {
    const int row = c >> 3, chunk = c & 7;
    const long long t = a.chunk_row_begin + block_row0 + row / H;
    const bool ok = block_row0 + row / H < a.chunk_rows && t < a.num_tokens;
    const u8* src = ok ? a.q + (t * H + row % H) * kDepth + chunk * 16 : a.q;
    cp_async_16(q_s + row * 128 + ((chunk ^ (row & 7)) << 4), src, ok ? 16u : 0u);
  }
  cp_async_commit();
#pragma unroll 1
  for (int n = tid; n < BLOCK_Q * H; n += nthreads) {
    const int slot = n / H, h = n % H;
    const long long t = a.chunk_row_begin + block_row0 + slot;
    const bool ok = block_row0 + slot < a.chunk_rows && t < a.num_tokens;
    const int ii = h >> 3, quad = (h >> 1) & 3, e = h & 1;
    w_sm[slot * 4 * W_QUAD + quad * W_QUAD + ii * 2 + e] = ok ? a.qs[t * H + h] : 0.0f;
  }
}

// Keeps the compiler from moving accumulator reads/writes across the async MMA boundaries.
template <int N>
MJ_DEVICE void fence_operands(float (&d)[N]) {
  sm90::fence_regs(d);
}

// Descriptor of a K-major operand tile whose rows are 128 bytes (128 fp8 values) with the 128-byte
// swizzle, starting on a 1024-byte boundary: 8-row groups 1024 bytes apart. Advancing K by 32 fp8
// values adds 32 bytes to the start address.
MJ_DEVICE u64 sw128_kmajor_desc(u32 smem_addr) { return sm90::smem_desc_sw128(smem_addr, 16, 1024); }

}  // namespace indexer_sm90
}  // namespace mj
