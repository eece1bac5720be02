// mlajit_runtime: a cache directory per runtime, chosen by the host instead of the environment.
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstddef>
#include <filesystem>
#include <string>

#include "mlajit/c_api.h"
#include "mlajit/compiler.hpp"

namespace fs = std::filesystem;
using mlajit::testing::TempDir;

namespace {

const char* kSpec = R"({"op": "sparse_index_remap", "params": {"page_size": 64}})";

size_t entries_in(const fs::path& dir) {
  size_t n = 0;
  if (!fs::exists(dir)) return 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".mjc";
  return n;
}

mlajit_runtime_options options_for(const std::string& path) {
  mlajit_runtime_options o{};
  o.struct_size = sizeof o;
  o.cache_path = path.c_str();
  return o;
}

}  // namespace

TEST_CASE("c api: a runtime's cache path takes its precompiles") {
  TempDir t("capi_rt");
  const fs::path mine = t.path / "mine";
  const std::string path = mine.string();
  mlajit_runtime_options o = options_for(path);
  mlajit_runtime rt = nullptr;
  REQUIRE_MESSAGE(mlajit_runtime_create_with_options(&o, &rt) == MLAJIT_OK, mlajit_last_error());
  CHECK(std::string(mlajit_runtime_cache_dir(rt)) == path);
  CHECK(fs::is_directory(mine));  // opened (and created 0700) at creation, not at first use

  mlajit_op op = nullptr;
  REQUIRE(mlajit_op_create_in(rt, kSpec, &op) == MLAJIT_OK);
  CHECK(std::string(mlajit_op_describe(op)).find("sparse_index_remap") != std::string::npos);

  if (mlajit::Compiler::available()) {
    int hit = -1;
    REQUIRE_MESSAGE(mlajit_runtime_precompile(rt, kSpec, "sm_90a", &hit) == MLAJIT_OK, mlajit_last_error());
    CHECK(hit == 0);
    CHECK(entries_in(mine) == 1);
    REQUIRE(mlajit_runtime_precompile(rt, kSpec, "sm_90a", &hit) == MLAJIT_OK);
    CHECK(hit == 1);
  } else {
    MESSAGE("NVRTC unavailable: precompile not exercised");
  }
  // The op keeps the runtime alive: destroying the handle first is fine.
  mlajit_runtime_destroy(rt);
  mlajit_op_destroy(op);
  mlajit_runtime_destroy(nullptr);
}

TEST_CASE("c api: runtime options are checked at creation: unsafe cache, bad struct_size, disabled cache") {
  TempDir t("capi_rt_bad");
  const fs::path shared = t.path / "shared";
  fs::create_directories(shared);
  ::chmod(shared.c_str(), 0770);
  const std::string path = shared.string();
  mlajit_runtime_options o = options_for(path);
  mlajit_runtime rt = nullptr;
  CHECK(mlajit_runtime_create_with_options(&o, &rt) == MLAJIT_ERROR_CACHE);
  CHECK(std::string(mlajit_last_error()).find("writable by its group") != std::string::npos);
  CHECK(rt == nullptr);

  o.struct_size = sizeof o + 8;  // a header newer than this library
  CHECK(mlajit_runtime_create_with_options(&o, &rt) == MLAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(mlajit_last_error()).find("struct_size") != std::string::npos);
  CHECK(mlajit_runtime_create_with_options(&o, nullptr) == MLAJIT_ERROR_INVALID_ARGUMENT);

  const std::string empty = ":::";
  o = options_for(empty);
  CHECK(mlajit_runtime_create_with_options(&o, &rt) == MLAJIT_ERROR_INVALID_ARGUMENT);

  mlajit_runtime_options off{};
  off.struct_size = sizeof off;
  off.disable_disk_cache = 1;
  REQUIRE(mlajit_runtime_create_with_options(&off, &rt) == MLAJIT_OK);
  CHECK(std::string(mlajit_runtime_cache_dir(rt)).empty());
  int hit = 0;
  CHECK(mlajit_runtime_precompile(rt, kSpec, "sm_90a", &hit) == MLAJIT_ERROR_CACHE);
  CHECK(std::string(mlajit_last_error()).find("disabled") != std::string::npos);
  mlajit_runtime_destroy(rt);
  CHECK(mlajit_runtime_precompile(nullptr, kSpec, "sm_90a", &hit) == MLAJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("c api: a runtime over a read-only layer and a writable one reports the writable one") {
  TempDir t("capi_rt_layers");
  const fs::path ro = t.path / "ro", rw = t.path / "rw";
  fs::create_directories(ro);
  ::chmod(ro.c_str(), 0555);
  const std::string path = ro.string() + ":" + rw.string();
  mlajit_runtime_options o = options_for(path);
  mlajit_runtime rt = nullptr;
  REQUIRE_MESSAGE(mlajit_runtime_create_with_options(&o, &rt) == MLAJIT_OK, mlajit_last_error());
  CHECK(std::string(mlajit_runtime_cache_dir(rt)) == rw.string());
  mlajit_runtime_destroy(rt);
  ::chmod(ro.c_str(), 0700);
}
