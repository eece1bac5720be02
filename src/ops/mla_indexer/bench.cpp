// Benchmark driver of mla_indexer; see ops/mla_indexer/bench.hpp.
#include "ops/mla_indexer/bench.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/ops.hpp"
#include "mlajit/runtime.hpp"
#include "ops/mla_indexer/stages.hpp"

namespace mlajit::bench {

namespace {

// A random finite e4m3 byte with magnitude in [2^-4, 2^3]: no NaN, no zeros.
uint8_t random_fp8(std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint8_t mag = static_cast<uint8_t>(0x18 + (r % 0x38));  // exponent field 3..9
  return static_cast<uint8_t>(((r >> 8) & 1 ? 0x80 : 0) | mag);
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

nlohmann::json bench_mla_indexer(const MlaIndexerBenchArgs& a) {
  MLAJIT_EXPECT(a.new_tokens >= 1, "new_tokens", a.new_tokens, ">= 1");
  MLAJIT_EXPECT(a.cached_tokens >= 0, "cached_tokens", a.cached_tokens, ">= 0");
  MLAJIT_EXPECT(a.reps >= 1, "reps", a.reps, ">= 1");
  MlaIndexerParams p;
  p.num_heads = a.num_heads;
  p.top_k = a.top_k;
  p.page_size = a.page_size;
  p.mask = a.mask;
  p.num_stages = a.num_stages;
  p.validate();
  driver::ensure_context();

  const int64_t T = a.new_tokens, L = a.cached_tokens, keys = L + T, H = a.num_heads;
  const int layers = 2;
  const int64_t pages = (keys + a.page_size - 1) / a.page_size;
  const int64_t num_blocks = pages + 1;
  std::mt19937_64 rng(1234);
  std::vector<uint8_t> q(static_cast<size_t>(T * H * 128)),
      kb(static_cast<size_t>(num_blocks * layers * a.page_size * 128));
  for (auto& v : q) v = random_fp8(rng);
  for (auto& v : kb) v = random_fp8(rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qs(static_cast<size_t>(T * H)), ks(static_cast<size_t>(num_blocks * layers * a.page_size));
  for (auto& v : qs) v = normal(rng);
  for (auto& v : ks) v = 0.5f + std::abs(normal(rng));
  std::vector<uint32_t> lut(static_cast<size_t>(pages));
  std::iota(lut.begin(), lut.end(), 1u);  // block 0 unused
  std::shuffle(lut.begin(), lut.end(), rng);
  const std::vector<uint32_t> off = {0, static_cast<uint32_t>(T)}, cl = {static_cast<uint32_t>(L)};

  auto up = [](const void* p, size_t n) {
    driver::DeviceBuffer b(std::max<size_t>(n, 16));
    b.upload(p, n);
    return b;
  };
  driver::DeviceBuffer dq = up(q.data(), q.size()), dqs = up(qs.data(), qs.size() * 4), dkb = up(kb.data(), kb.size()),
                       dks = up(ks.data(), ks.size() * 4), dlut = up(lut.data(), lut.size() * 4),
                       doff = up(off.data(), 8), dcl = up(cl.data(), 4);
  const size_t ws_bytes = ops::mla_indexer_workspace_bytes(p, T, keys);
  driver::DeviceBuffer ws(std::max<size_t>(ws_bytes, 16)), out(static_cast<size_t>(T * a.top_k) * 4);
  ops::PagedCacheView kc;
  kc.blocks = TensorView(dkb.get(), DType::fp8_e4m3, {num_blocks, 1, layers, a.page_size, 1, 128});
  kc.scales = TensorView(dks.get(), DType::f32, {num_blocks, 1, layers, a.page_size, 1, 1});
  kc.lookup_table = TensorView(dlut.get(), DType::u32, {1, pages});
  kc.cache_lengths = TensorView(dcl.get(), DType::u32, {1});
  const TensorView vq(dq.get(), DType::fp8_e4m3, {T, H, 128}), vqs(dqs.get(), DType::f32, {T, H}),
      voff(doff.get(), DType::u32, {2}), vout(out.get(), DType::i32, {T, a.top_k}),
      vws(ws.get(), DType::f32, {static_cast<int64_t>(std::max<size_t>(ws_bytes, 16) / 4)});

  auto time_stages = [&](unsigned stages) {
    for (int w = 0; w < 2; ++w) ops::detail::mla_indexer_run(p, vq, vqs, voff, kc, 1, keys, vout, vws, nullptr, stages);
    driver::synchronize();
    std::vector<float> ms;
    driver::EventTimer timer;
    for (int r = 0; r < a.reps; ++r) {
      timer.start();
      ops::detail::mla_indexer_run(p, vq, vqs, voff, kc, 1, keys, vout, vws, nullptr, stages);
      timer.stop();
      ms.push_back(timer.elapsed_ms());
    }
    return median(ms);
  };
  const float scores_ms = time_stages(ops::detail::kIndexerScores);
  const float topk_ms = time_stages(ops::detail::kIndexerTopk);
  const float total_ms = time_stages(ops::detail::kIndexerScores | ops::detail::kIndexerTopk);

  int64_t pairs = 0;
  for (int64_t i = 0; i < T; ++i) pairs += a.mask == Mask::causal ? L + i + 1 : keys;
  const double flops = 2.0 * static_cast<double>(pairs) * static_cast<double>(H) * 128.0;
  nlohmann::json j;
  j["op"] = "mla_indexer";
  j["num_heads"] = H;
  j["new_tokens"] = T;
  j["cached_tokens"] = L;
  j["s_kv"] = keys;
  j["top_k"] = a.top_k;
  j["page_size"] = a.page_size;
  j["mask"] = a.mask == Mask::causal ? "causal" : "none";
  j["reps"] = a.reps;
  j["num_stages"] = a.num_stages;
  j["arch"] = Runtime::global().arch();
  j["visible_pairs"] = pairs;
  j["workspace_bytes"] = ws_bytes;
  j["scores_ms"] = scores_ms;
  j["topk_ms"] = topk_ms;
  j["total_ms"] = total_ms;
  j["score_tflops"] = flops / (scores_ms * 1e-3) / 1e12;
  j["total_tflops"] = flops / (total_ms * 1e-3) / 1e12;
  return j;
}

}  // namespace mlajit::bench
