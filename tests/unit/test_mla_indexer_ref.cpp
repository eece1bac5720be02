// mla_indexer without a GPU: the CPU reference's own rules (fp8 decode, scores, top-k order),
// the op's argument validation (every error names the argument and happens before the runtime
// is touched), the workspace bound and the generated source.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "reference/mla_indexer_ref.hpp"

using namespace mlajit;

TEST_SUITE("mla_indexer reference") {
  TEST_CASE("e4m3 decode and nearest encode agree on every finite code") {
    CHECK(ref::e4m3_to_double(0x38) == 1.0);
    CHECK(ref::e4m3_to_double(0x7E) == 448.0);
    CHECK(ref::e4m3_to_double(0x01) == std::ldexp(1.0, -9));
    CHECK(ref::e4m3_to_double(0xB8) == -1.0);
    CHECK(std::isnan(ref::e4m3_to_double(0x7F)));
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) == 0x7F || c == 0x80) continue;
      CHECK(ref::e4m3_from_double(ref::e4m3_to_double(static_cast<uint8_t>(c))) == c);
    }
    CHECK(ref::e4m3_from_double(1e9) == 0x7E);
    CHECK(ref::e4m3_from_double(-1e9) == 0xFE);
    CHECK(ref::e4m3_from_double(1.0625) == 0x38);  // halfway between 1 and 1.125: to the even code
  }

  TEST_CASE("top-k order: descending, ties to the smaller position, NaN last, -1 tail, -0 == +0") {
    const double nan = std::nan("");
    std::vector<double> s = {1.0, 3.0, nan, 3.0, -2.0, 0.0, -0.0, 5.0};
    CHECK(ref::topk_ref(s, 3) == std::vector<int32_t>{7, 1, 3});
    CHECK(ref::topk_ref(s, 8) == std::vector<int32_t>{7, 1, 3, 0, 5, 6, 4, 2});
    CHECK(ref::topk_ref(s, 10) == std::vector<int32_t>{7, 1, 3, 0, 5, 6, 4, 2, -1, -1});
    std::vector<double> z = {-0.0, 0.0, -0.0};
    CHECK(ref::topk_ref(z, 3) == std::vector<int32_t>{0, 1, 2});
    CHECK(ref::topk_ref({}, 2) == std::vector<int32_t>{-1, -1});
  }

  TEST_CASE("scores follow the formula on a hand-checked case; causal and none visibility") {
    ref::IndexerCase c;
    c.num_heads = 32;
    c.page_size = 4;
    c.new_tokens = {2, 3};
    c.cache_lens = {5, 1};
    c.seed = 7;
    auto in = ref::make_indexer_inputs(c);
    CHECK(in.num_tokens() == 5);
    CHECK(in.max_keys == 7);
    // Token 3 is sequence 1, i = 1: causal sees L + i + 1 = 3 keys; none sees L + S = 4.
    CHECK(ref::ref_token(in, 3).seq == 1);
    CHECK(ref::ref_token(in, 3).visible == 3);
    in.mask = Mask::none;
    CHECK(ref::ref_token(in, 3).visible == 4);
    in.mask = Mask::causal;
    // Recompute score(3, 2) by hand from the raw bytes.
    const int64_t row = ref::ref_key_row(in, 1, 2);
    REQUIRE(row >= 0);
    double sum = 0;
    for (int h = 0; h < 32; ++h) {
      double dot = 0;
      for (int d = 0; d < 128; ++d)
        dot += ref::e4m3_to_double(in.q[(3 * 32 + h) * 128 + d]) * ref::e4m3_to_double(in.k_blocks[row * 128 + d]);
      sum += (dot > 0 ? dot : 0) * in.qs[3 * 32 + h];
    }
    const auto s = ref::indexer_scores_ref(in, 3);
    REQUIRE(s.size() == 3);
    CHECK(s[2] == doctest::Approx(sum * in.k_scales[row]).epsilon(1e-12));
    // Pages are shuffled and layer 1 is used: the row is not the identity mapping.
    CHECK(ref::encode_ref(in, 1, 2) == static_cast<int32_t>(in.lookup_table[1 * in.pages_per_seq] * 4 + 2));
    CHECK(ref::encode_ref(in, 1, -1) == -1);
    CHECK(ref::encode_ref(in, 1, static_cast<int32_t>(in.pages_per_seq * 4)) == -1);
  }
}

