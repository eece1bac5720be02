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

  TEST_CASE("v10 (block_kv 0 / 256): 128/H tokens per CTA, 256-key blocks, 4 stages by default, at most 6") {
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
      // Q 16 KiB + 4 x (32 KiB K + 1 KiB scales) + weights (128/H) x (H + 16) floats + 8 barriers + slack.
      CHECK(l.sm90_smem_bytes ==
            16384u + 4u * (32768u + 1024u) + static_cast<unsigned>((128 / H) * (H + 16) * 4) + 4u * 16u + 1024u);
      p.num_stages = 6;
      CHECK(indexer::layout(p).sm90_smem_bytes <= 227u * 1024u);
      p.num_stages = 7;
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

  TEST_CASE("v11's TMA plan: K by TMA always, scales by TMA when 16-byte aligned with one per row") {
    const uintptr_t base = uintptr_t{1} << 20;
    CHECK(indexer::plan_tma(base, base + 256, 1000, 1).scales_by_tma);
    CHECK(indexer::plan_tma(base + 48, base + 16, (int64_t{1} << 31) - 1, 1).scales_by_tma);
    // A scales view at a 4-byte offset is valid input: its scales come by cp.async.
    CHECK_FALSE(indexer::plan_tma(base, base + 4, 1000, 1).scales_by_tma);
    CHECK_FALSE(indexer::plan_tma(base, base + 8, 1000, 1).scales_by_tma);
    CHECK_FALSE(indexer::plan_tma(base, base, 1000, 2).scales_by_tma);
    // What the TMA cannot address is named.
    auto error_of = [](uintptr_t k, int64_t rows) -> std::string {
      try {
        indexer::plan_tma(k, 1 << 20, rows, 1);
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
}
