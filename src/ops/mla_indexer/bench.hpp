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
  // Decode shapes (batch > 0): `batch` sequences of `context` keys each, the last `next_n` of
  // them new (causal inside the step), T = batch * next_n query rows; one cache layer (engines keep
  // one cache tensor per layer), far larger than L2. Replaces new_tokens / cached_tokens.
  int64_t batch = 0;
  int next_n = 1;
  int64_t context = 32768;
  // The top-k stage's CTAs per row (1, 2, 4, 8) instead of the plan's (0), sm_90 and newer.
  int topk_ranks = 0;
  // Decode shapes: the K cache mlajit reads, split (fp8 blocks + scales) or fp8_page_scales (the
  // engines' pages, the anchor's buffer).
  CacheLayout k_layout = CacheLayout::split;
  // Optional: path of a shared library exporting DeepGEMM-style fp8 MQA logits (the C ABI below),
  // timed beside mlajit's scores stage on the same q, weights, K (gathered dense) and scales; at
  // decode shapes its paged logits (the decode ABI below) instead.
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
//
// Decode anchor ABI (decode shapes, batch > 0): when LIB exports
//   extern "C" size_t anchor_paged_mqa_logits_meta_bytes(int num_sms);
//   extern "C" int anchor_paged_mqa_logits(const void* q_fp8, const void* kv_cache, const float* weights,
//       const int* context_lens, const int* block_table, int max_blocks_per_seq, float* logits,
//       long long logits_stride, int b, int next_n, int num_heads, int num_blocks, int max_context_len,
//       void* meta, int num_sms, int phase, void* stream);   // 0 = launched
// (DeepGEMM's fp8_paged_mqa_logits and its schedule metadata kernel) it is timed instead: q e4m3
// [b, next_n, H, 128] (the same bytes as mlajit's q), kv_cache the same keys in the engines' page
// layout [num_blocks, 64, 1, 132] (per 64-token page: 64 x 128 e4m3, then 64 f32 scales), weights
// = mlajit's qs [b * next_n, H], context_lens int32 [b], block_table int32 [b, max_blocks_per_seq]
// (mlajit's lookup table), logits f32 [b * next_n, logits_stride]. Phase 0 (the metadata from the
// context lengths) runs once, untimed, as a serving loop computes it once per step for every
// layer; phase 1 is timed. Token j of next_n sees keys < context - next_n + j + 1, as mlajit's
// causal mask.
//
// Decode result: {"decode": {"batch", "next_n", "context"}, "scores_ms", "topk_ms", "total_ms",
// "topk_ranks" (CTAs per row of the top-k stage: a cluster when > 1), "topk_one_cta_ms" (the
// top-k stage with one CTA per row, timed in the same reps),
// "k_bytes" (the distinct K and scale bytes the rows read: batch x context x 132), "k_tbps"
// (k_bytes / total time), "scores_k_tbps", ... as above}, and with an anchor "anchor": {"info",
// "logits_ms", "k_tbps", "total_over_anchor" (mlajit scores + top-k / anchor logits: <= 1 means
// mlajit selects in less time than the anchor only scores), "scores_over_anchor", "max_rel_diff"
// (the last row's scores, relative to its largest |score|)} or {"error"}.
nlohmann::json bench_mla_indexer(const MlaIndexerBenchArgs& args);

}  // namespace mlajit::bench
