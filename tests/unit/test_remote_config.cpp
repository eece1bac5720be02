// Remote cache configuration without a server: the fleet key file's checks, the opt-in for
// unsigned entries, connection strings, and the environment (no network is touched).
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "jit/redis_store.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/error.hpp"

using namespace mlajit;
using mlajit::testing::TempDir;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("remote config: the fleet key file must be owner-only and long enough") {
  TempDir t("remote_key");
  const std::string path = (t.path / "fleet.key").string();
  std::ofstream(path) << "0123456789abcdef0123\n";
  ::chmod(path.c_str(), 0600);
  CHECK(read_fleet_key(path) == "0123456789abcdef0123");  // the trailing newline is not key
  ::chmod(path.c_str(), 0640);
  CHECK(error_of([&] { read_fleet_key(path); }).find("its group") != std::string::npos);
  ::chmod(path.c_str(), 0604);
  CHECK(error_of([&] { read_fleet_key(path); }).find("chmod 600") != std::string::npos);
  ::chmod(path.c_str(), 0600);
  std::ofstream(path) << "short";
  CHECK(error_of([&] { read_fleet_key(path); }).find("at least 16") != std::string::npos);
  CHECK(error_of([&] { read_fleet_key((t.path / "missing").string()); }).find("cannot open") != std::string::npos);
}

TEST_CASE("remote config: no key, no remote tier, unless unsigned entries are allowed explicitly") {
  RemoteConfig c;
  c.url = "redis://127.0.0.1:1/0";
  CHECK(error_of([&] { RemoteCache(open_remote_store(c.url, c.timeouts), c, ""); }).find("MLAJIT_REMOTE_CACHE_KEY_FILE") !=
        std::string::npos);
  c.allow_unsigned = true;
  RemoteCache rc(open_remote_store(c.url, c.timeouts), c, "");
  CHECK_FALSE(rc.signing());
}

TEST_CASE("remote config: connection strings") {
  auto a = RedisAddress::parse("redis://cache.example:6380/3");
  CHECK(a.host == "cache.example");
  CHECK(a.port == 6380);
  CHECK(a.db == 3);
  auto b = RedisAddress::parse("redis://:s3cret@10.0.0.5");
  CHECK(b.host == "10.0.0.5");
  CHECK(b.port == 6379);
  CHECK(b.password == "s3cret");
  CHECK(RedisStore(b, {}).describe().find("s3cret") == std::string::npos);
  for (const char* bad : {"http://x", "redis://", "redis://h:0", "redis://h:99999", "redis://h/x"})
    CHECK_THROWS_AS(RedisAddress::parse(bad), Error);
  CHECK(error_of([] { RedisAddress::parse("redis://:pw@h:99999"); }).find("pw") == std::string::npos);
  CHECK_THROWS_AS(open_remote_store("memcached://x", {}), Error);
}

TEST_CASE("remote config: the environment") {
  ::unsetenv("MLAJIT_REMOTE_CACHE");
  CHECK_FALSE(RemoteConfig::from_env());
  CHECK(RemoteCache::from_env() == nullptr);
  ::setenv("MLAJIT_REMOTE_CACHE", "redis://127.0.0.1:1/0", 1);
  ::setenv("MLAJIT_REMOTE_CACHE_TTL", "60", 1);
  ::setenv("MLAJIT_REMOTE_CACHE_PREFIX", "fleet7:", 1);
  ::setenv("MLAJIT_REMOTE_CACHE_TIMEOUT_MS", "250", 1);
  auto c = RemoteConfig::from_env();
  REQUIRE(c);
  CHECK(c->ttl_s == 60);
  CHECK(c->prefix == "fleet7:");
  CHECK(c->timeouts.command.count() == 250);
  CHECK(c->timeouts.connect.count() == 200);
  ::setenv("MLAJIT_REMOTE_CACHE_TTL", "soon", 1);
  CHECK(error_of([] { RemoteConfig::from_env(); }).find("MLAJIT_REMOTE_CACHE_TTL") != std::string::npos);
  // No key file and no opt-in: refused (the process-wide tier would stay off with a warning).
  ::setenv("MLAJIT_REMOTE_CACHE_TTL", "60", 1);
  CHECK(error_of([] { RemoteCache::from_env(); }).find("no signing key") != std::string::npos);
  for (const char* v : {"MLAJIT_REMOTE_CACHE", "MLAJIT_REMOTE_CACHE_TTL", "MLAJIT_REMOTE_CACHE_PREFIX",
                        "MLAJIT_REMOTE_CACHE_TIMEOUT_MS"})
    ::unsetenv(v);
}
