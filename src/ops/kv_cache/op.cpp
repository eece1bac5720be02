// Host entry points of the paged KV cache family (SPEC §1): kv_cache_store, kv_cache_gather,
// sparse_index_remap. Each validates the params and every tensor view BEFORE touching the runtime
// (so bad arguments fail the same way with or without a GPU), sizes the grid from the shared
// work plan (templates/kv_cache/plan.h) and launches entry 0 of the specialized kernel.
// The hot path builds no strings and allocates nothing; error paths do.
#include <climits>
#include <cstdint>

#include "kv_cache/args.h"
#include "kv_cache/plan.h"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/byte_cache_view.hpp"
#include "ops/tuning.hpp"

namespace mlajit::ops {

namespace {

constexpr int64_t kMaxGridX = INT_MAX;  // gridDim.x limit

// x / y: [tokens, num_heads, head_size] of `dt`, contiguous, aligned for the vector width; returns
// the token count.
int64_t expect_token_rows(const TensorView& t, DType dt, const PagedKVCacheParams& c, size_t align, const char* what) {
  expect_dtype(t, dt, what);
  expect_ndim(t, 3, what);
  expect_dim(t, 1, c.num_heads, what);
  expect_dim(t, 2, c.head_size, what);
  expect_contiguous(t, what);
  expect_nonnull(t, what);
  expect_aligned(t, align, what);
  return t.shape[0];
}

// Every kv kernel is entry 0 of its module, one-dimensional, `p.threads` per block.
template <typename P, typename Args>
void launch_1d(const P& p, unsigned grid, const Args& args, Stream stream) {
  LaunchDims dims;
  dims.grid[0] = grid;
  dims.block[0] = static_cast<unsigned>(p.threads);
  Runtime::global().get_for_launch(KernelSpec{p}, stream)->launch(0, dims, stream, args);
}

// The optional u32[1] counter of tokens that were not written / not found.
void expect_counter(const TensorView& dropped) {
  if (dropped.empty()) return;
  expect_tensor(dropped, DType::u32, {1}, "dropped");
}

// Batch size and pages per sequence, from the lookup table (u32 [B, pages_per_seq]).
struct TableDims {
  int batch;
  int pages_per_seq;
};

TableDims expect_lookup_table(const TensorView& lut) {
  expect_dtype(lut, DType::u32, "lookup_table");
  expect_ndim(lut, 2, "lookup_table");
  MLAJIT_EXPECT(lut.shape[0] <= INT_MAX, "lookup_table dim 0 (batch)", lut.shape[0], "at most 2^31 - 1");
  MLAJIT_EXPECT(lut.shape[1] <= INT_MAX, "lookup_table dim 1 (pages_per_seq)", lut.shape[1], "at most 2^31 - 1");
  expect_contiguous(lut, "lookup_table");
  expect_nonnull(lut, "lookup_table");
  return {static_cast<int>(lut.shape[0]), static_cast<int>(lut.shape[1])};
}

// blocks (and for fp8 scales) against the cache params; returns num_blocks.
int64_t expect_cache_storage(const PagedKVCacheParams& c, const PagedCacheView& cache, size_t block_align) {
  // fp8_ds_mla: u8 records of 656 bytes; fp8_page_scales: u8 pages, 132 bytes per token
  // (ops/byte_cache_view.hpp: the shapes, including vLLM's, FlashMLA's and DeepGEMM's of one layer).
  if (c.ds_mla())
    return expect_byte_cache(cache, "cache.blocks", "cache.scales", c.num_layers, c.page_size,
                             PagedKVCacheParams::kDsMlaRecordBytes, "layout fp8_ds_mla", "records")
        .num_blocks;
  if (c.page_scales())
    return expect_byte_cache(cache, "cache.blocks", "cache.scales", c.num_layers, c.page_size,
                             PagedKVCacheParams::kPageScalesTokenBytes, "layout fp8_page_scales", "pages")
        .num_blocks;
  const TensorView& blocks = cache.blocks;
  expect_dtype(blocks, c.dtype, "cache.blocks");
  expect_ndim(blocks, 6, "cache.blocks");
  const int64_t num_blocks = blocks.shape[0];
  expect_dim(blocks, 1, c.kv_dim(), "cache.blocks");
  expect_dim(blocks, 2, c.num_layers, "cache.blocks");
  expect_dim(blocks, 3, c.page_size, "cache.blocks");
  expect_dim(blocks, 4, c.num_heads, "cache.blocks");
  expect_dim(blocks, 5, c.head_size, "cache.blocks");
  expect_contiguous(blocks, "cache.blocks");
  expect_nonnull(blocks, "cache.blocks");
  expect_aligned(blocks, block_align, "cache.blocks");
  if (c.quantized()) {
    expect_tensor(cache.scales, DType::f32,
                  {num_blocks, c.kv_dim(), c.num_layers, c.page_size, c.num_heads, c.head_dim_granularity()},
                  "cache.scales");
  } else if (!cache.scales.empty()) {
    throw_invalid("cache.scales", cache.scales.describe(),
                  fmt::format("no scales (an empty view) for a {} cache", dtype_name(c.dtype)));
  }
  return num_blocks;
}

void expect_layer_kv(const PagedKVCacheParams& c, int layer_idx, int kv_idx) {
  MLAJIT_EXPECT(layer_idx >= 0 && layer_idx < c.num_layers, "layer_idx", layer_idx,
                fmt::format("an integer in [0, num_layers={})", c.num_layers));
  MLAJIT_EXPECT(kv_idx >= 0 && kv_idx < c.kv_dim(), "kv_idx", kv_idx,
                fmt::format("an integer in [0, kv_dim={})", c.kv_dim()));
}

// Layout fp8_ds_mla: one warp per token (templates/kv_cache/plan.h).
unsigned ds_mla_grid(int64_t num_tokens, int threads, const char* what) {
  const int64_t per_block = mj::kv::ds_mla_tokens_per_block(threads);
  const int64_t blocks = (num_tokens + per_block - 1) / per_block;
  MLAJIT_EXPECT(blocks <= kMaxGridX, what, num_tokens, fmt::format("at most {} tokens per launch", kMaxGridX * per_block));
  return static_cast<unsigned>(blocks);
}

unsigned grid_for(int64_t num_tokens, const mj::kv::Plan& plan, const char* what) {
  const int64_t segs = num_tokens * plan.segs_per_token;
  const int64_t blocks = (segs + plan.segs_per_block - 1) / plan.segs_per_block;
  MLAJIT_EXPECT(blocks <= kMaxGridX, what, num_tokens,
                fmt::format("at most {} tokens per launch", kMaxGridX / plan.segs_per_token * plan.segs_per_block));
  return static_cast<unsigned>(blocks);
}

}  // namespace

void kv_cache_store(const KvCacheStoreParams& requested, const TensorView& x, const TensorView& input_row_offsets,
                    const PagedCacheView& cache, int layer_idx, int kv_idx, const TensorView& dropped,
                    Stream stream) {
  requested.validate();
  const KvCacheStoreParams p = tuned_or_heuristic(
      requested, autotune::bucket_kv_cache_store(dim_or_zero(x, 0), dim_or_zero(input_row_offsets, 0) - 1));
  const PagedKVCacheParams& c = p.cache;
  const int in_bytes = static_cast<int>(dtype_size(p.input_dtype));
  const int cache_bytes = static_cast<int>(dtype_size(c.dtype));
  const mj::kv::Plan plan = mj::kv::make_plan(in_bytes, cache_bytes, c.num_heads, c.head_size, c.quantized(),
                                              c.resolved_quantization_granularity(), p.threads);

  // fp8_ds_mla: 16-byte accesses to x rows and records.
  const int64_t num_tokens =
      expect_token_rows(x, p.input_dtype, c, c.ds_mla() ? 16 : static_cast<size_t>(plan.vec) * in_bytes, "x");

  const TableDims table = expect_lookup_table(cache.lookup_table);
  expect_tensor(input_row_offsets, DType::u32, {int64_t{table.batch} + 1}, "input_row_offsets");
  expect_tensor(cache.cache_lengths, DType::u32, {table.batch}, "cache.cache_lengths");
  const int64_t num_blocks = expect_cache_storage(c, cache, static_cast<size_t>(plan.vec) * cache_bytes);
  expect_layer_kv(c, layer_idx, kv_idx);
  expect_counter(dropped);
  const unsigned grid =
      c.ds_mla() ? ds_mla_grid(num_tokens, p.threads, "x dim 0 (tokens)") : grid_for(num_tokens, plan, "x dim 0 (tokens)");
  if (num_tokens == 0) return;

  KvCacheStoreArgs args{};
  args.x = x.data;
  args.input_row_offsets = static_cast<const unsigned*>(input_row_offsets.data);
  args.cache_lengths = static_cast<const unsigned*>(cache.cache_lengths.data);
  args.lookup_table = static_cast<const unsigned*>(cache.lookup_table.data);
  args.blocks = cache.blocks.data;
  // fp8_page_scales: the scales live in the pages; the kernel indexes them from the blocks' start.
  args.scales = c.page_scales() ? static_cast<float*>(cache.blocks.data) : static_cast<float*>(cache.scales.data);
  args.dropped = static_cast<unsigned*>(dropped.data);
  args.num_tokens = num_tokens;
  args.num_blocks = num_blocks;
  args.batch = table.batch;
  args.pages_per_seq = table.pages_per_seq;
  args.layer_idx = layer_idx;
  args.kv_idx = kv_idx;

  launch_1d(p, grid, args, stream);
}

void kv_cache_gather(const KvCacheGatherParams& requested, const PagedCacheView& cache, const TensorView& batch_ids,
                     const TensorView& positions, int layer_idx, int kv_idx, const TensorView& y,
                     const TensorView& dropped, Stream stream) {
  requested.validate();
  const KvCacheGatherParams p = tuned_or_heuristic(requested, autotune::bucket_kv_cache_gather(dim_or_zero(y, 0)));
  const PagedKVCacheParams& c = p.cache;
  const int cache_bytes = static_cast<int>(dtype_size(c.dtype));
  const int out_bytes = static_cast<int>(dtype_size(p.output_dtype));
  const mj::kv::Plan plan = mj::kv::make_plan(cache_bytes, out_bytes, c.num_heads, c.head_size, c.quantized(),
                                              c.resolved_quantization_granularity(), p.threads);

  const int64_t num_tokens =
      expect_token_rows(y, p.output_dtype, c, c.ds_mla() ? 16 : static_cast<size_t>(plan.vec) * out_bytes, "y");
  expect_tensor(batch_ids, DType::u32, {num_tokens}, "batch_ids");
  expect_tensor(positions, DType::u32, {num_tokens}, "positions");

  const TableDims table = expect_lookup_table(cache.lookup_table);
  // Gather addresses by logical position; cache_lengths is not read, but a given view must fit.
  if (!cache.cache_lengths.empty())
    expect_tensor(cache.cache_lengths, DType::u32, {table.batch}, "cache.cache_lengths");
  const int64_t num_blocks = expect_cache_storage(c, cache, static_cast<size_t>(plan.vec) * cache_bytes);
  expect_layer_kv(c, layer_idx, kv_idx);
  expect_counter(dropped);
  const unsigned grid =
      c.ds_mla() ? ds_mla_grid(num_tokens, p.threads, "y dim 0 (tokens)") : grid_for(num_tokens, plan, "y dim 0 (tokens)");
  if (num_tokens == 0) return;

  KvCacheGatherArgs args{};
  args.blocks = cache.blocks.data;
  args.scales = c.page_scales() ? static_cast<const float*>(cache.blocks.data)
                                : static_cast<const float*>(cache.scales.data);
  args.lookup_table = static_cast<const unsigned*>(cache.lookup_table.data);
  args.batch_ids = static_cast<const unsigned*>(batch_ids.data);
  args.positions = static_cast<const unsigned*>(positions.data);
  args.y = y.data;
  args.dropped = static_cast<unsigned*>(dropped.data);
  args.num_tokens = num_tokens;
  args.num_blocks = num_blocks;
  args.batch = table.batch;
  args.pages_per_seq = table.pages_per_seq;
  args.layer_idx = layer_idx;
  args.kv_idx = kv_idx;

  launch_1d(p, grid, args, stream);
}

void sparse_index_remap(const SparseIndexRemapParams& requested, const TensorView& indices,
                        const TensorView& input_row_offsets, const TensorView& lookup_table, int64_t num_blocks,
                        const TensorView& out, Stream stream) {
  requested.validate();
  const SparseIndexRemapParams p = tuned_or_heuristic(
      requested, autotune::bucket_sparse_index_remap(dim_or_zero(indices, 0), dim_or_zero(indices, 1)));
  expect_dtype(indices, DType::i32, "indices");
  expect_ndim(indices, 2, "indices");
  const int64_t num_tokens = indices.shape[0];
  const int64_t k = indices.shape[1];
  expect_contiguous(indices, "indices");
  expect_nonnull(indices, "indices");
  expect_tensor(out, DType::i32, {num_tokens, k}, "out");
  const TableDims table = expect_lookup_table(lookup_table);
  expect_tensor(input_row_offsets, DType::u32, {int64_t{table.batch} + 1}, "input_row_offsets");
  // Encoded indices are i32: every block * page_size + offset must fit.
  MLAJIT_EXPECT(num_blocks >= 0 && num_blocks <= (int64_t{1} << 31) / p.page_size, "num_blocks", num_blocks,
                fmt::format("an integer in [0, 2^31 / page_size = {}] (encoded indices are i32)",
                            (int64_t{1} << 31) / p.page_size));
  MLAJIT_EXPECT(num_tokens <= kMaxGridX, "indices dim 0 (tokens)", num_tokens, "at most 2^31 - 1 per launch");
  if (num_tokens == 0 || k == 0) return;

  SparseIndexRemapArgs args{};
  args.indices = static_cast<const int*>(indices.data);
  args.input_row_offsets = static_cast<const unsigned*>(input_row_offsets.data);
  args.lookup_table = static_cast<const unsigned*>(lookup_table.data);
  args.out = static_cast<int*>(out.data);
  args.num_tokens = num_tokens;
  args.k = k;
  args.num_blocks = num_blocks;
  args.batch = table.batch;
  args.pages_per_seq = table.pages_per_seq;

  launch_1d(p, static_cast<unsigned>(num_tokens), args, stream);
}

}  // namespace mlajit::ops
