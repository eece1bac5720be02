#pragma once
// The Hopper sparse prefill's split, storage side: the partial slot a part of a split item writes
// (store_partial, called by the consumers' epilogue) and the combine entry that merges the parts of
// each split item (sparse_prefill/sm90_persistent.cuh says which items are split). The slot size is
// sparse_prefill/layout.h's, which the host sizes the workspace with.
#include "common/grid_dependency.cuh"
#include "sparse_prefill/sm90_config.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

// ---- tail split: partial slots and their combine ----------------------------------------------------
// A slot: o f32 in the accumulator's register order, [wg 2][warp 4][kk 16][lane 32][8] (each thread's
// o[8 kk .. 8 kk + 7] as two 16-byte stores: no address arithmetic per element and no per-row
// predicates; in the natural [64][512] order the stores' code doubled NVVM's time on the kernel),
// then (m, l) f32 [64 rows][2]: the running max in the kernel's exp2 units (score x softmax scale x
// log2 e) and the row sum of both warpgroups. Rows past kHeadsPerCta are written too (the slot
// has 64) and never read. A part without a valid slot writes l = 0 (m = kMaxInit).
using sparse_prefill_layout::kPartialSlotFloats;
// out_mult: the accumulator's unscale (output_unscale: the fp8 tiles' 2^64, 1 for bf16), applied
// here so that every slot holds the true weighted sum and the combine needs no spec knowledge.
template <class C>
MJ_DEVICE void store_partial(const SparsePrefillArgs& a, const Lane& ln, int lane, int slot, const float (&o)[128],
                             float out_mult, float m0, float m1, float L0, float L1) {
  static_assert(!C::kFp8Math, "partials hold a 16-bit kernel's accumulator layout");
  float* base = a.partials + static_cast<i64>(slot) * kPartialSlotFloats;
  float4* mine = reinterpret_cast<float4*>(base + (ln.wg * 4 + ln.w) * (16 * 32 * 8) + lane * 8);
  auto v = [&](int i) { return C::kFp8 ? o[i] * out_mult : o[i]; };
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    mine[kk * 64] = make_float4(v(8 * kk + 0), v(8 * kk + 1), v(8 * kk + 2), v(8 * kk + 3));
    mine[kk * 64 + 1] = make_float4(v(8 * kk + 4), v(8 * kk + 5), v(8 * kk + 6), v(8 * kk + 7));
  }
  if (ln.wg == 0 && ln.tig == 0) {
    float* ml = base + 64 * kVDim;
    *reinterpret_cast<float2*>(ml + 2 * ln.r0) = make_float2(m0, L0);
    *reinterpret_cast<float2*>(ml + 2 * ln.r1) = make_float2(m1, L1);
  }
}
// Where dims d, d + 1 (d even) of row r sit in a slot's o: warpgroup d / 256, warp r / 16, kk = (d % 256)
// / 16, lane 4 (r % 8) + (d % 8) / 2, element 2 (r % 16 >= 8) + 4 (d % 16 >= 8) (and + 1).
MJ_DEVICE int partial_offset(int r, int d) {
  const int wg = d >> 8, w = r >> 4, kk = (d >> 4) & 15, lane = 4 * (r & 7) + ((d & 7) >> 1);
  const int e = 2 * ((r >> 3) & 1) + 4 * ((d >> 3) & 1);
  return (((wg * 4 + w) * 16 + kk) * 32 + lane) * 8 + e;
}

// The combine entry (launched after the attention kernel when it split its tail): CTA (x, y) merges
// the parts of split item split_first + x, head row y, 4 dims per thread (128 threads):
//   M = max m_j over the parts with l_j > 0,  w_j = exp2(m_j - M),  L = sum_j w_j l_j,
//   out = sum_j w_j o_j / (L + [sink] exp2(sink log2 e - M)),  lse = (M + log2 L) ln 2,
// the epilogue's formulas (finish) with the whole item's max and sums; L = 0: out 0, lse +inf.
// The host launches it programmatically (LaunchDims::programmatic): its CTAs may start on SMs the
// attention kernel leaves free and wait there for that kernel's completion (common/grid_dependency.cuh),
// so the slots are read with plain loads after the wait.
using sparse_prefill_layout::kCombineThreads;
template <class C>
MJ_DEVICE void combine(const SparsePrefillArgs& a) {
  const int x = static_cast<int>(blockIdx.x), r = static_cast<int>(blockIdx.y);
  const int item = a.split_first + x, parts = 1 << a.split_shift;
  const i64 token = item / C::kCtasPerToken;
  const int head0 = (item % C::kCtasPerToken) * C::kHeadsPerCta;
  const float* slots = a.partials + static_cast<i64>(x) * parts * kPartialSlotFloats;
  const int d = 4 * static_cast<int>(threadIdx.x);
  grid_dependency::wait_prerequisites();
  float M = kMaxInit;
  for (int j = 0; j < parts; ++j) {
    const float2 ml = *reinterpret_cast<const float2*>(slots + j * kPartialSlotFloats + 64 * kVDim + 2 * r);
    if (ml.y > 0.0f) M = fmaxf(M, ml.x);
  }
  float L = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int j = 0; j < parts; ++j) {
    const float* slot = slots + j * kPartialSlotFloats;
    const float2 ml = *reinterpret_cast<const float2*>(slot + 64 * kVDim + 2 * r);
    if (ml.y > 0.0f) {
      const float w = fast_exp2(ml.x - M);
      L += w * ml.y;
      const float2 v0 = *reinterpret_cast<const float2*>(slot + partial_offset(r, d));
      const float2 v1 = *reinterpret_cast<const float2*>(slot + partial_offset(r, d + 2));
      acc.x += w * v0.x;
      acc.y += w * v0.y;
      acc.z += w * v1.x;
      acc.w += w * v1.y;
    }
  }
  float f = 0.0f;  // no valid slot: out = 0 whatever the sink
  if (L != 0.0f) {
    float den = L;
    if constexpr (C::kSink) den += fast_exp2(__ldg(a.attn_sink + head0 + r) * kLog2e - M);
    f = 1.0f / den;
  }
  unsigned char* out = static_cast<unsigned char*>(a.out) +
                       ((token * C::kNumHeads + head0 + r) * static_cast<i64>(kVDim) + d) * 2;
  asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};\n" ::"l"(out), "r"(pack_bf16x2(acc.x * f, acc.y * f)),
               "r"(pack_bf16x2(acc.z * f, acc.w * f))
               : "memory");
  if constexpr (C::kEmitLse) {
    if (threadIdx.x == 0) a.lse[token * C::kNumHeads + head0 + r] = L == 0.0f ? pos_inf() : (M + fast_log2(L)) * kLn2;
  }
}

}  // namespace sparse_prefill_sm90
}  // namespace mj
