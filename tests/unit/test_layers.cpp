// The include layers of src/ (documented at the top of src/core/op_definition.hpp):
//   include/mlajit  <  core  <  jit  <  autotune  <  ops  <  api, cli
// A file may include its own layer and the layers to its left, never one to its right. The CPU
// references (src/reference) see only the public headers; the families' bench drivers
// (src/ops/<family>/bench.*, tools outside libmlajit) and the CLI may use them.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

namespace fs = std::filesystem;

namespace {

// Rank of a top-level folder of src/ (or "mlajit", the public headers); -1 = not a layer.
int rank_of(const std::string& dir) {
  static const std::map<std::string, int> ranks = {{"mlajit", 0},   {"core", 1}, {"jit", 2}, {"autotune", 3},
                                                   {"ops", 4},      {"api", 5},  {"cli", 5}, {"reference", 1}};
  auto it = ranks.find(dir);
  return it == ranks.end() ? -1 : it->second;
}

}  // namespace

TEST_CASE("layers: no #include runs from a lower layer of src/ to a higher one") {
  const fs::path src = fs::path(MLAJIT_SOURCE_DIR) / "src";
  const std::regex include_re(R"re(^\s*#\s*include\s+"([a-z_]+)/)re");
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp" && ext != ".h") continue;
    const fs::path rel = fs::relative(e.path(), src);
    const std::string layer = rel.begin()->string();
    const int own = rank_of(layer);
    if (own < 0) continue;
    // The bench drivers are tools linked into the harness, not libmlajit: they may use the references.
    const bool bench_tool = layer == "ops" && rel.filename().string().rfind("bench.", 0) == 0;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const std::string target = m[1];
      const int to = rank_of(target);
      if (to < 0 || target == layer) continue;
      if (target == "reference" && (bench_tool || layer == "cli")) continue;
      CAPTURE(rel.string());
      CAPTURE(line);
      if (layer == "reference") CHECK(target == "mlajit");  // the references see only the public API
      else if (target == "reference") FAIL_CHECK("only the bench drivers and the CLI use src/reference");
      else CHECK(to <= own);
    }
  }
  CHECK(files > 50);
}
