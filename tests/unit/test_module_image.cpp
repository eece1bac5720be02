// Sources of several compile units (KernelSource::compile_units): the module image that packs the
// units' cubins (src/jit/module_image.hpp), its refusals of malformed bytes, and the indexer's
// three units compiled in parallel, each holding exactly its own entry.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "jit/module_image.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"

using namespace mlajit;

namespace {

std::string cache_error(std::string_view image) {
  try {
    unpack_module_image(image);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Cache);
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_SUITE("module image") {
  TEST_CASE("pack and unpack: units in order; a plain cubin is one unit; malformed packs are refused") {
    const std::vector<std::string> units = {std::string("\x7f" "ELF one", 8), "second unit", "3"};
    const std::string image = pack_module_image(units);
    const auto back = unpack_module_image(image);
    REQUIRE(back.size() == 3);
    for (size_t u = 0; u < 3; ++u) CHECK(back[u] == units[u]);
    const std::string elf = "\x7f" "ELF plain";
    REQUIRE(unpack_module_image(elf).size() == 1);
    CHECK(unpack_module_image(elf)[0] == elf);

    CHECK(has(cache_error(image.substr(0, 10)), "shorter than its 12-byte header"));
    CHECK(has(cache_error(image.substr(0, 20)), "sizes end at byte"));
    CHECK(has(cache_error(image.substr(0, image.size() - 1)), "runs past"));
    CHECK(has(cache_error(image + "x"), "1 bytes after its last unit"));
    std::string one = image;
    one[8] = 1;  // a count of 1
    CHECK(has(cache_error(one), "with 1 units: expected 2..16"));
    std::string zero = image;
    for (int i = 0; i < 8; ++i) zero[12 + i] = 0;  // unit 0 of 0 bytes
    CHECK(has(cache_error(zero), "unit 0 of 0 bytes"));
    CHECK_THROWS_AS(pack_module_image({"only one"}), Error);
    CHECK_THROWS_AS(pack_module_image({"a", ""}), Error);
  }

  TEST_CASE("the indexer's entries compile as three units in parallel, each with only its own kernel") {
    MlaIndexerParams p;
    const KernelSource src = generate(KernelSpec{p});
    CHECK(src.compile_units == 3);
    REQUIRE(src.entries.size() == 3);
    for (int u = 0; u < 3; ++u) CHECK(src.entries[static_cast<size_t>(u)].unit == u);
    CHECK(has(src.code, "#if !defined(MLAJIT_UNIT) || MLAJIT_UNIT == 2"));
    std::string why;
    if (!Compiler::available(&why)) {
      MESSAGE("NVRTC unavailable, the compile half skipped: " << why);
      return;
    }
    for (const char* arch : {"sm_90a", "sm_80"}) {
      const CompiledKernel k = Compiler::global().compile(src, arch);
      const auto units = unpack_module_image(k.cubin);
      REQUIRE(units.size() == 3);
      for (size_t u = 0; u < 3; ++u) {
        const std::string image(units[u]);
        CHECK(image.compare(0, 4, "\x7f" "ELF") == 0);
        for (size_t e = 0; e < 3; ++e)
          CHECK_MESSAGE(has(image, src.entries[e].symbol) == (e == u), arch, " unit ", u, " and entry ",
                        src.entries[e].symbol);
      }
    }
  }
}
