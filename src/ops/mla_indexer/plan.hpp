#pragma once
// Host side of the mla_indexer kernels' plan: which Hopper scorer a spec builds, its ring depth,
// and the launch shapes. Every thread count, shared-memory size and offset comes from the
// kernels' own layout (templates/mla_indexer/layout.h, compiled by NVRTC and by the host compiler),
// so the host cannot launch with a size the device does not use.
#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "mla_indexer/layout.h"
#include "mlajit/error.hpp"
#include "mlajit/params.hpp"

namespace mlajit::indexer {

namespace kl = mj::indexer;  // the kernels' layout (templates/mla_indexer/layout.h)

struct Layout {
  int page_shift = 0;
  int stages = 0;  // sm90 ring depth (64-key tiles of the tile scorer, 256-key blocks of the persistent one)
  // The sm90 scorer, picked by params.block_kv: the persistent scorer (256, or 0 = the heuristic at
  // pages >= 8; templates/mla_indexer/scores_sm90_persistent.cuh) or the tile scorer (64, or 0 at
  // the other pages; scores_sm90_tile.cuh). With K by TMA the persistent scorer measured 1.4-2x
  // faster than the tile scorer at H 64 and 128.
  bool sm90_persistent = false;
  int sm90_threads = kl::kScorerThreads;  // 4 consumer warpgroups + 1 producer warpgroup
  int sm90_block_q = 0;       // query tokens per CTA: tile 4 warpgroups x (128 / H), persistent 128 / H
  int sm90_stage_keys = 0;    // keys per ring stage (walk step): tile 64 (one MMA tile), persistent 256 (4 quarters)
  unsigned sm90_smem_bytes = 0;
  int portable_threads = kl::kPortableThreads;
  int portable_keys_per_split = kl::kPortableKeysPerSplit;
  unsigned portable_smem_bytes = 0;
  int topk_threads = kl::kTopkThreads;
  int topk_min_blocks = kl::kTopkMinBlocks;  // __launch_bounds__ minimum CTAs per SM
  int topk_candidates = 0;                    // SampleTopK::kCap
  unsigned topk_smem_bytes = 0;
};

// Validates the tiling knobs against the one tile shape the kernels implement and fills the sizes.
inline Layout layout(const MlaIndexerParams& p) {
  p.validate();
  Layout l;
  while ((1 << l.page_shift) < p.page_size) ++l.page_shift;
  // The persistent scorer does not build page size 1 (64 pages per 64-key quarter: its producer
  // lanes hold one table entry each); block_kv 0 and 256 run the tile scorer there. The heuristic
  // (block_kv 0) picks the persistent scorer where its K comes by TMA (GPU-tested at every one of
  // these page sizes): pages >= 8 (H64, s_kv 32K scores: page 8 2.47 vs the tile scorer's 3.77 ms,
  // page 16 1.92 vs 3.79, page 32 1.78 vs 3.51, page 64 1.73 vs 2.51). Pages 2 and 4 keep its
  // cp.async producer (per-row table lookups for 4x the tile scorer's K bytes per MMA), so the tile
  // scorer runs there. block_kv 256 builds the persistent scorer at any page size >= 2.
  const bool persistent_by_default = l.page_shift >= kl::kTmaMinPageShift;
  l.sm90_persistent = l.page_shift >= kl::kPersistentMinPageShift &&
                      (p.block_kv == 256 || (p.block_kv == 0 && persistent_by_default));
  l.sm90_block_q = kl::scorer_block_q(p.num_heads, l.sm90_persistent);
  MLAJIT_EXPECT(p.block_q == 0 || p.block_q == l.sm90_block_q, "params.block_q", p.block_q,
                fmt::format("0 or {} (query tokens per CTA for num_heads {} and block_kv {}: {}128/num_heads)",
                            l.sm90_block_q, p.num_heads, p.block_kv, l.sm90_persistent ? "" : "4 warpgroups x "));
  MLAJIT_EXPECT(p.block_kv == 0 || p.block_kv == kl::kTileKeys || p.block_kv == kl::kBlockKeys, "params.block_kv",
                p.block_kv,
                "0 (heuristic: the persistent scorer) | 64 (the tile scorer: keys per wgmma tile) | 256 (the "
                "persistent scorer: 256-key blocks, a 64-key quarter per warpgroup)");
  const int min_stages = l.sm90_persistent ? kl::kPersistentMinStages : kl::kTileMinStages;
  const int max_stages = l.sm90_persistent ? kl::kPersistentMaxStages : kl::kTileMaxStages;
  const int default_stages = l.sm90_persistent ? kl::kPersistentDefaultStages : kl::kTileDefaultStages;
  // Persistent: 2 x 16 KiB of Q (double-buffered across work items) + stages x 33 KiB of K blocks
  // and scales within the 227 KiB of a CTA.
  MLAJIT_EXPECT(p.num_stages == 0 || (p.num_stages >= min_stages && p.num_stages <= max_stages), "params.num_stages",
                p.num_stages,
                fmt::format("0 (heuristic: {}) or {}..{} (ring depth)", default_stages, min_stages, max_stages));
  l.stages = p.num_stages == 0 ? default_stages : p.num_stages;
  const kl::ScorerLayout sl = kl::scorer_layout(p.num_heads, l.stages, l.sm90_persistent);
  l.sm90_stage_keys = sl.stage_keys;
  l.sm90_smem_bytes = sl.smem_bytes;
  l.portable_smem_bytes = kl::portable_smem_bytes(p.num_heads);
  l.topk_candidates = kl::topk_candidates(p.top_k);
  l.topk_smem_bytes = kl::topk_smem_bytes(p.top_k);
  return l;
}

// Launch shape of the sm90 scorer for one chunk of `rows` query rows whose sequences see at most
// `max_keys` keys. A split is a whole number of ring steps ("tiles" below: 64 keys for the tile
// scorer, 256-key blocks for the persistent one).
struct Sm90Work {
  int keys_per_split = 0;
  int64_t q_blocks = 0;  // CTAs' worth of tokens: ceil(rows / sm90_block_q)
  int64_t splits = 0;    // ceil(max_keys / keys_per_split)
  int64_t items = 0;     // q_blocks * splits: the persistent scorer's work items
  unsigned grid_x = 0, grid_y = 1;
};

// Per-item cost of the persistent scorer's grid in blocks (256 keys) of consumer work, for the split
// choice below: waiting for the item's Q buffer, loading its weights into registers and walking its
// segments is about one block's issue slots (~200 warp instructions against 210 per block).
constexpr int64_t kSm90ItemCostBlocks = 1;

// The tile scorer, and the persistent scorer with one item per CTA (`persistent` false): enough
// CTAs for several waves (>= 8 per SM over the launch) but at least 1024 keys per CTA (16 tiles or
// 4 blocks) so that a CTA's cold start (token slots, Q load, first K block) is amortized; the tile
// scorer's grid is (q blocks, splits), the persistent scorer's (items). The hardware deals the
// CTAs to the SMs as they free up.
//
// Persistent grid: min(SMs, items) CTAs walking the items in rounds
// (ScoresSm90Persistent::work_item in the template). A CTA's Q is double-buffered across its
// items, so an item costs ~1 block beyond its keys (kSm90ItemCostBlocks), and the makespan is the
// busiest CTA's rounds x (blocks per item + 1). The host does not know the sequences' visible keys (they are on the device), so it assumes
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
  const int64_t tiles = (max_keys + l.sm90_stage_keys - 1) / l.sm90_stage_keys;
  int64_t tiles_per_split = 0;
  if (persistent && l.sm90_persistent) {
    // Past one item per SM, more splits only add items; the candidates end 64 counts past it
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
    const int64_t min_tiles = 1024 / l.sm90_stage_keys;
    int64_t splits = (8 * int64_t{sms} + w.q_blocks - 1) / w.q_blocks;
    splits = std::max<int64_t>(1, std::min(splits, (tiles + min_tiles - 1) / min_tiles));
    tiles_per_split = (tiles + splits - 1) / splits;
  }
  w.keys_per_split = static_cast<int>(tiles_per_split * l.sm90_stage_keys);
  w.splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  w.items = w.q_blocks * w.splits;
  if (!l.sm90_persistent) {
    w.grid_x = static_cast<unsigned>(w.q_blocks);
    w.grid_y = static_cast<unsigned>(w.splits);
  } else {
    w.grid_x = static_cast<unsigned>(persistent ? std::min<int64_t>(sms, w.items) : w.items);
  }
  return w;
}

