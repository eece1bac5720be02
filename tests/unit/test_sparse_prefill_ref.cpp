// sparse_prefill without a GPU: the f64 reference against hand-computed cases, the host codecs,
// the op's argument validation (every error names its argument) and the generated source.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "reference/sparse_prefill_ref.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"
#include "invalid_message.hpp"

using namespace mlajit;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A one-token, one-block problem whose slots the test fills by hand (page 64, 2 layers).
ref::SparsePrefillProblem tiny_problem(DType kv, int quant_granularity, bool sink, int heads = 16) {
  SparsePrefillParams p;
  p.kv_dtype = kv;
  p.num_q_heads = heads;
  p.quantization_granularity = quant_granularity;
  p.attn_sink = sink;
  ref::SparsePrefillShape s;
  s.num_tokens = 1;
  s.indices_stride = 64;
  s.kv_tokens = 64;
  s.num_blocks = 2;
  s.irregular = false;
  auto pb = ref::make_random_problem(p, s, 7);
  for (auto& e : pb.indices) e = 0xFFFFFFFFu;
  pb.topk_lengths[0] = 64;
  return pb;
}

// Row (absolute) of encoded index e in layer pb.layer_idx.
int64_t row_of(const ref::SparsePrefillProblem& pb, uint32_t e) {
  return static_cast<int64_t>(e / pb.p.page_size) * pb.row_stride() + e % pb.p.page_size +
         static_cast<int64_t>(pb.layer_idx) * pb.p.page_size;
}

double score(const ref::SparsePrefillProblem& pb, int h, const std::vector<double>& k) {
  double dot = 0;
  for (int d = 0; d < 576; ++d) dot += ref::bf16_to_float(pb.q[static_cast<size_t>(h) * 576 + d]) * k[d];
  return pb.softmax_scale * dot;
}

}  // namespace

TEST_CASE("sparse_prefill ref: host codecs") {
  for (int c = 0; c < 256; ++c) {
    const float v = ref::e4m3_to_float(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      CHECK(std::isnan(v));
      continue;
    }
    CHECK(ref::float_to_e4m3(v) == ((c == 0x80) ? 0x80 : c));  // -0 keeps its sign
  }
  CHECK(ref::e4m3_to_float(0x7E) == 448.f);
  CHECK(ref::e4m3_to_float(0x01) == std::ldexp(1.f, -9));
  CHECK(ref::float_to_e4m3(1000.f) == 0x7E);   // saturates
  CHECK(ref::float_to_e4m3(-1000.f) == 0xFE);
  CHECK(ref::float_to_e4m3(1.0625f) == 0x38);  // tie between 1.0 (even) and 1.125 -> 1.0
  CHECK(ref::float_to_e4m3(1.1875f) == 0x3A);  // tie between 1.125 and 1.25 (even) -> 1.25
  CHECK(ref::float_to_bf16(1.f) == 0x3F80);
  CHECK(ref::bf16_to_float(ref::float_to_bf16(1.00390625f)) == 1.f);  // tie to even
  CHECK(ref::bf16_to_float(ref::float_to_bf16(1.01171875f)) == 1.015625f);
}

TEST_CASE("sparse_prefill ref: a single valid key gives out = V and lse = p") {
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    auto pb = tiny_problem(kv, kv == DType::fp8_e4m3 ? 64 : 0, false);
    const uint32_t e = 1 * 64 + 5;  // block 1, offset 5
    pb.indices[17] = e;
    auto r = ref::sparse_prefill_reference(pb, 1);
    std::vector<double> k(576);
    ref::decode_row(pb, row_of(pb, e), k.data());
    for (int h = 0; h < pb.p.num_q_heads; ++h) {
      for (int d = 0; d < 512; ++d) REQUIRE(r.out[static_cast<size_t>(h) * 512 + d] == doctest::Approx(k[d]).epsilon(1e-12));
      CHECK(r.lse[h] == doctest::Approx(score(pb, h, k)).epsilon(1e-12));
    }
  }
}

TEST_CASE("sparse_prefill ref: a row without valid slots gives out = 0 and lse = +inf") {
  auto pb = tiny_problem(DType::bf16, 0, false);
  pb.indices[0] = 0x80000001u;                          // negative
  pb.indices[1] = static_cast<uint32_t>(2 * 64 + 3);    // block 2 of 2: past the cache
  pb.indices[2] = 7;                                    // valid, but past the length
  pb.topk_lengths[0] = 2;
  CHECK_FALSE(ref::slot_valid(pb, 0, 0));
  CHECK_FALSE(ref::slot_valid(pb, 0, 1));
  CHECK_FALSE(ref::slot_valid(pb, 0, 2));
  auto r = ref::sparse_prefill_reference(pb, 1);
  for (double v : r.out) REQUIRE(v == 0.0);
  for (double v : r.lse) CHECK(v == kInf);
}

