#pragma once
// Parameter structs of every op (SPEC.md). Each has validate() (throws Error naming the field,
// the bad value and the allowed set), JSON round trip (unknown fields are rejected so a typo in
// a config never silently falls back to a default), and a canonical string.
//
// Compile-time parameters are what the generated kernel is specialized on. Sizes that vary per
// call (token counts, batch, number of blocks) are run-time arguments, not params.
#include <string>
#include <variant>

#include <nlohmann/json_fwd.hpp>

#include "mlajit/dtype.hpp"

namespace mlajit {

enum class ScaleFmt { fp32, ue8m0 };  // fp32: s = amax/448; ue8m0: s rounded up to a power of 2
enum class Mask { none, causal };
enum class IndexEmit { logical, physical };
// sparse_prefill tensor-core math. bf16: 16-bit operands (bf16 tiles; f16 tiles for an fp8 cache with
// unit or per-row scales), exact up to bf16/f16 rounding. fp8: opt-in, Hopper only: Q quantized per
// token and head to e4m3 and QK (and P.V) on FP8 wgmma, faster and less accurate (docs/ops/sparse_prefill.md).
enum class QkMath { bf16, fp8 };
// sparse_prefill on an fp8 cache. none: the attention kernel decodes the fp8 rows it gathers (no
// workspace). bf16: opt-in: the rows the launch selects are first converted once into a bf16 copy
// in the caller's workspace (sparse_prefill_workspace_bytes) and the bf16 kernel reads that copy:
// faster, and each element q * scale is rounded once to bf16 (exact for unit and ue8m0 scales).
enum class KvStaging { none, bf16 };
// The paged cache's storage (SPEC §1). split: `blocks` of dtype plus a separate f32 `scales` tensor
// for fp8. fp8_ds_mla: FlashMLA's DeepSeek-V3.2 fp8 latent record, one 656-byte record per token
// (512 e4m3, 4 f32 tile scales, 64 bf16 rope) in u8 `blocks`, no `scales` tensor.
// fp8_page_scales: the indexer K cache of DeepGEMM's paged MQA logits and of vLLM: each page holds
// page_size x 128 e4m3 (token after token) followed by the page's page_size f32 scales, in u8
// `blocks`, no `scales` tensor.
enum class CacheLayout { split, fp8_ds_mla, fp8_page_scales };

// SPEC §1. The paged KV cache layout:
//   split:      blocks [num_blocks, kv_dim, num_layers, page_size, num_heads, head_size] of dtype
//               scales [num_blocks, kv_dim, num_layers, page_size, num_heads, head_dim_granularity] f32
//   fp8_ds_mla: blocks [num_blocks, 1, num_layers, page_size, 656] u8 (one record per token), no scales
//   fp8_page_scales: blocks [num_blocks, 1, num_layers, page_size, 132] u8, no scales: page (block,
//               layer) is page_size * 132 bytes, its tokens' 128 e4m3 each, then their f32 scales
struct PagedKVCacheParams {
  DType dtype = DType::bf16;        // bf16 | f16 | f32 | fp8_e4m3
  int num_heads = 1;
  int head_size = 576;
  int page_size = 64;
  bool is_mla = true;               // kv_dim = 1 if true, else 2 (K then V)
  int num_layers = 1;
  int quantization_granularity = 0; // fp8 only: elements sharing one scale (0 = head_size)
  ScaleFmt scale_fmt = ScaleFmt::fp32;
  // split (default) | fp8_ds_mla (dtype fp8_e4m3, num_heads 1, head_size 576, is_mla, granularity
  // 128 (or 0), scale_fmt ue8m0) | fp8_page_scales (dtype fp8_e4m3, num_heads 1, head_size 128,
  // is_mla, granularity 128 (or 0), page_size a multiple of 32). Written to JSON only when not
  // split, so that the JSON, the canonical form, the names and the generated sources of split
  // caches do not mention it.
  CacheLayout layout = CacheLayout::split;

