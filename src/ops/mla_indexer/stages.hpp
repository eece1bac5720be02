#pragma once
// Internal entry of ops::mla_indexer that can run its two stages separately, so that the
// benchmark (src/ops/mla_indexer/bench.cpp) times the scores and the top-k stage on their own.
// Not part of the public API.
#include <cstdint>

#include "mlajit/ops.hpp"

namespace mlajit::ops::detail {

// SM count that kIndexerSmallGrid sizes the persistent grid for (prime: items rarely divide).
constexpr int kIndexerSmallGridSms = 7;

enum IndexerStage : unsigned {
  kIndexerScores = 1u,
  kIndexerTopk = 2u,
  // Use the portable (FMA) scores entry even on sm_90a, so that the GPU tests cover the path
  // that sm_80/sm_89 devices run.
  kIndexerForcePortable = 4u,
  // The persistent scorer with one work item per CTA (grid = items, the hardware deals the CTAs to
  // the SMs) instead of one persistent CTA per SM, so that tests and the benchmark compare the two
  // launches in one binary.
  kIndexerOneItemPerCta = 8u,
  // The persistent scorer's grid sized for kIndexerSmallGridSms SMs instead of the device's, so
  // that the GPU tests walk many work items per CTA, in uneven numbers, on any device.
  kIndexerSmallGrid = 16u,
  // The top-k stage with one CTA per row even where the plan would give each row a cluster of
  // CTAs (indexer::topk_ranks), for A/B runs and the tests' comparison of the two.
  kIndexerTopkOneCta = 32u,
};
// Bits 8..11 of `stages`: when nonzero, the top-k stage's CTAs per row (1, 2, 4 or 8; a cluster
// when > 1, sm_90 and newer) instead of the plan's choice (indexer::topk_ranks), for A/B runs.
constexpr unsigned kIndexerTopkRanksShift = 8u;
constexpr unsigned kIndexerTopkRanks(unsigned ranks) { return ranks << kIndexerTopkRanksShift; }

// Same contract as ops::mla_indexer; `stages` is a mask of IndexerStage. Running only the top-k
// stage reads whatever the workspace holds (the benchmark runs the scores stage first); with more
// than one chunk only the last chunk's scores are still there, so only the timing is meaningful.
void mla_indexer_run(const MlaIndexerParams& p, const TensorView& q, const TensorView& qs,
                     const TensorView& input_row_offsets, const PagedCacheView& k_cache, int layer_idx,
                     int64_t max_keys_per_seq, const TensorView& out, const TensorView& workspace, Stream stream,
                     unsigned stages);

}  // namespace mlajit::ops::detail
