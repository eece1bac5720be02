// The mla_indexer tiling plan (src/ops/mla_indexer/plan.hpp) for its two sm90 scorers: v8
// (params.block_kv 64: 64-key tiles shared by 4 x 128/H tokens) and v10 (block_kv 0 / 256: 256-key
// blocks, a 64-key quarter per warpgroup, 128/H tokens). The generated source static_asserts the
// same sizes against the templates, so these pin the host side; no GPU needed.
#include <doctest/doctest.h>

#include <string>

#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "ops/mla_indexer/plan.hpp"
#include "ops/mla_indexer/tma.hpp"

using namespace mlajit;

TEST_SUITE("mla_indexer plan") {
  TEST_CASE("v8 (block_kv 64): 4 x 128/H tokens per CTA, 64-key tiles, 6 stages") {
    for (int bkv : {64}) {
      MlaIndexerParams p;
      p.num_heads = 64;
      p.block_kv = bkv;
      const indexer::Layout l = indexer::layout(p);
      CHECK_FALSE(l.sm90_blocks);
      CHECK(l.sm90_block_q == 8);
      CHECK(l.sm90_tile_keys == 64);
      CHECK(l.stages == 6);
      CHECK(l.sm90_threads == 640);
      // Q 64 KiB + 6 x (8 KiB K + 256 B scales) + weights 8 x 80 floats + 12 barriers + 1 KiB slack.
      CHECK(l.sm90_smem_bytes == 65536u + 6u * (8192u + 256u) + 8u * 80u * 4u + 6u * 16u + 1024u);
    }
  }

  TEST_CASE("v10 (block_kv 0 / 256): 128/H tokens per CTA, 256-key blocks, 4 stages by default, at most 5") {
    for (int H : {32, 64, 128}) {
      MlaIndexerParams p;
      p.num_heads = H;
      CHECK(indexer::layout(p).sm90_blocks);  // block_kv 0: the heuristic picks v10
      p.block_kv = 256;
      const indexer::Layout l = indexer::layout(p);
      CHECK(l.sm90_blocks);
      CHECK(l.sm90_block_q == 128 / H);
      CHECK(l.sm90_tile_keys == 256);
      CHECK(l.stages == 4);
      CHECK(l.sm90_threads == 640);
      // Two Q buffers of 16 KiB + 4 x (32 KiB K + 1 KiB scales) + two buffers of weights, (128/H) x
      // (H + 16) floats + 8 ring barriers and 4 Q-buffer barriers + slack.
      CHECK(l.sm90_smem_bytes == 2u * 16384u + 4u * (32768u + 1024u) +
                                     2u * static_cast<unsigned>((128 / H) * (H + 16) * 4) + 12u * 8u + 1024u);
      p.num_stages = 5;
      CHECK(indexer::layout(p).sm90_smem_bytes <= 227u * 1024u);
      p.num_stages = 6;
      CHECK_THROWS_AS(indexer::layout(p), Error);
      p.num_stages = 0;
      p.block_q = 128 / H;
      CHECK_NOTHROW(indexer::layout(p));
      p.block_q = 4 * (128 / H);  // v8's tokens per CTA
      CHECK_THROWS_AS(indexer::layout(p), Error);
    }
    MlaIndexerParams p;
    p.block_kv = 128;
    CHECK_THROWS_AS(indexer::layout(p), Error);
  }

  TEST_CASE("block_kv 0 / 256 at page size 1 run v8 (v10 builds pages >= 2: one table entry per producer lane)") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.page_size = 1;
    CHECK_FALSE(indexer::layout(p).sm90_blocks);
    p.block_kv = 256;
    CHECK_FALSE(indexer::layout(p).sm90_blocks);
    p.page_size = 2;
    CHECK(indexer::layout(p).sm90_blocks);
  }

  TEST_CASE("block_kv 0 picks v10 at pages >= 8 (K by TMA, GPU-tested), v8 at 1, 2 and 4; block_kv 256 builds v10 at any page >= 2") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.page_size = 1;
    CHECK_FALSE(indexer::layout(p).sm90_blocks);
    for (int page : {2, 4}) {
      p.page_size = page;
      p.block_kv = 0;
      CHECK_FALSE(indexer::layout(p).sm90_blocks);
      CHECK(indexer::layout(p).sm90_block_q == 8);  // v8: 4 warpgroups x 128/H
      p.block_kv = 256;
      CHECK(indexer::layout(p).sm90_blocks);
    }
    for (int page : {8, 16, 32, 64, 128, 256, 4096}) {
      p.page_size = page;
      p.block_kv = 0;
      CHECK(indexer::layout(p).sm90_blocks);
    }
  }

  TEST_CASE("generated source: v10's template for block_kv 256, under its own kernel name") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.block_kv = 64;
    const KernelSpec v8{p};
    p.block_kv = 256;
    const KernelSpec v10{p};
    CHECK(v8.name() != v10.name());
    CHECK(v10.name().find("_bkv256") != std::string::npos);
    const KernelSource s8 = generate(v8), s10 = generate(v10);
    CHECK(s8.code.find("scores_sm90_blk") == std::string::npos);
    CHECK(s10.code.find("#include \"mla_indexer/scores_sm90_blk.cuh\"") != std::string::npos);
    CHECK(s10.code.find("ScoresSm90Blk<kHeads, kPageShift, kCausal, kStages>") != std::string::npos);
    CHECK(s10.code.find("scores_sm90_blk<kHeads, kPageShift, kCausal, kStages>(a)") != std::string::npos);
    CHECK(s10.entries.at(0).smem_bytes == indexer::layout(p).sm90_smem_bytes);
  }

  TEST_CASE("sm90_work: v8's (q blocks, splits) grid and v10's one-item-per-CTA grid, as before the persistent grid") {
    MlaIndexerParams p;
    p.num_heads = 64;
    p.block_kv = 64;
    const indexer::Layout v8 = indexer::layout(p);
    // 1024 rows of 8 tokens = 128 q blocks, 32768 keys = 512 tiles; 8 x 132 / 128 -> 9 splits of 57 tiles.
    indexer::Sm90Work w = indexer::sm90_work(v8, 1024, 32768, 132, true);
    CHECK(w.q_blocks == 128);
    CHECK(w.keys_per_split == 57 * 64);
    CHECK(w.splits == 9);
    CHECK(w.grid_x == 128u);
    CHECK(w.grid_y == 9u);
    p.block_kv = 0;
    const indexer::Layout v10 = indexer::layout(p);
    // 512 q blocks, 128 blocks: 8 x 132 / 512 -> 3 splits of 43 blocks, 1536 CTAs of one item.
    w = indexer::sm90_work(v10, 1024, 32768, 132, false);
    CHECK(w.q_blocks == 512);
    CHECK(w.keys_per_split == 43 * 256);
    CHECK(w.splits == 3);
    CHECK(w.items == 1536);
    CHECK(w.grid_x == 1536u);
    CHECK(w.grid_y == 1u);
  }

  TEST_CASE("sm90_work: v10's persistent grid, split by the makespan model") {
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

  TEST_CASE("v11's TMA plan: K by TMA always, scales by TMA when 16-byte aligned with one per row") {
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

  TEST_CASE("v11's TMA plan: one box per 64-key quarter at pages >= 64, one per page at pages 8..32") {
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
    // Boxes of fewer than 8 rows would not fill a 1024-byte swizzle atom: pages 2 and 4 stay on v10.
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
}
