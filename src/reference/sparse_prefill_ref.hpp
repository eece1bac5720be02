#pragma once
// CPU f64 reference of sparse_prefill (SPEC §3) on the decoded inputs, plus the host-side data
// helpers its tests and benchmark share: bf16 / fp8 e4m3 encode-decode and a random paged latent
// cache with per-row scales.
#include <cstdint>
#include <random>
#include <vector>

#include "mlajit/params.hpp"

namespace mlajit::ref {

// ---- accuracy bounds against this reference ------------------------------------------------------
// 16-bit math (qk_math bf16) is held to SPEC §3: relative Frobenius error < 1e-2, cosine > 0.9999,
// |lse - ref| < 1e-4. The FP8-math mode (qk_math fp8) has bounds of its own, used by the GPU tests
// (tests/gpu/test_sparse_prefill.cpp) and `mlajit check`. Its error comes from rounding q (per
// token and head, scale amax / 448) and P (256 P) to e4m3: about 3% of each score's and each
// probability's value, so the lse error grows with the spread of the logits, i.e. with the
// softmax scale for given q and k. Measured on an H100 on
// the random test data (normal q and k, scale amax / 448): at softmax scale 1/sqrt(576) relative
// Frobenius 0.017-0.033, cosine >= 0.99946, lse max error 0.008-0.058; at 0.2 (logits 4.8x wider)
// 0.055, 0.9985, 0.38. The bounds leave ~30% above the worst measured relative Frobenius and lse
// error of each tier (cosine: about twice the measured distance from 1); they are measured at those
// two softmax scales only (the second tier extrapolates the lse bound linearly in the scale).
struct Fp8MathBounds {
  double max_rel_frobenius;
  double min_cosine;
  double max_lse_abs_err;
};
inline Fp8MathBounds fp8_math_bounds(double softmax_scale) {
  if (softmax_scale <= 0.05) return {0.045, 0.999, 0.08};
  // Sharper softmax: the lse error scales with the logits (0.38 measured at 0.2).
  return {0.08, 0.997, 2.5 * softmax_scale};
}

// ---- element codecs (host) ------------------------------------------------------------------------
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);  // round to nearest even (NaN stays NaN)
float e4m3_to_float(uint8_t b);   // exact; 0x7F / 0xFF are NaN
uint8_t float_to_e4m3(float f);   // round to nearest even, saturating to +-448 (satfinite)

// ---- the op's inputs, on the host ------------------------------------------------------------------
struct SparsePrefillProblem {
  SparsePrefillParams p;
  int64_t num_tokens = 0;
  int64_t num_blocks = 0;
  int64_t num_layers = 1;
  int layer_idx = 0;
  float softmax_scale = 0.f;
  int64_t indices_stride = 0;
  std::vector<uint16_t> q;             // bf16 bits [T, H, 576]
  std::vector<uint8_t> blocks;         // raw kv_dtype bytes [num_blocks, 1, num_layers, page_size, 1, 576]
  std::vector<float> scales;           // [num_blocks, 1, num_layers, page_size, 1, spt] (fp8, quantization_granularity > 0)
  std::vector<uint32_t> indices;       // [T, indices_stride] encoded (block * page_size + offset)
  std::vector<uint32_t> topk_lengths;  // [T]
  std::vector<float> attn_sink;        // [H] when p.attn_sink

  int64_t row_stride() const { return num_layers * p.page_size; }
  int64_t num_kv_rows() const { return (num_blocks - 1) * row_stride() + p.page_size; }
  size_t block_bytes() const;  // bytes of `blocks`
};

struct SparsePrefillResult {
  std::vector<double> out;  // [T, H, 512]
  std::vector<double> lse;  // [T, H]; +inf for a row with no valid slot
};

// The decoded 576-vector of cache row `row` (absolute row: tma_row + layer_row_offset).
void decode_row(const SparsePrefillProblem& pb, int64_t row, double* k576);

// params.kv_staging bf16 (templates/sparse_prefill/stage_bf16.cuh): cache row `row` (absolute) as
// the staging writes it: each element e4m3 * scale in f32, rounded once to bf16 (bits).
void staged_bf16_row(const SparsePrefillProblem& pb, int64_t row, uint16_t* out576);
// The problem the attention kernel of kv_staging bf16 solves: pb over a bf16 cache of the same
// layout holding staged_bf16_row of every row (params: kv_dtype bf16, no scales, no staging).
SparsePrefillProblem staged_bf16_problem(const SparsePrefillProblem& pb);

// True iff slot j of token t is read (SPEC §3; lengths above the stride are clamped to it).
bool slot_valid(const SparsePrefillProblem& pb, int64_t t, int64_t j);

// The reference, threaded over tokens (`threads` 0: hardware concurrency).
SparsePrefillResult sparse_prefill_reference(const SparsePrefillProblem& pb, unsigned threads = 0);

// ---- random problems --------------------------------------------------------------------------------
struct SparsePrefillShape {
  int64_t num_tokens = 1;
  int64_t indices_stride = 128;   // multiple of b_topk
  int64_t num_blocks = 0;         // 0: enough pages for `kv_tokens` tokens (+1 spare)
  int64_t kv_tokens = 4096;       // logical tokens the indices point into
  int64_t num_layers = 2;
  int layer_idx = 1;
  float softmax_scale = 0.0416667f;  // 1 / sqrt(576)
  // Test-data knobs (SPEC §4): fraction of invalid (0xFFFFFFFF / negative) and out-of-range slots,
  // tokens with no valid slot, and lengths drawn in [1, stride] (never a multiple of b_topk unless
  // it is the stride). Benchmarks turn these off.
  bool irregular = true;
  // scale_fmt ue8m0 data: each group of a row is scaled by 2^k, k uniform in [lo, hi], before it is
  // quantized, so that the row's power-of-two scales differ (by up to 2^(hi - lo)).
  int ue8m0_group_exp_lo = -3, ue8m0_group_exp_hi = 3;
};

// Random normal q and cache (bf16, or fp8 quantized per group of quantization_granularity elements
// with scale = amax / 448; unit scales when quantization_granularity is 0), pages shuffled through a random permutation, distinct
// random token indices per row encoded to physical rows.
SparsePrefillProblem make_random_problem(const SparsePrefillParams& p, const SparsePrefillShape& s, uint64_t seed);

}  // namespace mlajit::ref
