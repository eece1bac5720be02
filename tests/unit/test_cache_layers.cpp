// A cache as a search path of layers (include/mlajit/cache.hpp, "Layers"): read-only layers are
// found and never written, misses go to the first writable layer, unsafe layers are refused, and
// an image built as root serves a non-root user.
#include "shell_command.hpp"
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/sha256.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "unit/fake_entry_meta.hpp"

using namespace mlajit;
namespace fs = std::filesystem;
using mlajit::testing::TempDir;

namespace {

CacheEntryMeta layer_meta() { return mlajit::testing::fake_entry_meta("layer"); }

std::string lkey(int i) { return sha256_hex("layer entry " + std::to_string(i)); }
const std::string kCubin = std::string("\x7f" "ELF", 4) + std::string(2000, 'l');
constexpr uid_t kNobody = 65534;

// Sets (or, with nullopt, unsets) an environment variable for one scope, restoring the old value.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, std::optional<std::string> v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    if (v) ::setenv(n, v->c_str(), 1);
    else ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// A layer as an image ships it: entries written by DiskCache, then the files made `file_mode`
// and the directory `dir_mode`.
void make_read_only_layer(const fs::path& dir, const std::vector<int>& keys, mode_t dir_mode = 0555,
                          mode_t file_mode = 0444) {
  {
    DiskCache builder(dir.string());
    for (int k : keys) builder.put(lkey(k), layer_meta(), kCubin);
  }
  for (auto& e : fs::directory_iterator(dir)) REQUIRE(::chmod(e.path().c_str(), file_mode) == 0);
  REQUIRE(::chmod(dir.c_str(), dir_mode) == 0);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

using Out = mlajit::testing::ShellOutput;

Out sh(const std::string& command) { return mlajit::testing::run_shell(command + " 2>/dev/null"); }

}  // namespace

TEST_CASE("layers: a read-only layer's entry is found, misses go to the writable layer, the read-only one is never written") {
  TempDir t("layers_ro");
  const fs::path ro = t.path / "ro", rw = t.path / "rw";
  make_read_only_layer(ro, {1});
  const auto ro_before = names_in(ro);
  const auto ro_mtime = fs::last_write_time(ro / (lkey(1) + ".mjc"));

  DiskCache cache(std::vector<std::string>{ro.string(), rw.string()});
  REQUIRE(cache.layers().size() == 2);
  CHECK_FALSE(cache.layers()[0].writable);
  CHECK(cache.layers()[1].writable);
  CHECK(cache.writable());
  CHECK(cache.dir() == rw.string());
  CHECK((fs::status(rw).permissions() & fs::perms::all) == fs::perms::owner_all);  // created 0700

  auto hit = cache.get(lkey(1));
  REQUIRE(hit);
  CHECK(hit->cubin == kCubin);

  {
    DiskCache::KeyLock lock(cache, lkey(2));
    CHECK(lock.locked());
  }
  cache.put(lkey(2), layer_meta(), kCubin);  // a miss: compiled, stored in the writable layer
  CHECK(fs::exists(rw / (lkey(2) + ".mjc")));
  CHECK(cache.get(lkey(2)));

  auto listed = cache.list();
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].layer == ro.string());
  CHECK(listed[0].read_only);
  CHECK(listed[1].layer == rw.string());
  CHECK_FALSE(listed[1].read_only);
  auto rep = cache.verify(/*remove_corrupt=*/true);
  CHECK(rep.entries == 2);
  CHECK(rep.ok == 2);

  CHECK(cache.prune(0).removed == 1);  // only the writable layer's entry
  cache.put(lkey(2), layer_meta(), kCubin);
  CHECK(cache.clear() == 1);
  CHECK(cache.get(lkey(1)));  // the read-only layer still serves

  // Not one byte of the read-only layer changed: no new file (lock, temp), no LRU touch.
  CHECK(names_in(ro) == ro_before);
  CHECK(fs::last_write_time(ro / (lkey(1) + ".mjc")) == ro_mtime);
  ::chmod(ro.c_str(), 0700);
}

