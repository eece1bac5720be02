#pragma once
// Host-side mirror of the mla_indexer kernels' launch shapes and shared-memory sizes (the
// templates mla_indexer/scores_sm90.cuh (v8), mla_indexer/scores_sm90_blk.cuh (v10), mla_indexer/scores_portable.cuh,
// common/topk_sample.cuh, common/topk_radix.cuh).
// The generated source static_asserts that both sides agree, so a change on one side that is not
// made on the other fails the NVRTC compile instead of launching with the wrong size.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "mlajit/error.hpp"
#include "mlajit/params.hpp"

namespace mlajit::indexer {

struct Layout {
  int page_shift = 0;
  int stages = 0;             // sm90 ring depth (64-key tiles in v8, 256-key blocks in v10)
  // sm90 scorer variant, picked by params.block_kv: v10 (256, or 0 = the heuristic at pages >= 8;
  // templates/mla_indexer/scores_sm90_blk.cuh) or v8 (64, or 0 at the other pages;
  // scores_sm90.cuh). With K by TMA v10 (persistent) measured 1.4-2x faster than v8 at H 64 and 128
  // (docs/notes/mla_indexer_kv.md, "Scores v10" / "v11").
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
  // entry each); block_kv 0 and 256 run v8 there. The heuristic (block_kv 0) picks v10 where its K
  // comes by TMA (GPU-tested at every one of these page sizes): pages >= 8 (H64, s_kv 32K scores:
  // page 8 2.47 vs v8's 3.77 ms, page 16 1.92 vs 3.79, page 32 1.78 vs 3.51, page 64 1.73 vs 2.51).
  // Pages 2 and 4 keep v10's cp.async producer (per-row table lookups for 4x v8's K bytes per MMA:
  // 1.3x slower than v8 at pages 16 / 32 before v11 took them), so v8 runs there
  // (docs/notes/mla_indexer_kv.md). block_kv 256 builds v10 at any page size >= 2.
  const bool v10_by_default = p.page_size >= 8;
  l.sm90_blocks = p.page_size >= 2 && (p.block_kv == 256 || (p.block_kv == 0 && v10_by_default));
  l.sm90_block_q = (l.sm90_blocks ? 1 : 4) * (128 / p.num_heads);
  l.sm90_tile_keys = l.sm90_blocks ? 256 : 64;
  MLAJIT_EXPECT(p.block_q == 0 || p.block_q == l.sm90_block_q, "params.block_q", p.block_q,
                fmt::format("0 or {} (query tokens per CTA for num_heads {} and block_kv {}: {}128/num_heads)",
                            l.sm90_block_q, p.num_heads, p.block_kv, l.sm90_blocks ? "" : "4 warpgroups x "));
  MLAJIT_EXPECT(p.block_kv == 0 || p.block_kv == 64 || p.block_kv == 256, "params.block_kv", p.block_kv,
                "0 (heuristic: v10) | 64 (v8: keys per wgmma tile) | 256 (v10: 256-key blocks, a 64-key quarter per warpgroup)");
  // v10: 2 x 16 KiB of Q (double-buffered across work items) + stages x 33 KiB of K blocks and
  // scales within the 227 KiB of a CTA.
  const int max_stages = l.sm90_blocks ? 5 : 8;
  MLAJIT_EXPECT(p.num_stages == 0 || (p.num_stages >= 2 && p.num_stages <= max_stages), "params.num_stages",
                p.num_stages,
                fmt::format("0 (heuristic: {}) or 2..{} (ring depth)", l.sm90_blocks ? 4 : 6, max_stages));
  l.stages = p.num_stages == 0 ? (l.sm90_blocks ? 4 : 6) : p.num_stages;
  // v10 holds two Q buffers (Q tile, weights; the current and the next work item), v8 one.
  const unsigned q_bufs = l.sm90_blocks ? 2u : 1u;
  const unsigned q_bytes = static_cast<unsigned>(l.sm90_block_q * p.num_heads * 128);
  const unsigned tile = static_cast<unsigned>(l.sm90_tile_keys);
  const unsigned off_kscale = q_bufs * q_bytes + l.stages * tile * 128u;
  const unsigned off_w = off_kscale + l.stages * tile * 4u;
  // Weights: per token slot 4 quads x (H/4 + 4) floats (padded against bank conflicts).
  const unsigned off_bar = off_w + q_bufs * static_cast<unsigned>(l.sm90_block_q * (p.num_heads + 16) * 4);
  // Barriers: full and empty per ring stage; v10 also q_full and q_empty per Q buffer.
  const unsigned barriers = 2u * l.stages + (l.sm90_blocks ? 2u * q_bufs : 0u);
  l.sm90_smem_bytes = off_bar + barriers * 8u + 1024u;
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

// Launch shape of the sm90 scorer for one chunk of `rows` query rows whose sequences see at most
// `max_keys` keys. A split is a whole number of ring steps (tiles: 64 keys in v8, 256 in v10).
struct Sm90Work {
  int keys_per_split = 0;
  int64_t q_blocks = 0;  // CTAs' worth of tokens: ceil(rows / sm90_block_q)
  int64_t splits = 0;    // ceil(max_keys / keys_per_split)
  int64_t items = 0;     // q_blocks * splits: v10's work items
  unsigned grid_x = 0, grid_y = 1;
};

// Per-item cost of the persistent v10 grid in blocks (256 keys) of consumer work, for the split
// choice below: waiting for the item's Q buffer, loading its weights into registers and walking its
// segments is about one block's issue slots (~200 warp instructions against 210 per block).
constexpr int64_t kSm90ItemCostBlocks = 1;

// v8 and v10 with one item per CTA (`persistent` false): enough CTAs for several waves (>= 8 per SM
// over the launch) but at least 1024 keys per CTA (16 tiles of v8, 4 blocks of v10) so that a CTA's
// cold start (token slots, Q load, first K block) is amortized; v8's grid is (q blocks, splits),
// v10's (items). The hardware deals the CTAs to the SMs as they free up.
//
// v10 persistent: grid = min(SMs, items) CTAs walking the items in rounds (ScoresSm90Blk::work_item
// in the template). A CTA's Q is double-buffered across its items, so an item costs ~1 block beyond
// its keys (kSm90ItemCostBlocks), and the makespan is the busiest CTA's rounds x (blocks per item +
// 1). The host does not know the sequences' visible keys (they are on the device), so it assumes
// every row sees max_keys and picks the split count with the smallest
//   ceil(items / grid) x (ceil(tiles / splits) + kSm90ItemCostBlocks)
// (ties: fewer splits, i.e. fewer Q loads). Rows that see fewer keys (causal rows, shorter
// sequences) shorten their items; the alternating round order (work_item) evens out a trend along
// the rows. Example: 1024 rows at H 64 (512 q blocks), 128 tiles (32K keys), 132 SMs: 1 split,
// 4 rounds of 128 blocks (3.88 items per CTA on average: ~3% tail), against 3 splits of 43 blocks in
// 11.6 waves of 1536 CTAs with one item each.
inline Sm90Work sm90_work(const Layout& l, int64_t rows, int64_t max_keys, int sms, bool persistent) {
  MLAJIT_EXPECT(rows >= 1, "chunk rows", rows, ">= 1");
  MLAJIT_EXPECT(max_keys >= 1, "max_keys_per_seq", max_keys, ">= 1 (no scores launch without keys)");
  MLAJIT_EXPECT(sms >= 1, "SM count", sms, ">= 1");
  Sm90Work w;
  w.q_blocks = (rows + l.sm90_block_q - 1) / l.sm90_block_q;
  const int64_t tiles = (max_keys + l.sm90_tile_keys - 1) / l.sm90_tile_keys;
  int64_t tiles_per_split = 0;
  if (persistent && l.sm90_blocks) {
    // Past one item per SM, more splits only add items; the candidates stop 64 counts beyond it
    // (a few hundred divisions per launch at most).
    const int64_t max_splits = std::min(tiles, (int64_t{sms} + w.q_blocks - 1) / w.q_blocks + 64);
    int64_t best_cost = 0;
    for (int64_t s = 1; s <= max_splits; ++s) {
      const int64_t tps = (tiles + s - 1) / s;
      if ((tiles + tps - 1) / tps != s) continue;  // the same split as a smaller count
      const int64_t items = w.q_blocks * s;
      const int64_t grid = std::min<int64_t>(sms, items);
      const int64_t cost = (items + grid - 1) / grid * (tps + kSm90ItemCostBlocks);
      if (tiles_per_split == 0 || cost < best_cost) {
        best_cost = cost;
        tiles_per_split = tps;
      }
    }
  } else {
    const int64_t min_tiles = 1024 / l.sm90_tile_keys;
    int64_t splits = (8 * int64_t{sms} + w.q_blocks - 1) / w.q_blocks;
    splits = std::max<int64_t>(1, std::min(splits, (tiles + min_tiles - 1) / min_tiles));
    tiles_per_split = (tiles + splits - 1) / splits;
  }
  w.keys_per_split = static_cast<int>(tiles_per_split * l.sm90_tile_keys);
  w.splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  w.items = w.q_blocks * w.splits;
  if (!l.sm90_blocks) {
    w.grid_x = static_cast<unsigned>(w.q_blocks);
    w.grid_y = static_cast<unsigned>(w.splits);
  } else {
    w.grid_x = static_cast<unsigned>(persistent ? std::min<int64_t>(sms, w.items) : w.items);
  }
  return w;
}

}  // namespace mlajit::indexer
