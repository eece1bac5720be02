#pragma once
// `mlajit bench sparse_prefill`: times sparse_prefill (SPEC §3) on the current GPU. `tokens` query
// tokens attend to `top_k` distinct random keys each out of `keys` tokens of one sequence whose pages
// are shuffled through a lookup table, in a paged latent cache of `layers` layers (default 2,
// interleaved page by page as the store writes them; the last layer is read), bf16 or fp8 (random
// positive scales per quantization group), with 16-bit or (qk_math fp8, Hopper only) FP8 math.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/params.hpp"
#include "ops/sparse_prefill/launch.hpp"

namespace mlajit::bench {

struct SparsePrefillBenchArgs {
  int64_t tokens = 4096;  // query tokens (the anchor ABI's s_q)
  int num_heads = 128;
  int top_k = 2048;       // keys selected per query token
  int64_t keys = 32768;   // keys in the cache (the anchor ABI's s_kv)
  // Decode shapes (batch > 0): `batch` sequences of `context` keys each, `next_n` query tokens per
  // sequence (tokens = batch * next_n, keys = batch * context), every token choosing its top_k keys
  // among its own sequence's: the cache a server decodes from, far larger than L2.
  int64_t batch = 0;
  int next_n = 1;
  int64_t context = 32768;
  DType kv_dtype = DType::bf16;
  int page_size = 64;
  int layers = 2;  // layers of the paged cache (1..64); 1 = one contiguous layer, FlashMLA's own layout
  int quantization_granularity = 0;  // fp8 only (0 = unit scales)
  ScaleFmt scale_fmt = ScaleFmt::fp32;  // ue8m0: the random scales are powers of two (params.scale_fmt)
  QkMath qk_math = QkMath::bf16;  // fp8: the FP8-math kernel (fp8 cache, quantization_granularity 0 | 576, sm_90a)
  // kv_staging bf16: the selected fp8 rows are staged as bf16 in a workspace first (params.kv_staging);
  // stage_rows: auto | all | marked (sparse_prefill::StageRows), the staging's row choice.
  KvStaging kv_staging = KvStaging::none;
  std::string stage_rows = "auto";
  // fp8_ds_mla: the cache holds FlashMLA's 656-byte records (kv_dtype fp8_e4m3, granularity 128).
  CacheLayout kv_layout = CacheLayout::split;
  bool attn_sink = false;
  bool emit_lse = true;
  int reps = 20;
  std::string path = "auto";  // auto | portable | sm90
  int64_t ctas = 0;  // grid of the persistent sm90 kernel (bf16); 0 = automatic (sparse_prefill::launch)
  // The persistent kernel's tail split: 0 = automatic, 1 = off, N = at most N parts per split item.
  // When a split runs, the same launch without it is timed too ("unsplit" in the JSON).
  int split_parts = 0;
  // The crossover (sparse_prefill/launch.hpp crossover_taken): automatic, or forced on / off.
  sparse_prefill::Crossover crossover = sparse_prefill::Crossover::automatic;
  // Optional: a shared library timed side by side on the same inputs (see below); "" = none.
  std::string anchor;
};

// Anchor ABI (`mlajit bench sparse_prefill --anchor LIB.so`): LIB is dlopened and must export
//   extern "C" int anchor_sparse_prefill_bf16(const void* q, const void* kv, long long s_kv,
//       const int* indices, int s_q, int h_q, int topk, float sm_scale,
//       const float* attn_sink /*nullable*/, const int* topk_length /*nullable*/, void* out,
//       float* max_logits, float* lse, void* stream /*a CUstream*/);   // 0 = launched
// and optionally `const char* anchor_sparse_prefill_info(void)`. Layouts (contiguous): q bf16
// [s_q, h_q, 576], kv bf16 [s_kv, 1, 576], indices int32 [s_q, 1, topk] (positions into kv),
// attn_sink f32 [h_q], out bf16 [s_q, h_q, 512], max_logits / lse f32 [s_q, h_q]; lse natural log
// without the sink, out = sum p v / (sum p + exp(sink)) -- the op's semantics (SPEC §3). Needs
// top_k % 128 == 0; h_q is heads rounded up to a multiple of 64 (more heads run padded: zero query
// heads and sinks past H, only the first H compared; the JSON's anchor.heads_run says how many ran).
// The anchor gets the same q, the same key rows (an fp8 cache
// dequantised to bf16, also with qk_math fp8: the anchor stays the 16-bit kernel it is compared
// against) and the same keys per query as mlajit; both are timed in alternating reps, each after
// an L2 flush.

// Decode anchor ABI (decode shapes, batch > 0): when LIB exports
//   extern "C" int anchor_sparse_decode_fp8_ds_mla(const void* q, const void* kv, const int* indices,
//       const int* topk_lengths /*null*/, const float* attn_sink /*nullable*/, void* out, float* lse,
//       int b, int s_q, int h_q, int topk, int num_blocks, int page_size, float sm_scale,
//       void* workspace, size_t workspace_bytes, int phase, void* stream);
//   extern "C" size_t anchor_sparse_decode_fp8_ds_mla_workspace(int b, int s_q, int h_q, int topk, int num_sms);
// it is timed instead: q bf16 [b, s_q, h_q, 576], kv the fp8_ds_mla records [num_blocks, page_size,
// 656] of the same keys (each selected row of the read layer, decoded to bf16 and quantized as
// FlashMLA's reference quantizer does: per 128 dims scale 2^ceil(log2(max(amax / 448, 1e-4))), the
// rope dims as bf16), indices int32 [b, s_q, top_k] the same encoded indices, out bf16 [b, s_q, h_q,
// 512], lse f32 [b, s_q, h_q]; h_q 64 or 128 (fewer heads run padded to 64, and the JSON says so).
// phase 0 computes the scheduler metadata (once, untimed), phase 1 reuses it, as a serving loop does.

// CUDA-event timings after 3 warm-up launches over `reps` launches:
//   {"op", "params", "path", "arch", "device", "tokens", "num_heads", "top_k", "keys", "reps",
//    "flops" (2 * tokens * top_k * H * (576 + 512)), "ms": {"median", "min", "max"},
//    "tflops" (flops / median), "tflops_best" (flops / min)}; with kv_staging bf16 also
//    "stage": {"rows" (all | marked, as resolved), "ms_median" (the staging kernels alone, timed in
//    the same interleaved reps; "ms" above is staging + attention, the op's whole cost)}; and with an anchor
//    "anchor": {"library", "info", "ms_median", "tflops", "ratio" (anchor ms / mlajit ms: > 1 means
//    mlajit is faster), "with_topk_length": {"ms_median", "tflops", "ratio"} (the anchor again, given
//    the per-token lengths that mlajit always reads; timed in the same interleaved reps),
//    "compare": {"out_rel_frobenius", "lse_max_abs_diff"}} (mlajit vs anchor). Always "crossover"
//    (whether the launch ran it, sparse_prefill/launch.hpp crossover_taken) and "split":
//    {"first", "parts", "units"} (the persistent kernel's tail split; parts 1: none; with the
//    crossover also "resident_clusters", the clusters of 2 the device holds at once, which its
//    split over tokens is sized to), and when a
//    split ran "unsplit": {"ms_median", "tflops", "speedup" (unsplit ms / split ms), "ratio" (with an
//    anchor: anchor ms / unsplit ms)}, the same launch without the split in the same reps.
// Every timed launch follows a 256 MiB device write (L2 flush).
// Throws Error(InvalidArgument) for bad arguments, Error(Driver) without a GPU.
nlohmann::json bench_sparse_prefill(const SparsePrefillBenchArgs& args);

}  // namespace mlajit::bench
