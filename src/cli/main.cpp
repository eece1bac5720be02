// mlajit command-line tool: build, gen, cache, info, bench, tune, check.
// Exit codes: 0 success, 2 bad usage or config, 3 compile failure, 4 driver or runtime failure.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "mlajit/version.hpp"

namespace {

constexpr const char* kUsage = R"(mlajit )" MLAJIT_VERSION_STRING R"( - run-time specialized sparse-attention kernels (NVRTC JIT)

usage:
  mlajit build CONFIG.json [--arch A[,B...]] [--cache-dir D] [--jobs N] [--json]
                                   compile every kernel of a config into the disk cache (no GPU needed)
  mlajit gen CONFIG.json [--kernel NAME] [--expand]
                                   print the generated source (all kernels, or the one named)
  mlajit cache ls|verify|prune|clear [--cache-dir D] [--max-bytes N] [--json]
  mlajit cache push|pull CONFIG.json [--arch A] [--cache-dir D] [--jobs N] [--json]
                                   upload a config's kernels and the tuning records to the remote cache
                                   (MLAJIT_REMOTE_CACHE), or download and verify them into the disk cache
  mlajit cache export CONFIG.json -o FILE [--arch A[,B...]] | import FILE [--arch A[,B...]] [--allow-unsigned]
                                   a config's kernels as one verified (signed with a key) archive, and back
  mlajit check CONFIG.json [--cache-dir D] [--json] [--require-gpu]
                                   run every op of a config once on random data against the CPU reference (GPU)
  mlajit bench OP [--shape ...] [--json]
                                   time an op on the GPU (mlajit bench --help lists ops and shapes)
  mlajit tune CONFIG.json [--jobs N] [--reps R] [--json] [--csv F]
                                   autotune sweeps on the GPU, remember the best per device and shape
  mlajit info [--json]             versions, devices, cache dir, remote cache state
  mlajit --version                 the version; `mlajit CMD --help` describes each command

exit codes: 0 ok, 2 bad usage or config, 3 compile failure, 4 driver or runtime failure
)";

// kUsage, then the environment variables the library reads (config::variables), wrapped.
std::string usage() {
  std::string out = kUsage, line = "environment:";
  for (const char* name : mlajit::config::variables()) {
    if (line.size() + 1 + std::strlen(name) > 110) {
      out += line + "\n";
      line = "            ";
    }
    line += " ";
    line += name;
  }
  return out + line + "\n";
}

