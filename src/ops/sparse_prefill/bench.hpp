#pragma once
// `mlajit bench sparse_prefill`: times sparse_prefill (SPEC §3) on the current GPU. s_q query
// tokens attend to `topk` distinct random keys each out of s_kv tokens of one sequence whose pages
// are shuffled through a lookup table, in a 2-layer paged latent cache (layer 1 read), bf16 or fp8
// (random positive scales per scale block).
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/params.hpp"

namespace mlajit::bench {

struct SparsePrefillBenchArgs {
  int64_t s_q = 4096;
  int num_heads = 128;
  int topk = 2048;
  int64_t s_kv = 32768;
  DType kv_dtype = DType::bf16;
  int b_topk = 64;
  int page_size = 64;
  int scale_block_size = 0;  // fp8 only (0 = unit scales)
  bool attn_sink = false;
  bool emit_lse = true;
  int reps = 20;
  std::string path = "auto";  // auto | sm80 | sm90
};

// CUDA-event timings after 3 warm-up launches over `reps` launches:
//   {"op", "params", "path", "arch", "device", "s_q", "num_heads", "topk", "s_kv", "reps",
//    "flops" (2 * sum(topk_lengths) * H * (576 + 512)), "ms": {"median", "min", "max"},
//    "tflops" (flops / median), "tflops_best" (flops / min)}.
// Throws Error(InvalidArgument) for bad arguments, Error(Driver) without a GPU.
nlohmann::json bench_sparse_prefill(const SparsePrefillBenchArgs& args);

}  // namespace mlajit::bench
