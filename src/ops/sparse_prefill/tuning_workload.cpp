// Tuner workload of sparse_prefill (SPEC §3): bf16 queries attending to `top_k` keys each, picked at
// random from a shuffled paged latent cache with two layers (bf16, or fp8 with positive scales).
// Outputs are floats whose rounding depends on the tiling, so candidates are accepted when the
// relative Frobenius error to the default configuration's output is < 1e-2 (out, and lse when
// emitted; qk_math fp8 too, see below) and no value that the default computed as finite is NaN/inf.
#include <algorithm>
#include <cmath>

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
// Candidates must agree with each other to this. The op has no knobs today, so a group holds the
// default spec alone; qk_math fp8 is held to the same bound, and an FP8-math knob that changed the
// rounding would need its own bound here (up to twice ref::fp8_math_bounds, the error of each
// against the exact result).
constexpr double kMaxRelFrobenius = 1e-2;

// Relative Frobenius error of `got` against `ref`; a non-finite value where ref is finite counts
// as an infinite error. Entries where ref is not finite (lse of an empty row) must match exactly.
template <typename Get>
std::string rel_frobenius(size_t n, Get get, const char* what, double max_rel) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto [r, g] = get(i);
    if (!std::isfinite(r)) {
      if (!(std::isnan(r) ? std::isnan(g) : r == g))
        return fmt::format("{}[{}] = {}, the default configuration computed {}", what, i, g, r);
      continue;
    }
    if (!std::isfinite(g)) return fmt::format("{}[{}] = {}, the default configuration computed {}", what, i, g, r);
    num += (g - r) * (g - r);
    den += r * r;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (rel < max_rel) return "";
  return fmt::format("{}: relative Frobenius error {:.3g} to the default configuration's output, expected < {}", what,
                     rel, max_rel);
}

class PrefillWorkload : public Workload {
 public:
  PrefillWorkload(const SparsePrefillParams& p, const Shape& s, uint64_t seed) : p_(p), rng_(seed) {
    tokens_ = s.at("tokens");
    top_k_ = s.at("top_k");
    stride_ = (top_k_ + 127) / 128 * 128;
    const int64_t keys = s.at("keys");
    const int H = p.num_q_heads;

    q_ = DeviceBuffer(static_cast<size_t>(tokens_) * H * p.qk_depth * 2);
    data::fill_random(q_, DType::bf16, rng_);

    // One sequence of `keys` tokens through a shuffled table.
    pages_ = (keys + p.page_size - 1) / p.page_size;
    num_blocks_ = pages_;
    const auto lut = data::shuffled_lookup_table(1, pages_, rng_);
    lut_d_ = data::upload(lut);
    const std::vector<uint32_t> lengths{static_cast<uint32_t>(keys)};
    lengths_d_ = data::upload(lengths);
    const size_t rows = static_cast<size_t>(num_blocks_) * kLayers * p.page_size;
    kv_ = DeviceBuffer(rows * static_cast<size_t>(p.row_bytes()));
    if (p.kv_layout == CacheLayout::fp8_ds_mla) {
      data::fill_random_ds_mla(kv_, p.scale_fmt == ScaleFmt::ue8m0, rng_);
    } else {
      data::fill_random(kv_, p.kv_dtype, rng_);
    }
    if (p.kv_dtype == DType::fp8_e4m3 && p.scales_per_token() > 0) {
      std::vector<float> sc(rows * p.scales_per_token());
      for (auto& x : sc) x = rng_.uniform(0.25f, 1.0f);
      if (p.scale_fmt == ScaleFmt::ue8m0)  // the spec's promise: powers of two (1/2 or 1)
        for (auto& x : sc) x = x <= 0.5f ? 0.5f : 1.0f;
      scales_d_ = data::upload(sc);
    }

    std::vector<uint32_t> idx(static_cast<size_t>(tokens_ * stride_), 0xFFFFFFFFu);
    for (int64_t t = 0; t < tokens_; ++t)
      for (int64_t j = 0; j < top_k_; ++j) {
        const uint32_t pos = rng_.below(static_cast<uint32_t>(keys));
        idx[t * stride_ + j] = lut[pos / p.page_size] * p.page_size + pos % p.page_size;
      }
    idx_d_ = data::upload(idx);
    lens_d_ = data::upload(std::vector<uint32_t>(tokens_, static_cast<uint32_t>(top_k_)));
    if (p.attn_sink) {
      std::vector<float> sink(H);
      for (auto& x : sink) x = rng_.uniform(-1.0f, 1.0f);
      sink_d_ = data::upload(sink);
    }
    out_ = DeviceBuffer(static_cast<size_t>(tokens_) * H * p.v_depth * 2);
    if (p.emit_lse) lse_ = DeviceBuffer(static_cast<size_t>(tokens_) * H * 4);
    // kv_staging bf16: the staged copy; the persistent kernel: its tail split's partial slots (the knobs do
    // not change the size).
    if (const size_t ws = ops::sparse_prefill_workspace_bytes(p, num_blocks_)) workspace_ = DeviceBuffer(ws);
  }

