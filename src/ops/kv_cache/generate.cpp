// Source generator of the paged KV cache family (SPEC §1): kv_cache_store, kv_cache_gather and
// sparse_index_remap. Each spec becomes one translation unit with one extern "C" entry that
// instantiates the matching template of templates/kv_cache/kv_cache.cuh with the params as template
// arguments; the host side (ops/kv_cache/op.cpp) launches entry 0 with the args struct of
// templates/kv_cache/args.h.
#include <string>
#include <type_traits>
#include <variant>

#include "ops/generators.hpp"
#include "mlajit/error.hpp"

namespace mlajit {

namespace {

// The element type tag of templates/common/elem.cuh for a storage dtype.
const char* elem_tag(DType t) {
  switch (t) {
    case DType::f32: return "mj::F32";
    case DType::f16: return "mj::F16";
    case DType::bf16: return "mj::Bf16";
    case DType::fp8_e4m3: return "mj::E4m3";
    default: break;
  }
  throw_error(ErrorKind::Internal, "kv_cache codegen: no element type for dtype {}", dtype_name(t));
}

// Template arguments shared by store and gather: the cache geometry.
std::string cache_geometry_args(const PagedKVCacheParams& c) {
  return fmt::format("/*num_heads*/ {}, /*head_size*/ {}, /*page_size*/ {}, /*num_layers*/ {}, /*kv_dim*/ {}, "
                     "/*quantization_granularity*/ {}",
                     c.num_heads, c.head_size, c.page_size, c.num_layers, c.kv_dim(),
                     c.resolved_quantization_granularity());
}

std::string layout_comment(const PagedKVCacheParams& c) {
  if (c.page_scales())
    return fmt::format("// cache: layout fp8_page_scales, u8 blocks [num_blocks, 1, {}, {}, 132]: per page {} x 128 "
                       "e4m3, then {} f32 scales ({})\n",
                       c.num_layers, c.page_size, c.page_size, c.page_size,
                       c.scale_fmt == ScaleFmt::ue8m0 ? "ue8m0" : "fp32");
  std::string s = fmt::format("// cache: {} blocks [num_blocks, {}, {}, {}, {}, {}]", dtype_name(c.dtype), c.kv_dim(),
                              c.num_layers, c.page_size, c.num_heads, c.head_size);
  if (c.quantized())
    s += fmt::format("; f32 scales [num_blocks, {}, {}, {}, {}, {}] ({})", c.kv_dim(), c.num_layers, c.page_size,
                     c.num_heads, c.head_dim_granularity(), c.scale_fmt == ScaleFmt::ue8m0 ? "ue8m0" : "fp32");
  return s + "\n";
}

// Layout fp8_ds_mla: one 656-byte record per token (SPEC §1).
std::string ds_mla_layout_comment(const PagedKVCacheParams& c) {
  return fmt::format("// cache: layout fp8_ds_mla, u8 blocks [num_blocks, 1, {}, {}, 656]: per token 512 e4m3, "
                     "4 f32 ue8m0 tile scales, 64 bf16\n",
                     c.num_layers, c.page_size);
}

// One extern "C" entry taking the args struct by value, bounded to `threads` per block.
std::string entry(const char* symbol, const char* args_type, const char* kernel_type, int threads) {
  return fmt::format(
      "extern \"C\" __global__ void __launch_bounds__({}) {}(const {} args) {{\n"
      "  {}::run(args);\n"
      "}}\n",
      threads, symbol, args_type, kernel_type);
}

}  // namespace

KernelSource generate_kv_cache(const KernelSpec& spec) {
  spec.validate();
  KernelSource src;
  src.spec = spec;
  src.name = spec.name();
  src.min_arch = "sm_80";
  std::string body;
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, KvCacheStoreParams>) {
          const auto& c = p.cache;
          if (c.ds_mla()) {
            body = fmt::format(
                "// kv_cache_store: x {} [T, 1, 576] -> cache\n{}"
                "using KvCacheStoreKernel = mj::kv::KvStoreDsMla<{}, /*page_size*/ {}, /*num_layers*/ {}, "
                "/*threads*/ {}>;\n\n{}",
                dtype_name(p.input_dtype), ds_mla_layout_comment(c), elem_tag(p.input_dtype), c.page_size,
                c.num_layers, p.threads, entry("kv_cache_store", "KvCacheStoreArgs", "KvCacheStoreKernel", p.threads));
            src.entries.push_back({"kv_cache_store", static_cast<unsigned>(p.threads), 0});
            return;
          }
          body = fmt::format(
              "// kv_cache_store: x {} [T, {}, {}] -> cache\n{}"
              "using KvCacheStoreKernel = mj::kv::KvStore<{}, {}, {}, /*ue8m0*/ {}, /*threads*/ {}{}>;\n\n{}",
              dtype_name(p.input_dtype), c.num_heads, c.head_size, layout_comment(c), elem_tag(p.input_dtype),
              elem_tag(c.dtype), cache_geometry_args(c), c.scale_fmt == ScaleFmt::ue8m0 ? "true" : "false",
              p.threads, c.page_scales() ? ", /*page_scales*/ true" : "",
              entry("kv_cache_store", "KvCacheStoreArgs", "KvCacheStoreKernel", p.threads));
          src.entries.push_back({"kv_cache_store", static_cast<unsigned>(p.threads), 0});
        } else if constexpr (std::is_same_v<T, KvCacheGatherParams>) {
          const auto& c = p.cache;
          if (c.ds_mla()) {
            body = fmt::format(
                "// kv_cache_gather: cache -> y {} [T, 1, 576]\n{}"
                "using KvCacheGatherKernel = mj::kv::KvGatherDsMla<{}, /*page_size*/ {}, /*num_layers*/ {}, "
                "/*threads*/ {}>;\n\n{}",
                dtype_name(p.output_dtype), ds_mla_layout_comment(c), elem_tag(p.output_dtype), c.page_size,
                c.num_layers, p.threads, entry("kv_cache_gather", "KvCacheGatherArgs", "KvCacheGatherKernel", p.threads));
            src.entries.push_back({"kv_cache_gather", static_cast<unsigned>(p.threads), 0});
            return;
          }
          body = fmt::format(
              "// kv_cache_gather: cache -> y {} [T, {}, {}]\n{}"
              "using KvCacheGatherKernel = mj::kv::KvGather<{}, {}, {}, /*threads*/ {}{}>;\n\n{}",
              dtype_name(p.output_dtype), c.num_heads, c.head_size, layout_comment(c), elem_tag(c.dtype),
              elem_tag(p.output_dtype), cache_geometry_args(c), p.threads,
              c.page_scales() ? ", /*page_scales*/ true" : "",
              entry("kv_cache_gather", "KvCacheGatherArgs", "KvCacheGatherKernel", p.threads));
          src.entries.push_back({"kv_cache_gather", static_cast<unsigned>(p.threads), 0});
        } else if constexpr (std::is_same_v<T, SparseIndexRemapParams>) {
          body = fmt::format(
              "// sparse_index_remap: logical positions -> block * {} + offset\n"
              "using SparseIndexRemapKernel = mj::kv::SparseIndexRemap</*page_size*/ {}, /*threads*/ {}>;\n\n{}",
              p.page_size, p.page_size, p.threads,
              entry("sparse_index_remap", "SparseIndexRemapArgs", "SparseIndexRemapKernel", p.threads));
          src.entries.push_back({"sparse_index_remap", static_cast<unsigned>(p.threads), 0});
        } else {
          throw_error(ErrorKind::Internal, "generate_kv_cache called for op {}", op_name(spec.op()));
        }
      },
      spec.params);
  src.code = source_header(spec) + "#include \"kv_cache/kv_cache.cuh\"\n\n" + body;
  return src;
}

}  // namespace mlajit