TEST_CASE("sparse_prefill ref: two keys follow the softmax; the sink scales out but not lse") {
  auto pb = tiny_problem(DType::bf16, 0, true);
  const uint32_t e0 = 3, e1 = 64 + 40;
  pb.indices[0] = e0;
  pb.indices[63] = e1;
  const float sinks[3] = {-std::numeric_limits<float>::infinity(), 0.25f, std::numeric_limits<float>::infinity()};
  std::vector<double> k0(576), k1(576);
  ref::decode_row(pb, row_of(pb, e0), k0.data());
  ref::decode_row(pb, row_of(pb, e1), k1.data());
  for (float sink : sinks) {
    for (auto& s : pb.attn_sink) s = sink;
    auto r = ref::sparse_prefill_reference(pb, 2);
    for (int h = 0; h < pb.p.num_q_heads; ++h) {
      const double p0 = score(pb, h, k0), p1 = score(pb, h, k1), m = std::max(p0, p1);
      const double w0 = std::exp(p0 - m), w1 = std::exp(p1 - m), l = w0 + w1;
      const double denom = l + std::exp(static_cast<double>(sink) - m);
      CHECK(r.lse[h] == doctest::Approx(m + std::log(l)).epsilon(1e-12));
      for (int d = 0; d < 512; d += 37) {
        const double want = std::isinf(denom) ? 0.0 : (w0 * k0[d] + w1 * k1[d]) / denom;
        CHECK(r.out[static_cast<size_t>(h) * 512 + d] == doctest::Approx(want).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("sparse_prefill ref: lengths above the stride are clamped; fp8 rows decode with their scales") {
  auto pb = tiny_problem(DType::fp8_e4m3, 576, false);
  pb.topk_lengths[0] = 1000;
  pb.indices[63] = 10;
  CHECK(ref::slot_valid(pb, 0, 63));
  CHECK_FALSE(ref::slot_valid(pb, 0, 64));
  std::vector<double> k(576);
  const int64_t row = row_of(pb, 10);
  ref::decode_row(pb, row, k.data());
  const double s = pb.scales[static_cast<size_t>(row)];
  CHECK(s > 0);
  CHECK(k[100] == ref::e4m3_to_float(pb.blocks[static_cast<size_t>(row) * 576 + 100]) * s);
}

TEST_CASE("sparse_prefill random problems follow SPEC §4") {
  SparsePrefillParams p;
  p.num_q_heads = 16;
  p.b_topk = 64;
  ref::SparsePrefillShape s;
  s.num_tokens = 40;
  s.indices_stride = 256;
  s.kv_tokens = 1000;
  auto pb = ref::make_random_problem(p, s, 1);
  CHECK(pb.topk_lengths[0] == 0);
  CHECK(pb.topk_lengths[2] > 256);
  int invalid = 0, ragged = 0;
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    if (pb.topk_lengths[t] % 64 != 0) ++ragged;
    for (int64_t j = 0; j < std::min<int64_t>(pb.topk_lengths[t], 256); ++j) invalid += !ref::slot_valid(pb, t, j);
  }
  CHECK(ragged >= 30);
  CHECK(invalid > 0);
  for (int64_t j = 0; j < 256; ++j) CHECK_FALSE(ref::slot_valid(pb, 1, j));
  // Same seed, same data.
  CHECK(ref::make_random_problem(p, s, 1).indices == pb.indices);
}

TEST_CASE("sparse_prefill random problems with scale_fmt ue8m0: power-of-two scales that differ within a row") {
  SparsePrefillParams p;
  p.num_q_heads = 16;
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = 64;
  p.scale_fmt = ScaleFmt::ue8m0;
  ref::SparsePrefillShape s;
  s.num_tokens = 4;
  s.kv_tokens = 512;
  const auto pb = ref::make_random_problem(p, s, 3);
  REQUIRE(!pb.scales.empty());
  int rows_with_distinct = 0;
  size_t not_pow2 = 0;
  const size_t spt = static_cast<size_t>(p.scales_per_token());
  for (size_t r = 0; r * spt < pb.scales.size(); ++r) {
    bool distinct = false;
    for (size_t b = 0; b < spt; ++b) {
      const float sc = pb.scales[r * spt + b];
      int e = 0;
      not_pow2 += std::frexp(sc, &e) != 0.5f;
      distinct |= sc != pb.scales[r * spt];
    }
    rows_with_distinct += distinct;
  }
  CHECK(not_pow2 == 0);
  CHECK(rows_with_distinct * 10 > static_cast<int>(pb.scales.size() / spt) * 9);  // nearly every row
}

TEST_CASE("sparse_prefill op: argument validation names the argument (no GPU needed)") {
  SparsePrefillParams p;
  p.num_q_heads = 32;
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = 64;
  p.attn_sink = true;
  p.emit_lse = true;
  const int64_t T = 3, NB = 4, L = 2, P = 64, S = 128;
  alignas(16) static unsigned char fake[64];  // never dereferenced: validation fails first
  void* ptr = fake;
  TensorView q(ptr, DType::bf16, {T, 32, 576});
  ops::PagedCacheView kv;
  kv.blocks = TensorView(ptr, DType::fp8_e4m3, {NB, 1, L, P, 1, 576});
  kv.scales = TensorView(ptr, DType::f32, {NB, 1, L, P, 1, 9});
  TensorView idx(ptr, DType::u32, {T, S}), len(ptr, DType::u32, {T}), sink(ptr, DType::f32, {32});
  TensorView out(ptr, DType::bf16, {T, 32, 512}), lse(ptr, DType::f32, {T, 32});

  // The good case builds the arguments the kernels get.
  auto a = sparse_prefill::make_args(p, q, kv, idx, len, 1, 0.05f, sink, out, lse);
  CHECK(a.num_tokens == T);
  CHECK(a.indices_stride == S);
  CHECK(a.row_stride == L * P);
  CHECK(a.num_kv_rows == (NB - 1) * L * P + P);
  CHECK(a.layer_row_offset == P);
  CHECK(a.sm_scale_log2e == doctest::Approx(0.05 * 1.4426950408889634));
  CHECK(a.kv_scales != nullptr);

  auto call = [&](auto mutate) {
    SparsePrefillParams pp = p;
    TensorView q2 = q, idx2 = idx, len2 = len, sink2 = sink, out2 = out, lse2 = lse;
    ops::PagedCacheView kv2 = kv;
    int layer = 1;
    float scale = 0.05f;
    mutate(pp, q2, kv2, idx2, len2, sink2, out2, lse2, layer, scale);
    return invalid_message([&] { ops::sparse_prefill(pp, q2, kv2, idx2, len2, layer, scale, sink2, out2, lse2); });
  };
  using V = TensorView;
  using K = ops::PagedCacheView;
  using Pr = SparsePrefillParams;
  auto has = [](const std::string& msg, const char* what) {
    INFO(msg);
    CHECK(msg.find(what) != std::string::npos);
  };
  has(call([&](Pr&, V& q2, K&, V&, V&, V&, V&, V&, int&, float&) { q2 = V(ptr, DType::bf16, {T, 16, 576}); }), "q dim 1");
  has(call([&](Pr&, V& q2, K&, V&, V&, V&, V&, V&, int&, float&) { q2 = V(ptr, DType::f16, {T, 32, 576}); }), "q dtype");
  has(call([&](Pr&, V&, K& k, V&, V&, V&, V&, V&, int&, float&) { k.blocks = V(ptr, DType::bf16, {NB, 1, L, P, 1, 576}); }),
      "kv.blocks dtype");
  has(call([&](Pr&, V&, K& k, V&, V&, V&, V&, V&, int&, float&) { k.blocks = V(ptr, DType::fp8_e4m3, {NB, 1, L, 32, 1, 576}); }),
      "kv.blocks dim 3");
  has(call([&](Pr&, V&, K& k, V&, V&, V&, V&, V&, int&, float&) { k.scales = V(ptr, DType::f32, {NB, 1, L, P, 1, 8}); }),
      "kv.scales dim 5");
  has(call([&](Pr& pp, V&, K&, V&, V&, V&, V&, V&, int&, float&) { pp.quantization_granularity = 0; }), "kv.scales");
  has(call([&](Pr&, V&, K&, V& i, V&, V&, V&, V&, int&, float&) { i = V(ptr, DType::u32, {T, 100}); }),
      "indices dim 1 (indices_stride)");
  has(call([&](Pr&, V&, K&, V& i, V&, V&, V&, V&, int&, float&) { i = V(ptr, DType::i32, {T, S}); }), "indices dtype");
  has(call([&](Pr&, V&, K&, V&, V& l, V&, V&, V&, int&, float&) { l = V(ptr, DType::u32, {T + 1}); }), "topk_lengths dim 0");
  has(call([&](Pr&, V&, K&, V&, V&, V& s, V&, V&, int&, float&) { s = V(); }), "attn_sink");
  has(call([&](Pr&, V&, K&, V&, V&, V& s, V&, V&, int&, float&) { s = V(ptr, DType::f32, {16}); }), "attn_sink dim 0");
  has(call([&](Pr& pp, V&, K&, V&, V&, V&, V&, V&, int&, float&) { pp.attn_sink = false; }), "attn_sink");
  has(call([&](Pr&, V&, K&, V&, V&, V&, V& o, V&, int&, float&) { o = V(ptr, DType::bf16, {T, 32, 576}); }), "out dim 2");
  has(call([&](Pr&, V&, K&, V&, V&, V&, V&, V& l, int&, float&) { l = V(); }), "lse");
  has(call([&](Pr& pp, V&, K&, V&, V&, V&, V&, V&, int&, float&) { pp.emit_lse = false; }), "lse");
  has(call([&](Pr&, V&, K&, V&, V&, V&, V&, V&, int& layer, float&) { layer = 2; }), "layer_idx");
  has(call([&](Pr&, V&, K&, V&, V&, V&, V&, V&, int&, float& sc) { sc = std::numeric_limits<float>::quiet_NaN(); }),
      "softmax_scale");
  has(call([&](Pr& pp, V&, K&, V&, V&, V&, V&, V&, int&, float&) { pp.num_q_heads = 24; }), "params.num_q_heads");
  has(call([&](Pr&, V& q2, K&, V&, V&, V&, V&, V&, int&, float&) { q2.data = fake + 4; }), "q address");
}

TEST_CASE("sparse_prefill codegen: deterministic source with the planned entries") {
  for (int heads : {16, 48, 80, 112, 128}) {
    for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
      SparsePrefillParams p;
      p.num_q_heads = heads;
      p.kv_dtype = kv;
      p.quantization_granularity = kv == DType::fp8_e4m3 ? 64 : 0;
      KernelSpec spec{p};
      KernelSource a = generate(spec), b = generate(spec);
      CHECK(a.code == b.code);
      REQUIRE(a.entries.size() >= 1);
      const auto plan = sparse_prefill::portable_plan(p);
      CHECK(a.entries[sparse_prefill::kEntryPortable].symbol == sparse_prefill::kSymbolPortable);
      CHECK(a.entries[0].threads == static_cast<unsigned>(plan.threads));
      CHECK(a.entries[0].smem_bytes == static_cast<unsigned>(plan.smem_bytes));
      CHECK(plan.heads_per_cta * plan.head_tiles >= heads);
      CHECK(plan.heads_per_cta * (plan.head_tiles - 1) < heads);
      CHECK(plan.smem_bytes <= 227 * 1024);
      CHECK(a.code.find("#include \"sparse_prefill/portable.cuh\"") != std::string::npos);
      CHECK(a.code.find(fmt::format("kSmemBytes == {}", plan.smem_bytes)) != std::string::npos);
      CHECK(a.min_arch == "sm_80");
      if (sparse_prefill::sm90_supported(p)) {
        // The splitting kernels (16-bit math: the persistent one and the fp8 ones) add the split's
        // combine entry.
        const bool splits = sparse_prefill::split_kernel(p);
        REQUIRE(a.entries.size() == (splits ? 3u : 2u));
        CHECK(a.entries[sparse_prefill::kEntrySm90].symbol == sparse_prefill::kSymbolSm90);
        if (splits) CHECK(a.entries[sparse_prefill::kEntrySm90Combine].symbol == sparse_prefill::kSymbolSm90Combine);
      } else {
        CHECK(a.entries.size() == 1);
      }
    }
  }
}

TEST_CASE("sparse_prefill codegen: one kernel body per module") {
  SparsePrefillParams p;  // bf16, H 128: the Hopper kernel is the automatic choice on sm_90a
  const KernelSpec spec{p};
  const std::string hopper_if = "#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL))";
  KernelSource a = generate(spec);
  CHECK(a.code.find(hopper_if) != std::string::npos);  // the target picks the body
  CHECK(a.min_arch == "sm_80");
  KernelSource s80 = generate_sparse_prefill_mode(spec, sparse_prefill::Path::portable);
  KernelSource s90 = generate_sparse_prefill_mode(spec, sparse_prefill::Path::sm90);
  CHECK(s80.code.find("#if 0\n#define MLAJIT_SPARSE_PREFILL_HOPPER 1") != std::string::npos);
  CHECK(s90.code.find("#if 1\n#define MLAJIT_SPARSE_PREFILL_HOPPER 1") != std::string::npos);
  CHECK(s90.min_arch == "sm_90a");
  CHECK(s80.name != s90.name);
  CHECK(s80.name != a.name);  // distinct cache entries and dumps
  for (const KernelSource* k : {&a, &s80, &s90}) {
    REQUIRE(k->entries.size() == 3);  // same entry list whatever the body: the op indexes it by path
    CHECK(k->entries[sparse_prefill::kEntryPortable].symbol == sparse_prefill::kSymbolPortable);
    CHECK(k->entries[sparse_prefill::kEntrySm90].symbol == sparse_prefill::kSymbolSm90);
    CHECK(k->entries[sparse_prefill::kEntrySm90Combine].symbol == sparse_prefill::kSymbolSm90Combine);
    CHECK(k->code.find("__trap()") != std::string::npos);  // the other entry is a guard
  }
  // fp8 group scales of arbitrary f32 values: the portable kernel is the automatic choice
  // everywhere, so the automatic source never compiles the Hopper body; forcing it is still
  // possible. Power-of-two scales (scale_fmt ue8m0) take the Hopper body on sm_90a again.
  SparsePrefillParams group = p;
  group.kv_dtype = DType::fp8_e4m3;
  group.quantization_granularity = 64;
  KernelSource g = generate(KernelSpec{group});
  CHECK(g.code.find(hopper_if) == std::string::npos);
  CHECK(g.code.find("#if 0\n#define MLAJIT_SPARSE_PREFILL_HOPPER 1") != std::string::npos);
  CHECK_NOTHROW(generate_sparse_prefill_mode(KernelSpec{group}, sparse_prefill::Path::sm90));
  SparsePrefillParams pow2 = group;
  pow2.scale_fmt = ScaleFmt::ue8m0;
  CHECK(generate(KernelSpec{pow2}).code.find(hopper_if) != std::string::npos);
  // A spec the Hopper kernel does not cover: one entry, no forced sm90 source.
  SparsePrefillParams three = p;  // quantization granularity 8: below the Hopper kernel's 16
  three.kv_dtype = DType::fp8_e4m3;
  three.quantization_granularity = 8;
  KernelSource t = generate(KernelSpec{three});
  CHECK(t.entries.size() == 1);
  CHECK(t.code.find("sparse_prefill/sm90.cuh") == std::string::npos);
  CHECK_THROWS_AS(generate_sparse_prefill_mode(KernelSpec{three}, sparse_prefill::Path::sm90), Error);
}

TEST_CASE("sparse_prefill path choice") {
  SparsePrefillParams p;
  CHECK(sparse_prefill::resolve_path(p, "sm_80", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  CHECK(sparse_prefill::resolve_path(p, "sm_100a", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  CHECK(sparse_prefill::resolve_path(p, "sm_90a", sparse_prefill::Path::portable) == sparse_prefill::Path::portable);
  CHECK_THROWS_AS(sparse_prefill::resolve_path(p, "sm_80", sparse_prefill::Path::sm90), Error);
  CHECK(sparse_prefill::path_available(p, "sm_90a", sparse_prefill::Path::sm90));
  CHECK_FALSE(sparse_prefill::path_available(p, "sm_100a", sparse_prefill::Path::sm90));
  CHECK(sparse_prefill::resolve_path(p, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::sm90);
  SparsePrefillParams group = p;  // fp8 group scales: the portable kernel applies them exactly
  group.kv_dtype = DType::fp8_e4m3;
  group.quantization_granularity = 64;
  CHECK(sparse_prefill::resolve_path(group, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  CHECK(sparse_prefill::resolve_path(group, "sm_90a", sparse_prefill::Path::sm90) == sparse_prefill::Path::sm90);
  // Power-of-two group scales: exact in the Hopper kernel's tile, so it is preferred there.
  SparsePrefillParams pow2 = group;
  pow2.scale_fmt = ScaleFmt::ue8m0;
  CHECK(sparse_prefill::sm90_preferred(pow2));
  CHECK_FALSE(sparse_prefill::sm90_preferred(group));
  CHECK(sparse_prefill::resolve_path(pow2, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::sm90);
  CHECK(sparse_prefill::resolve_path(pow2, "sm_80", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  pow2.quantization_granularity = 8;  // below the Hopper kernel's 16-element minimum: portable whatever the format
  CHECK(sparse_prefill::resolve_path(pow2, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  SparsePrefillParams three = p;  // quantization granularity 8: only the portable kernel takes them
  three.kv_dtype = DType::fp8_e4m3;
  three.quantization_granularity = 8;
  CHECK(sparse_prefill::resolve_path(three, "sm_90a", sparse_prefill::Path::automatic) == sparse_prefill::Path::portable);
  CHECK_THROWS_AS(sparse_prefill::resolve_path(three, "sm_90a", sparse_prefill::Path::sm90), Error);
  CHECK(sparse_prefill::parse_path("sm90") == sparse_prefill::Path::sm90);
  CHECK_THROWS_AS(sparse_prefill::parse_path("fast"), Error);
}

namespace {

// An FP8-math spec: fp8 cache with unit (quant_granularity 0) or per-row (quant_granularity 576) scales.
SparsePrefillParams fp8_math(int quant_granularity, int heads = 128) {
  SparsePrefillParams p;
  p.kv_dtype = DType::fp8_e4m3;
  p.quantization_granularity = quant_granularity;
  p.num_q_heads = heads;
  p.qk_math = QkMath::fp8;
  return p;
}

}  // namespace

TEST_CASE("sparse_prefill qk_math fp8 codegen: the Hopper FP8-math kernel only, never the portable body") {
  for (int quant_granularity : {0, 576}) {
    for (int heads : {16, 48, 64, 80, 128}) {
      for (bool sink : {false, true}) {
        SparsePrefillParams p = fp8_math(quant_granularity, heads);
        p.attn_sink = sink;
        p.emit_lse = heads != 48;
        const KernelSpec spec{p};
        CAPTURE(spec.name());
        const KernelSource a = generate(spec);
        CHECK(generate(spec).code == a.code);
        CHECK(a.min_arch == "sm_90a");
        CHECK(a.min_arch_why.find("qk_math fp8") != std::string::npos);
        CHECK(a.code.find("#include \"sparse_prefill/sm90.cuh\"") != std::string::npos);
        CHECK(a.code.find("sparse_prefill/portable.cuh") == std::string::npos);
        CHECK(a.code.find("sparse_prefill_portable::") == std::string::npos);
        CHECK(a.code.find(fmt::format("/*page_size*/ {},\n    /*fp8_math*/ true, /*pow2_scales*/ false>",
                                      p.page_size)) != std::string::npos);
        CHECK(a.code.find(fmt::format("/*quant_granularity*/ {}, /*attn_sink*/ {}, /*emit_lse*/ {}", quant_granularity,
                                      p.attn_sink ? "true" : "false", p.emit_lse ? "true" : "false")) != std::string::npos);
        // The FP8-math kernel's layout (templates/sparse_prefill/layout.h), which the plan and the
        // generated source's static_assert both take.
        const int f8_smem = mj::sparse_prefill_layout::hopper_layout(/*fp8_math*/ true, /*persistent*/ false).smem_bytes;
        CHECK(a.code.find(fmt::format("kSmemBytes == {}", f8_smem)) != std::string::npos);
        const auto plan = sparse_prefill::sm90_plan(p);
        CHECK(plan.smem_bytes == f8_smem);
        CHECK(plan.threads == mj::sparse_prefill_layout::kHopperThreads);
        CHECK(plan.head_tiles == mj::sparse_prefill_layout::hopper_ctas_per_token(heads));
        CHECK(a.code.find(fmt::format("kCtasPerToken == {} && SparsePrefillSm90::kPersistent == false",
                                      plan.head_tiles)) != std::string::npos);
        // Both entries, in the usual order: the portable one is a trapping guard.
        REQUIRE(a.entries.size() == 2);
        CHECK(a.entries[sparse_prefill::kEntryPortable].symbol == sparse_prefill::kSymbolPortable);
        CHECK(a.entries[sparse_prefill::kEntryPortable].smem_bytes == 0u);
        CHECK(a.entries[sparse_prefill::kEntrySm90].symbol == sparse_prefill::kSymbolSm90);
        CHECK(a.entries[sparse_prefill::kEntrySm90].threads == static_cast<unsigned>(mj::sparse_prefill_layout::kHopperThreads));
        CHECK(a.entries[sparse_prefill::kEntrySm90].smem_bytes == static_cast<unsigned>(f8_smem));
        CHECK(a.code.find("__trap()") != std::string::npos);
        // Its own ptxas setting, named in the source header too.
        REQUIRE(a.nvrtc_options.size() == 1u);
        CHECK(a.nvrtc_options[0] == "--ptxas-options=--register-usage-level=10");
        CHECK(a.code.find("// NVRTC options of this kernel (besides the fixed ones): "
                          "--ptxas-options=--register-usage-level=10\n") != std::string::npos);
        // The forced Hopper source is the same code (one cache entry); portable is refused.
        const KernelSource s90 = generate_sparse_prefill_mode(spec, sparse_prefill::Path::sm90);
        CHECK(s90.code == a.code);
        CHECK(s90.nvrtc_options == a.nvrtc_options);
        CHECK(s90.min_arch == "sm_90a");
        const std::string e = invalid_message([&] { generate_sparse_prefill_mode(spec, sparse_prefill::Path::portable); });
        CHECK_MESSAGE(e.find("sparse_prefill path portable") != std::string::npos, e);
        CHECK_MESSAGE(e.find("qk_math bf16 (qk_math fp8 runs on the Hopper kernel only") != std::string::npos, e);
      }
    }
  }
  // The same cache with 16-bit math keeps its portable body and Config without the FP8-math flag.
  SparsePrefillParams bf16_math = fp8_math(576);
  bf16_math.qk_math = QkMath::bf16;
  const KernelSource b = generate(KernelSpec{bf16_math});
  CHECK(b.code.find("/*fp8_math*/ false, /*pow2_scales*/ false>") != std::string::npos);
  CHECK(b.code.find("#include \"sparse_prefill/portable.cuh\"") != std::string::npos);
  CHECK(b.min_arch == "sm_80");
  CHECK(b.min_arch_why.empty());
  CHECK(b.nvrtc_options.empty());  // the 16-bit kernels keep ptxas's defaults
  CHECK(sparse_prefill::sm90_plan(bf16_math).smem_bytes !=
        mj::sparse_prefill_layout::hopper_layout(/*fp8_math*/ true, /*persistent*/ false).smem_bytes);
  CHECK(KernelSpec{bf16_math}.name() != KernelSpec{fp8_math(576)}.name());
}

TEST_CASE("sparse_prefill qk_math fp8 path choice: sm_90a only, with errors naming qk_math fp8 and the arch") {
  using sparse_prefill::Path;
  for (int quant_granularity : {0, 576}) {
    const SparsePrefillParams p = fp8_math(quant_granularity);
    CHECK(sparse_prefill::sm90_supported(p));
    CHECK(sparse_prefill::sm90_preferred(p));
    CHECK_FALSE(sparse_prefill::portable_supported(p));
    CHECK(sparse_prefill::path_available(p, "sm_90a", Path::automatic));
    CHECK(sparse_prefill::path_available(p, "sm_90a", Path::sm90));
    CHECK_FALSE(sparse_prefill::path_available(p, "sm_90a", Path::portable));
    CHECK(sparse_prefill::resolve_path(p, "sm_90a", Path::automatic) == Path::sm90);
    CHECK(sparse_prefill::resolve_path(p, "sm_90a", Path::sm90) == Path::sm90);
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_100a", "sm_120a"}) {
      CAPTURE(arch);
      CHECK_FALSE(sparse_prefill::path_available(p, arch, Path::automatic));
      CHECK_FALSE(sparse_prefill::path_available(p, arch, Path::sm90));
      const std::string e = invalid_message([&] { sparse_prefill::resolve_path(p, arch, Path::automatic); });
      CHECK_MESSAGE(e.find(fmt::format("sparse_prefill with qk_math fp8: device arch: got {}, expected sm_90a", arch)) == 0,
                    e);
    }
    const std::string e80 = invalid_message([&] { sparse_prefill::resolve_path(p, "sm_90a", Path::portable); });
    CHECK_MESSAGE(e80.find("sparse_prefill path portable: params.qk_math: got fp8, expected bf16") == 0, e80);
  }
  // 16-bit math on the same caches is unchanged: the portable kernel stays available everywhere.
  SparsePrefillParams bf16_math = fp8_math(576);
  bf16_math.qk_math = QkMath::bf16;
  CHECK(sparse_prefill::portable_supported(bf16_math));
  CHECK(sparse_prefill::resolve_path(bf16_math, "sm_80", Path::automatic) == Path::portable);
  CHECK(sparse_prefill::resolve_path(bf16_math, "sm_90a", Path::automatic) == Path::sm90);
}

TEST_CASE("sparse_prefill qk_math fp8: a negative softmax scale is refused before any GPU work") {
  // Its only kernel needs scale >= 0 (bf16 math would fall back to the portable kernel).
  const SparsePrefillParams p = fp8_math(576, 64);
  const int64_t T = 2, NB = 2, L = 2, P = 64, S = 64;
  alignas(16) static unsigned char fake[64];  // never dereferenced: validation fails first
  void* ptr = fake;
  ops::PagedCacheView kv;
  kv.blocks = TensorView(ptr, DType::fp8_e4m3, {NB, 1, L, P, 1, 576});
  kv.scales = TensorView(ptr, DType::f32, {NB, 1, L, P, 1, 1});
  const TensorView q(ptr, DType::bf16, {T, 64, 576}), idx(ptr, DType::u32, {T, S}), len(ptr, DType::u32, {T});
  const TensorView out(ptr, DType::bf16, {T, 64, 512}), lse(ptr, DType::f32, {T, 64});
  CHECK_NOTHROW(sparse_prefill::make_args(p, q, kv, idx, len, 1, 0.f, TensorView(), out, lse));
  const std::string e = invalid_message([&] { sparse_prefill::make_args(p, q, kv, idx, len, 1, -0.05f, TensorView(), out, lse); });
  CHECK_MESSAGE(e.find("softmax_scale: got -0.05, expected >= 0 with qk_math fp8") == 0, e);
  SparsePrefillParams bf16_math = p;
  bf16_math.qk_math = QkMath::bf16;
  CHECK_NOTHROW(sparse_prefill::make_args(bf16_math, q, kv, idx, len, 1, -0.05f, TensorView(), out, lse));
}

TEST_CASE("sparse_prefill scale_fmt ue8m0 tells the Hopper kernel its group scales are powers of two") {
  // The Config's pow2_scales flag selects the one-multiply group decode (exact for powers of two
  // only), so it must follow scale_fmt exactly: on for ue8m0, off for fp32 scales, and part of the
  // source (hence of the cache key).
  for (int quant_granularity : {16, 64, 192, 576}) {
    for (ScaleFmt fmt_ : {ScaleFmt::fp32, ScaleFmt::ue8m0}) {
      SparsePrefillParams p;
      p.kv_dtype = DType::fp8_e4m3;
      p.num_q_heads = 128;
      p.quantization_granularity = quant_granularity;
      p.scale_fmt = fmt_;
      const KernelSpec spec{p};
      CAPTURE(spec.name());
      const KernelSource s90 = generate_sparse_prefill_mode(spec, sparse_prefill::Path::sm90);
      const bool pow2 = fmt_ == ScaleFmt::ue8m0;
      CHECK(s90.code.find(fmt::format("/*fp8_math*/ false, /*pow2_scales*/ {}>", pow2 ? "true" : "false")) !=
            std::string::npos);
    }
  }
  SparsePrefillParams a;
  a.kv_dtype = DType::fp8_e4m3;
  a.quantization_granularity = 64;
  SparsePrefillParams b = a;
  b.scale_fmt = ScaleFmt::ue8m0;
  CHECK(generate_sparse_prefill_mode(KernelSpec{a}, sparse_prefill::Path::sm90).code !=
        generate_sparse_prefill_mode(KernelSpec{b}, sparse_prefill::Path::sm90).code);
}

TEST_CASE("sparse_prefill reference data: ue8m0 group magnitudes follow the shape's exponent range") {
  SparsePrefillParams p;
  p.kv_dtype = DType::fp8_e4m3;
  p.num_q_heads = 16;
  p.quantization_granularity = 64;
  p.scale_fmt = ScaleFmt::ue8m0;
  ref::SparsePrefillShape s;
  s.kv_tokens = 256;
  // Default: group magnitudes 2^-3..2^3 on N(0, 1) data: every scale well below 1.
  const auto def = ref::make_random_problem(p, s, 1);
  float hi = 0;
  for (float x : def.scales) hi = std::max(hi, x);
  CHECK(hi < 1.0f);
  // 2^-2..2^17: scales above 1 (|x| > 448), i.e. the Hopper f16 decode's per-row factor above 1.
  s.ue8m0_group_exp_lo = -2;
  s.ue8m0_group_exp_hi = 17;
  const auto wide = ref::make_random_problem(p, s, 1);
  hi = 0;
  for (float x : wide.scales) {
    hi = std::max(hi, x);
    int e = 0;
    CHECK(std::frexp(x, &e) == 0.5f);  // powers of two
  }
  CHECK(hi >= 256.0f);
  s.ue8m0_group_exp_lo = 3;
  s.ue8m0_group_exp_hi = 2;
  CHECK_THROWS_AS(ref::make_random_problem(p, s, 1), std::invalid_argument);
}

TEST_CASE("sparse_prefill launch grid: the persistent bf16 Hopper kernel takes a grid size, the others one CTA per item") {
  using sparse_prefill::Path;
  SparsePrefillParams bf16;
  bf16.kv_dtype = DType::bf16;
  bf16.num_q_heads = 128;
  CHECK(sparse_prefill::sm90_plan(bf16).persistent);
  CHECK(sparse_prefill::sm90_plan(bf16).smem_bytes ==
        mj::sparse_prefill_layout::hopper_layout(/*fp8_math*/ false, /*persistent*/ true).smem_bytes);
  // The generated source holds the device Config to the host plan's grid rule.
  const KernelSource bf16_src = generate_sparse_prefill_mode(KernelSpec{bf16}, Path::sm90);
  CHECK(bf16_src.code.find("SparsePrefillSm90::kPersistent == true") != std::string::npos);
  // Explicit grids: capped at the item count (tokens x 64-head tiles); no tokens, no CTAs.
  CHECK(sparse_prefill::launch_ctas(bf16, Path::sm90, 10, 3) == 3);
  CHECK(sparse_prefill::launch_ctas(bf16, Path::sm90, 10, 7) == 7);
  CHECK(sparse_prefill::launch_ctas(bf16, Path::sm90, 10, 1000) == 20);
  CHECK(sparse_prefill::launch_ctas(bf16, Path::sm90, 0, 5) == 0);
  SparsePrefillParams fp8 = bf16;
  fp8.kv_dtype = DType::fp8_e4m3;
  fp8.quantization_granularity = 576;
  CHECK_FALSE(sparse_prefill::sm90_plan(fp8).persistent);
  CHECK(sparse_prefill::sm90_plan(fp8).smem_bytes ==
        mj::sparse_prefill_layout::hopper_layout(/*fp8_math*/ false, /*persistent*/ false).smem_bytes);
  CHECK(sparse_prefill::launch_ctas(fp8, Path::sm90, 10, 0) == 20);
  CHECK(sparse_prefill::launch_ctas(bf16, Path::portable, 10, 0) == 10 * sparse_prefill::portable_plan(bf16).head_tiles);
  // A grid size for a kernel that does not walk items, or a negative one: errors naming grid_ctas.
  for (const auto& [p, path, grid] : {std::tuple{fp8, Path::sm90, int64_t{37}}, std::tuple{bf16, Path::portable, int64_t{37}},
                                      std::tuple{bf16, Path::sm90, int64_t{-37}}}) {
    const std::string e = invalid_message([&] { sparse_prefill::launch_ctas(p, path, 10, grid); });
    CHECK_MESSAGE(e.find("grid_ctas") != std::string::npos, e);
    CHECK_MESSAGE(e.find(std::to_string(grid)) != std::string::npos, e);
    CHECK_MESSAGE(e.find(grid > 0 ? "persistent" : ">= 0") != std::string::npos, e);
  }
}

TEST_CASE("sparse_prefill crossover: which Hopper kernels run as clusters of a token's two CTAs") {
  using sparse_prefill::Path;
  auto spec = [](int heads, int qg, ScaleFmt fmt = ScaleFmt::fp32, CacheLayout layout = CacheLayout::split) {
    SparsePrefillParams p;
    p.kv_dtype = DType::fp8_e4m3;
    p.num_q_heads = heads;
    p.quantization_granularity = qg;
    p.scale_fmt = fmt;
    p.kv_layout = layout;
    return p;
  };
  // Two CTAs per token and the bf16-tile group decode, one scale per 16-element chunk: clusters of 2.
  for (const auto& p : {spec(128, 64), spec(128, 64, ScaleFmt::ue8m0), spec(80, 16), spec(112, 192),
                        spec(128, 128, ScaleFmt::ue8m0, CacheLayout::fp8_ds_mla), spec(96, 288)}) {
    CAPTURE(p.num_q_heads);
    CAPTURE(p.quantization_granularity);
    CHECK(sparse_prefill::sm90_plan(p).crossover);
    CHECK(sparse_prefill::crossover_kernel(p));
    const std::string code = generate_sparse_prefill_mode(KernelSpec{p}, Path::sm90).code;
    CHECK(code.find("SparsePrefillSm90::kCrossoverAvailable == true") != std::string::npos);
    CHECK(code.find("launches of at most 512 tokens take it") != std::string::npos);
  }
  // One CTA per token; f16 tiles (unit, per-row scales, ue8m0 groups of 192); chunks spanning two
  // groups; a bf16 cache: no cluster.
  SparsePrefillParams bf16;
  bf16.kv_dtype = DType::bf16;
  bf16.num_q_heads = 128;
  for (const auto& p : {spec(64, 64), spec(16, 64, ScaleFmt::ue8m0), spec(128, 0), spec(128, 576),
                        spec(128, 192, ScaleFmt::ue8m0), spec(128, 72), spec(96, 36), bf16}) {
    CAPTURE(p.num_q_heads);
    CAPTURE(p.quantization_granularity);
    CHECK_FALSE(sparse_prefill::crossover_kernel(p));
    CHECK(generate_sparse_prefill_mode(KernelSpec{p}, Path::sm90).code.find("SparsePrefillSm90::kCrossoverAvailable == false") !=
          std::string::npos);
  }
  // When a launch runs it: decode-sized launches by default, forced on / off; never on the
  // portable path; `on` for a kernel without it is refused, naming the option and the spec.
  using sparse_prefill::Crossover;
  using sparse_prefill::crossover_taken;
  const SparsePrefillParams g64 = spec(128, 64, ScaleFmt::ue8m0);
  CHECK(crossover_taken(g64, Path::sm90, 1, Crossover::automatic));
  CHECK(crossover_taken(g64, Path::sm90, sparse_prefill::kCrossoverMaxTokens, Crossover::automatic));
  CHECK_FALSE(crossover_taken(g64, Path::sm90, sparse_prefill::kCrossoverMaxTokens + 1, Crossover::automatic));
  CHECK(crossover_taken(g64, Path::sm90, 4096, Crossover::on));
  CHECK_FALSE(crossover_taken(g64, Path::sm90, 1, Crossover::off));
  CHECK_FALSE(crossover_taken(g64, Path::portable, 1, Crossover::automatic));
  CHECK_FALSE(crossover_taken(spec(64, 64), Path::sm90, 1, Crossover::automatic));
  for (const auto& [p, path] : {std::pair{spec(64, 64), Path::sm90}, std::pair{g64, Path::portable}, std::pair{bf16, Path::sm90}}) {
    const std::string e = invalid_message([&] { crossover_taken(p, path, 1, Crossover::on); });
    CHECK_MESSAGE(e.find("crossover") != std::string::npos, e);
    CHECK_MESSAGE(e.find(KernelSpec{p}.name()) != std::string::npos, e);
  }
}

TEST_CASE("sparse_prefill tail split: the last round's items in parts that fill the grid") {
  using sparse_prefill::tail_split;
  // The benchmark's shape on an H100: 4096 tokens x 2 head tiles = 8192 items on 132 CTAs: 62 full
  // rounds and 8 items left; top-2048 (16 steps) caps the parts at 8 (two steps each): 64 units.
  auto sp = tail_split(8192, 132, 256, 2048);
  CHECK(sp.first == 8184);
  CHECK(sp.parts == 8);
  CHECK(sp.units == 8184 + 64);
  // Fewer items than CTAs (decode): every item is split, the parts run side by side, one step each
  // at least; parts are powers of two (132 / 20 = 6 -> 4).
  sp = tail_split(20, 132, 256, 2048);
  CHECK(sp.first == 0);
  CHECK(sp.parts == 4);
  CHECK(sp.units == 80);
  CHECK(tail_split(9, 132, 256, 2048).parts == 8);   // 14 -> 8
  CHECK(tail_split(2, 132, 256, 2048).parts == 16);  // 66, the 16 one-step parts of top-2048
  CHECK(tail_split(1, 132, 256, 256).parts == 2);    // 2 steps: two one-step parts
  CHECK(tail_split(8192, 132, 256, 2048, 6).parts == 4);
  // Limits: the slots, the steps of a full-length item, the caller's cap.
  CHECK(tail_split(20, 132, 40, 2048).parts == 2);
  CHECK(tail_split(20, 132, 256, 512).parts == 4);   // 4 steps: 4 parts of 1 (decode)
  CHECK(tail_split(140, 132, 256, 512).parts == 2);  // 8 left after a full round: 2 parts of 2
  CHECK(tail_split(8192, 132, 256, 2048, 4).parts == 4);
  // An explicit cap replaces the two-step rule (the benchmark's sweep): one step per part at least.
  CHECK(tail_split(8192, 132, 256, 2048, 16).parts == 16);
  CHECK(tail_split(8192, 132, 256, 2048, 64).parts == 16);  // 132 / 8 and 16 steps
  CHECK(tail_split(20, 132, 256, 256, 4).parts == 2);       // 2 steps: 2 one-step parts
  // No split: a full last round, a last round too full to gain, too few slots or steps, no slots.
  for (const auto& s : {tail_split(8184, 132, 256, 2048), tail_split(8192 + 60, 132, 256, 2048),
                        tail_split(20, 132, 39, 2048), tail_split(140, 132, 256, 256), tail_split(20, 132, 0, 2048),
                        tail_split(8192, 132, 256, 2048, 1), tail_split(0, 132, 256, 2048)}) {
    CHECK(s.parts == 1);
    CHECK(s.first == s.units);
  }
  // Small grids (the GPU tests' walks): 213 items on 7 CTAs: 3 left over, 2 parts each.
  sp = tail_split(213, 7, 256, 2048);
  CHECK(sp.first == 210);
  CHECK(sp.parts == 2);
  CHECK(sp.units == 216);
}
