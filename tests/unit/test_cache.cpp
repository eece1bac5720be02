// SHA-256, the cache key, DiskCache (hits, corruption, permissions, LRU, verify/prune/clear,
// locks) and single flight of concurrent builds.
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "jit/memory_cache.hpp"
#include "jit/build_source.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"
#include "core/sha256.hpp"
#include "unit/fake_entry_meta.hpp"
#include "unit/handwritten_kernel.hpp"

using namespace mlajit;
namespace fs = std::filesystem;

using mlajit::testing::TempDir;

namespace {

using mlajit::testing::read_file;

void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

// fake_entry_meta with 1 KiB of shared memory and a compile time, which these tests read back.
CacheEntryMeta meta_for(const std::string& name) {
  CacheEntryMeta m = testing::fake_entry_meta(name);
  m.entries = {{"mj_entry", 256, 1024}};
  m.compile_seconds = 0.25;
  return m;
}

std::string key_of(int i) { return sha256_hex("entry " + std::to_string(i)); }

std::string fake_cubin(size_t n, char fill) { return std::string("\x7f" "ELF", 4) + std::string(n, fill); }

void set_mtime(const std::string& path, time_t t) {
  struct utimbuf u{t, t};
  REQUIRE(::utime(path.c_str(), &u) == 0);
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Streaming in odd pieces equals one shot.
  std::string msg(1000, 'x');
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<char>(i * 7);
  Sha256 h;
  for (size_t i = 0; i < msg.size();) {
    size_t n = std::min<size_t>(msg.size() - i, 1 + i % 67);
    h.update(msg.data() + i, n);
    i += n;
  }
  auto d = h.finish();
  CHECK(to_hex(d.data(), d.size()) == sha256_hex(msg));
}

TEST_CASE("the cache key changes when any input changes") {
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(4));
  std::vector<std::string> opts = {"-std=c++17", "--gpu-architecture=sm_90a"};
  std::string base = cache_key(src, "sm_90a", opts, "13.0");
  CHECK(base.size() == 64);
  CHECK(cache_key(src, "sm_90a", opts, "13.0") == base);  // deterministic

  auto src2 = src;
  src2.code += " ";
  CHECK(cache_key(src2, "sm_90a", opts, "13.0") != base);                      // source
  CHECK(cache_key(src, "sm_100a", opts, "13.0") != base);                      // arch
  CHECK(cache_key(src, "sm_90a", opts, "12.8") != base);                       // NVRTC version
  auto opts2 = opts;
  opts2.push_back("-lineinfo");
  CHECK(cache_key(src, "sm_90a", opts2, "13.0") != base);                      // an option
  CHECK(cache_key(src, "sm_90a", {"-std=c++17--gpu-architecture=sm_90a"}, "13.0") != base);  // field framing
  CHECK(cache_base_key(src, "sm_90a", opts) != base);                          // base key differs from key

  // Contents of an included template (through a template folder override).
  TempDir dir("cache_tpl", /*create=*/ false);
  fs::create_directories(dir.path / "common");
  for (auto& t : templates()) {
    fs::create_directories((dir.path / t.path).parent_path());
    spit(dir.path / t.path, t.content);
  }
  set_template_dir(dir.path.string());
  CHECK(cache_key(src, "sm_90a", opts, "13.0") == base);  // same bytes, same key
  spit(dir.path / "common/types.cuh", find_template("common/types.cuh")->content + "\n// changed\n");
  set_template_dir(dir.path.string());
  CHECK(cache_key(src, "sm_90a", opts, "13.0") != base);  // a transitively included template changed
  set_template_dir("");
  CHECK(cache_key(src, "sm_90a", opts, "13.0") == base);
}

