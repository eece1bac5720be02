// Benchmark driver of sparse_prefill; see ops/sparse_prefill/bench.hpp.
#include "ops/sparse_prefill/bench.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "autotune/device_data.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/sparse_prefill/launch.hpp"
#include "ops/sparse_prefill/plan.hpp"

namespace mlajit::bench {

namespace {

constexpr int kLayers = 2;
constexpr int kLayer = 1;
constexpr int kWarmup = 3;

}  // namespace

nlohmann::json bench_sparse_prefill(const SparsePrefillBenchArgs& a) {
  MLAJIT_EXPECT(a.s_q >= 1, "s_q", a.s_q, ">= 1");
  MLAJIT_EXPECT(a.topk >= 1, "topk", a.topk, ">= 1");
  MLAJIT_EXPECT(a.s_kv >= a.topk, "s_kv", a.s_kv, fmt::format(">= topk ({}): indices are distinct", a.topk));
  MLAJIT_EXPECT(a.s_kv <= (int64_t{1} << 30), "s_kv", a.s_kv, "<= 2^30");
  MLAJIT_EXPECT(a.reps >= 1, "reps", a.reps, ">= 1");
  SparsePrefillParams p;
  p.kv_dtype = a.kv_dtype;
  p.num_q_heads = a.num_heads;
  p.b_topk = a.b_topk;
  p.page_size = a.page_size;
  p.scale_block_size = a.scale_block_size;
  p.attn_sink = a.attn_sink;
  p.emit_lse = a.emit_lse;
  p.validate();
  const sparse_prefill::Path requested = sparse_prefill::parse_path(a.path, "path");

  const int dev = driver::ensure_context();
  Runtime& rt = Runtime::global();
  const sparse_prefill::Path path = sparse_prefill::resolve_path(p, rt.arch(), requested);

  const int64_t T = a.s_q, H = a.num_heads;
  const int64_t stride = (a.topk + p.b_topk - 1) / p.b_topk * p.b_topk;
  const int64_t pages = (a.s_kv + p.page_size - 1) / p.page_size;
  const int64_t num_blocks = pages + 1;  // one block no sequence maps
  autotune::data::Rng rng(2024);

  driver::DeviceBuffer q(static_cast<size_t>(T * H * 576 * 2));
  autotune::data::fill_random(q, DType::bf16, rng);
  const size_t rows = static_cast<size_t>(num_blocks * kLayers * p.page_size);
  driver::DeviceBuffer blocks(rows * 576 * dtype_size(p.kv_dtype));
  autotune::data::fill_random(blocks, p.kv_dtype, rng);
  driver::DeviceBuffer scales;
  const int spt = p.kv_dtype == DType::fp8_e4m3 ? p.scales_per_token() : 0;
  if (spt > 0) {
    std::vector<float> sc(rows * spt);
    for (auto& x : sc) x = rng.uniform(0.25f, 1.0f);
    scales = autotune::data::upload(sc);
  }

  // Distinct random positions per row (partial Fisher-Yates over the pool), encoded through the
  // shuffled lookup table.
  const auto lut = autotune::data::shuffled_lookup_table(1, num_blocks, rng);
  std::vector<uint32_t> pool(static_cast<size_t>(a.s_kv));
  std::iota(pool.begin(), pool.end(), 0u);
  std::vector<uint32_t> idx(static_cast<size_t>(T * stride), 0xFFFFFFFFu);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < a.topk; ++j) {
      const size_t k = static_cast<size_t>(j) + rng.below(static_cast<uint32_t>(a.s_kv - j));
      std::swap(pool[static_cast<size_t>(j)], pool[k]);
      const uint32_t pos = pool[static_cast<size_t>(j)];
      idx[static_cast<size_t>(t * stride + j)] = lut[pos / p.page_size] * p.page_size + pos % p.page_size;
    }
  }
  driver::DeviceBuffer indices = autotune::data::upload(idx);
  driver::DeviceBuffer lengths =
      autotune::data::upload(std::vector<uint32_t>(static_cast<size_t>(T), static_cast<uint32_t>(a.topk)));
  std::vector<float> sink_h(static_cast<size_t>(H));
  for (auto& x : sink_h) x = rng.uniform(-1.f, 1.f);
  driver::DeviceBuffer sink = autotune::data::upload(sink_h);
  driver::DeviceBuffer out(static_cast<size_t>(T * H * 512 * 2));
  driver::DeviceBuffer lse(static_cast<size_t>(T * H * 4));

  ops::PagedCacheView kv;
  kv.blocks = TensorView(blocks.get(), p.kv_dtype, {num_blocks, 1, kLayers, p.page_size, 1, 576});
  if (spt > 0) kv.scales = TensorView(scales.get(), DType::f32, {num_blocks, 1, kLayers, p.page_size, 1, spt});
  const SparsePrefillArgs args = sparse_prefill::make_args(
      p, TensorView(q.get(), DType::bf16, {T, H, 576}), kv, TensorView(indices.get(), DType::u32, {T, stride}),
      TensorView(lengths.get(), DType::u32, {T}), kLayer, 0.0416667f,
      p.attn_sink ? TensorView(sink.get(), DType::f32, {H}) : TensorView(),
      TensorView(out.get(), DType::bf16, {T, H, 512}), p.emit_lse ? TensorView(lse.get(), DType::f32, {T, H}) : TensorView());
  auto kernel = rt.get(KernelSpec{p});  // compile / load outside the timed region

  Stream stream = driver::create_stream();
  for (int i = 0; i < kWarmup; ++i) sparse_prefill::launch(*kernel, p, path, args, stream);
  std::vector<float> ms;
  driver::EventTimer timer;
  for (int r = 0; r < a.reps; ++r) {
    timer.start(stream);
    sparse_prefill::launch(*kernel, p, path, args, stream);
    timer.stop(stream);
    ms.push_back(timer.elapsed_ms());
  }
  driver::destroy_stream(stream);
  std::vector<float> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], best = sorted.front(), worst = sorted.back();
  const double flops = 2.0 * static_cast<double>(T) * a.topk * static_cast<double>(H) * (576 + 512);

  const auto info = driver::device_info(dev);
  nlohmann::json j;
  j["op"] = "sparse_prefill";
  j["params"] = params_to_json(OpParams{p});
  j["path"] = sparse_prefill::path_name(path);
  j["arch"] = rt.arch();
  j["device"] = info.name;
  j["s_q"] = T;
  j["num_heads"] = H;
  j["topk"] = a.topk;
  j["s_kv"] = a.s_kv;
  j["reps"] = a.reps;
  j["flops"] = flops;
  j["ms"] = {{"median", median}, {"min", best}, {"max", worst}};
  j["tflops"] = flops / (median * 1e-3) / 1e12;
  j["tflops_best"] = flops / (best * 1e-3) / 1e12;
  return j;
}

}  // namespace mlajit::bench
