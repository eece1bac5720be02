// The CLI as a build pipeline sees it: exit codes, JSON outputs, concurrent builds into one cache,
// corrupt entries found by `cache verify`, refused cache permissions. Runs the real binary.
#include "shell_command.hpp"
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

using mlajit::testing::TempDir;

namespace {

struct Run {
  int code = -1;
  std::string out;
};

// stderr of the last cli() run: one file per test process, so that suites running at the same
// time (CI beside a developer's build, several worktrees) do not read each other's errors.
const std::string& stderr_path() {
  static const std::string p = "/tmp/mlajit_cli_test_err." + std::to_string(::getpid());
  return p;
}
// Removes this process's stderr file at exit (computes the name itself: stderr_path()'s string may
// already be destroyed by then).
const struct RemoveStderrFile {
  ~RemoveStderrFile() { std::remove(("/tmp/mlajit_cli_test_err." + std::to_string(::getpid())).c_str()); }
} remove_stderr_file;

// Runs the CLI through the shell, capturing stdout; stderr goes to a file so errors can be checked.
Run cli(const std::string& args, const std::string& env = "") {
  auto s = mlajit::testing::run_shell(env + " " MLAJIT_CLI_PATH " " + args + " 2>" + stderr_path());
  return Run{s.code, std::move(s.text)};
}

std::string last_stderr() {
  std::ifstream f(stderr_path());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p.string();
}

const std::string kConfig = std::string(MLAJIT_SOURCE_DIR) + "/examples/deepseek_v32.json";

}  // namespace

