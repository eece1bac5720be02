// Tuner workload of mla_indexer (SPEC §2): a ragged batch of fp8 queries over a shuffled paged fp8
// K cache with two layers. The values are chosen so that every score is exact in f32 (fp8 values
// with a 3-exponent range, power-of-two head weights and key scales), so candidates that tile the
// reduction differently must still select the same keys; outputs are compared as per-row index
// sets (the order within a row of equal scores is the only freedom).
#include <algorithm>

#include "autotune/device_data.hpp"
#include "autotune/workloads.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"

namespace mlajit::autotune {

namespace {

using driver::DeviceBuffer;

constexpr int kLayers = 2;
constexpr int kLayer = 1;

class IndexerWorkload : public Workload {
 public:
  IndexerWorkload(const MlaIndexerParams& p, const Shape& s, uint64_t seed) : p_(p), rng_(seed) {
    tokens_ = s.at("tokens");
    batch_ = std::min<int64_t>(s.at("batch"), tokens_);
    const auto offsets = data::ragged_offsets(tokens_, batch_, rng_);
    std::vector<uint32_t> cached(batch_);
    max_keys_ = 1;
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t n = offsets[b + 1] - offsets[b];
      cached[b] = static_cast<uint32_t>(std::max<int64_t>(0, s.at("keys") - n));
      max_keys_ = std::max<int64_t>(max_keys_, cached[b] + n);
      for (int64_t i = 0; i < n; ++i)
        visible_pairs_ += p.mask == Mask::causal ? static_cast<double>(cached[b] + i + 1) : static_cast<double>(cached[b] + n);
    }
    pages_per_seq_ = (max_keys_ + p.page_size - 1) / p.page_size;
    num_blocks_ = batch_ * pages_per_seq_;
    const auto lut = data::shuffled_lookup_table(batch_, pages_per_seq_, rng_);

    const int H = p.num_heads, D = p.depth;
    q_ = DeviceBuffer(static_cast<size_t>(tokens_) * H * D);
    data::fill_random(q_, DType::fp8_e4m3, rng_);
    std::vector<float> qs(static_cast<size_t>(tokens_) * H);
    for (auto& w : qs) w = (rng_.next() & 1) ? 0.0625f : -0.0625f;
    qs_d_ = data::upload(qs);
    offsets_d_ = data::upload(offsets);
    lut_d_ = data::upload(lut);
    lengths_d_ = data::upload(cached);

    const size_t rows = static_cast<size_t>(num_blocks_) * kLayers * p.page_size;
    // 132 bytes per key: room for the fp8_page_scales pages too (whose scale bytes are then random
    // finite e4m3 bytes read as f32); the split layout uses the first rows x 128.
    k_ = DeviceBuffer(rows * (D + 4));
    data::fill_random(k_, DType::fp8_e4m3, rng_);
    std::vector<float> ks(rows);
    for (auto& x : ks) x = 0.25f * static_cast<float>(1u << rng_.below(3));
    ks_d_ = data::upload(ks);

    ws_ = DeviceBuffer((ops::mla_indexer_workspace_bytes(p, tokens_, max_keys_) + 15) / 16 * 16);
    out_ = DeviceBuffer(static_cast<size_t>(tokens_) * p.top_k * 4);
  }

  void run(const KernelSpec& spec, Stream stream) override {
    const auto& p = std::get<MlaIndexerParams>(spec.params);
    ops::PagedCacheView kc;
    const int64_t bdims[6] = {num_blocks_, 1, kLayers, p.page_size, 1, p.depth};
    const int64_t sdims[6] = {num_blocks_, 1, kLayers, p.page_size, 1, 1};
    if (p.k_layout == CacheLayout::fp8_page_scales) {
      const int64_t pdims[5] = {num_blocks_, 1, kLayers, p.page_size, p.depth + 4};
      kc.blocks = TensorView(k_.get(), DType::u8, pdims, 5);
    } else {
      kc.blocks = TensorView(k_.get(), DType::fp8_e4m3, bdims, 6);
      kc.scales = TensorView(ks_d_.get(), DType::f32, sdims, 6);
    }
    kc.lookup_table = TensorView(lut_d_.get(), DType::u32, {batch_, pages_per_seq_});
    kc.cache_lengths = TensorView(lengths_d_.get(), DType::u32, {batch_});
    ops::mla_indexer(p, TensorView(q_.get(), DType::fp8_e4m3, {tokens_, p.num_heads, p.depth}),
                     TensorView(qs_d_.get(), DType::f32, {tokens_, p.num_heads}),
                     TensorView(offsets_d_.get(), DType::u32, {batch_ + 1}), kc, kLayer, max_keys_,
                     TensorView(out_.get(), DType::i32, {tokens_, p.top_k}),
                     TensorView(ws_.get(), DType::f32, {static_cast<int64_t>(ws_.size() / 4)}), stream);
  }
  void poison_output() override { out_.fill_bytes(0xFF); }
  std::vector<uint8_t> read_output() const override {
    std::vector<uint8_t> out(out_.size());
    out_.download(out.data(), out.size());
    return out;
  }
  std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got) const override {
    if (ref.size() != got.size())
      return fmt::format("output: {} bytes, the default configuration wrote {}", got.size(), ref.size());
    const size_t k = static_cast<size_t>(p_.top_k);
    std::vector<int32_t> a(k), b(k);
    size_t bad_rows = 0, first = 0;
    for (size_t row = 0; row < static_cast<size_t>(tokens_); ++row) {
      std::memcpy(a.data(), ref.data() + row * k * 4, k * 4);
      std::memcpy(b.data(), got.data() + row * k * 4, k * 4);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b && bad_rows++ == 0) first = row;
    }
    if (!bad_rows) return "";
    return fmt::format("{} of {} rows select a different index set than the default configuration, first row {}",
                       bad_rows, tokens_, first);
  }
  double bytes_moved() const override {
    return static_cast<double>(tokens_) * p_.num_heads * (p_.depth + 4) +
           static_cast<double>(batch_) * max_keys_ * (p_.depth + 4) + static_cast<double>(tokens_) * p_.top_k * 4;
  }
  double flops() const override { return 2.0 * visible_pairs_ * p_.num_heads * p_.depth; }

 private:
  MlaIndexerParams p_;
  data::Rng rng_;
  int64_t tokens_ = 0, batch_ = 0, max_keys_ = 0, pages_per_seq_ = 0, num_blocks_ = 0;
  double visible_pairs_ = 0;
  DeviceBuffer q_, qs_d_, offsets_d_, lut_d_, lengths_d_, k_, ks_d_, ws_, out_;
};

}  // namespace

std::unique_ptr<Workload> make_indexer_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed) {
  return std::make_unique<IndexerWorkload>(std::get<MlaIndexerParams>(problem.params), shape, seed);
}

}  // namespace mlajit::autotune
