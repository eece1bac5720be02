// mlajit cache ls|verify|prune|clear [--cache-dir D] [--max-bytes N] [--remove] [--json]
// mlajit cache push|pull CONFIG.json ... (cli/cmd_cache_remote.cpp)
// mlajit cache export|import ... (cli/cmd_cache_archive.cpp)
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "cli/remote_report.hpp"
#include "jit/lock_files.hpp"
#include "mlajit/config.hpp"

namespace mlajit::cli {

namespace {

nlohmann::json layers_json(const DiskCache& cache) {
  nlohmann::json layers = nlohmann::json::array();
  for (auto& l : cache.layers()) layers.push_back({{"dir", l.dir}, {"writable", l.writable}});
  return layers;
}

// The search path, one line per layer, when there is more than one (or the one is read-only).
void print_layers(const DiskCache& cache) {
  if (cache.layers().size() == 1 && cache.writable()) return;
  for (auto& l : cache.layers()) std::printf("layer %s (%s)\n", l.dir.c_str(), l.writable ? "writable" : "read-only");
}

int cache_ls(DiskCache& cache, bool json) {
  auto entries = cache.list();
  uint64_t total = 0;
  for (auto& e : entries) total += e.size;
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& e : entries)
      list.push_back({{"key", e.key}, {"name", e.name}, {"arch", e.arch}, {"bytes", e.size}, {"mtime", e.mtime},
                      {"path", e.path}, {"layer", e.layer}, {"read_only", e.read_only}});
    std::puts(nlohmann::json({{"cache_dir", cache.dir()}, {"layers", layers_json(cache)}, {"entries", list},
                              {"total_bytes", total}})
                  .dump(2)
                  .c_str());
    return 0;
  }
  print_layers(cache);
  std::printf("%-16s %-58s %-8s %10s  %s\n", "key", "name", "arch", "bytes", "last used");
  for (auto& e : entries) {
    char when[32];
    std::time_t t = e.mtime;
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    std::printf("%-16s %-58s %-8s %10llu  %s%s\n", e.key.substr(0, 16).c_str(), e.name.c_str(), e.arch.c_str(),
                static_cast<unsigned long long>(e.size), when, e.read_only ? "  (read-only layer)" : "");
  }
  if (cache.layers().size() == 1)
    std::printf("%zu entries, %llu bytes in %s\n", entries.size(), static_cast<unsigned long long>(total),
                cache.dir().c_str());
  else
    std::printf("%zu entries, %llu bytes in %zu layers; misses go to %s\n", entries.size(),
                static_cast<unsigned long long>(total), cache.layers().size(),
                cache.writable() ? cache.dir().c_str() : "none (every layer is read-only)");
  return 0;
}

int cache_verify(DiskCache& cache, bool json, bool remove) {
  // Listed (and with --remove removed) before the entries are checked.
  const std::vector<std::string> orphaned_locks = orphaned_lock_files(cache, remove);
  VerifyReport r = cache.verify(remove);
  // Bad entries of read-only layers stay (they are skipped at lookup, never loaded).
  size_t removed = 0;
  if (remove)
    for (auto& c : r.corrupt) removed += c.read_only ? 0 : 1;
  if (json) {
    nlohmann::json corrupt = nlohmann::json::array();
    for (auto& c : r.corrupt) corrupt.push_back({{"path", c.path}, {"reason", c.reason}, {"read_only", c.read_only}});
    std::puts(nlohmann::json({{"cache_dir", cache.dir()}, {"layers", layers_json(cache)}, {"entries", r.entries},
                              {"ok", r.ok}, {"corrupt", corrupt}, {"removed", removed},
                              {"orphaned_locks", orphaned_locks}, {"orphaned_locks_removed", remove}})
                  .dump(2)
                  .c_str());
  } else {
    print_layers(cache);
    for (auto& c : r.corrupt)
      std::printf("corrupt: %s: %s%s\n", c.path.c_str(), c.reason.c_str(),
                  !remove ? "" : c.read_only ? " (read-only layer: not removed)" : " (removed)");
    for (auto& l : orphaned_locks)
      std::printf("orphaned lock: %s: no entry and no holder (its writer died)%s\n", l.c_str(), remove ? " (removed)" : "");
    std::printf("%zu entries: %zu ok, %zu corrupt", r.entries, r.ok, r.corrupt.size());
    if (!orphaned_locks.empty())
      std::printf("; %zu orphaned lock file%s%s", orphaned_locks.size(), orphaned_locks.size() == 1 ? "" : "s",
                  remove ? " removed" : " (cache verify --remove removes them)");
    std::printf("\n");
  }
  // Corrupt entries are a runtime failure of the cache (exit 4) until they are removed.
  return r.corrupt.size() == removed ? 0 : 4;
}

}  // namespace

int cmd_cache(const Argv& argv) {
  if (!argv.empty() && (argv[0] == "push" || argv[0] == "pull")) return cache_push_pull(argv[0], argv);
  if (!argv.empty() && (argv[0] == "export" || argv[0] == "import")) return cache_export_import(argv[0], argv);
  Args args(argv, {"json", "remove"}, {"cache-dir", "max-bytes"});
  args.at_most(1);
  const std::string sub = args.need(0, "cache subcommand (ls|verify|prune|clear|push|pull|export|import)");
  if (sub != "ls" && sub != "verify" && sub != "prune" && sub != "clear")
    throw_invalid("cache subcommand", sub, "ls | verify | prune | clear | push | pull | export | import");
  std::optional<uint64_t> max_bytes;
  if (auto m = args.get("max-bytes")) max_bytes = config::parse_bytes(*m, "--max-bytes");
  auto cache = open_cache(args);
  const bool json = args.flag("json");

  if (sub == "ls") return cache_ls(*cache, json);
  if (sub == "verify") return cache_verify(*cache, json, args.flag("remove"));
  if (sub == "prune") {
    if (!max_bytes) max_bytes = config::cache_max_bytes();
    if (!max_bytes) throw_invalid("cache prune", "no size cap", "--max-bytes N or MLAJIT_CACHE_MAX_BYTES");
    PruneReport r = cache->prune(*max_bytes);
    if (json)
      std::puts(nlohmann::json({{"removed", r.removed}, {"removed_bytes", r.removed_bytes},
                                {"remaining_bytes", r.remaining_bytes}})
                    .dump(2)
                    .c_str());
    else
      std::printf("removed %zu entries (%llu bytes); %llu bytes remain\n", r.removed,
                  static_cast<unsigned long long>(r.removed_bytes), static_cast<unsigned long long>(r.remaining_bytes));
    return 0;
  }
  size_t n = cache->clear();
  if (json) std::puts(nlohmann::json({{"removed", n}}).dump(2).c_str());
  else std::printf("removed %zu entries from %s\n", n, cache->dir().c_str());
  return 0;
}

}  // namespace mlajit::cli
