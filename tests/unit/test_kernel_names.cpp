// Kernel names tell variants apart: every knob a spec sets is in its name, and any two specs whose
// generated code differs get different names (names key the dumps, `mlajit cache ls`, logs, and
// the tune report). Both checks iterate the registry, so a new op or knob is covered unasked.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "core/param_checks.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"

using namespace mlajit;

namespace {

// The code a generator emits, without the header comment (which quotes the params and the name,
// so it always differs): what actually gets compiled.
std::string code_body(const KernelSource& src) {
  const std::string header = source_header(src.spec);
  return src.code.compare(0, header.size(), header) == 0 ? src.code.substr(header.size()) : src.code;
}

bool generates(const KernelSpec& spec) {
  try {
    spec.validate();
    generate(spec);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The specs every op's fields are varied around: its defaults, and for the kv family a quantized
// cache (fp8 scales make the quantization granularity and scale format matter).
std::vector<OpParams> bases(Op op) {
  std::vector<OpParams> out{default_params(op)};
  auto quantized = [](PagedKVCacheParams& c) {
    c.dtype = DType::fp8_e4m3;
    c.num_heads = 1;
    c.head_size = 656;
    c.quantization_granularity = 128;
    c.scale_fmt = ScaleFmt::ue8m0;
  };
  // FlashMLA's record layout's geometry, split (varying `layout` reaches fp8_ds_mla) and fp8_ds_mla.
  auto ds_mla = [](PagedKVCacheParams& c, CacheLayout layout) {
    c.dtype = DType::fp8_e4m3;
    c.num_heads = 1;
    c.head_size = 576;
    c.quantization_granularity = 128;
    c.scale_fmt = ScaleFmt::ue8m0;
    c.layout = layout;
  };
  if (op == Op::kv_cache_store) {
    quantized(std::get<KvCacheStoreParams>(out.emplace_back(out[0])).cache);
    ds_mla(std::get<KvCacheStoreParams>(out.emplace_back(out[0])).cache, CacheLayout::split);
    ds_mla(std::get<KvCacheStoreParams>(out.emplace_back(out[0])).cache, CacheLayout::fp8_ds_mla);
  }
  if (op == Op::kv_cache_gather) {
    quantized(std::get<KvCacheGatherParams>(out.emplace_back(out[0])).cache);
    ds_mla(std::get<KvCacheGatherParams>(out.emplace_back(out[0])).cache, CacheLayout::split);
    ds_mla(std::get<KvCacheGatherParams>(out.emplace_back(out[0])).cache, CacheLayout::fp8_ds_mla);
  }
  if (op == Op::sparse_prefill) {
    auto& p = std::get<SparsePrefillParams>(out.emplace_back(out[0]));
    p.kv_dtype = DType::fp8_e4m3;
    p.quantization_granularity = 64;
    // Per-row scales, with 16-bit and with FP8 math: qk_math is only valid on such a cache, so it
    // is varied (and its fields are varied around it) from these two.
    SparsePrefillParams row = std::get<SparsePrefillParams>(out[0]);
    row.kv_dtype = DType::fp8_e4m3;
    row.quantization_granularity = 576;
    out.emplace_back(row);
    row.qk_math = QkMath::fp8;
    out.emplace_back(row);
  }
  return out;
}

// Writes candidate value `choice` into field number `target` of a params struct (fields() order);
// `done` says whether that field had a candidate with that number.
struct FieldVariant {
  int target, choice;
  int pos = 0;
  bool done = false;
  std::string field;
  template <class T>
  void set(const char* name, T& field_ref, const std::vector<T>& candidates) {
    if (pos++ != target) return;
    field = name;
    if (choice < static_cast<int>(candidates.size())) {
      field_ref = candidates[choice];
      done = true;
    }
  }
  void operator()(const char* name, int& v) {
    set<int>(name, v, {0, 1, 2, 3, 4, 8, 16, 32, 64, 96, 128, 256, 512, 576, 656, 1024, 2048, 4096, v + 1, 2 * v});
  }
  void operator()(const char* name, bool& v) { set<bool>(name, v, {false, true}); }
  void operator()(const char* name, DType& v) {
    set<DType>(name, v, {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::u32, DType::i32, DType::u8});
  }
  void operator()(const char* name, ScaleFmt& v) { set<ScaleFmt>(name, v, {ScaleFmt::fp32, ScaleFmt::ue8m0}); }
  void operator()(const char* name, CacheLayout& v) {
    set<CacheLayout>(name, v, {CacheLayout::split, CacheLayout::fp8_ds_mla});
  }
  void operator()(const char* name, Mask& v) { set<Mask>(name, v, {Mask::none, Mask::causal}); }
  void operator()(const char* name, IndexEmit& v) { set<IndexEmit>(name, v, {IndexEmit::logical, IndexEmit::physical}); }
  void operator()(const char* name, QkMath& v) { set<QkMath>(name, v, {QkMath::bf16, QkMath::fp8}); }
  void operator()(const char* name, KvStaging& v) { set<KvStaging>(name, v, {KvStaging::none, KvStaging::bf16}); }
};

int field_count(OpParams p) {
  FieldVariant f{-1, 0};
  std::visit([&](auto& x) { std::decay_t<decltype(x)>::fields(x, f); }, p);
  return f.pos;
}

}  // namespace

TEST_CASE("kernel names: two variants differing in one knob never share a name") {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const auto& d = ops::definition(op);
    for (size_t ki = 0; ki < d.knobs.size(); ++ki) {
      const auto& knob = d.knobs[ki];
      for (const OpParams& base : bases(op)) {
        // Every explicit value the op accepts for this knob: its sweep space, its heuristic, and
        // whatever else validates (the knobs a sweep does not try can still be pinned).
        std::set<int> values(knob.space.begin(), knob.space.end());
        if (knob.heuristic) values.insert(knob.heuristic);
        for (int v : {1, 2, 3, 4, 6, 8, 16, 32, 64, 96, 128, 256, 512, 1024}) values.insert(v);
        std::vector<std::pair<int, std::string>> named;  // (value, generated kernel name)
        for (int v : values) {
          OpParams p = base;
          ops::knob_at(p, ki) = v;
          const KernelSpec spec{p};
          if (!generates(spec)) continue;
          CHECK_MESSAGE(spec.name().find(std::string("_") + knob.tag + std::to_string(v)) != std::string::npos,
                        spec.name(), " does not show ", knob.name, "=", v);
          named.emplace_back(v, generate(spec).name);
        }
        INFO(op_name(op), ".", knob.name);
        CHECK_MESSAGE(named.size() >= (knob.space.size() > 1 ? knob.space.size() : 1), "legal values found: ", named.size());
        for (size_t a = 0; a < named.size(); ++a)
          for (size_t b = a + 1; b < named.size(); ++b)
            CHECK_MESSAGE(named[a].second != named[b].second, knob.name, "=", named[a].first, " and ", named[b].first,
                          " are both named ", named[a].second);
      }
    }
  }
}

TEST_CASE("kernel names: specs whose generated code differs never share a name (every field)") {
  size_t pairs = 0;
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    for (const OpParams& base : bases(op)) {
      REQUIRE(generates(KernelSpec{base}));
      const KernelSource base_src = generate(KernelSpec{base});
      const int n = field_count(base);
      for (int fi = 0; fi < n; ++fi) {
        for (int choice = 0;; ++choice) {
          OpParams p = base;
          FieldVariant f{fi, choice};
          std::visit([&](auto& x) { std::decay_t<decltype(x)>::fields(x, f); }, p);
          if (!f.done) break;
          const KernelSpec spec{p};
          if (spec == KernelSpec{base} || !generates(spec)) continue;
          const KernelSource src = generate(spec);
          if (code_body(src) == code_body(base_src)) continue;  // same kernel: a shared name is right
          ++pairs;
          CHECK_MESSAGE(src.name != base_src.name, op_name(op), ": ", f.field, " changes the code but not the name ",
                        src.name);
        }
      }
    }
  }
  MESSAGE("variant pairs with different code compared: ", pairs);
  CHECK(pairs > 20);
}
