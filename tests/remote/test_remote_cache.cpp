// The remote tier against a real redis-server (started per test on a free loopback port): round
// trips, two processes racing on one key, forged / replayed / tampered entries refused, a Redis
// killed mid-run and a Redis that never answers (the build goes on locally, bounded by the
// timeouts), tuning records shared between two nodes, and `mlajit cache push|pull`.
#include <doctest/doctest.h>

#include "shell_command.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "autotune/remote_tuning.hpp"
#include "jit/build_source.hpp"
#include "jit/redis_store.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/build.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/version.hpp"
#include "core/sha256.hpp"
#include "remote/redis_fixture.hpp"
#include "unit/handwritten_kernel.hpp"

using namespace mlajit;
using mlajit::testing::RedisServer;
using mlajit::testing::SilentServer;
using mlajit::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kFleetKey = "fleet-key-0123456789abcdef-0123456789";

std::unique_ptr<RemoteCache> remote(const std::string& url, const std::string& key = kFleetKey, bool unsigned_ok = false,
                                    int timeout_ms = 1000) {
  RemoteConfig c;
  c.url = url;
  c.prefix = "test:";
  c.ttl_s = 600;
  c.allow_unsigned = unsigned_ok;
  c.timeouts.connect = std::chrono::milliseconds(200);
  c.timeouts.command = std::chrono::milliseconds(timeout_ms);
  return std::make_unique<RemoteCache>(open_remote_store(c.url, c.timeouts), c, key);
}

// The raw store, to plant and read blobs behind the RemoteCache's back.
std::unique_ptr<RemoteStore> raw(const std::string& url) { return open_remote_store(url, RemoteTimeouts{}); }

std::string key_of(int i) { return sha256_hex("remote entry " + std::to_string(i)); }

CacheEntryMeta meta_of(const std::string& name) {
  CacheEntryMeta m;
  m.name = name;
  m.op = "sparse_index_remap";
  m.params_json = "{}";
  m.entries = {{"mj_entry", 128, 0}};
  m.arch = "sm_90a";
  m.nvrtc_version = "12.8";
  m.compile_seconds = 1.5;
  return m;
}

bool nvrtc_or_skip() {
  std::string why;
  if (Compiler::available(&why)) return true;
  MESSAGE("NVRTC unavailable, this part of the test is skipped: " << why);
  return false;
}

}  // namespace

TEST_CASE("remote: put/get round trip, misses, counters") {
  RedisServer server;
  auto rc = remote(server.url());
  CHECK(rc->signing());
  CHECK(rc->ping());
  CHECK_FALSE(rc->get(key_of(1)));
  std::string cubin(100000, '\0');
  for (size_t i = 0; i < cubin.size(); ++i) cubin[i] = static_cast<char>(i * 7);
  REQUIRE(rc->put(key_of(1), meta_of("k1"), cubin));
  auto e = rc->get(key_of(1));
  REQUIRE(e);
  CHECK(e->key == key_of(1));
  CHECK(e->meta.name == "k1");
  CHECK(e->cubin == cubin);
  // A second node (its own connection) sees it too.
  auto other = remote(server.url());
  CHECK(other->get(key_of(1)));
  auto s = rc->stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 1);
  CHECK(s.puts == 1);
  CHECK(s.errors == 0);
  CHECK(s.bad_signature == 0);
  // The TTL reached Redis.
  auto stored = raw(server.url())->get(rc->entry_name(key_of(1)));
  REQUIRE(stored);
  CHECK(stored->compare(0, 8, "MLAJITR\n") == 0);
}

