// Source generator of sparse_prefill (SPEC §3). Every source declares the same two entries:
//   entry 0  mlajit_sparse_prefill_portable: the portable mma.sync kernel (templates/sparse_prefill/portable.cuh);
//   entry 1  mlajit_sparse_prefill_sm90: the wgmma kernel (templates/sparse_prefill/sm90.cuh),
// (specs of the persistent Hopper kernel add entry 2, the tail split's combine; kv_staging bf16
// adds entries 3-5, the staging kernels of templates/sparse_prefill/stage_bf16.cuh, and its
// attention entries are those of the bf16-cache kernel: plan.hpp attention_params)
// but compiles exactly ONE of the two bodies: the other entry is a guard that traps if launched
// (the op never launches it: ops/sparse_prefill/op.cpp picks the module by path). Compiling one
// kernel per module halves the cold NVRTC time of a spec (the arch picks the body while
// preprocessing, so the other template is not even parsed).
//   Mode automatic (generate(spec), what Runtime::get / `mlajit build` compile): the wgmma body when
//     the target has the sm_90a feature set and the Hopper kernel is the automatic choice for the
//     spec (plan.hpp: sm90_supported && sm90_preferred), else the portable body.
//   Mode portable / sm90: that body whatever the target (the op's forced paths and
//     its fallbacks on sm_90a, e.g. a negative softmax scale); sm90 needs an sm_90a target (min_arch).
// qk_math fp8 (FP8 tensor-core math) exists only as the Hopper kernel: its source, automatic or
// sm90, holds the FP8-math Config and a guard in place of the portable entry, never the portable body,
// and needs an sm_90a target (min_arch, with min_arch_why naming qk_math fp8); mode portable is refused.
// Launch geometry comes from ops/sparse_prefill/plan.hpp, shared with the op.
#include <string>
#include <variant>

#include <fmt/ranges.h>

#include "ops/generators.hpp"
#include "mlajit/error.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"

