// mlajit build CONFIG.json [--arch A[,B...]] [--cache-dir D] [--jobs N] [--json]
// Compiles every kernel of a config into the disk cache, in parallel, without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/remote_report.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/build.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/kernel_set.hpp"
#include "core/parallel.hpp"

namespace mlajit::cli {

int cmd_build(const Argv& argv) {
  Args args(argv, {"json"}, {"arch", "cache-dir", "jobs"});
  args.at_most(1);
  const KernelSet set = load_kernel_set(args.need(0, "CONFIG.json"));
  // --arch sm_90a,sm_100a builds every kernel for each target in one run (one image, many GPUs).
  const std::vector<std::string> archs = resolve_archs(args, set.arch);
  std::string arch = archs[0];
  for (size_t i = 1; i < archs.size(); ++i) arch += "," + archs[i];
  const unsigned jobs = static_cast<unsigned>(args.get_int("jobs", default_jobs(), 1, 1024));
  auto cache = open_cache(args);

  // The same spec listed twice is built once.
  std::vector<const KernelSetEntry*> todo;  // one per (kernel, arch), arch-major
  std::vector<const std::string*> todo_arch;
  for (const auto& target : archs) {
    std::set<std::string> seen;
    for (const auto& k : set.kernels)
      if (seen.insert(k.spec.canonical()).second) todo.push_back(&k), todo_arch.push_back(&target);
  }

  struct Outcome {
    BuildResult r;
    std::string error;
    int error_kind = 0;
  };
  std::vector<Outcome> out(todo.size());
  const auto t0 = std::chrono::steady_clock::now();
  {
    Progress progress("building", todo.size());
    parallel_for(todo.size(), jobs, [&](size_t i) {
      try {
        out[i].r = build_kernel(todo[i]->spec, *todo_arch[i], cache.get());
      } catch (const Error& e) {
        out[i].r.name = todo[i]->spec.name();
        out[i].error = e.what();
        out[i].error_kind = static_cast<int>(e.kind());
      }
      progress.advance(out[i].r.name);
    });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t compiled = 0, hits = 0, remote_hits = 0, failed = 0;
  int worst = 0;
  // The critical path: the slowest single kernel. With enough jobs the wall time cannot drop
  // below it, so wall / critical says how much parallelism is left (1.0: none).
  size_t slowest = out.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].error.empty() && (slowest == out.size() || out[i].r.seconds > out[slowest].r.seconds)) slowest = i;
  nlohmann::json critical = nullptr;
  if (slowest < out.size())
    critical = {{"name", out[slowest].r.name}, {"arch", *todo_arch[slowest]}, {"seconds", out[slowest].r.seconds},
                {"compile_seconds", out[slowest].r.compile_seconds},
                {"wall_over_critical", out[slowest].r.seconds > 0 ? seconds / out[slowest].r.seconds : 0.0}};
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < out.size(); ++i) {
    const auto& o = out[i];
    nlohmann::json r = {{"name", o.r.name}, {"origin", todo[i]->origin}, {"arch", *todo_arch[i]}};
    if (!o.error.empty()) {
      ++failed;
      r["status"] = "failed";
      r["error"] = o.error;
      worst = std::max(worst, o.error_kind == static_cast<int>(ErrorKind::Compile) ? 3
                              : o.error_kind == static_cast<int>(ErrorKind::InvalidArgument) ? 2 : 4);
    } else {
      (o.r.cache_hit ? hits : compiled) += 1;
      remote_hits += o.r.remote_hit ? 1 : 0;
      r["status"] = o.r.remote_hit ? "remote_hit" : o.r.cache_hit ? "cache_hit" : "compiled";
      r["key"] = o.r.key;
      r["compile_seconds"] = o.r.compile_seconds;
      r["seconds"] = o.r.seconds;
      r["cubin_bytes"] = o.r.cubin_bytes;
    }
    results.push_back(r);
  }

  if (args.flag("json")) {
    nlohmann::json j = {{"kernels", todo.size()}, {"compiled", compiled}, {"cache_hits", hits},
                        {"failed", failed},       {"seconds", seconds},   {"arch", arch},
                        {"jobs", jobs},           {"cache_dir", cache->dir()}, {"critical_path", critical},
                        {"results", results}};
    if (RemoteCache* remote = RemoteCache::global()) {
      j["remote_hits"] = remote_hits;
      j["remote"] = {{"url", remote->describe()}, {"signed", remote->signing()}, {"counters", remote_counters_json(*remote)}};
    }
    std::puts(j.dump(2).c_str());
  } else {
    std::printf("%-58s %-8s %-10s %10s %10s\n", "kernel", "arch", "status", "compile_s", "cubin_KB");
    for (const auto& r : results) {
      std::string status = r["status"];
      std::printf("%-58s %-8s %-10s %10s %10s\n", r["name"].get<std::string>().c_str(),
                  r["arch"].get<std::string>().c_str(), status.c_str(),
                  status == "compiled" ? fmt::format("{:.3f}", r["compile_seconds"].get<double>()).c_str() : "-",
                  status != "failed" ? fmt::format("{:.1f}", r["cubin_bytes"].get<double>() / 1024).c_str() : "-");
      if (status == "failed") std::fprintf(stderr, "%s: %s\n", r["name"].get<std::string>().c_str(),
                                           r["error"].get<std::string>().c_str());
    }
    std::printf("%zu kernels for %s: %zu compiled, %zu cache hits (%zu remote), %zu failed in %.2f s (jobs %u) -> %s\n",
                todo.size(), arch.c_str(), compiled, hits, remote_hits, failed, seconds, jobs, cache->dir().c_str());
    if (!critical.is_null() && compiled > 0)
      std::printf("critical path: %s (%s) %.2f s\n", critical["name"].get<std::string>().c_str(),
                  critical["arch"].get<std::string>().c_str(), critical["seconds"].get<double>());
  }
  return worst;
}

}  // namespace mlajit::cli
