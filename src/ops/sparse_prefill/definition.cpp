// The definition of sparse_prefill (SPEC §3): params validation, knobs, shapes and bucket, kernel
// name, generator and tuning workload (src/core/op_definition.hpp says what each field means).
//
// What lives where in this folder:
//   definition.cpp       this file
//   plan.hpp/.cpp        which kernel entries a spec has and the launch geometry of each
//   generate.cpp         params -> CUDA source (templates/sparse_prefill/sm90.cuh, sm80.cuh)
//   op.cpp, launch.hpp   the entry point: validation, path choice, launch
//   tuning_workload.cpp  the autotuner's problem
//   bench.cpp/.hpp       `mlajit bench sparse_prefill` (harness library, not libmlajit)
#include "autotune/workloads.hpp"
#include "core/param_checks.hpp"
#include "mlajit/error.hpp"
#include "ops/generators.hpp"
#include "core/op_definition.hpp"

namespace mlajit {

void SparsePrefillParams::validate() const {
  MLAJIT_EXPECT(qkv_dtype == DType::bf16, "params.qkv_dtype", dtype_name(qkv_dtype), "bf16");
  MLAJIT_EXPECT(kv_dtype == DType::bf16 || kv_dtype == DType::fp8_e4m3, "params.kv_dtype", dtype_name(kv_dtype),
                "bf16 | fp8_e4m3");
  MLAJIT_EXPECT(num_q_heads >= 16 && num_q_heads <= 128 && num_q_heads % 16 == 0, "params.num_q_heads",
                num_q_heads, "a multiple of 16 in [16, 128]");
  MLAJIT_EXPECT(qk_depth == 576, "params.qk_depth", qk_depth, "576");
  MLAJIT_EXPECT(v_depth == 512, "params.v_depth", v_depth, "512");
  MLAJIT_EXPECT(b_topk == 64 || b_topk == 128, "params.b_topk", b_topk, "64 | 128");
  check_page_size(page_size, "params.page_size");
  if (kv_dtype == DType::fp8_e4m3) {
    MLAJIT_EXPECT(scale_block_size == 0 || (scale_block_size > 0 && qk_depth % scale_block_size == 0),
                  "params.scale_block_size", scale_block_size, "0 (unit scales) or a divisor of 576");
  } else {
    MLAJIT_EXPECT(scale_block_size == 0, "params.scale_block_size", scale_block_size, "0 for kv_dtype bf16");
  }
  MLAJIT_EXPECT(output_dtype == DType::bf16, "params.output_dtype", dtype_name(output_dtype), "bf16");
  // ue8m0 describes the cache's scales (powers of two); a cache without scales has nothing to describe.
  MLAJIT_EXPECT(scale_fmt == ScaleFmt::fp32 || (kv_dtype == DType::fp8_e4m3 && scale_block_size > 0),
                "params.scale_fmt", scale_fmt_name(scale_fmt),
                "fp32 for a cache without scales (ue8m0 needs kv_dtype fp8_e4m3 and scale_block_size > 0: it says "
                "every scale is a power of two)");
  if (qk_math == QkMath::fp8) {
    // The FP8-math kernel feeds the cache's e4m3 bytes straight to the FP8 tensor cores, so the
    // cache must be fp8, and a scale may only multiply a whole row (folded into the scores and P);
    // group scales would have to be applied inside the tile, i.e. 16-bit math again.
    MLAJIT_EXPECT(kv_dtype == DType::fp8_e4m3, "params.kv_dtype", dtype_name(kv_dtype),
                  "fp8_e4m3 with qk_math fp8 (FP8 math reads an fp8 cache; a bf16 cache takes qk_math bf16)");
    MLAJIT_EXPECT(scale_block_size == 0 || scale_block_size == qk_depth, "params.scale_block_size", scale_block_size,
                  "0 (unit scales) or 576 (one scale per row) with qk_math fp8 (group scales are not supported "
                  "in FP8 math: use qk_math bf16 for them)");
  }
  if (kv_staging == KvStaging::bf16) {
    // Staging converts fp8 rows for the 16-bit kernel: a bf16 cache has nothing to convert, and FP8
    // math reads the fp8 bytes themselves.
    MLAJIT_EXPECT(kv_dtype == DType::fp8_e4m3, "params.kv_staging", "bf16",
                  "none for kv_dtype bf16 (kv_staging bf16 converts an fp8_e4m3 cache)");
    MLAJIT_EXPECT(qk_math == QkMath::bf16, "params.kv_staging", "bf16",
                  "none with qk_math fp8 (FP8 math reads the cache's e4m3 bytes; staging feeds the 16-bit kernel)");
  }
  // Only the Hopper kernel has a pipeline depth (its K ring is two 64-key stages); the portable
  // kernel's pipeline is fixed. Any other depth used to mean "skip the Hopper kernel" silently: the
  // path is chosen by the arch (and by the bench's / tests' explicit path), never by a knob.
  MLAJIT_EXPECT(num_stages == 0 || num_stages == 2, "params.num_stages", num_stages,
                "0 (auto) or 2 (the Hopper kernel's two-stage K ring; the portable kernel's pipeline is fixed)");
}

namespace ops {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

const OpDefinition& sparse_prefill_definition() {
  static const OpDefinition d{
      Op::sparse_prefill,
      // b_topk has no auto value (0 is rejected by validate()). num_stages has one legal depth (2),
      // which auto (0) resolves to: a record or a config may pin it, no sweep tries it.
      {{"b_topk", "t", false, 0, {64, 128}}, {"num_stages", "st", true, 0, {}}},
      {{"tokens", 4096, true, "query tokens"},
       {"topk", 2048, true, "selected keys per token (indices_stride = topk rounded up to 128)"},
       {"keys", 32768, false, "keys in the latent cache (s_kv)"}},
      [](const autotune::Shape& s) {
        return autotune::bucket_sparse_prefill(s.at("tokens"), round_up(s.at("topk"), 128));
      },
      [](const OpParams& params) {
        const auto& p = std::get<SparsePrefillParams>(params);
        std::string s = fmt::format("sparse_prefill_{}_h{}_p{}", dtype_name(p.kv_dtype), p.num_q_heads, p.page_size);
        if (p.kv_dtype == DType::fp8_e4m3) s += fmt::format("_sb{}", p.scale_block_size);
        if (p.scale_fmt == ScaleFmt::ue8m0) s += "_ue8m0";  // fp32 (the default) keeps the old names
        if (p.attn_sink) s += "_sink";
        if (!p.emit_lse) s += "_nolse";
        // Only the opt-in mode is marked, so the default specs keep the names they always had.
        if (p.qk_math == QkMath::fp8) s += "_fp8math";
        if (p.kv_staging == KvStaging::bf16) s += "_stagebf16";
        return s;
      },
      generate_sparse_prefill,
      autotune::make_prefill_workload,
  };
  return d;
}

}  // namespace ops
}  // namespace mlajit
