// CPU f64 reference of sparse_prefill (SPEC §3) and its random test data (SPEC §4).
#include "reference/sparse_prefill_ref.hpp"
#include "reference/kv_cache_ref.hpp"
#include "reference/test_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>

namespace mlajit::ref {

// ---- codecs -----------------------------------------------------------------------------------------

// The host codecs are the shared exact ones of src/reference/test_data.hpp.
float bf16_to_float(uint16_t b) { return testdata::bf16_to_f32(b); }
uint16_t float_to_bf16(float f) { return testdata::f32_to_bf16(f); }
float e4m3_to_float(uint8_t b) { return testdata::e4m3_to_f32(b); }
uint8_t float_to_e4m3(float x) { return testdata::f32_to_e4m3(x); }

// ---- problem ------------------------------------------------------------------------------------------

size_t SparsePrefillProblem::block_bytes() const {
  return static_cast<size_t>(num_blocks) * num_layers * p.page_size * static_cast<size_t>(p.row_bytes());
}

void decode_row(const SparsePrefillProblem& pb, int64_t row, double* k) {
  if (pb.p.kv_layout == CacheLayout::fp8_ds_mla) {
    // FlashMLA's record: dims 0..511 e4m3 * scale[d / 128] (f32 scales at byte 512), dims 512..575
    // bf16 at byte 528.
    const uint8_t* rec = pb.blocks.data() + static_cast<size_t>(row) * 656;
    float sc[4];
    std::memcpy(sc, rec + 512, 16);
    for (int d = 0; d < 512; ++d) k[d] = static_cast<double>(e4m3_to_float(rec[d])) * static_cast<double>(sc[d / 128]);
    for (int d = 0; d < 64; ++d) {
      uint16_t b;
      std::memcpy(&b, rec + 528 + 2 * d, 2);
      k[512 + d] = bf16_to_float(b);
    }
    return;
  }
  if (pb.p.kv_dtype == DType::bf16) {
    const uint8_t* src = pb.blocks.data() + static_cast<size_t>(row) * 576 * 2;
    for (int d = 0; d < 576; ++d) {
      uint16_t b;
      std::memcpy(&b, src + 2 * d, 2);
      k[d] = bf16_to_float(b);
    }
    return;
  }
  const uint8_t* src = pb.blocks.data() + static_cast<size_t>(row) * 576;
  const int G = pb.p.quantization_granularity;  // elements per scale (0: unit scales)
  const int spt = pb.p.scales_per_token();
  for (int d = 0; d < 576; ++d) {
    const double s = G > 0 ? static_cast<double>(pb.scales[static_cast<size_t>(row) * spt + d / G]) : 1.0;
    k[d] = static_cast<double>(e4m3_to_float(src[d])) * s;
  }
}

void staged_bf16_row(const SparsePrefillProblem& pb, int64_t row, uint16_t* out) {
  const uint8_t* src = pb.blocks.data() + static_cast<size_t>(row) * 576;
  const int G = pb.p.quantization_granularity;  // elements per scale (0: unit scales)
  const int spt = pb.p.scales_per_token();
  for (int d = 0; d < 576; ++d) {
    const float s = G > 0 ? pb.scales[static_cast<size_t>(row) * spt + d / G] : 1.0f;
    out[d] = float_to_bf16(e4m3_to_float(src[d]) * s);  // one f32 product, as the device computes it
  }
}

SparsePrefillProblem staged_bf16_problem(const SparsePrefillProblem& pb) {
  SparsePrefillProblem s = pb;
  s.p.kv_dtype = DType::bf16;
  s.p.quantization_granularity = 0;
  s.p.scale_fmt = ScaleFmt::fp32;
  s.p.kv_staging = KvStaging::none;
  s.scales.clear();
  const int64_t rows = pb.num_blocks * pb.row_stride();
  s.blocks.assign(static_cast<size_t>(rows) * 576 * 2, 0);
  std::vector<uint16_t> r(576);
  for (int64_t row = 0; row < rows; ++row) {
    staged_bf16_row(pb, row, r.data());
    std::memcpy(s.blocks.data() + static_cast<size_t>(row) * 1152, r.data(), 1152);
  }
  return s;
}

bool slot_valid(const SparsePrefillProblem& pb, int64_t t, int64_t j) {
  const int64_t len = std::min<int64_t>(pb.topk_lengths[t], pb.indices_stride);
  if (j >= len) return false;
  const uint32_t e = pb.indices[t * pb.indices_stride + j];
  if (static_cast<int32_t>(e) < 0) return false;
  const int64_t page = pb.p.page_size;
  const int64_t tma_row = static_cast<int64_t>(e / page) * pb.row_stride() + e % page;
  return tma_row < pb.num_kv_rows();
}

namespace {

void reference_tokens(const SparsePrefillProblem& pb, int64_t t0, int64_t t1, SparsePrefillResult& r) {
  const int H = pb.p.num_q_heads;
  const int64_t page = pb.p.page_size;
  const int64_t layer_off = static_cast<int64_t>(pb.layer_idx) * page;
  std::vector<double> q(static_cast<size_t>(H) * 576), keys, p;
  for (int64_t t = t0; t < t1; ++t) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_float(pb.q[static_cast<size_t>(t) * H * 576 + i]);
    // Decoded rows of the valid slots.
    keys.clear();
    for (int64_t j = 0; j < pb.indices_stride; ++j) {
      if (!slot_valid(pb, t, j)) continue;
      const uint32_t e = pb.indices[t * pb.indices_stride + j];
      const int64_t row = static_cast<int64_t>(e / page) * pb.row_stride() + e % page + layer_off;
      keys.resize(keys.size() + 576);
      decode_row(pb, row, keys.data() + keys.size() - 576);
    }
    const size_t n = keys.size() / 576;
    p.resize(n);
    for (int h = 0; h < H; ++h) {
      double* out = r.out.data() + (static_cast<size_t>(t) * H + h) * 512;
      double& lse = r.lse[static_cast<size_t>(t) * H + h];
      std::fill(out, out + 512, 0.0);
      if (n == 0) {
        lse = std::numeric_limits<double>::infinity();
        continue;
      }
      const double* qh = q.data() + static_cast<size_t>(h) * 576;
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < n; ++j) {
        const double* k = keys.data() + j * 576;
        double dot = 0;
        for (int d = 0; d < 576; ++d) dot += qh[d] * k[d];
        p[j] = static_cast<double>(pb.softmax_scale) * dot;
        m = std::max(m, p[j]);
      }
      double l = 0;
      for (size_t j = 0; j < n; ++j) {
        const double w = std::exp(p[j] - m);
        l += w;
        const double* v = keys.data() + j * 576;
        for (int d = 0; d < 512; ++d) out[d] += w * v[d];
      }
      double denom = l;
      if (pb.p.attn_sink) denom += std::exp(static_cast<double>(pb.attn_sink[h]) - m);
      for (int d = 0; d < 512; ++d) out[d] /= denom;  // sink +inf: denom inf, out 0
      lse = m + std::log(l);
    }
  }
}

}  // namespace