TEST_CASE("remote: two processes racing on one key never see a torn or foreign entry") {
  RedisServer server;
  const std::string key = key_of(2);
  std::vector<pid_t> kids;
  for (int p = 0; p < 2; ++p) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int bad = 0;
      try {
        auto rc = remote(server.url());
        const std::string mine(50000 + p, static_cast<char>('a' + p));
        for (int i = 0; i < 200; ++i) {
          if (!rc->put(key, meta_of("racer" + std::to_string(p)), mine)) ++bad;
          auto e = rc->get(key);
          // Either writer's whole entry, never a mix.
          if (!e || !(e->cubin == std::string(50000, 'a') || e->cubin == std::string(50001, 'b'))) ++bad;
          if (e && e->meta.name != "racer" + std::to_string(e->cubin.size() - 50000)) ++bad;
        }
        if (rc->stats().bad_signature || rc->stats().corrupt || rc->stats().errors) ++bad;
      } catch (...) {
        bad = 1;
      }
      ::_exit(bad ? 1 : 0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  CHECK(remote(server.url())->get(key));
}

TEST_CASE("remote: forged, unsigned, replayed and tampered entries are refused") {
  RedisServer server;
  auto rc = remote(server.url());
  const std::string cubin(4096, 'c');

  SUBCASE("signed under another key") {
    auto forger = remote(server.url(), "another-fleet-key-not-ours-0123456789");
    REQUIRE(forger->put(key_of(3), meta_of("forged"), cubin));
    CHECK_FALSE(rc->get(key_of(3)));
    CHECK(rc->stats().bad_signature == 1);
    CHECK(rc->stats().hits == 0);
  }
  SUBCASE("unsigned (written by a node that allows unsigned entries)") {
    auto lax = remote(server.url(), "", /*unsigned_ok=*/true);
    CHECK_FALSE(lax->signing());
    REQUIRE(lax->put(key_of(3), meta_of("unsigned"), cubin));
    CHECK(lax->get(key_of(3)));  // the opted-in node trusts it
    CHECK_FALSE(rc->get(key_of(3)));
    CHECK(rc->stats().bad_signature == 1);
  }
  SUBCASE("a valid entry replayed under another key") {
    REQUIRE(rc->put(key_of(3), meta_of("real"), cubin));
    auto store = raw(server.url());
    store->put(rc->entry_name(key_of(4)), *store->get(rc->entry_name(key_of(3))), 0);
    CHECK_FALSE(rc->get(key_of(4)));
    CHECK(rc->stats().bad_signature == 1);
    CHECK(rc->get(key_of(3)));
  }
  SUBCASE("payload or signature tampered with") {
    REQUIRE(rc->put(key_of(3), meta_of("real"), cubin));
    auto store = raw(server.url());
    const std::string good = *store->get(rc->entry_name(key_of(3)));
    for (size_t pos : {good.size() - 1 /* cubin */, size_t{48 + 200} /* header/metadata */, size_t{20} /* MAC */}) {
      std::string bad = good;
      bad[pos] ^= 0x01;
      store->put(rc->entry_name(key_of(3)), bad, 0);
      CHECK_FALSE(rc->get(key_of(3)));
    }
    CHECK(rc->stats().bad_signature == 3);
    store->put(rc->entry_name(key_of(3)), good.substr(0, 30), 0);  // truncated
    CHECK_FALSE(rc->get(key_of(3)));
    CHECK(rc->stats().bad_signature == 4);
    // Unsigned mode still catches a tampered cubin through the disk checksums.
    auto lax = remote(server.url(), "", true);
    REQUIRE(lax->put(key_of(5), meta_of("lax"), cubin));
    std::string blob = *store->get(lax->entry_name(key_of(5)));
    blob.back() ^= 0x01;
    store->put(lax->entry_name(key_of(5)), blob, 0);
    CHECK_FALSE(lax->get(key_of(5)));
    CHECK(lax->stats().corrupt == 1);
  }
}

TEST_CASE("remote: a planted entry is never loaded by the build; the local compile replaces it") {
  if (!nvrtc_or_skip()) return;
  RedisServer server;
  TempDir t("remote");
  DiskCache disk((t.path / "cache").string());
  auto rc = remote(server.url());
  KernelSource src = mlajit_test::axpy_source(mlajit_test::axpy_spec(8));
  // Plant garbage code under the key the build will compute, signed by someone else.
  const std::string key = cache_key(src, "sm_90a", Compiler::global().options("sm_90a"), Compiler::global().nvrtc_key_version());
  auto forger = remote(server.url(), "another-fleet-key-not-ours-0123456789");
  REQUIRE(forger->put(key, meta_of("planted"), std::string(1000, '\xcc')));

  BuiltKernel b = build_source(src, "sm_90a", &disk, rc.get());
  CHECK_FALSE(b.result.cache_hit);  // compiled, not loaded
  CHECK(b.cubin != std::string(1000, '\xcc'));
  CHECK(rc->stats().bad_signature == 1);
  // The compile was uploaded over the planted entry: a fresh node now gets the real cubin.
  TempDir t2("remote");
  DiskCache disk2((t2.path / "cache").string());
  auto node2 = remote(server.url());
  BuiltKernel b2 = build_source(src, "sm_90a", &disk2, node2.get());
  CHECK(b2.result.remote_hit);
  CHECK(b2.cubin == b.cubin);
  CHECK(disk2.get(key));  // and it went to the node's disk cache
  CHECK(node2->stats().bad_signature == 0);
}

TEST_CASE("remote: Redis killed mid-run: the build still succeeds locally, one failure, then no network") {
  RedisServer server;
  TempDir t("remote");
  DiskCache disk((t.path / "cache").string());
  auto rc = remote(server.url());
  REQUIRE(rc->put(key_of(6), meta_of("before"), "x"));
  REQUIRE(rc->get(key_of(6)));
  server.kill();

  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(rc->get(key_of(6)));
  CHECK(rc->stats().errors == 1);
  CHECK_FALSE(rc->get(key_of(7)));  // resting: not even tried
  CHECK_FALSE(rc->put(key_of(7), meta_of("after"), "y"));
  CHECK(rc->stats().errors == 1);
  CHECK(rc->stats().skipped == 2);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));

  if (!nvrtc_or_skip()) return;
  auto rc2 = remote(server.url());  // a fresh process-like tier that has not seen the failure yet
  BuiltKernel b = build_source(mlajit_test::axpy_source(mlajit_test::axpy_spec(16)), "sm_90a", &disk, rc2.get());
  CHECK_FALSE(b.result.cache_hit);
  CHECK_FALSE(b.cubin.empty());
  CHECK(disk.get(b.result.key));
  CHECK(rc2->stats().errors == 1);  // the get failed; the put after the compile was skipped
  CHECK(rc2->stats().skipped == 1);
}

