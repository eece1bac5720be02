#pragma once
// Host-side mirror of the mla_indexer kernels' launch shapes and shared-memory sizes (the
// templates mla_indexer/scores_sm90.cuh (v8), mla_indexer/scores_sm90_blk.cuh (v10), mla_indexer/scores_portable.cuh,
// common/topk_sample.cuh, common/topk_radix.cuh).
// The generated source static_asserts that both sides agree, so a change on one side that is not
// made on the other fails the NVRTC compile instead of launching with the wrong size.
#include <algorithm>

#include <fmt/format.h>

#include "mlajit/error.hpp"
#include "mlajit/params.hpp"

namespace mlajit::indexer {

struct Layout {
  int page_shift = 0;
  int stages = 0;             // sm90 ring depth (64-key tiles in v8, 256-key blocks in v10)
  // sm90 scorer variant, picked by params.block_kv: v10 (0 = heuristic, or 256;
  // templates/mla_indexer/scores_sm90_blk.cuh) or v8 (64, scores_sm90.cuh). v10 measured 1.17-1.26x
  // faster than v8 at H 64 and 128 (docs/notes/mla_indexer_kv.md, "Scores v10").
  bool sm90_blocks = false;   // v10
  int sm90_threads = 640;     // 4 consumer warpgroups + 1 producer warpgroup (one warp works)
  int sm90_block_q = 0;       // query tokens per CTA: v8 4 warpgroups x (128 / H), v10 128 / H
  int sm90_tile_keys = 64;    // keys per ring stage (walk step): v8 64 (one MMA tile), v10 256 (4 quarters)
  unsigned sm90_smem_bytes = 0;
  int portable_threads = 256;
  int portable_keys_per_split = 1024;
  unsigned portable_smem_bytes = 0;
  int topk_threads = 256;
  int topk_min_blocks = 3;       // __launch_bounds__ minimum CTAs per SM
  int topk_candidates = 0;       // SampleTopK::kCap
  unsigned topk_smem_bytes = 0;
};

inline int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Validates the tiling knobs against the one tile shape the kernels implement and fills the sizes.
inline Layout layout(const MlaIndexerParams& p) {
  p.validate();
  Layout l;
  while ((1 << l.page_shift) < p.page_size) ++l.page_shift;
  // v10 does not build page size 1 (64 pages per 64-key quarter: its producer lanes hold one table
  // entry each); block_kv 0 and 256 run v8 there.
  l.sm90_blocks = (p.block_kv == 0 || p.block_kv == 256) && p.page_size >= 2;
  l.sm90_block_q = (l.sm90_blocks ? 1 : 4) * (128 / p.num_heads);
  l.sm90_tile_keys = l.sm90_blocks ? 256 : 64;
  MLAJIT_EXPECT(p.block_q == 0 || p.block_q == l.sm90_block_q, "params.block_q", p.block_q,
                fmt::format("0 or {} (query tokens per CTA for num_heads {} and block_kv {}: {}128/num_heads)",
                            l.sm90_block_q, p.num_heads, p.block_kv, l.sm90_blocks ? "" : "4 warpgroups x "));
  MLAJIT_EXPECT(p.block_kv == 0 || p.block_kv == 64 || p.block_kv == 256, "params.block_kv", p.block_kv,
                "0 (heuristic: v10) | 64 (v8: keys per wgmma tile) | 256 (v10: 256-key blocks, a 64-key quarter per warpgroup)");
  // v10: 16 KiB of Q + stages x 33 KiB of K blocks and scales within the 227 KiB of a CTA.
  const int max_stages = l.sm90_blocks ? 6 : 8;
  MLAJIT_EXPECT(p.num_stages == 0 || (p.num_stages >= 2 && p.num_stages <= max_stages), "params.num_stages",
                p.num_stages,
                fmt::format("0 (heuristic: {}) or 2..{} (ring depth)", l.sm90_blocks ? 4 : 6, max_stages));
  l.stages = p.num_stages == 0 ? (l.sm90_blocks ? 4 : 6) : p.num_stages;
  const unsigned q_bytes = static_cast<unsigned>(l.sm90_block_q * p.num_heads * 128);
  const unsigned tile = static_cast<unsigned>(l.sm90_tile_keys);
  const unsigned off_kscale = q_bytes + l.stages * tile * 128u;
  const unsigned off_w = off_kscale + l.stages * tile * 4u;
  // Weights: per token slot 4 quads x (H/4 + 4) floats (padded against bank conflicts).
  const unsigned off_bar = off_w + static_cast<unsigned>(l.sm90_block_q * (p.num_heads + 16) * 4);
  l.sm90_smem_bytes = off_bar + l.stages * 16u + 1024u;
  l.portable_smem_bytes = static_cast<unsigned>((p.num_heads * 128 + p.num_heads) * 4);
  // SampleTopK::Smem = union of RadixTopK::Smem (hist u32[4096], sel u64[pow2(k)], cand u64[4096],
  // scan u32[threads/32 + 1], 3 x u32) and SampleTopK::Fast (sel u64[pow2(k) + 40], cand u64[cap],
  // hist u32[4096], 2 x u64, scan u32[threads/32 + 1], 9 x u32), cap = clamp(2 pow2(k), 2048, 8192).
  // sel's 40 extra slots (kSelPad = kMaxBucket 32 + 8) hold the fused select's scatter of up to
  // k - 1 + 32 entries and the rank loop's zero padding.
  const int sort_cap = pow2_ceil(p.top_k);
  l.topk_candidates = std::min(8192, std::max(2048, 2 * sort_cap));
  unsigned radix = static_cast<unsigned>(4096 * 4 + 8 * sort_cap + 8 * 4096 + 4 * (l.topk_threads / 32 + 1) + 12);
  radix = (radix + 7u) & ~7u;
  unsigned fast = static_cast<unsigned>(8 * (sort_cap + 40) + 8 * l.topk_candidates + 4096 * 4 + 16 +
                                        4 * (l.topk_threads / 32 + 1) + 36);
  fast = (fast + 7u) & ~7u;
  l.topk_smem_bytes = (std::max(radix, fast) + 7u) & ~7u;
  return l;
}

}  // namespace mlajit::indexer
