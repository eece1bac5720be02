// Test data helpers (SPEC §4): exact host dtype encodings, ragged batches, shuffled page tables.
#include "reference/test_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "mlajit/error.hpp"

namespace mlajit::testdata {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds |a| (finite, >= 0) to a multiple of 2^step_exp, nearest even multiple on ties; returns the
// multiple count. Exact: every f32 is a multiple of 2^-149, so the scaled value and its fraction
// are computed without error in double.
uint64_t round_to_grid(float a, int step_exp) {
  const double scaled = std::ldexp(static_cast<double>(a), -step_exp);
  const double fl = std::floor(scaled);
  const double frac = scaled - fl;
  uint64_t n = static_cast<uint64_t>(fl);
  if (frac > 0.5 || (frac == 0.5 && (n & 1))) ++n;
  return n;
}

}  // namespace

// ---- bf16 -----------------------------------------------------------------------------------------
uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if (std::isnan(f)) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FFFu);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);  // RNE; overflow carries into inf
}
float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// ---- f16 ------------------------------------------------------------------------------------------
uint16_t f32_to_f16(float f) {
  const uint16_t sign = static_cast<uint16_t>((bits_of(f) >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7FFFu);
  const float a = std::fabs(f);
  if (std::isinf(a)) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a < 0x1p-14f) return static_cast<uint16_t>(sign | round_to_grid(a, -24));  // subnormal grid 2^-24
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): a in [2^(e-1), 2^e)
  const int exp = e - 1;  // a in [2^exp, 2^(exp+1))
  if (exp > 15) return static_cast<uint16_t>(sign | 0x7C00u);
  uint64_t m = round_to_grid(a, exp - 10);  // in [1024, 2048]
  int biased = exp + 15;
  if (m == 2048) {
    m = 1024;
    ++biased;
  }
  if (biased >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | (biased << 10) | (m - 1024));
}

float f16_to_f32(uint16_t h) {
  const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1F;
  const int man = h & 0x3FF;
  if (exp == 31) return man ? std::nanf("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -24);
  return sign * std::ldexp(static_cast<float>(1024 + man), exp - 25);
}

// ---- e4m3 (OCP e4m3fn: bias 7, max 448 = 0x7E, no inf, NaN = S.1111.111) --------------------------
uint8_t f32_to_e4m3(float f) {
  const uint8_t sign = static_cast<uint8_t>((bits_of(f) >> 24) & 0x80u);
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7F);
  const float a = std::fabs(f);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7E);  // satfinite (inf included)
  if (a < 0x1p-6f) {
    // Subnormals: multiples of 2^-9; a count of 8 is the smallest normal 2^-6 (code 0x08).
    return static_cast<uint8_t>(sign | round_to_grid(a, -9));
  }
  int e;
  std::frexp(a, &e);
  int exp = e - 1;                           // a in [2^exp, 2^(exp+1)), exp in [-6, 8]
  uint64_t m = round_to_grid(a, exp - 3);    // in [8, 16]
  if (m == 16) {
    m = 8;
    ++exp;
  }
  // a < 448 keeps exp 8 at m <= 14 (code 0x7E): the NaN code 0x7F is never produced here.
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | (m - 8));
}

float e4m3_to_f32(uint8_t b) {
  const float sign = (b & 0x80u) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF;
  const int man = b & 0x7;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(static_cast<float>(8 + man), exp - 10);
}

void encode(DType t, float v, void* p) {
  switch (t) {
    case DType::f32: std::memcpy(p, &v, 4); return;
    case DType::bf16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::f16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::fp8_e4m3: *static_cast<uint8_t*>(p) = f32_to_e4m3(v); return;
    default: throw_invalid("testdata::encode dtype", dtype_name(t), "f32 | f16 | bf16 | fp8_e4m3");
  }
}

float decode(DType t, const void* p) {
  switch (t) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::fp8_e4m3: return e4m3_to_f32(*static_cast<const uint8_t*>(p));
    default: throw_invalid("testdata::decode dtype", dtype_name(t), "f32 | f16 | bf16 | fp8_e4m3");
  }
}

std::vector<uint8_t> encode_all(DType t, const std::vector<float>& v) {
  const size_t s = dtype_size(t);
  std::vector<uint8_t> out(v.size() * s);
  for (size_t i = 0; i < v.size(); ++i) encode(t, v[i], out.data() + i * s);
  return out;
}

std::vector<float> random_normal(size_t n, Rng& rng, float stddev) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.normal(stddev);
  return v;
}

// ---- ragged batches ------------------------------------------------------------------------------
RaggedBatch make_ragged_batch(std::vector<uint32_t> seq_lens, std::vector<uint32_t> cache_lengths) {
  if (seq_lens.size() != cache_lengths.size())
    throw_invalid("make_ragged_batch cache_lengths size", cache_lengths.size(),
                  fmt::format("one per sequence ({})", seq_lens.size()));
  RaggedBatch b;
  b.row_offsets.assign(seq_lens.size() + 1, 0);
  for (size_t i = 0; i < seq_lens.size(); ++i) b.row_offsets[i + 1] = b.row_offsets[i] + seq_lens[i];
  b.seq_lens = std::move(seq_lens);
  b.cache_lengths = std::move(cache_lengths);
  return b;
}

int RaggedBatch::sequence_of(int64_t t) const {
  // Last b with row_offsets[b] <= t (skips empty sequences).
  auto it = std::upper_bound(row_offsets.begin(), row_offsets.end() - 1, static_cast<uint32_t>(t));
  return static_cast<int>(it - row_offsets.begin()) - 1;
}

uint32_t RaggedBatch::position_of(int64_t t) const {
  const int b = sequence_of(t);
  return cache_lengths[b] + static_cast<uint32_t>(t - row_offsets[b]);
}

PageTable make_page_table(const RaggedBatch& batch, int page_size, Rng& rng, int pages_per_seq,
                          int64_t num_blocks) {
  PageTable t;
  t.batch = batch.batch();
  if (pages_per_seq == 0) {
    uint32_t longest = 0;
    for (int b = 0; b < t.batch; ++b) longest = std::max(longest, batch.cache_lengths[b] + batch.seq_lens[b]);
    pages_per_seq = std::max(1, static_cast<int>((longest + page_size - 1) / page_size));
  }
  t.pages_per_seq = pages_per_seq;
  const int64_t needed = static_cast<int64_t>(t.batch) * pages_per_seq;
  t.num_blocks = num_blocks > 0 ? num_blocks : needed + 3;
  std::vector<uint32_t> perm(static_cast<size_t>(std::max(t.num_blocks, needed)));
  std::iota(perm.begin(), perm.end(), 0u);
  rng.shuffle(perm);
  // With num_blocks < needed some entries are >= num_blocks: the out-of-range blocks tests want.
  t.lut.assign(perm.begin(), perm.begin() + needed);
  return t;
}

}  // namespace mlajit::testdata
