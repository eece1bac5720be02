#pragma once
// The environment variables mlajit reads (docs/design.md, "Environment variables"), parsed in one
// place so that every consumer agrees on defaults and on what a malformed value means.
// Values are read when asked for (not cached): the runtime reads them once at construction.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlajit::config {

// Every environment variable the library reads, in the order `mlajit --help` and `mlajit info` list
// them (the README's "Environment variables" table says what each means).
const std::vector<const char*>& variables();

// The variable's value if set and non-empty.
std::optional<std::string> env(const char* name);
// A boolean switch: 1/true/yes/on -> true, 0/false/no/off/unset/empty -> false; anything else
// throws Error(InvalidArgument) naming the variable.
bool env_flag(const char* name);

// MLAJIT_CACHE_DIR, else $XDG_CACHE_HOME/mlajit, else $HOME/.cache/mlajit.
std::string cache_dir();
// The cache's search path, in lookup order: MLAJIT_CACHE_PATH split at ':' (empty items
// skipped), else { cache_dir() }. Setting both MLAJIT_CACHE_PATH and MLAJIT_CACHE_DIR is an
// Error(InvalidArgument): which one wins would be a guess.
std::vector<std::string> cache_path();
// The packaged read-only cache layer (cubins of examples/deepseek_v32.json built when the package
// was built), searched after the layers above: MLAJIT_PREBUILT_CACHE=off (or 0) disables it, a path
// names it; unset, it is `prebuilt-cache` beside the library (the Python wheel) or
// `../share/mlajit/prebuilt-cache` from it (cmake --install: lib/ or bin/), whichever exists.
// nullopt: none.
std::optional<std::string> prebuilt_cache_dir();
// MLAJIT_DISABLE_DISK_CACHE.
bool disk_cache_disabled();
// MLAJIT_CACHE_MAX_BYTES: a byte count with optional K/M/G suffix (powers of 1024); unset = no cap.
std::optional<uint64_t> cache_max_bytes();
// Parses "123", "64K", "512M", "2G"; throws Error(InvalidArgument) naming `what`.
uint64_t parse_bytes(const std::string& text, const std::string& what);
// MLAJIT_DUMP_DIR: where every compile writes <name>.cu/.ptx/.cubin/.log.
std::optional<std::string> dump_dir();
// MLAJIT_ARCH: target override (e.g. "sm_90a"), for compiling without a GPU.
std::optional<std::string> arch_override();
// MLAJIT_TEMPLATE_DIR: read templates from this folder instead of the embedded copies.
std::optional<std::string> template_dir();
// MLAJIT_NVRTC_EXTRA_OPTIONS: NVRTC options appended to the fixed set (Compiler::options), split at
// whitespace (no quoting), e.g. "--ptxas-options=-O1" to A/B a compiler option with one binary.
// Empty when unset. Each item must start with '-'; options that pick the target
// (-arch / --gpu-architecture) are rejected: the target is the build's `arch`. Throws
// Error(InvalidArgument) naming the variable otherwise.
std::vector<std::string> nvrtc_extra_options();

}  // namespace mlajit::config
