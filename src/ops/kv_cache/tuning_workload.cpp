// Tuner workloads of the paged KV cache ops (kv_cache_store, kv_cache_gather, sparse_index_remap):
// a ragged batch over a shuffled paged cache, outputs compared byte for byte (these ops are exact:
// a cast or a quantization that does not depend on the launch shape).
#include <algorithm>
#include <cstring>

#include "autotune/device_data.hpp"
#include "autotune/workloads.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"

namespace mlajit::autotune {

namespace {

using driver::DeviceBuffer;

// "" when equal, else where the first difference is.
std::string compare_exact(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got, const char* what) {
  if (ref.size() != got.size())
    return fmt::format("{}: {} bytes, the default configuration wrote {}", what, got.size(), ref.size());
  auto m = std::mismatch(ref.begin(), ref.end(), got.begin());
  if (m.first == ref.end()) return "";
  const size_t at = static_cast<size_t>(m.first - ref.begin());
  const size_t diff = static_cast<size_t>(
      std::inner_product(ref.begin(), ref.end(), got.begin(), size_t{0}, std::plus<>(),
                         [](uint8_t a, uint8_t b) { return static_cast<size_t>(a != b); }));
  return fmt::format("{}: {} of {} bytes differ from the default configuration's output, first at byte {} "
                     "(0x{:02x}, expected 0x{:02x})",
                     what, diff, ref.size(), at, got[at], ref[at]);
}

// The paged cache both kv workloads use: `batch` sequences of `context[b] + new[b]` tokens over a
// shuffled lookup table, all layers allocated (the kernels are specialized on num_layers).
struct PagedCache {
  PagedKVCacheParams p;
  int64_t batch = 0, pages_per_seq = 0, num_blocks = 0;
  std::vector<uint32_t> lut, cache_lengths;
  DeviceBuffer blocks, scales, lut_d, lengths_d;
  int layer_idx = 0, kv_idx = 0;

  PagedCache(const PagedKVCacheParams& params, const std::vector<uint32_t>& lengths_before,
             const std::vector<uint32_t>& tokens_needed, data::Rng& rng)
      : p(params), batch(static_cast<int64_t>(lengths_before.size())), cache_lengths(lengths_before) {
    int64_t most = 1;
    for (auto n : tokens_needed) most = std::max<int64_t>(most, n);
    pages_per_seq = (most + p.page_size - 1) / p.page_size;
    num_blocks = batch * pages_per_seq;
    lut = data::shuffled_lookup_table(batch, pages_per_seq, rng);
    // The last layer and kv index, so that a kernel that forgets either stride writes elsewhere.
    layer_idx = p.num_layers - 1;
    kv_idx = p.kv_dim() - 1;
    blocks = DeviceBuffer(static_cast<size_t>(num_blocks) * p.kv_dim() * p.num_layers * p.page_size * p.row_bytes());
    if (p.split_scales())
      scales = DeviceBuffer(static_cast<size_t>(num_blocks) * p.kv_dim() * p.num_layers * p.page_size * p.num_heads *
                            p.head_dim_granularity() * sizeof(float));
    lut_d = data::upload(lut);
    lengths_d = data::upload(cache_lengths);
  }

  size_t slab_bytes() const { return static_cast<size_t>(p.page_size) * p.row_bytes(); }
  size_t scale_slab_bytes() const {
    return static_cast<size_t>(p.page_size) * p.num_heads * p.head_dim_granularity() * sizeof(float);
  }
  // Slab index of (block, kv_idx, layer_idx): slabs are page_size rows.
  size_t slab(int64_t blk) const {
    return (static_cast<size_t>(blk) * p.kv_dim() + kv_idx) * p.num_layers + layer_idx;
  }

