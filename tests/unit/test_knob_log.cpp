// MLAJIT_LOG=info shows what an op call ran with: the knobs chosen (and where each came from),
// once per distinct problem / bucket / choice, through the same log sink hosts install.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "mlajit/autotune.hpp"
#include "mlajit/log_sink.hpp"
#include "ops/knob_choice.hpp"
#include "ops/tuning.hpp"

using namespace mlajit;

namespace {

struct CapturedLog {
  std::mutex mu;
  std::vector<std::string> info_lines;
  log::Level saved = log::level();
  static void sink(log::Level l, std::string_view msg, void* user) {
    auto* self = static_cast<CapturedLog*>(user);
    std::lock_guard<std::mutex> lk(self->mu);
    if (l == log::Level::info) self->info_lines.emplace_back(msg);
  }
  explicit CapturedLog(log::Level l) {
    log::set_level(l);
    log::set_sink(&sink, this);
  }
  ~CapturedLog() {
    log::set_sink(nullptr, nullptr);
    log::set_level(saved);
  }
  size_t count_containing(const std::string& s) {
    std::lock_guard<std::mutex> lk(mu);
    size_t n = 0;
    for (const auto& line : info_lines) n += line.find(s) != std::string::npos;
    return n;
  }
};

}  // namespace

TEST_CASE("knob log: an op call logs its heuristic knobs once per problem and bucket at info") {
  const autotune::ScopedTuningLookupOff no_records;  // the heuristic, whatever database the host has
  SparseIndexRemapParams p;
  p.page_size = 32;  // a problem no other test logs
  const auto small = autotune::bucket_sparse_index_remap(1000, 2048), large = autotune::bucket_sparse_index_remap(70000, 2048);
  {
    CapturedLog quiet(log::Level::warn);
    CHECK(ops::tuned_or_heuristic(p, small).threads == 256);
    CHECK(quiet.info_lines.empty());  // below info nothing is formed
  }
  CapturedLog log(log::Level::info);
  for (int i = 0; i < 5; ++i) CHECK(ops::tuned_or_heuristic(p, small).threads == 256);
  const std::string line = "sparse_index_remap for bucket tokens=1024,top_k=2048 runs sparse_index_remap_p32_thr256: "
                           "threads=256 (heuristic)";
  CHECK(log.count_containing(line) == 1);  // five calls, one line
  ops::tuned_or_heuristic(p, large);       // another bucket: its own line
  CHECK(log.count_containing("sparse_index_remap for bucket tokens=131072,top_k=2048 runs sparse_index_remap_p32_thr256") == 1);
  SparseIndexRemapParams pinned = p;
  pinned.threads = 512;                    // an explicit knob is reported as the caller's
  CHECK(ops::tuned_or_heuristic(pinned, small).threads == 512);
  CHECK(log.count_containing("runs sparse_index_remap_p32_thr512: threads=512 (params)") == 1);
  CHECK(log.info_lines.size() == 3);
}

TEST_CASE("knob log: each knob says whether it came from a tuning record, the heuristic, the params or the plan") {
  MlaIndexerParams requested;
  requested.block_q = 8;  // pinned by the caller; block_kv left to the plan, num_stages tuned
  MlaIndexerParams chosen = requested;
  chosen.num_stages = 4;
  const auto bucket = autotune::bucket_mla_indexer(4096, 1, 32768);
  const std::string line = ops::describe_knob_choice(requested, chosen, /*tuned=*/true, bucket);
  CHECK(line.find("mla_indexer for bucket batch=1,keys=32768,tokens=4096 runs ") == 0);
  CHECK(line.find(KernelSpec{chosen}.name()) != std::string::npos);
  CHECK(line.find("block_kv=auto (plan) block_q=8 (params) num_stages=4 (tuned)") != std::string::npos);

  KvCacheStoreParams kv;
  KvCacheStoreParams kv_chosen = kv;
  kv_chosen.threads = 128;
  CHECK(ops::describe_knob_choice(kv, kv_chosen, /*tuned=*/false, autotune::bucket_kv_cache_store(65536, 8))
            .find(": threads=128 (heuristic)") != std::string::npos);
}
