// Validation, JSON round trip and canonical form of the op parameter structs.
#include "mlajit/params.hpp"

#include <set>

#include <nlohmann/json.hpp>

#include "mlajit/error.hpp"

namespace mlajit {

using nlohmann::json;

namespace {

// ---- enum names -------------------------------------------------------------------------------
template <typename E>
struct EnumNames;
template <>
struct EnumNames<ScaleFmt> {
  static constexpr std::pair<ScaleFmt, const char*> v[] = {{ScaleFmt::fp32, "fp32"}, {ScaleFmt::ue8m0, "ue8m0"}};
};
template <>
struct EnumNames<Mask> {
  static constexpr std::pair<Mask, const char*> v[] = {{Mask::none, "none"}, {Mask::causal, "causal"}};
};
template <>
struct EnumNames<IndexEmit> {
  static constexpr std::pair<IndexEmit, const char*> v[] = {{IndexEmit::logical, "logical"},
                                                            {IndexEmit::physical, "physical"}};
};

template <typename E>
const char* enum_name(E e) {
  for (auto& [k, n] : EnumNames<E>::v)
    if (k == e) return n;
  return "?";
}

template <typename E>
std::string enum_choices() {
  std::string s;
  for (auto& [k, n] : EnumNames<E>::v) s += (s.empty() ? "" : " | ") + std::string(n);
  return s;
}

template <typename E>
E parse_enum(const std::string& s, const std::string& path) {
  for (auto& [k, n] : EnumNames<E>::v)
    if (s == n) return k;
  throw_invalid(path, fmt::format("\"{}\"", s), enum_choices<E>());
}

// ---- field visitors: one list of fields per struct drives both JSON directions -----------------
struct JsonWriter {
  json& out;
  void operator()(const char* name, const int& v) { out[name] = v; }
  void operator()(const char* name, const bool& v) { out[name] = v; }
  void operator()(const char* name, const DType& v) { out[name] = std::string(dtype_name(v)); }
  template <typename E>
  void operator()(const char* name, const E& v) { out[name] = enum_name(v); }
};

struct JsonReader {
  const json& in;
  std::string path;
  std::set<std::string> seen;

  const json* get(const char* name) {
    seen.insert(name);
    auto it = in.find(name);
    return it == in.end() ? nullptr : &*it;
  }
  std::string at(const char* name) const { return path + "." + name; }