  ops::PagedCacheView view() const {
    ops::PagedCacheView v;
    const int64_t bdims[6] = {num_blocks, p.kv_dim(), p.num_layers, p.page_size, p.num_heads, p.head_size};
    // fp8_ds_mla records, fp8_page_scales pages: u8 [num_blocks, 1, num_layers, page_size, row_bytes].
    const int64_t rdims[5] = {num_blocks, 1, p.num_layers, p.page_size, static_cast<int64_t>(p.row_bytes())};
    v.blocks = p.ds_mla() || p.page_scales() ? TensorView(blocks.get(), DType::u8, rdims, 5)
                                             : TensorView(blocks.get(), p.dtype, bdims, 6);
    if (p.split_scales()) {
      const int64_t sdims[6] = {num_blocks, p.kv_dim(), p.num_layers, p.page_size, p.num_heads, p.head_dim_granularity()};
      v.scales = TensorView(scales.get(), DType::f32, sdims, 6);
    }
    v.lookup_table = TensorView(lut_d.get(), DType::u32, {batch, pages_per_seq});
    v.cache_lengths = TensorView(lengths_d.get(), DType::u32, {batch});
    return v;
  }

  // Random values (and positive scales) in the (layer_idx, kv_idx) slab of every block; the rest
  // of the cache is never read. fp8_ds_mla records and fp8_page_scales pages are filled with random
  // finite e4m3 bytes: no byte is 0x7F or 0xFF, so their f32 scales and bf16 rope values are finite
  // too.
  void fill_random(data::Rng& rng) {
    blocks.fill_bytes(0);
    for (int64_t b = 0; b < num_blocks; ++b) data::fill_random(blocks, p.dtype, rng, slab(b) * slab_bytes(), slab_bytes());
    if (p.split_scales()) {
      scales.fill_bytes(0);
      std::vector<float> s(scale_slab_bytes() / sizeof(float));
      for (int64_t b = 0; b < num_blocks; ++b) {
        for (auto& x : s) x = rng.uniform(0.5f, 2.0f) / 448.0f;
        scales.upload(s.data(), scale_slab_bytes(), slab(b) * scale_slab_bytes());
      }
    }
  }

  // The (layer_idx, kv_idx) slabs of every block, blocks then scales.
  std::vector<uint8_t> read_slabs() const {
    const size_t sb = slab_bytes(), ssb = p.split_scales() ? scale_slab_bytes() : 0;
    std::vector<uint8_t> out(static_cast<size_t>(num_blocks) * (sb + ssb));
    const bool whole = p.kv_dim() * p.num_layers == 1;  // one slab per block: read in one copy
    if (whole) {
      blocks.download(out.data(), num_blocks * sb);
      if (ssb) scales.download(out.data() + num_blocks * sb, num_blocks * ssb);
      return out;
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
      blocks.download(out.data() + b * sb, sb, slab(b) * sb);
      if (ssb) scales.download(out.data() + num_blocks * sb + b * ssb, ssb, slab(b) * ssb);
    }
    return out;
  }
};

std::vector<uint32_t> context_lengths(int64_t batch, int64_t context, data::Rng& rng) {
  std::vector<uint32_t> c(batch);
  for (auto& x : c) x = static_cast<uint32_t>(std::max<int64_t>(0, context * 3 / 4 + rng.below(static_cast<uint32_t>(context / 2 + 1))));
  return c;
}

// ---- kv_cache_store -----------------------------------------------------------------------------

class KvStoreWorkload : public Workload {
 public:
  KvStoreWorkload(const KvCacheStoreParams& p, const Shape& s, uint64_t seed) : p_(p), rng_(seed) {
    tokens_ = s.at("tokens");
    const int64_t batch = std::min<int64_t>(s.at("batch"), tokens_);
    offsets_ = data::ragged_offsets(tokens_, batch, rng_);
    auto before = context_lengths(batch, s.at("context"), rng_);
    std::vector<uint32_t> needed(batch);
    for (int64_t b = 0; b < batch; ++b) needed[b] = before[b] + offsets_[b + 1] - offsets_[b];
    cache_ = std::make_unique<PagedCache>(p.cache, before, needed, rng_);
    const auto& c = p.cache;
    x_ = DeviceBuffer(static_cast<size_t>(tokens_) * c.num_heads * c.head_size * dtype_size(p.input_dtype));
    data::fill_random(x_, p.input_dtype, rng_);
    offsets_d_ = data::upload(offsets_);
    dropped_ = DeviceBuffer(4);
  }

