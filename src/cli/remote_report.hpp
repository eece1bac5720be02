#pragma once
// How the CLI shows the remote tier (mlajit info, build --json, cache push|pull).
#include <nlohmann/json.hpp>

namespace mlajit {
class RemoteCache;
}

namespace mlajit::cli {

// {"hits", "misses", "puts", "errors", "bad_signature", "corrupt", "skipped"} of this process.
nlohmann::json remote_counters_json(const RemoteCache& remote);

// mlajit cache push|pull CONFIG.json [--arch A] [--cache-dir D] [--jobs N] [--json]
int cache_push_pull(const std::string& sub, const std::vector<std::string>& argv);
// mlajit cache export|import (cli/cmd_cache_archive.cpp).
int cache_export_import(const std::string& sub, const std::vector<std::string>& argv);

}  // namespace mlajit::cli