TEST_CASE("put then get returns the same entry; bad keys are rejected without touching the disk") {
  TempDir dir("cache_hit", /*create=*/ false);
  DiskCache cache(dir.path.string());
  CHECK((fs::status(dir.path).permissions() & fs::perms::all) == fs::perms::owner_all);  // created 0700
  std::string key = key_of(1), cubin = fake_cubin(5000, 'c');
  CHECK_FALSE(cache.get(key));
  cache.put(key, meta_for("k1"), cubin);
  auto e = cache.get(key);
  REQUIRE(e);
  CHECK(e->cubin == cubin);
  CHECK(e->meta.name == "k1");
  CHECK(e->meta.entries.size() == 1);
  CHECK(e->meta.entries[0].smem_bytes == 1024);
  CHECK(e->meta.params_json == R"({"page_size":64,"threads":256})");
  auto files = std::distance(fs::directory_iterator(dir.path), fs::directory_iterator());
  CHECK(files == 1);  // no temp files left behind
  CHECK((fs::status(cache.path_of(key)).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));

  for (const char* bad : {"", "../../etc/passwd", "ABCDEF", "zz"}) CHECK_THROWS_AS(cache.get(bad), Error);
  CHECK_THROWS_AS(cache.put("../x", meta_for("x"), cubin), Error);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("corrupt entries are detected, removed and reported as a miss") {
  TempDir dir("cache_corrupt", /*create=*/ false);
  DiskCache cache(dir.path.string());
  std::string cubin = fake_cubin(4096, 'q');
  struct Damage {
    const char* what;
    std::function<void(std::string&)> apply;
  };
  std::vector<Damage> damages = {
      {"payload byte flipped", [](std::string& d) { d[d.size() - 100] ^= 0x01; }},
      {"truncated", [](std::string& d) { d.resize(d.size() - 10); }},
      {"truncated into the header", [](std::string& d) { d.resize(40); }},
      {"metadata byte flipped", [](std::string& d) { d[160] ^= 0x20; }},
      {"bad magic", [](std::string& d) { d[0] = 'X'; }},
      {"other format version", [](std::string& d) { d[8] = 99; }},
      {"extra bytes appended", [](std::string& d) { d += "junk"; }},
  };
  for (auto& dmg : damages) {
    CAPTURE(dmg.what);
    std::string key = key_of(2);
    cache.put(key, meta_for("k2"), cubin);
    std::string data = read_file(cache.path_of(key));
    dmg.apply(data);
    spit(cache.path_of(key), data);
    auto report = cache.verify();
    CHECK(report.entries == 1);
    CHECK(report.ok == 0);
    REQUIRE(report.corrupt.size() == 1);
    CHECK(fs::exists(cache.path_of(key)));  // verify without removal leaves it
    CHECK_FALSE(cache.get(key));            // detected
    CHECK_FALSE(fs::exists(cache.path_of(key)));  // removed
  }
  // An entry copied under another key's name is not that key's entry.
  cache.put(key_of(3), meta_for("k3"), cubin);
  fs::copy_file(cache.path_of(key_of(3)), cache.path_of(key_of(4)));
  CHECK_FALSE(cache.get(key_of(4)));
  CHECK(cache.get(key_of(3)));
  auto report = cache.verify();
  CHECK(report.entries == 1);
  CHECK(report.ok == 1);
}

TEST_CASE("unsafe cache directories are refused and left unchanged") {
  TempDir dir("cache_perm", /*create=*/ false);
  fs::create_directories(dir.path);
  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_write | fs::perms::group_exec);
  try {
    DiskCache cache(dir.path.string());
    FAIL("group-writable cache dir accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Cache);
    std::string msg = e.what();
    CHECK(msg.find("writable by its group") != std::string::npos);
    CHECK(msg.find("runs code on the GPU") != std::string::npos);
  }
  CHECK(fs::is_empty(dir.path));
  CHECK((fs::status(dir.path).permissions() & fs::perms::group_write) != fs::perms::none);  // not "fixed" silently

  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::others_write | fs::perms::others_exec);
  CHECK_THROWS_AS(DiskCache(dir.path.string()), Error);

  // A file where the directory should be.
  TempDir file("file", /*create=*/ false);
  spit(file.path, "not a dir");
  CHECK_THROWS_AS(DiskCache(file.path.string()), Error);

  // A root-owned directory (when not running as root) is a read-only layer: read, never written.
  if (::geteuid() != 0) {
    DiskCache cache("/");
    CHECK_FALSE(cache.writable());
  }

  // Missing nested directories are created 0700.
  TempDir fresh("fresh", /*create=*/ false);
  DiskCache cache((fresh.path / "a/b/c").string());
  CHECK((fs::status(fresh.path / "a/b/c").permissions() & fs::perms::all) == fs::perms::owner_all);
}

