#pragma once
// Typed entry points of every op. Each validates its params and the tensor views against them
// (shapes, dtypes, contiguity; errors name the argument), fetches the specialized kernel from the
// runtime (memory cache → disk cache → NVRTC) and launches it on `stream`. All pointers are
// device pointers; nothing here synchronizes.
#include <cstddef>
#include <cstdint>

#include "mlajit/params.hpp"
#include "mlajit/tensor.hpp"

namespace mlajit::ops {

// The paged cache of SPEC §1, as views. Layout fp8_ds_mla: blocks are u8 records [num_blocks, 1,
// num_layers, page_size, 656] (one layer: also [num_blocks, page_size, 656] or [num_blocks,
// page_size, 1, 656]) and scales is empty.
struct PagedCacheView {
  TensorView blocks;         // [num_blocks, kv_dim, num_layers, page_size, num_heads, head_size] of dtype
  TensorView scales;         // [num_blocks, kv_dim, num_layers, page_size, num_heads, head_dim_granularity] f32; fp8 only
  TensorView lookup_table;   // u32[B, pages_per_seq]: logical page -> physical block
  TensorView cache_lengths;  // u32[B]: tokens already cached before this step
};

// SPEC §1 kv_cache_store. x[T, num_heads, head_size] of input_dtype; input_row_offsets u32[B+1].
// `dropped` (u32[1], may be empty) is incremented by the number of tokens that were not written
// because their page is outside the lookup table or their block id is >= num_blocks.
void kv_cache_store(const KvCacheStoreParams& p, const TensorView& x, const TensorView& input_row_offsets,
                    const PagedCacheView& cache, int layer_idx, int kv_idx, const TensorView& dropped,
                    Stream stream = nullptr);

// SPEC §1 kv_cache_gather. y[T', num_heads, head_size] (output_dtype) of the tokens given by
// batch_ids u32[T'] and positions u32[T'] (logical positions). Rows whose page is outside the table
// or whose block is >= num_blocks are written as NaN (poison) and counted in `dropped` (optional).
void kv_cache_gather(const KvCacheGatherParams& p, const PagedCacheView& cache, const TensorView& batch_ids,
                     const TensorView& positions, int layer_idx, int kv_idx, const TensorView& y,
                     const TensorView& dropped, Stream stream = nullptr);

// SPEC §1 sparse_index_remap. indices i32[T, K] of logical positions, token t belongs to the
// sequence b with input_row_offsets[b] <= t < input_row_offsets[b+1]; out i32[T, K] encoded.
void sparse_index_remap(const SparseIndexRemapParams& p, const TensorView& indices,
                        const TensorView& input_row_offsets, const TensorView& lookup_table, int64_t num_blocks,
                        const TensorView& out, Stream stream = nullptr);

// SPEC §2 mla_indexer. q fp8[T, H, D], qs f32[T, H], input_row_offsets u32[B+1], k_cache with
// num_heads 1, head_size D, is_mla; out i32[T, top_k]. `workspace` is device scratch (16-byte
// aligned): mla_indexer_workspace_bytes(...) bytes run the fewest chunks (at most 128 MiB, or one
// score row of round_up(max_keys_per_seq, 4) floats if that is larger); any size of at least one
// score row works, in more chunks. Keys past max_keys_per_seq are treated as not visible.
size_t mla_indexer_workspace_bytes(const MlaIndexerParams& p, int64_t total_tokens, int64_t max_keys_per_seq);
void mla_indexer(const MlaIndexerParams& p, const TensorView& q, const TensorView& qs,
                 const TensorView& input_row_offsets, const PagedCacheView& k_cache, int layer_idx,
                 int64_t max_keys_per_seq, const TensorView& out, const TensorView& workspace,
                 Stream stream = nullptr);

// SPEC §3 sparse_prefill. q bf16[T, H, 576]; kv: blocks (and fp8 scales) of the latent cache;
// indices u32[T, indices_stride] encoded; topk_lengths u32[T]; attn_sink f32[H] iff p.attn_sink;
// out bf16[T, H, 512]; lse f32[T, H] iff p.emit_lse.
// `workspace`: device scratch of sparse_prefill_workspace_bytes(p, num_blocks) bytes (num_blocks =
// kv.blocks dim 0), 16-byte aligned, or an empty view (the overload without it passes one):
// - p.kv_staging bf16 requires its first part: the selected fp8 rows are converted into it once per
//   launch and the bf16 kernel reads them there;
// - the 16-bit Hopper kernels (every spec but qk_math fp8, on sm_90a) split items over keys where
//   the workspace holds their partial slots (~33.7 MB) and run unsplit without them: with fewer
//   items (tokens x head tiles) than SMs, i.e. decode, every item in parts of at least 128 keys
//   (the decode plan: 3.5x faster at one token over 2048 keys); otherwise the last round's items
//   (+0.7-1.2 % at 4096 tokens). The split depends only on the shapes and the SM count, so a CUDA
//   graph replays it. Launches that may overlap (other streams) must not share a workspace. The
//   size depends on the spec only (off sm_90a the slots are unused).
// sparse_prefill_workspace_bytes is 0 for qk_math fp8. p.kv_layout fp8_ds_mla: kv.blocks holds the
// records kv_cache_store writes, u8 [num_blocks, 1, num_layers, page_size, 656], no kv.scales.
size_t sparse_prefill_workspace_bytes(const SparsePrefillParams& p, int64_t num_blocks);
void sparse_prefill(const SparsePrefillParams& p, const TensorView& q, const PagedCacheView& kv,
                    const TensorView& indices, const TensorView& topk_lengths, int layer_idx, float softmax_scale,
                    const TensorView& attn_sink, const TensorView& out, const TensorView& lse,
                    const TensorView& workspace, Stream stream = nullptr);
void sparse_prefill(const SparsePrefillParams& p, const TensorView& q, const PagedCacheView& kv,
                    const TensorView& indices, const TensorView& topk_lengths, int layer_idx, float softmax_scale,
                    const TensorView& attn_sink, const TensorView& out, const TensorView& lse,
                    Stream stream = nullptr);

}  // namespace mlajit::ops