TEST_CASE("layers: lookups search the layers in order; a bad entry in a read-only layer is skipped, never removed") {
  TempDir t("layers_order");
  const fs::path ro = t.path / "ro", rw = t.path / "rw";
  {
    DiskCache builder(ro.string());
    builder.put(lkey(3), layer_meta(), kCubin);
    // One flipped cubin byte: the payload checksum no longer matches.
    std::fstream f(builder.path_of(lkey(3)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('X');
  }
  make_read_only_layer(ro, {}, 0555, 0444);
  {
    DiskCache writer(rw.string());
    writer.put(lkey(3), layer_meta(), kCubin);
  }
  DiskCache cache(std::vector<std::string>{ro.string(), rw.string()});
  auto e = cache.get(lkey(3));
  REQUIRE(e);  // the good copy of the later layer
  CHECK(e->cubin == kCubin);
  CHECK(fs::exists(ro / (lkey(3) + ".mjc")));  // the bad one stays where it is

  auto rep = cache.verify(/*remove_corrupt=*/true);
  REQUIRE(rep.corrupt.size() == 1);
  CHECK(rep.corrupt[0].read_only);
  CHECK(rep.corrupt[0].reason.find("checksum") != std::string::npos);
  CHECK(fs::exists(ro / (lkey(3) + ".mjc")));

  // The first layer wins when both hold a good entry: the writable one, listed first here.
  DiskCache rw_first(std::vector<std::string>{rw.string(), ro.string()});
  CHECK(rw_first.dir() == rw.string());
  CHECK(rw_first.get(lkey(3)));
  ::chmod(ro.c_str(), 0700);
}

TEST_CASE("layers: a layer writable by group or others is refused with a clear error, and nothing is created") {
  TempDir t("layers_unsafe");
  const fs::path shared = t.path / "shared", rw = t.path / "rw";
  fs::create_directories(shared);
  for (mode_t mode : {0775, 0757, 0777}) {
    CAPTURE(mode);
    REQUIRE(::chmod(shared.c_str(), mode) == 0);
    try {
      DiskCache cache(std::vector<std::string>{shared.string(), rw.string()});
      FAIL("a group/other-writable layer was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Cache);
      const std::string msg = e.what();
      CHECK(msg.find(shared.string()) != std::string::npos);
      CHECK(msg.find((mode & S_IWOTH) ? "writable by other users" : "writable by its group") != std::string::npos);
      CHECK(msg.find("runs code on the GPU") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(rw));
  }
  // A later unsafe layer is refused too, even though the first one takes every write.
  REQUIRE(::chmod(shared.c_str(), 0777) == 0);
  CHECK_THROWS_AS(DiskCache(std::vector<std::string>{rw.string(), shared.string()}), Error);
}

TEST_CASE("layers: every layer read-only: lookups work, a put is a clear error, no lock is taken") {
  TempDir t("layers_all_ro");
  const fs::path ro = t.path / "ro";
  make_read_only_layer(ro, {4});
  DiskCache cache(ro.string());  // one directory the caller cannot write (0555): read-only, not refused
  CHECK_FALSE(cache.writable());
  CHECK(cache.get(lkey(4)));
  DiskCache::KeyLock lock(cache, lkey(5), 0.01);
  CHECK_FALSE(lock.locked());
  try {
    cache.put(lkey(5), layer_meta(), kCubin);
    FAIL("put into a read-only cache");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Cache);
    CHECK(std::string(e.what()).find("read-only") != std::string::npos);
  }
  CHECK(cache.clear() == 0);
  CHECK(names_in(ro).size() == 1);
  ::chmod(ro.c_str(), 0700);
}

TEST_CASE("layers: a missing layer is skipped, or becomes the writable one; a second writable layer is read-only") {
  TempDir t("layers_missing");
  const fs::path a = t.path / "a", b = t.path / "b", c = t.path / "c";
  fs::create_directories(b);
  ::chmod(b.c_str(), 0700);
  // a is missing and comes first: it is created and takes writes; b (writable too) is read-only.
  DiskCache cache(std::vector<std::string>{a.string(), b.string(), c.string()});
  REQUIRE(cache.layers().size() == 2);  // c: missing after the writable layer, nothing to read
  CHECK(cache.layers()[0].dir == a.string());
  CHECK(cache.layers()[0].writable);
  CHECK_FALSE(cache.layers()[1].writable);
  CHECK_FALSE(fs::exists(c));
  // Without create (what `mlajit info` reports), nothing is made.
  auto described = resolve_cache_layers({(t.path / "x").string(), b.string()}, /*create=*/false);
  CHECK_FALSE(described[0].exists);
  CHECK(described[0].writable);
  CHECK_FALSE(fs::exists(t.path / "x"));
}

TEST_CASE("layers: MLAJIT_CACHE_PATH is split at ':'; setting it with MLAJIT_CACHE_DIR is an error") {
  {
    ScopedEnv dir("MLAJIT_CACHE_DIR", std::nullopt);
    ScopedEnv path("MLAJIT_CACHE_PATH", std::string("/opt/mlajit/cache::/home/u/.cache/mlajit:"));
    CHECK(config::cache_path() == std::vector<std::string>{"/opt/mlajit/cache", "/home/u/.cache/mlajit"});
  }
  {
    ScopedEnv dir("MLAJIT_CACHE_DIR", std::nullopt);
    ScopedEnv path("MLAJIT_CACHE_PATH", std::string(":::"));
    CHECK_THROWS_AS(config::cache_path(), Error);
  }
  {
    ScopedEnv dir("MLAJIT_CACHE_DIR", std::string("/tmp/one"));
    ScopedEnv path("MLAJIT_CACHE_PATH", std::string("/tmp/two"));
    try {
      config::cache_path();
      FAIL("both accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::InvalidArgument);
      CHECK(std::string(e.what()).find("MLAJIT_CACHE_DIR") != std::string::npos);
    }
  }
  {
    ScopedEnv dir("MLAJIT_CACHE_DIR", std::string("/tmp/one"));
    ScopedEnv path("MLAJIT_CACHE_PATH", std::nullopt);
    CHECK(config::cache_path() == std::vector<std::string>{"/tmp/one"});
  }
}

TEST_CASE("layers: root-owned read-only layers are trusted, layers and entries of other users are not") {
  if (::geteuid() != 0) {
    MESSAGE("not root: cannot chown to another user; skipped");
    return;
  }
  TempDir t("layers_owner");
  const fs::path ro = t.path / "ro", rw = t.path / "rw";
  make_read_only_layer(ro, {6, 7}, 0555, 0444);
  // An entry owned by another (non-root) user inside a read-only layer: refused, not removed.
  REQUIRE(::chown((ro / (lkey(7) + ".mjc")).c_str(), kNobody, kNobody) == 0);
  DiskCache cache(std::vector<std::string>{ro.string(), rw.string()});
  CHECK(cache.get(lkey(6)));
  CHECK_FALSE(cache.get(lkey(7)));
  CHECK(fs::exists(ro / (lkey(7) + ".mjc")));
  auto rep = cache.verify(true);
  REQUIRE(rep.corrupt.size() == 1);
  CHECK(rep.corrupt[0].reason.find("owned by uid 65534") != std::string::npos);

  // A layer directory owned by another user: refused outright.
  REQUIRE(::chown(ro.c_str(), kNobody, kNobody) == 0);
  try {
    DiskCache refused(std::vector<std::string>{ro.string(), rw.string()});
    FAIL("a layer owned by uid 65534 was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("neither the current user") != std::string::npos);
  }
  ::chown(ro.c_str(), 0, 0);
  ::chmod(ro.c_str(), 0700);
}

TEST_CASE("layers: an image built as root serves a non-root user read-only (mlajit build, then run as uid 65534)") {
  if (::geteuid() != 0 || sh("command -v setpriv").code != 0) {
    MESSAGE("needs root and setpriv to run a command as another user; skipped");
    return;
  }
  if (!Compiler::available()) {
    MESSAGE("NVRTC unavailable: nothing to build; skipped");
    return;
  }
  TempDir t("layers_image");
  ::chmod(t.path.c_str(), 0755);
  const fs::path image = t.path / "opt_cache", home = t.path / "home";
  const std::string cfg = (t.path / "k.json").string();
  std::ofstream(cfg) << R"({"kernels": [{"op": "sparse_index_remap", "params": {"page_size": 64}}]})";
  ::chmod(cfg.c_str(), 0644);
  // The image step, as root.
  Out built = sh(std::string(MLAJIT_CLI_PATH) + " build " + cfg + " --arch sm_90a --json --cache-dir " + image.string());
  REQUIRE(built.code == 0);
  CHECK(nlohmann::json::parse(built.text)["compiled"] == 1);
  ::chmod(image.c_str(), 0755);  // what an image's `chmod -R a+rX` leaves: readable, root-writable only
  for (auto& e : fs::directory_iterator(image)) ::chmod(e.path().c_str(), 0644);
  const auto image_before = names_in(image);
  fs::create_directories(home);  // the user's own directory (its parent here is root's)
  REQUIRE(::chown(home.c_str(), kNobody, kNobody) == 0);
  ::chmod(home.c_str(), 0700);

  // The serving user: its own home layer after the image's.
  const std::string as_nobody = "MLAJIT_CACHE_DIR= MLAJIT_CACHE_PATH=" + image.string() + ":" + home.string() +
                                " setpriv --reuid=65534 --regid=65534 --clear-groups " + MLAJIT_CLI_PATH;
  Out served = sh(as_nobody + " build " + cfg + " --arch sm_90a --json");
  REQUIRE(served.code == 0);
  auto j = nlohmann::json::parse(served.text);
  CHECK(j["cache_hits"] == 1);
  CHECK(j["compiled"] == 0);
  CHECK(j["cache_dir"] == home.string());
  Out verified = sh(as_nobody + " cache verify --json");
  REQUIRE(verified.code == 0);
  auto v = nlohmann::json::parse(verified.text);
  CHECK(v["ok"] == 1);
  CHECK(v["layers"][0]["writable"] == false);
  CHECK(v["layers"][1]["writable"] == true);
  // A miss (another arch) compiles into the user's layer, not the image.
  Out miss = sh(as_nobody + " build " + cfg + " --arch sm_100a --json");
  REQUIRE(miss.code == 0);
  CHECK(nlohmann::json::parse(miss.text)["compiled"] == 1);
  CHECK(names_in(image) == image_before);
  struct stat st;
  REQUIRE(::stat(home.c_str(), &st) == 0);
  CHECK(st.st_uid == kNobody);
  CHECK(names_in(home).size() >= 1);

  // The same image made group-writable is refused to the user, with the reason.
  ::chmod(image.c_str(), 0775);
  Out refused = sh(as_nobody + " cache ls 2>&1; true");
  CHECK(refused.text.find("writable by its group") != std::string::npos);
  ::chmod(image.c_str(), 0755);
}

TEST_CASE("layers: the packaged layer (MLAJIT_PREBUILT_CACHE) is searched after the user's, read-only, and skipped when unsafe") {
  TempDir t("layers_packaged");
  const fs::path pkg = t.path / "prebuilt-cache", user = t.path / "user";
  make_read_only_layer(pkg, {7}, 0755, 0644);  // as an install leaves it: owner-writable, read by all
  {
    ScopedEnv off("MLAJIT_PREBUILT_CACHE", std::string("off"));
    CHECK_FALSE(config::prebuilt_cache_dir());
  }
  ScopedEnv path("MLAJIT_CACHE_PATH", std::nullopt);
  ScopedEnv dir("MLAJIT_CACHE_DIR", user.string());
  ScopedEnv disabled("MLAJIT_DISABLE_DISK_CACHE", std::nullopt);
  ScopedEnv max("MLAJIT_CACHE_MAX_BYTES", std::nullopt);
  {
    ScopedEnv prebuilt("MLAJIT_PREBUILT_CACHE", pkg.string());
    REQUIRE(config::prebuilt_cache_dir() == pkg.string());
    auto cache = DiskCache::from_env();
    REQUIRE(cache);
    REQUIRE(cache->layers().size() == 2);
    CHECK(cache->layers()[0].dir == user.string());
    CHECK(cache->layers()[0].writable);
    CHECK(cache->layers()[1].dir == pkg.string());
    CHECK_FALSE(cache->layers()[1].writable);  // owner-writable on disk, but never written
    CHECK(cache->get(lkey(7)));                // served by the packaged layer
    cache->put(lkey(8), layer_meta(), kCubin);  // a miss goes to the user's layer
    CHECK(fs::exists(user / (lkey(8) + ".mjc")));
    CHECK_FALSE(fs::exists(pkg / (lkey(8) + ".mjc")));
    const auto layers = cache_layers_from_env();  // what `mlajit info` / `cache ls` show
    REQUIRE(layers.size() == 2);
    CHECK(layers[1].dir == pkg.string());
    // Added once, whatever the number of calls.
    cache->add_read_only_layer(pkg.string());
    CHECK(cache->layers().size() == 2);
  }
  {
    // A packaged layer others could write into is not used (a warning), and the cache still works.
    REQUIRE(::chmod(pkg.c_str(), 0777) == 0);
    ScopedEnv prebuilt("MLAJIT_PREBUILT_CACHE", pkg.string());
    auto cache = DiskCache::from_env();
    REQUIRE(cache);
    CHECK(cache->layers().size() == 1);
    CHECK_FALSE(cache->get(lkey(7)));
    REQUIRE(::chmod(pkg.c_str(), 0755) == 0);
  }
  {
    // A missing one is skipped.
    ScopedEnv prebuilt("MLAJIT_PREBUILT_CACHE", (t.path / "absent").string());
    auto cache = DiskCache::from_env();
    REQUIRE(cache);
    CHECK(cache->layers().size() == 1);
  }
}
