// Compiler: NVRTC to CUBIN for each supported target, error reporting, dumps, arch checks, and the
// precompiled-header measurement.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <unistd.h>

#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"
#include "jit/build_source.hpp"
#include "temp_dir.hpp"
#include "unit/handwritten_kernel.hpp"

using namespace mlajit;
namespace fs = std::filesystem;

namespace {

bool nvrtc_or_skip() {
  std::string why;
  if (Compiler::available(&why)) return true;
  MESSAGE("NVRTC unavailable, compiler test skipped: " << why);
  return false;
}

bool is_elf(const std::string& image) { return image.size() > 64 && image.compare(0, 4, "\x7f" "ELF") == 0; }

using mlajit::testing::read_file;

struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("arch names are validated and derived from compute capability") {
  for (const char* a : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120"}) CHECK_NOTHROW(validate_arch(a));
  for (const char* a : {"", "sm_75", "sm90a", "sm_90b", "compute_90", "SM_90"}) {
    CAPTURE(a);
    try {
      validate_arch(a);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::InvalidArgument);
      CHECK(std::string(e.what()).find("sm_90a") != std::string::npos);  // lists the allowed set
    }
  }
  CHECK(arch_for_compute_capability(9, 0) == "sm_90a");
  CHECK(arch_for_compute_capability(10, 0) == "sm_100a");
  CHECK(arch_for_compute_capability(8, 9) == "sm_89");
  CHECK(arch_for_compute_capability(8, 0) == "sm_80");
  CHECK(arch_satisfies("sm_90a", "sm_80"));
  CHECK(arch_satisfies("sm_89", "sm_80"));
  CHECK_FALSE(arch_satisfies("sm_80", "sm_89"));
  CHECK(arch_satisfies("sm_90a", "sm_90a"));
  CHECK_FALSE(arch_satisfies("sm_100a", "sm_90a"));  // wgmma does not exist on sm_100
  CHECK(arch_satisfies("sm_80", ""));
}

TEST_CASE("options: fixed set, never fast math") {
  auto o = Compiler::global().options("sm_90a");
  CHECK(std::find(o.begin(), o.end(), "--gpu-architecture=sm_90a") != o.end());
  CHECK(std::find(o.begin(), o.end(), "-std=c++17") != o.end());
  CHECK(std::find(o.begin(), o.end(), "-default-device") != o.end());
  CHECK(std::find(o.begin(), o.end(), "-DNDEBUG") != o.end());
  for (auto& x : o) CHECK(x.find("fast") == std::string::npos);
  CHECK_THROWS_AS(Compiler::global().options("sm_75"), Error);
}

TEST_CASE("a kernel's own NVRTC options: before MLAJIT_NVRTC_EXTRA_OPTIONS, in the cache key, passed to NVRTC") {
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(4));
  REQUIRE(src.nvrtc_options.empty());
  const std::string plain_key = cache_key(src, "sm_90a", {"-std=c++17"}, "13.0");
  const std::string plain_base = cache_base_key(src, "sm_90a", {"-std=c++17"});
  src.nvrtc_options = {"--ptxas-options=--register-usage-level=10"};
  const std::string key = cache_key(src, "sm_90a", {"-std=c++17"}, "13.0");
  CHECK(key != plain_key);  // cubins built with and without a kernel's options never mix
  CHECK(cache_base_key(src, "sm_90a", {"-std=c++17"}) != plain_base);
  auto other = src;
  other.nvrtc_options = {"--ptxas-options=--register-usage-level=8"};
  CHECK(cache_key(other, "sm_90a", {"-std=c++17"}, "13.0") != key);
  {
    ScopedEnv env("MLAJIT_NVRTC_EXTRA_OPTIONS", "-DMJ_TEST_EXTRA=1");
    const auto base = Compiler::global().options("sm_90a");
    const auto o = Compiler::global().options("sm_90a", src);
    REQUIRE(o.size() == base.size() + 1);
    CHECK(std::equal(base.begin(), base.end() - 1, o.begin()));  // the fixed options first
    CHECK(o[o.size() - 2] == "--ptxas-options=--register-usage-level=10");
    CHECK(o.back() == "-DMJ_TEST_EXTRA=1");  // the knob last: it can still override
    if (nvrtc_or_skip()) CHECK_FALSE(Compiler::global().compile(src, "sm_90a").cubin.empty());
  }
  if (nvrtc_or_skip()) {  // really handed to NVRTC: an option it rejects fails the compile, named
    src.nvrtc_options = {"--no-such-kernel-option"};
    std::string e;
    try {
      Compiler::global().compile(src, "sm_90a");
    } catch (const Error& x) {
      e = x.what();
    }
    CHECK_MESSAGE(e.find("--no-such-kernel-option") != std::string::npos, e);
  }
}