  void run(const KernelSpec& spec, Stream stream) override {
    const auto& p = std::get<SparsePrefillParams>(spec.params);
    const int H = p.num_q_heads;
    ops::PagedCacheView kv;
    const bool ds_mla = p.kv_layout == CacheLayout::fp8_ds_mla;  // one 656-byte record per row
    const int64_t bdims[6] = {num_blocks_, 1, kLayers, p.page_size, 1, ds_mla ? 656 : p.qk_depth};
    kv.blocks = TensorView(kv_.get(), p.kv_dtype, bdims, 6);
    if (scales_d_.get()) {
      const int64_t sdims[6] = {num_blocks_, 1, kLayers, p.page_size, 1, p.scales_per_token()};
      kv.scales = TensorView(scales_d_.get(), DType::f32, sdims, 6);
    }
    kv.lookup_table = TensorView(lut_d_.get(), DType::u32, {1, pages_});
    kv.cache_lengths = TensorView(lengths_d_.get(), DType::u32, {1});
    ops::sparse_prefill(p, TensorView(q_.get(), DType::bf16, {tokens_, H, p.qk_depth}), kv,
                        TensorView(idx_d_.get(), DType::u32, {tokens_, stride_}),
                        TensorView(lens_d_.get(), DType::u32, {tokens_}), kLayer,
                        static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.qk_depth))),
                        p.attn_sink ? TensorView(sink_d_.get(), DType::f32, {H}) : TensorView(),
                        TensorView(out_.get(), DType::bf16, {tokens_, H, p.v_depth}),
                        p.emit_lse ? TensorView(lse_.get(), DType::f32, {tokens_, H}) : TensorView(),
                        workspace_.get() ? TensorView(workspace_.get(), DType::u32,
                                                      {static_cast<int64_t>(workspace_.size() / 4)})
                                         : TensorView(),
                        stream);
  }
  void poison_output() override {
    out_.fill_bytes(0xFF);
    if (lse_.get()) lse_.fill_bytes(0xFF);
  }
  std::vector<uint8_t> read_output() const override {
    std::vector<uint8_t> out(out_.size() + lse_.size());
    out_.download(out.data(), out_.size());
    if (lse_.get()) lse_.download(out.data() + out_.size(), lse_.size());
    return out;
  }
  std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got) const override {
    if (ref.size() != got.size())
      return fmt::format("output: {} bytes, the default configuration wrote {}", got.size(), ref.size());
    const size_t n_out = out_.size() / 2;
    std::string why = rel_frobenius(
        n_out,
        [&](size_t i) {
          uint16_t r, g;
          std::memcpy(&r, ref.data() + 2 * i, 2);
          std::memcpy(&g, got.data() + 2 * i, 2);
          return std::pair<double, double>(data::bf16_to_float(r), data::bf16_to_float(g));
        },
        "out", max_rel());
    if (!why.empty() || !lse_.get()) return why;
    const uint8_t* r0 = ref.data() + out_.size();
    const uint8_t* g0 = got.data() + out_.size();
    return rel_frobenius(
        lse_.size() / 4,
        [&](size_t i) {
          float r, g;
          std::memcpy(&r, r0 + 4 * i, 4);
          std::memcpy(&g, g0 + 4 * i, 4);
          return std::pair<double, double>(r, g);
        },
        "lse", max_rel());
  }
  double max_rel() const { return kMaxRelFrobenius; }
  double bytes_moved() const override {
    const int H = p_.num_q_heads;
    return static_cast<double>(tokens_) *
           (H * p_.qk_depth * 2.0 + top_k_ * (static_cast<double>(p_.row_bytes()) + 4) +
            H * p_.v_depth * 2.0);
  }
  double flops() const override {
    return 2.0 * static_cast<double>(tokens_) * top_k_ * p_.num_q_heads * (p_.qk_depth + p_.v_depth);
  }

 private:
  SparsePrefillParams p_;
  data::Rng rng_;
  int64_t tokens_ = 0, top_k_ = 0, stride_ = 0, pages_ = 0, num_blocks_ = 0;
  DeviceBuffer q_, lut_d_, lengths_d_, kv_, scales_d_, idx_d_, lens_d_, sink_d_, out_, lse_, workspace_;
};

}  // namespace

std::unique_ptr<Workload> make_prefill_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed) {
  return std::make_unique<PrefillWorkload>(std::get<SparsePrefillParams>(problem.params), shape, seed);
}

}  // namespace mlajit::autotune
