// mlajit cache push|pull CONFIG.json [--arch A] [--cache-dir D] [--jobs N] [--json]
//   push: build (or load from the disk cache) every kernel of the config and upload it, signed, to
//         the remote cache (MLAJIT_REMOTE_CACHE), together with the local tuning records; no GPU.
//   pull: download every kernel of the config from the remote into the disk cache, verifying
//         each, and merge the remote's tuning records into the local tuning.json; never compiles.
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "autotune/remote_tuning.hpp"
#include "cli/args.hpp"
#include "cli/cli_common.hpp"
#include "cli/progress.hpp"
#include "cli/remote_report.hpp"
#include "core/parallel.hpp"
#include "jit/build_source.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/kernel_set.hpp"

namespace mlajit::cli {

nlohmann::json remote_counters_json(const RemoteCache& remote) {
  RemoteStats s = remote.stats();
  return {{"hits", s.hits},     {"misses", s.misses},   {"puts", s.puts},          {"errors", s.errors},
          {"bad_signature", s.bad_signature}, {"corrupt", s.corrupt}, {"skipped", s.skipped}};
}

int cache_push_pull(const std::string& sub, const std::vector<std::string>& argv) {
  Args args(argv, {"json"}, {"arch", "cache-dir", "jobs"});
  args.at_most(2);
  const KernelSet set = load_kernel_set(args.need(1, "CONFIG.json"));
  const std::string arch = resolve_arch(args, set.arch);
  const unsigned jobs = static_cast<unsigned>(args.get_int("jobs", default_jobs(), 1, 1024));
  auto cache = open_cache(args);
  auto remote = RemoteCache::from_env();  // a bad configuration is an error here, not a warning
  if (!remote)
    throw_invalid("MLAJIT_REMOTE_CACHE", "unset", "a connection string such as redis://host:6379/0 for cache " + sub);
  std::string why;
  if (!remote->ping(&why)) throw_error(ErrorKind::Cache, "remote cache unreachable: {}", why);

  std::vector<const KernelSetEntry*> todo;
  std::set<std::string> seen;
  for (const auto& k : set.kernels)
    if (seen.insert(k.spec.canonical()).second) todo.push_back(&k);

  const bool push = sub == "push";
  struct Outcome {
    std::string name, status, key, error;
  };
  std::vector<Outcome> out(todo.size());
  const auto t0 = std::chrono::steady_clock::now();
  {
    Progress progress(push ? "pushing" : "pulling", todo.size());
    parallel_for(todo.size(), jobs, [&](size_t i) {
      Outcome& o = out[i];
      try {
        KernelSource src = generate(todo[i]->spec);
        o.name = src.name;
        if (push) {
          // The disk copy (compiled now if missing, without asking the remote) is what goes up:
          // exactly the bytes a node verifies.
          BuildResult r = build_source(src, arch, cache.get(), nullptr).result;
          o.key = r.key;
          auto e = cache->get(r.key);
          if (!e) throw_error(ErrorKind::Cache, "{} vanished from the disk cache before its upload", r.key);
          o.status = remote->put(r.key, e->meta, e->cubin) ? "uploaded" : "failed";
          if (o.status == "failed") o.error = "the remote cache did not take it (see the warning above)";
        } else {
          Compiler& compiler = Compiler::global();
          if (!Compiler::available(&o.error))
            throw_error(ErrorKind::Compile, "pull needs NVRTC's version to compute cache keys: {}", o.error);
          o.key = cache_key(src, arch, compiler.options(arch), compiler.nvrtc_key_version());
          if (cache->get(o.key)) {
            o.status = "present";
          } else if (auto e = remote->get(o.key)) {
            cache->put(o.key, e->meta, e->cubin);
            o.status = "pulled";
          } else {
            o.status = "missing";
          }
        }
      } catch (const Error& e) {
        if (o.name.empty()) o.name = todo[i]->spec.name();
        o.status = "failed";
        o.error = e.what();
      }
      progress.advance(o.name);
    });
  }
  // Tuning records go the command's way: push uploads the local ones, pull merges the remote's.
  autotune::TuningDb db(autotune::TuningDb::default_path(cache->dir()));
  autotune::TuningShare tuning = push ? autotune::push_tuning(db, *remote) : autotune::pull_tuning(db, *remote);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::map<std::string, size_t> counts;
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < out.size(); ++i) {
    ++counts[out[i].status];
    nlohmann::json r = {{"name", out[i].name}, {"origin", todo[i]->origin}, {"status", out[i].status}};
    if (!out[i].key.empty()) r["key"] = out[i].key;
    if (!out[i].error.empty()) r["error"] = out[i].error;
    results.push_back(r);
  }
  nlohmann::json tj = {{"local_records", tuning.local}};
  if (push) tj["uploaded"] = tuning.uploaded;
  else tj["downloaded"] = tuning.remote;
  const size_t bad = counts["failed"] + counts["missing"];
  if (args.flag("json")) {
    nlohmann::json j = {{"command", sub},          {"remote", remote->describe()}, {"signed", remote->signing()},
                        {"arch", arch},            {"cache_dir", cache->dir()},     {"kernels", todo.size()},
                        {"counts", counts},        {"tuning", tj},                  {"seconds", seconds},
                        {"counters", remote_counters_json(*remote)}, {"results", results}};
    std::puts(j.dump(2).c_str());
  } else {
    for (const auto& o : out)
      if (o.status == "failed" || o.status == "missing")
        std::fprintf(stderr, "%s: %s%s%s\n", o.name.c_str(), o.status.c_str(), o.error.empty() ? "" : ": ",
                     o.error.c_str());
    std::string summary;
    for (auto& [k, v] : counts) summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", v, k);
    std::printf("%zu kernels for %s: %s in %.2f s (%s, %s)\n", todo.size(), arch.c_str(), summary.c_str(), seconds,
                remote->describe().c_str(), remote->signing() ? "signed" : "unsigned");
    if (push) std::printf("tuning: %zu local records, %zu new to the remote\n", tuning.local, tuning.uploaded);
    else std::printf("tuning: %zu verified remote records, %zu records in %s\n", tuning.remote, tuning.merged, db.path().c_str());
  }
  // A kernel that could not be moved is a runtime failure of the cache (exit 4).
  return bad ? 4 : 0;
}

}  // namespace mlajit::cli