  void operator()(const char* name, int& v) {
    if (auto* j = get(name)) {
      if (!j->is_number_integer()) throw_invalid(at(name), j->dump(), "an integer");
      auto x = j->get<long long>();
      if (x < -(1LL << 31) || x >= (1LL << 31)) throw_invalid(at(name), x, "a 32-bit integer");
      v = static_cast<int>(x);
    }
  }
  void operator()(const char* name, bool& v) {
    if (auto* j = get(name)) {
      if (!j->is_boolean()) throw_invalid(at(name), j->dump(), "true or false");
      v = j->get<bool>();
    }
  }
  void operator()(const char* name, DType& v) {
    if (auto* j = get(name)) {
      if (!j->is_string()) throw_invalid(at(name), j->dump(), "a dtype name string");
      v = parse_dtype(j->get<std::string>(), at(name));
    }
  }
  template <typename E>
  void operator()(const char* name, E& v) {
    if (auto* j = get(name)) {
      if (!j->is_string()) throw_invalid(at(name), j->dump(), "one of " + enum_choices<E>());
      v = parse_enum<E>(j->get<std::string>(), at(name));
    }
  }
  void reject_unknown() const {
    for (auto it = in.begin(); it != in.end(); ++it)
      if (!seen.count(it.key()))
        throw_invalid(path, fmt::format("unknown field \"{}\"", it.key()),
                      fmt::format("only the fields of this op ({})", known()));
  }
  std::string known() const {
    std::string s;
    for (auto& k : seen) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
};

// Cache fields are flattened into the op's params object.
template <typename V, typename C>
void visit_cache(C& c, V& v) {
  v("dtype", c.dtype);
  v("num_heads", c.num_heads);
  v("head_size", c.head_size);
  v("page_size", c.page_size);
  v("is_mla", c.is_mla);
  v("num_layers", c.num_layers);
  v("quantization_granularity", c.quantization_granularity);
  v("scale_fmt", c.scale_fmt);
}

template <typename V, typename P>
void visit(P& p, V& v);

template <typename V>
void visit_store(KvCacheStoreParams& p, V& v) {
  visit_cache(p.cache, v);
  v("input_dtype", p.input_dtype);
  v("threads", p.threads);
}
template <typename V>
void visit_gather(KvCacheGatherParams& p, V& v) {
  visit_cache(p.cache, v);
  v("output_dtype", p.output_dtype);
  v("threads", p.threads);
}
template <typename V>
void visit_remap(SparseIndexRemapParams& p, V& v) {
  v("page_size", p.page_size);
  v("threads", p.threads);
}
template <typename V>
void visit_indexer(MlaIndexerParams& p, V& v) {
  v("num_heads", p.num_heads);
  v("depth", p.depth);
  v("top_k", p.top_k);
  v("page_size", p.page_size);
  v("quantization_granularity", p.quantization_granularity);
  v("mask", p.mask);
  v("emit", p.emit);
  v("block_q", p.block_q);
  v("block_kv", p.block_kv);
  v("num_stages", p.num_stages);
}
template <typename V>
void visit_prefill(SparsePrefillParams& p, V& v) {
  v("qkv_dtype", p.qkv_dtype);
  v("kv_dtype", p.kv_dtype);
  v("num_q_heads", p.num_q_heads);
  v("qk_depth", p.qk_depth);
  v("v_depth", p.v_depth);
  v("b_topk", p.b_topk);
  v("page_size", p.page_size);
  v("scale_block_size", p.scale_block_size);
  v("attn_sink", p.attn_sink);
  v("emit_lse", p.emit_lse);
  v("output_dtype", p.output_dtype);
  v("num_stages", p.num_stages);
}

template <typename V>
void visit_any(OpParams& p, V& v) {
  std::visit(
      [&](auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, KvCacheStoreParams>) visit_store(x, v);
        else if constexpr (std::is_same_v<T, KvCacheGatherParams>) visit_gather(x, v);
        else if constexpr (std::is_same_v<T, SparseIndexRemapParams>) visit_remap(x, v);
        else if constexpr (std::is_same_v<T, MlaIndexerParams>) visit_indexer(x, v);
        else visit_prefill(x, v);
      },
      p);
}

bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

void check_threads(int threads, const std::string& field) {
  MLAJIT_EXPECT(threads == 0 || (threads >= 32 && threads <= 1024 && threads % 32 == 0), field, threads,
                "0 (auto) or a multiple of 32 in [32, 1024]");
}

void check_page_size(int page_size, const std::string& field) {
  MLAJIT_EXPECT(is_pow2(page_size) && page_size <= 4096, field, page_size, "a power of two in [1, 4096]");
}

constexpr std::pair<Op, const char*> kOpNames[] = {
    {Op::kv_cache_store, "kv_cache_store"},
    {Op::kv_cache_gather, "kv_cache_gather"},
    {Op::sparse_index_remap, "sparse_index_remap"},
    {Op::mla_indexer, "mla_indexer"},
    {Op::sparse_prefill, "sparse_prefill"},
};

}  // namespace

// ---- validation ---------------------------------------------------------------------------------
void PagedKVCacheParams::validate(const std::string& p) const {
  MLAJIT_EXPECT(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32 || dtype == DType::fp8_e4m3,
                p + ".dtype", dtype_name(dtype), "bf16 | f16 | f32 | fp8_e4m3");
  MLAJIT_EXPECT(num_heads >= 1 && num_heads <= 1024, p + ".num_heads", num_heads, "an integer in [1, 1024]");
  MLAJIT_EXPECT(head_size >= 1 && head_size <= 4096, p + ".head_size", head_size, "an integer in [1, 4096]");
  check_page_size(page_size, p + ".page_size");
  MLAJIT_EXPECT(num_layers >= 1 && num_layers <= 1024, p + ".num_layers", num_layers, "an integer in [1, 1024]");
  if (quantized()) {
    MLAJIT_EXPECT(quantization_granularity >= 0 && quantization_granularity <= head_size,
                  p + ".quantization_granularity", quantization_granularity,
                  fmt::format("an integer in [1, head_size={}] (0 = head_size)", head_size));
    MLAJIT_EXPECT(granularity() % 4 == 0 || granularity() == head_size, p + ".quantization_granularity",
                  quantization_granularity, "a multiple of 4 or the head size");
  } else {
    MLAJIT_EXPECT(quantization_granularity == 0, p + ".quantization_granularity", quantization_granularity,
                  "0 (scales exist only for dtype fp8_e4m3)");
    MLAJIT_EXPECT(scale_fmt == ScaleFmt::fp32, p + ".scale_fmt", enum_name(scale_fmt),
                  "fp32 (scales exist only for dtype fp8_e4m3)");
  }
}

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
}

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
  MLAJIT_EXPECT(num_stages >= 0 && num_stages <= 4, "params.num_stages", num_stages, "0 (heuristic) or 1..4");
}