// Whether a compile target launches thread-block clusters: sm_90 and newer ("sm_90a" -> 90).
inline bool arch_has_clusters(const std::string& arch) {
  int v = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) v = v * 10 + (arch[i] - '0');
  return arch.rfind("sm_", 0) == 0 && v >= 90;
}

// CTAs per row of the top-k stage (a thread-block cluster of that many, sm_90 and newer): at decode
// shapes a step has few rows, each long, and one CTA per row leaves most SMs idle while each row's
// pass over its scores is the latency. Doubling while all of them still fit the top-k's slots at
// once (kTopkMinBlocks CTAs per SM), up to 8 (the portable cluster size), while each rank's slice
// keeps >= 2048 keys; 1 (one CTA per row) for rows of at most twice the candidate capacity, which
// the select takes whole without a sample. Examples at 132 SMs and 32K keys: 1 row -> 8, 64 rows
// -> 4, 128 rows -> 2, 4096 rows (prefill) -> 1. `forced` > 0 (the benchmark's and the tests'
// A/B, ops::detail::kIndexerTopkRanks) replaces the choice where clusters exist.
inline int topk_ranks(const Layout& l, int64_t rows, int64_t max_keys, int sms, bool clusters, int forced = 0) {
  if (!clusters) return 1;
  if (forced > 0) return forced;
  if (max_keys <= 2 * int64_t{l.topk_candidates}) return 1;
  const int64_t slots = int64_t{sms} * l.topk_min_blocks;
  int ranks = 1;
  while (ranks < 8 && rows * ranks * 2 <= slots && max_keys / (ranks * 2) >= 2048) ranks *= 2;
  // Rows of 64K keys and more are long enough that halving each CTA's pass pays for a second
  // wave: 256 rows of 128K keys, 132 SMs: 0.20 ms on one CTA per row.
  if (ranks == 1 && max_keys >= 65536 && rows * 2 <= 2 * slots) ranks = 2;
  return ranks;
}

}  // namespace mlajit::indexer
