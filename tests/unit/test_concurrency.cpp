// Threads sharing the process-wide state a serving process shares: one disk cache that builds put
// into and evict from while other threads list and verify it, and the tuning index that lookups
// read while a reload publishes a new one. Meant for ThreadSanitizer (scripts/sanitize.sh tsan),
// which sees races between threads only when a test runs them concurrently; the assertions also
// hold in every other build.
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "jit/build_source.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/version.hpp"
#include "unit/handwritten_kernel.hpp"

namespace fs = std::filesystem;
using namespace mlajit;
using mlajit::testing::TempDir;

TEST_CASE("concurrency: 4 threads build into one capped disk cache while another lists and verifies it") {
  if (!Compiler::available()) {
    MESSAGE("NVRTC unavailable: skipped");
    return;
  }
  TempDir dir("concurrency_cache", /*create=*/false);
  // The size of one entry, for a cap of about two entries: eviction runs on most puts.
  uint64_t entry = 0;
  {
    DiskCache probe(dir.str());
    build_source(mlajit_test::axpy_source(mlajit_test::axpy_spec(1)), "sm_90a", &probe);
    for (auto& l : probe.list()) entry = l.size;
    probe.clear();
  }
  REQUIRE(entry > 0);
  DiskCache cache(dir.str(), 2 * entry + entry / 2);

  // Thread t builds divisors t, t+1, t+2, t+3: neighbours share three sources, so the same key is
  // looked up, locked, put and evicted by several threads at once.
  constexpr int kBuilders = 4, kPerBuilder = 4;
  std::atomic<int> builders_left{kBuilders};
  std::vector<int> good_cubins(kBuilders, 0);
  std::vector<std::string> errors(kBuilders + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kBuilders; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kPerBuilder; ++i) {
          auto b = build_source(mlajit_test::axpy_source(mlajit_test::axpy_spec(1 << (t + i))), "sm_90a", &cache);
          good_cubins[t] += b.cubin.compare(0, 4, "\x7f" "ELF") == 0;
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
      --builders_left;
    });
  int observations = 0;
  size_t corrupt_seen = 0;
  threads.emplace_back([&] {
    try {
      while (builders_left > 0) {
        (void)cache.list();
        corrupt_seen += cache.verify(/*remove_corrupt=*/false).corrupt.size();
        ++observations;
      }
    } catch (const std::exception& e) {
      errors[kBuilders] = e.what();
    }
  });
  for (auto& th : threads) th.join();

  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (int n : good_cubins) CHECK(n == kPerBuilder);
  CHECK(corrupt_seen == 0);  // an entry being written, renamed or evicted is never seen half-done
  auto rep = cache.verify();
  CHECK(rep.corrupt.empty());
  CHECK(rep.ok == rep.entries);
  MESSAGE((kBuilders * kPerBuilder) << " builds of 7 distinct sources under a " << 2 * entry + entry / 2
                                  << "-byte cap; the observer listed and verified " << observations << " times; "
                                  << rep.entries << " entries left");
}

TEST_CASE("concurrency: tuning lookups on 4 threads while another reloads the index (>= 20 times)") {
  TempDir dir("concurrency_tuning");
  {
    autotune::TuningRecord r;
    r.op = Op::kv_cache_store;
    r.device = "GPU-A";
    r.sm_count = 132;
    r.bucket = autotune::bucket_kv_cache_store(int64_t{1} << 17, 8);
    r.version = kVersion;
    r.params = KvCacheStoreParams{};
    r.median_ms = 1.0;
    r.default_ms = 1.5;
    r.tuned_at = 1;
    autotune::TuningDb(autotune::TuningDb::default_path(dir.str())).merge({r});
  }
  const KvCacheStoreParams problem;
  const auto bucket = autotune::bucket_kv_cache_store(int64_t{1} << 17, 8);
  std::atomic<bool> reloading{true};
  std::atomic<long> lookups{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&] {
      // Without a GPU the lookup stops at the device (no record can match); with one it probes the
      // index. Either way it reads the published index while reloads replace it.
      while (reloading) {
        (void)autotune::tuned_params(OpParams{problem}, bucket, 0);
        ++lookups;
      }
    });
  // At least 20 reloads, and on until the readers have looked up meanwhile (a fast build reloads
  // 20 times before the threads have started).
  int reloads = 0;
  while (reloads < 20 || lookups < 1000) {
    autotune::reload_tuning_index(dir.str());
    ++reloads;
  }
  reloading = false;
  for (auto& th : readers) th.join();
  autotune::reload_tuning_index();  // back to the default cache directory's database
  MESSAGE(lookups.load() << " lookups during " << reloads << " reloads");
  CHECK(lookups > 0);
}
