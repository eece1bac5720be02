#pragma once
// `mlajit bench mla_indexer`: times ops::mla_indexer on the current GPU for one sequence of
// `new_tokens` new tokens after `cached_tokens` cached ones (s_kv = cached + new), with random
// fp8 q/k, random weights and scales, shuffled pages, 2 layers.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "mlajit/params.hpp"

namespace mlajit::bench {

struct MlaIndexerBenchArgs {
  int num_heads = 128;
  int64_t new_tokens = 4096;
  int64_t cached_tokens = 28672;
  int top_k = 2048;
  int reps = 20;
  int page_size = 64;
  Mask mask = Mask::causal;
  int num_stages = 0;  // MlaIndexerParams::num_stages (0 = heuristic)
};

// CUDA-event timings after warm-up, median of `reps`: {"scores_ms", "topk_ms", "total_ms",
// "score_tflops" (2 * visible pairs * H * 128 / scores time), "total_tflops", "visible_pairs",
// "workspace_bytes", "arch", the arguments}.
nlohmann::json bench_mla_indexer(const MlaIndexerBenchArgs& args);

}  // namespace mlajit::bench
