// Validation, JSON round trip and canonical form of the op parameter structs.
#include "mlajit/params.hpp"

#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "core/param_checks.hpp"
#include "core/renamed_keys.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"

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
struct EnumNames<CacheLayout> {
  static constexpr std::pair<CacheLayout, const char*> v[] = {{CacheLayout::split, "split"},
                                                              {CacheLayout::fp8_ds_mla, "fp8_ds_mla"},
                                                              {CacheLayout::fp8_page_scales, "fp8_page_scales"}};
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
template <>
struct EnumNames<QkMath> {
  static constexpr std::pair<QkMath, const char*> v[] = {{QkMath::bf16, "bf16"}, {QkMath::fp8, "fp8"}};
};
template <>
struct EnumNames<KvStaging> {
  static constexpr std::pair<KvStaging, const char*> v[] = {{KvStaging::none, "none"}, {KvStaging::bf16, "bf16"}};
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
  throw_invalid(path, json_quoted(s), enum_choices<E>());
}

// ---- field visitors: one list of fields per struct drives both JSON directions -----------------
struct JsonWriter {
  json& out;
  void operator()(const char* name, const int& v) { out[name] = v; }
  void operator()(const char* name, const bool& v) { out[name] = v; }
  void operator()(const char* name, const DType& v) { out[name] = std::string(dtype_name(v)); }
  template <typename E>
  void operator()(const char* name, const E& v) { out[name] = enum_name(v); }
  // The cache layout is written only when it is not the default (split): the JSON, canonical form,
  // tuning keys and generated sources of split caches stay as they are without the field.
  void operator()(const char* name, const CacheLayout& v) {
    if (v != CacheLayout::split) out[name] = enum_name(v);
  }
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
      constexpr const char* kRange = "an integer in [-2147483648, 2147483647]";
      if (!j->is_number_integer()) throw_invalid(at(name), json_excerpt(*j), kRange);
      // An unsigned value is compared as unsigned: 9223372036854775808 is not a negative number.
      // The value is quoted as written (dump() of a number does not recurse).
      if (j->is_number_unsigned() ? j->get<unsigned long long>() > 2147483647ull
                                  : (j->get<long long>() < -(1LL << 31) || j->get<long long>() >= (1LL << 31)))
        throw_invalid(at(name), j->dump(), kRange);
      v = static_cast<int>(j->get<long long>());
    }
  }
  void operator()(const char* name, bool& v) {
    if (auto* j = get(name)) {
      if (!j->is_boolean()) throw_invalid(at(name), json_excerpt(*j), "true or false");
      v = j->get<bool>();
    }
  }
  void operator()(const char* name, DType& v) {
    if (auto* j = get(name)) {
      if (!j->is_string()) throw_invalid(at(name), json_excerpt(*j), "a dtype name string");
      v = parse_dtype(j->get<std::string>(), at(name));
    }
  }
  template <typename E>
  void operator()(const char* name, E& v) {
    if (auto* j = get(name)) {
      if (!j->is_string()) throw_invalid(at(name), json_excerpt(*j), "one of " + enum_choices<E>());
      v = parse_enum<E>(j->get<std::string>(), at(name));
    }
  }
  void reject_unknown() const {
    for (auto it = in.begin(); it != in.end(); ++it)
      if (!seen.count(it.key()))
        throw_invalid(path, fmt::format("unknown field {}", json_quoted(it.key())),
                      fmt::format("only the fields of this op ({}){}", known(), renamed_key_hint(it.key())));
  }
  std::string known() const {
    std::string s;
    for (auto& k : seen) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
};

// Every field of any op's params, through the struct's fields() list.
template <typename V>
void visit_any(OpParams& p, V& v) {
  std::visit([&](auto& x) { std::decay_t<decltype(x)>::fields(x, v); }, p);
}

#define MLAJIT_OP_NAME_(name, P) {Op::name, #name},
constexpr std::pair<Op, const char*> kOpNames[] = {MLAJIT_FOR_EACH_OP(MLAJIT_OP_NAME_)};
#undef MLAJIT_OP_NAME_

std::string op_choices() {
  std::string s;
  for (auto& [k, n] : kOpNames) s += (s.empty() ? "" : " | ") + std::string(n);
  return s;
}

}  // namespace

// ---- shared checks (src/core/param_checks.hpp) --------------------------------------------------
bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

