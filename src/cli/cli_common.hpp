#pragma once
// Pieces several subcommands share: which cache and which target arch a command uses.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "mlajit/cache.hpp"

namespace mlajit::cli {

// --cache-dir D (with MLAJIT_CACHE_MAX_BYTES as the cap) or the environment's default cache
// (MLAJIT_CACHE_PATH's layers, else MLAJIT_CACHE_DIR ...).
// Error(Cache) when the disk cache is disabled: the command needs one.
std::unique_ptr<DiskCache> open_cache(const Args& args);

// --arch, else the config's arch, else MLAJIT_ARCH, else the current GPU's; else a usage error.
std::string resolve_arch(const Args& args, const std::string& config_arch);
// resolve_arch, where --arch may list several targets (sm_90a,sm_100a; each validated, duplicates
// dropped, order kept).
std::vector<std::string> resolve_archs(const Args& args, const std::string& config_arch);

}  // namespace mlajit::cli
