// Params: validation errors name the field, JSON round trips, canonical form, structural hash/eq.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlajit/error.hpp"
#include "mlajit/params.hpp"

using namespace mlajit;
using nlohmann::json;

namespace {

// Every op with its default params (all valid).
std::vector<KernelSpec> default_specs() {
  return {KernelSpec{KvCacheStoreParams{}}, KernelSpec{KvCacheGatherParams{}}, KernelSpec{SparseIndexRemapParams{}},
          KernelSpec{MlaIndexerParams{}}, KernelSpec{SparsePrefillParams{}}};
}

// Parses `text` as a kernel spec and returns the error message (fails the test if none).
std::string rejection(const std::string& text, ErrorKind kind = ErrorKind::InvalidArgument) {
  try {
    kernel_spec_from_json(json::parse(text), "kernel");
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("accepted: " << text);
  return "";
}

}  // namespace

TEST_CASE("defaults of every op are valid and round trip through JSON") {
  for (const auto& spec : default_specs()) {
    CAPTURE(spec.canonical());
    CHECK_NOTHROW(spec.validate());
    json j = to_json(spec);
    KernelSpec back = kernel_spec_from_json(json::parse(j.dump()));
    CHECK(back == spec);
    CHECK(back.canonical() == spec.canonical());
    CHECK(back.hash() == spec.hash());
    CHECK(to_json(back) == j);
  }
}

TEST_CASE("non-default params round trip exactly") {
  KvCacheStoreParams s;
  s.cache.dtype = DType::fp8_e4m3;
  s.cache.num_heads = 1;
  s.cache.head_size = 128;
  s.cache.quantization_granularity = 128;
  s.cache.scale_fmt = ScaleFmt::ue8m0;
  s.cache.num_layers = 3;
  s.input_dtype = DType::f32;
  s.threads = 256;
  MlaIndexerParams m;
  m.num_heads = 128;
  m.top_k = 512;
  m.mask = Mask::none;
  m.emit = IndexEmit::physical;
  m.block_kv = 128;
  SparsePrefillParams p;
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = 64;
  p.attn_sink = true;
  p.emit_lse = false;
  p.num_q_heads = 64;
  p.scale_fmt = ScaleFmt::ue8m0;
  SparsePrefillParams f;
  f.kv_dtype = DType::fp8_e4m3;
  f.quantization_granularity = 576;
  f.qk_math = QkMath::fp8;
  for (const KernelSpec& spec : {KernelSpec{s}, KernelSpec{m}, KernelSpec{p}, KernelSpec{f}}) {
    CAPTURE(spec.canonical());
    KernelSpec back = kernel_spec_from_json(json::parse(to_json(spec).dump()));
    CHECK(back == spec);
    CHECK(back.canonical() == spec.canonical());
  }
}

TEST_CASE("canonical form is stable") {
  // Pinned: the canonical string appears in generated source headers and therefore in cache keys.
  CHECK(KernelSpec{SparseIndexRemapParams{}}.canonical() == R"(sparse_index_remap {"page_size":64,"threads":0})");
  // Auto knobs resolve to the built-in heuristic.
  CHECK(KernelSpec{with_heuristic_knobs(SparseIndexRemapParams{})}.canonical() ==
        R"(sparse_index_remap {"page_size":64,"threads":256})");
  // Key order in the input does not matter.
  auto a = kernel_spec_from_json(json::parse(R"({"op":"sparse_index_remap","params":{"threads":128,"page_size":32}})"));
  auto b = kernel_spec_from_json(json::parse(R"({"params":{"page_size":32,"threads":128},"op":"sparse_index_remap"})"));
  CHECK(a.canonical() == b.canonical());
  CHECK(a == b);
}

TEST_CASE("bad params are rejected with an error naming the field") {
  struct Case {
    const char* json;
    const char* field;
  };
  const Case cases[] = {
      {R"({"op":"kv_cache_store","params":{"dtype":"i32"}})", "kernel.params.dtype"},
      {R"({"op":"kv_cache_store","params":{"num_heads":0}})", "kernel.params.num_heads"},
      {R"({"op":"kv_cache_store","params":{"head_size":5000}})", "kernel.params.head_size"},
      {R"({"op":"kv_cache_store","params":{"page_size":48}})", "kernel.params.page_size"},
      {R"({"op":"kv_cache_store","params":{"num_layers":0}})", "kernel.params.num_layers"},
      {R"({"op":"kv_cache_store","params":{"quantization_granularity":64}})", "kernel.params.quantization_granularity"},
      {R"({"op":"kv_cache_store","params":{"scale_fmt":"ue8m0"}})", "kernel.params.scale_fmt"},
      {R"({"op":"kv_cache_store","params":{"dtype":"fp8_e4m3","head_size":128,"quantization_granularity":129}})",
       "kernel.params.quantization_granularity"},
      {R"({"op":"kv_cache_store","params":{"input_dtype":"fp8_e4m3"}})", "kernel.params.input_dtype"},
      {R"({"op":"kv_cache_store","params":{"threads":100}})", "kernel.params.threads"},
      {R"({"op":"kv_cache_gather","params":{"output_dtype":"f16"}})", "kernel.params.output_dtype"},
      {R"({"op":"kv_cache_gather","params":{"threads":2048}})", "kernel.params.threads"},
      {R"({"op":"sparse_index_remap","params":{"page_size":0}})", "kernel.params.page_size"},
      {R"({"op":"mla_indexer","params":{"num_heads":48}})", "kernel.params.num_heads"},
      {R"({"op":"mla_indexer","params":{"depth":64}})", "kernel.params.depth"},
      {R"({"op":"mla_indexer","params":{"top_k":0}})", "kernel.params.top_k"},
      {R"({"op":"mla_indexer","params":{"top_k":4097}})", "kernel.params.top_k"},
      {R"({"op":"mla_indexer","params":{"quantization_granularity":64}})", "kernel.params.quantization_granularity"},
      {R"({"op":"mla_indexer","params":{"block_kv":96}})", "kernel.params.block_kv"},
      {R"({"op":"mla_indexer","params":{"num_stages":9}})", "kernel.params.num_stages"},
      {R"({"op":"mla_indexer","params":{"mask":"sliding"}})", "kernel.params.mask"},
      {R"({"op":"sparse_prefill","params":{"num_q_heads":24}})", "kernel.params.num_q_heads"},
      {R"({"op":"sparse_prefill","params":{"b_topk":96}})", "kernel.params.b_topk"},
      {R"({"op":"sparse_prefill","params":{"b_topk":128}})", "kernel.params.b_topk"},
      {R"({"op":"sparse_prefill","params":{"qk_depth":512}})", "kernel.params.qk_depth"},
      {R"({"op":"sparse_prefill","params":{"v_depth":576}})", "kernel.params.v_depth"},
      {R"({"op":"sparse_prefill","params":{"kv_dtype":"f16"}})", "kernel.params.kv_dtype"},
      {R"({"op":"sparse_prefill","params":{"quantization_granularity":64}})", "kernel.params.quantization_granularity"},
      {R"({"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":100}})",
       "kernel.params.quantization_granularity"},
      {R"({"op":"sparse_prefill","params":{"num_stages":2}})", "unknown field \"num_stages\""},
      {R"({"op":"sparse_prefill","params":{"qk_math":"fp16"}})", "kernel.params.qk_math"},
      {R"({"op":"sparse_prefill","params":{"qk_math":"fp8"}})", "kernel.params.kv_dtype"},
      {R"({"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":64,"qk_math":"fp8"}})",
       "kernel.params.quantization_granularity"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.json);
    std::string msg = rejection(c.json);
    CHECK_MESSAGE(msg.find(c.field) != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("expected") != std::string::npos, msg);
  }
}

TEST_CASE("bad JSON is rejected with an error naming the path") {
  struct Case {
    const char* json;
    const char* needle;
  };
  const Case cases[] = {
      {R"([1,2])", "kernel"},
      {R"({"params":{}})", "kernel.op"},
      {R"({"op":"flash_attention"})", "kernel.op"},
      {R"({"op":7})", "kernel.op"},
      {R"({"op":"mla_indexer","param":{}})", "unknown field \"param\""},
      {R"({"op":"mla_indexer","params":{"topk":8}})", "unknown field \"topk\""},
      {R"({"op":"mla_indexer","params":{"topk":8}})", "\"topk\" is now \"top_k\""},
      {R"({"op":"sparse_prefill","params":{"scale_block_size":576}})", "unknown field \"scale_block_size\""},
      {R"({"op":"sparse_prefill","params":{"scale_block_size":576}})",
       "\"scale_block_size\" is now \"quantization_granularity\""},
      {R"({"op":"mla_indexer","params":[]})", "kernel.params"},
      {R"({"op":"mla_indexer","params":{"top_k":"8"}})", "kernel.params.top_k"},
      {R"({"op":"mla_indexer","params":{"top_k":8.5}})", "kernel.params.top_k"},
      {R"({"op":"mla_indexer","params":{"top_k":4294967296}})", "kernel.params.top_k"},
      {R"({"op":"sparse_prefill","params":{"attn_sink":1}})", "kernel.params.attn_sink"},
      {R"({"op":"sparse_prefill","params":{"kv_dtype":8}})", "kernel.params.kv_dtype"},
      {R"({"op":"mla_indexer","params":{"mask":true}})", "kernel.params.mask"},
      {R"({"op":"sparse_prefill","params":{"qk_math":8}})", "kernel.params.qk_math"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.json);
    std::string msg = rejection(c.json);
    CHECK_MESSAGE(msg.find(c.needle) != std::string::npos, msg);
  }
}

TEST_CASE("hash and equality see every field") {
  // Changing any single field of any op must change equality (and, for these, the hash).
  std::vector<KernelSpec> variants;
  for (auto& spec : default_specs()) {
    json p = to_json(spec)["params"];
    for (auto it = p.begin(); it != p.end(); ++it) {
      json q = p;
      if (it->is_boolean()) q[it.key()] = !it->get<bool>();
      else if (it->is_number_integer()) q[it.key()] = it->get<int>() + 1;
      else q[it.key()] = it->get<std::string>() + "x";  // invalid on purpose: compare params only
      OpParams changed;
      try {
        changed = params_from_json(spec.op(), q);
      } catch (const Error&) {
        continue;  // an enum/dtype name that does not parse
      }
      KernelSpec other{changed};
      CAPTURE(spec.canonical());
      CAPTURE(other.canonical());
      CHECK(other != spec);
      CHECK(other.hash() != spec.hash());
    }
  }
  // Same params under different ops differ (sparse_index_remap vs nothing else shares layout, but
  // the op index is hashed in regardless).
  CHECK(KernelSpec{KvCacheStoreParams{}} != KernelSpec{KvCacheGatherParams{}});
}

TEST_CASE("sparse_prefill qk_math: bf16 by default, \"fp8\" opts in, and only on an fp8 cache with unit or row scales") {
  // Absent means bf16 (configs written before the field existed keep their meaning); it is always
  // written out, like every other field.
  const KernelSpec plain = kernel_spec_from_json(json::parse(R"({"op":"sparse_prefill","params":{}})"));
  CHECK(std::get<SparsePrefillParams>(plain.params).qk_math == QkMath::bf16);
  CHECK(to_json(plain)["params"]["qk_math"] == "bf16");
  for (int quant_granularity : {0, 576}) {
    CAPTURE(quant_granularity);
    json j = {{"op", "sparse_prefill"},
              {"params", {{"kv_dtype", "fp8_e4m3"}, {"quantization_granularity", quant_granularity}, {"qk_math", "fp8"}}}};
    const KernelSpec spec = kernel_spec_from_json(j);
    CHECK(std::get<SparsePrefillParams>(spec.params).qk_math == QkMath::fp8);
    CHECK(to_json(spec)["params"]["qk_math"] == "fp8");
    CHECK(kernel_spec_from_json(to_json(spec)) == spec);
    j["params"]["qk_math"] = "bf16";
    CHECK(kernel_spec_from_json(j) != spec);
    CHECK(kernel_spec_from_json(j).hash() != spec.hash());
  }
  // The errors say what FP8 math needs.
  const std::string bf16_cache = rejection(R"({"op":"sparse_prefill","params":{"qk_math":"fp8"}})");
  CHECK_MESSAGE(bf16_cache.find("kernel.params.kv_dtype: got bf16, expected fp8_e4m3 with qk_math fp8") == 0, bf16_cache);
  for (int quant_granularity : {16, 64, 72, 192, 288}) {
    const std::string group = rejection(
        json{{"op", "sparse_prefill"}, {"params", {{"kv_dtype", "fp8_e4m3"}, {"quantization_granularity", quant_granularity}, {"qk_math", "fp8"}}}}
            .dump());
    CAPTURE(group);
    CHECK(group.find(fmt::format("kernel.params.quantization_granularity: got {}, expected 0 (unit scales) or 576 (one scale "
                                 "per row) with qk_math fp8",
                                 quant_granularity)) == 0);
    CHECK(group.find("group scales are not supported in FP8 math") != std::string::npos);
  }
  const std::string bad_name = rejection(R"({"op":"sparse_prefill","params":{"qk_math":"e4m3"}})");
  CHECK_MESSAGE(bad_name.find(R"(kernel.params.qk_math: got "e4m3", expected bf16 | fp8)") == 0, bad_name);
}

TEST_CASE("sparse_prefill names: dtype, heads, page size, quantization granularity, then the modes") {
  // Pinned: names key dumps, `mlajit cache ls`, logs and tune reports.
  SparsePrefillParams p;
  CHECK(KernelSpec{p}.name() == "sparse_prefill_bf16_h128_p64");
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = 576;
  p.attn_sink = true;
  CHECK(KernelSpec{p}.name() == "sparse_prefill_fp8_e4m3_h128_p64_g576_sink");
  p.qk_math = QkMath::fp8;
  CHECK(KernelSpec{p}.name() == "sparse_prefill_fp8_e4m3_h128_p64_g576_sink_fp8math");
  SparsePrefillParams g;
  g.kv_dtype = DType::fp8_e4m3;
  g.quantization_granularity = 64;
  CHECK(KernelSpec{g}.name() == "sparse_prefill_fp8_e4m3_h128_p64_g64");
  g.scale_fmt = ScaleFmt::ue8m0;
  CHECK(KernelSpec{g}.name() == "sparse_prefill_fp8_e4m3_h128_p64_g64_ue8m0");
}

TEST_CASE("sparse_prefill scale_fmt: fp32 by default, \"ue8m0\" declares power-of-two scales, only where there are scales") {
  const KernelSpec plain = kernel_spec_from_json(json::parse(R"({"op":"sparse_prefill","params":{}})"));
  CHECK(std::get<SparsePrefillParams>(plain.params).scale_fmt == ScaleFmt::fp32);
  CHECK(to_json(plain)["params"]["scale_fmt"] == "fp32");
  for (int quant_granularity : {16, 64, 576}) {
    CAPTURE(quant_granularity);
    json j = {{"op", "sparse_prefill"},
              {"params", {{"kv_dtype", "fp8_e4m3"}, {"quantization_granularity", quant_granularity}, {"scale_fmt", "ue8m0"}}}};
    const KernelSpec spec = kernel_spec_from_json(j);
    CHECK(std::get<SparsePrefillParams>(spec.params).scale_fmt == ScaleFmt::ue8m0);
    CHECK(kernel_spec_from_json(to_json(spec)) == spec);
    j["params"]["scale_fmt"] = "fp32";
    CHECK(kernel_spec_from_json(j).hash() != spec.hash());
    CHECK(kernel_spec_from_json(j).name() != spec.name());
  }
  const std::string bf16_cache = rejection(R"({"op":"sparse_prefill","params":{"scale_fmt":"ue8m0"}})");
  CHECK_MESSAGE(bf16_cache.find("kernel.params.scale_fmt: got ue8m0, expected fp32 for a cache without scales") == 0,
                bf16_cache);
  const std::string unit = rejection(
      R"({"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":0,"scale_fmt":"ue8m0"}})");
  CHECK_MESSAGE(unit.find("kernel.params.scale_fmt: got ue8m0") == 0, unit);
  const std::string bad = rejection(R"({"op":"sparse_prefill","params":{"scale_fmt":"e8m0"}})");
  CHECK_MESSAGE(bad.find(R"(kernel.params.scale_fmt: got "e8m0", expected fp32 | ue8m0)") == 0, bad);
}
