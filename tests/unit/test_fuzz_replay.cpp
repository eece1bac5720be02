// The libFuzzer targets (tests/fuzz) replayed over their seed corpora and over every input a
// fuzzer ever reported (tests/fuzz/regressions/<target>/): each must run through without a crash,
// a sanitizer report or a broken property, now and after every change.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

extern "C" int mlajit_fuzz_config_one(const uint8_t* data, size_t size);
extern "C" int mlajit_fuzz_cache_entry_one(const uint8_t* data, size_t size);
extern "C" int mlajit_fuzz_shape_one(const uint8_t* data, size_t size);
extern "C" int mlajit_fuzz_cache_archive_one(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

namespace {

// Replays every file of tests/fuzz/{corpus,regressions}/<target>; returns how many ran.
int replay(const std::string& target, int (*one)(const uint8_t*, size_t)) {
  int n = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    fs::path dir = fs::path(MLAJIT_SOURCE_DIR) / "tests/fuzz" / kind / target;
    if (!fs::exists(dir)) continue;
    for (auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
      std::ifstream f(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      std::string data = ss.str();
      INFO("input " << e.path().string());
      one(reinterpret_cast<const uint8_t*>(data.data()), data.size());
      ++n;
    }
  }
  return n;
}

}  // namespace

TEST_CASE("fuzz replay: config / kernel spec parser") { CHECK(replay("config", mlajit_fuzz_config_one) >= 4); }
TEST_CASE("fuzz replay: cache entry reader") { CHECK(replay("cache_entry", mlajit_fuzz_cache_entry_one) >= 4); }
TEST_CASE("fuzz replay: --shape parser") { CHECK(replay("shape", mlajit_fuzz_shape_one) >= 3); }
TEST_CASE("fuzz replay: cache archive reader") { CHECK(replay("cache_archive", mlajit_fuzz_cache_archive_one) >= 4); }