  void run(const KernelSpec& spec, Stream stream) override {
    const auto& p = std::get<KvCacheStoreParams>(spec.params);
    const auto& c = p.cache;
    ops::kv_cache_store(p, TensorView(x_.get(), p.input_dtype, {tokens_, c.num_heads, c.head_size}),
                        TensorView(offsets_d_.get(), DType::u32, {static_cast<int64_t>(offsets_.size())}),
                        cache_->view(), cache_->layer_idx, cache_->kv_idx, TensorView(dropped_.get(), DType::u32, {1}),
                        stream);
  }
  void poison_output() override {
    cache_->blocks.fill_bytes(0xFF);
    if (p_.cache.split_scales()) cache_->scales.fill_bytes(0xFF);
    dropped_.fill_bytes(0);
  }
  std::vector<uint8_t> read_output() const override {
    auto out = cache_->read_slabs();
    uint8_t d[4];
    dropped_.download(d, 4);
    out.insert(out.end(), d, d + 4);
    return out;
  }
  std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got) const override {
    return compare_exact(ref, got, "cache slabs + dropped count");
  }
  double bytes_moved() const override {
    const auto& c = p_.cache;
    const double elems = static_cast<double>(tokens_) * c.num_heads * c.head_size;
    return elems * dtype_size(p_.input_dtype) + static_cast<double>(tokens_) * c.row_bytes() +
           (c.split_scales() ? static_cast<double>(tokens_) * c.num_heads * c.head_dim_granularity() * 4 : 0.0);
  }
  double flops() const override { return 0; }

 private:
  KvCacheStoreParams p_;
  data::Rng rng_;
  int64_t tokens_ = 0;
  std::vector<uint32_t> offsets_;
  std::unique_ptr<PagedCache> cache_;
  DeviceBuffer x_, offsets_d_, dropped_;
};

// ---- kv_cache_gather ----------------------------------------------------------------------------

class KvGatherWorkload : public Workload {
 public:
  KvGatherWorkload(const KvCacheGatherParams& p, const Shape& s, uint64_t seed) : p_(p), rng_(seed) {
    tokens_ = s.at("tokens");
    const int64_t batch = s.at("batch");
    auto lengths = context_lengths(batch, std::max<int64_t>(1, s.at("context")), rng_);
    for (auto& l : lengths) l = std::max(l, 1u);
    cache_ = std::make_unique<PagedCache>(p.cache, lengths, lengths, rng_);
    cache_->fill_random(rng_);
    std::vector<uint32_t> ids(tokens_), pos(tokens_);
    for (int64_t i = 0; i < tokens_; ++i) {
      ids[i] = rng_.below(static_cast<uint32_t>(batch));
      pos[i] = rng_.below(lengths[ids[i]]);
    }
    ids_d_ = data::upload(ids);
    pos_d_ = data::upload(pos);
    const auto& c = p.cache;
    y_ = DeviceBuffer(static_cast<size_t>(tokens_) * c.num_heads * c.head_size * dtype_size(p.output_dtype));
    dropped_ = DeviceBuffer(4);
  }

  void run(const KernelSpec& spec, Stream stream) override {
    const auto& p = std::get<KvCacheGatherParams>(spec.params);
    const auto& c = p.cache;
    ops::kv_cache_gather(p, cache_->view(), TensorView(ids_d_.get(), DType::u32, {tokens_}),
                         TensorView(pos_d_.get(), DType::u32, {tokens_}), cache_->layer_idx, cache_->kv_idx,
                         TensorView(y_.get(), p.output_dtype, {tokens_, c.num_heads, c.head_size}),
                         TensorView(dropped_.get(), DType::u32, {1}), stream);
  }
  void poison_output() override {
    y_.fill_bytes(0xFF);
    dropped_.fill_bytes(0);
  }
  std::vector<uint8_t> read_output() const override {
    std::vector<uint8_t> out(y_.size() + 4);
    y_.download(out.data(), y_.size());
    dropped_.download(out.data() + y_.size(), 4);
    return out;
  }
  std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got) const override {
    return compare_exact(ref, got, "y + dropped count");
  }
  double bytes_moved() const override {
    const auto& c = p_.cache;
    const double elems = static_cast<double>(tokens_) * c.num_heads * c.head_size;
    return elems * dtype_size(p_.output_dtype) + static_cast<double>(tokens_) * (c.row_bytes() + 8) +
           (c.split_scales() ? static_cast<double>(tokens_) * c.num_heads * c.head_dim_granularity() * 4 : 0.0);
  }
  double flops() const override { return 0; }

