// Autotuning on the GPU: a small kv_cache_store sweep is verified, timed and persisted; the
// winner is what the run-time lookup returns; a second run is a database hit that times nothing;
// a candidate whose output is wrong (test hook) is rejected however fast it is; an op call logs
// (MLAJIT_LOG=info) that the record chose its knobs.
#include "temp_dir.hpp"
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "autotune/test_hooks.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/log_sink.hpp"
#include "mlajit/version.hpp"
#include "ops/tuning.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace mlajit;
using namespace mlajit::autotune;

using mlajit::testing::TempDir;

namespace {

// fp8 store with 2 layers (the workload writes the last one) and a small ragged batch.
std::vector<TuneGroup> store_sweep() {
  return tune_groups_from_config(json::parse(R"({"kernels": [
      {"op": "kv_cache_store",
       "params": {"dtype": "fp8_e4m3", "num_heads": 1, "head_size": 576, "page_size": 64, "is_mla": true,
                  "num_layers": 2, "quantization_granularity": 64, "scale_fmt": "fp32", "input_dtype": "bf16"},
       "sweep": {"threads": [64, 256]}}]})"));
}

TuneOptions small_options(const std::string& cache_dir) {
  TuneOptions o;
  o.cache_dir = cache_dir;
  o.reps = 5;
  o.warmup = 2;
  o.jobs = 4;
  o.devices = {driver::ensure_context()};
  o.shapes[Op::kv_cache_store] = {{"tokens", 4096}, {"batch", 4}, {"context", 300}};
  return o;
}

}  // namespace

