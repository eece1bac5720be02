// Source generator of sparse_prefill (SPEC §3). One translation unit per spec holding:
//   entry 0  mlajit_sparse_prefill_sm80: the portable mma.sync kernel of
//            templates/sparse_prefill/sm80.cuh, compiled for every target (sm_80 and newer);
//   entry 1  mlajit_sparse_prefill_sm90: the wgmma kernel of templates/sparse_prefill/sm90.cuh,
//            emitted for the specs that kernel covers (ops/sparse_prefill/plan.cpp: sm90_supported).
//            Its body is compiled only when the target has the sm_90a feature set; on other
//            targets the symbol exists with an empty body and the op never launches it (it picks
//            the entry by the device's arch).
// One source therefore compiles for any target the runtime asks for, and the cache key (source +
// arch) keeps the per-arch cubins apart. Launch geometry comes from ops/sparse_prefill/plan.hpp,
// shared with the op.
#include <string>
#include <variant>

#include "ops/generators.hpp"
#include "mlajit/error.hpp"
#include "ops/sparse_prefill/plan.hpp"

namespace mlajit {

namespace {

const char* cpp_bool(bool b) { return b ? "true" : "false"; }

std::string sm80_part(const SparsePrefillParams& p, const sparse_prefill::Sm80Plan& plan) {
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  return fmt::format(
      "// Portable path: {} CTA(s) of {} threads per token, {} heads each, {} keys per step, {} B shared memory.\n"
      "using SparsePrefillSm80 = mj::sparse_prefill_sm80::Config</*num_heads*/ {}, /*m_tiles*/ {}, /*key_tile*/ {},\n"
      "    /*kv_fp8*/ {}, /*scale_block*/ {}, /*attn_sink*/ {}, /*emit_lse*/ {}, /*page_size*/ {}>;\n"
      "static_assert(SparsePrefillSm80::kSmemBytes == {}, \"host plan and device layout disagree\");\n"
      "static_assert(SparsePrefillSm80::kThreads == {} && SparsePrefillSm80::kHeadTiles == {}, \"host plan\");\n"
      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const SparsePrefillArgs args) {{\n"
      "  mj::sparse_prefill_sm80::run<SparsePrefillSm80>(args);\n"
      "}}\n",
      plan.head_tiles, plan.threads, plan.heads_per_cta, plan.key_tile, plan.smem_bytes, p.num_q_heads, plan.m_tiles,
      plan.key_tile, cpp_bool(fp8), fp8 ? p.scale_block_size : 0, cpp_bool(p.attn_sink), cpp_bool(p.emit_lse),
      p.page_size, plan.smem_bytes, plan.threads, plan.head_tiles, plan.threads, sparse_prefill::kSymbolSm80);
}

std::string sm90_part(const SparsePrefillParams& p, const sparse_prefill::Sm90Plan& plan) {
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  return fmt::format(
      "\n// Hopper path (sm_90a only): {} CTA(s) of {} threads per token, {} B shared memory.\n"
      "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
      "#define MLAJIT_SPARSE_PREFILL_SM90 1\n"
      "#include \"sparse_prefill/sm90.cuh\"\n"
      "using SparsePrefillSm90 = mj::sparse_prefill_sm90::Config</*num_heads*/ {}, /*b_topk*/ {}, /*kv_fp8*/ {},\n"
      "    /*scale_block*/ {}, /*attn_sink*/ {}, /*emit_lse*/ {}, /*page_size*/ {}, /*num_stages*/ {}>;\n"
      "static_assert(SparsePrefillSm90::kSmemBytes == {} && SparsePrefillSm90::kThreads == {} &&\n"
      "              SparsePrefillSm90::kCtasPerToken == {}, \"host plan and device layout disagree\");\n"
      "#endif\n"
      "extern \"C\" __global__ void __launch_bounds__({}, 1) {}(const __grid_constant__ SparsePrefillArgs args) {{\n"
      "#if defined(MLAJIT_SPARSE_PREFILL_SM90)\n"
      "  mj::sparse_prefill_sm90::run<SparsePrefillSm90>(args);\n"
      "#endif\n"
      "}}\n",
      plan.head_tiles, plan.threads, plan.smem_bytes, p.num_q_heads, p.b_topk, cpp_bool(fp8),
      fp8 ? p.scale_block_size : 0, cpp_bool(p.attn_sink), cpp_bool(p.emit_lse), p.page_size, plan.num_stages,
      plan.smem_bytes, plan.threads, plan.head_tiles, plan.threads, sparse_prefill::kSymbolSm90);
}

}  // namespace

KernelSource generate_sparse_prefill(const KernelSpec& spec) {
  spec.validate();
  const auto* pp = std::get_if<SparsePrefillParams>(&spec.params);
  if (!pp) throw_error(ErrorKind::Internal, "generate_sparse_prefill called for op {}", op_name(spec.op()));
  const SparsePrefillParams& p = *pp;

  KernelSource src;
  src.spec = spec;
  src.name = spec.name();
  src.min_arch = "sm_80";

  const auto plan80 = sparse_prefill::sm80_plan(p);
  std::string code = source_header(spec);
  code += fmt::format(
      "// sparse_prefill: q bf16 [T, {}, 576], latent cache {} (page {}{}), out bf16 [T, {}, 512]{}{}\n"
      "#include \"sparse_prefill/sm80.cuh\"\n\n",
      p.num_q_heads, dtype_name(p.kv_dtype), p.page_size,
      p.kv_dtype == DType::fp8_e4m3 ? fmt::format(", scale block {}", p.scale_block_size) : std::string(),
      p.num_q_heads, p.emit_lse ? ", lse f32 [T, H]" : "", p.attn_sink ? ", attention sink" : "");
  code += sm80_part(p, plan80);
  src.entries.push_back({sparse_prefill::kSymbolSm80, static_cast<unsigned>(plan80.threads),
                         static_cast<unsigned>(plan80.smem_bytes)});

  if (sparse_prefill::sm90_supported(p)) {
    const auto plan90 = sparse_prefill::sm90_plan(p);
    code += sm90_part(p, plan90);
    src.entries.push_back({sparse_prefill::kSymbolSm90, static_cast<unsigned>(plan90.threads),
                           static_cast<unsigned>(plan90.smem_bytes)});
  }
  src.code = std::move(code);
  return src;
}

}  // namespace mlajit
