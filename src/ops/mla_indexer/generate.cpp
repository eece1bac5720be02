// Source generator of the mla_indexer family (SPEC §2): three entries, each its own compile unit
// (compiled in parallel, loaded as one module each),
//   0 mla_indexer_scores_sm90      fp8 wgmma scores (sm_90a; traps elsewhere): the persistent
//                                  scorer, or the tile scorer (block_kv 64, pages 1, 2, 4)
//   1 mla_indexer_scores_portable  f32 FMA scores for every other target (sm_80+)
//   2 mla_indexer_topk             exact top-k (one pass into a candidate list; radix fallback) + emit
// The op (src/ops/mla_indexer/op.cpp) picks entry 0 or 1 by the device's arch. Thread counts and
// shared-memory sizes come from the kernels' layout (templates/mla_indexer/layout.h), which the
// templates use as well.
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
  // The sm90 entry runs the persistent or the tile scorer; the spec's name carries a set knob
  // (_bkv64, _bkv256), so the variants are cached side by side.
  const char* sm90_header =
      lay.sm90_persistent ? "mla_indexer/scores_sm90_persistent.cuh" : "mla_indexer/scores_sm90_tile.cuh";
  const char* sm90_fn = lay.sm90_persistent ? "scores_sm90_persistent" : "scores_sm90_tile";
  c += fmt::format("#include \"{}\"\n", sm90_header);
  c += "#include \"mla_indexer/scores_portable.cuh\"\n";
  c += "#include \"mla_indexer/topk.cuh\"\n\n";
  c += fmt::format(
      "constexpr int kHeads = {};\n"
      "constexpr int kPageShift = {};\n"
      "constexpr bool kCausal = {};\n"
      "constexpr int kStages = {};\n"
      "constexpr int kTopK = {};\n"
      "constexpr bool kPhysical = {};\n\n",
      p.num_heads, lay.page_shift, p.mask == Mask::causal ? "true" : "false", lay.stages, p.top_k,
      p.emit == IndexEmit::physical ? "true" : "false");
  // The K cache layout fp8_page_scales: the scorers' extra template argument, emitted only for it
  // (sources of split-layout specs stay as they were).
  const bool page_scales = p.k_layout == CacheLayout::fp8_page_scales;
  const char* ps_arg = page_scales ? ", /*page_scales*/ true" : "";
  if (page_scales)
    c += fmt::format("// K cache: layout fp8_page_scales, per page {} x 128 e4m3 then {} f32 scales\n\n", p.page_size,
                     p.page_size);
  // __grid_constant__: the persistent scorer's TMA reads its tensor maps (MlaIndexerScoresArgs::
  // k_map, scale_map) from the kernel's parameter space by address; without it, taking that
  // address would copy the struct to local memory.
  // Each entry is its own compile unit (KernelSource::compile_units): NVRTC compiles the three in
  // parallel, so the module's cold compile is its slowest kernel's (the top-k's) rather than the sum.
  c += fmt::format(
      "#if !defined(MLAJIT_UNIT) || MLAJIT_UNIT == 0\n"
      "extern \"C\" __global__ void __launch_bounds__({}, 1) mla_indexer_scores_sm90(\n"
      "    const __grid_constant__ MlaIndexerScoresArgs a) {{\n"
      "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
      "  mj::indexer_sm90::{}<kHeads, kPageShift, kCausal, kStages{}>(a);\n"
      "#else\n"
      "  asm volatile(\"trap;\");  // wgmma needs sm_90a; the host launches the portable entry instead\n"
      "#endif\n"
      "}}\n"
      "#endif\n\n",
      lay.sm90_threads, sm90_fn, ps_arg);
  c += fmt::format(
      "#if !defined(MLAJIT_UNIT) || MLAJIT_UNIT == 1\n"
      "extern \"C\" __global__ void __launch_bounds__({}) mla_indexer_scores_portable(const MlaIndexerScoresArgs a) "
      "{{\n"
      "  mj::indexer_portable::scores_portable<kHeads, kPageShift, kCausal{}>(a);\n"
      "}}\n"
      "#endif\n\n",
      lay.portable_threads, ps_arg);
  c += fmt::format(
      "#if !defined(MLAJIT_UNIT) || MLAJIT_UNIT == 2\n"
      "extern \"C\" __global__ void __launch_bounds__({}, {}) mla_indexer_topk(const MlaIndexerTopkArgs a) {{\n"
      "  mj::indexer::topk_rows<kTopK, kPageShift, kCausal, kPhysical>(a);\n"
      "}}\n"
      "#endif\n",
      lay.topk_threads, lay.topk_min_blocks);
  src.entries = {
      {"mla_indexer_scores_sm90", static_cast<unsigned>(lay.sm90_threads), lay.sm90_smem_bytes, /*unit*/ 0},
      {"mla_indexer_scores_portable", static_cast<unsigned>(lay.portable_threads), lay.portable_smem_bytes, 1},
      {"mla_indexer_topk", static_cast<unsigned>(lay.topk_threads), lay.topk_smem_bytes, 2},
  };
  src.compile_units = 3;
  return src;
}

}  // namespace mlajit
