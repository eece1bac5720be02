// Source generator of the mla_indexer family (SPEC §2): three entries in one module,
//   0 mla_indexer_scores_sm90      fp8 wgmma scores (sm_90a; traps elsewhere): v10, or v8 with block_kv 64
//   1 mla_indexer_scores_portable  f32 FMA scores for every other target (sm_80+)
//   2 mla_indexer_topk             exact top-k (one pass into a candidate list; radix fallback) + emit
// The op (src/ops/mla_indexer/op.cpp) picks entry 0 or 1 by the device's arch.
#include <fmt/format.h>

#include "ops/generators.hpp"
#include "ops/mla_indexer/plan.hpp"
#include "mlajit/error.hpp"

namespace mlajit {

KernelSource generate_mla_indexer(const KernelSpec& spec) {
  const auto& p = std::get<MlaIndexerParams>(spec.params);
  const indexer::Layout lay = indexer::layout(p);  // validates the tiling knobs

  KernelSource src;
  src.spec = spec;
  src.name = spec.name();
  src.min_arch = "sm_80";
  std::string& c = src.code;
  c = source_header(spec);
  // The sm90 entry runs v10 (block_kv 0 / 256) or v8 (block_kv 64); the spec's name carries a set
  // knob (_bkv64, _bkv256), so the variants are cached side by side.
  const char* sm90_header = lay.sm90_blocks ? "mla_indexer/scores_sm90_blk.cuh" : "mla_indexer/scores_sm90.cuh";
  const char* sm90_struct = lay.sm90_blocks ? "ScoresSm90Blk" : "ScoresSm90";
  const char* sm90_fn = lay.sm90_blocks ? "scores_sm90_blk" : "scores_sm90";
  c += fmt::format("#include \"{}\"\n", sm90_header);
  c += "#include \"mla_indexer/scores_portable.cuh\"\n";
  c += "#include \"mla_indexer/topk.cuh\"\n\n";
  c += fmt::format(
      "constexpr int kHeads = {};\n"
      "constexpr int kPageShift = {};\n"
      "constexpr bool kCausal = {};\n"
      "constexpr int kStages = {};\n"
      "constexpr int kTopK = {};\n"
      "constexpr bool kPhysical = {};\n"
      "using Sm90 = mj::indexer_sm90::{}<kHeads, kPageShift, kCausal, kStages>;\n"
      "using Topk = mj::indexer::TopkSelect<kTopK>;\n"
      "// The host computes the same sizes (src/ops/mla_indexer/plan.hpp); a mismatch is a build error.\n"
      "static_assert(Sm90::kSmemBytes == {}u, \"sm90 scores smem size\");\n"
      "static_assert(Sm90::kThreads == {}, \"sm90 scores threads\");\n"
      "static_assert(Sm90::kBlockQ == {}, \"sm90 tokens per CTA\");\n"
      "static_assert(mj::indexer_portable::scores_portable_smem_bytes<kHeads>() == {}u, \"portable smem size\");\n"
      "static_assert(Topk::kSmemBytes == {}u, \"top-k smem size\");\n"
      "static_assert(Topk::kCap == {}, \"top-k candidate capacity\");\n"
      "static_assert(mj::indexer::TopkConfig::kThreads == {}, \"top-k threads\");\n\n",
      p.num_heads, lay.page_shift, p.mask == Mask::causal ? "true" : "false", lay.stages, p.top_k,
      p.emit == IndexEmit::physical ? "true" : "false", sm90_struct, lay.sm90_smem_bytes, lay.sm90_threads, lay.sm90_block_q,
      lay.portable_smem_bytes, lay.topk_smem_bytes, lay.topk_candidates, lay.topk_threads);
  // __grid_constant__: v11's TMA reads its tensor maps (MlaIndexerScoresArgs::k_map, scale_map) from
  // the kernel's parameter space by address; without it, taking that address would copy the
  // struct to local memory.
  c += fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}, 1) mla_indexer_scores_sm90(\n"
      "    const __grid_constant__ MlaIndexerScoresArgs a) {{\n"
      "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
      "  mj::indexer_sm90::{}<kHeads, kPageShift, kCausal, kStages>(a);\n"
      "#else\n"
      "  asm volatile(\"trap;\");  // wgmma needs sm_90a; the host launches the portable entry instead\n"
      "#endif\n"
      "}}\n\n",
      lay.sm90_threads, sm90_fn);
  c += fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}) mla_indexer_scores_portable(const MlaIndexerScoresArgs a) "
      "{{\n"
      "  mj::indexer_portable::scores_portable<kHeads, kPageShift, kCausal>(a);\n"
      "}}\n\n",
      lay.portable_threads);
  c += fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}, {}) mla_indexer_topk(const MlaIndexerTopkArgs a) {{\n"
      "  mj::indexer::topk_rows<kTopK, kPageShift, kCausal, kPhysical>(a);\n"
      "}}\n",
      lay.topk_threads, lay.topk_min_blocks);
  src.entries = {
      {"mla_indexer_scores_sm90", static_cast<unsigned>(lay.sm90_threads), lay.sm90_smem_bytes},
      {"mla_indexer_scores_portable", static_cast<unsigned>(lay.portable_threads), lay.portable_smem_bytes},
      {"mla_indexer_topk", static_cast<unsigned>(lay.topk_threads), lay.topk_smem_bytes},
  };
  return src;
}

}  // namespace mlajit