TEST_CASE("remote: a Redis that accepts and never answers is bounded by the command timeout") {
  SilentServer silent;
  auto rc = remote(silent.url(), kFleetKey, false, /*timeout_ms=*/300);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(rc->get(key_of(8)));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s >= 0.25);
  CHECK(s < 1.5);
  CHECK(rc->stats().errors == 1);
  // Every later call returns at once while the tier rests.
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) CHECK_FALSE(rc->get(key_of(8)));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK(rc->stats().skipped == 100);
  // An explicit ping goes out again and is bounded too.
  t0 = std::chrono::steady_clock::now();
  std::string why;
  CHECK_FALSE(rc->ping(&why));
  CHECK(why.find("no answer within 300 ms") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500));
}

TEST_CASE("remote: a full Redis (maxmemory, noeviction) fails the upload, not the build") {
  RedisServer server("--maxmemory 4mb --maxmemory-policy noeviction");
  auto rc = remote(server.url());
  // Fill it up to the cap; the next upload is refused (OOM).
  bool refused = false;
  for (int i = 0; i < 8 && !refused; ++i) refused = !rc->put(key_of(100 + i), meta_of("big"), std::string(1 << 20, 'z'));
  CHECK(refused);
  CHECK(rc->stats().errors == 1);
  // An error reply does not make the tier rest: reads still go to the network (and hit).
  CHECK(rc->get(key_of(100)));
  CHECK(rc->stats().skipped == 0);
}

