#pragma once
// CPU f64 reference of mla_indexer (SPEC §2): scores and exact top-k with the kernel's rules
// (descending score, ties to the smaller position, NaN below every number, -1 past min(k, visible)),
// plus the SPEC §1 remap for emit = physical. Host copies of the device inputs, same layouts.
#include <cstdint>
#include <vector>
#include <cstddef>

#include "mlajit/params.hpp"

namespace mlajit::ref {

// Host mirror of ops::mla_indexer's inputs (K cache with num_heads 1, head_size 128, is_mla).
struct IndexerInputs {
  int num_heads = 64;
  int page_size = 64;
  Mask mask = Mask::causal;
  std::vector<uint8_t> q;               // fp8 e4m3 [T, H, 128]
  std::vector<float> qs;                // [T, H]
  std::vector<uint32_t> row_offsets;    // [B + 1]
  std::vector<uint32_t> cache_lengths;  // [B]
  std::vector<uint32_t> lookup_table;   // [B, pages_per_seq]
  int64_t pages_per_seq = 0;
  std::vector<uint8_t> k_blocks;        // fp8 [num_blocks, 1, num_layers, page_size, 1, 128]
  std::vector<float> k_scales;          // [num_blocks, 1, num_layers, page_size, 1, scale_row_stride]
  int64_t num_blocks = 0;
  int num_layers = 1;
  int layer = 0;
  int scale_row_stride = 1;
  int64_t max_keys = 0;                 // bound on L + S; keys past it are not visible

  int64_t num_tokens() const { return static_cast<int64_t>(qs.size()) / num_heads; }
  int batch() const { return static_cast<int>(row_offsets.size()) - 1; }
};

double e4m3_to_double(uint8_t b);

// Sequence of token t (-1 if none) and its visible key count.
struct RefToken {
  int seq = -1;
  int64_t visible = 0;
};
RefToken ref_token(const IndexerInputs& in, int64_t t);

// Cache row of key j of sequence b, -1 when its page/block is unmapped (such a key scores 0).
int64_t ref_key_row(const IndexerInputs& in, int b, int64_t j);

// Scores of token t against its visible keys [0, visible), in f64.
std::vector<double> indexer_scores_ref(const IndexerInputs& in, int64_t t);

// Magnitude of the sums behind each visible key's score of token t:
// |k_scale_j| * sum_h |qs[t,h]| * sum_d |q[t,h,d] * k_j[d]|. A reduced-precision accumulator (the fp8
// tensor-core path) errs relative to this, not to the score, which cancels across heads of either
// weight sign and can be far smaller.
std::vector<double> indexer_score_magnitudes_ref(const IndexerInputs& in, int64_t t);

// Top-k positions of `scores` (any floating type converted to double) with the kernel's order;
// -1 past min(k, n). -0 == +0 (a tie).
std::vector<int32_t> topk_ref(const std::vector<double>& scores, int k);
std::vector<int32_t> topk_ref_f32(const std::vector<float>& scores, int k);

// SPEC §1 remap of a logical position of sequence b (-1 for negative or unmapped).
int32_t encode_ref(const IndexerInputs& in, int b, int32_t pos);

// Nearest e4m3 value (ties to even code), saturating to +-448; never NaN.
uint8_t e4m3_from_double(double x);

// Test data per SPEC §4: random normal q/k (fp8), random weights and scales, pages shuffled
// through the lookup table (unused table slots hold an out-of-range block id), `num_layers`
// layers all filled with different data, a ragged batch.
struct IndexerCase {
  int num_heads = 64;
  int page_size = 64;
  Mask mask = Mask::causal;
  std::vector<int> new_tokens;    // S per sequence
  std::vector<int> cache_lens;    // L per sequence
  int num_layers = 2;
  int layer = 1;
  uint64_t seed = 1;
  int spare_blocks = 3;           // blocks no sequence uses
  // Heavy ties: every key is one of `palette` vectors (with its scale), and every third token's q
  // is all zeros (all its scores are exactly 0).
  bool ties = false;
  int palette = 5;
  // Keys whose scale is NaN (their scores are NaN and rank last): every nan_every-th position.
  int nan_every = 0;
};
IndexerInputs make_indexer_inputs(const IndexerCase& c);

}  // namespace mlajit::ref
