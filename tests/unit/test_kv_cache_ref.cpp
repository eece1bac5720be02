// Paged KV cache without a GPU: the exact host encodings the reference (and the GPU tests) rely
// on, the fp8 scale rules, the division identity the store kernel uses, the reference ops on
// hand-checked cases, the generated source, and the ops' argument validation (which runs before
// the runtime is touched, so every error here is raised without a driver).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/test_data.hpp"
#include "invalid_message.hpp"

using namespace mlajit;
namespace td = mlajit::testdata;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent e4m3 encoder: the nearest of all finite codes by exhaustive search, ties to the
// code with an even mantissa, saturating to +-448.
uint8_t e4m3_nearest(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(static_cast<double>(td::e4m3_to_f32(static_cast<uint8_t>(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace

TEST_SUITE("kv_cache reference") {
  TEST_CASE("e4m3: every code decodes exactly and re-encodes to itself") {
    CHECK(td::e4m3_to_f32(0x38) == 1.0f);
    CHECK(td::e4m3_to_f32(0x7E) == 448.0f);
    CHECK(td::e4m3_to_f32(0x08) == 0x1p-6f);   // smallest normal
    CHECK(td::e4m3_to_f32(0x01) == 0x1p-9f);   // smallest subnormal
    CHECK(td::e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    CHECK(td::e4m3_to_f32(0xB8) == -1.0f);
    CHECK(std::isnan(td::e4m3_to_f32(0x7F)));
    CHECK(std::isnan(td::e4m3_to_f32(0xFF)));
    CHECK(std::signbit(td::e4m3_to_f32(0x80)));
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) == 0x7F) continue;
      const float v = td::e4m3_to_f32(static_cast<uint8_t>(c));
      CHECK_MESSAGE(td::f32_to_e4m3(v) == c, "code ", c);
      if (c < 0x7E) CHECK(td::e4m3_to_f32(static_cast<uint8_t>(c + 1)) > v);  // codes ascend with value
    }
  }

  TEST_CASE("e4m3: midpoints round to even, neighbours to nearest, saturation, NaN") {
    for (int c = 0; c < 0x7E; ++c) {
      const float lo = td::e4m3_to_f32(static_cast<uint8_t>(c)), hi = td::e4m3_to_f32(static_cast<uint8_t>(c + 1));
      const float mid = (lo + hi) / 2;  // exact in f32
      const int even = (c & 1) == 0 ? c : c + 1;
      CHECK_MESSAGE(td::f32_to_e4m3(mid) == even, "midpoint above code ", c);
      CHECK(td::f32_to_e4m3(-mid) == (0x80 | even));
      CHECK(td::f32_to_e4m3(std::nextafter(mid, 0.0f)) == c);
      CHECK(td::f32_to_e4m3(std::nextafter(mid, 1e9f)) == c + 1);
    }
    CHECK(td::f32_to_e4m3(448.0f) == 0x7E);
    CHECK(td::f32_to_e4m3(464.0f) == 0x7E);  // would round to 480 without saturation
    CHECK(td::f32_to_e4m3(1e30f) == 0x7E);
    CHECK(td::f32_to_e4m3(INFINITY) == 0x7E);
    CHECK(td::f32_to_e4m3(-INFINITY) == 0xFE);
    CHECK((td::f32_to_e4m3(std::nanf("")) & 0x7F) == 0x7F);
    CHECK(td::f32_to_e4m3(0x1p-10f) == 0x00);   // half the smallest subnormal: ties to even (0)
    CHECK(td::f32_to_e4m3(-0x1p-11f) == 0x80);  // signed zero
    CHECK(td::f32_to_e4m3(3 * 0x1p-10f) == 0x02);  // 1.5 * 2^-9: tie to the even code 2
  }

  TEST_CASE("e4m3: encoder equals the exhaustive nearest search on random and edge values") {
    td::Rng rng(1);
    for (int i = 0; i < 20000; ++i) {
      const float x = std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-14, 10)));
      REQUIRE_MESSAGE(td::f32_to_e4m3(x) == e4m3_nearest(x), "x = ", x);
    }
    for (uint32_t u = 0x3A800000u; u < 0x44000000u; u += 0x1357u) {  // 2^-10 .. 512, fine steps
      REQUIRE(td::f32_to_e4m3(from_bits(u)) == e4m3_nearest(from_bits(u)));
    }
  }

  TEST_CASE("bf16 and f16 encoders: exact round trips, ties to even, overflow") {
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      const float b = td::bf16_to_f32(static_cast<uint16_t>(h));
      if (!std::isnan(b)) REQUIRE(td::f32_to_bf16(b) == h);
      const float f = td::f16_to_f32(static_cast<uint16_t>(h));
      if (!std::isnan(f)) REQUIRE(td::f32_to_f16(f) == h);
    }
    CHECK(td::f32_to_bf16(from_bits(0x3F808000u)) == 0x3F80);  // tie, even stays
    CHECK(td::f32_to_bf16(from_bits(0x3F818000u)) == 0x3F82);  // tie, odd rounds up
    CHECK(td::f32_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
    CHECK(td::f32_to_f16(65520.0f) == 0x7C00);  // rounds past the max finite 65504: inf
    CHECK(td::f32_to_f16(65519.0f) == 0x7BFF);
    CHECK(td::f32_to_f16(0x1p-25f) == 0x0000);  // half the smallest subnormal: even (0)
    CHECK(td::f32_to_f16(0x1.8p-24f) == 0x0002);
#if defined(__FLT16_MAX__)
    td::Rng rng(2);
    for (int i = 0; i < 100000; ++i) {
      const float x = std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-30, 18)));
      _Float16 h = static_cast<_Float16>(x);
      uint16_t hb;
      std::memcpy(&hb, &h, 2);
      REQUIRE_MESSAGE(td::f32_to_f16(x) == hb, "x = ", x);
    }
