// Trust rules of the disk cache's entry files (cache.hpp): an entry others could have written is
// never loaded but recompiled over, and lock files go away with their entries.
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/sha256.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/error.hpp"
#include "unit/fake_entry_meta.hpp"

using namespace mlajit;
namespace fs = std::filesystem;
using mlajit::testing::TempDir;

namespace {

CacheEntryMeta trust_meta() { return mlajit::testing::fake_entry_meta("trust"); }

std::string tkey(int i) { return sha256_hex("trust entry " + std::to_string(i)); }
const std::string kCubin = std::string("\x7f" "ELF", 4) + std::string(3000, 't');

bool has_lock(const DiskCache& c, const std::string& key) { return fs::exists(c.dir() + "/" + key + ".lock"); }

}  // namespace

TEST_CASE("an entry file writable by group or others is refused, removed and can be written again") {
  TempDir dir("trust_mode", /*create=*/false);
  DiskCache cache(dir.str());
  for (mode_t mode : {0620, 0602, 0666}) {
    CAPTURE(mode);
    cache.put(tkey(1), trust_meta(), kCubin);
    REQUIRE(::chmod(cache.path_of(tkey(1)).c_str(), mode) == 0);
    auto rep = cache.verify();
    REQUIRE(rep.corrupt.size() == 1);
    CHECK(rep.corrupt[0].reason.find("writable by") != std::string::npos);
    CHECK_FALSE(cache.get(tkey(1)));                    // never loaded
    CHECK_FALSE(fs::exists(cache.path_of(tkey(1))));   // removed: the caller recompiles over it
    cache.put(tkey(1), trust_meta(), kCubin);          // the recompiled entry is 0600 again
    CHECK((fs::status(cache.path_of(tkey(1))).permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write));
    REQUIRE(cache.get(tkey(1)));
  }
  // Read-only for others is fine (only writers could have planted it).
  REQUIRE(::chmod(cache.path_of(tkey(1)).c_str(), 0644) == 0);
  CHECK(cache.get(tkey(1)));
}

TEST_CASE("an entry file owned by another user is refused and removed") {
  if (::geteuid() != 0) {
    MESSAGE("not root: cannot chown a file to another user; skipped");
    return;
  }
  TempDir dir("trust_owner", /*create=*/false);
  DiskCache cache(dir.str());
  cache.put(tkey(2), trust_meta(), kCubin);
  REQUIRE(::chown(cache.path_of(tkey(2)).c_str(), 65534, 65534) == 0);
  auto rep = cache.verify();
  REQUIRE(rep.corrupt.size() == 1);
  CHECK(rep.corrupt[0].reason.find("owned by uid 65534") != std::string::npos);
  CHECK_FALSE(cache.get(tkey(2)));
  CHECK_FALSE(fs::exists(cache.path_of(tkey(2))));
}

TEST_CASE("a symlinked entry is refused") {
  TempDir dir("trust_link", /*create=*/false);
  DiskCache cache(dir.str());
  cache.put(tkey(3), trust_meta(), kCubin);
  fs::rename(cache.path_of(tkey(3)), dir.path / "elsewhere");
  fs::create_symlink(dir.path / "elsewhere", cache.path_of(tkey(3)));
  CHECK_FALSE(cache.get(tkey(3)));
  CHECK(fs::exists(dir.path / "elsewhere"));  // the link target is not touched
}

TEST_CASE("lock files are removed with their entries: bad entry, eviction, verify --remove, prune") {
  TempDir dir("trust_locks", /*create=*/false);
  uint64_t entry_size;
  {
    DiskCache probe(dir.str());
    probe.put(tkey(0), trust_meta(), kCubin);
    entry_size = fs::file_size(probe.path_of(tkey(0)));
    probe.clear();
  }
  DiskCache cache(dir.str(), 2 * entry_size + entry_size / 2);  // room for 2
  auto put_locked = [&](int i) {
    DiskCache::KeyLock lock(cache, tkey(i));  // as build_kernel does around compile + put
    REQUIRE(lock.locked());
    cache.put(tkey(i), trust_meta(), kCubin);
  };
  put_locked(1);
  put_locked(2);
  CHECK(has_lock(cache, tkey(1)));
  CHECK(has_lock(cache, tkey(2)));
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  ::utimensat(AT_FDCWD, cache.path_of(tkey(1)).c_str(), old, 0);  // entry 1 is the LRU one
  put_locked(3);                                                   // evicts entry 1 ...
  CHECK_FALSE(fs::exists(cache.path_of(tkey(1))));
  CHECK_FALSE(has_lock(cache, tkey(1)));  // ... and its lock
  CHECK(has_lock(cache, tkey(3)));        // the lock just released stays with its entry

  // A bad entry found by get(): removed with its lock.
  ::chmod(cache.path_of(tkey(2)).c_str(), 0666);
  CHECK_FALSE(cache.get(tkey(2)));
  CHECK_FALSE(has_lock(cache, tkey(2)));

  // A held lock is left alone (its holder is compiling that key), then verify --remove.
  put_locked(4);
  ::chmod(cache.path_of(tkey(4)).c_str(), 0666);
  {
    DiskCache::KeyLock held(cache, tkey(4));
    REQUIRE(held.locked());
    CHECK(cache.verify(/*remove_corrupt=*/true).corrupt.size() == 1);
    CHECK(has_lock(cache, tkey(4)));
  }
  put_locked(4);
  ::chmod(cache.path_of(tkey(4)).c_str(), 0666);
  CHECK(cache.verify(/*remove_corrupt=*/true).corrupt.size() == 1);
  CHECK_FALSE(has_lock(cache, tkey(4)));

  // prune removes the pruned entries' locks and orphaned locks (a crash between lock and put).
  { DiskCache::KeyLock orphan(cache, tkey(7)); }
  CHECK(has_lock(cache, tkey(7)));
  cache.prune(0);
  CHECK(cache.list().empty());
  for (auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().extension() != ".lock");
}

TEST_CASE("metadata integers are checked before conversion (planted-entry regression)") {
  // get<unsigned>() of 1.5e300 was undefined behaviour (a float-to-int cast out of range), reached
  // by any entry whose checksums match its planted metadata (seed tests/fuzz/corpus/cache_entry/float_threads).
  auto meta = [](const std::string& entry, const std::string& created = "1") {
    return R"({"name":"x","op":"sparse_index_remap","params":{},"entries":[)" + entry +
           R"(],"arch":"sm_90a","nvrtc_version":"13.0","compile_seconds":0.1,"created":)" + created + "}";
  };
  for (const char* bad : {R"({"symbol":"e","threads":1.5e300,"smem":0})", R"({"symbol":"e","threads":-1,"smem":0})",
                          R"({"symbol":"e","threads":256,"smem":4294967296})", R"({"symbol":"e","threads":"256","smem":0})"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(CacheEntryMeta::from_json(meta(bad)), doctest::Contains("bad metadata JSON"), Error);
  }
  CHECK_THROWS_WITH_AS(CacheEntryMeta::from_json(meta(R"({"symbol":"e","threads":256,"smem":0})", "1e300")),
                       doctest::Contains("created"), Error);
  auto ok = CacheEntryMeta::from_json(meta(R"({"symbol":"e","threads":256,"smem":4294967295})"));
  CHECK(ok.entries[0].smem_bytes == 4294967295u);
}