namespace mlajit {

namespace {

const char* cpp_bool(bool b) { return b ? "true" : "false"; }

std::string portable_part(const SparsePrefillParams& p, const sparse_prefill::PortablePlan& plan) {
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  return fmt::format(
      "// Portable path: {} CTA(s) of {} threads per token, {} heads each, {} keys per step, {} B shared memory.\n"
      "#include \"sparse_prefill/portable.cuh\"\n"
      "using SparsePrefillPortable = mj::sparse_prefill_portable::Config</*num_heads*/ {}, /*m_tiles*/ {},\n"
      "    /*key_tile*/ {}, /*kv_fp8*/ {}, /*quant_granularity*/ {}, /*attn_sink*/ {}, /*emit_lse*/ {}, /*page_size*/ {}>;\n"
      "static_assert(SparsePrefillPortable::kSmemBytes == {}, \"host plan and device layout disagree\");\n"
      "static_assert(SparsePrefillPortable::kThreads == {} && SparsePrefillPortable::kHeadTiles == {}, \"host plan\");\n"
      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const SparsePrefillArgs args) {{\n"
      "  mj::sparse_prefill_portable::run<SparsePrefillPortable>(args);\n"
      "}}\n",
      plan.head_tiles, plan.threads, plan.heads_per_cta, plan.key_tile, plan.smem_bytes, p.num_q_heads, plan.m_tiles,
      plan.key_tile, cpp_bool(fp8), fp8 ? p.quantization_granularity : 0, cpp_bool(p.attn_sink), cpp_bool(p.emit_lse),
      p.page_size, plan.smem_bytes, plan.threads, plan.head_tiles, plan.threads, sparse_prefill::kSymbolPortable);
}

std::string sm90_part(const SparsePrefillParams& p, const sparse_prefill::Sm90Plan& plan) {
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  return fmt::format(
      "// Hopper path: {} CTA(s) of {} threads per token, {} B shared memory.{}\n"
      "#include \"sparse_prefill/sm90.cuh\"\n"
      "using SparsePrefillSm90 = mj::sparse_prefill_sm90::Config</*num_heads*/ {}, /*kv_fp8*/ {},\n"
      "    /*quant_granularity*/ {}, /*attn_sink*/ {}, /*emit_lse*/ {}, /*page_size*/ {},\n"
      "    /*fp8_math*/ {}, /*pow2_scales*/ {}{}>;\n"
      "static_assert(SparsePrefillSm90::kSmemBytes == {} && SparsePrefillSm90::kThreads == {} &&\n"
      "              SparsePrefillSm90::kCtasPerToken == {} && SparsePrefillSm90::kPersistent == {} &&\n"
      "              SparsePrefillSm90::kCrossoverAvailable == {},\n"
      "              \"host plan and device layout disagree\");\n"
      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const __grid_constant__ SparsePrefillArgs args) {{\n"
      "  mj::sparse_prefill_sm90::run<SparsePrefillSm90>(args);\n"
      "}}\n",
      plan.head_tiles, plan.threads, plan.smem_bytes,
      plan.crossover ? fmt::format("\n// Both bodies, with and without the crossover (the token's two CTAs as a cluster "
                                   "sharing the fp8 decode): launches of at most {} tokens take it.",
                                   sparse_prefill::kCrossoverMaxTokens)
                     : std::string(),
      p.num_q_heads, cpp_bool(fp8), fp8 ? p.quantization_granularity : 0,
      cpp_bool(p.attn_sink), cpp_bool(p.emit_lse), p.page_size, cpp_bool(p.qk_math == QkMath::fp8),
      cpp_bool(fp8 && p.scale_fmt == ScaleFmt::ue8m0),
      p.kv_layout == CacheLayout::fp8_ds_mla ? ", /*ds_mla*/ true" : "", plan.smem_bytes, plan.threads, plan.head_tiles,
      cpp_bool(plan.persistent), cpp_bool(plan.crossover), plan.threads, sparse_prefill::kSymbolSm90);
}

// The persistent kernel's tail-split combine (sm90_combine.cuh), on the Hopper side of the module.
std::string combine_part() {
  return fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}) {}(const __grid_constant__ SparsePrefillArgs args) {{\n"
      "  mj::sparse_prefill_sm90::combine<SparsePrefillSm90>(args);\n"
      "}}\n"
      "static_assert(mj::sparse_prefill_sm90::kCombineThreads == {}, \"host plan and device block size disagree\");\n",
      sparse_prefill::kCombineThreads, sparse_prefill::kSymbolSm90Combine, sparse_prefill::kCombineThreads);
}

// kv_staging bf16: the three staging kernels (templates/sparse_prefill/stage_bf16.cuh), compiled
// beside whichever attention body the module holds (they are plain CUDA for any target).
std::string stage_part(const SparsePrefillParams& p) {
  return fmt::format(
      "// fp8 -> bf16 staging of the selected rows (kv_staging bf16): clear the page flags, mark, convert.\n"
      "#include \"sparse_prefill/stage_bf16.cuh\"\n"
      "using SparsePrefillStage = mj::sparse_prefill_stage::Config</*page_size*/ {}, /*quant_granularity*/ {}>;\n"
      "static_assert(mj::sparse_prefill_stage::kThreads == {}, \"host plan and device block size disagree\");\n"
      "extern \"C\" __global__ void __launch_bounds__({}) {}(const SparsePrefillStageArgs args) {{\n"
      "  mj::sparse_prefill_stage::clear_flags(args);\n"
      "}}\n"
      "extern \"C\" __global__ void __launch_bounds__({}) {}(const SparsePrefillStageArgs args) {{\n"
      "  mj::sparse_prefill_stage::mark_pages<SparsePrefillStage>(args);\n"
      "}}\n"
      "extern \"C\" __global__ void __launch_bounds__({}) {}(const SparsePrefillStageArgs args) {{\n"
      "  mj::sparse_prefill_stage::convert_rows<SparsePrefillStage>(args);\n"
      "}}\n",
      p.page_size, p.quantization_granularity, sparse_prefill::kStageThreads, sparse_prefill::kStageThreads,
      sparse_prefill::kSymbolStageClear, sparse_prefill::kStageThreads, sparse_prefill::kSymbolStageMark,
      sparse_prefill::kStageThreads, sparse_prefill::kSymbolStageConvert);
}

// The entry whose body this module does not compile: it exists so that every module has both
// symbols (the runtime resolves all entries at load), and traps if it is ever launched.
std::string guard_entry(const char* symbol, int threads, bool grid_constant) {
  return fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const {}SparsePrefillArgs) {{\n"
      "  __trap();  // this module holds the other path's kernel: the op never launches this entry\n"
      "}}\n",
      threads, symbol, grid_constant ? "__grid_constant__ " : "");
}

// The specs no portable kernel computes (plan.hpp portable_supported: qk_math fp8, kv_layout
// fp8_ds_mla): the Hopper kernel alone (automatic and sm90 give the same code, hence one cache
// entry), with its split's combine where it splits (16-bit math). Entry 0 stays a guard so that the
// entry indices do not depend on the spec.
KernelSource hopper_only_source(const KernelSpec& spec, const SparsePrefillParams& p, sparse_prefill::Path mode) {
  const bool fp8_math = p.qk_math == QkMath::fp8;
  KernelSource src;
  src.spec = spec;
  src.name = spec.name();
  if (mode != sparse_prefill::Path::automatic) src.name += std::string("_") + sparse_prefill::path_name(mode);
  src.min_arch = "sm_90a";
  src.min_arch_why = fp8_math ? "qk_math fp8: FP8 tensor-core math runs on the Hopper kernel only; no portable kernel has it"
                              : "kv_layout fp8_ds_mla: the records are read by the Hopper kernel only";
  // FP8 math: ptxas's register-usage heuristic at its most aggressive level: -1.5 % cycles at s_kv
  // 32K and 128K, -0.2 % at 8K (ncu, H100). The 16-bit sources keep the default: bf16 gained at
  // most 0.8 % at any level, and its module also holds the portable kernel, which sm_80 targets
  // would compile with the same options unmeasured; fp8 on f16 tiles lost 3-9 % at every other level.
  if (fp8_math) src.nvrtc_options = {"--ptxas-options=--register-usage-level=10"};
  const auto plan = sparse_prefill::sm90_plan(p);
  std::string code = source_header(spec);
  if (fp8_math) {
    code += fmt::format(
        "// sparse_prefill: q bf16 [T, {}, 576] quantized per token and head to e4m3, latent cache fp8_e4m3 (page "
        "{}, quantization granularity {}), attention on FP8 tensor cores (qk_math fp8), out bf16 [T, {}, 512]{}{}\n"
        "// Kernel compiled in this module: the Hopper FP8-math one (qk_math fp8 has no portable kernel).\n"
        "// NVRTC options of this kernel (besides the fixed ones): {}\n",
        p.num_q_heads, p.page_size, p.quantization_granularity, p.num_q_heads, p.emit_lse ? ", lse f32 [T, H]" : "",
        p.attn_sink ? ", attention sink" : "", fmt::join(src.nvrtc_options, " "));
  } else {
    code += fmt::format(
        "// sparse_prefill: q bf16 [T, {}, 576], latent cache of fp8_ds_mla records (page {}: 512 e4m3, 4 f32 scales, "
        "64 bf16 rope dims per row), out bf16 [T, {}, 512]{}{}\n"
        "// Kernel compiled in this module: the Hopper one (fp8_ds_mla has no portable kernel).\n",
        p.num_q_heads, p.page_size, p.num_q_heads, p.emit_lse ? ", lse f32 [T, H]" : "", p.attn_sink ? ", attention sink" : "");
  }
  // The host never builds this source for another target (min_arch); this keeps an offline
  // compile of a dump (`mlajit gen --expand` | nvcc) from producing a module that cannot run.
  code += fmt::format("#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#error \"{}\"\n#endif\n",
                      fp8_math ? "qk_math fp8: the FP8-math sparse_prefill kernel needs sm_90a"
                               : "kv_layout fp8_ds_mla: the sparse_prefill kernel that reads it needs sm_90a");
  code += sm90_part(p, plan);
  code += guard_entry(sparse_prefill::kSymbolPortable, plan.threads, false);
  const bool combine = sparse_prefill::split_kernel(p);
  if (combine) code += combine_part();
  // The guard is never launched (the op refuses the portable path for these specs): it gets the
  // Hopper entry's block size and no dynamic shared memory.
  src.entries.push_back({sparse_prefill::kSymbolPortable, static_cast<unsigned>(plan.threads), 0u});
  src.entries.push_back(
      {sparse_prefill::kSymbolSm90, static_cast<unsigned>(plan.threads), static_cast<unsigned>(plan.smem_bytes)});
  if (combine)
    src.entries.push_back({sparse_prefill::kSymbolSm90Combine, static_cast<unsigned>(sparse_prefill::kCombineThreads), 0u});
  src.code = std::move(code);
  return src;
}

}  // namespace

KernelSource generate_sparse_prefill_mode(const KernelSpec& spec, sparse_prefill::Path mode) {
  spec.validate();
  const auto* pp = std::get_if<SparsePrefillParams>(&spec.params);
  if (!pp) throw_error(ErrorKind::Internal, "generate_sparse_prefill called for op {}", op_name(spec.op()));
  const SparsePrefillParams& p = *pp;
  // The attention kernel's params: p, or for kv_staging bf16 the bf16-cache kernel that reads the
  // staged copy (plan.hpp). The plans apply the same mapping.
  const SparsePrefillParams pa = sparse_prefill::attention_params(p);
  const bool covered = sparse_prefill::sm90_supported(p);
  if (mode == sparse_prefill::Path::sm90 && !covered)
    throw_invalid("sparse_prefill path sm90: params", spec.name(),
                  "a spec the sm90 kernel covers (fp8 quantization granularity 0 or >= 16)");
  if (!sparse_prefill::portable_supported(p)) {
    if (mode == sparse_prefill::Path::portable)
      throw_invalid("sparse_prefill path portable: params", spec.name(),
                    p.qk_math == QkMath::fp8
                        ? "qk_math bf16 (qk_math fp8 runs on the Hopper kernel only; the portable kernel has no FP8 math)"
                        : "kv_layout split (fp8_ds_mla records are read by the Hopper kernel only)");
    return hopper_only_source(spec, p, mode);
  }

  KernelSource src;
  src.spec = spec;
  src.name = spec.name();
  if (mode != sparse_prefill::Path::automatic) src.name += std::string("_") + sparse_prefill::path_name(mode);
  src.min_arch = mode == sparse_prefill::Path::sm90 ? "sm_90a" : "sm_80";

  const auto plan_portable = sparse_prefill::portable_plan(p);
  const auto plan90 = covered ? sparse_prefill::sm90_plan(p) : sparse_prefill::Sm90Plan{};
  std::string code = source_header(spec);
  code += fmt::format(
      "// sparse_prefill: q bf16 [T, {}, 576], latent cache {} (page {}{}), out bf16 [T, {}, 512]{}{}\n"
      "// Kernel compiled in this module{}: {}.\n",
      p.num_q_heads, dtype_name(p.kv_dtype), p.page_size,
      p.kv_dtype == DType::fp8_e4m3 ? fmt::format(", quantization granularity {}", p.quantization_granularity) : std::string(),
      p.num_q_heads, p.emit_lse ? ", lse f32 [T, H]" : "", p.attn_sink ? ", attention sink" : "",
      p.kv_staging == KvStaging::bf16 ? " (the selected rows staged as bf16 in the workspace first; the bf16-cache kernel reads them)" : "",
      mode == sparse_prefill::Path::portable ? "the portable one (forced)"
      : mode == sparse_prefill::Path::sm90 ? "the Hopper one (forced)"
      : covered && sparse_prefill::sm90_preferred(p) ? "the Hopper one on sm_90a targets, else the portable one"
                                                      : "the portable one (the automatic choice for this spec)");
  // MLAJIT_SPARSE_PREFILL_HOPPER: 1 when this compile takes the wgmma body.
  const char* hopper_cond = mode == sparse_prefill::Path::sm90   ? "1"
                            : mode == sparse_prefill::Path::portable ? "0"
                            : covered && sparse_prefill::sm90_preferred(p)
                                ? "(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL))"
                                : "0";
  code += fmt::format("#if {}\n#define MLAJIT_SPARSE_PREFILL_HOPPER 1\n#else\n#define MLAJIT_SPARSE_PREFILL_HOPPER 0\n#endif\n",
                      hopper_cond);
  const bool combine = covered && sparse_prefill::split_kernel(p);
  code += "#if MLAJIT_SPARSE_PREFILL_HOPPER\n";
  code += covered ? sm90_part(pa, plan90) +
                        guard_entry(sparse_prefill::kSymbolPortable, plan_portable.threads, false)
                  : std::string("#error \"unreachable: no Hopper kernel for this spec\"\n");
  if (combine) code += combine_part();
  code += "#else\n";
  code += portable_part(pa, plan_portable);
  if (covered) code += guard_entry(sparse_prefill::kSymbolSm90, plan90.threads, true);
  if (combine) code += guard_entry(sparse_prefill::kSymbolSm90Combine, sparse_prefill::kCombineThreads, true);
  code += "#endif\n";
  if (p.kv_staging == KvStaging::bf16) code += stage_part(p);

  src.entries.push_back({sparse_prefill::kSymbolPortable, static_cast<unsigned>(plan_portable.threads),
                         static_cast<unsigned>(plan_portable.smem_bytes)});
  if (covered)
    src.entries.push_back({sparse_prefill::kSymbolSm90, static_cast<unsigned>(plan90.threads),
                           static_cast<unsigned>(plan90.smem_bytes)});
  if (combine) src.entries.push_back({sparse_prefill::kSymbolSm90Combine, static_cast<unsigned>(sparse_prefill::kCombineThreads), 0u});
  if (p.kv_staging == KvStaging::bf16) {
    if (!combine) throw_error(ErrorKind::Internal, "sparse_prefill: kv_staging bf16 without the persistent kernel");
    const auto t = static_cast<unsigned>(sparse_prefill::kStageThreads);
    src.entries.push_back({sparse_prefill::kSymbolStageClear, t, 0u});
    src.entries.push_back({sparse_prefill::kSymbolStageMark, t, 0u});
    src.entries.push_back({sparse_prefill::kSymbolStageConvert, t, 0u});
  }
  src.code = std::move(code);
  return src;
}

KernelSource generate_sparse_prefill(const KernelSpec& spec) {
  return generate_sparse_prefill_mode(spec, sparse_prefill::Path::automatic);
}

}  // namespace mlajit
