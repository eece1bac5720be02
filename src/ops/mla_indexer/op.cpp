// ops::mla_indexer (SPEC §2): validates every view against the params before it touches the
// runtime, then runs the query rows in chunks: per chunk one scores launch (fp8 wgmma on sm_90a,
// f32 FMA elsewhere) that fills the workspace with the chunk's score rows, and one top-k launch
// that reduces each row to its top-k positions.
//
// Workspace bound: score rows are score_row_stride = round_up(max(max_keys_per_seq, 1), 4) floats
// (4: mj::indexer::kScoreRowAlignFloats, the top-k's 16-byte loads);
// mla_indexer_workspace_bytes() sizes a chunk to as many rows as fit in kWorkspaceCapBytes (at
// least one row, a multiple of 16 rows when more than 16 fit, never more than the tokens):
//   min(T, chunk_rows) * score_row_stride * 4 bytes  <=  max(kWorkspaceCapBytes, one row)
// instead of a full [T, max_keys] matrix (which is 2 GiB at 4096 tokens x 128K keys). A smaller
// workspace (at least one score row) also works: the chunks then hold as many rows as it fits.
#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "mla_indexer/args.h"
#include "ops/mla_indexer/plan.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/byte_cache_view.hpp"
#include "ops/tuning.hpp"
#include "ops/mla_indexer/stages.hpp"
#include "ops/mla_indexer/tma.hpp"

