// The environment variables: config::variables() names every MLAJIT_* variable the library's
// sources read, and the README's table and `mlajit --help` list each of them.
#include "shell_command.hpp"
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "mlajit/config.hpp"

namespace fs = std::filesystem;

namespace {

using mlajit::testing::read_file;

}  // namespace

TEST_CASE("environment: config::variables() holds every MLAJIT_* name the sources read, once") {
  std::set<std::string> listed;
  for (const char* name : mlajit::config::variables()) {
    CAPTURE(name);
    CHECK(listed.insert(name).second);
  }
  // Every string literal "MLAJIT_..." in the library's and the CLI's sources (the names they pass to
  // config::env or getenv; the C API's and Python's own names are not read by the library).
  const std::regex literal_re("\"(MLAJIT_[A-Z0-9_]+)\"");
  int files = 0, found = 0;
  for (const char* dir : {"src", "include"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(MLAJIT_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h") continue;
      ++files;
      const std::string text = read_file(e.path());
      for (std::sregex_iterator it(text.begin(), text.end(), literal_re), end; it != end; ++it) {
        ++found;
        CAPTURE(e.path().string());
        CHECK(listed.count((*it)[1].str()) == 1);
      }
    }
  }
  CHECK(files > 50);
  CHECK(found >= static_cast<int>(listed.size()));  // (the list itself is among them)
}

TEST_CASE("environment: the README's table and `mlajit --help` list every variable") {
  const std::string readme = read_file(fs::path(MLAJIT_SOURCE_DIR) / "README.md");
  const size_t begin = readme.find("## Environment variables");
  REQUIRE(begin != std::string::npos);
  const std::string table = readme.substr(begin, readme.find("\n## ", begin + 1) - begin);
  const auto help = mlajit::testing::run_shell(MLAJIT_CLI_PATH " --help 2>/dev/null");
  REQUIRE(help.code == 0);
  for (const char* name : mlajit::config::variables()) {
    CAPTURE(name);
    CHECK(table.find(std::string("`") + name + "`") != std::string::npos);
    CHECK(std::regex_search(help.text, std::regex(std::string("[ :]") + name + "[ \n]")));
  }
}
