// The runtime's memory-hit path without a GPU: spec hashing + the sharded single-flight lookup.
// (The GPU suite measures the whole get()+launch against raw cuLaunchKernel.)
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "jit/memory_cache.hpp"
#include "sanitized_build.hpp"
#include "mlajit/params.hpp"

using namespace mlajit;

namespace {

struct SpecOnDevice {
  KernelSpec spec;
  int device;
  bool operator==(const SpecOnDevice& o) const { return device == o.device && spec == o.spec; }
};

}  // namespace

TEST_CASE("memory-hit lookup costs well under a microsecond") {
  detail::SingleFlightCache<SpecOnDevice, int> cache;
  // A realistic population: a sweep of prefill and indexer variants.
  std::vector<KernelSpec> specs;
  for (bool sink : {false, true})
    for (int heads = 16; heads <= 128; heads += 16)
      for (auto dt : {DType::bf16, DType::fp8_e4m3}) {
        SparsePrefillParams p;
        p.attn_sink = sink;
        p.num_q_heads = heads;
        p.kv_dtype = dt;
        specs.push_back(KernelSpec{p});
      }
  for (int k : {256, 512, 1024, 2048}) {
    MlaIndexerParams m;
    m.top_k = k;
    specs.push_back(KernelSpec{m});
  }
  for (size_t i = 0; i < specs.size(); ++i)
    cache.get({specs[i], 0}, specs[i].hash(), [&] { return std::make_shared<const int>(static_cast<int>(i)); });
  REQUIRE(cache.size() == specs.size());

  auto lookup = [&](const KernelSpec& s) {
    return cache.get({s, 0}, s.hash(), []() -> std::shared_ptr<const int> { throw std::logic_error("miss"); });
  };
  const int iters = 200000;
  long sink = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) sink += *lookup(specs[i % specs.size()]);
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
  MESSAGE("memory-hit lookup (hash + shared-lock find + shared_ptr copy), 1 thread: " << ns << " ns");
  CHECK(sink > 0);
  if (!mlajit::testing::kSanitizedBuild) CHECK(ns < 1000);

  // Four threads hammering the same hot key.
  std::vector<std::thread> ts;
  std::vector<double> per(4);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      auto a = std::chrono::steady_clock::now();
      for (int i = 0; i < iters / 4; ++i) lookup(specs[0]);
      per[t] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - a).count() / (iters / 4);
    });
  for (auto& th : ts) th.join();
  double worst = *std::max_element(per.begin(), per.end());
  MESSAGE("memory-hit lookup, 4 threads on one key: " << worst << " ns (worst thread)");
  if (!mlajit::testing::kSanitizedBuild) CHECK(worst < 5000);
}