namespace mlajit::ops {

namespace {

constexpr int64_t kWorkspaceCapBytes = int64_t{128} << 20;
constexpr int kDepth = mj::indexer::kDepth;

struct Chunking {
  int64_t row_stride = 0;  // floats per score row
  int64_t chunk_rows = 0;  // rows per chunk (>= 1 when T >= 1)
  size_t bytes = 0;
};

Chunking chunking(int64_t total_tokens, int64_t max_keys) {
  Chunking c;
  constexpr int64_t kAlign = mj::indexer::kScoreRowAlignFloats;
  c.row_stride = (std::max<int64_t>(max_keys, 1) + kAlign - 1) / kAlign * kAlign;
  const int64_t row_bytes = c.row_stride * 4;
  int64_t rows = std::max<int64_t>(1, kWorkspaceCapBytes / row_bytes);
  if (rows > 16) rows = rows / 16 * 16;
  c.chunk_rows = std::min(rows, std::max<int64_t>(total_tokens, 0));
  c.bytes = static_cast<size_t>(c.chunk_rows * row_bytes);
  return c;
}


}  // namespace

size_t mla_indexer_workspace_bytes(const MlaIndexerParams& p, int64_t total_tokens, int64_t max_keys_per_seq) {
  p.validate();
  MLAJIT_EXPECT(total_tokens >= 0, "total_tokens", total_tokens, "a non-negative count");
  MLAJIT_EXPECT(max_keys_per_seq >= 0 && max_keys_per_seq < (int64_t{1} << 31), "max_keys_per_seq", max_keys_per_seq,
                "an integer in [0, 2^31)");
  return chunking(total_tokens, max_keys_per_seq).bytes;
}

namespace detail {

void mla_indexer_run(const MlaIndexerParams& p, const TensorView& q, const TensorView& qs,
                     const TensorView& input_row_offsets, const PagedCacheView& kc, int layer_idx,
                     int64_t max_keys_per_seq, const TensorView& out, const TensorView& workspace, Stream stream,
                     unsigned stages) {
  // ---- validation: everything is checked before the runtime is touched ----
  const indexer::Layout lay = indexer::layout(p);
  const int H = p.num_heads;
  expect_dtype(q, DType::fp8_e4m3, "q");
  expect_ndim(q, 3, "q");
  const int64_t T = q.size(0);
  expect_dim(q, 1, H, "q");
  expect_dim(q, 2, kDepth, "q");
  expect_contiguous(q, "q");
  expect_nonnull(q, "q");
  expect_aligned(q, 16, "q");

  expect_dtype(qs, DType::f32, "qs");
  expect_ndim(qs, 2, "qs");
  expect_dim(qs, 0, T, "qs");
  expect_dim(qs, 1, H, "qs");
  expect_contiguous(qs, "qs");
  expect_nonnull(qs, "qs");

  expect_dtype(input_row_offsets, DType::u32, "input_row_offsets");
  expect_ndim(input_row_offsets, 1, "input_row_offsets");
  MLAJIT_EXPECT(input_row_offsets.size(0) >= 2, "input_row_offsets shape[0]", input_row_offsets.size(0),
                "batch + 1 >= 2");
  const int64_t B = input_row_offsets.size(0) - 1;
  expect_contiguous(input_row_offsets, "input_row_offsets");
  expect_nonnull(input_row_offsets, "input_row_offsets");

  // The K cache: the split layout (fp8 blocks + an f32 scales tensor), or the engines' pages
  // (k_layout fp8_page_scales: u8 pages of page_size x 128 e4m3 then page_size f32 scales).
  const bool page_scales = p.k_layout == CacheLayout::fp8_page_scales;
  int64_t num_blocks = 0, num_layers = 0, hdg = 1;
  if (page_scales) {
    // u8 pages (ops/byte_cache_view.hpp), the layers from the view.
    const ByteCacheDims d = expect_byte_cache(kc, "k_cache.blocks", "k_cache.scales", 0, p.page_size,
                                              PagedKVCacheParams::kPageScalesTokenBytes, "k_layout fp8_page_scales",
                                              "pages");
    num_blocks = d.num_blocks;
    num_layers = d.num_layers;
    MLAJIT_EXPECT(num_blocks >= 1, "k_cache.blocks shape[0] (num_blocks)", num_blocks, ">= 1");
    MLAJIT_EXPECT(num_layers >= 1, "k_cache.blocks shape[2] (num_layers)", num_layers, ">= 1");
  } else {
    expect_dtype(kc.blocks, DType::fp8_e4m3, "k_cache.blocks");
    expect_ndim(kc.blocks, 6, "k_cache.blocks");
    num_blocks = kc.blocks.size(0);
    MLAJIT_EXPECT(num_blocks >= 1, "k_cache.blocks shape[0] (num_blocks)", num_blocks, ">= 1");
    expect_dim(kc.blocks, 1, 1, "k_cache.blocks (kv_dim: is_mla)");
    num_layers = kc.blocks.size(2);
    MLAJIT_EXPECT(num_layers >= 1, "k_cache.blocks shape[2] (num_layers)", num_layers, ">= 1");
    expect_dim(kc.blocks, 3, p.page_size, "k_cache.blocks (page_size)");
    expect_dim(kc.blocks, 4, 1, "k_cache.blocks (num_heads)");
    expect_dim(kc.blocks, 5, kDepth, "k_cache.blocks (head_size = depth)");
    expect_contiguous(kc.blocks, "k_cache.blocks");
    expect_nonnull(kc.blocks, "k_cache.blocks");
    expect_aligned(kc.blocks, 16, "k_cache.blocks");

    // SPEC §1 kv_scales_view with num_heads 1: one scale per token since granularity >= depth.
    hdg = (kDepth + p.quantization_granularity - 1) / p.quantization_granularity;
    expect_dtype(kc.scales, DType::f32, "k_cache.scales");
    expect_ndim(kc.scales, 6, "k_cache.scales");
    expect_dim(kc.scales, 0, num_blocks, "k_cache.scales (num_blocks)");
    expect_dim(kc.scales, 1, 1, "k_cache.scales (kv_dim: is_mla)");
    expect_dim(kc.scales, 2, num_layers, "k_cache.scales (num_layers)");
    expect_dim(kc.scales, 3, p.page_size, "k_cache.scales (page_size)");
    expect_dim(kc.scales, 4, 1, "k_cache.scales (num_heads)");
    expect_dim(kc.scales, 5, hdg, "k_cache.scales (head_dim_granularity)");
    expect_contiguous(kc.scales, "k_cache.scales");
    expect_nonnull(kc.scales, "k_cache.scales");
  }
  // Rows of 128 bytes per page: the tokens' (split), or theirs and the scales' (page + page / 32).
  const int64_t rows_per_page = page_scales ? p.page_size + p.page_size / 32 : p.page_size;

  expect_dtype(kc.lookup_table, DType::u32, "k_cache.lookup_table");
  expect_ndim(kc.lookup_table, 2, "k_cache.lookup_table");
  expect_dim(kc.lookup_table, 0, B, "k_cache.lookup_table (batch)");
  const int64_t pages_per_seq = kc.lookup_table.size(1);
  expect_contiguous(kc.lookup_table, "k_cache.lookup_table");
  expect_nonnull(kc.lookup_table, "k_cache.lookup_table");

  expect_dtype(kc.cache_lengths, DType::u32, "k_cache.cache_lengths");
  expect_ndim(kc.cache_lengths, 1, "k_cache.cache_lengths");
  expect_dim(kc.cache_lengths, 0, B, "k_cache.cache_lengths (batch)");
  expect_contiguous(kc.cache_lengths, "k_cache.cache_lengths");
  expect_nonnull(kc.cache_lengths, "k_cache.cache_lengths");

  MLAJIT_EXPECT(layer_idx >= 0 && layer_idx < num_layers, "layer_idx", layer_idx,
                fmt::format("an integer in [0, num_layers={})", num_layers));
  MLAJIT_EXPECT(max_keys_per_seq >= 0 && max_keys_per_seq < (int64_t{1} << 31), "max_keys_per_seq",
                max_keys_per_seq, "an integer in [0, 2^31): the bound on cache_length + new tokens of every sequence");
  MLAJIT_EXPECT(B < (int64_t{1} << 31), "batch", B, "< 2^31");
  // The persistent scorer at pages >= 8 loads K by TMA: checked here, with everything else, before
  // the runtime is touched (the descriptors are encoded at launch; tma.hpp).
  const bool tma = lay.sm90_persistent && p.page_size >= indexer::kTmaMinPage;
  indexer::TmaPlan tma_plan;
  if (tma)
    tma_plan = indexer::plan_tma(
        reinterpret_cast<uintptr_t>(kc.blocks.data),
        reinterpret_cast<uintptr_t>(page_scales ? kc.blocks.data : kc.scales.data), num_blocks * num_layers * rows_per_page,
        static_cast<int>(hdg), p.page_size, page_scales ? num_blocks * num_layers * p.page_size * 33 : 0);
  // The persistent scorer walks keys in 32-bit ints in steps of 256 (its loop state has no room for
  // 64-bit keys).
  MLAJIT_EXPECT(!lay.sm90_persistent || max_keys_per_seq <= (int64_t{1} << 31) - 1024, "max_keys_per_seq",
                max_keys_per_seq,
                "<= 2^31 - 1024 with the persistent scorer (params.block_kv 256, or 0 at page_size >= 8; 64 "
                "selects the tile scorer, which takes up to 2^31 - 1)");

  expect_dtype(out, DType::i32, "out");
  expect_ndim(out, 2, "out");
  expect_dim(out, 0, T, "out");
  expect_dim(out, 1, p.top_k, "out (top_k)");
  expect_contiguous(out, "out");
  expect_nonnull(out, "out");

  Chunking ch = chunking(T, max_keys_per_seq);
  const size_t ws_have = workspace.empty() ? 0 : static_cast<size_t>(workspace.numel()) * dtype_size(workspace.dtype);
  const size_t row_bytes = static_cast<size_t>(ch.row_stride) * 4;
  if (T > 0 && ws_have < row_bytes)
    throw_invalid("workspace size", fmt::format("{} bytes", ws_have),
                  fmt::format("at least one score row ({} bytes); mla_indexer_workspace_bytes(...) = {} bytes "
                              "runs the fewest chunks",
                              row_bytes, ch.bytes));
  expect_aligned(workspace, 16, "workspace");
  if (T == 0) return;
  ch.chunk_rows = std::min<int64_t>(ch.chunk_rows, static_cast<int64_t>(ws_have / row_bytes));

  const unsigned forced_ranks = (stages >> kIndexerTopkRanksShift) & 15u;
  MLAJIT_EXPECT(forced_ranks == 0 || forced_ranks == 1 || forced_ranks == 2 || forced_ranks == 4 || forced_ranks == 8,
                "forced top-k CTAs per row", forced_ranks, "0 (the plan's) or 1, 2, 4, 8");

  // ---- launch ----
  Runtime& rt = Runtime::global();
  const auto kernel = rt.get_for_launch(KernelSpec{p}, stream);
  const bool sm90 = rt.arch() == "sm_90a" && !(stages & kIndexerForcePortable);
  const int sms = std::max(1, rt.sm_count());
  // Thread-block clusters (the top-k's CTAs per row) from sm_90 on.
  const bool clusters = indexer::arch_has_clusters(rt.arch());

  MlaIndexerScoresArgs sa{};
  sa.q = static_cast<const unsigned char*>(q.data);
  sa.qs = static_cast<const float*>(qs.data);
  sa.input_row_offsets = static_cast<const unsigned*>(input_row_offsets.data);
  sa.k_blocks = static_cast<const unsigned char*>(kc.blocks.data);
  // fp8_page_scales: the scorers index the scales from the pages' start (common.cuh, scale_index).
  sa.k_scales = static_cast<const float*>(page_scales ? kc.blocks.data : kc.scales.data);
  sa.lookup_table = static_cast<const unsigned*>(kc.lookup_table.data);
  sa.cache_lengths = static_cast<const unsigned*>(kc.cache_lengths.data);
  sa.scores = static_cast<float*>(workspace.data);
  sa.num_tokens = T;
  sa.score_row_stride = ch.row_stride;
  sa.max_keys = max_keys_per_seq;
  sa.num_blocks = num_blocks;
  sa.pages_per_seq = pages_per_seq;
  sa.block_row_stride = num_layers * rows_per_page;
  sa.layer_row_offset = static_cast<int64_t>(layer_idx) * rows_per_page;
  sa.batch = static_cast<int>(B);
  sa.scale_row_stride = static_cast<int>(hdg);
  // The TMA descriptors, once for all chunks (host-only; captured by value in a CUDA graph).
  if (sm90 && tma) indexer::encode_tma(tma_plan, sa);

  MlaIndexerTopkArgs ta{};
  ta.scores = sa.scores;
  ta.input_row_offsets = sa.input_row_offsets;
  ta.cache_lengths = sa.cache_lengths;
  ta.lookup_table = sa.lookup_table;
  ta.out = static_cast<int*>(out.data);
  ta.num_tokens = T;
  ta.score_row_stride = ch.row_stride;
  ta.max_keys = max_keys_per_seq;
  ta.num_blocks = num_blocks;
  ta.pages_per_seq = pages_per_seq;
  ta.batch = static_cast<int>(B);

  for (int64_t row0 = 0; row0 < T; row0 += ch.chunk_rows) {
    const int64_t rows = std::min(ch.chunk_rows, T - row0);
    sa.chunk_row_begin = ta.chunk_row_begin = row0;
    sa.chunk_rows = ta.chunk_rows = rows;
    if ((stages & kIndexerScores) && max_keys_per_seq > 0) {
      LaunchDims d;
      if (sm90) {
        // Grid and key split (plan.hpp, sm90_work): the persistent scorer runs one CTA per SM unless
        // the caller asks for one work item per CTA; the tile scorer runs its (q blocks, splits) grid.
        const indexer::Sm90Work w =
            indexer::sm90_work(lay, rows, max_keys_per_seq, (stages & kIndexerSmallGrid) ? kIndexerSmallGridSms : sms,
                               !(stages & kIndexerOneItemPerCta));
        sa.keys_per_split = w.keys_per_split;
        d.grid[0] = w.grid_x;
        d.grid[1] = w.grid_y;
        d.block[0] = static_cast<unsigned>(lay.sm90_threads);
        d.smem_bytes = lay.sm90_smem_bytes;
        kernel->launch(0, d, stream, sa);
      } else {
        sa.keys_per_split = lay.portable_keys_per_split;
        d.grid[0] = static_cast<unsigned>(rows);
        d.grid[1] = static_cast<unsigned>((max_keys_per_seq + sa.keys_per_split - 1) / sa.keys_per_split);
        d.block[0] = static_cast<unsigned>(lay.portable_threads);
        d.smem_bytes = lay.portable_smem_bytes;
        kernel->launch(1, d, stream, sa);
      }
    }
    if (stages & kIndexerTopk) {
      LaunchDims d;
      const int ranks = indexer::topk_ranks(lay, rows, max_keys_per_seq, sms, clusters && !(stages & kIndexerTopkOneCta),
                                            static_cast<int>((stages >> kIndexerTopkRanksShift) & 15u));
      d.grid[0] = static_cast<unsigned>(rows * ranks);
      d.cluster[0] = static_cast<unsigned>(ranks);
      d.block[0] = static_cast<unsigned>(lay.topk_threads);
      d.smem_bytes = lay.topk_smem_bytes;
      kernel->launch(2, d, stream, ta);
    }
  }
}

}  // namespace detail

void mla_indexer(const MlaIndexerParams& requested, const TensorView& q, const TensorView& qs,
                 const TensorView& input_row_offsets, const PagedCacheView& k_cache, int layer_idx,
                 int64_t max_keys_per_seq, const TensorView& out, const TensorView& workspace, Stream stream) {
  requested.validate();
  const MlaIndexerParams p = tuned_or_heuristic(
      requested, autotune::bucket_mla_indexer(dim_or_zero(q, 0), dim_or_zero(input_row_offsets, 0) - 1, max_keys_per_seq));
  detail::mla_indexer_run(p, q, qs, input_row_offsets, k_cache, layer_idx, max_keys_per_seq, out, workspace, stream,
                          detail::kIndexerScores | detail::kIndexerTopk);
}

}  // namespace mlajit::ops
