// The definition of mla_indexer (SPEC §2): params validation, knobs, shapes and bucket, kernel
// name, generator and tuning workload (src/core/op_definition.hpp says what each field means).
//
// What lives where in this folder:
//   definition.cpp       this file
//   plan.hpp             the host side of the tiling plan: which scorer, launch shapes (sizes from
//                        templates/mla_indexer/layout.h, the kernels' own layout)
//   tma.hpp/.cpp         the persistent scorer's TMA descriptors of the K cache
//   generate.cpp         params -> CUDA source (templates/mla_indexer/: scores_sm90_tile,
//                        scores_sm90_persistent, scores_portable, topk)
//   op.cpp, stages.hpp   the entry point: validation, workspace chunking, the three launches
//   tuning_workload.cpp  the autotuner's problem
//   bench.cpp/.hpp       `mlajit bench mla_indexer` (harness library, not libmlajit)
#include "autotune/workloads.hpp"
#include "core/param_checks.hpp"
#include "mlajit/error.hpp"
#include "ops/generators.hpp"
#include "core/op_definition.hpp"

namespace mlajit {

void MlaIndexerParams::validate() const {
  MLAJIT_EXPECT(num_heads == 32 || num_heads == 64 || num_heads == 128, "params.num_heads", num_heads,
                "32 | 64 | 128");
  MLAJIT_EXPECT(depth == 128, "params.depth", depth, "128");
  MLAJIT_EXPECT(top_k >= 1 && top_k <= 4096, "params.top_k", top_k, "an integer in [1, 4096]");
  check_page_size(page_size, "params.page_size");
  MLAJIT_EXPECT(quantization_granularity >= depth, "params.quantization_granularity", quantization_granularity,
                fmt::format(">= depth ({}): one k scale per token", depth));
  MLAJIT_EXPECT(block_q >= 0 && block_q <= 256, "params.block_q", block_q, "0 (heuristic) or 1..256");
  MLAJIT_EXPECT(block_kv == 0 || block_kv == 64 || block_kv == 128 || block_kv == 256, "params.block_kv", block_kv,
                "0 (heuristic) | 64 | 128 | 256");
  MLAJIT_EXPECT(num_stages >= 0 && num_stages <= 8, "params.num_stages", num_stages, "0 (heuristic) or 1..8");
  MLAJIT_EXPECT(k_layout == CacheLayout::split || k_layout == CacheLayout::fp8_page_scales, "params.k_layout",
                cache_layout_name(k_layout), "split | fp8_page_scales");
  if (k_layout == CacheLayout::fp8_page_scales)
    MLAJIT_EXPECT(page_size % 32 == 0, "params.page_size", page_size,
                  "a multiple of 32 with k_layout fp8_page_scales (a page of 132-byte tokens is whole 128-byte rows)");
}

namespace ops {

const OpDefinition& mla_indexer_definition() {
  static const OpDefinition d{
      Op::mla_indexer,
      // block_kv picks the sm90 scorer (plan.hpp): 256 = the persistent scorer (256-key blocks,
      // block_q = 128 / H), 64 = the tile scorer (64-key tiles, block_q = 4 * 128 / H), 0 = the
      // heuristic (persistent at pages >= 8, tile at 1, 2 and 4); block_q follows from it. Both stay knobs so that a record or a config can pin them,
      // but no sweep tries other values (the heuristic's pick was the faster one at every measured
      // page size). The ring depth is the knob the tuner sweeps, over the
      // depths both scorers build (the persistent scorer's ring holds at most 5 blocks next to its two Q buffers).
      {{"block_kv", "bkv", true, 0, {}}, {"block_q", "bq", true, 0, {}}, {"num_stages", "st", true, 0, {2, 3, 4, 5}}},
      {{"tokens", 4096, true, "new query tokens across the batch"},
       {"batch", 1, true, "sequences"},
       {"keys", 32768, true, "keys per sequence, cached + new (max_keys_per_seq)"}},
      [](const autotune::Shape& s) {
        return autotune::bucket_mla_indexer(s.at("tokens"), s.at("batch"), s.at("keys"));
      },
      [](const OpParams& params) {
        const auto& p = std::get<MlaIndexerParams>(params);
        return fmt::format("mla_indexer_h{}_d{}_k{}_p{}_{}_{}{}", p.num_heads, p.depth, p.top_k, p.page_size,
                           mask_name(p.mask), emit_name(p.emit),
                           p.k_layout == CacheLayout::fp8_page_scales ? "_page_scales" : "");
      },
      generate_mla_indexer,
      autotune::make_indexer_workload,
  };
  return d;
}

}  // namespace ops
}  // namespace mlajit