OpParams with_heuristic_knobs(const OpParams& params) {
  OpParams p = params;
  std::visit(
      [](auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, KvCacheStoreParams> || std::is_same_v<T, KvCacheGatherParams>) {
          if (x.threads == 0) x.threads = 128;
        } else if constexpr (std::is_same_v<T, SparseIndexRemapParams>) {
          if (x.threads == 0) x.threads = 256;
        }
      },
      p);
  return p;
}

// ---- ops and specs ------------------------------------------------------------------------------
std::string_view op_name(Op op) {
  for (auto& [k, n] : kOpNames)
    if (k == op) return n;
  return "?";
}

Op parse_op(std::string_view name, const std::string& field) {
  for (auto& [k, n] : kOpNames)
    if (name == n) return k;
  throw_invalid(field, fmt::format("\"{}\"", name),
                "kv_cache_store | kv_cache_gather | sparse_index_remap | mla_indexer | sparse_prefill");
}

Op KernelSpec::op() const { return static_cast<Op>(params.index()); }

void KernelSpec::validate() const {
  std::visit([](const auto& p) { p.validate(); }, params);
}

json params_to_json(const OpParams& p) {
  json out = json::object();
  JsonWriter w{out};
  visit_any(const_cast<OpParams&>(p), w);
  return out;
}

OpParams params_from_json(Op op, const json& j, const std::string& path) {
  if (!j.is_object()) throw_invalid(path, j.dump(), "a JSON object of params");
  OpParams p;
  switch (op) {
    case Op::kv_cache_store: p = KvCacheStoreParams{}; break;
    case Op::kv_cache_gather: p = KvCacheGatherParams{}; break;
    case Op::sparse_index_remap: p = SparseIndexRemapParams{}; break;
    case Op::mla_indexer: p = MlaIndexerParams{}; break;
    case Op::sparse_prefill: p = SparsePrefillParams{}; break;
  }
  JsonReader r{j, path, {}};
  visit_any(p, r);
  r.reject_unknown();
  return p;
}

json to_json(const KernelSpec& spec) {
  return json{{"op", std::string(op_name(spec.op()))}, {"params", params_to_json(spec.params)}};
}