TEST_SUITE("gpu autotune") {

TEST_CASE("time_launches: median between min and max, all positive") {
  driver::DeviceBuffer buf(64 << 20);
  const Timing t = time_launches([&](Stream) { buf.fill_bytes(1); }, 1, 7);
  CHECK(t.reps == 7);
  CHECK(t.min_ms > 0);
  CHECK(t.min_ms <= t.median_ms);
  CHECK(t.median_ms <= t.max_ms);
}

TEST_CASE("kv_cache_store sweep: winner verified, persisted, looked up; rerun is a database hit") {
  TempDir dir("gpu_autotune");
  const auto groups = store_sweep();
  REQUIRE(groups.size() == 1);
  REQUIRE(groups[0].candidates.size() == 3);  // 128 (default), 64, 256

  const TuneReport first = tune(groups, small_options(dir.path.string()));
  REQUIRE(first.gpu);
  REQUIRE(first.groups.size() == 1);
  const GroupResult& g = first.groups[0];
  REQUIRE(g.devices.size() == 1);
  for (const auto& c : g.candidates) {
    INFO(c.origin, " ", knobs_of(c.spec.params).dump(), ": ", c.devices[0].status, " ", c.devices[0].reason);
    CHECK(c.compiled);
    CHECK(c.devices[0].status == "ok");
    CHECK(c.devices[0].timing.reps == 5);
    CHECK(c.devices[0].timing.median_ms > 0);
  }
  const GroupDeviceResult& d = g.devices[0];
  REQUIRE(d.winner >= 0);
  CHECK_FALSE(d.from_db);
  CHECK(d.default_ms > 0);
  CHECK(d.best_ms <= d.default_ms);
  CHECK(first.db_written == 1);
  MESSAGE("kv_cache_store fp8 576: default ", d.default_ms, " ms, best ", knobs_of(g.candidates[d.winner].spec.params).dump(),
          " ", d.best_ms, " ms; tune took ", first.total_seconds, " s");

  // Persisted: one record, the winner's knobs, this device.
  const auto recs = TuningDb(first.db_path).load();
  REQUIRE(recs.size() == 1);
  const auto info = driver::device_info(d.device);
  CHECK(recs[0].device == info.name);
  CHECK(recs[0].sm_count == info.sm_count);
  CHECK(recs[0].version == kVersion);
  CHECK(knobs_of(recs[0].params) == knobs_of(g.candidates[d.winner].spec.params));

  // The run-time lookup (what the ops call) returns it for the same problem and bucket.
  reload_tuning_index(dir.path.string());
  KvCacheStoreParams query = std::get<KvCacheStoreParams>(groups[0].default_spec.params);
  query.threads = 0;
  const OpParams* t = tuned_params(query, bucket_kv_cache_store(4000, 3));
  REQUIRE(t != nullptr);
  CHECK(std::get<KvCacheStoreParams>(*t).threads == std::get<KvCacheStoreParams>(g.candidates[d.winner].spec.params).threads);
  CHECK(tuned_params(query, bucket_kv_cache_store(1 << 20, 4)) == nullptr);  // another bucket

  // MLAJIT_LOG=info: what an op call runs with, and that the record chose it.
  {
    struct Lines {
      std::vector<std::string> info;
      static void sink(log::Level l, std::string_view m, void* self) {
        if (l == log::Level::info) static_cast<Lines*>(self)->info.emplace_back(m);
      }
    } lines;
    const log::Level saved = log::level();
    log::set_level(log::Level::info);
    log::set_sink(&Lines::sink, &lines);
    const int winner_threads = std::get<KvCacheStoreParams>(g.candidates[d.winner].spec.params).threads;
    for (int i = 0; i < 3; ++i) CHECK(ops::tuned_or_heuristic(query, bucket_kv_cache_store(4000, 3)).threads == winner_threads);
    log::set_sink(nullptr, nullptr);
    log::set_level(saved);
    REQUIRE(lines.info.size() == 1);  // once, not per call
    CHECK(lines.info[0].find(fmt::format("threads={} (tuned)", winner_threads)) != std::string::npos);
  }

  // Second run: the database already holds this sweep for this device and bucket: nothing timed.
  const TuneReport second = tune(groups, small_options(dir.path.string()));
  REQUIRE(second.groups.size() == 1);
  CHECK(second.groups[0].devices[0].from_db);
  CHECK(second.groups[0].devices[0].winner == d.winner);
  CHECK(second.db_written == 0);
  for (const auto& c : second.groups[0].candidates) {
    CHECK(c.devices[0].status == "db_hit");
    CHECK(c.compile_seconds == 0);  // not even compiled
  }
  CHECK(second.to_json()["groups"][0]["devices"][0]["from_db"] == true);
  reload_tuning_index();
}

TEST_CASE("a candidate with a wrong output is rejected, however fast") {
  TempDir dir("gpu_autotune");
  TuneOptions o = small_options(dir.path.string());
  // Test hook: every threads=256 output gets one byte flipped, as a kernel with a race would.
  auto hooks = std::make_shared<autotune::detail::TestHooks>();
  hooks->tamper_output = [](const KernelSpec& s, std::vector<uint8_t>& out) {
    if (std::get<KvCacheStoreParams>(s.params).threads == 256 && !out.empty()) out[out.size() / 3] ^= 0x40;
  };
  o.test_hooks = hooks;
  const TuneReport rep = tune(store_sweep(), o);
  REQUIRE(rep.groups.size() == 1);
  const auto& g = rep.groups[0];
  int rejected = 0;
  for (size_t i = 0; i < g.candidates.size(); ++i) {
    const auto& c = g.candidates[i];
    if (std::get<KvCacheStoreParams>(c.spec.params).threads == 256) {
      CHECK(c.devices[0].status == "wrong_output");
      CHECK(c.devices[0].reason.find("differ") != std::string::npos);
      CHECK(g.devices[0].winner != static_cast<int>(i));
      ++rejected;
    } else {
      CHECK(c.devices[0].status == "ok");
    }
  }
  CHECK(rejected == 1);
  REQUIRE(g.devices[0].winner >= 0);
  const auto recs = TuningDb(rep.db_path).load();
  REQUIRE(recs.size() == 1);
  CHECK(std::get<KvCacheStoreParams>(recs[0].params).threads != 256);
}

TEST_CASE("gather and remap workloads verify every candidate of their default knob spaces") {
  TempDir dir("gpu_autotune");
  const auto groups = tune_groups_from_config(json::parse(R"({"kernels": [
      {"op": "kv_cache_gather", "params": {"dtype": "fp8_e4m3", "head_size": 576, "num_layers": 3,
                                           "quantization_granularity": 64, "output_dtype": "bf16"}},
      {"op": "sparse_index_remap", "params": {"page_size": 64}}]})"));
  TuneOptions o = small_options(dir.path.string());
  o.shapes[Op::kv_cache_gather] = {{"tokens", 4096}, {"batch", 3}, {"context", 700}};
  o.shapes[Op::sparse_index_remap] = {{"tokens", 256}, {"top_k", 2048}, {"batch", 3}, {"context", 5000}};
  const TuneReport rep = tune(groups, o);
  REQUIRE(rep.groups.size() == 2);
  for (const auto& g : rep.groups) {
    CHECK(g.candidates.size() == 4);
    for (const auto& c : g.candidates) {
      INFO(c.spec.name(), " ", knobs_of(c.spec.params).dump(), ": ", c.devices[0].reason);
      CHECK(c.devices[0].status == "ok");
    }
    CHECK(g.devices[0].winner >= 0);
  }
  CHECK(rep.db_written == 2);
}

}  // TEST_SUITE