TEST_CASE("MLAJIT_NVRTC_EXTRA_OPTIONS: appended last, part of the cache key, validated") {
  const auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(4));
  std::vector<std::string> base;
  std::string base_key;
  {
    ScopedEnv none("MLAJIT_NVRTC_EXTRA_OPTIONS", "");  // empty = unset
    base = Compiler::global().options("sm_90a");
    base_key = cache_key(src, "sm_90a", base, "13.0");
  }
  {
    ScopedEnv env("MLAJIT_NVRTC_EXTRA_OPTIONS", "  --ptxas-options=-O1 \t -DMJ_TEST_EXTRA=1 ");
    auto o = Compiler::global().options("sm_90a");
    REQUIRE(o.size() == base.size() + 2);
    CHECK(std::equal(base.begin(), base.end(), o.begin()));
    CHECK(o[base.size()] == "--ptxas-options=-O1");
    CHECK(o[base.size() + 1] == "-DMJ_TEST_EXTRA=1");
    CHECK(cache_key(src, "sm_90a", o, "13.0") != base_key);  // cubins with and without never mix
    if (nvrtc_or_skip()) CHECK_FALSE(Compiler::global().compile(src, "sm_90a").cubin.empty());
  }
  for (const char* bad : {"O1", "-O1 ptxas", "--gpu-architecture=sm_80", "-arch=sm_80"}) {
    ScopedEnv env("MLAJIT_NVRTC_EXTRA_OPTIONS", bad);
    CHECK_THROWS_AS(Compiler::global().options("sm_90a"), Error);
  }
  if (nvrtc_or_skip()) {  // an option NVRTC rejects fails the compile with NVRTC's message
    ScopedEnv env("MLAJIT_NVRTC_EXTRA_OPTIONS", "--no-such-nvrtc-option");
    CHECK_THROWS_AS(Compiler::global().compile(src, "sm_90a"), Error);
  }
}

TEST_CASE("compiles a hand-written kernel to CUBIN for sm_80, sm_90a and sm_100a") {
  if (!nvrtc_or_skip()) return;
  MESSAGE("NVRTC " << Compiler::global().nvrtc_version());
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(4));
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    CAPTURE(arch);
    auto before = Compiler::compile_count();
    CompiledKernel k = Compiler::global().compile(src, arch);
    CHECK(is_elf(k.cubin));
    CHECK(k.stats.cubin_bytes == k.cubin.size());
    CHECK(k.stats.seconds > 0);
    CHECK(k.cubin.find("mj_test_axpy") != std::string::npos);  // the extern "C" symbol is in the image
    CHECK(Compiler::compile_count() == before + 1);
    MESSAGE(std::string(arch) << ": " << k.cubin.size() << " bytes in " << k.stats.seconds * 1e3 << " ms");
  }
}

TEST_CASE("a syntax error is Error(Compile) with the NVRTC log and the written source path") {
  if (!nvrtc_or_skip()) return;
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(8), "int broken = ;\n");
  src.name = "test_broken_" + std::to_string(::getpid());
  try {
    Compiler::global().compile(src, "sm_80");
    FAIL("compiled a syntax error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(e.kind() == ErrorKind::Compile);
    CHECK(msg.find("expected an expression") != std::string::npos);  // NVRTC's own diagnostic
    CHECK(msg.find(src.name) != std::string::npos);
    auto at = msg.find("source: ");
    REQUIRE(at != std::string::npos);
    std::string path = msg.substr(at + 8, msg.find('\n', at) - at - 8);
    CAPTURE(path);
    REQUIRE(fs::exists(path));
    CHECK(read_file(path).find("int broken = ;") != std::string::npos);
    CHECK(read_file(path).find("#include \"") == std::string::npos);  // expanded, self-contained
    fs::remove(path);
    fs::remove(fs::path(path).replace_extension(".log"));
  }
}

TEST_CASE("target below min_arch is rejected before compiling") {
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(4));
  src.min_arch = "sm_90a";
  CHECK_THROWS_AS(Compiler::global().compile(src, "sm_80"), Error);
  CHECK_THROWS_AS(Compiler::global().compile(src, "sm_100a"), Error);
}