KernelSpec kernel_spec_from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw_invalid(path, j.dump(), "an object {\"op\": ..., \"params\": {...}}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "op" && it.key() != "params")
      throw_invalid(path, fmt::format("unknown field \"{}\"", it.key()), "only \"op\" and \"params\"");
  auto op_it = j.find("op");
  if (op_it == j.end() || !op_it->is_string()) throw_invalid(path + ".op", j.dump(), "an op name string");
  Op op = parse_op(op_it->get<std::string>(), path + ".op");
  auto p_it = j.find("params");
  KernelSpec spec{params_from_json(op, p_it == j.end() ? json::object() : *p_it, path + ".params")};
  try {
    spec.validate();
  } catch (const Error& e) {
    // Re-anchor "params.x" messages at the JSON path of this kernel.
    std::string msg = e.what();
    if (msg.rfind("params.", 0) == 0) msg = path + "." + msg;
    throw Error(e.kind(), msg);
  }
  return spec;
}

std::string KernelSpec::canonical() const {
  // nlohmann::json objects keep keys sorted, so dump() is canonical.
  return std::string(op_name(op())) + " " + params_to_json(params).dump();
}

std::string KernelSpec::name() const {
  const std::string op(op_name(this->op()));
  return std::visit(
      [&](const auto& p) -> std::string {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, KvCacheStoreParams> || std::is_same_v<T, KvCacheGatherParams>) {
          const auto& c = p.cache;
          std::string s = fmt::format("{}_{}_{}_h{}_d{}_p{}", op, c.is_mla ? "mla" : "mha", dtype_name(c.dtype),
                                      c.num_heads, c.head_size, c.page_size);
          if (c.quantized()) s += fmt::format("_g{}_{}", c.granularity(), enum_name(c.scale_fmt));
          return s;
        } else if constexpr (std::is_same_v<T, SparseIndexRemapParams>) {
          return fmt::format("{}_p{}", op, p.page_size);
        } else if constexpr (std::is_same_v<T, MlaIndexerParams>) {
          return fmt::format("{}_h{}_d{}_k{}_p{}_{}_{}", op, p.num_heads, p.depth, p.top_k, p.page_size,
                             enum_name(p.mask), enum_name(p.emit));
        } else {
          std::string s = fmt::format("{}_{}_h{}_t{}_p{}", op, dtype_name(p.kv_dtype), p.num_q_heads, p.b_topk,
                                      p.page_size);
          if (p.kv_dtype == DType::fp8_e4m3) s += fmt::format("_sb{}", p.scale_block_size);
          if (p.attn_sink) s += "_sink";
          return s;
        }
      },
      params);
}

// ---- structural hash / equality (infra: runtime memory cache) -----------------------------------
namespace {

// Flattens every field of a params struct into integers, in the order of the field lists above.
struct FieldFlattener {
  static constexpr int kMax = 32;
  int64_t v[kMax];
  int n = 0;
  void push(int64_t x) {
    if (n < kMax) v[n] = x;
    ++n;  // an overflow is caught below: the field lists are far shorter than kMax
  }
  void operator()(const char*, const int& x) { push(x); }
  void operator()(const char*, const bool& x) { push(x ? 1 : 0); }
  template <typename E>
  void operator()(const char*, const E& x) { push(static_cast<int64_t>(x)); }
};

FieldFlattener flatten(const OpParams& p) {
  FieldFlattener f;
  visit_any(const_cast<OpParams&>(p), f);
  if (f.n > FieldFlattener::kMax) throw Error(ErrorKind::Internal, "params struct has more fields than FieldFlattener::kMax");
  return f;
}

}  // namespace

size_t KernelSpec::hash() const {
  FieldFlattener f = flatten(params);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(params.index());
  for (int i = 0; i < f.n; ++i) {
    h ^= static_cast<uint64_t>(f.v[i]) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xFF51AFD7ED558CCDull;
  }
  return static_cast<size_t>(h ^ (h >> 29));
}

bool KernelSpec::operator==(const KernelSpec& o) const {
  if (params.index() != o.params.index()) return false;
  FieldFlattener a = flatten(params), b = flatten(o.params);
  if (a.n != b.n) return false;
  for (int i = 0; i < a.n; ++i)
    if (a.v[i] != b.v[i]) return false;
  return true;
}

}  // namespace mlajit
