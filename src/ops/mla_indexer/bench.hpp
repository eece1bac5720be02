#pragma once
// `mlajit bench mla_indexer`: times ops::mla_indexer on the current GPU for one sequence of
// `new_tokens` new tokens after `cached_tokens` cached ones (s_kv = cached + new), with random
// fp8 q/k, random weights and scales, shuffled pages, 2 layers.
#include <cstdint>
#include <string>

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
  // MlaIndexerParams::block_kv: 0 (heuristic) / 256 = the persistent scorer (256-key blocks), 64 = the
  // tile scorer (64-key tiles).
  int block_kv = 0;
  // The persistent scorer's grid: persistent (one CTA per SM walking work items, the op's launch)
  // or one work item per CTA (ops::detail::kIndexerOneItemPerCta), for A/B runs in one binary.
  bool persistent = true;
  // Optional: path of a shared library exporting DeepGEMM-style fp8 MQA logits (the C ABI below),
  // timed beside mlajit's scores stage on the same q, weights, K (gathered dense) and scales.
  std::string anchor;
};

// Anchor C ABI (dlopen'ed; `--anchor PATH` of `mlajit bench mla_indexer`):
//   int anchor_mqa_logits(const void* q_fp8, const void* k_fp8, const float* k_scales,
//       const float* weights, const int* ks, const int* ke, float* logits, long long logits_stride,
//       int seq_len, int seq_len_kv, int num_heads, int head_dim, void* stream);   // 0 = ok
//   long long anchor_mqa_logits_stride(int seq_len_kv);   // floats per logits row it needs
// computing logits[i, j] = k_scales[j] * sum_h relu(q[i,h,:] . k[j,:]) * weights[i,h] for
// ks[i] <= j < ke[i]. The bench gives it q [T, H, 128] e4m3, k [s_kv, 128] e4m3, k_scales f32
// [round_up(s_kv, 4)], weights f32 [T, H], ks/ke int32 [T], logits f32 [round_up(T, 4), stride]
// (it may write whole row blocks past T and columns past ke), every pointer 256-byte aligned.
// A nonzero return (e.g. a head count it does not support) is reported, not thrown.

// CUDA-event timings after warm-up, L2 flushed (256 MB memset) before every timed launch, the
// stages interleaved rep by rep, median of `reps`: {"scores_ms", "topk_ms", "total_ms",
// "score_tflops" (2 * visible pairs * H * 128 / scores time), "total_tflops", "visible_pairs",
// "workspace_bytes", "arch", the arguments}, and with an anchor "anchor": {"scores_ms",
// "score_tflops", "mlajit_over_anchor" (scores time ratio), "max_rel_diff" (last row, relative to
// its largest |score|), "info"} or {"error"}.
nlohmann::json bench_mla_indexer(const MlaIndexerBenchArgs& args);

}  // namespace mlajit::bench
