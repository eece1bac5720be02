#pragma once
// Workload data for the tuner: deterministic pseudo-random values, generated on the host and
// uploaded. Plain on purpose: the tuner needs realistic magnitudes and no pathological patterns
// (no zeros, no NaN encodings), not a distribution; the statistical test data of SPEC §4 lives in
// tests/reference/ and is for the correctness suites.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "mlajit/driver.hpp"
#include "mlajit/dtype.hpp"

namespace mlajit::autotune::data {

// splitmix64: tiny, fast, good enough for test data, identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) * n >> 32); }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t s_;
};

// One random element of `t` as raw bits, magnitude in about [0.25, 4), random sign, never NaN/inf.
inline void random_element(DType t, Rng& rng, uint8_t* out) {
  const uint64_t r = rng.next();
  const uint32_t sign = r & 1;
  switch (t) {
    case DType::f32: {
      const uint32_t bits = (sign << 31) | ((125u + (r >> 1) % 4) << 23) | ((r >> 8) & 0x7fffff);
      std::memcpy(out, &bits, 4);
      break;
    }
    case DType::bf16: {
      const uint16_t bits = static_cast<uint16_t>((sign << 15) | ((125u + (r >> 1) % 4) << 7) | ((r >> 8) & 0x7f));
      std::memcpy(out, &bits, 2);
      break;
    }
    case DType::f16: {
      const uint16_t bits = static_cast<uint16_t>((sign << 15) | ((13u + (r >> 1) % 4) << 10) | ((r >> 8) & 0x3ff));
      std::memcpy(out, &bits, 2);
      break;
    }
    case DType::fp8_e4m3:
      // Exponent field 6..8 (bias 7): |x| in [0.5, 3.75]. Products and 128-term sums of such
      // values are exact in f32, so the indexer's scores do not depend on accumulation order.
      out[0] = static_cast<uint8_t>((sign << 7) | ((6u + (r >> 1) % 3) << 3) | ((r >> 8) & 7));
      break;
    default: {
      const uint32_t bits = static_cast<uint32_t>(r);
      std::memcpy(out, &bits, 4);
    }
  }
}

// `count` random elements of `t`.
inline std::vector<uint8_t> random_bytes(DType t, size_t count, Rng& rng) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) random_element(t, rng, out.data() + i * es);
  return out;
}

// Fills `bytes` bytes of `buf` from `offset` with random elements of `t`. Large fills repeat a
// random tile of a few MiB (an odd number of elements, so repeats do not line up with rows):
// generating hundreds of MiB on one host core would dominate a tune for no benefit.
inline void fill_random(driver::DeviceBuffer& buf, DType t, Rng& rng, size_t offset = 0, size_t bytes = SIZE_MAX) {
  if (bytes == SIZE_MAX) bytes = buf.size() - offset;
  const size_t es = dtype_size(t);
  const size_t tile_elems = std::min<size_t>(bytes / es, (size_t{1} << 20) + 7);
  const std::vector<uint8_t> tile = random_bytes(t, tile_elems, rng);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(tile.size(), bytes - done);
    buf.upload(tile.data(), n, offset + done);
    done += n;
  }
}

// Fills `buf` with random fp8_ds_mla records (656 bytes: 512 e4m3 without NaN codes, 4 f32 scales,
// 64 bf16 rope dims in [-2, 2]): scales in [1/4, 1], or 1/2 or 1 when `pow2_scales` (a ue8m0
// spec's promise). A tile of 4099 records repeats (odd, so repeats do not line up with pages).
inline void fill_random_ds_mla(driver::DeviceBuffer& buf, bool pow2_scales, Rng& rng) {
  constexpr size_t kRec = 656;
  const size_t rows = buf.size() / kRec, tile_rows = std::min<size_t>(rows, 4099);
  std::vector<uint8_t> tile(tile_rows * kRec);
  for (size_t r = 0; r < tile_rows; ++r) {
    uint8_t* rec = tile.data() + r * kRec;
    for (int d = 0; d < 512; ++d) {
      uint8_t x = static_cast<uint8_t>(rng.below(256));
      if ((x & 0x7F) == 0x7F) x ^= 1;  // 0x7F / 0xFF are NaN in e4m3
      rec[d] = x;
    }
    for (int g = 0; g < 4; ++g) {
      float sc = rng.uniform(0.25f, 1.0f);
      if (pow2_scales) sc = sc <= 0.5f ? 0.5f : 1.0f;
      std::memcpy(rec + 512 + 4 * g, &sc, 4);
    }
    for (int d = 0; d < 64; ++d) {
      const float v = rng.uniform(-2.0f, 2.0f);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t h = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // RNE to bf16
      std::memcpy(rec + 528 + 2 * d, &h, 2);
    }
  }
  for (size_t done = 0; done < rows * kRec;) {
    const size_t n = std::min(tile.size(), rows * kRec - done);
    buf.upload(tile.data(), n, done);
    done += n;
  }
}

template <typename T>
driver::DeviceBuffer upload(const std::vector<T>& v) {
  driver::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 4));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// A ragged split of `total` tokens over `batch` sequences (each gets >= 1 when total >= batch),
// lengths varying by about +-50% around the mean. Returns the offsets [batch + 1].
inline std::vector<uint32_t> ragged_offsets(int64_t total, int64_t batch, Rng& rng) {
  std::vector<double> w(batch);
  for (auto& x : w) x = 0.5 + rng.uniform(0, 1);
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<uint32_t> off(batch + 1, 0);
  double acc = 0;
  for (int64_t b = 0; b < batch; ++b) {
    acc += w[b];
    int64_t end = b + 1 == batch ? total : static_cast<int64_t>(acc / sum * static_cast<double>(total));
    end = std::max<int64_t>(end, std::min<int64_t>(total, off[b] + 1));
    off[b + 1] = static_cast<uint32_t>(std::min(end, total));
  }
  return off;
}

// A lookup table [batch, pages_per_seq] that maps every logical page to a distinct physical block
// in shuffled order (blocks 0 .. batch * pages_per_seq - 1).
inline std::vector<uint32_t> shuffled_lookup_table(int64_t batch, int64_t pages_per_seq, Rng& rng) {
  std::vector<uint32_t> lut(static_cast<size_t>(batch * pages_per_seq));
  std::iota(lut.begin(), lut.end(), 0u);
  for (size_t i = lut.size(); i > 1; --i) std::swap(lut[i - 1], lut[rng.below(static_cast<uint32_t>(i))]);
  return lut;
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace mlajit::autotune::data