TEST_CASE("remote: a tuning record shared between two nodes (two cache dirs), merged, never overwritten") {
  RedisServer server;
  TempDir a("nodeA"), b("nodeB");
  autotune::TuningDb dba(autotune::TuningDb::default_path(a.str())), dbb(autotune::TuningDb::default_path(b.str()));
  auto ra = remote(server.url()), rb = remote(server.url());

  auto rec = [](int page_size, double ms, const std::string& device) {
    SparseIndexRemapParams p;
    p.page_size = page_size;
    autotune::TuningRecord r;
    r.op = Op::sparse_index_remap;
    r.device = device;
    r.sm_count = 132;
    r.bucket = autotune::bucket_sparse_index_remap(4096, 2048);
    r.version = kVersion;
    r.params = p;
    r.median_ms = ms;
    r.default_ms = ms * 2;
    r.tuned_at = 1;
    return r;
  };
  dba.merge({rec(64, 2.0, "GPU-A")});
  auto pa = autotune::push_tuning(dba, *ra);
  CHECK(pa.local == 1);
  CHECK(pa.uploaded == 1);
  CHECK(autotune::push_tuning(dba, *ra).uploaded == 0);  // content-addressed: already there

  auto pb = autotune::pull_tuning(dbb, *rb);
  CHECK(pb.remote == 1);
  auto got = dbb.load();
  REQUIRE(got.size() == 1);
  CHECK(got[0].key() == rec(64, 2.0, "GPU-A").key());
  CHECK(got[0].median_ms == 2.0);

  // Node B tunes the same key faster and another device; A merges: nothing lost, faster wins.
  dbb.merge({rec(64, 1.0, "GPU-A"), rec(64, 3.0, "GPU-B")});
  CHECK(autotune::push_tuning(dbb, *rb).uploaded == 2);
  autotune::pull_tuning(dba, *ra);
  auto merged = dba.load();
  REQUIRE(merged.size() == 2);
  for (auto& r : merged) CHECK(r.median_ms == (r.device == "GPU-A" ? 1.0 : 3.0));
  // On the remote both versions of the GPU-A record remain (added, never overwritten).
  CHECK(raw(server.url())->members("test:tuning").size() == 3);

  // A record planted by someone without the key is refused.
  raw(server.url())->add_member("test:tuning", sha256_hex("x"), "MLAJITR\nforged-record-bytes-forged-record-bytes-xx", 0);
  TempDir c("nodeC");
  autotune::TuningDb dbc(autotune::TuningDb::default_path(c.str()));
  auto rcn = remote(server.url());
  CHECK(autotune::pull_tuning(dbc, *rcn).remote == 3);
  CHECK(rcn->stats().bad_signature == 1);
  CHECK(dbc.load().size() == 2);

  // A node configured by the environment merges the fleet's records when its run-time index
  // first loads (pull_remote_tuning); in a child process, whose process-wide tier is fresh.
  TempDir d("nodeD");
  const std::string key_file = (d.path / "fleet.key").string();
  {
    std::ofstream(key_file) << kFleetKey;
  }
  ::chmod(key_file.c_str(), 0600);
  const std::string db_path = autotune::TuningDb::default_path((d.path / "cache").string());
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("MLAJIT_REMOTE_CACHE", server.url().c_str(), 1);
    ::setenv("MLAJIT_REMOTE_CACHE_PREFIX", "test:", 1);
    ::setenv("MLAJIT_REMOTE_CACHE_KEY_FILE", key_file.c_str(), 1);
    autotune::pull_remote_tuning(db_path);
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st));
  CHECK(autotune::TuningDb(db_path).load().size() == 2);
  // Up to date: a second pull leaves the file alone.
  auto before = fs::last_write_time(db_path);
  autotune::pull_tuning(autotune::TuningDb(db_path), *rcn);
  CHECK(fs::last_write_time(db_path) == before);
}

