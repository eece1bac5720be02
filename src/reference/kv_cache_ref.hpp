#pragma once
// CPU reference of the paged KV cache ops (SPEC §1): kv_cache_store, kv_cache_gather and
// sparse_index_remap, on host copies of the cache.
//
// Precision: these ops do no accumulation, only single rounded operations, so the reference
// evaluates exactly the f32 formulas the SPEC defines and the kernels must match it bit for bit:
//   fp8 store:  amax = max |x| (NaN ignored), s = max(amax, 1e-4f) / 448.0f (IEEE f32 division),
//               ue8m0: s rounded up to a power of two (exact, on the bits),
//               q = e4m3_rne_satfinite(x / s) (IEEE f32 division)
//   fp8 gather: y = cast(f32(q) * s) (one f32 product, then a round-to-nearest-even cast)
//   otherwise:  y = cast(x) (round to nearest even).
//   layout fp8_ds_mla (one 656-byte record per token): per 128-element tile of dims 0..511,
//               s = 2^ceil(log2(max(RN(amax / 448), 1e-4f))) (exact, on the bits), q = e4m3(x / s);
//               dims 512..575 as bf16 (bf16 input copied verbatim); gather: cast(f32(q) * s), the
//               rope cast from bf16.
#include <cstdint>
#include <vector>

#include "mlajit/params.hpp"

namespace mlajit::ref {

// The cache of SPEC §1 on the host: blocks [num_blocks, kv_dim, num_layers, page_size, num_heads,
// head_size] as raw bytes of params.dtype, and for fp8 f32 scales [..., head_dim_granularity];
// layout fp8_ds_mla: blocks [num_blocks, 1, num_layers, page_size, 656] bytes, no scales.
// Layout fp8_page_scales is held as the split layout (128-byte rows and their f32 scales);
// page_scales_bytes() lays it out as the device holds it.
struct HostPagedCache {
  PagedKVCacheParams params;
  int64_t num_blocks = 0;
  std::vector<uint8_t> blocks;
  std::vector<float> scales;

  HostPagedCache(const PagedKVCacheParams& p, int64_t num_blocks);
  // Row of (physical block, kv index, layer, page offset): one token's [num_heads, head_size] slab.
  int64_t row(uint32_t blk, int kv_idx, int layer_idx, uint32_t offset) const;
  size_t row_bytes() const;     // num_heads * head_size * dtype size (fp8_ds_mla: 656)
  int scales_per_row() const;   // num_heads * head_dim_granularity (fp8, split layout), else 0
  uint8_t* row_data(int64_t r) { return blocks.data() + static_cast<size_t>(r) * row_bytes(); }
  const uint8_t* row_data(int64_t r) const { return blocks.data() + static_cast<size_t>(r) * row_bytes(); }
  float* row_scales(int64_t r) { return scales.data() + static_cast<size_t>(r) * scales_per_row(); }
  const float* row_scales(int64_t r) const { return scales.data() + static_cast<size_t>(r) * scales_per_row(); }
  // Layout fp8_page_scales as the engines store it (SPEC §1), built by hand from the split copy:
  // page (block, layer) = its page_size rows' 128 e4m3, then their page_size f32 scales.
  std::vector<uint8_t> page_scales_bytes() const;
};

// Layout fp8_page_scales from the split layout's bytes (SPEC §1): `pages` pages of page_size rows
// of 128 e4m3 (`rows`, page after page) and their f32 scales (`scales`, one per row), each page
// laid out as its rows' bytes, then their scales.
std::vector<uint8_t> page_scales_from_split(const uint8_t* rows, const float* scales, size_t pages, int page_size);

// s = max(amax, 1e-4f) / 448.0f in f32; ue8m0: rounded up to a power of two.
float fp8_group_scale(float amax, ScaleFmt fmt);
// Tile scale of layout fp8_ds_mla (FlashMLA's quantizer): 2^ceil(log2(max(RN(amax / 448), 1e-4f))),
// the power of two found on the bits (exact).
float ds_mla_tile_scale(float amax);
// The smallest power of two >= s (s > 0; inf stays inf), by clearing the mantissa and carrying
// into the exponent.
float ue8m0_round_up(float s);

// The physical block and page offset of logical position `pos` of sequence b; false when the
// page is past the table (pages_per_seq) or the block id is >= num_blocks.
bool resolve_slot(const std::vector<uint32_t>& lookup_table, int pages_per_seq, int64_t num_blocks, int page_size,
                  int b, uint64_t pos, uint32_t* blk, uint32_t* offset);

// kv_cache_store: x holds num_tokens * num_heads * head_size elements of p.input_dtype. Token t
// of sequence b (row_offsets[b] <= t < row_offsets[b + 1]) goes to logical position
// cache_lengths[b] + t - row_offsets[b]. Returns the number of tokens not written (page past
// the table, block >= num_blocks, or t outside every sequence).
int64_t kv_cache_store(const KvCacheStoreParams& p, const std::vector<uint8_t>& x, int64_t num_tokens,
                       const std::vector<uint32_t>& row_offsets, const std::vector<uint32_t>& cache_lengths,
                       const std::vector<uint32_t>& lookup_table, int pages_per_seq, int layer_idx, int kv_idx,
                       HostPagedCache& cache);

// kv_cache_gather into y (resized to batch_ids.size() * num_heads * head_size elements of
// p.output_dtype). Rows that do not exist (batch id >= batch, page past the table, block >=
// num_blocks) are NaN; returns their count.
int64_t kv_cache_gather(const KvCacheGatherParams& p, const HostPagedCache& cache,
                        const std::vector<uint32_t>& lookup_table, int batch, int pages_per_seq,
                        const std::vector<uint32_t>& batch_ids, const std::vector<uint32_t>& positions, int layer_idx,
                        int kv_idx, std::vector<uint8_t>& y);

// sparse_index_remap of indices i32 [num_tokens, k]: e = lut[b, t / page_size] * page_size +
// t % page_size; -1 for a negative index, a page past the table, a block >= num_blocks or a
// token outside every sequence.
std::vector<int32_t> sparse_index_remap(int page_size, const std::vector<int32_t>& indices, int64_t num_tokens,
                                        int64_t k, const std::vector<uint32_t>& row_offsets,
                                        const std::vector<uint32_t>& lookup_table, int pages_per_seq,
                                        int64_t num_blocks);

}  // namespace mlajit::ref
