// mlajit cache export CONFIG.json -o FILE [--arch A[,B...]] [--cache-dir D] [--jobs N] [--json]
//   builds (or finds in the disk cache) every kernel of the config for each arch and writes them
//   as one archive (include/mlajit/cache_archive.hpp), signed when MLAJIT_REMOTE_CACHE_KEY_FILE
//   names a key; no GPU.
// mlajit cache import FILE [--arch A[,B...]] [--cache-dir D] [--allow-unsigned] [--json]
//   verifies the whole archive first (nothing is written when any check fails), then writes each
//   entry into the writable cache layer atomically; entries for other archs than --arch are
//   listed and skipped.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "cli/remote_report.hpp"
#include "cli/progress.hpp"
#include "core/input.hpp"
#include "core/parallel.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache_archive.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/kernel_set.hpp"

namespace mlajit::cli {

namespace {

// The signing key (MLAJIT_REMOTE_CACHE_KEY_FILE, held to the fleet key's rules), or "".
std::string archive_key() {
  auto path = config::env("MLAJIT_REMOTE_CACHE_KEY_FILE");
  return path ? read_fleet_key(*path) : std::string();
}

// Writes `data` to `path` through a temp file and a rename: a reader sees the old file or the
// whole new one.
void write_file_atomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw_error(ErrorKind::Io, "cannot write {}", tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw_error(ErrorKind::Io, "cannot rename {} to {}", tmp, path);
  }
}

int cache_export(Argv argv) {
  for (auto& a : argv)
    if (a == "-o") a = "--output";  // the short spelling every archiver has
  Args args(argv, {"json"}, {"output", "arch", "cache-dir", "jobs"});
  args.at_most(2);
  const KernelSet set = load_kernel_set(args.need(1, "CONFIG.json"));
  const auto output = args.get("output");
  if (!output) throw_invalid("cache export", "no output file", "-o FILE");
  const std::vector<std::string> archs = resolve_archs(args, set.arch);
  const unsigned jobs = static_cast<unsigned>(args.get_int("jobs", default_jobs(), 1, 1024));
  const std::string key = archive_key();  // a bad key file fails before any compile
  auto cache = open_cache(args);

  std::vector<std::pair<const KernelSpec*, const std::string*>> todo;  // arch-major, each spec once
  for (const auto& arch : archs) {
    std::set<std::string> seen;
    for (const auto& k : set.kernels)
      if (seen.insert(k.spec.canonical()).second) todo.push_back({&k.spec, &arch});
  }
  std::vector<BuildResult> built(todo.size());
  std::vector<std::string> errors(todo.size());
  {
    Progress progress("exporting", todo.size());
    parallel_for(todo.size(), jobs, [&](size_t i) {
      try {
        built[i] = build_kernel(*todo[i].first, *todo[i].second, cache.get());
      } catch (const Error& e) {
        errors[i] = fmt::format("{} for {}: {}", todo[i].first->name(), *todo[i].second, e.what());
      }
      progress.advance(todo[i].first->name());
    });
  }
  for (auto& e : errors)
    if (!e.empty()) throw_error(ErrorKind::Compile, "cache export: nothing written: {}", e);

  std::vector<ArchiveEntry> entries;
  size_t compiled = 0;
  for (auto& b : built) {
    auto e = cache->get(b.key);
    if (!e)
      throw_error(ErrorKind::Cache, "cache export: {} for {} is not in the disk cache after its build (is every cache "
                                    "layer read-only?); nothing written", b.name, b.arch);
    compiled += b.cache_hit ? 0 : 1;
    entries.push_back({b.key, std::move(*e)});
  }
  const std::string archive = pack_cache_archive(entries, key);
  write_file_atomically(*output, archive);

  if (args.flag("json")) {
    nlohmann::json list = nlohmann::json::array();
    for (auto& e : entries) list.push_back({{"key", e.key}, {"name", e.entry.meta.name}, {"arch", e.entry.meta.arch}});
    std::puts(nlohmann::json({{"file", *output}, {"entries", list}, {"compiled", compiled}, {"bytes", archive.size()},
                              {"signed", !key.empty()}})
                  .dump(2)
                  .c_str());
  } else {
    std::printf("%zu kernels (%zu compiled now) -> %s, %zu bytes, %s\n", entries.size(), compiled, output->c_str(),
                archive.size(), key.empty() ? "unsigned (no MLAJIT_REMOTE_CACHE_KEY_FILE)" : "signed");
  }
  return 0;
}

int cache_import(const Argv& argv) {
  Args args(argv, {"json", "allow-unsigned"}, {"arch", "cache-dir"});
  args.at_most(2);
  const std::string file = args.need(1, "FILE");
  std::set<std::string> wanted;  // empty: every arch
  if (args.get("arch"))
    for (auto& a : resolve_archs(args, "")) wanted.insert(a);
  const std::string key = archive_key();
  const UnpackedArchive archive = unpack_cache_archive(read_input_file(file, "cache archive", kMaxArchiveFileBytes), key, args.flag("allow-unsigned"));
  auto cache = open_cache(args);
  if (!cache->writable())
    throw_error(ErrorKind::Cache, "cache import: every cache layer is read-only ({}); nothing imported", cache->dir());

  // Everything is verified; now each entry is written (temp file, fsync, rename).
  nlohmann::json imported = nlohmann::json::array(), present = nlohmann::json::array(),
                 other_arch = nlohmann::json::array();
  for (const auto& e : archive.entries) {
    nlohmann::json item = {{"key", e.key}, {"name", e.entry.meta.name}, {"arch", e.entry.meta.arch}};
    if (!wanted.empty() && !wanted.count(e.entry.meta.arch)) {
      other_arch.push_back(item);
      continue;
    }
    if (cache->get(e.key)) {
      present.push_back(item);
      continue;
    }
    cache->put(e.key, e.entry.meta, e.entry.cubin);
    imported.push_back(item);
  }
  const char* trust = archive.signature_verified ? "signature verified"
                      : archive.is_signed        ? "signed, signature NOT checked (no MLAJIT_REMOTE_CACHE_KEY_FILE)"
                                                 : "unsigned";
  if (args.flag("json")) {
    std::puts(nlohmann::json({{"file", file},
                              {"cache_dir", cache->dir()},
                              {"imported", imported},
                              {"already_present", present},
                              {"other_arch", other_arch},
                              {"signed", archive.is_signed},
                              {"signature_verified", archive.signature_verified}})
                  .dump(2)
                  .c_str());
  } else {
    for (auto& o : other_arch)
      std::printf("skipped (built for %s): %s\n", o["arch"].get<std::string>().c_str(),
                  o["name"].get<std::string>().c_str());
    std::printf("%zu imported, %zu already present, %zu for other archs -> %s (%s)\n", imported.size(), present.size(),
                other_arch.size(), cache->dir().c_str(), trust);
  }
  return 0;
}

}  // namespace

int cache_export_import(const std::string& sub, const Argv& argv) {
  return sub == "export" ? cache_export(argv) : cache_import(argv);
}

}  // namespace mlajit::cli
