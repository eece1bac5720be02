// Crash and eviction stress of the disk cache through the real CLI, sized for CI: tiny
// sparse_index_remap kernels (~30 ms each to compile) so that hundreds of builds take seconds.
//   SIGKILL: >= 200 kills of concurrent `mlajit build` runs at random moments; afterwards every
//            entry verifies, and no temp file survives the next opening of the cache.
//   eviction: 8 concurrent processes x 20 builds each under a cap of ~3 entries, so that eviction
//            runs throughout; every build succeeds and `cache verify` is clean.
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"

namespace fs = std::filesystem;
using mlajit::testing::TempDir;

namespace {

bool nvrtc_or_skip() {
  std::string why;
  if (mlajit::Compiler::available(&why)) return true;
  MESSAGE("NVRTC unavailable, stress test skipped: " << why);
  return false;
}

// A config of `n` distinct remap kernels starting at variant `first` (page_size x threads).
std::string remap_config(const fs::path& p, int first, int n) {
  nlohmann::json kernels = nlohmann::json::array();
  for (int i = first; i < first + n; ++i) {
    int v = i % 40;
    kernels.push_back({{"op", "sparse_index_remap"},
                       {"params", {{"page_size", 1 << (v % 8)}, {"threads", 32 * (1 + v / 8)}}}});
  }
  std::ofstream(p) << nlohmann::json{{"arch", "sm_90a"}, {"kernels", kernels}}.dump();
  return p.string();
}

// Starts `mlajit build` with stdout/stderr discarded; returns the pid.
pid_t spawn_build(const std::string& config, const std::string& cache, const std::string& max_bytes = "",
                  const char* jobs = "2") {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!max_bytes.empty()) ::setenv("MLAJIT_CACHE_MAX_BYTES", max_bytes.c_str(), 1);
    std::freopen("/dev/null", "w", stdout);
    std::freopen("/dev/null", "w", stderr);
    ::execl(MLAJIT_CLI_PATH, "mlajit", "build", config.c_str(), "--jobs", jobs, "--cache-dir", cache.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int count_temps(const fs::path& dir) {
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name[0] == '.' && e.path().extension() == ".tmp") ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("stress: 200 SIGKILLs of concurrent builds leave no corrupt entry and no temp file") {
  if (!nvrtc_or_skip()) return;
  TempDir t("stress_kill");
  const std::string cache = (t.path / "cache").string();
  const std::string config = remap_config(t.path / "remap.json", 0, 12);
  std::mt19937 rng(12345);
  const auto t0 = std::chrono::steady_clock::now();
  int kills = 0, finished = 0, rounds = 0;
  size_t written = 0;  // entries found before each clear: puts happened while processes were killed
  while (kills < 200) {
    ++rounds;
    if (rounds % 4 == 0 && fs::exists(cache)) {  // keep compiles (and puts) happening
      mlajit::DiskCache c(cache);
      written += c.list().size();
      c.clear();
    }
    std::vector<pid_t> pids;
    for (int i = 0; i < 8; ++i) pids.push_back(spawn_build(config, cache));
    // Kill anywhere from start-up to the last puts of a 12-kernel build.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(50, 1200)(rng)));
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) {
      int status = 0;
      REQUIRE(::waitpid(p, &status, 0) == p);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
      else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++finished;
      else FAIL("a build exited with status " << status);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int temps_left_by_kills = count_temps(cache);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // dead temp files are >= 2 s old
  mlajit::DiskCache c(cache);  // opening the cache removes the temp files of dead writers
  auto rep = c.verify();
  written += rep.entries;
  MESSAGE(kills << " kills (" << finished << " builds finished first) in " << rounds << " rounds, " << secs
                << " s; " << written << " entries written meanwhile, at the end " << rep.entries << " entries, " << rep.corrupt.size() << " corrupt; " << temps_left_by_kills
                << " temp files left by killed writers, " << count_temps(cache) << " after reopening");
  CHECK(kills >= 200);
  CHECK(written > 0);
  CHECK(rep.corrupt.empty());
  CHECK(rep.ok == rep.entries);
  CHECK(count_temps(cache) == 0);
}

TEST_CASE("stress: 8 processes x 20 builds under a cap that evicts throughout; all succeed, verify clean") {
  if (!nvrtc_or_skip()) return;
  TempDir t("stress_evict");
  const std::string cache = (t.path / "cache").string();
  // The size of one entry, to set a cap of about 3 entries.
  {
    std::string one = remap_config(t.path / "one.json", 0, 1);
    pid_t p = spawn_build(one, cache);
    int status = 0;
    REQUIRE(::waitpid(p, &status, 0) == p);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  uint64_t entry = 0;
  for (auto& e : fs::directory_iterator(cache))
    if (e.path().extension() == ".mjc") entry = fs::file_size(e.path());
  REQUIRE(entry > 0);
  mlajit::DiskCache(cache).clear();
  const uint64_t cap = 3 * entry + entry / 2;

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int i = 0; i < 8; ++i)  // each process: 20 kernels, starting at a different variant
    pids.push_back(spawn_build(remap_config(t.path / ("p" + std::to_string(i) + ".json"), 5 * i, 20), cache,
                               std::to_string(cap), "1"));
  int ok = 0;
  for (pid_t p : pids) {
    int status = 0;
    REQUIRE(::waitpid(p, &status, 0) == p);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++ok;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  mlajit::DiskCache c(cache);
  auto rep = c.verify();
  uint64_t total = 0;
  int locks = 0;
  for (auto& l : c.list()) total += l.size;
  const auto locks_at_end = [&] {
    int n = 0;
    for (auto& e : fs::directory_iterator(cache)) n += e.path().extension() == ".lock";
    return n;
  };
  // A lock held (by a process looking the key up) while its entry was evicted stays; prune
  // removes such orphans.
  locks = locks_at_end();
  c.prune(cap);
  MESSAGE("8 x 20 builds under a " << cap << "-byte cap (entry " << entry << " bytes): " << ok << "/8 processes ok in "
                                   << secs << " s; " << rep.entries << " entries left (" << total << " bytes), "
                                   << rep.corrupt.size() << " corrupt, " << locks << " lock files, "
                                   << locks_at_end() << " after prune");
  CHECK(ok == 8);
  CHECK(rep.corrupt.empty());
  CHECK(rep.entries <= 4);   // eviction ran: 40 distinct kernels were built
  CHECK(total <= cap + entry);  // a racing put may briefly hold one entry over the cap
  CHECK(locks_at_end() <= static_cast<int>(c.list().size()));  // locks go with their entries
}
