// The CLI as a new user explores it: --help on every command exits 0 and describes it, --version,
// `build --arch A,B` in one run, `check --require-gpu` failing without a GPU.
#include "shell_command.hpp"
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mlajit/driver.hpp"
#include "mlajit/version.hpp"

namespace fs = std::filesystem;

namespace {

using Out = mlajit::testing::ShellOutput;

Out run(const std::string& args) { return mlajit::testing::run_shell(MLAJIT_CLI_PATH " " + args + " 2>/dev/null"); }

}  // namespace

TEST_CASE("cli: --help on every command exits 0 with its usage; --version") {
  for (const char* cmd : {"build", "gen", "cache", "check", "info", "bench", "tune"}) {
    CAPTURE(cmd);
    for (const char* flag : {"--help", "-h"}) {
      Out o = run(std::string(cmd) + " " + flag);
      CHECK(o.code == 0);
      CHECK(o.text.find(cmd) != std::string::npos);
      CHECK(o.text.find("usage") != std::string::npos);
    }
  }
  for (const char* args : {"--version", "version", "build --version", "cache ls --version", "tune x.json --version"}) {
    CAPTURE(args);
    Out v = run(args);
    CHECK(v.code == 0);
    CHECK(v.text == std::string(MLAJIT_VERSION_STRING) + "\n");
  }
}

TEST_CASE("cli: build --arch sm_90a,sm_100a compiles every kernel for both targets in one run") {
  mlajit::testing::TempDir t("cli_archs");
  const std::string cfg = (t.path / "k.json").string();
  std::ofstream(cfg) << R"({"kernels": [{"op": "sparse_index_remap", "params": {"page_size": 64}}]})";
  const std::string cache = (t.path / "cache").string();
  Out o = run("build " + cfg + " --arch sm_90a,sm_100a --json --cache-dir " + cache);
  REQUIRE(o.code == 0);
  auto j = nlohmann::json::parse(o.text);
  CHECK(j["arch"] == "sm_90a,sm_100a");
  CHECK(j["compiled"] == 2);
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][0]["arch"] == "sm_90a");
  CHECK(j["results"][1]["arch"] == "sm_100a");
  CHECK(j["results"][0]["key"] != j["results"][1]["key"]);
  CHECK(run("build " + cfg + " --arch sm_90a,sm_91 --cache-dir " + cache).code == 2);  // each arch validated
}

TEST_CASE("cli: check --require-gpu fails without a GPU instead of passing") {
  if (mlajit::driver::available()) {
    MESSAGE("a GPU is present: the no-GPU exit code is not observable here");
    return;
  }
  mlajit::testing::TempDir t("cli_check");
  const std::string cfg = (t.path / "k.json").string();
  std::ofstream(cfg) << R"({"arch": "sm_90a", "kernels": [{"op": "sparse_index_remap", "params": {"page_size": 64}}]})";
  const std::string cache = " --cache-dir " + (t.path / "cache").string();
  CHECK(run("check " + cfg + cache).code == 0);
  CHECK(run("check " + cfg + " --require-gpu" + cache).code == 4);
  Out j = run("check " + cfg + " --require-gpu --json" + cache);
  CHECK(j.code == 4);
  CHECK(nlohmann::json::parse(j.text)["skipped"] == true);  // the report still says why
}