TEST_CASE("cli: usage errors exit 2 and name what was wrong") {
  CHECK(cli("").code == 2);
  CHECK(cli("frobnicate").code == 2);
  CHECK(cli("build").code == 2);
  CHECK(cli("build /nonexistent.json --arch sm_90a").code == 2);
  CHECK(last_stderr().find("config file") != std::string::npos);
  CHECK(cli("build " + kConfig + " --arch sm_91").code == 2);
  CHECK(last_stderr().find("sm_91") != std::string::npos);
  CHECK(cli("build " + kConfig + " --bogus").code == 2);
  CHECK(cli("cache frob").code == 2);
  CHECK(cli("--help").code == 0);
  // --anchor: only for mla_indexer, and a library that does not load is a usage error (no GPU needed).
  // bench speaks the tuner's shape vocabulary (tokens / keys / top_k); checked before any GPU use.
  CHECK(cli("bench mla_indexer --shape tokens=4096,keys=100").code == 2);
  CHECK(last_stderr().find("keys count the new tokens too") != std::string::npos);
  // stages = the scorer's K-ring depth (params.num_stages): validated by the params, before any GPU use.
  CHECK(cli("bench mla_indexer --shape stages=99").code == 2);
  CHECK(last_stderr().find("params.num_stages: got 99") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape stages=x").code == 2);
  CHECK(last_stderr().find("--shape stages") != std::string::npos);
  // block_kv picks the scorer (0 / 256 persistent, 64 tile); the persistent scorer's ring holds at
  // most 5 blocks of 256 keys (next to its two Q buffers).
  CHECK(cli("bench mla_indexer --shape block_kv=128").code == 2);
  CHECK(last_stderr().find("params.block_kv: got 128") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape block_kv=256,stages=8").code == 2);
  CHECK(last_stderr().find("params.num_stages: got 8") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape stages=6").code == 2);
  CHECK(last_stderr().find("params.num_stages: got 6") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape persistent=2").code == 2);
  CHECK(last_stderr().find("--shape persistent") != std::string::npos);
  // One spelling per key: an old one is refused and named with its replacement.
  CHECK(cli("bench sparse_prefill --shape tokens=4096,s_q=2048").code == 2);
  CHECK(last_stderr().find("\"s_q\" is now \"tokens\"") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape topk=2048").code == 2);
  CHECK(last_stderr().find("\"topk\" is now \"top_k\"") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape kv_dtype=fp8_e4m3,scale_block_size=576").code == 2);
  CHECK(last_stderr().find("\"scale_block_size\" is now \"quantization_granularity\"") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape b_topk=64").code == 2);  // fixed at 64: not a bench key
  CHECK(cli("bench sparse_prefill --shape tokens=4096,keys=32768,top_k=2048,bogus=1").code == 2);
  CHECK(last_stderr().find("bogus") != std::string::npos);
  // qk_math: spelled as in the params, validated with them, before any GPU use.
  CHECK(cli("bench sparse_prefill --shape qk_math=fp16").code == 2);
  CHECK(last_stderr().find("--shape qk_math: got \"fp16\", expected bf16 | fp8") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape qk_math=fp8").code == 2);
  CHECK(last_stderr().find("params.kv_dtype: got bf16, expected fp8_e4m3 with qk_math fp8") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape kv_dtype=fp8_e4m3,quantization_granularity=64,qk_math=fp8").code == 2);
  CHECK(last_stderr().find("group scales are not supported in FP8 math") != std::string::npos);
  // scale_fmt: the params' spelling and validation as well.
  CHECK(cli("bench sparse_prefill --shape kv_dtype=fp8_e4m3,quantization_granularity=64,scale_fmt=e8m0").code == 2);
  CHECK(last_stderr().find("--shape scale_fmt: got \"e8m0\", expected fp32 | ue8m0") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape scale_fmt=ue8m0").code == 2);
  CHECK(last_stderr().find("params.scale_fmt: got ue8m0, expected fp32 for a cache without scales") != std::string::npos);
  // layers: the bench cache's layer count, checked before any GPU use.
  CHECK(cli("bench sparse_prefill --shape layers=0").code == 2);
  CHECK(last_stderr().find("layers: got 0, expected 1..64") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape layers=65").code == 2);
  CHECK(last_stderr().find("layers: got 65, expected 1..64") != std::string::npos);
  // ctas: the persistent bf16 kernel's grid only, checked before any GPU use.
  CHECK(cli("bench sparse_prefill --shape ctas=-1").code == 2);
  CHECK(last_stderr().find("--shape ctas: got -1, expected a non-negative integer") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape kv_dtype=fp8_e4m3,quantization_granularity=576,ctas=3").code == 2);
  CHECK(last_stderr().find("ctas: got 3, expected 0 unless the kernel is the persistent Hopper one") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape ctas=3,path=portable").code == 2);
  CHECK(last_stderr().find("ctas: got 3") != std::string::npos);
  // split_parts: 0 (automatic), 1 (off) or a cap up to 256, checked before any GPU use.
  CHECK(cli("bench sparse_prefill --shape split_parts=257").code == 2);
  CHECK(last_stderr().find("--shape split_parts: got 257, expected 0 (automatic), 1 (no tail split) or a cap") !=
        std::string::npos);
  // crossover: auto, 0 or 1, and 1 only for a kernel that has it, checked before any GPU use.
  CHECK(cli("bench sparse_prefill --shape crossover=2").code == 2);
  CHECK(last_stderr().find("--shape crossover: got 2, expected auto | 0 | 1") != std::string::npos);
  CHECK(cli("bench sparse_prefill --shape crossover=1").code == 2);
  CHECK(last_stderr().find("crossover: got 1, expected 0 or auto unless the kernel has the crossover") !=
        std::string::npos);
  CHECK(cli("bench kv_cache_store --anchor /nonexistent.so").code == 2);
  CHECK(last_stderr().find("only with OP mla_indexer or sparse_prefill") != std::string::npos);
  CHECK(cli("bench mla_indexer --anchor /nonexistent.so").code == 2);
  CHECK(last_stderr().find("--anchor") != std::string::npos);
  // Decode shapes: the paged-logits ABI, checked before any GPU use; decode-only keys refused at
  // prefill shapes.
  CHECK(cli("bench mla_indexer --shape batch=4,context=4096 --anchor libc.so.6").code == 2);
  CHECK(last_stderr().find("anchor_paged_mqa_logits") != std::string::npos);
  CHECK(cli("bench mla_indexer --anchor libc.so.6").code == 2);
  CHECK(last_stderr().find("anchor_mqa_logits") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape k_layout=fp8_page_scales").code == 2);
  CHECK(last_stderr().find("k_layout") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape batch=2,topk_ranks=3").code == 2);
  CHECK(last_stderr().find("topk_ranks: got 3") != std::string::npos);
  CHECK(cli("bench mla_indexer --shape batch=2,next_n=17").code == 2);
  CHECK(last_stderr().find("next_n") != std::string::npos);
}

TEST_CASE("cli: bad configs are rejected with the JSON path of the bad field, nothing written") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  struct Bad {
    const char* json;
    const char* needle;
  } cases[] = {
      {R"({"kernels":[{"op":"sparse_prefill","params":{"page_size":48}}]})", "kernels[0].params.page_size"},
      {R"({"kernels":[{"op":"sparse_prefil","params":{}}]})", "kernels[0].op"},
      {R"({"kernels":[{"op":"mla_indexer","params":{"num_heads":96}}]})", "num_heads"},
      {R"({"kernels":[{"op":"kv_cache_store","params":{"head_sise":128}}]})", "head_sise"},
      {R"({"kernels":[{"op":"sparse_prefill","sweep":{"b_topk":[64, 128]}}]})", "b_topk"},
      {R"({"kernels":[]})", "kernels"},
      {R"({"kernels":[{"op":"kv_cache_store"}], "arhc": "sm_90a"})", "arhc"},
      {R"({"kernels":[{"op":"kv_cache_store",)", "JSON"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.json);
    auto cfg = write_file(t.path / "bad.json", c.json);
    Run r = cli("build " + cfg + " --arch sm_90a --cache-dir " + cache);
    CHECK(r.code == 2);
    CHECK(last_stderr().find(c.needle) != std::string::npos);
    CHECK_FALSE(fs::exists(cache));  // bad input changes nothing on disk
  }
}

TEST_CASE("cli: an FP8-math prefill is refused for a non-Hopper target, naming qk_math fp8 and the arch") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  const std::string cfg = write_file(
      t.path / "fp8math.json",
      R"({"kernels":[{"op":"sparse_prefill","params":{"kv_dtype":"fp8_e4m3","quantization_granularity":576,"qk_math":"fp8"}}]})");
  for (const char* arch : {"sm_80", "sm_100a"}) {
    CAPTURE(arch);
    Run r = cli("build " + cfg + " --arch " + arch + " --json --cache-dir " + cache);
    CHECK(r.code == 2);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["failed"] == 1);
    REQUIRE(j["results"].size() == 1);
    const std::string err = j["results"][0]["error"];
    CHECK_MESSAGE(err.find(std::string("got ") + arch + ", expected sm_90a") != std::string::npos, err);
    CHECK_MESSAGE(err.find("qk_math fp8") != std::string::npos, err);
    CHECK_MESSAGE(err.find("_fp8math") != std::string::npos, err);  // the kernel's name
    // Nothing was compiled or stored.
    if (fs::exists(cache))
      for (const auto& e : fs::directory_iterator(cache)) CHECK_MESSAGE(e.path().extension() != ".mjc", e.path());
  }
  // Its source needs no target to be generated: the FP8-math Config, not the portable body.
  Run g = cli("gen " + cfg);
  REQUIRE(g.code == 0);
  CHECK(g.out.find("/*fp8_math*/ true, /*pow2_scales*/ false>") != std::string::npos);
  CHECK(g.out.find("sparse_prefill/portable.cuh") == std::string::npos);
}

TEST_CASE("cli: build --json, cache hits on the second run, cache ls/verify") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  Run a = cli("build " + kConfig + " --arch sm_90a --json --jobs 2 --cache-dir " + cache);
  REQUIRE(a.code == 0);
  auto ja = nlohmann::json::parse(a.out);
  const int n = ja["kernels"];
  CHECK(n >= 5);
  CHECK(ja["compiled"] == n);
  CHECK(ja["cache_hits"] == 0);
  CHECK(ja.contains("seconds"));
  // The critical path is the slowest kernel's build, never longer than the whole build.
  REQUIRE(ja["critical_path"].is_object());
  double slowest = 0;
  for (const auto& r : ja["results"]) slowest = std::max(slowest, r["seconds"].get<double>());
  CHECK(ja["critical_path"]["seconds"].get<double>() == slowest);
  CHECK(ja["critical_path"]["seconds"].get<double>() <= ja["seconds"].get<double>());
  CHECK(ja["critical_path"]["wall_over_critical"].get<double>() >= 1.0);
  CHECK((fs::status(cache).permissions() & fs::perms::all) == fs::perms::owner_all);

  Run b = cli("build " + kConfig + " --arch sm_90a --json --cache-dir " + cache);
  REQUIRE(b.code == 0);
  auto jb = nlohmann::json::parse(b.out);
  CHECK(jb["compiled"] == 0);
  CHECK(jb["cache_hits"] == n);

  auto v = nlohmann::json::parse(cli("cache verify --json --cache-dir " + cache).out);
  CHECK(v["entries"] == n);
  CHECK(v["ok"] == n);
  CHECK(v["corrupt"].empty());
  auto ls = nlohmann::json::parse(cli("cache ls --json --cache-dir " + cache).out);
  CHECK(ls["entries"].size() == static_cast<size_t>(n));
}

TEST_CASE("cli: 4 concurrent builds into one empty cache all succeed and verify clean") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  std::vector<FILE*> procs;
  for (int i = 0; i < 4; ++i) {
    std::string cmd = MLAJIT_CLI_PATH " build " + kConfig + " --arch sm_90a --jobs 2 --json --cache-dir " + cache +
                      " 2>/dev/null";
    procs.push_back(popen(cmd.c_str(), "r"));
  }
  int total_compiled = 0;
  for (FILE* p : procs) {
    REQUIRE(p != nullptr);
    std::string out;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
    int status = pclose(p);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    auto j = nlohmann::json::parse(out);
    CHECK(j["failed"] == 0);
    total_compiled += j["compiled"].get<int>();
  }
  auto v = nlohmann::json::parse(cli("cache verify --json --cache-dir " + cache).out);
  CHECK(v["corrupt"].empty());
  CHECK(v["ok"] == v["entries"]);
  // The per-key lock lets one process compile each kernel and the others reuse it.
  CHECK(total_compiled == v["entries"].get<int>());
}

TEST_CASE("cli: cache verify reports a corrupt entry (exit 4), --remove deletes it, build recompiles") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  REQUIRE(cli("build " + kConfig + " --arch sm_90a --cache-dir " + cache).code == 0);
  fs::path victim;
  for (auto& e : fs::directory_iterator(cache))
    if (e.path().extension() == ".mjc") victim = e.path();
  REQUIRE(!victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  Run r = cli("cache verify --json --cache-dir " + cache);
  CHECK(r.code == 4);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["corrupt"].size() == 1);
  CHECK(cli("cache verify --remove --cache-dir " + cache).code == 0);
  CHECK_FALSE(fs::exists(victim));
  auto b = nlohmann::json::parse(cli("build " + kConfig + " --arch sm_90a --json --cache-dir " + cache).out);
  CHECK(b["compiled"] == 1);
}

TEST_CASE("cli: a cache dir writable by others is refused (exit 4) and left as it was") {
  TempDir t("cli");
  fs::path cache = t.path / "shared";
  fs::create_directory(cache);
  chmod(cache.c_str(), 0777);
  Run r = cli("build " + kConfig + " --arch sm_90a --cache-dir " + cache.string());
  CHECK(r.code == 4);
  CHECK(last_stderr().find("writable") != std::string::npos);
  CHECK(fs::is_empty(cache));
}

TEST_CASE("cli: prune and clear") {
  TempDir t("cli");
  const std::string cache = (t.path / "cache").string();
  REQUIRE(cli("build " + kConfig + " --arch sm_90a --cache-dir " + cache).code == 0);
  auto p = nlohmann::json::parse(cli("cache prune --max-bytes 40K --json --cache-dir " + cache).out);
  CHECK(p["removed"].get<int>() > 0);
  CHECK(p["remaining_bytes"].get<int>() <= 40 * 1024);
  auto c = nlohmann::json::parse(cli("cache clear --json --cache-dir " + cache).out);
  CHECK(cli("cache ls --json --cache-dir " + cache).out.find("\"entries\": []") != std::string::npos);
  (void)c;
}

TEST_CASE("cli: MLAJIT_DUMP_DIR keeps one file set per kernel variant and arch") {
  TempDir t("cli_dump");
  const std::string cfg = write_file(t.path / "k.json", R"({"kernels": [
      {"op": "sparse_index_remap", "params": {"page_size": 64}, "sweep": {"threads": [128, 256]}}]})");
  const std::string dump = (t.path / "dump").string();
  auto build = [&](const std::string& cache) {
    return cli("build " + cfg + " --arch sm_90a,sm_80 --json --cache-dir " + (t.path / cache).string(),
               "MLAJIT_DUMP_DIR=" + dump);
  };
  Run r = build("cache1");
  REQUIRE_MESSAGE(r.code == 0, last_stderr());
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["results"].size() == 4);
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dump)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto files = listing();
  CHECK(files.size() == 4 * 4);  // .cu .ptx .cubin .log for 2 variants x 2 archs
  for (const auto& res : j["results"]) {
    // <kernel name>-<cache key prefix>-<arch>, the key as `cache ls` shows it.
    const std::string base = res["name"].get<std::string>() + "-" + res["key"].get<std::string>().substr(0, 12) + "-" +
                             res["arch"].get<std::string>();
    CAPTURE(base);
    for (const char* ext : {".cu", ".ptx", ".cubin", ".log"}) CHECK(fs::exists(fs::path(dump) / (base + ext)));
  }
  // The same variants for the same archs again (a fresh cache, so they compile): same files.
  REQUIRE(build("cache2").code == 0);
  CHECK(listing() == files);
}

TEST_CASE("cli: gen prints deterministic source with the params header") {
  Run a = cli("gen " + kConfig);
  Run b = cli("gen " + kConfig);
  REQUIRE(a.code == 0);
  CHECK(a.out == b.out);
  CHECK(a.out.rfind("//", 0) == 0);
  CHECK(a.out.find("extern \"C\"") != std::string::npos);
}

TEST_CASE("cli: check and bench without a GPU") {
  Run r = cli("check " + kConfig + " --json", "MLAJIT_CACHE_DIR=/tmp/mlajit_cli_check_cache");
  fs::remove_all("/tmp/mlajit_cli_check_cache");
  if (r.out.find("\"skipped\": true") == std::string::npos) {
    MESSAGE("a GPU is present: `check` ran for real (exit ", r.code, ")");
    CHECK(r.code == 0);
    return;
  }
  CHECK(r.code == 0);
  CHECK(cli("bench kv_cache_store").code == 4);  // no driver: a runtime failure, not a crash
  CHECK(cli("bench nope").code == 2);
}

TEST_CASE("cli: bench sparse_prefill --anchor checks the library before touching the GPU") {
  Run r = cli("bench sparse_prefill --anchor /nonexistent/libanchor.so");
  CHECK(r.code == 2);
  CHECK(last_stderr().find("--anchor") != std::string::npos);
  // A loadable library without the symbol.
  r = cli("bench sparse_prefill --anchor libc.so.6");
  CHECK(r.code == 2);
  CHECK(last_stderr().find("anchor_sparse_prefill_bf16") != std::string::npos);
  // The anchor ABI's shape constraints.
  r = cli("bench sparse_prefill --shape top_k=100,keys=1000 --anchor libc.so.6");
  CHECK(r.code == 2);
  CHECK(last_stderr().find("multiple of 128") != std::string::npos);
  // Heads that are not a multiple of 64 are no shape error: the anchor runs padded (what stops this
  // run is the missing symbol).
  r = cli("bench sparse_prefill --shape heads=16 --anchor libc.so.6");
  CHECK(r.code == 2);
  CHECK(last_stderr().find("anchor_sparse_prefill_bf16") != std::string::npos);
  CHECK(last_stderr().find("heads") == std::string::npos);
}

TEST_CASE("cli: hostile paths and option values: a FIFO, a device, a directory, an option as a value") {
  TempDir t("cli_hostile");
  const std::string fifo = (t.path / "fifo.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string cache = " --cache-dir " + (t.path / "cache").string();
  // `timeout 20`: a blocking open of the FIFO (no writer ever comes) fails the test instead of
  // hanging the suite; refused at once, the commands take milliseconds.
  const std::string bounded = "timeout 20";
  for (const std::string& cmd : {"build " + fifo + " --arch sm_90a" + cache, "gen " + fifo, "cache import " + fifo + cache,
                                 "cache export " + fifo + " -o " + (t.path / "out.mjca").string() + cache}) {
    CAPTURE(cmd);
    CHECK(cli(cmd, bounded).code == 2);
    CHECK(last_stderr().find(fifo + ": got a FIFO (named pipe), expected a regular file") != std::string::npos);
  }
  // A bench anchor is checked before dlopen, which would block on a FIFO.
  for (const std::string op : {"sparse_prefill", "mla_indexer"}) {
    CHECK(cli("bench " + op + " --anchor " + fifo, bounded).code == 2);
    CHECK(last_stderr().find("--anchor " + fifo + ": got a FIFO (named pipe), expected a regular file") != std::string::npos);
  }
  // /dev/zero is not read (it used to be read without limit).
  CHECK(cli("build /dev/zero --arch sm_90a" + cache, bounded).code == 2);
  CHECK(last_stderr().find("config file /dev/zero: got a character device, expected a regular file") != std::string::npos);
  // A directory is named as one: as the config, and as the archive of cache import (which exited
  // 4 with "internal error: basic_filebuf::underflow").
  CHECK(cli("build " + t.str() + " --arch sm_90a" + cache).code == 2);
  CHECK(last_stderr().find("config file " + t.str() + ": got a directory, expected a regular file") != std::string::npos);
  CHECK(cli("cache import " + t.str() + cache).code == 2);
  CHECK(last_stderr().find("cache archive " + t.str() + ": got a directory, expected a regular file") != std::string::npos);
  CHECK(last_stderr().find("internal error") == std::string::npos);

  // An option where an option's value belongs is refused, naming the option (it printed the usage
  // and exited 0).
  Run r = cli("build " + kConfig + " --arch --help" + cache);
  CHECK(r.code == 2);
  CHECK(last_stderr().find("option --arch: got \"--help\" (an option), expected a value after it") != std::string::npos);
  CHECK(cli("build " + kConfig + " --cache-dir --json --arch sm_90a").code == 2);
  CHECK(last_stderr().find("option --cache-dir: got \"--json\" (an option)") != std::string::npos);
  CHECK(cli("build " + kConfig + " --arch --version").code == 2);
  // --help itself still works anywhere else, and --name=VALUE takes any value.
  CHECK(cli("build " + kConfig + " --help").code == 0);
  CHECK(cli("build --json --help").code == 0);
  CHECK(cli("cache prune --max-bytes=-5" + cache).code == 2);
  CHECK(last_stderr().find("--max-bytes: got -5") != std::string::npos);
}

TEST_CASE("cli: duplicate keys, deep nesting and huge numbers in a config are refused before anything is built") {
  TempDir t("cli_hostile_json");
  const std::string cache = (t.path / "cache").string();
  auto config = [&](const std::string& name, const std::string& params) {
    return write_file(t.path / name, R"({"arch":"sm_90a","kernels":[{"op":"sparse_index_remap","params":)" + params + "}]}");
  };
  CHECK(cli("build " + config("dup.json", R"({"page_size":64,"page_size":32})") + " --cache-dir " + cache).code == 2);
  CHECK(last_stderr().find("config.kernels[0].params: got the key \"page_size\" twice, expected each key at most once") !=
        std::string::npos);
  CHECK(cli("build " + config("deep.json", R"({"page_size":)" + std::string(100000, '[') + std::string(100000, ']') + "}") +
            " --cache-dir " + cache)
            .code == 2);
  CHECK(last_stderr().find("more than 64 nested arrays/objects") != std::string::npos);
  CHECK(last_stderr().size() < 1000);
  CHECK(cli("build " + config("big.json", R"({"page_size":9223372036854775808})") + " --cache-dir " + cache).code == 2);
  CHECK(last_stderr().find("got 9223372036854775808, expected an integer in [-2147483648, 2147483647]") != std::string::npos);
  CHECK(cli("build " + config("nul.json", R"({"page_size":"64\u0000tail"})") + " --cache-dir " + cache).code == 2);
  CHECK(last_stderr().find(R"(got "64\u0000tail")") != std::string::npos);
  // Nothing was built: no entry in the cache.
  if (fs::exists(cache))
    for (auto& e : fs::directory_iterator(cache)) CHECK(e.path().extension() != ".mjc");
}

TEST_CASE("cli: cache verify lists orphaned lock files, --remove removes them") {
  TempDir t("cli_locks");
  const fs::path cache = t.path / "cache";
  fs::create_directories(cache);
  fs::permissions(cache, fs::perms::owner_all);
  const fs::path lock = cache / (std::string(64, 'e') + ".lock");
  write_file(lock, "");
  struct timespec old[2] = {{1000, 0}, {1000, 0}};  // its writer died long ago
  REQUIRE(::utimensat(AT_FDCWD, lock.c_str(), old, 0) == 0);
  Run r = cli("cache verify --json --cache-dir " + cache.string());
  CHECK(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["orphaned_locks"].size() == 1);
  CHECK(j["orphaned_locks"][0] == lock.string());
  CHECK(fs::exists(lock));
  r = cli("cache verify --remove --cache-dir " + cache.string());
  CHECK(r.code == 0);
  CHECK(r.out.find("orphaned lock: " + lock.string()) != std::string::npos);
  CHECK_FALSE(fs::exists(lock));
}
