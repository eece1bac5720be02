#pragma once
// Test data that catches real bugs (SPEC §4), shared by every op's tests: seeded random normal
// values, exact host encodings of the storage dtypes, ragged batches with cache lengths, shuffled
// page lookup tables, and NaN poisoning of outputs.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "mlajit/dtype.hpp"

namespace mlajit::testdata {

// ---- exact host element encodings (round to nearest even, like the device cvt.rn) -------------
uint16_t f32_to_bf16(float f);  // NaN -> 0x7FFF with the sign kept (cvt.rn.bf16.f32 canonical NaN)
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);   // overflow -> inf, subnormals kept
float f16_to_f32(uint16_t h);
// OCP e4m3fn: saturating (satfinite) round-to-nearest-even encode; NaN -> 0x7F | sign.
uint8_t f32_to_e4m3(float f);
float e4m3_to_f32(uint8_t b);   // exact; 0x7F / 0xFF -> NaN

// One element of `t` (f32 | f16 | bf16 | fp8_e4m3) at `p`, to and from f32.
void encode(DType t, float v, void* p);
float decode(DType t, const void* p);
// Encodes a whole array: dtype_size(t) bytes per value.
std::vector<uint8_t> encode_all(DType t, const std::vector<float>& v);

// ---- randomness ------------------------------------------------------------------------------
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  // Uniform integer in [lo, hi].
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(uniform(0, int64_t(i) - 1))]);
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

// n normal values N(0, stddev^2): never zeros or constants, so unwritten or misplaced data shows.
std::vector<float> random_normal(size_t n, Rng& rng, float stddev = 1.0f);

// ---- ragged batches and paged caches -------------------------------------------------------------

// Sequence b has seq_lens[b] new tokens after cache_lengths[b] cached ones.
struct RaggedBatch {
  std::vector<uint32_t> seq_lens;
  std::vector<uint32_t> cache_lengths;
  std::vector<uint32_t> row_offsets;  // u32 [B + 1], exclusive prefix sum of seq_lens

  int batch() const { return static_cast<int>(seq_lens.size()); }
  int64_t total_tokens() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
  // Sequence of new token t and its logical position (cache_lengths[b] + index within b).
  int sequence_of(int64_t t) const;
  uint32_t position_of(int64_t t) const;
};
RaggedBatch make_ragged_batch(std::vector<uint32_t> seq_lens, std::vector<uint32_t> cache_lengths);

// Logical page -> physical block per sequence, u32 [batch, pages_per_seq] row-major. Distinct
// physical blocks are drawn from a shuffled permutation of [0, num_blocks), so consecutive logical
// pages land in scattered, non-monotonic blocks.
struct PageTable {
  int batch = 0;
  int pages_per_seq = 0;
  int64_t num_blocks = 0;
  std::vector<uint32_t> lut;
  uint32_t at(int b, int page) const { return lut[static_cast<size_t>(b) * pages_per_seq + page]; }
};
// pages_per_seq: 0 = just enough for the longest sequence (cache + new tokens); num_blocks: 0 =
// batch * pages_per_seq + 3 spare blocks that no sequence maps (writes there are bugs).
PageTable make_page_table(const RaggedBatch& batch, int page_size, Rng& rng, int pages_per_seq = 0,
                          int64_t num_blocks = 0);

// ---- poisoning -------------------------------------------------------------------------------------
// 0xFF bytes are NaN in f32, f16, bf16 and e4m3: unwritten output shows as NaN.
constexpr uint8_t kPoisonByte = 0xFF;
inline void poison(std::vector<uint8_t>& bytes) { bytes.assign(bytes.size(), kPoisonByte); }

}  // namespace mlajit::testdata