#endif
  }

  TEST_CASE("fp8 scales: fp32 formula and ue8m0 rounding up to a power of two") {
    CHECK(ref::fp8_group_scale(448.0f, ScaleFmt::fp32) == 1.0f);
    CHECK(ref::fp8_group_scale(0.0f, ScaleFmt::fp32) == 1e-4f / 448.0f);
    CHECK(ref::fp8_group_scale(448.0f, ScaleFmt::ue8m0) == 1.0f);
    CHECK(ref::fp8_group_scale(449.0f, ScaleFmt::ue8m0) == 2.0f);
    CHECK(ref::fp8_group_scale(0.0f, ScaleFmt::ue8m0) == 0x1p-22f);  // 2.23e-7 -> 2^-22
    CHECK(ref::ue8m0_round_up(0x1p-100f) == 0x1p-100f);
    CHECK(ref::ue8m0_round_up(std::nextafter(0x1p-100f, 1.0f)) == 0x1p-99f);
    CHECK(ref::ue8m0_round_up(std::nextafter(0x1p-100f, 0.0f)) == 0x1p-100f);
    CHECK(std::isinf(ref::ue8m0_round_up(INFINITY)));
    CHECK(std::isinf(ref::ue8m0_round_up(std::numeric_limits<float>::max())));
    td::Rng rng(3);
    for (int i = 0; i < 100000; ++i) {
      const float amax = std::fabs(std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-20, 20))));
      const float s = ref::fp8_group_scale(amax, ScaleFmt::fp32);
      const float u = ref::fp8_group_scale(amax, ScaleFmt::ue8m0);
      REQUIRE(u == static_cast<float>(std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<double>(s)))))));
      REQUIRE(u >= s);
      REQUIRE(u < 2 * s);
    }
  }

  TEST_CASE("store kernel's division-free formulas equal the IEEE f32 divisions of the SPEC") {
    // kv_cache/kv_cache.cuh computes s = a / 448 and q = x / s without a division instruction (group_scale,
    // GroupQuantizer): q0 = x * r, rem = fma(-q0, d, x), q = fma(rem, r, q0) with r = RN(1/d), the
    // quotient taking x's sign bit. Here the same f32 operations on the host.
    auto markstein = [](float x, float d, float r) {
      const float q0 = x * r;
      const float rem = std::fma(-q0, d, x);
      const float q = std::fma(rem, r, q0);
      return from_bits((bits(q) & 0x7FFFFFFFu) | (bits(x) & 0x80000000u));
    };
    volatile float v448 = 448.0f;
    const float r448 = 1.0f / v448;
    CHECK(bits(r448) == 0x3B124925u);  // the constant the kernel uses
    td::Rng rng(4);
    for (int i = 0; i < 1000000; ++i) {  // s = a / 448 for a >= 1e-4 (exhaustively checked once too)
      const float a = std::fabs(std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-13, 127))));
      if (!(a >= 1e-4f) || std::isinf(a)) continue;
      volatile float va = a;
      REQUIRE_MESSAGE(bits(markstein(a, 448.0f, r448)) == bits(va / v448), "a = ", a);
    }
    for (int i = 0; i < 2000000; ++i) {  // q = x / s for every scale the store produces (s >= 2^-23)
      const float amax = std::fabs(std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-30, 60))));
      const float s = ref::fp8_group_scale(amax, ScaleFmt::fp32);
      const float x = (i % 3 == 0) ? std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-40, 60)))
                                   : amax * static_cast<float>(rng.uniform(-1000000, 1000000)) / 1000000.0f;
      volatile float vs = s, vx = x;
      const float q = markstein(x, s, 1.0f / vs);
      const float exact = vx / vs;
      if (std::fabs(exact) < 0x1p-12f) {  // subnormal inputs: both far below the smallest e4m3 step
        REQUIRE(td::f32_to_e4m3(q) == td::f32_to_e4m3(exact));
      } else {
        REQUIRE_MESSAGE(bits(q) == bits(exact), "x = ", x, " s = ", s);
      }
    }
    CHECK(bits(markstein(-0.0f, 3.0f, 1.0f / 3.0f)) == 0x80000000u);  // -0 / s keeps its sign
  }

  TEST_CASE("store kernel's fast path (finite bf16 group, fp32 scales) gives the general path's bits") {
    // kv_cache/kv_cache.cuh, KvStore::quantize_fast: group_scale_finite drops group_scale's inf test
    // and quotient_finite drops GroupQuantizer's sign fix-up (rem' = q0 * s - x, q = fma(-rem', r,
    // q0)). For every finite amax and finite x with |x| <= amax (x is in the group: |x / s| <= ~448,
    // so no overflow) both must give the same bits. Host f32 operations.
    auto general = [](float x, float s, float r) {  // GroupQuantizer<false>::operator()
      const float q0 = x * r;
      const float rem = std::fma(-q0, s, x);
      const float q = std::fma(rem, r, q0);
      return from_bits((bits(q) & 0x7FFFFFFFu) | (bits(x) & 0x80000000u));
    };
    auto fast = [](float x, float s, float r) {  // quotient_finite
      const float q0 = x * r;
      const float rem_neg = std::fma(q0, s, -x);
      return std::fma(-rem_neg, r, q0);
    };
    auto scale_finite = [](float amax) {  // group_scale_finite
      const float a = std::fmax(amax, 1e-4f);
      const float r448 = from_bits(0x3B124925u);
      const float q0 = a * r448;
      const float rem = std::fma(q0, -448.0f, a);
      return std::fma(rem, r448, q0);
    };
    auto bf16 = [](uint16_t h) { return td::bf16_to_f32(h); };
    td::Rng rng(5);
    // Edge magnitudes: zeros, the smallest subnormal, the largest finite, around 1e-4 * ..., and
    // random bf16 patterns across the whole finite range.
    const uint16_t edges[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0x38D1, 0x3F81};
    auto random_finite_bf16 = [&]() {
      for (;;) {
        const uint16_t h = static_cast<uint16_t>(rng.uniform(0, 65535));
        if ((h & 0x7F80u) != 0x7F80u) return h;
      }
    };
    int64_t checked = 0;
    for (int i = 0; i < 300000; ++i) {
      const uint16_t ha = i < 12 * 12 ? edges[i / 12] : random_finite_bf16();
      const float amax = std::fabs(bf16(ha));
      const float s = scale_finite(amax);
      REQUIRE(bits(s) == bits(ref::fp8_group_scale(amax, ScaleFmt::fp32)));
      volatile float vs = s;
      const float r = 1.0f / vs;
      for (int k = 0; k < 16; ++k) {
        // x a fraction of amax, or any finite bf16 with |x| <= amax.
        uint16_t hx = i < 12 * 12 ? edges[i % 12] : random_finite_bf16();
        if (k % 2 == 0 && amax > 0.0f) {
          const float frac = static_cast<float>(rng.uniform(-1000000, 1000000)) / 1000000.0f;
          hx = td::f32_to_bf16(amax * frac);
        }
        if (k == 15) hx = static_cast<uint16_t>(ha ^ 0x8000u);  // -amax
        const float x = bf16(hx);
        if (std::fabs(x) > amax) continue;
        ++checked;
        REQUIRE_MESSAGE(bits(fast(x, s, r)) == bits(general(x, s, r)), "x = ", x, " amax = ", amax);
      }
    }
    CHECK(checked > 2000000);
    CHECK(bits(fast(-0.0f, 3.0f, 1.0f / 3.0f)) == 0x80000000u);
    CHECK(bits(fast(0.0f, 3.0f, 1.0f / 3.0f)) == 0x00000000u);
  }

  TEST_CASE("reference store / gather: MHA fp8 round trip, dropped tokens, layer and kv placement") {
    PagedKVCacheParams c;
    c.dtype = DType::fp8_e4m3;
    c.num_heads = 2;
    c.head_size = 8;
    c.page_size = 4;
    c.is_mla = false;
    c.num_layers = 2;
    c.quantization_granularity = 4;
    KvCacheStoreParams sp{c, DType::f32, 128};
    td::Rng rng(5);
    auto batch = td::make_ragged_batch({3, 5}, {2, 0});
    // One page per sequence: positions 4.. of sequence 0 (token 2) and 4 of sequence 1 (token 7)
    // fall past the table.
    auto table = td::make_page_table(batch, c.page_size, rng, /*pages_per_seq=*/1);
    const auto xf = td::random_normal(8 * 2 * 8, rng);
    ref::HostPagedCache cache(c, table.num_blocks);
    const int64_t dropped = ref::kv_cache_store(sp, td::encode_all(DType::f32, xf), 8, batch.row_offsets,
                                                batch.cache_lengths, table.lut, 1, /*layer*/ 1, /*kv*/ 1, cache);
    CHECK(dropped == 2);
    // Token 0 (sequence 0, position 2) in block lut[0][0], offset 2, kv 1, layer 1.
    const int64_t r = cache.row(table.at(0, 0), 1, 1, 2);
    CHECK(r == ((int64_t(table.at(0, 0)) * 2 + 1) * 2 + 1) * 4 + 2);
    for (int e = 0; e < 16; ++e) {
      const float s = cache.row_scales(r)[e / 4];
      const float y = td::e4m3_to_f32(cache.row_data(r)[e]) * s;
      CHECK(std::fabs(y - xf[e]) <= s * 16.0f);  // |x / s| <= 448: e4m3 step there is <= 32 / 2
    }
    KvCacheGatherParams gp{c, DType::f32, 128};
    std::vector<uint8_t> y;
    const int64_t missing = ref::kv_cache_gather(gp, cache, table.lut, 2, 1, {0, 1, 0, 2}, {2, 3, 4, 0}, 1, 1, y);
    CHECK(missing == 2);  // position 4 is past the one-page table; batch id 2 does not exist
    std::vector<float> yf(y.size() / 4);
    std::memcpy(yf.data(), y.data(), y.size());
    for (int e = 0; e < 16; ++e) CHECK(yf[e] == td::e4m3_to_f32(cache.row_data(r)[e]) * cache.row_scales(r)[e / 4]);
    for (int e = 32; e < 64; ++e) CHECK(std::isnan(yf[e]));
  }

  TEST_CASE("reference sparse_index_remap: negative, past the table, block >= num_blocks, no sequence") {
    // Two sequences: tokens 0-1 and 2; page size 4, two pages each.
    const std::vector<uint32_t> off = {0, 2, 3};
    const std::vector<uint32_t> lut = {7, 2, 5, 9};  // block 9 >= num_blocks 8
    const std::vector<int32_t> idx = {0, 5, -1, 8,   //
                                      3, 4, 7, 1,    //
                                      1, 6, 2, -5,   //
                                      0, 0, 0, 0};   // token 3: outside every sequence
    const auto out = ref::sparse_index_remap(4, idx, 4, 4, off, lut, 2, 8);
    const std::vector<int32_t> want = {28, 9, -1, -1,  //
                                       31, 8, 11, 29,  //
                                       21, -1, 22, -1,  //
                                       -1, -1, -1, -1};
    CHECK(out == want);
  }

  TEST_CASE("generated source: one extern C entry with the params baked in") {
    KvCacheStoreParams sp;
    sp.cache.dtype = DType::fp8_e4m3;
    sp.cache.num_heads = 8;
    sp.cache.head_size = 128;
    sp.cache.is_mla = false;
    sp.cache.num_layers = 3;
    sp.cache.scale_fmt = ScaleFmt::ue8m0;
    auto src = generate(KernelSpec{sp});
    REQUIRE(src.entries.size() == 1);
    CHECK(src.entries[0].symbol == "kv_cache_store");
    CHECK(src.entries[0].threads == 128);
    CHECK(src.code.find("mj::kv::KvStore<mj::Bf16, mj::E4m3, /*num_heads*/ 8, /*head_size*/ 128, /*page_size*/ 64, "
                        "/*num_layers*/ 3, /*kv_dim*/ 2, /*quantization_granularity*/ 128, /*ue8m0*/ true, /*threads*/ 128>") !=
          std::string::npos);
    CHECK(src.code.find("extern \"C\" __global__ void __launch_bounds__(128) kv_cache_store(") != std::string::npos);
    CHECK(generate(KernelSpec{sp}).code == src.code);  // deterministic
    KvCacheGatherParams gp;
    gp.output_dtype = DType::f32;
    CHECK(generate(KernelSpec{gp}).code.find("mj::kv::KvGather<mj::Bf16, mj::F32,") != std::string::npos);
    SparseIndexRemapParams rp;
    rp.page_size = 32;
    CHECK(generate(KernelSpec{rp}).code.find("SparseIndexRemap</*page_size*/ 32, /*threads*/ 256>") !=
          std::string::npos);
  }
}