TEST_CASE("LRU eviction under a size cap, prune and clear") {
  TempDir dir("cache_lru", /*create=*/ false);
  std::string cubin = fake_cubin(10000, 'l');
  uint64_t entry_size;
  {
    DiskCache probe(dir.path.string());
    probe.put(key_of(100), meta_for("ep"), cubin);  // same name length as e0..e3: same size
    entry_size = fs::file_size(probe.path_of(key_of(100)));
    probe.clear();
  }
  DiskCache cache(dir.path.string(), 3 * entry_size + entry_size / 2);  // room for 3
  time_t now = ::time(nullptr);
  for (int i = 0; i < 3; ++i) {
    cache.put(key_of(i), meta_for("e" + std::to_string(i)), cubin);
    set_mtime(cache.path_of(key_of(i)), now - 1000 + i * 100);  // e0 oldest
  }
  REQUIRE(cache.get(key_of(0)));  // a hit makes e0 the most recently used
  cache.put(key_of(3), meta_for("e3"), cubin);
  CHECK(fs::exists(cache.path_of(key_of(0))));
  CHECK_FALSE(fs::exists(cache.path_of(key_of(1))));  // least recently used: evicted
  CHECK(fs::exists(cache.path_of(key_of(2))));
  CHECK(fs::exists(cache.path_of(key_of(3))));

  auto listing = cache.list();
  REQUIRE(listing.size() == 3);
  CHECK(listing[0].name == "e2");  // oldest first
  CHECK(listing[0].arch == "sm_90a");
  CHECK(listing[0].size == entry_size);

  auto pr = cache.prune(entry_size);
  CHECK(pr.removed == 2);
  CHECK(pr.remaining_bytes == entry_size);
  CHECK(cache.list().size() == 1);

  spit(dir.path / "notes.txt", "user file");
  { DiskCache::KeyLock lock(cache, key_of(9)); }
  CHECK(cache.clear() == 1);
  CHECK(cache.list().empty());
  CHECK(fs::exists(dir.path / "notes.txt"));  // clear never removes files mlajit did not write
  CHECK_FALSE(fs::exists(dir.path / (key_of(9) + ".lock")));
}

TEST_CASE("a held key lock makes a second locker wait, then proceed unlocked after its timeout") {
  TempDir dir("cache_lock", /*create=*/ false);
  DiskCache cache(dir.path.string());
  DiskCache::KeyLock first(cache, key_of(5));
  CHECK(first.locked());
  auto t0 = std::chrono::steady_clock::now();
  DiskCache::KeyLock second(cache, key_of(5), 0.1);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_FALSE(second.locked());
  CHECK(waited >= 0.09);
  DiskCache::KeyLock other_key(cache, key_of(6), 0.1);
  CHECK(other_key.locked());
}

TEST_CASE("single flight: 8 threads asking for one key build it once") {
  detail::SingleFlightCache<KernelSpec, int> sf;
  std::atomic<int> builds{0};
  KernelSpec spec = mlajit_test::axpy_spec(4);
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const int>> got(8);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      got[t] = sf.get(spec, spec.hash(), [&] {
        builds++;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return std::make_shared<const int>(42);
      });
    });
  for (auto& th : threads) th.join();
  CHECK(builds == 1);
  for (auto& g : got) CHECK(g.get() == got[0].get());

  // A failed build reaches every waiter and is retried by the next request.
  KernelSpec other = mlajit_test::axpy_spec(8);
  std::atomic<int> failures{0};
  threads.clear();
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      try {
        sf.get(other, other.hash(), []() -> std::shared_ptr<const int> {
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          throw Error(ErrorKind::Compile, "boom");
        });
      } catch (const Error&) {
        failures++;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 4);
  CHECK(*sf.get(other, other.hash(), [] { return std::make_shared<const int>(7); }) == 7);
  CHECK(sf.size() == 2);
}

TEST_CASE("8 threads building one source through the disk cache compile it once") {
  if (!Compiler::available()) {
    MESSAGE("NVRTC unavailable: skipped");
    return;
  }
  TempDir dir("cache_flight", /*create=*/ false);
  DiskCache cache(dir.path.string());
  // A source unique to this run so that no earlier cache could hold it.
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(64), "// run " + std::to_string(::getpid()) + "\n");
  auto before = Compiler::compile_count();
  std::vector<BuildResult> results(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { results[t] = build_source(src, "sm_90a", &cache).result; });
  for (auto& th : threads) th.join();
  CHECK(Compiler::compile_count() - before == 1);
  int hits = 0;
  for (auto& r : results) {
    hits += r.cache_hit;
    CHECK(r.key == results[0].key);
  }
  CHECK(hits == 7);
  // A second round is all disk hits.
  auto again = build_source(src, "sm_90a", &cache);
  CHECK(again.result.cache_hit);
  CHECK(again.cubin.compare(0, 4, "\x7f" "ELF") == 0);
  MESSAGE("disk hit (read + verify) took " << again.result.seconds * 1e3 << " ms");
  CHECK(Compiler::compile_count() - before == 1);
}