SparsePrefillResult sparse_prefill_reference(const SparsePrefillProblem& pb, unsigned threads) {
  SparsePrefillResult r;
  const int H = pb.p.num_q_heads;
  r.out.assign(static_cast<size_t>(pb.num_tokens) * H * 512, 0.0);
  r.lse.assign(static_cast<size_t>(pb.num_tokens) * H, 0.0);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<int64_t>(threads, std::max<int64_t>(1, pb.num_tokens)));
  std::vector<std::thread> pool;
  // Interleaved token ranges of one token each would share cache lines of `out`; contiguous
  // chunks keep the threads apart.
  const int64_t chunk = (pb.num_tokens + threads - 1) / threads;
  for (unsigned i = 0; i < threads; ++i) {
    const int64_t t0 = i * chunk, t1 = std::min<int64_t>(pb.num_tokens, t0 + chunk);
    if (t0 >= t1) break;
    pool.emplace_back([&, t0, t1] { reference_tokens(pb, t0, t1, r); });
  }
  for (auto& th : pool) th.join();
  return r;
}

// ---- random problems ------------------------------------------------------------------------------------

SparsePrefillProblem make_random_problem(const SparsePrefillParams& p, const SparsePrefillShape& s, uint64_t seed) {
  p.validate();
  if (s.indices_stride <= 0 || s.indices_stride % p.b_topk != 0)
    throw std::invalid_argument("make_random_problem: indices_stride " + std::to_string(s.indices_stride) +
                                " is not a positive multiple of b_topk " + std::to_string(p.b_topk));
  if (s.layer_idx < 0 || s.layer_idx >= s.num_layers)
    throw std::invalid_argument("make_random_problem: layer_idx " + std::to_string(s.layer_idx) +
                                " outside [0, num_layers=" + std::to_string(s.num_layers) + ")");
  if (s.ue8m0_group_exp_lo > s.ue8m0_group_exp_hi)
    throw std::invalid_argument("make_random_problem: ue8m0_group_exp_lo " + std::to_string(s.ue8m0_group_exp_lo) +
                                " > ue8m0_group_exp_hi " + std::to_string(s.ue8m0_group_exp_hi));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);

  SparsePrefillProblem pb;
  pb.p = p;
  pb.num_tokens = s.num_tokens;
  pb.num_layers = s.num_layers;
  pb.layer_idx = s.layer_idx;
  pb.softmax_scale = s.softmax_scale;
  pb.indices_stride = s.indices_stride;
  const int64_t page = p.page_size;
  const int64_t pages = (s.kv_tokens + page - 1) / page;
  pb.num_blocks = s.num_blocks > 0 ? s.num_blocks : pages + 1;
  if (pb.num_blocks < pages) throw std::invalid_argument("make_random_problem: num_blocks < pages of kv_tokens");
  const int H = p.num_q_heads;

  pb.q.resize(static_cast<size_t>(s.num_tokens) * H * 576);
  for (auto& v : pb.q) v = float_to_bf16(normal(rng));

  // Every row of every block and layer holds random data, so a wrong layer or block lands on
  // plausible but different numbers.
  const int64_t rows = pb.num_blocks * s.num_layers * page;
  pb.blocks.resize(pb.block_bytes());
  const bool fp8 = p.kv_dtype == DType::fp8_e4m3;
  const int G = fp8 ? p.quantization_granularity : 0;  // elements per scale (0: unit scales)
  const int spt = p.scales_per_token();
  if (fp8 && G > 0) pb.scales.resize(static_cast<size_t>(rows) * spt);
  std::vector<float> x(576);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : x) v = normal(rng);
    if (p.kv_layout == CacheLayout::fp8_ds_mla) {
      // Records: four 128-dim groups of different magnitudes (2^lo..2^hi apart with ue8m0, as
      // below), quantized with the store's scale rule; the rope dims as bf16.
      uint8_t* rec = pb.blocks.data() + static_cast<size_t>(r) * 656;
      for (int b = 0; b < 4; ++b) {
        const int lo = s.ue8m0_group_exp_lo, span = s.ue8m0_group_exp_hi - lo + 1;
        const float mag = std::ldexp(1.0f, static_cast<int>(rng() % static_cast<uint32_t>(span)) + lo);
        float amax = 0;
        for (int d = 128 * b; d < 128 * (b + 1); ++d) amax = std::max(amax, std::fabs(x[d] *= mag));
        const float scale = fp8_group_scale(amax, p.scale_fmt);
        std::memcpy(rec + 512 + 4 * b, &scale, 4);
        for (int d = 128 * b; d < 128 * (b + 1); ++d) rec[d] = float_to_e4m3(x[d] / scale);
      }
      for (int d = 0; d < 64; ++d) {
        const uint16_t h = float_to_bf16(x[512 + d]);
        std::memcpy(rec + 528 + 2 * d, &h, 2);
      }
      continue;
    }
    if (!fp8) {
      for (int d = 0; d < 576; ++d) {
        const uint16_t b = float_to_bf16(x[d]);
        std::memcpy(pb.blocks.data() + (static_cast<size_t>(r) * 576 + d) * 2, &b, 2);
      }
    } else if (G == 0) {
      for (int d = 0; d < 576; ++d) pb.blocks[static_cast<size_t>(r) * 576 + d] = float_to_e4m3(x[d]);
    } else {
      const bool ue8m0 = p.scale_fmt == ScaleFmt::ue8m0;
      for (int b = 0; b < spt; ++b) {
        if (ue8m0) {
          // Groups of one row 2^lo..2^hi apart in magnitude (default -3..3), so that their
          // power-of-two scales differ (a kernel applying a neighbour's scale, or none, fails).
          const int lo = s.ue8m0_group_exp_lo, span = s.ue8m0_group_exp_hi - lo + 1;
          const float mag = std::ldexp(1.0f, static_cast<int>(rng() % static_cast<uint32_t>(span)) + lo);
          for (int d = b * G; d < (b + 1) * G; ++d) x[d] *= mag;
        }
        float amax = 0;
        for (int d = b * G; d < (b + 1) * G; ++d) amax = std::max(amax, std::fabs(x[d]));
        const float scale = fp8_group_scale(amax, p.scale_fmt);  // SPEC §1, the store's rule
        pb.scales[static_cast<size_t>(r) * spt + b] = scale;
        for (int d = b * G; d < (b + 1) * G; ++d)
          pb.blocks[static_cast<size_t>(r) * 576 + d] = float_to_e4m3(x[d] / scale);
      }
    }
  }

  // Logical page -> physical block: a random permutation (shuffled pages).
  std::vector<uint32_t> perm(static_cast<size_t>(pb.num_blocks));
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), rng);
  auto encode = [&](int64_t pos) { return static_cast<uint32_t>(perm[pos / page] * page + pos % page); };

  pb.indices.assign(static_cast<size_t>(s.num_tokens * s.indices_stride), 0u);
  pb.topk_lengths.assign(static_cast<size_t>(s.num_tokens), 0u);
  std::vector<int64_t> pool(static_cast<size_t>(s.kv_tokens));
  std::iota(pool.begin(), pool.end(), 0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const int64_t stride = s.indices_stride;
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    int64_t len = stride;
    if (s.irregular) {
      len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(stride));
      if (len % p.b_topk == 0 && len != stride) len -= 1;
    }
    // Distinct positions: a partial Fisher-Yates draw from the (already shuffled) pool.
    const int64_t draw = std::min<int64_t>(stride, s.kv_tokens);
    for (int64_t j = 0; j < draw; ++j) {
      const int64_t k = j + static_cast<int64_t>(rng() % static_cast<uint64_t>(s.kv_tokens - j));
      std::swap(pool[j], pool[k]);
    }
    uint32_t* row = pb.indices.data() + t * stride;
    for (int64_t j = 0; j < stride; ++j) row[j] = encode(pool[j % draw]);
    if (s.irregular) {
      for (int64_t j = 0; j < stride; ++j) {
        const double u = uni(rng);
        if (u < 0.03) row[j] = 0xFFFFFFFFu;                                               // -1
        else if (u < 0.04) row[j] = 0x80000000u | static_cast<uint32_t>(rng() & 0xFFFFu);  // other negatives
        else if (u < 0.06)  // block past the cache: tma_row >= num_kv_rows
          row[j] = static_cast<uint32_t>((pb.num_blocks + static_cast<int64_t>(rng() % 7)) * page + rng() % page);
      }
      // Special rows (SPEC §4): no slot at all, every slot invalid, a length above the stride.
      if (s.num_tokens > 3) {
        if (t == 0) len = 0;
        if (t == 1)
          for (int64_t j = 0; j < stride; ++j)
            row[j] = (j & 1) ? 0xFFFFFFFFu : static_cast<uint32_t>(pb.num_blocks * page + j % page);
        if (t == 2) len = stride + 7;  // clamped to the stride
      }
    }
    pb.topk_lengths[t] = static_cast<uint32_t>(len);
  }

  if (p.attn_sink) {
    pb.attn_sink.resize(H);
    // -inf, finite (around the typical max score) and +inf sinks, mixed over the heads.
    for (int h = 0; h < H; ++h) {
      switch (h % 4) {
        case 0: pb.attn_sink[h] = -std::numeric_limits<float>::infinity(); break;
        case 1: pb.attn_sink[h] = 2.f * normal(rng); break;
        case 2: pb.attn_sink[h] = 0.5f + normal(rng); break;
        default: pb.attn_sink[h] = std::numeric_limits<float>::infinity(); break;
      }
    }
  }
  return pb;
}

}  // namespace mlajit::ref
