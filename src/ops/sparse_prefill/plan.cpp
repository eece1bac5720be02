// Tiling and launch geometry of the sparse_prefill kernels (see ops/sparse_prefill/plan.hpp).
#include "ops/sparse_prefill/plan.hpp"

#include "mlajit/error.hpp"

namespace mlajit::sparse_prefill {

namespace {

int round_up(int x, int m) { return (x + m - 1) / m * m; }

}  // namespace

Sm80Plan sm80_plan(const SparsePrefillParams& spec_params) {
  const SparsePrefillParams p = attention_params(spec_params);
  Sm80Plan plan;
  // As few CTAs per token as the 64-head limit of one CTA allows (each CTA re-gathers the token's
  // keys), split evenly: 80 heads -> 2 x 48, 112 -> 2 x 64 (16 padding heads), 128 -> 2 x 64.
  const int row_tiles = p.num_q_heads / 16;
  plan.head_tiles = (row_tiles + 3) / 4;
  plan.m_tiles = (row_tiles + plan.head_tiles - 1) / plan.head_tiles;
  plan.heads_per_cta = 16 * plan.m_tiles;
  plan.head_tiles = (p.num_q_heads + plan.heads_per_cta - 1) / plan.heads_per_cta;
  plan.threads = 64 * plan.m_tiles;
  // 64 keys per step halves the Q fragment re-reads of 32; the footprint (at most ~226 KB) needs
  // the 227 KB opt-in of sm_90 / sm_100 class parts.
  plan.key_tile = 64;

  // Shared memory, region by region, exactly as templates/sparse_prefill/sm80.cuh Config lays it
  // out (the generated source static_asserts the total).
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  const int sbs = fp8 ? p.quantization_granularity : 0;
  const int spt = sbs > 0 ? 576 / sbs : 0;
  const bool exact_scales = sbs > 0 && sbs % 16 == 0;
  const int kt = plan.key_tile;
  const int q_bytes = plan.heads_per_cta * 1152;
  const int k_bytes = (fp8 ? 1 : 2) * kt * 1152;
  const int stage_bytes = fp8 ? kt * 576 : 0;
  const int scale_tile_bytes = exact_scales ? round_up(kt * spt * 4, 128) : 0;
  const int p_bytes = plan.heads_per_cta * (kt * 2 + 16);
  const int bias_bytes = 2 * kt * 4;
  const int red_bytes = 4 * plan.heads_per_cta * 4;
  plan.smem_bytes = q_bytes + k_bytes + stage_bytes + 2 * scale_tile_bytes + p_bytes + bias_bytes + red_bytes;
  return plan;
}

// templates/sparse_prefill/sm90.cuh covers every valid spec (heads 16..128, one or two CTAs per
// token; bf16, or fp8 with unit scales or a quantization granularity of at least 16 elements, which
// its scale tiles need: templates/sparse_prefill/sm90.cuh static_asserts this).
bool sm90_supported(const SparsePrefillParams& spec_params) {
  const SparsePrefillParams p = attention_params(spec_params);  // kv_staging bf16: the bf16 kernel
  return p.kv_dtype != DType::fp8_e4m3 || p.quantization_granularity == 0 || p.quantization_granularity >= 16;
}

bool sm80_supported(const SparsePrefillParams& p) { return p.qk_math != QkMath::fp8; }

bool persistent_kernel(const SparsePrefillParams& p) { return sm90_supported(p) && sm90_plan(p).persistent; }

// Measured on an H200 (2026-11-21; s_q 4096, H 128, top-k 2048, s_kv 32K, b_topk 64; TFLOP/s):
//   bf16:          sm90 450, sm80 241.
//   fp8 sbs 0:     sm90 400, sm80 212.      fp8 sbs 576: sm90 370, sm80 209.
//   fp8 sbs 64:    sm90 327, sm80 185; but the sm90 kernel rounds group scales to bf16 before
//                  applying them, so its lse is off by up to ~5e-3 against the f64 reference
//                  (the team's bar is 1e-4; sm80 applies them in f32: ~1e-6).
// The Hopper kernel is therefore preferred everywhere except fp8 group scales (0 < sbs < 576) of
// any f32 value, which stay on the portable kernel (exact for widths that are multiples of 16; for
// other widths it rounds K * scale to bf16 too): applying them in f32 would take a separate
// accumulation per scale block (docs/notes/sparse_prefill_sm90.md, 30). Scales that are powers of
// two (scale_fmt ue8m0, as kv_cache_store writes them) make the tile's K * scale exact (e4m3 has 4
// significant bits, bf16 8) for scales in [2^-53, 2^71] (above 2^71 the tile's 2^56 bias overflows:
// NaN), which covers every scale the store writes for |x| < 2^80, so those run on the Hopper kernel
// with the portable kernel's accuracy (session 20, H100: sbs 64 at 32K 360 TFLOP/s vs 187).
// qk_math fp8 never has group scales (validate()); the Hopper kernel is its only one.
bool sm90_preferred(const SparsePrefillParams& spec_params) {
  // kv_staging bf16: the bf16 kernel reads the staged copy (its rounding is the staging's).
  const SparsePrefillParams p = attention_params(spec_params);
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
  if (!persistent_kernel(p)) return staged;
  return partials_offset(p, num_blocks) + static_cast<size_t>(kMaxSplitSlots * kPartialSlotBytes);
}

Sm90Plan sm90_plan(const SparsePrefillParams& spec_params) {
  const SparsePrefillParams p = attention_params(spec_params);
  if (!sm90_supported(p))
    throw_error(ErrorKind::Internal, "sparse_prefill: the sm90 kernel has no variant for {}", KernelSpec{p}.name());
  Sm90Plan plan;
  plan.head_tiles = (p.num_q_heads + 63) / 64;  // Config::kCtasPerToken
  plan.heads_per_cta = p.num_q_heads / plan.head_tiles;
  plan.threads = 384;                           // two consumer warpgroups and a producer
  plan.num_stages = 2;
  // Config::kPersistent: the bf16 kernel walks items (token x head tile) with a stride of its grid.
  plan.persistent = p.kv_dtype == DType::bf16;
  // Config::kSmemBytes: bookkeeping (1872; the persistent kernel's five item / rope mbarriers: + 40) + 1024
  // alignment slack + Q and two 64-key K stages (3 x 73728) + WG1's P tile (8192). The FP8-math
  // kernel (Config<..., FP8_MATH = true>) has a layout of its own, 189520 bytes. The generated source
  // static_asserts both.
  plan.smem_bytes = p.qk_math == QkMath::fp8 ? 189520 : 1872 + (plan.persistent ? 40 : 0) + 1024 + 3 * 73728 + 8192;
  return plan;
}

}  // namespace mlajit::sparse_prefill