void check_threads(int threads, const std::string& field) {
  MLAJIT_EXPECT(threads == 0 || (threads >= 32 && threads <= 1024 && threads % 32 == 0), field, threads,
                "0 (auto) or a multiple of 32 in [32, 1024]");
}

void check_page_size(int page_size, const std::string& field) {
  MLAJIT_EXPECT(is_pow2(page_size) && page_size <= 4096, field, page_size, "a power of two in [1, 4096]");
}

const char* scale_fmt_name(ScaleFmt f) { return enum_name(f); }
const char* cache_layout_name(CacheLayout l) { return enum_name(l); }
const char* mask_name(Mask m) { return enum_name(m); }
const char* emit_name(IndexEmit e) { return enum_name(e); }
QkMath parse_qk_math(const std::string& name, const std::string& field) { return parse_enum<QkMath>(name, field); }
KvStaging parse_kv_staging(const std::string& name, const std::string& field) {
  return parse_enum<KvStaging>(name, field);
}
ScaleFmt parse_scale_fmt(const std::string& name, const std::string& field) { return parse_enum<ScaleFmt>(name, field); }
CacheLayout parse_cache_layout(const std::string& name, const std::string& field) {
  return parse_enum<CacheLayout>(name, field);
}

// ---- validation ---------------------------------------------------------------------------------
void PagedKVCacheParams::validate(const std::string& p) const {
  MLAJIT_EXPECT(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32 || dtype == DType::fp8_e4m3,
                p + ".dtype", dtype_name(dtype), "bf16 | f16 | f32 | fp8_e4m3");
  if (ds_mla()) {
    // FlashMLA's V3.2 fp8 latent record (SPEC §1): its geometry and quantizer are fixed.
    constexpr const char* kWhy = " (layout fp8_ds_mla)";
    MLAJIT_EXPECT(dtype == DType::fp8_e4m3, p + ".dtype", dtype_name(dtype), std::string("fp8_e4m3") + kWhy);
    MLAJIT_EXPECT(num_heads == 1, p + ".num_heads", num_heads, std::string("1") + kWhy);
    MLAJIT_EXPECT(head_size == 576, p + ".head_size", head_size, std::string("576") + kWhy);
    MLAJIT_EXPECT(is_mla, p + ".is_mla", "false", std::string("true") + kWhy);
    MLAJIT_EXPECT(quantization_granularity == 0 || quantization_granularity == kDsMlaTile,
                  p + ".quantization_granularity", quantization_granularity,
                  std::string("128 or 0 (= 128: one scale per 128-element tile)") + kWhy);
    MLAJIT_EXPECT(scale_fmt == ScaleFmt::ue8m0, p + ".scale_fmt", enum_name(scale_fmt),
                  std::string("ue8m0 (FlashMLA's power-of-two tile scales)") + kWhy);
  }
  if (page_scales()) {
    // The engines' indexer K pages (SPEC §1): 128 e4m3 per token, one f32 scale per token.
    constexpr const char* kWhy = " (layout fp8_page_scales)";
    MLAJIT_EXPECT(dtype == DType::fp8_e4m3, p + ".dtype", dtype_name(dtype), std::string("fp8_e4m3") + kWhy);
    MLAJIT_EXPECT(num_heads == 1, p + ".num_heads", num_heads, std::string("1") + kWhy);
    MLAJIT_EXPECT(head_size == kPageScalesHeadSize, p + ".head_size", head_size, std::string("128") + kWhy);
    MLAJIT_EXPECT(is_mla, p + ".is_mla", "false", std::string("true") + kWhy);
    MLAJIT_EXPECT(quantization_granularity == 0 || quantization_granularity == kPageScalesHeadSize,
                  p + ".quantization_granularity", quantization_granularity,
                  std::string("128 or 0 (one f32 scale per token)") + kWhy);
    MLAJIT_EXPECT(page_size % 32 == 0, p + ".page_size", page_size,
                  std::string("a multiple of 32 (a page of 132-byte tokens is then whole 128-byte rows)") + kWhy);
  }
  MLAJIT_EXPECT(num_heads >= 1 && num_heads <= 1024, p + ".num_heads", num_heads, "an integer in [1, 1024]");
  MLAJIT_EXPECT(head_size >= 1 && head_size <= 4096, p + ".head_size", head_size, "an integer in [1, 4096]");
  check_page_size(page_size, p + ".page_size");
  MLAJIT_EXPECT(num_layers >= 1 && num_layers <= 1024, p + ".num_layers", num_layers, "an integer in [1, 1024]");
  if (quantized()) {
    MLAJIT_EXPECT(quantization_granularity >= 0 && quantization_granularity <= head_size,
                  p + ".quantization_granularity", quantization_granularity,
                  fmt::format("an integer in [1, head_size={}] (0 = head_size)", head_size));
    const int g = resolved_quantization_granularity();
    MLAJIT_EXPECT(g % 4 == 0 || g == head_size, p + ".quantization_granularity", quantization_granularity,
                  "a multiple of 4 or the head size");
  } else {
    MLAJIT_EXPECT(quantization_granularity == 0, p + ".quantization_granularity", quantization_granularity,
                  "0 (scales exist only for dtype fp8_e4m3)");
    MLAJIT_EXPECT(scale_fmt == ScaleFmt::fp32, p + ".scale_fmt", enum_name(scale_fmt),
                  "fp32 (scales exist only for dtype fp8_e4m3)");
  }
}