  // fp8_ds_mla record: bytes [0, 512) e4m3 dims 0..511, [512, 528) four f32 scales (one per
  // 128-element tile), [528, 656) 64 bf16 (dims 512..575, not quantized).
  static constexpr int kDsMlaRecordBytes = 656;
  static constexpr int kDsMlaNopeDims = 512;
  static constexpr int kDsMlaRopeDims = 64;
  static constexpr int kDsMlaTile = 128;
  static constexpr int kDsMlaScalesOffset = 512;
  static constexpr int kDsMlaRopeOffset = 528;
  // fp8_page_scales: a token's 128 e4m3 and its f32 scale, stored apart within the page.
  static constexpr int kPageScalesHeadSize = 128;
  static constexpr int kPageScalesTokenBytes = 132;

  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    v("dtype", p.dtype);
    v("num_heads", p.num_heads);
    v("head_size", p.head_size);
    v("page_size", p.page_size);
    v("is_mla", p.is_mla);
    v("num_layers", p.num_layers);
    v("quantization_granularity", p.quantization_granularity);
    v("scale_fmt", p.scale_fmt);
    v("layout", p.layout);
  }
  bool quantized() const { return dtype == DType::fp8_e4m3; }
  bool ds_mla() const { return layout == CacheLayout::fp8_ds_mla; }
  bool page_scales() const { return layout == CacheLayout::fp8_page_scales; }
  // A separate f32 `scales` tensor: fp8 in the split layout.
  bool split_scales() const { return quantized() && layout == CacheLayout::split; }
  // Bytes of one row (one token of one layer and kv index) in `blocks`; fp8_page_scales: the
  // token's share of its page (its 128 e4m3 and its scale, stored apart).
  size_t row_bytes() const {
    return ds_mla()        ? static_cast<size_t>(kDsMlaRecordBytes)
           : page_scales() ? static_cast<size_t>(kPageScalesTokenBytes)
                           : static_cast<size_t>(num_heads) * static_cast<size_t>(head_size) * dtype_size(dtype);
  }
  int kv_dim() const { return is_mla ? 1 : 2; }
  // The elements sharing one scale, 0 resolved to head_size (fp8_ds_mla: 128); and the scales per
  // head (the SPEC name of the scales' last dimension).
  int resolved_quantization_granularity() const {
    return quantization_granularity > 0 ? quantization_granularity : ds_mla() ? kDsMlaTile : head_size;
  }
  int head_dim_granularity() const {
    return (head_size + resolved_quantization_granularity() - 1) / resolved_quantization_granularity();
  }
  void validate(const std::string& field_prefix = "params") const;
};

// kv_cache_store: x[T, num_heads, head_size] (input_dtype) -> cache at each token's logical slot.
struct KvCacheStoreParams {
  PagedKVCacheParams cache;
  DType input_dtype = DType::bf16;  // bf16 | f16 | f32
  int threads = 0;                  // tuning knob: threads per block (0 = auto, else 32..1024, multiple of 32)
  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    PagedKVCacheParams::fields(p.cache, v);
    v("input_dtype", p.input_dtype);
    v("threads", p.threads);
  }
  void validate() const;
};

// kv_cache_gather: dense y[T', num_heads, head_size] (output_dtype) of (batch, position) pairs.
struct KvCacheGatherParams {
  PagedKVCacheParams cache;
  DType output_dtype = DType::bf16;  // bf16 | f32
  int threads = 0;                   // 0 = auto
  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    PagedKVCacheParams::fields(p.cache, v);
    v("output_dtype", p.output_dtype);
    v("threads", p.threads);
  }
  void validate() const;
};

// sparse_index_remap: logical top-k positions -> encoded indices (block * page_size + offset).
struct SparseIndexRemapParams {
  int page_size = 64;
  int threads = 0;                   // 0 = auto
  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    v("page_size", p.page_size);
    v("threads", p.threads);
  }
  void validate() const;
};

