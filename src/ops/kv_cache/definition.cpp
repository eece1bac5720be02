// The definitions of the paged KV cache family's ops (SPEC §1): kv_cache_store, kv_cache_gather
// and sparse_index_remap: params validation, knobs, shapes and buckets, kernel names, and the
// generator / tuning workload they share (src/core/op_definition.hpp says what each field means).
//
// What lives where in this folder:
//   definition.cpp       this file
//   generate.cpp         params -> CUDA source (templates/kv_cache/kv_cache.cuh)
//   op.cpp               the typed entry points: validation against the views, launch
//   tuning_workload.cpp  the autotuner's problems (random data on the GPU, compare)
//   bench.cpp/.hpp       `mlajit bench kv_cache_*` (harness library, not libmlajit)
// The host/device contract is templates/kv_cache/plan.h (compiled by both compilers) and args.h.
#include "autotune/workloads.hpp"
#include "core/param_checks.hpp"
#include "mlajit/error.hpp"
#include "ops/generators.hpp"
#include "core/op_definition.hpp"

namespace mlajit {

// ---- validation ---------------------------------------------------------------------------------
void KvCacheStoreParams::validate() const {
  cache.validate("params");
  MLAJIT_EXPECT(input_dtype == DType::bf16 || input_dtype == DType::f16 || input_dtype == DType::f32,
                "params.input_dtype", dtype_name(input_dtype), "bf16 | f16 | f32");
  check_threads(threads, "params.threads");
}

void KvCacheGatherParams::validate() const {
  cache.validate("params");
  MLAJIT_EXPECT(output_dtype == DType::bf16 || output_dtype == DType::f32, "params.output_dtype",
                dtype_name(output_dtype), "bf16 | f32");
  check_threads(threads, "params.threads");
}

void SparseIndexRemapParams::validate() const {
  check_page_size(page_size, "params.page_size");
  check_threads(threads, "params.threads");
}

namespace ops {

namespace {

std::string cache_name(std::string_view op, const PagedKVCacheParams& c) {
  std::string s = fmt::format("{}_{}_{}_h{}_d{}_p{}", op, c.is_mla ? "mla" : "mha", dtype_name(c.dtype), c.num_heads,
                              c.head_size, c.page_size);
  if (c.quantized()) s += fmt::format("_g{}_{}", c.resolved_quantization_granularity(), scale_fmt_name(c.scale_fmt));
  if (c.ds_mla()) s += "_ds_mla";  // absent: the split layout
  if (c.page_scales()) s += "_page_scales";
  if (c.num_layers != 1) s += fmt::format("_l{}", c.num_layers);  // absent: one layer
  return s;
}

// threads: every multiple of 32 up to 1024 is legal; auto is 128 (store, gather) / 256 (remap).
KnobDef threads_knob(int heuristic) { return {"threads", "thr", true, heuristic, {64, 128, 256, 512}}; }

}  // namespace

const OpDefinition& kv_cache_store_definition() {
  static const OpDefinition d{
      Op::kv_cache_store,
      {threads_knob(128)},
      {{"tokens", 65536, true, "new tokens written this step, across the batch (rows of x)"},
       {"batch", 8, true, "sequences in the batch"},
       {"context", 1024, false, "tokens already cached per sequence before this step"}},
      [](const autotune::Shape& s) { return autotune::bucket_kv_cache_store(s.at("tokens"), s.at("batch")); },
      [](const OpParams& params) {
        const auto& p = std::get<KvCacheStoreParams>(params);
        return fmt::format("{}_from_{}", cache_name("kv_cache_store", p.cache), dtype_name(p.input_dtype));
      },
      generate_kv_cache,
      autotune::make_kv_workload,
  };
  return d;
}

const OpDefinition& kv_cache_gather_definition() {
  static const OpDefinition d{
      Op::kv_cache_gather,
      {threads_knob(128)},
      {{"tokens", 65536, true, "rows gathered (rows of y)"},
       {"batch", 8, false, "sequences the rows are drawn from"},
       {"context", 8192, false, "cached tokens per sequence"}},
      [](const autotune::Shape& s) { return autotune::bucket_kv_cache_gather(s.at("tokens")); },
      [](const OpParams& params) {
        const auto& p = std::get<KvCacheGatherParams>(params);
        return fmt::format("{}_to_{}", cache_name("kv_cache_gather", p.cache), dtype_name(p.output_dtype));
      },
      generate_kv_cache,
      autotune::make_kv_workload,
  };
  return d;
}

const OpDefinition& sparse_index_remap_definition() {
  static const OpDefinition d{
      Op::sparse_index_remap,
      {threads_knob(256)},
      {{"tokens", 4096, true, "query tokens (rows of indices)"},
       {"top_k", 2048, true, "indices per token (columns of indices)"},
       {"batch", 4, false, "sequences"},
       {"context", 32768, false, "cached tokens per sequence (range of the logical indices)"}},
      [](const autotune::Shape& s) { return autotune::bucket_sparse_index_remap(s.at("tokens"), s.at("top_k")); },
      [](const OpParams& p) {
        return fmt::format("sparse_index_remap_p{}", std::get<SparseIndexRemapParams>(p).page_size);
      },
      generate_kv_cache,
      autotune::make_kv_workload,
  };
  return d;
}

}  // namespace ops
}  // namespace mlajit