 private:
  KvCacheGatherParams p_;
  data::Rng rng_;
  int64_t tokens_ = 0;
  std::unique_ptr<PagedCache> cache_;
  DeviceBuffer ids_d_, pos_d_, y_, dropped_;
};

// ---- sparse_index_remap -------------------------------------------------------------------------

class RemapWorkload : public Workload {
 public:
  RemapWorkload(const SparseIndexRemapParams& p, const Shape& s, uint64_t seed) : p_(p), rng_(seed) {
    tokens_ = s.at("tokens");
    k_ = s.at("top_k");
    const int64_t batch = std::min<int64_t>(s.at("batch"), tokens_);
    const auto offsets = data::ragged_offsets(tokens_, batch, rng_);
    auto lengths = context_lengths(batch, s.at("context"), rng_);
    int64_t most = 1;
    for (int64_t b = 0; b < batch; ++b) {
      lengths[b] += offsets[b + 1] - offsets[b];
      most = std::max<int64_t>(most, lengths[b]);
    }
    pages_per_seq_ = (most + p.page_size - 1) / p.page_size;
    num_blocks_ = batch * pages_per_seq_;
    const auto lut = data::shuffled_lookup_table(batch, pages_per_seq_, rng_);
    std::vector<int32_t> idx(static_cast<size_t>(tokens_ * k_));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = offsets[b]; t < offsets[b + 1]; ++t)
        for (int64_t j = 0; j < k_; ++j)
          // ~3% -1 (padding of short top-k rows), the rest valid positions of the token's sequence.
          idx[t * k_ + j] = rng_.below(32) == 0 ? -1 : static_cast<int32_t>(rng_.below(lengths[b]));
    idx_d_ = data::upload(idx);
    offsets_d_ = data::upload(offsets);
    lut_d_ = data::upload(lut);
    batch_ = batch;
    out_ = DeviceBuffer(static_cast<size_t>(tokens_ * k_) * 4);
  }

  void run(const KernelSpec& spec, Stream stream) override {
    const auto& p = std::get<SparseIndexRemapParams>(spec.params);
    ops::sparse_index_remap(p, TensorView(idx_d_.get(), DType::i32, {tokens_, k_}),
                            TensorView(offsets_d_.get(), DType::u32, {batch_ + 1}),
                            TensorView(lut_d_.get(), DType::u32, {batch_, pages_per_seq_}), num_blocks_,
                            TensorView(out_.get(), DType::i32, {tokens_, k_}), stream);
  }
  void poison_output() override { out_.fill_bytes(0xFF); }
  std::vector<uint8_t> read_output() const override {
    std::vector<uint8_t> out(out_.size());
    out_.download(out.data(), out.size());
    return out;
  }
  std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got) const override {
    return compare_exact(ref, got, "encoded indices");
  }
  double bytes_moved() const override { return static_cast<double>(tokens_) * k_ * 8; }
  double flops() const override { return 0; }

 private:
  SparseIndexRemapParams p_;
  data::Rng rng_;
  int64_t tokens_ = 0, k_ = 0, batch_ = 0, pages_per_seq_ = 0, num_blocks_ = 0;
  DeviceBuffer idx_d_, offsets_d_, lut_d_, out_;
};

}  // namespace

std::unique_ptr<Workload> make_kv_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed) {
  switch (problem.op()) {
    case Op::kv_cache_store:
      return std::make_unique<KvStoreWorkload>(std::get<KvCacheStoreParams>(problem.params), shape, seed);
    case Op::kv_cache_gather:
      return std::make_unique<KvGatherWorkload>(std::get<KvCacheGatherParams>(problem.params), shape, seed);
    case Op::sparse_index_remap:
      return std::make_unique<RemapWorkload>(std::get<SparseIndexRemapParams>(problem.params), shape, seed);
    default: throw_error(ErrorKind::Internal, "make_kv_workload: {} is not a kv op", op_name(problem.op()));
  }
}

}  // namespace mlajit::autotune