TEST_SUITE("kv_cache op validation") {
  // A valid MLA fp8 store call's views over fake (never dereferenced) pointers; each case breaks one.
  struct StoreCall {
    KvCacheStoreParams p;
    TensorView x, offsets, dropped;
    ops::PagedCacheView cache;
    int layer = 1, kv = 0;
    alignas(256) static inline char fake[256];
    StoreCall() {
      p.cache.dtype = DType::fp8_e4m3;
      p.cache.num_heads = 1;
      p.cache.head_size = 576;
      p.cache.page_size = 64;
      p.cache.num_layers = 2;
      p.cache.quantization_granularity = 64;
      void* ptr = fake;
      x = TensorView(ptr, DType::bf16, {10, 1, 576});
      offsets = TensorView(ptr, DType::u32, {3});
      dropped = TensorView(ptr, DType::u32, {1});
      cache.blocks = TensorView(ptr, DType::fp8_e4m3, {5, 1, 2, 64, 1, 576});
      cache.scales = TensorView(ptr, DType::f32, {5, 1, 2, 64, 1, 9});
      cache.lookup_table = TensorView(ptr, DType::u32, {2, 3});
      cache.cache_lengths = TensorView(ptr, DType::u32, {2});
    }
    std::string run() {
      return invalid_message([&] { ops::kv_cache_store(p, x, offsets, cache, layer, kv, dropped); });
    }
  };

  TEST_CASE("kv_cache_store rejects each bad argument by name") {
    auto has = [](const std::string& msg, const char* what) {
      CHECK_MESSAGE(msg.find(what) != std::string::npos, "message: ", msg, " lacks: ", what);
    };
    { StoreCall c; c.x.dtype = DType::f16; has(c.run(), "x dtype"); }
    { StoreCall c; c.x = TensorView(c.fake, DType::bf16, {10, 576}); has(c.run(), "x rank"); }
    { StoreCall c; c.x = TensorView(c.fake, DType::bf16, {10, 1, 512}); has(c.run(), "x dim 2"); }
    { StoreCall c; c.x.strides[0] = 1000; has(c.run(), "x layout"); }
    { StoreCall c; c.x.data = c.fake + 2; has(c.run(), "x address"); }
    { StoreCall c; c.offsets = TensorView(c.fake, DType::u32, {2}); has(c.run(), "input_row_offsets dim 0"); }
    { StoreCall c; c.offsets.dtype = DType::i32; has(c.run(), "input_row_offsets dtype"); }
    { StoreCall c; c.cache.cache_lengths = TensorView(c.fake, DType::u32, {3}); has(c.run(), "cache.cache_lengths dim 0"); }
    { StoreCall c; c.cache.lookup_table = TensorView(c.fake, DType::u32, {6}); has(c.run(), "lookup_table rank"); }
    { StoreCall c; c.cache.blocks.dtype = DType::bf16; has(c.run(), "cache.blocks dtype"); }
    { StoreCall c; c.cache.blocks = TensorView(c.fake, DType::fp8_e4m3, {5, 2, 2, 64, 1, 576}); has(c.run(), "cache.blocks dim 1"); }
    { StoreCall c; c.cache.blocks = TensorView(c.fake, DType::fp8_e4m3, {5, 1, 3, 64, 1, 576}); has(c.run(), "cache.blocks dim 2"); }
    { StoreCall c; c.cache.blocks = TensorView(c.fake, DType::fp8_e4m3, {5, 1, 2, 32, 1, 576}); has(c.run(), "cache.blocks dim 3"); }
    { StoreCall c; c.cache.scales = TensorView(c.fake, DType::f32, {5, 1, 2, 64, 1, 1}); has(c.run(), "cache.scales dim 5"); }
    { StoreCall c; c.cache.scales = TensorView(c.fake, DType::f32, {4, 1, 2, 64, 1, 9}); has(c.run(), "cache.scales dim 0"); }
    { StoreCall c; c.cache.scales = TensorView(); has(c.run(), "cache.scales"); }
    { StoreCall c; c.layer = 2; has(c.run(), "layer_idx"); }
    { StoreCall c; c.kv = 1; has(c.run(), "kv_idx"); }
    { StoreCall c; c.dropped = TensorView(c.fake, DType::u32, {2}); has(c.run(), "dropped dim 0"); }
    { StoreCall c; c.p.threads = 100; has(c.run(), "params.threads"); }
    { StoreCall c; c.p.input_dtype = DType::fp8_e4m3; has(c.run(), "params.input_dtype"); }
    {
      StoreCall c;  // a bf16 cache takes no scales
      c.p.cache.dtype = DType::bf16;
      c.p.cache.quantization_granularity = 0;
      c.cache.blocks.dtype = DType::bf16;
      has(c.run(), "cache.scales");
    }
  }

  TEST_CASE("kv_cache_gather and sparse_index_remap reject bad arguments by name") {
    StoreCall s;
    KvCacheGatherParams gp{s.p.cache, DType::bf16, 128};
    TensorView y(s.fake, DType::bf16, {4, 1, 576}), ids(s.fake, DType::u32, {4}), pos(s.fake, DType::u32, {4});
    auto gather = [&](const TensorView& yy, const TensorView& ii, const TensorView& pp) {
      return invalid_message([&] { ops::kv_cache_gather(gp, s.cache, ii, pp, 0, 0, yy, TensorView()); });
    };
    CHECK(gather(TensorView(s.fake, DType::f16, {4, 1, 576}), ids, pos).find("y dtype") != std::string::npos);
    CHECK(gather(TensorView(s.fake, DType::bf16, {4, 2, 576}), ids, pos).find("y dim 1") != std::string::npos);
    CHECK(gather(y, TensorView(s.fake, DType::u32, {3}), pos).find("batch_ids dim 0") != std::string::npos);
    CHECK(gather(y, ids, TensorView(s.fake, DType::i32, {4})).find("positions dtype") != std::string::npos);

    SparseIndexRemapParams rp;
    TensorView idx(s.fake, DType::i32, {4, 16}), out(s.fake, DType::i32, {4, 16});
    TensorView off(s.fake, DType::u32, {3}), lut(s.fake, DType::u32, {2, 3});
    auto remap = [&](const TensorView& i, const TensorView& o, int64_t nb) {
      return invalid_message([&] { ops::sparse_index_remap(rp, i, off, lut, nb, o); });
    };
    CHECK(remap(TensorView(s.fake, DType::u32, {4, 16}), out, 8).find("indices dtype") != std::string::npos);
    CHECK(remap(idx, TensorView(s.fake, DType::i32, {4, 8}), 8).find("out dim 1") != std::string::npos);
    CHECK(remap(idx, out, (int64_t{1} << 31) / 64 + 1).find("num_blocks") != std::string::npos);
    CHECK(remap(idx, out, -1).find("num_blocks") != std::string::npos);
  }
}

