// `mlajit tune --csv F`: one column per knob (a plot reads knobs as numbers), timing cells only for
// candidates that were timed, and a reason on every row that has none. Built from a hand-made
// report (no GPU, no NVRTC); tests/unit/test_autotune.cpp checks the CSV of a real compile run.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "mlajit/autotune.hpp"

using namespace mlajit;
using namespace mlajit::autotune;

namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) cells.push_back(std::exchange(cell, {}));
    else cell += c;
  }
  cells.push_back(cell);
  return cells;
}

std::vector<std::vector<std::string>> parse(const std::string& csv) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) rows.push_back(split(line));
  return rows;
}

CandidateResult candidate(const OpParams& p, bool compiled, std::vector<CandidateDeviceResult> devices) {
  CandidateResult c;
  c.spec = KernelSpec{p};
  c.origin = "kernels[0]";
  c.compiled = compiled;
  c.compile_seconds = compiled ? 1.5 : 0;
  if (!compiled) c.compile_error = "NVRTC failed, \"quoted\"";
  c.devices = std::move(devices);
  return c;
}

}  // namespace

TEST_CASE("tune --csv: one column per knob, empty timing cells for untimed candidates, and why") {
  TuneReport rep;
  // Group 0: sparse_index_remap over threads; device 0 timed two of four candidates.
  GroupResult remap;
  remap.group.default_spec = KernelSpec{SparseIndexRemapParams{}};
  auto remap_with = [](int threads) {
    SparseIndexRemapParams p;
    p.threads = threads;
    return OpParams{p};
  };
  Timing t{0.25, 0.2, 0.3, 20};
  remap.candidates.push_back(candidate(remap_with(128), true, {{0, "ok", "", t}}));
  remap.candidates.push_back(candidate(remap_with(256), true, {{0, "ok", "", Timing{0.125, 0.1, 0.2, 20}}}));
  remap.candidates.push_back(candidate(remap_with(512), true, {{0, "wrong_output", "row 3 differs", {}}}));
  remap.candidates.push_back(candidate(remap_with(64), false, {{0, "not_compiled", "NVRTC failed", {}}}));
  remap.devices.push_back({0, "GPU", 132, /*winner=*/1, 0.125, 0.25, false, {}});
  rep.groups.push_back(remap);
  // Group 1: mla_indexer, compile only (no devices).
  GroupResult indexer;
  indexer.group.default_spec = KernelSpec{MlaIndexerParams{}};
  MlaIndexerParams ip;
  ip.num_stages = 4;
  indexer.candidates.push_back(candidate(ip, true, {}));
  rep.groups.push_back(indexer);

  const auto rows = parse(rep.to_csv());
  REQUIRE(rows.size() == 1 + 4 + 1);
  const std::vector<std::string> header = {"group", "origin", "op", "name", "threads", "block_kv", "block_q",
                                           "num_stages", "is_default", "compiled", "cache_hit", "compile_seconds",
                                           "device", "status", "median_ms", "min_ms", "max_ms", "reps", "winner",
                                           "reason"};
  CHECK(rows[0] == header);
  auto col = [&](const std::string& name) {
    for (size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return i;
    FAIL("no column ", name);
    return size_t{0};
  };
  for (const auto& r : rows) CHECK(r.size() == header.size());

  // Timed: every timing cell filled, the winner marked, no reason needed.
  CHECK(rows[1][col("threads")] == "128");
  CHECK(rows[1][col("block_kv")].empty());  // not a knob of sparse_index_remap
  CHECK(rows[1][col("median_ms")] == "0.250000");
  CHECK(rows[1][col("reps")] == "20");
  CHECK(rows[1][col("winner")] == "0");
  CHECK(rows[2][col("winner")] == "1");
  CHECK(rows[2][col("reason")].empty());
  // Verified wrong: no timings, the tuner's reason.
  CHECK(rows[3][col("threads")] == "512");
  CHECK(rows[3][col("status")] == "wrong_output");
  for (const char* c : {"median_ms", "min_ms", "max_ms", "reps"}) CHECK(rows[3][col(c)].empty());
  CHECK(rows[3][col("reason")] == "row 3 differs");
  // Not compiled: no compile time, no timings, the compile error.
  CHECK(rows[4][col("threads")] == "64");
  CHECK(rows[4][col("compile_seconds")].empty());
  CHECK(rows[4][col("median_ms")].empty());
  CHECK(rows[4][col("reason")] == "NVRTC failed");
  // Compile only: the indexer's knobs in their own columns, a reason saying nothing was timed.
  CHECK(rows[5][col("threads")].empty());
  CHECK(rows[5][col("num_stages")] == "4");
  CHECK(rows[5][col("block_q")] == "0");
  CHECK(rows[5][col("status")] == "compiled");
  CHECK(rows[5][col("compile_seconds")] == "1.5000");
  CHECK(rows[5][col("median_ms")].empty());
  CHECK(rows[5][col("reason")].find("no GPU timing") != std::string::npos);
}