namespace {

// Views over fake (never dereferenced) host memory: validation must fail before any access.
struct FakeArgs {
  std::vector<unsigned char> mem = std::vector<unsigned char>(1 << 16);
  MlaIndexerParams p;
  TensorView q, qs, offsets, out, ws;
  ops::PagedCacheView kc;
  int layer = 1;
  int64_t max_keys = 300;
  FakeArgs() {
    p.num_heads = 64;
    p.top_k = 128;
    p.page_size = 64;
    void* m = mem.data();
    q = TensorView(m, DType::fp8_e4m3, {10, 64, 128});
    qs = TensorView(m, DType::f32, {10, 64});
    offsets = TensorView(m, DType::u32, {3});
    kc.blocks = TensorView(m, DType::fp8_e4m3, {8, 1, 2, 64, 1, 128});
    kc.scales = TensorView(m, DType::f32, {8, 1, 2, 64, 1, 1});
    kc.lookup_table = TensorView(m, DType::u32, {2, 5});
    kc.cache_lengths = TensorView(m, DType::u32, {2});
    out = TensorView(m, DType::i32, {10, 128});
    ws = TensorView(m, DType::f32, {10 * 300});
  }
  void call() const { ops::mla_indexer(p, q, qs, offsets, kc, layer, max_keys, out, ws); }
};

std::string error_of(const FakeArgs& a) {
  try {
    a.call();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::InvalidArgument);
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_SUITE("mla_indexer validation") {
  TEST_CASE("each bad view is named before the runtime is touched") {
    struct Case {
      const char* expect;
      void (*mutate)(FakeArgs&);
    };
    const Case cases[] = {
        {"q", [](FakeArgs& a) { a.q.dtype = DType::bf16; }},
        {"q", [](FakeArgs& a) { a.q = TensorView(a.mem.data(), DType::fp8_e4m3, {10, 32, 128}); }},
        {"q", [](FakeArgs& a) { a.q = TensorView(a.mem.data(), DType::fp8_e4m3, {10, 64, 64}); }},
        {"q address", [](FakeArgs& a) { a.q.data = a.mem.data() + 1; }},
        {"qs", [](FakeArgs& a) { a.qs = TensorView(a.mem.data(), DType::f32, {9, 64}); }},
        {"input_row_offsets", [](FakeArgs& a) { a.offsets = TensorView(a.mem.data(), DType::u32, {1}); }},
        {"input_row_offsets", [](FakeArgs& a) { a.offsets.dtype = DType::i32; }},
        {"k_cache.blocks", [](FakeArgs& a) { a.kc.blocks.dtype = DType::bf16; }},
        {"k_cache.blocks (page_size)",
         [](FakeArgs& a) { a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {8, 1, 2, 32, 1, 128}); }},
        {"k_cache.blocks (kv_dim",
         [](FakeArgs& a) { a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {8, 2, 2, 64, 1, 128}); }},
        {"k_cache.scales (num_layers)",
         [](FakeArgs& a) { a.kc.scales = TensorView(a.mem.data(), DType::f32, {8, 1, 1, 64, 1, 1}); }},
        {"k_cache.scales (head_dim_granularity)",
         [](FakeArgs& a) { a.kc.scales = TensorView(a.mem.data(), DType::f32, {8, 1, 2, 64, 1, 2}); }},
        {"k_cache.lookup_table (batch)",
         [](FakeArgs& a) { a.kc.lookup_table = TensorView(a.mem.data(), DType::u32, {3, 5}); }},
        {"k_cache.cache_lengths", [](FakeArgs& a) { a.kc.cache_lengths = TensorView(a.mem.data(), DType::u32, {3}); }},
        {"layer_idx", [](FakeArgs& a) { a.layer = 2; }},
        {"max_keys_per_seq", [](FakeArgs& a) { a.max_keys = -1; }},
        {"out (top_k)", [](FakeArgs& a) { a.out = TensorView(a.mem.data(), DType::i32, {10, 64}); }},
        {"out", [](FakeArgs& a) { a.out.dtype = DType::u32; }},
        {"workspace size", [](FakeArgs& a) { a.ws = TensorView(a.mem.data(), DType::f32, {299}); }},
        {"params.num_heads", [](FakeArgs& a) { a.p.num_heads = 48; }},
        {"params.block_kv", [](FakeArgs& a) { a.p.block_kv = 128; }},
        {"params.block_q", [](FakeArgs& a) { a.p.block_q = 4; }},
    };
    for (const auto& c : cases) {
      FakeArgs a;
      c.mutate(a);
      const std::string msg = error_of(a);
      INFO("expected an error naming \"" << c.expect << "\", got: " << msg);
      CHECK(msg.rfind(c.expect, 0) == 0);
    }
  }