// SPEC §2: the lightning indexer (FP8 scores over the paged K cache fused with exact top-k).
struct MlaIndexerParams {
  int num_heads = 64;               // 32 | 64 | 128
  int depth = 128;                  // 128
  int top_k = 2048;                 // 1..4096
  int page_size = 64;
  int quantization_granularity = 128;  // >= depth: one k scale per token
  Mask mask = Mask::causal;
  IndexEmit emit = IndexEmit::logical;
  // The K cache's storage: split (fp8 blocks + f32 scales tensor) | fp8_page_scales (the engines'
  // pages: page_size x 128 e4m3 then the page's f32 scales; page_size a multiple of 32). Written to
  // JSON only when not split.
  CacheLayout k_layout = CacheLayout::split;
  // tuning knobs
  int block_q = 0;                  // query tokens per score tile (0 = heuristic)
  int block_kv = 0;                 // keys per score tile (0 = heuristic)
  int num_stages = 0;               // K-tile pipeline depth (0 = heuristic)
  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    v("num_heads", p.num_heads);
    v("depth", p.depth);
    v("top_k", p.top_k);
    v("page_size", p.page_size);
    v("quantization_granularity", p.quantization_granularity);
    v("mask", p.mask);
    v("emit", p.emit);
    v("k_layout", p.k_layout);
    v("block_q", p.block_q);
    v("block_kv", p.block_kv);
    v("num_stages", p.num_stages);
  }
  void validate() const;
};

// SPEC §3: sparse MLA prefill over top-k encoded indices.
struct SparsePrefillParams {
  DType qkv_dtype = DType::bf16;    // bf16
  DType kv_dtype = DType::bf16;     // bf16 | fp8_e4m3
  int num_q_heads = 128;            // 16..128, multiple of 16
  int qk_depth = 576;
  int v_depth = 512;
  int b_topk = 64;                  // 64: the keys each pipeline step of the kernels processes (fixed)
  int page_size = 64;
  int quantization_granularity = 0; // fp8 only: elements sharing one scale (0 = unit scales, else a divisor of 576)
  // fp8 scales: fp32 = any positive f32; ue8m0 = every scale a power of two (what kv_cache_store
  // writes with scale_fmt ue8m0). A promise about the data: with it, group scales run on the
  // Hopper kernel exactly (K * 2^k is exact in its bf16 tile); without it they take the portable one.
  ScaleFmt scale_fmt = ScaleFmt::fp32;
  bool attn_sink = false;
  bool emit_lse = true;
  DType output_dtype = DType::bf16; // bf16
  QkMath qk_math = QkMath::bf16;    // fp8: opt-in FP8 tensor-core math (fp8 cache, quantization_granularity 0 | 576)
  KvStaging kv_staging = KvStaging::none;  // bf16: stage the selected fp8 rows as bf16 first (kv_dtype fp8_e4m3, qk_math bf16)
  CacheLayout kv_layout = CacheLayout::split;  // fp8_ds_mla: FlashMLA's 656-byte records (kv_dtype fp8_e4m3, granularity 128)
  // No tuning knobs: the launch plan picks the kernel and its geometry from these params and the device.
  // Every field in JSON order: `v("name", field)` per field. One list drives JSON, hashing,
  // equality and knob access (src/core/params.cpp), so a new field is declared once.
  template <class Self, class V>
  static void fields(Self& p, V& v) {
    v("qkv_dtype", p.qkv_dtype);
    v("kv_dtype", p.kv_dtype);
    v("num_q_heads", p.num_q_heads);
    v("qk_depth", p.qk_depth);
    v("v_depth", p.v_depth);
    v("b_topk", p.b_topk);
    v("page_size", p.page_size);
    v("quantization_granularity", p.quantization_granularity);
    v("scale_fmt", p.scale_fmt);
    v("attn_sink", p.attn_sink);
    v("emit_lse", p.emit_lse);
    v("output_dtype", p.output_dtype);
    v("qk_math", p.qk_math);
    v("kv_staging", p.kv_staging);
    v("kv_layout", p.kv_layout);
  }
  void validate() const;
  // Scales of a row in the `scales` tensor (split layout); fp8_ds_mla rows hold theirs in the record.
  int scales_per_token() const {
    if (kv_layout == CacheLayout::fp8_ds_mla) return 0;
    return quantization_granularity > 0 ? (qk_depth + quantization_granularity - 1) / quantization_granularity : 0;
  }
  // Bytes of one latent cache row: 576 elements of kv_dtype, or a 656-byte fp8_ds_mla record.
  int row_bytes() const;
};