TEST_CASE("remote: mlajit cache push from a build node, pull into a fresh node, build from the remote") {
  if (!nvrtc_or_skip()) return;
  RedisServer server;
  TempDir t("remote_cli");
  const std::string key_file = (t.path / "fleet.key").string();
  {
    std::ofstream(key_file) << kFleetKey << "\n";
  }
  ::chmod(key_file.c_str(), 0600);
  const std::string cfg = (t.path / "small.json").string();
  std::ofstream(cfg) << R"({"arch": "sm_90a", "kernels": [
      {"op": "sparse_index_remap", "params": {"page_size": 64}},
      {"op": "kv_cache_store", "params": {"dtype": "bf16", "num_heads": 1, "head_size": 576, "page_size": 64, "is_mla": true, "num_layers": 61, "input_dtype": "bf16"}}]})";
  const std::string env = "MLAJIT_REMOTE_CACHE=" + server.url() + " MLAJIT_REMOTE_CACHE_KEY_FILE=" + key_file + " ";
  auto run = [&](const std::string& args, const std::string& extra_env = "") {
    auto r = mlajit::testing::run_shell(env + extra_env + MLAJIT_CLI_PATH " " + args + " 2>" + (t.path / "err").string());
    return std::make_pair(r.code, std::move(r.text));
  };
  const std::string node_a = (t.path / "a").string(), node_b = (t.path / "b").string(), node_c = (t.path / "c").string();

  auto [c1, o1] = run("cache push " + cfg + " --json --cache-dir " + node_a);
  REQUIRE(c1 == 0);
  auto j1 = nlohmann::json::parse(o1);
  CHECK(j1["counts"]["uploaded"] == 2);
  CHECK(j1["signed"] == true);

  auto [c2, o2] = run("cache pull " + cfg + " --json --cache-dir " + node_b);
  REQUIRE(c2 == 0);
  auto j2 = nlohmann::json::parse(o2);
  CHECK(j2["counts"]["pulled"] == 2);
  auto [c3, o3] = run("build " + cfg + " --json --cache-dir " + node_b);
  CHECK(nlohmann::json::parse(o3)["compiled"] == 0);  // the pulled entries are disk hits

  // A fresh node builds straight from the remote; its counters show it.
  auto [c4, o4] = run("build " + cfg + " --json --cache-dir " + node_c);
  REQUIRE(c4 == 0);
  auto j4 = nlohmann::json::parse(o4);
  CHECK(j4["compiled"] == 0);
  CHECK(j4["remote_hits"] == 2);
  CHECK(j4["remote"]["counters"]["hits"] == 2);

  // A node with another key refuses everything: pull reports them missing (exit 4).
  const std::string other_key = (t.path / "other.key").string();
  {
    std::ofstream(other_key) << "a-different-fleet-key-0123456789\n";
  }
  ::chmod(other_key.c_str(), 0600);
  auto [c5, o5] = run("cache pull " + cfg + " --json --cache-dir " + (t.path / "d").string(),
                      "MLAJIT_REMOTE_CACHE_KEY_FILE=" + other_key + " ");
  CHECK(c5 == 4);
  auto j5 = nlohmann::json::parse(o5);
  CHECK(j5["counts"]["missing"] == 2);
  CHECK(j5["counters"]["bad_signature"] == 2);

  // info shows the state; a group-readable key file turns the tier off with a clear error.
  auto [c6, o6] = run("info --json");
  auto j6 = nlohmann::json::parse(o6);
  CHECK(j6["remote_cache"]["reachable"] == true);
  CHECK(j6["remote_cache"]["signed"] == true);
  ::chmod(key_file.c_str(), 0640);
  auto [c7, o7] = run("info --json");
  auto j7 = nlohmann::json::parse(o7);
  CHECK(j7["remote_cache"]["enabled"] == false);
  CHECK(j7["remote_cache"]["error"].get<std::string>().find("chmod 600") != std::string::npos);
  auto [c8, o8] = run("build " + cfg + " --json --cache-dir " + (t.path / "e").string());
  CHECK(c8 == 0);  // never fatal: the build compiles locally
  CHECK(nlohmann::json::parse(o8)["compiled"] == 2);
  auto [c9, o9] = run("cache pull " + cfg + " --cache-dir " + node_b);
  CHECK(c9 == 4);  // but push/pull, which need the tier, fail loudly
}