  TEST_CASE("the v10 scorer (the default) walks keys in 32-bit ints: max_keys_per_seq <= 2^31 - 1024") {
    FakeArgs a;
    a.max_keys = (int64_t{1} << 31) - 1000;
    const std::string msg = error_of(a);
    INFO(msg);
    CHECK(msg.rfind("max_keys_per_seq", 0) == 0);
    CHECK(msg.find("2^31 - 1024") != std::string::npos);
    // v8 (block_kv 64) has no such bound: the same call gets past it (to the workspace check).
    a.p.block_kv = 64;
    CHECK(error_of(a).rfind("workspace size", 0) == 0);
  }

  TEST_CASE("the v11 scorer (v10's tiling at pages >= 64) addresses cache rows by TMA: fewer than 2^31 rows") {
    FakeArgs a;
    a.layer = 0;
    a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {int64_t{1} << 25, 1, 1, 64, 1, 128});
    a.kc.scales = TensorView(a.mem.data(), DType::f32, {int64_t{1} << 25, 1, 1, 64, 1, 1});
    a.ws = TensorView(a.mem.data(), DType::f32, {299});  // a valid call stops at the workspace check
    const std::string msg = error_of(a);
    INFO(msg);
    CHECK(msg.rfind("k_cache rows", 0) == 0);
    CHECK(msg.find("2^31") != std::string::npos);
    // One row fewer passes; so does v8 (block_kv 64), and page 4 (v10's cp.async producer).
    a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {(int64_t{1} << 25) - 1, 1, 1, 64, 1, 128});
    a.kc.scales = TensorView(a.mem.data(), DType::f32, {(int64_t{1} << 25) - 1, 1, 1, 64, 1, 1});
    CHECK(error_of(a).rfind("workspace size", 0) == 0);
    a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {int64_t{1} << 25, 1, 1, 64, 1, 128});
    a.kc.scales = TensorView(a.mem.data(), DType::f32, {int64_t{1} << 25, 1, 1, 64, 1, 1});
    a.p.block_kv = 64;
    CHECK(error_of(a).rfind("workspace size", 0) == 0);
    a.p.block_kv = 256;
    a.p.page_size = 4;
    a.kc.blocks = TensorView(a.mem.data(), DType::fp8_e4m3, {int64_t{1} << 29, 1, 1, 4, 1, 128});
    a.kc.scales = TensorView(a.mem.data(), DType::f32, {int64_t{1} << 29, 1, 1, 4, 1, 1});
    CHECK(error_of(a).rfind("workspace size", 0) == 0);
  }

  TEST_CASE("workspace bound: chunks of score rows, never a full [T, max_keys] matrix") {
    MlaIndexerParams p;
    // 128K keys: a row is 512 KiB; 4096 tokens would be 2 GiB, the workspace stays at 128 MiB.
    CHECK(ops::mla_indexer_workspace_bytes(p, 4096, 131072) == size_t{256} * 131072 * 4);
    CHECK(ops::mla_indexer_workspace_bytes(p, 10, 300) == size_t{10} * 300 * 4);
    CHECK(ops::mla_indexer_workspace_bytes(p, 3, 301) == size_t{3} * 304 * 4);  // rows padded to 4 floats
    CHECK(ops::mla_indexer_workspace_bytes(p, 0, 300) == 0);
    CHECK_THROWS_AS(ops::mla_indexer_workspace_bytes(p, -1, 300), Error);
  }

  TEST_CASE("generated source: three entries, deterministic, knob errors named") {
    MlaIndexerParams p;
    p.num_heads = 128;
    p.top_k = 2048;
    const KernelSource a = generate(KernelSpec{p});
    const KernelSource b = generate(KernelSpec{p});
    CHECK(a.code == b.code);
    REQUIRE(a.entries.size() == 3);
    CHECK(a.entries[0].symbol == "mla_indexer_scores_sm90");
    CHECK(a.entries[1].symbol == "mla_indexer_scores_portable");
    CHECK(a.entries[2].symbol == "mla_indexer_topk");
    CHECK(a.min_arch == "sm_80");
    CHECK(a.code.find("constexpr int kHeads = 128;") != std::string::npos);
    p.num_stages = 1;
    try {
      generate(KernelSpec{p});
      FAIL("num_stages 1 accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).rfind("params.num_stages", 0) == 0);
    }
  }
}