// The op list: one line per op, (JSON name, params struct). The Op enum, the OpParams variant and
// the op names are generated from it; everything else an op needs (knobs, shapes, codegen, launch,
// tuning workload) is its definition in src/ops/<family>/ and one line of src/ops/registry.cpp.
#define MLAJIT_FOR_EACH_OP(X)                   \
  X(kv_cache_store, KvCacheStoreParams)         \
  X(kv_cache_gather, KvCacheGatherParams)       \
  X(sparse_index_remap, SparseIndexRemapParams) \
  X(mla_indexer, MlaIndexerParams)              \
  X(sparse_prefill, SparsePrefillParams)

#define MLAJIT_OP_ENUM_(name, P) name,
enum class Op { MLAJIT_FOR_EACH_OP(MLAJIT_OP_ENUM_) };
#undef MLAJIT_OP_ENUM_
#define MLAJIT_OP_COUNT_(name, P) +1
inline constexpr int kNumOps = 0 MLAJIT_FOR_EACH_OP(MLAJIT_OP_COUNT_);
#undef MLAJIT_OP_COUNT_
std::string_view op_name(Op op);
Op parse_op(std::string_view name, const std::string& field = "op");

namespace detail {
#define MLAJIT_OP_TYPE_(name, P) , P
template <class Ignored, class... P>
using OpVariantOf = std::variant<P...>;
}  // namespace detail
// One alternative per op, in op-list order (variant index == Op value).
using OpParams = detail::OpVariantOf<void MLAJIT_FOR_EACH_OP(MLAJIT_OP_TYPE_)>;
#undef MLAJIT_OP_TYPE_

// One kernel of a config: an op and its params.
struct KernelSpec {
  OpParams params;
  Op op() const;
  void validate() const;
  // "op {sorted params json}": equal specs give equal strings, different specs different strings.
  std::string canonical() const;
  // Readable name: params, then "_<tag><value>" per knob set, e.g. "sparse_index_remap_p64_thr256".
  std::string name() const;
  // Structural hash and equality over the op and every params field, built from the same field
  // lists as the JSON; no strings are formed (the runtime's memory-cache hot path uses them).
  size_t hash() const;
  bool operator==(const KernelSpec& o) const;
  bool operator!=(const KernelSpec& o) const { return !(*this == o); }
};

// Auto knobs (0) replaced by the built-in heuristics (kv ops: threads 128, 128, 256). The indexer
// and prefill resolve their own auto knobs inside their tiling plans. Ops first consult the tuning
// database (autotune.hpp) and fall back to this; codegen applies it to whatever it is given.
OpParams with_heuristic_knobs(const OpParams& p);

// JSON. from_json validates and rejects unknown fields; errors name the JSON path.
nlohmann::json to_json(const KernelSpec& spec);  // {"op": ..., "params": {...}}
KernelSpec kernel_spec_from_json(const nlohmann::json& j, const std::string& path = "kernel");
nlohmann::json params_to_json(const OpParams& p);
OpParams params_from_json(Op op, const nlohmann::json& j, const std::string& path = "params");

}  // namespace mlajit
