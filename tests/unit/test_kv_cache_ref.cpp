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