TEST_CASE("MLAJIT_DUMP_DIR receives .cu, .ptx, .cubin and .log") {
  if (!nvrtc_or_skip()) return;
  fs::path dir = fs::temp_directory_path() / ("mlajit_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ScopedEnv env("MLAJIT_DUMP_DIR", dir.string());
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(16));
  CompiledKernel k = Compiler::global().compile(src, "sm_90a");
  const std::string key = cache_key(src, "sm_90a", Compiler::global().options("sm_90a"),
                                    Compiler::global().nvrtc_key_version());
  const std::string base = dump_base_name(src, "sm_90a", key);
  CHECK(base == src.name + "-" + key.substr(0, kDumpKeyChars) + "-sm_90a");
  CHECK(read_file(dir / (base + ".cubin")) == k.cubin);
  std::string ptx = read_file(dir / (base + ".ptx"));
  CHECK(ptx.find(".entry mj_test_axpy") != std::string::npos);
  CHECK(ptx.find("div.rn.f32") != std::string::npos);  // IEEE division, no fast math
  CHECK(read_file(dir / (base + ".cu")).find("mj_test_axpy") != std::string::npos);
  CHECK(read_file(dir / (base + ".log")).find("--gpu-architecture=sm_90a") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("MLAJIT_DUMP_DIR: variants and archs never overwrite each other, a rebuild overwrites itself") {
  if (!nvrtc_or_skip()) return;
  fs::path dir = fs::temp_directory_path() / ("mlajit_dump_variants_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ScopedEnv env("MLAJIT_DUMP_DIR", dir.string());
  // Two variants under one kernel name: the name alone would make them share files.
  auto a = mlajit_test::axpy_source(mlajit_test::axpy_spec(16));
  auto b = mlajit_test::axpy_source(mlajit_test::axpy_spec(32));
  b.name = a.name;
  auto files = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  std::map<std::string, std::string> cubin_of;  // dump base name -> the cubin that build produced
  for (const auto* src : {&a, &b})
    for (const char* arch : {"sm_80", "sm_90a"}) {
      const CompiledKernel k = Compiler::global().compile(*src, arch);
      const std::string key = cache_key(*src, arch, Compiler::global().options(arch), Compiler::global().nvrtc_key_version());
      cubin_of[dump_base_name(*src, arch, key)] = k.cubin;
    }
  REQUIRE(cubin_of.size() == 4);  // four distinct base names
  const auto after_four = files();
  CHECK(after_four.size() == 4 * 4);  // .cu .ptx .cubin .log each
  for (const auto& [base, cubin] : cubin_of) {
    CAPTURE(base);
    CHECK(read_file(dir / (base + ".cubin")) == cubin);  // nobody overwrote it
    for (const char* ext : {".cu", ".ptx", ".log"}) CHECK(fs::exists(dir / (base + ext)));
  }
  Compiler::global().compile(a, "sm_90a");  // the same variant for the same target again
  CHECK(files() == after_four);
  fs::remove_all(dir);
}

TEST_CASE("pch timing (measurement, printed)") {
  // Measures whether NVRTC's automatic precompiled headers (--pch) cut compile time of a kernel
  // that includes our templates. Compiler defaults to PCH off; this prints the numbers behind that.
  if (!nvrtc_or_skip()) return;
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(32));
  Compiler c;
  auto median_ms = [&](bool pch) {
    c.set_use_pch(pch);
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) t.push_back(c.compile(src, "sm_90a").stats.seconds * 1e3);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  double off = median_ms(false), on = median_ms(true);
  MESSAGE("NVRTC compile median of 5, sm_90a: without --pch " << off << " ms, with --pch " << on << " ms");
  CHECK(off > 0);
  CHECK(on > 0);
}

TEST_CASE("cache keys hold the NVRTC release, not the file it was loaded from") {
  if (!nvrtc_or_skip()) return;
  const std::string full = Compiler::global().nvrtc_version(), release = Compiler::global().nvrtc_key_version();
  CHECK(full.rfind(release + " (", 0) == 0);  // "13.0 (libnvrtc.so.13)" starts with "13.0 ("
  CHECK(release.find(' ') == std::string::npos);
  CHECK(release.find("libnvrtc") == std::string::npos);
  // A build's key is the one made from the release alone, whatever file name loaded NVRTC.
  auto src = mlajit_test::axpy_source(mlajit_test::axpy_spec(16));
  mlajit::testing::TempDir t("nvrtc_key");
  DiskCache disk((t.path / "cache").string());
  const BuiltKernel b = build_source(src, "sm_90a", &disk);
  CHECK(b.result.key == cache_key(src, "sm_90a", Compiler::global().options("sm_90a"), release));
  CHECK(b.result.key != cache_key(src, "sm_90a", Compiler::global().options("sm_90a"), full));
}
