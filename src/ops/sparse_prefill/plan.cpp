// Tiling and launch geometry of the sparse_prefill kernels (see ops/sparse_prefill/plan.hpp).
#include "ops/sparse_prefill/plan.hpp"

#include "mlajit/error.hpp"

namespace mlajit::sparse_prefill {

PortablePlan portable_plan(const SparsePrefillParams& spec_params) {
  namespace layout = mj::sparse_prefill_layout;
  const SparsePrefillParams p = attention_params(spec_params);
  // Tiling and shared memory: templates/sparse_prefill/layout.h, the definition portable.cuh's Config
  // uses (64 keys per step halves the Q fragment re-reads of 32; the footprint, at most ~226 KB,
  // needs the 227 KB opt-in of sm_90 / sm_100 class parts).
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  const auto l = layout::portable_layout(p.num_q_heads, layout::portable_m_tiles(p.num_q_heads),
                                         layout::kPortableKeyTile, fp8, fp8 ? p.quantization_granularity : 0);
  PortablePlan plan;
  plan.m_tiles = l.m_tiles;
  plan.heads_per_cta = l.heads_per_cta;
  plan.head_tiles = l.head_tiles;
  plan.threads = l.threads;
  plan.key_tile = l.key_tile;
  plan.smem_bytes = l.smem_bytes;
  return plan;
}

// templates/sparse_prefill/sm90.cuh covers every valid spec (heads 16..128, one or two CTAs per
// token; bf16 or fp8) except fp8 quantization granularities below 16 elements: its decode takes a
// 16-element chunk to span at most two scale groups (sm90_config.cuh static_asserts this).
bool sm90_supported(const SparsePrefillParams& spec_params) {
  const SparsePrefillParams p = attention_params(spec_params);  // kv_staging bf16: the bf16 kernel
  return p.kv_dtype != DType::fp8_e4m3 || p.quantization_granularity == 0 || p.quantization_granularity >= 16;
}

bool portable_supported(const SparsePrefillParams& p) {
  return p.qk_math != QkMath::fp8 && p.kv_layout != CacheLayout::fp8_ds_mla;
}

bool persistent_kernel(const SparsePrefillParams& p) { return sm90_supported(p) && sm90_plan(p).persistent; }

bool split_kernel(const SparsePrefillParams& p) { return sm90_supported(p) && p.qk_math != QkMath::fp8; }

bool crossover_kernel(const SparsePrefillParams& p) { return sm90_supported(p) && sm90_plan(p).crossover; }

// Measured on an H200 (2026-11-21; s_q 4096, H 128, top-k 2048, s_kv 32K, b_topk 64; TFLOP/s):
//   bf16:                 Hopper 450, portable 241.
//   fp8 granularity 0:    Hopper 400, portable 212.    fp8 granularity 576: Hopper 370, portable 209.
//   fp8 granularity 64:   Hopper 327, portable 185; but the Hopper kernel rounds group scales to
//                         bf16 before applying them, so its lse is off by up to ~5e-3 against the
//                         f64 reference (the bar is 1e-4; the portable kernel applies them in f32:
//                         ~1e-6).
// The Hopper kernel is therefore preferred everywhere except fp8 group scales (0 < granularity <
// 576) of any f32 value, which stay on the portable kernel (exact for widths that are multiples of
// 16; for other widths it rounds K * scale to bf16 too): applying them in f32 would take a separate
// accumulation per scale group. Scales that are powers of two (scale_fmt ue8m0, as kv_cache_store
// writes them) make the tile's K * scale exact (e4m3 has 4 significant bits, bf16 8) for scales in
// [2^-53, 2^71] (above 2^71 the tile's 2^56 bias overflows: NaN), which covers every scale the store
// writes for |x| < 2^80, so those run on the Hopper kernel with the portable kernel's accuracy
// (H100: granularity 64 at 32K keys 360 TFLOP/s against 187).
// qk_math fp8 never has group scales (validate()); the Hopper kernel is its only one.
bool sm90_preferred(const SparsePrefillParams& spec_params) {
  // kv_staging bf16: the bf16 kernel reads the staged copy (its rounding is the staging's).
  const SparsePrefillParams p = attention_params(spec_params);
  if (!portable_supported(p)) return true;  // its only kernel
  const bool group_scales =
      p.kv_dtype == DType::fp8_e4m3 && p.quantization_granularity > 0 && p.quantization_granularity < 576;
  return !group_scales || p.scale_fmt == ScaleFmt::ue8m0;
}

SparsePrefillParams attention_params(const SparsePrefillParams& p) {
  if (p.kv_staging != KvStaging::bf16) return p;
  SparsePrefillParams a = p;
  a.kv_dtype = DType::bf16;
  a.quantization_granularity = 0;
  a.scale_fmt = ScaleFmt::fp32;
  a.kv_staging = KvStaging::none;
  return a;
}

size_t staged_bytes(const SparsePrefillParams& p, int64_t num_blocks, const char* field) {
  if (p.kv_staging != KvStaging::bf16) return 0;
  MLAJIT_EXPECT(num_blocks <= kMaxStagedRows / p.page_size, field, num_blocks,
                fmt::format("at most 2^31 / page_size = {} with params.kv_staging bf16 (the staged copy is indexed "
                            "by the int32 encoded index)",
                            kMaxStagedRows / p.page_size));
  const auto rows = static_cast<size_t>(num_blocks) * static_cast<size_t>(p.page_size);
  return rows * 576 * 2 + (static_cast<size_t>(num_blocks) + 15) / 16 * 16;
}

size_t partials_offset(const SparsePrefillParams& p, int64_t num_blocks) {
  return (staged_bytes(p, num_blocks) + 255) / 256 * 256;
}

size_t workspace_bytes(const SparsePrefillParams& p, int64_t num_blocks, const char* field) {
  const size_t staged = staged_bytes(p, num_blocks, field);
  if (!split_kernel(p)) return staged;
  return partials_offset(p, num_blocks) + static_cast<size_t>(kMaxSplitSlots * kPartialSlotBytes);
}

Sm90Plan sm90_plan(const SparsePrefillParams& spec_params) {
  namespace layout = mj::sparse_prefill_layout;
  const SparsePrefillParams p = attention_params(spec_params);
  if (!sm90_supported(p))
    throw_error(ErrorKind::Internal, "sparse_prefill: the sm90 kernel has no variant for quantization granularity {}",
                p.quantization_granularity);
  Sm90Plan plan;
  plan.head_tiles = layout::hopper_ctas_per_token(p.num_q_heads);  // Config::kCtasPerToken
  plan.heads_per_cta = p.num_q_heads / plan.head_tiles;
  plan.threads = layout::kHopperThreads;
  // Config::kPersistent: the bf16 kernel walks items (token x head tile) with a stride of its grid.
  plan.persistent = p.kv_dtype == DType::bf16;
  // Config::kSmemBytes (the generated source static_asserts the pairing).
  plan.smem_bytes = layout::hopper_layout(p.qk_math == QkMath::fp8, plan.persistent).smem_bytes;
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  plan.crossover = layout::hopper_crossover(p.num_q_heads, fp8, fp8 ? p.quantization_granularity : 0,
                                            p.qk_math == QkMath::fp8, fp8 && p.scale_fmt == ScaleFmt::ue8m0,
                                            p.kv_layout == CacheLayout::fp8_ds_mla);
  return plan;
}

}  // namespace mlajit::sparse_prefill