OpParams with_heuristic_knobs(const OpParams& params) {
  OpParams p = params;
  const auto& knobs = ops::definition(static_cast<Op>(p.index())).knobs;
  for (size_t k = 0; k < knobs.size(); ++k)
    if (knobs[k].has_auto && knobs[k].heuristic != 0 && ops::knob_at(p, k) == 0) ops::knob_at(p, k) = knobs[k].heuristic;
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
  throw_invalid(field, json_quoted(name), op_choices());
}

Op KernelSpec::op() const { return static_cast<Op>(params.index()); }

void KernelSpec::validate() const {
  std::visit([](const auto& p) { p.validate(); }, params);
}

namespace {
template <size_t... I>
bool emplace_alternative(OpParams& p, size_t index, std::index_sequence<I...>) {
  return ((I == index ? (p.emplace<I>(), true) : false) || ...);
}
}  // namespace

OpParams default_params(Op op) {
  OpParams p;
  // The variant alternative whose index is `op`, default-constructed (no per-op code).
  if (!emplace_alternative(p, static_cast<size_t>(op), std::make_index_sequence<std::variant_size_v<OpParams>>{}))
    throw_error(ErrorKind::Internal, "default_params: no op with index {}", static_cast<int>(op));
  return p;
}

json params_to_json(const OpParams& p) {
  json out = json::object();
  JsonWriter w{out};
  visit_any(const_cast<OpParams&>(p), w);
  return out;
}

OpParams params_from_json(Op op, const json& j, const std::string& path) {
  if (!j.is_object()) throw_invalid(path, json_excerpt(j), "a JSON object of params");
  OpParams p = default_params(op);
  JsonReader r{j, path, {}};
  visit_any(p, r);
  r.reject_unknown();
  return p;
}

json to_json(const KernelSpec& spec) {
  return json{{"op", std::string(op_name(spec.op()))}, {"params", params_to_json(spec.params)}};
}

KernelSpec kernel_spec_from_json(const json& j, const std::string& path) {
  check_json_depth(j, path);  // a value built by the caller: no walk below recurses deeper than the limit
  if (!j.is_object()) throw_invalid(path, json_excerpt(j), "an object {\"op\": ..., \"params\": {...}}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "op" && it.key() != "params")
      throw_invalid(path, fmt::format("unknown field {}", json_quoted(it.key())), "only \"op\" and \"params\"");
  auto op_it = j.find("op");
  if (op_it == j.end() || !op_it->is_string())
    throw_invalid(path + ".op", op_it == j.end() ? std::string("nothing") : json_excerpt(*op_it), "an op name string");
  Op op = parse_op(op_it->get<std::string>(), path + ".op");
  auto p_it = j.find("params");
  static const json kNoParams = json::object();
  KernelSpec spec{params_from_json(op, p_it == j.end() ? kNoParams : *p_it, path + ".params")};
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
  const auto& d = ops::definition(op());
  std::string s = d.kernel_name(params);
  // Every knob changes the generated code, so every knob the spec sets is in the name (in knob
  // table order); one left at auto (0) is left out: the generator resolves it from the other params.
  for (size_t k = 0; k < d.knobs.size(); ++k)
    if (const int v = ops::knob_at(params, k)) s += fmt::format("_{}{}", d.knobs[k].tag, v);
  return s;
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
