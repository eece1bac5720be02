// The definition of sparse_prefill (SPEC §3): params validation, knobs, shapes and bucket, kernel
// name, generator and tuning workload (src/core/op_definition.hpp says what each field means).
//
// What lives where in this folder:
//   definition.cpp       this file
//   plan.hpp/.cpp        which kernel entries a spec has and the launch geometry of each
//   generate.cpp         params -> CUDA source (templates/sparse_prefill/sm90.cuh, portable.cuh)
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
  // b_topk is not a knob: no kernel reads it (the Hopper kernels take 64 keys per pipeline step), and the
  // indices' row stride must be a multiple of it (op.cpp).
  MLAJIT_EXPECT(b_topk == 64, "params.b_topk", b_topk,
                "64 (the keys each pipeline step of the kernels processes, fixed at 64)");
  check_page_size(page_size, "params.page_size");
  MLAJIT_EXPECT(kv_layout == CacheLayout::split || kv_layout == CacheLayout::fp8_ds_mla, "params.kv_layout",
                cache_layout_name(kv_layout), "split | fp8_ds_mla (fp8_page_scales is the indexer's K layout)");
  if (kv_layout == CacheLayout::fp8_ds_mla) {
    MLAJIT_EXPECT(kv_dtype == DType::fp8_e4m3, "params.kv_dtype", dtype_name(kv_dtype),
                  "fp8_e4m3 with kv_layout fp8_ds_mla (its records hold e4m3 latents)");
    MLAJIT_EXPECT(quantization_granularity == 128, "params.quantization_granularity", quantization_granularity,
                  "128 with kv_layout fp8_ds_mla (one f32 scale per 128 latent elements; the rope dims are bf16)");
  } else if (kv_dtype == DType::fp8_e4m3) {
    MLAJIT_EXPECT(quantization_granularity == 0 ||
                      (quantization_granularity > 0 && qk_depth % quantization_granularity == 0),
                  "params.quantization_granularity", quantization_granularity, "0 (unit scales) or a divisor of 576");
  } else {
    MLAJIT_EXPECT(quantization_granularity == 0, "params.quantization_granularity", quantization_granularity,
                  "0 for kv_dtype bf16");
  }
  MLAJIT_EXPECT(output_dtype == DType::bf16, "params.output_dtype", dtype_name(output_dtype), "bf16");
  // ue8m0 describes the cache's scales (powers of two); a cache without scales has nothing to describe.
  MLAJIT_EXPECT(scale_fmt == ScaleFmt::fp32 || (kv_dtype == DType::fp8_e4m3 && quantization_granularity > 0),
                "params.scale_fmt", scale_fmt_name(scale_fmt),
                "fp32 for a cache without scales (ue8m0 needs kv_dtype fp8_e4m3 and quantization_granularity > 0: "
                "it says every scale is a power of two)");
  if (qk_math == QkMath::fp8) {
    // The FP8-math kernel feeds the cache's e4m3 bytes straight to the FP8 tensor cores, so the
    // cache must be fp8, and a scale may only multiply a whole row (folded into the scores and P);
    // group scales would have to be applied inside the tile, i.e. 16-bit math again.
    MLAJIT_EXPECT(kv_dtype == DType::fp8_e4m3, "params.kv_dtype", dtype_name(kv_dtype),
                  "fp8_e4m3 with qk_math fp8 (FP8 math reads an fp8 cache; a bf16 cache takes qk_math bf16)");
    MLAJIT_EXPECT(quantization_granularity == 0 || quantization_granularity == qk_depth,
                  "params.quantization_granularity", quantization_granularity,
                  "0 (unit scales) or 576 (one scale per row) with qk_math fp8 (group scales are not supported "
                  "in FP8 math: use qk_math bf16 for them)");
  }
  if (kv_layout == CacheLayout::fp8_ds_mla) {
    // The record holds e4m3 latents with one f32 scale per 128 elements and the rope dims as bf16
    // (checked above); only the 16-bit Hopper kernel reads records.
    MLAJIT_EXPECT(qk_math == QkMath::bf16, "params.qk_math", qk_math == QkMath::fp8 ? "fp8" : "bf16",
                  "bf16 with kv_layout fp8_ds_mla (FP8 math needs unit or per-row scales)");
    MLAJIT_EXPECT(kv_staging == KvStaging::none, "params.kv_staging", "bf16",
                  "none with kv_layout fp8_ds_mla (the attention kernel decodes the records itself)");
  }
  if (kv_staging == KvStaging::bf16) {
    // Staging converts fp8 rows for the 16-bit kernel: a bf16 cache has nothing to convert, and FP8
    // math reads the fp8 bytes themselves.
    MLAJIT_EXPECT(kv_dtype == DType::fp8_e4m3, "params.kv_staging", "bf16",
                  "none for kv_dtype bf16 (kv_staging bf16 converts an fp8_e4m3 cache)");
    MLAJIT_EXPECT(qk_math == QkMath::bf16, "params.kv_staging", "bf16",
                  "none with qk_math fp8 (FP8 math reads the cache's e4m3 bytes; staging feeds the 16-bit kernel)");
  }
}

int SparsePrefillParams::row_bytes() const {
  return kv_layout == CacheLayout::fp8_ds_mla ? 656 : qk_depth * static_cast<int>(dtype_size(kv_dtype));
}

namespace ops {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

const OpDefinition& sparse_prefill_definition() {
  static const OpDefinition d{
      Op::sparse_prefill,
      // No knobs: b_topk has one legal value and the launch plan picks the kernel and its geometry.
      {},
      {{"tokens", 4096, true, "query tokens"},
       {"top_k", 2048, true, "selected keys per token (indices_stride = top_k rounded up to 128)"},
       {"keys", 32768, false, "keys in the latent cache (s_kv)"}},
      [](const autotune::Shape& s) {
        return autotune::bucket_sparse_prefill(s.at("tokens"), round_up(s.at("top_k"), 128));
      },
      [](const OpParams& params) {
        const auto& p = std::get<SparsePrefillParams>(params);
        std::string s = fmt::format("sparse_prefill_{}_h{}_p{}", dtype_name(p.kv_dtype), p.num_q_heads, p.page_size);
        if (p.kv_dtype == DType::fp8_e4m3) s += fmt::format("_g{}", p.quantization_granularity);
        if (p.scale_fmt == ScaleFmt::ue8m0) s += "_ue8m0";  // fp32, the default, is not marked
        if (p.attn_sink) s += "_sink";
        if (!p.emit_lse) s += "_nolse";
        // Only the opt-in modes are marked.
        if (p.qk_math == QkMath::fp8) s += "_fp8math";
        if (p.kv_staging == KvStaging::bf16) s += "_stagebf16";
        if (p.kv_layout == CacheLayout::fp8_ds_mla) s += "_dsmla";
        return s;
      },
      generate_sparse_prefill,
      autotune::make_prefill_workload,
  };
  return d;
}

}  // namespace ops
}  // namespace mlajit
