// The mla_indexer tiling plan (src/ops/mla_indexer/plan.hpp) for its two sm90 scorers: the tile
// scorer (params.block_kv 64: 64-key tiles shared by 4 x 128/H tokens) and the persistent scorer
// (block_kv 0 / 256: 256-key blocks, a 64-key quarter per warpgroup, 128/H tokens). Sizes come from
// the kernels' layout (templates/mla_indexer/layout.h), which the templates compile too; these
// check the plan's choices and the layout's invariants. No GPU needed.
#include <doctest/doctest.h>

#include <string>

#include "mla_indexer/layout.h"
#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "ops/mla_indexer/plan.hpp"
#include "ops/mla_indexer/tma.hpp"

using namespace mlajit;
namespace kl = mj::indexer;

TEST_SUITE("mla_indexer plan") {
  TEST_CASE("the kernels' layout: offsets in order, swizzle-aligned buffers, within a CTA's shared memory") {
    for (bool persistent : {false, true})
      for (int H : {32, 64, 128}) {
        const int lo = persistent ? kl::kPersistentMinStages : kl::kTileMinStages;
        const int hi = persistent ? kl::kPersistentMaxStages : kl::kTileMaxStages;
        for (int st = lo; st <= hi; ++st) {
          const kl::ScorerLayout l = kl::scorer_layout(H, st, persistent);
          INFO("persistent " << persistent << " H " << H << " stages " << st);
          CHECK(l.block_q * H == kl::kMmaColumns * (persistent ? 1 : kl::kScorerWarpgroups));
          CHECK(l.q_bytes == static_cast<unsigned>(l.block_q * H * kl::kDepth));
          CHECK(l.stage_bytes == static_cast<unsigned>(l.stage_keys * kl::kDepth));
          CHECK(l.q_bytes % kl::kSmemAlign == 0);
          CHECK(l.stage_bytes % kl::kSmemAlign == 0);
          CHECK(l.off_k == static_cast<unsigned>(l.q_bufs) * l.q_bytes);
          CHECK(l.off_kscale == l.off_k + static_cast<unsigned>(st) * l.stage_bytes);
          CHECK(l.off_w == l.off_kscale + static_cast<unsigned>(st * l.stage_keys * 4));
          CHECK(l.off_full_bar == l.off_w + static_cast<unsigned>(l.q_bufs * l.w_floats * 4));
          CHECK(l.off_full_bar % 8 == 0);
          CHECK(l.off_empty_bar == l.off_full_bar + static_cast<unsigned>(8 * st));
          CHECK(l.barriers == 2 * st + (persistent ? 2 * kl::kQBufs : 0));
          CHECK(l.smem_bytes == l.off_full_bar + static_cast<unsigned>(8 * l.barriers) + kl::kSmemAlign);
          CHECK(l.smem_bytes <= kl::kMaxSmemBytes);
        }
        // One stage more than the scorer builds would not fit (the persistent scorer), or is
        // simply not built (the tile scorer's ring of 8 already covers the latency).
        if (persistent) CHECK(kl::scorer_layout(H, hi + 1, true).smem_bytes > kl::kMaxSmemBytes);
      }
    CHECK(kl::portable_smem_bytes(64) == static_cast<unsigned>((64 * 128 + 64) * 4));
    // Top-k: the layout depends on top_k only through its power-of-two ceiling.
    CHECK(kl::topk_smem_bytes(2048) == sizeof(kl::TopkLayout<2048>::Smem));
    CHECK(kl::topk_smem_bytes(1025) == sizeof(kl::TopkLayout<1025>::Smem));
    CHECK(kl::topk_smem_bytes(4096) == sizeof(kl::TopkLayout<4096>::Smem));
    CHECK(kl::topk_smem_bytes(4097) == 0u);
    CHECK(kl::topk_candidates(2048) == kl::TopkLayout<2048>::kCap);
    CHECK(kl::topk_candidates(1) == 2048);
    CHECK(kl::topk_candidates(4096) == 8192);
    // Three top-k CTAs per SM at k 2048.
    CHECK(3u * kl::topk_smem_bytes(2048) <= 228u * 1024u);
  }

  TEST_CASE("the tile scorer (block_kv 64): 4 x 128/H tokens per CTA, 64-key tiles, 6 stages") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.block_kv = 64;
    const indexer::Layout l = indexer::layout(p);
    CHECK_FALSE(l.sm90_persistent);
    CHECK(l.sm90_block_q == 8);
    CHECK(l.sm90_stage_keys == 64);
    CHECK(l.stages == kl::kTileDefaultStages);
    CHECK(l.sm90_threads == kl::kScorerThreads);
    CHECK(l.sm90_smem_bytes == kl::tile_scorer_layout(64, kl::kTileDefaultStages).smem_bytes);
    p.num_stages = kl::kTileMaxStages;
    CHECK(indexer::layout(p).sm90_smem_bytes == kl::tile_scorer_layout(64, kl::kTileMaxStages).smem_bytes);
    p.num_stages = kl::kTileMaxStages + 1;
    CHECK_THROWS_AS(indexer::layout(p), Error);
  }

  TEST_CASE("the persistent scorer (block_kv 0 / 256): 128/H tokens per CTA, 256-key blocks, 4 stages by default, at most 5") {
    for (int H : {32, 64, 128}) {
      MlaIndexerParams p;
      p.num_heads = H;
      CHECK(indexer::layout(p).sm90_persistent);  // block_kv 0: the heuristic picks the persistent scorer
      p.block_kv = 256;
      const indexer::Layout l = indexer::layout(p);
      CHECK(l.sm90_persistent);
      CHECK(l.sm90_block_q == 128 / H);
      CHECK(l.sm90_stage_keys == 256);
      CHECK(l.stages == kl::kPersistentDefaultStages);
      CHECK(l.sm90_threads == kl::kScorerThreads);
      CHECK(l.sm90_smem_bytes == kl::persistent_scorer_layout(H, kl::kPersistentDefaultStages).smem_bytes);
      p.num_stages = kl::kPersistentMaxStages;
      CHECK(indexer::layout(p).sm90_smem_bytes <= kl::kMaxSmemBytes);
      p.num_stages = kl::kPersistentMaxStages + 1;
      CHECK_THROWS_AS(indexer::layout(p), Error);
      p.num_stages = 0;
      p.block_q = 128 / H;
      CHECK_NOTHROW(indexer::layout(p));
      p.block_q = 4 * (128 / H);  // the tile scorer's tokens per CTA
      CHECK_THROWS_AS(indexer::layout(p), Error);
    }
    MlaIndexerParams p;
    p.block_kv = 128;
    CHECK_THROWS_AS(indexer::layout(p), Error);
  }

  TEST_CASE("block_kv 0 / 256 at page size 1 run the tile scorer (the persistent one builds pages >= 2: one table entry per producer lane)") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.page_size = 1;
    CHECK_FALSE(indexer::layout(p).sm90_persistent);
    p.block_kv = 256;
    CHECK_FALSE(indexer::layout(p).sm90_persistent);
    p.page_size = 2;
    CHECK(indexer::layout(p).sm90_persistent);
  }

  TEST_CASE("block_kv 0 picks the persistent scorer at pages >= 8 (K by TMA, GPU-tested), the tile scorer at 1, 2 and 4; block_kv 256 builds the persistent one at any page >= 2") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.page_size = 1;
    CHECK_FALSE(indexer::layout(p).sm90_persistent);
    for (int page : {2, 4}) {
      p.page_size = page;
      p.block_kv = 0;
      CHECK_FALSE(indexer::layout(p).sm90_persistent);
      CHECK(indexer::layout(p).sm90_block_q == 8);  // the tile scorer: 4 warpgroups x 128/H
      p.block_kv = 256;
      CHECK(indexer::layout(p).sm90_persistent);
    }
    for (int page : {8, 16, 32, 64, 128, 256, 4096}) {
      p.page_size = page;
      p.block_kv = 0;
      CHECK(indexer::layout(p).sm90_persistent);
    }
  }

  TEST_CASE("generated source: the persistent scorer's template for block_kv 256, under its own kernel name") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.block_kv = 64;
    const KernelSpec tile{p};
    p.block_kv = 256;
    const KernelSpec persistent{p};
    CHECK(tile.name() != persistent.name());
    CHECK(persistent.name().find("_bkv256") != std::string::npos);
    const KernelSource st = generate(tile), sp = generate(persistent);
    CHECK(st.code.find("scores_sm90_persistent") == std::string::npos);
    CHECK(st.code.find("#include \"mla_indexer/scores_sm90_tile.cuh\"") != std::string::npos);
    CHECK(st.code.find("scores_sm90_tile<kHeads, kPageShift, kCausal, kStages>(a)") != std::string::npos);
    CHECK(sp.code.find("#include \"mla_indexer/scores_sm90_persistent.cuh\"") != std::string::npos);
    CHECK(sp.code.find("scores_sm90_persistent<kHeads, kPageShift, kCausal, kStages>(a)") != std::string::npos);
    // Launch sizes: the kernels' layout, as the templates use it.
    CHECK(sp.entries.at(0).smem_bytes == kl::persistent_scorer_layout(64, kl::kPersistentDefaultStages).smem_bytes);
    CHECK(st.entries.at(0).smem_bytes == kl::tile_scorer_layout(64, kl::kTileDefaultStages).smem_bytes);
    CHECK(sp.entries.at(0).threads == static_cast<unsigned>(kl::kScorerThreads));
    CHECK(sp.entries.at(1).threads == static_cast<unsigned>(kl::kPortableThreads));
    CHECK(sp.entries.at(1).smem_bytes == kl::portable_smem_bytes(64));
    CHECK(sp.entries.at(2).threads == static_cast<unsigned>(kl::kTopkThreads));
    CHECK(sp.entries.at(2).smem_bytes == kl::topk_smem_bytes(p.top_k));
  }

  TEST_CASE("sm90_work: the tile scorer's (q blocks, splits) grid and the persistent scorer's one-item-per-CTA grid") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.block_kv = 64;
    const indexer::Layout tile = indexer::layout(p);
    // 1024 rows of 8 tokens = 128 q blocks, 32768 keys = 512 tiles; 8 x 132 / 128 -> 9 splits of 57 tiles.
    indexer::Sm90Work w = indexer::sm90_work(tile, 1024, 32768, 132, true);
    CHECK(w.q_blocks == 128);
    CHECK(w.keys_per_split == 57 * 64);
    CHECK(w.splits == 9);
    CHECK(w.grid_x == 128u);
    CHECK(w.grid_y == 9u);
    p.block_kv = 0;
    const indexer::Layout persistent = indexer::layout(p);
    // 512 q blocks, 128 blocks: 8 x 132 / 512 -> 3 splits of 43 blocks, 1536 CTAs of one item.
    w = indexer::sm90_work(persistent, 1024, 32768, 132, false);
    CHECK(w.q_blocks == 512);
    CHECK(w.keys_per_split == 43 * 256);
    CHECK(w.splits == 3);
    CHECK(w.items == 1536);
    CHECK(w.grid_x == 1536u);
    CHECK(w.grid_y == 1u);
  }

  TEST_CASE("sm90_work: the persistent grid, split by the makespan model") {
    MlaIndexerParams p;
    p.num_heads = 64;
    const indexer::Layout l = indexer::layout(p);
    // H 64, 1024 rows, 32K keys, 132 SMs: no split (4 rounds of 128 blocks: cost 4 x 129 = 516;
    // 2 splits: 8 x 65 = 520; 3: 12 x 44 = 528).
    indexer::Sm90Work w = indexer::sm90_work(l, 1024, 32768, 132, true);
    CHECK(w.splits == 1);
    CHECK(w.keys_per_split == 32768);
    CHECK(w.items == 512);
    CHECK(w.grid_x == 132u);
    CHECK(w.grid_y == 1u);
    // Fewer q blocks than SMs: the keys are split into the shortest items that still run in one
    // round. 3 q blocks, 79 blocks of keys (20000 keys): 40 splits of 2 blocks (120 items, cost
    // 1 x 3); splits of 1 block would be 237 items in 2 rounds (cost 2 x 2).
    w = indexer::sm90_work(l, 6, 20000, 132, true);
    CHECK(w.q_blocks == 3);
    CHECK(w.keys_per_split % 256 == 0);
    CHECK(w.items <= 132);
    CHECK(w.grid_x == static_cast<unsigned>(w.items));
    CHECK(w.keys_per_split == 2 * 256);
    CHECK(w.splits == 40);
    // Every case: the split covers the keys with whole blocks, the grid never exceeds the items or
    // the SMs, and the last split is non-empty.
    for (int H : {32, 64, 128})
      for (int64_t rows : {1, 7, 100, 1024, 4096})
        for (int64_t keys : {1, 255, 256, 4097, 32768, 131072})
          for (int sms : {1, 7, 132}) {
            p.num_heads = H;
            const indexer::Layout lh = indexer::layout(p);
            const indexer::Sm90Work x = indexer::sm90_work(lh, rows, keys, sms, true);
            INFO("H " << H << " rows " << rows << " keys " << keys << " sms " << sms);
            CHECK(x.keys_per_split % 256 == 0);
            CHECK(x.keys_per_split > 0);
            CHECK(x.splits == (keys + x.keys_per_split - 1) / x.keys_per_split);
            CHECK((x.splits - 1) * int64_t{x.keys_per_split} < keys);
            CHECK(x.q_blocks == (rows + 128 / H - 1) / (128 / H));
            CHECK(x.items == x.q_blocks * x.splits);
            CHECK(x.grid_x >= 1u);
            CHECK(int64_t{x.grid_x} == std::min<int64_t>(sms, x.items));
            CHECK(x.grid_y == 1u);
          }
    CHECK_THROWS_AS(indexer::sm90_work(l, 0, 32768, 132, true), Error);
    CHECK_THROWS_AS(indexer::sm90_work(l, 16, 0, 132, true), Error);
  }

  TEST_CASE("the TMA plan: K by TMA always, scales by TMA when 16-byte aligned with one per row") {
    const uintptr_t base = uintptr_t{1} << 20;
    CHECK(indexer::plan_tma(base, base + 256, 1000, 1, 64).scales_by_tma);
    CHECK(indexer::plan_tma(base + 48, base + 16, (int64_t{1} << 31) - 1, 1, 64).scales_by_tma);
    // A scales view at a 4-byte offset is valid input: its scales come by cp.async.
    CHECK_FALSE(indexer::plan_tma(base, base + 4, 1000, 1, 64).scales_by_tma);
    CHECK_FALSE(indexer::plan_tma(base, base + 8, 1000, 1, 64).scales_by_tma);
    CHECK_FALSE(indexer::plan_tma(base, base, 1000, 2, 64).scales_by_tma);
    // What the TMA cannot address is named.
    auto error_of = [](uintptr_t k, int64_t rows) -> std::string {
      try {
        indexer::plan_tma(k, 1 << 20, rows, 1, 64);
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::InvalidArgument);
        return e.what();
      }
      return "(no error)";
    };
    CHECK(error_of(base + 8, 1000).rfind("k_cache.blocks address", 0) == 0);
    CHECK(error_of(base, int64_t{1} << 31).rfind("k_cache rows", 0) == 0);
    CHECK(error_of(base, 0).rfind("k_cache rows", 0) == 0);
  }

  TEST_CASE("the TMA plan: one box per 64-key quarter at pages >= 64, one per page at pages 8..32") {
    const uintptr_t base = uintptr_t{1} << 20;
    for (int page : {64, 128, 256, 1024}) CHECK(indexer::plan_tma(base, base, 1000, 1, page).box_rows == 64u);
    CHECK(indexer::plan_tma(base, base, 1000, 1, 64).rows == 1000);  // the maps' row extent
    for (int page : {8, 16, 32}) {
      const indexer::TmaPlan p = indexer::plan_tma(base, base, 1000, 1, page);
      CHECK(p.box_rows == static_cast<uint32_t>(page));
      // A scale box lands at page x 4 bytes into the quarter's scales: a tensor copy's shared
      // destination must be 128-byte aligned, so pages 8 and 16 take the cp.async scale path.
      CHECK(p.scales_by_tma == (page >= 32));
      CHECK_FALSE(indexer::plan_tma(base, base + 4, 1000, 1, page).scales_by_tma);
    }
    // Boxes of fewer than 8 rows would not fill a 1024-byte swizzle atom: pages 2 and 4 stay on cp.async.
    for (int page : {1, 2, 4, 0, -8, 24, 48}) {
      std::string what = "(no error)";
      try {
        indexer::plan_tma(base, base, 1000, 1, page);
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::InvalidArgument);
        what = e.what();
      }
      CHECK_MESSAGE(what.rfind("page_size", 0) == 0, "page ", page, ": ", what);
    }
    CHECK(indexer::kTmaMinPage == 8);
  }

  TEST_CASE("the top-k's CTAs per row: clusters for a decode step's few long rows, one CTA otherwise") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.top_k = 2048;
    p.page_size = 64;
    const indexer::Layout l = indexer::layout(p);
    CHECK(l.topk_candidates == 4096);
    // 132 SMs x 3 top-k CTAs: clusters of up to 8 while rows x ranks stays within half the slots.
    CHECK(indexer::topk_ranks(l, 1, 32768, 132, true) == 8);
    CHECK(indexer::topk_ranks(l, 32, 131072, 132, true) == 8);
    CHECK(indexer::topk_ranks(l, 64, 32768, 132, true) == 4);
    CHECK(indexer::topk_ranks(l, 128, 131072, 132, true) == 2);
    // Rows of >= 64K keys take 2 even past one wave.
    CHECK(indexer::topk_ranks(l, 256, 131072, 132, true) == 2);
    CHECK(indexer::topk_ranks(l, 256, 32768, 132, true) == 1);
    CHECK(indexer::topk_ranks(l, 1024, 131072, 132, true) == 1);
    CHECK(indexer::topk_ranks(l, 256, 32768, 132, true, 4) == 4);  // forced (A/B)
    CHECK(indexer::topk_ranks(l, 4096, 32768, 132, true) == 1);
    // Slices keep >= 2048 keys; rows of at most twice the candidate capacity take one CTA.
    CHECK(indexer::topk_ranks(l, 1, 9000, 132, true) == 4);
    CHECK(indexer::topk_ranks(l, 1, 8192, 132, true) == 1);
    // No clusters before sm_90.
    CHECK(indexer::topk_ranks(l, 1, 131072, 132, false) == 1);
    CHECK(indexer::arch_has_clusters("sm_90a"));
    CHECK(indexer::arch_has_clusters("sm_100a"));
    CHECK_FALSE(indexer::arch_has_clusters("sm_89"));
    CHECK_FALSE(indexer::arch_has_clusters("sm_80"));
    CHECK_FALSE(indexer::arch_has_clusters("compute_90"));
  }
}