// ---- layout fp8_ds_mla --------------------------------------------------------------------------
// The expected records below are built by hand from the published layout (FlashMLA's
// V32_FP8Sparse): e4m3 values from the format's definition (not the testdata codec), the tile
// scale as the smallest power of two 2^k >= max(amax / 448, 1e-4) found by comparing amax with
// 448 * 2^k exactly in double, quotients x / 2^k exact in double, bf16 rope bytes copied.
namespace {

// OCP e4m3fn by definition: bias 7, 3 mantissa bits, exponent field 0 = subnormal, S.1111.111 = NaN.
double e4m3_value_by_hand(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}

// Nearest finite e4m3 code to v (exact double), ties to the even code, saturating at 448.
uint8_t e4m3_by_hand(double v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(v);
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double err = std::fabs(e4m3_value_by_hand(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

uint16_t bf16_bits(float f) {  // f must be a bf16 value
  uint32_t u = bits(f);
  return static_cast<uint16_t>(u >> 16);
}

// The layout's tile scale: the smallest 2^k (k >= -13, since 1e-4 lies in (2^-14, 2^-13]) with
// amax <= 448 * 2^k.
float tile_scale_by_hand(double amax) {
  if (std::isinf(amax)) return INFINITY;
  int k = -13;
  while (amax > 448.0 * std::ldexp(1.0, k)) ++k;
  return static_cast<float>(std::ldexp(1.0, k));
}

// The 656-byte record of one token row x[576] (bf16 values, held as floats).
std::vector<uint8_t> record_by_hand(const std::vector<float>& x) {
  std::vector<uint8_t> rec(656, 0);
  for (int tile = 0; tile < 4; ++tile) {
    double amax = 0;
    for (int d = tile * 128; d < tile * 128 + 128; ++d)
      if (!std::isnan(x[d])) amax = std::max(amax, std::fabs(static_cast<double>(x[d])));
    const float s = tile_scale_by_hand(amax);
    std::memcpy(rec.data() + 512 + 4 * tile, &s, 4);
    for (int d = tile * 128; d < tile * 128 + 128; ++d) {
      const double q = std::isinf(s) ? (std::isinf(x[d]) ? std::nan("") : std::copysign(0.0, x[d]))
                                     : static_cast<double>(x[d]) / s;
      rec[d] = e4m3_by_hand(q);
    }
  }
  for (int i = 0; i < 64; ++i) {
    const uint16_t h = bf16_bits(x[512 + i]);
    rec[528 + 2 * i] = static_cast<uint8_t>(h & 0xFF);
    rec[528 + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return rec;
}

PagedKVCacheParams ds_mla_params(int num_layers = 1, int page_size = 4) {
  PagedKVCacheParams c;
  c.dtype = DType::fp8_e4m3;
  c.num_heads = 1;
  c.head_size = 576;
  c.page_size = page_size;
  c.is_mla = true;
  c.num_layers = num_layers;
  c.quantization_granularity = 128;
  c.scale_fmt = ScaleFmt::ue8m0;
  c.layout = CacheLayout::fp8_ds_mla;
  return c;
}

float to_bf16_value(float f) { return td::bf16_to_f32(td::f32_to_bf16(f)); }

}  // namespace

TEST_SUITE("kv_cache layout fp8_ds_mla") {
  TEST_CASE("tile scale: 2^ceil(log2(max(amax / 448, 1e-4))) exactly, powers of two kept") {
    CHECK(ref::ds_mla_tile_scale(0.0f) == 0x1p-13f);         // clamp: 1e-4 -> 2^-13
    CHECK(ref::ds_mla_tile_scale(448.0f * 0x1p-13f) == 0x1p-13f);
    CHECK(ref::ds_mla_tile_scale(0.01f) == 0x1p-13f);        // 0.01 / 448 = 2.2e-5 < 1e-4
    CHECK(ref::ds_mla_tile_scale(448.0f) == 1.0f);           // exact power of two stays
    CHECK(ref::ds_mla_tile_scale(56.0f) == 0.125f);
    CHECK(ref::ds_mla_tile_scale(std::nextafter(448.0f, 1e9f)) == 2.0f);  // one ulp above: next power
    CHECK(ref::ds_mla_tile_scale(std::nextafter(448.0f, 0.0f)) == 1.0f);
    CHECK(ref::ds_mla_tile_scale(3.0e38f) == 0x1p120f);
    CHECK(std::isinf(ref::ds_mla_tile_scale(INFINITY)));
    // Every f32 amax: the frexp form of 2^ceil(log2(max(RN(amax / 448), 1e-4f))). The double
    // quotient rounded to f32 is RN(amax / 448): a quotient by 7 * 64 never lies on an f32
    // midpoint after its double rounding (its binary expansion repeats with period 3).
    td::Rng rng(7);
    for (int i = 0; i < 200000; ++i) {
      const float amax = std::fabs(std::ldexp(rng.normal(), static_cast<int>(rng.uniform(-30, 100))));
      const float s0 = std::max(static_cast<float>(static_cast<double>(amax) / 448.0), 1e-4f);
      int e;
      const double m = std::frexp(static_cast<double>(s0), &e);  // s0 = m * 2^e, m in [0.5, 1)
      const float want = static_cast<float>(std::ldexp(1.0, m == 0.5 ? e - 1 : e));
      REQUIRE_MESSAGE(ref::ds_mla_tile_scale(amax) == want, "amax = ", amax);
      if (i < 20000) REQUIRE(ref::ds_mla_tile_scale(amax) == tile_scale_by_hand(amax));
    }
  }

  TEST_CASE("reference store writes the published record: bytes equal records built by hand") {
    const PagedKVCacheParams c = ds_mla_params(/*num_layers*/ 2, /*page_size*/ 4);
    td::Rng rng(11);
    const int T = 6;
    std::vector<float> x(static_cast<size_t>(T) * 576);
    for (auto& v : x) v = to_bf16_value(rng.normal(1.5f));
    auto tok = [&](int t) { return x.data() + static_cast<size_t>(t) * 576; };
    // Token 0: tile 1 all zero (with a -0), tile 2 with amax 56 = 448 * 2^-3 (scale exactly 2^-3,
    // the amax element encodes to 448), tile 3 tiny (amax / 448 < 1e-4: scale 2^-13).
    for (int d = 128; d < 256; ++d) tok(0)[d] = 0.0f;
    tok(0)[130] = -0.0f;
    for (int d = 256; d < 384; ++d) tok(0)[d] = to_bf16_value(std::fmod(tok(0)[d], 50.0f));
    tok(0)[300] = 56.0f;
    tok(0)[301] = -56.0f;
    for (int d = 384; d < 512; ++d) tok(0)[d] = to_bf16_value(tok(0)[d] * 0.004f);
    // Token 1: amax one bf16 step above 448 * 2^-3 (56.25: scale 2^-2); negative rope values.
    for (int d = 0; d < 128; ++d) tok(1)[d] = to_bf16_value(std::fmod(tok(1)[d], 40.0f));
    tok(1)[5] = -56.25f;
    for (int d = 512; d < 576; ++d) tok(1)[d] = -std::fabs(tok(1)[d]);
    // Token 2: a NaN in tile 0 (ignored by the amax, encoded as NaN), large values in tile 3.
    tok(2)[7] = std::nanf("");
    for (int d = 384; d < 512; ++d) tok(2)[d] = to_bf16_value(tok(2)[d] * 1e20f);
    // Token 3: an infinity in tile 1: inf scale, the tile's finite values +-0, the inf NaN.
    tok(3)[200] = -INFINITY;
    // Token 4: every tile's amax exactly 448 * 2^k for k = -13, -1, 0, 7.
    const float amax4[4] = {448.0f * 0x1p-13f, 224.0f, 448.0f, 448.0f * 128.0f};
    for (int tile = 0; tile < 4; ++tile) {
      for (int d = tile * 128; d < tile * 128 + 128; ++d)
        tok(4)[d] = to_bf16_value(std::fmod(tok(4)[d], 1.0f) * amax4[tile] * 0.99f);
      tok(4)[tile * 128 + 17] = -amax4[tile];
    }
    // Token 5: bf16 rope bit patterns kept verbatim, including subnormals and -0.
    tok(5)[512] = -0.0f;
    tok(5)[513] = td::bf16_to_f32(0x0001);
    tok(5)[514] = td::bf16_to_f32(0x807F);

    // Two sequences: tokens 0..2 at positions 1..3 of seq 0, tokens 3..5 at 4..6 of seq 1.
    const std::vector<uint32_t> off = {0, 3, 6}, lens = {1, 4};
    const std::vector<uint32_t> lut = {3, 0, 1, 2};  // 2 pages per sequence
    ref::HostPagedCache cache(c, 4);
    CHECK(cache.row_bytes() == 656);
    CHECK(cache.scales.empty());
    std::fill(cache.blocks.begin(), cache.blocks.end(), uint8_t{0xA5});
    KvCacheStoreParams sp{c, DType::bf16, 128};
    const int64_t dropped =
        ref::kv_cache_store(sp, td::encode_all(DType::bf16, x), T, off, lens, lut, 2, /*layer*/ 1, /*kv*/ 0, cache);
    CHECK(dropped == 0);
    const uint32_t where[T][2] = {{3, 1}, {3, 2}, {3, 3}, {2, 0}, {2, 1}, {2, 2}};  // block, offset
    for (int t = 0; t < T; ++t) {
      INFO("token ", t);
      const int64_t r = cache.row(where[t][0], 0, 1, where[t][1]);
      CHECK(r == (int64_t(where[t][0]) * 2 + 1) * 4 + where[t][1]);
      const std::vector<float> row(tok(t), tok(t) + 576);
      const auto want = record_by_hand(row);
      const uint8_t* got = cache.row_data(r);
      for (int i = 0; i < 656; ++i) {
        if (i < 512 && std::isnan(row[i])) {  // NaN input: a NaN code (sign not specified)
          CHECK((got[i] & 0x7F) == 0x7F);
          continue;
        }
        if (i < 512 && t == 3 && i == 200) {  // -inf / inf scale: NaN
          CHECK((got[i] & 0x7F) == 0x7F);
          continue;
        }
        REQUIRE_MESSAGE(got[i] == want[i], "byte ", i, ": got ", int(got[i]), ", want ", int(want[i]));
      }
    }
    // Spot checks of the hand-built records themselves.
    const auto r0 = record_by_hand(std::vector<float>(tok(0), tok(0) + 576));
    float s[4];
    std::memcpy(s, r0.data() + 512, 16);
    CHECK(s[1] == 0x1p-13f);
    CHECK(s[2] == 0.125f);
    CHECK(s[3] == 0x1p-13f);
    CHECK(r0[130] == 0x80);  // -0
    CHECK(r0[300] == 0x7E);  // 56 / 2^-3 = 448
    CHECK(r0[301] == 0xFE);
    const auto r1 = record_by_hand(std::vector<float>(tok(1), tok(1) + 576));
    std::memcpy(s, r1.data() + 512, 4);
    CHECK(s[0] == 0.25f);
    const auto r3 = record_by_hand(std::vector<float>(tok(3), tok(3) + 576));
    std::memcpy(s, r3.data() + 512, 16);
    CHECK(std::isinf(s[1]));
    // Rows of the other layer and the unused slots are untouched.
    for (int64_t r = 0; r < 4 * 2 * 4; ++r) {
      const bool written = (r == cache.row(3, 0, 1, 1) || r == cache.row(3, 0, 1, 2) || r == cache.row(3, 0, 1, 3) ||
                            r == cache.row(2, 0, 1, 0) || r == cache.row(2, 0, 1, 1) || r == cache.row(2, 0, 1, 2));
      if (!written)
        for (size_t i = 0; i < 656; ++i) REQUIRE(cache.row_data(r)[i] == 0xA5);
    }
  }

  TEST_CASE("reference store from f16 and f32: the rope rounded to nearest bf16, same nope bytes") {
    const PagedKVCacheParams c = ds_mla_params();
    td::Rng rng(12);
    std::vector<float> x(576);
    for (auto& v : x) v = rng.normal(3.0f);
    x[520] = from_bits(0x3F808000u);  // a tie: rounds to even 0x3F80
    x[521] = from_bits(0x3F818000u);  // a tie: rounds up to 0x3F82
    const std::vector<uint32_t> off = {0, 1}, lens = {0}, lut = {0};
    for (DType in : {DType::f32, DType::f16}) {
      INFO(dtype_name(in));
      const auto enc = td::encode_all(in, x);
      std::vector<float> xin(576);  // the input's values
      for (int d = 0; d < 576; ++d) xin[d] = td::decode(in, enc.data() + d * dtype_size(in));
      ref::HostPagedCache cache(c, 1);
      KvCacheStoreParams sp{c, in, 128};
      CHECK(ref::kv_cache_store(sp, enc, 1, off, lens, lut, 1, 0, 0, cache) == 0);
      const uint8_t* got = cache.row_data(0);
      for (int tile = 0; tile < 4; ++tile) {
        double amax = 0;
        for (int d = tile * 128; d < tile * 128 + 128; ++d) amax = std::max(amax, std::fabs(double(xin[d])));
        const float s = tile_scale_by_hand(amax);
        float got_s;
        std::memcpy(&got_s, got + 512 + 4 * tile, 4);
        CHECK(got_s == s);
        for (int d = tile * 128; d < tile * 128 + 128; ++d) REQUIRE(got[d] == e4m3_by_hand(double(xin[d]) / s));
      }
      for (int i = 0; i < 64; ++i) {
        // Round to nearest even on the f32 bits, by hand.
        const uint32_t u = bits(xin[512 + i]);
        const uint16_t want = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        const uint16_t g = static_cast<uint16_t>(got[528 + 2 * i] | (got[528 + 2 * i + 1] << 8));
        REQUIRE_MESSAGE(g == want, "rope dim ", i);
      }
      if (in == DType::f32) {
        CHECK(got[528 + 2 * 8 + 1] == 0x3F);
        CHECK(got[528 + 2 * 8] == 0x80);
        CHECK(got[528 + 2 * 9] == 0x82);
      }
    }
  }

  TEST_CASE("reference gather of records: e4m3 * scale rounded once, the bf16 rope converted") {
    const PagedKVCacheParams c = ds_mla_params(1, 2);
    ref::HostPagedCache cache(c, 2);
    td::Rng rng(13);
    for (auto& b : cache.blocks) b = static_cast<uint8_t>(static_cast<uint8_t>(rng.uniform(0, 255)) & 0xF7);  // no NaN codes
    // Scales and rope of the gathered row (block 1, offset 1) set by hand.
    const int64_t r1 = cache.row(1, 0, 0, 1);
    const float sc[4] = {0x1p-13f, 0.5f, 3.0f, 0x1p20f};
    std::memcpy(cache.row_data(r1) + 512, sc, 16);
    for (int i = 0; i < 64; ++i) {
      const uint16_t h = static_cast<uint16_t>(0x3F80 + i * 3 - 90);
      std::memcpy(cache.row_data(r1) + 528 + 2 * i, &h, 2);
    }
    const std::vector<uint32_t> lut = {1, 0};  // seq 0: page 0 -> block 1, page 1 -> block 0
    for (DType out : {DType::bf16, DType::f32}) {
      KvCacheGatherParams gp{c, out, 128};
      std::vector<uint8_t> y;
      CHECK(ref::kv_cache_gather(gp, cache, lut, 1, 2, {0, 0, 1}, {1, 9, 0}, 0, 0, y) == 2);
      const uint8_t* rec = cache.row_data(r1);
      for (int d = 0; d < 576; ++d) {
        double want;
        if (d < 512) {
          want = e4m3_value_by_hand(rec[d]) * sc[d / 128];  // exact in double; one rounding below
        } else {
          uint16_t h;
          std::memcpy(&h, rec + 528 + 2 * (d - 512), 2);
          want = td::bf16_to_f32(h);
        }
        const float wf = static_cast<float>(want);  // the f32 product
        const float g = td::decode(out, y.data() + d * dtype_size(out));
        REQUIRE_MESSAGE(bits(g) == bits(out == DType::f32 ? wf : to_bf16_value(wf)), "dim ", d);
      }
      for (int d = 576; d < 3 * 576; ++d) CHECK(std::isnan(td::decode(out, y.data() + d * dtype_size(out))));
    }
  }

  TEST_CASE("params: fp8_ds_mla requirements, each refusal naming the param; JSON and names") {
    auto msg = [](const PagedKVCacheParams& c) { return invalid_message([&] { c.validate("params"); }); };
    auto has = [](const std::string& m, const char* what) {
      CHECK_MESSAGE(m.find(what) != std::string::npos, "message: ", m, " lacks: ", what);
    };
    CHECK(msg(ds_mla_params()).empty());
    { auto c = ds_mla_params(); c.quantization_granularity = 0; CHECK(msg(c).empty()); CHECK(c.resolved_quantization_granularity() == 128); }
    { auto c = ds_mla_params(); c.dtype = DType::bf16; const auto m = msg(c); has(m, "params.dtype"); has(m, "bf16"); has(m, "fp8_e4m3"); }
    { auto c = ds_mla_params(); c.num_heads = 2; const auto m = msg(c); has(m, "params.num_heads"); has(m, "got 2"); has(m, "fp8_ds_mla"); }
    { auto c = ds_mla_params(); c.head_size = 512; const auto m = msg(c); has(m, "params.head_size"); has(m, "got 512"); has(m, "576"); }
    { auto c = ds_mla_params(); c.is_mla = false; const auto m = msg(c); has(m, "params.is_mla"); has(m, "got false"); }
    { auto c = ds_mla_params(); c.quantization_granularity = 64; const auto m = msg(c); has(m, "params.quantization_granularity"); has(m, "got 64"); has(m, "128"); }
    { auto c = ds_mla_params(); c.quantization_granularity = 576; has(msg(c), "params.quantization_granularity"); }
    { auto c = ds_mla_params(); c.scale_fmt = ScaleFmt::fp32; const auto m = msg(c); has(m, "params.scale_fmt"); has(m, "got fp32"); has(m, "ue8m0"); }

    // JSON: "layout" is read, written only when not split, and a bad value names the field.
    KvCacheStoreParams sp{ds_mla_params(61, 64), DType::bf16, 0};
    const KernelSpec spec{sp};
    CHECK(to_json(spec)["params"]["layout"] == "fp8_ds_mla");
    CHECK(kernel_spec_from_json(to_json(spec)) == spec);
    CHECK(spec.name() == "kv_cache_store_mla_fp8_e4m3_h1_d576_p64_g128_ue8m0_ds_mla_l61_from_bf16");
    KvCacheStoreParams split = sp;
    split.cache.layout = CacheLayout::split;
    CHECK(to_json(KernelSpec{split})["params"].count("layout") == 0);
    CHECK(KernelSpec{split}.name() == "kv_cache_store_mla_fp8_e4m3_h1_d576_p64_g128_ue8m0_l61_from_bf16");
    CHECK(!(KernelSpec{split} == spec));
    CHECK(KernelSpec{split}.canonical() != spec.canonical());
    auto j = to_json(KernelSpec{split});
    j["params"]["layout"] = "split";
    CHECK(kernel_spec_from_json(j) == KernelSpec{split});
    j["params"]["layout"] = "fp8_ds";
    const auto m = invalid_message([&] { kernel_spec_from_json(j); });
    has(m, "params.layout");
    has(m, "\"fp8_ds\"");
    has(m, "split | fp8_ds_mla");
    j["params"]["layout"] = "fp8_ds_mla";
    j["params"]["scale_fmt"] = "fp32";
    has(invalid_message([&] { kernel_spec_from_json(j); }), "kernel.params.scale_fmt");
    KvCacheGatherParams gp{ds_mla_params(), DType::f32, 0};
    CHECK(KernelSpec{gp}.name() == "kv_cache_gather_mla_fp8_e4m3_h1_d576_p4_g128_ue8m0_ds_mla_to_f32");
  }

  TEST_CASE("generated sources: the record kernels for fp8_ds_mla, split sources without the layout") {
    KvCacheStoreParams sp{ds_mla_params(61, 64), DType::f16, 0};
    const auto src = generate(KernelSpec{sp});
    CHECK(src.code.find("mj::kv::KvStoreDsMla<mj::F16, /*page_size*/ 64, /*num_layers*/ 61, /*threads*/ 128>") !=
          std::string::npos);
    CHECK(src.code.find("\"layout\":\"fp8_ds_mla\"") != std::string::npos);
    KvCacheGatherParams gp{ds_mla_params(2, 16), DType::bf16, 256};
    CHECK(generate(KernelSpec{gp}).code.find("mj::kv::KvGatherDsMla<mj::Bf16, /*page_size*/ 16, /*num_layers*/ 2, "
                                             "/*threads*/ 256>") != std::string::npos);
    KvCacheStoreParams split = sp;
    split.cache.layout = CacheLayout::split;
    const auto s2 = generate(KernelSpec{split});
    CHECK(s2.code.find("layout") == std::string::npos);
    CHECK(s2.code.find("DsMla") == std::string::npos);
  }

  TEST_CASE("kv_cache_store / kv_cache_gather views for fp8_ds_mla: records in u8 blocks, no scales") {
    alignas(256) static char fake[256];
    void* ptr = fake;
    KvCacheStoreParams sp{ds_mla_params(2, 64), DType::bf16, 0};
    TensorView x(ptr, DType::bf16, {10, 1, 576}), off(ptr, DType::u32, {3}), dropped(ptr, DType::u32, {1});
    ops::PagedCacheView cache;
    cache.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 656});
    cache.lookup_table = TensorView(ptr, DType::u32, {2, 3});
    cache.cache_lengths = TensorView(ptr, DType::u32, {2});
    auto store = [&](const ops::PagedCacheView& v) {
      return invalid_message([&] { ops::kv_cache_store(sp, x, off, v, 1, 0, dropped); });
    };
    auto has = [](const std::string& m, const char* what) {
      CHECK_MESSAGE(m.find(what) != std::string::npos, "message: ", m, " lacks: ", what);
    };
    { auto v = cache; v.scales = TensorView(ptr, DType::f32, {5, 1, 2, 64, 1, 5}); const auto m = store(v); has(m, "cache.scales"); has(m, "fp8_ds_mla"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 655}); const auto m = store(v); has(m, "cache.blocks dim 4"); has(m, "656"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 1, 3, 64, 656}); has(store(v), "cache.blocks dim 2"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 32, 656}); has(store(v), "cache.blocks dim 3"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 2, 2, 64, 656}); has(store(v), "cache.blocks dim 1"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::bf16, {5, 1, 2, 64, 656}); const auto m = store(v); has(m, "cache.blocks dtype"); has(m, "u8"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 1, 576}); has(store(v), "cache.blocks rank"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5 * 64, 656}); has(store(v), "cache.blocks rank"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 64, 656}); has(store(v), "cache.blocks rank"); }  // 2 layers
    { auto v = cache; v.blocks.data = fake + 8; has(store(v), "cache.blocks address"); }
    { auto xx = TensorView(fake + 8, DType::bf16, {10, 1, 576}); has(invalid_message([&] { ops::kv_cache_store(sp, xx, off, cache, 1, 0, dropped); }), "x address"); }
    has(invalid_message([&] { ops::kv_cache_store(sp, x, off, cache, 0, 1, dropped); }), "kv_idx");
    // One layer: [num_blocks, page_size, 656] and [num_blocks, page_size, 1, 656] (and fp8_e4m3
    // bytes) pass the blocks checks: the first refusal is the layer_idx checked after them.
    KvCacheGatherParams gp{ds_mla_params(1, 64), DType::bf16, 0};
    TensorView y(ptr, DType::bf16, {4, 1, 576}), ids(ptr, DType::u32, {4}), pos(ptr, DType::u32, {4});
    for (const TensorView& b : {TensorView(ptr, DType::u8, {5, 64, 656}), TensorView(ptr, DType::u8, {5, 64, 1, 656}),
                                TensorView(ptr, DType::fp8_e4m3, {5, 1, 1, 64, 656})}) {
      auto v = cache;
      v.blocks = b;
      const auto m = invalid_message([&] { ops::kv_cache_gather(gp, v, ids, pos, /*layer*/ 1, 0, y, TensorView()); });
      CHECK_MESSAGE(m.rfind("layer_idx", 0) == 0, m);
    }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 64, 2, 656}); has(invalid_message([&] { ops::kv_cache_gather(gp, v, ids, pos, 0, 0, y, TensorView()); }), "cache.blocks dim 2"); }
  }

  TEST_CASE("fp8_page_scales (the engines' indexer K pages): params, JSON, names, sources, views, the host pages") {
    auto has = [](const std::string& m, const char* what) {
      CHECK_MESSAGE(m.find(what) != std::string::npos, "message: ", m, " lacks: ", what);
    };
    PagedKVCacheParams c;
    c.dtype = DType::fp8_e4m3;
    c.num_heads = 1;
    c.head_size = 128;
    c.page_size = 64;
    c.num_layers = 2;
    c.quantization_granularity = 128;
    c.scale_fmt = ScaleFmt::ue8m0;
    c.layout = CacheLayout::fp8_page_scales;
    auto msg = [](const PagedKVCacheParams& q) { return invalid_message([&] { q.validate("params"); }); };
    CHECK(msg(c).empty());
    CHECK(c.row_bytes() == 132);
    { auto q = c; q.scale_fmt = ScaleFmt::fp32; CHECK(msg(q).empty()); }
    { auto q = c; q.quantization_granularity = 0; CHECK(msg(q).empty()); }
    { auto q = c; q.head_size = 576; const auto m = msg(q); has(m, "params.head_size"); has(m, "fp8_page_scales"); }
    { auto q = c; q.page_size = 16; const auto m = msg(q); has(m, "params.page_size"); has(m, "multiple of 32"); }
    { auto q = c; q.dtype = DType::bf16; has(msg(q), "params.dtype"); }
    { auto q = c; q.num_heads = 2; has(msg(q), "params.num_heads"); }
    { auto q = c; q.quantization_granularity = 64; has(msg(q), "params.quantization_granularity"); }
    KvCacheStoreParams sp{c, DType::bf16, 0};
    const KernelSpec spec{sp};
    CHECK(to_json(spec)["params"]["layout"] == "fp8_page_scales");
    CHECK(kernel_spec_from_json(to_json(spec)) == spec);
    CHECK(spec.name() == "kv_cache_store_mla_fp8_e4m3_h1_d128_p64_g128_ue8m0_page_scales_l2_from_bf16");
    const auto src = generate(KernelSpec{sp});
    CHECK(src.code.find("/*page_scales*/ true>") != std::string::npos);
    KvCacheStoreParams split = sp;
    split.cache.layout = CacheLayout::split;
    CHECK(generate(KernelSpec{split}).code.find("page_scales") == std::string::npos);

    // Views: u8 pages [num_blocks, 1, num_layers, page_size, 132] (or one layer's 3-d / 4-d), no scales.
    alignas(256) static char fake[256];
    void* ptr = fake;
    TensorView x(ptr, DType::bf16, {10, 1, 128}), off(ptr, DType::u32, {3}), dropped(ptr, DType::u32, {1});
    ops::PagedCacheView cache;
    cache.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 132});
    cache.lookup_table = TensorView(ptr, DType::u32, {2, 3});
    cache.cache_lengths = TensorView(ptr, DType::u32, {2});
    auto store = [&](const ops::PagedCacheView& v, int layer = 1) {
      return invalid_message([&] { ops::kv_cache_store(sp, x, off, v, layer, 0, dropped); });
    };
    { auto v = cache; v.scales = TensorView(ptr, DType::f32, {5, 1, 2, 64, 1, 1}); const auto m = store(v); has(m, "cache.scales"); has(m, "fp8_page_scales"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 128}); const auto m = store(v); has(m, "cache.blocks dim 4"); has(m, "132"); }
    { auto v = cache; v.blocks = TensorView(ptr, DType::u8, {5, 64, 132}); has(store(v), "cache.blocks rank"); }  // 2 layers
    { auto v = cache; v.blocks = TensorView(ptr, DType::f32, {5, 1, 2, 64, 132}); has(store(v), "cache.blocks dtype"); }
    has(store(cache, 2), "layer_idx");  // the views pass: the first refusal is the layer

    // The host pages: each page's rows' bytes, then their scales.
    ref::HostPagedCache host(c, 3);
    for (size_t i = 0; i < host.blocks.size(); ++i) host.blocks[i] = static_cast<uint8_t>(i * 7);
    for (size_t i = 0; i < host.scales.size(); ++i) host.scales[i] = static_cast<float>(i) + 0.5f;
    const std::vector<uint8_t> pages = host.page_scales_bytes();
    REQUIRE(pages.size() == size_t{3} * 2 * 64 * 132);
    const size_t pg = 3, tok = 5;  // page (block 1, layer 1), token 5
    CHECK(std::memcmp(pages.data() + pg * 64 * 132 + tok * 128, host.row_data(host.row(1, 0, 1, 5)), 128) == 0);
    float sc = 0;
    std::memcpy(&sc, pages.data() + pg * 64 * 132 + 64 * 128 + tok * 4, 4);
    CHECK(sc == host.row_scales(host.row(1, 0, 1, 5))[0]);

    // The indexer reads the layout (k_layout); sparse_prefill's latents do not use it.
    MlaIndexerParams ip;
    ip.k_layout = CacheLayout::fp8_page_scales;
    CHECK(invalid_message([&] { ip.validate(); }).empty());
    {
      // Its views: the pages' shapes (the layers from the view), no scales tensor; refusals name the field.
      TensorView q(ptr, DType::fp8_e4m3, {4, 64, 128}), qs(ptr, DType::f32, {4, 64}), offs(ptr, DType::u32, {3}),
          out(ptr, DType::i32, {4, 2048}), ws(ptr, DType::f32, {1 << 16});
      ops::PagedCacheView kc;
      kc.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 132});
      kc.lookup_table = TensorView(ptr, DType::u32, {2, 3});
      kc.cache_lengths = TensorView(ptr, DType::u32, {2});
      auto run = [&](const ops::PagedCacheView& v, int layer = 1) {
        return invalid_message([&] { ops::mla_indexer(ip, q, qs, offs, v, layer, 100, out, ws); });
      };
      { auto v = kc; v.scales = TensorView(ptr, DType::f32, {5, 1, 2, 64, 1, 1}); const auto m = run(v); has(m, "k_cache.scales"); has(m, "k_layout fp8_page_scales"); }
      { auto v = kc; v.blocks = TensorView(ptr, DType::fp8_e4m3, {5, 1, 2, 64, 1, 128}); has(run(v), "k_cache.blocks rank"); }
      { auto v = kc; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 64, 128}); has(run(v), "k_cache.blocks dim 4"); }
      { auto v = kc; v.blocks = TensorView(ptr, DType::u8, {5, 1, 2, 32, 132}); has(run(v), "k_cache.blocks dim 3"); }
      { auto v = kc; v.blocks = TensorView(ptr, DType::f32, {5, 1, 2, 64, 132}); has(run(v), "k_cache.blocks dtype"); }
      has(run(kc, 2), "layer_idx");  // 2 layers from the view: layer 2 is out of range
      { auto v = kc; v.blocks = TensorView(ptr, DType::u8, {5, 64, 132}); has(run(v, 1), "layer_idx"); }  // one layer
    }
    CHECK(KernelSpec{ip}.name() == "mla_indexer_h64_d128_k2048_p64_causal_logical_page_scales");
    CHECK(to_json(KernelSpec{ip})["params"]["k_layout"] == "fp8_page_scales");
    CHECK(to_json(KernelSpec{MlaIndexerParams{}})["params"].count("k_layout") == 0);
    ip.page_size = 16;
    has(invalid_message([&] { ip.validate(); }), "params.page_size");
    ip.page_size = 64;
    ip.k_layout = CacheLayout::fp8_ds_mla;
    has(invalid_message([&] { ip.validate(); }), "params.k_layout");
    SparsePrefillParams spp;
    spp.kv_layout = CacheLayout::fp8_page_scales;
    has(invalid_message([&] { spp.validate(); }), "params.kv_layout");
  }
}