// `mlajit CMD --help` for the commands without their own help text (bench and tune have theirs).
const char* command_help(const std::string& cmd) {
  if (cmd == "build")
    return "usage: mlajit build CONFIG.json [--arch A[,B...]] [--cache-dir D] [--jobs N] [--json]\n"
           "  Compiles every kernel of CONFIG.json into the disk cache with NVRTC; no GPU needed.\n"
           "  --arch       target(s), e.g. sm_90a or sm_90a,sm_100a (default: the config's \"arch\")\n"
           "  --cache-dir  cache directory (default: MLAJIT_CACHE_PATH's writable layer, else MLAJIT_CACHE_DIR,\n"
           "               else ~/.cache/mlajit)\n"
           "  --jobs       parallel compiles (default: hardware threads)\n"
           "  --json       one JSON report on stdout\n";
  if (cmd == "gen")
    return "usage: mlajit gen CONFIG.json [--kernel NAME] [--expand]\n"
           "  Prints the generated CUDA source of every kernel of CONFIG.json (or of the one named).\n"
           "  --expand     inline the #included templates\n";
  if (cmd == "cache")
    return "usage: mlajit cache ls|verify|prune|clear [--cache-dir D] [--max-bytes N] [--remove] [--json]\n"
           "       mlajit cache push|pull CONFIG.json [--arch A] [--cache-dir D] [--jobs N] [--json]\n"
           "  ls      list the cached kernels        verify  check every entry (--remove drops bad ones)\n"
           "  prune   evict least recently used entries down to --max-bytes (or MLAJIT_CACHE_MAX_BYTES)\n"
           "  clear   remove every entry\n"
           "  push    upload a config's kernels and tuning records to the remote cache (MLAJIT_REMOTE_CACHE)\n"
           "  pull    download and verify them into the disk cache\n"
           "       mlajit cache export CONFIG.json -o FILE [--arch A[,B...]] [--cache-dir D] [--jobs N] [--json]\n"
           "       mlajit cache import FILE [--arch A[,B...]] [--cache-dir D] [--allow-unsigned] [--json]\n"
           "  export  build (or take from the cache) a config's kernels for each arch into one archive with a\n"
           "          manifest and per-entry SHA-256, signed when MLAJIT_REMOTE_CACHE_KEY_FILE names a key\n"
           "  import  verify the whole archive (signature too, with a key), then write its entries atomically;\n"
           "          nothing is written when any check fails; --arch skips (and lists) other archs' entries\n"
           "  With MLAJIT_CACHE_PATH, ls and verify show every layer; misses, prune, clear and import use\n"
           "  the writable one.\n";
  if (cmd == "check")
    return "usage: mlajit check CONFIG.json [--cache-dir D] [--seed S] [--json] [--require-gpu]\n"
           "  Runs every op of CONFIG.json once on random data and compares with the f64 CPU reference.\n"
           "  Without a GPU it only builds and exits 0, or 4 with --require-gpu.\n";
  if (cmd == "info")
    return "usage: mlajit info [--json]\n"
           "  Versions, NVRTC, cache directory, MLAJIT_* environment and devices.\n";
  return nullptr;
}

bool wants_version(const mlajit::cli::Argv& rest) {
  for (size_t i = 0; i < rest.size(); ++i)
    if (rest[i] == "--version" && !(i > 0 && mlajit::cli::is_value_option(rest[i - 1]))) return true;
  return false;
}

// --help / -h anywhere, except as the value of an option (`--arch --help`: the command then
// refuses "--help" as an arch, naming the option).
bool wants_help(const mlajit::cli::Argv& rest) {
  for (size_t i = 0; i < rest.size(); ++i)
    if ((rest[i] == "--help" || rest[i] == "-h") && !(i > 0 && mlajit::cli::is_value_option(rest[i - 1])))
      return true;
  return false;
}

int exit_code(mlajit::ErrorKind k) {
  switch (k) {
    case mlajit::ErrorKind::InvalidArgument: return 2;
    case mlajit::ErrorKind::Compile: return 3;
    default: return 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mlajit::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const Argv rest(argv + 2, argv + argc);
  // `mlajit --version`, `mlajit version`, and `--version` after any command (as most tools
  // accept it): the version, nothing else run.
  if (cmd == "--version" || cmd == "version" || wants_version(rest)) {
    std::puts(MLAJIT_VERSION_STRING);
    return 0;
  }
  if (const char* help = command_help(cmd); help && wants_help(rest)) {
    std::fputs(help, stdout);
    return 0;
  }
  if (cmd == "bench" && wants_help(rest)) return cmd_bench({"--help"});  // -h as well as --help
  try {
    if (cmd == "build") return cmd_build(rest);
    if (cmd == "gen") return cmd_gen(rest);
    if (cmd == "cache") return cmd_cache(rest);
    if (cmd == "info") return cmd_info(rest);
    if (cmd == "bench") return cmd_bench(rest);
    if (cmd == "tune") return cmd_tune(rest);
    if (cmd == "check") return cmd_check(rest);
    std::fprintf(stderr, "mlajit: unknown command \"%s\", expected build|gen|cache|check|bench|tune|info\n%s",
                 cmd.c_str(), usage().c_str());
    return 2;
  } catch (const mlajit::Error& e) {
    std::fprintf(stderr, "mlajit %s: %s: %s\n", cmd.c_str(), mlajit::error_kind_name(e.kind()), e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlajit %s: internal error: %s\n", cmd.c_str(), e.what());
    return 4;
  }
}
