// The remote tier stays off the hot path: a Runtime::get memory hit costs the same with a remote
// cache attached as without, and never calls the store (printed figures; the store counts calls).
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

#include "gpu/gpu_util.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/runtime.hpp"
#include "unit/handwritten_kernel.hpp"

using namespace mlajit;
using namespace mlajit_test;

namespace {

// An in-process store that counts every call: any network access on the hot path would show.
class CountingStore final : public RemoteStore {
 public:
  std::optional<std::string> get(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++calls;
    auto it = map_.find(key);
    return it == map_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  void put(const std::string& key, const std::string& value, long) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++calls;
    map_[key] = value;
  }
  bool add_member(const std::string&, const std::string&, const std::string&, long) override {
    ++calls;
    return false;
  }
  std::vector<std::pair<std::string, std::string>> members(const std::string&) override {
    ++calls;
    return {};
  }
  void ping() override { ++calls; }
  std::string describe() const override { return "counting://"; }
  std::atomic<uint64_t> calls{0};

 private:
  std::mutex mu_;
  std::map<std::string, std::string> map_;
};

}  // namespace

TEST_CASE("Runtime::get memory hit: same cost with and without the remote tier, no store call (printed)") {
  const std::string tag = "// remote hot path " + std::to_string(::getpid()) + "." + std::to_string(std::time(nullptr)) + "\n";
  auto store = std::make_unique<CountingStore>();
  CountingStore* counting = store.get();
  RemoteConfig cfg;
  cfg.url = "counting://";
  auto remote = std::make_shared<RemoteCache>(std::move(store), cfg, "hot-path-test-fleet-key-0123456789");

  auto make = [&](bool with_remote) {
    RuntimeOptions o;
    o.codegen = [tag](const KernelSpec& s) { return axpy_source(s, tag); };
    o.disk_cache_enabled = false;
    o.remote_cache = with_remote ? remote : nullptr;
    o.remote_cache_enabled = with_remote;
    return Runtime::create(std::move(o));
  };
  auto with = make(true), without = make(false);
  KernelSpec spec = axpy_spec(4);
  with->get(spec);  // miss: remote get, compile, remote put
  without->get(spec);
  const uint64_t calls_after_load = counting->calls;
  CHECK(calls_after_load == 2);

  double t_with = 0, t_without = 0;
  for (int round = 0; round < 5; ++round) {  // interleaved to cancel drift
    t_without += ns_per_call([&] { (void)without->get(spec); }, 200000) / 5;
    t_with += ns_per_call([&] { (void)with->get(spec); }, 200000) / 5;
  }
  std::printf("[remote] Runtime::get memory hit: %.1f ns without a remote tier, %.1f ns with one; store calls during "
              "%d hits: %llu\n",
              t_without, t_with, 2000000, static_cast<unsigned long long>(counting->calls - calls_after_load));
  CHECK(counting->calls == calls_after_load);
  CHECK(t_with < t_without * 1.5 + 20);  // equal up to timing noise
}
