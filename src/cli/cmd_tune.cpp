// mlajit tune CONFIG.json [--shape ...] [--jobs N] [--reps R] [--warmup W] [--json] [--csv F]
//                         [--cache-dir D] [--arch A] [--devices 0,1] [--force] [--compile-only]
// Autotuning sweeps: compile every candidate in parallel, verify and time them on every visible
// GPU, remember the winner per device and shape bucket in <cache_dir>/tuning.json.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "core/parallel.hpp"

namespace mlajit::cli {

namespace {

using namespace mlajit::autotune;

std::string shape_help() {
  std::string s;
  for (Op op : {Op::kv_cache_store, Op::kv_cache_gather, Op::sparse_index_remap, Op::mla_indexer, Op::sparse_prefill}) {
    s += fmt::format("  {}:\n", op_name(op));
    for (const auto& k : shape_keys(op))
      s += fmt::format("    {:<8} default {:<7} {}{}\n", k.name, k.default_value, k.help, k.bucketed ? " [bucketed]" : "");
  }
  return s;
}

void print_help() {
  std::printf(
      "usage: mlajit tune CONFIG.json [--shape K=V,...] [--jobs N] [--reps R] [--warmup W] [--json] [--csv F]\n"
      "                   [--cache-dir D] [--arch A] [--devices I,J] [--force] [--compile-only]\n\n"
      "Expands every config entry's \"sweep\" (an entry without one gets its op's default knob space: threads\n"
      "{64,128,256,512} for the kv ops, num_stages for mla_indexer; sparse_prefill has no knobs),\n"
      "compiles all candidates in parallel (--jobs, default: all cores), then on every visible GPU checks each\n"
      "candidate's output against the default configuration's and times it (--warmup launches, then --reps\n"
      "repetitions with CUDA events, L2 flushed before each; median, min, max). The fastest correct candidate\n"
      "per device and shape bucket (sizes rounded up to powers of two) is merged into <cache dir>/tuning.json,\n"
      "which the ops consult at run time. A sweep already in the database for this device, bucket and mlajit\n"
      "version is not timed again unless --force.\n\n"
      "  --shape K=V,...   problem sizes; a plain key applies to every op of the config that has it,\n"
      "                    OP.K=V to one op (e.g. kv_cache_store.tokens=4096)\n"
      "  --csv F           also write one row per candidate and device to F\n"
      "  --compile-only    stop after compiling (no GPU needed)\n\n"
      "shape keys and defaults:\n%s"
      "\nexit codes: 0 every group has a winner, 2 bad usage, 3 a group had no candidate that compiled,\n"
      "4 no GPU / a group had no verified candidate / the database could not be written\n",
      shape_help().c_str());
}

std::map<Op, Shape> parse_shapes(const std::string& text, const std::vector<TuneGroup>& groups) {
  std::set<Op> ops;
  for (const auto& g : groups) ops.insert(g.default_spec.op());
  std::map<Op, Shape> shapes;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('='), dot = item.find('.');
    if (dot != std::string::npos && (eq == std::string::npos || dot < eq)) {
      const Op op = parse_op(item.substr(0, dot), "--shape op prefix");
      shapes[op] = parse_shape(op, item.substr(dot + 1), shapes.count(op) ? shapes[op] : Shape{});
      continue;
    }
    const std::string key = item.substr(0, eq == std::string::npos ? item.size() : eq);
    bool used = false;
    for (Op op : ops)
      for (const auto& k : shape_keys(op))
        if (key == k.name) {
          shapes[op] = parse_shape(op, item, shapes.count(op) ? shapes[op] : Shape{});
          used = true;
        }
    if (!used) {
      std::string known;
      for (Op op : ops)
        for (const auto& k : shape_keys(op)) known += fmt::format(" {}.{}", op_name(op), k.name);
      throw_invalid("--shape key", key, "a shape key of an op in the config:" + known);
    }
  }
  return shapes;
}

std::vector<int> parse_devices(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 0) throw_invalid("--devices", text, "device ordinals like 0,1");
    out.push_back(v);
  }
  return out;
}

std::string fmt_ms(double ms) { return ms > 0 ? fmt::format("{:.4f}", ms) : std::string("-"); }

void print_table(const TuneReport& rep) {
  for (const auto& g : rep.groups) {
    const Op op = g.group.default_spec.op();
    std::printf("\n%s  %s  shape %s  bucket %s%s\n", g.group.origin.c_str(), g.group.default_spec.name().c_str(),
                describe_shape(g.shape).c_str(), g.bucket.to_json(op).dump().c_str(),
                g.group.default_space ? "  (default knob space)" : "");
    std::printf("  %-34s %8s %-3s", "knobs", "build_s", "");
    for (const auto& d : g.devices) std::printf(" | dev%-2d %-17s %10s %10s %10s", d.device, "status", "median_ms", "min_ms", "max_ms");
    std::printf("\n");
    for (size_t ci = 0; ci < g.candidates.size(); ++ci) {
      const auto& c = g.candidates[ci];
      std::string knobs = knobs_of(c.spec.params).dump() + (c.is_default ? " (default)" : "");
      std::printf("  %-34s %8s %-3s", knobs.c_str(),
                  c.compiled ? (c.cache_hit ? "hit" : fmt::format("{:.2f}", c.compile_seconds)).c_str()
                             : c.compile_error.empty() ? "-" : "FAIL",
                  "");
      for (size_t di = 0; di < c.devices.size(); ++di) {
        const auto& d = c.devices[di];
        const bool win = g.devices[di].winner == static_cast<int>(ci);
        std::printf(" | %s%-22s %10s %10s %10s", win ? "* " : "  ", d.status.c_str(), fmt_ms(d.timing.median_ms).c_str(),
                    fmt_ms(d.timing.min_ms).c_str(), fmt_ms(d.timing.max_ms).c_str());
      }
      std::printf("\n");
      if (!c.compile_error.empty()) std::printf("      compile: %s\n", c.compile_error.substr(0, 300).c_str());
      for (const auto& d : c.devices)
        if (d.status != "ok" && d.status != "db_hit" && !d.reason.empty() && d.status != "not_compiled")
          std::printf("      dev%d %s: %s\n", d.device, d.status.c_str(), d.reason.substr(0, 300).c_str());
    }
    for (const auto& d : g.devices) {
      if (d.winner < 0 && !d.from_db) {
        std::printf("  dev%d %s: no verified candidate\n", d.device, d.device_name.c_str());
        continue;
      }
      const std::string knobs = d.winner >= 0 ? knobs_of(g.candidates[d.winner].spec.params).dump() : d.db_knobs.dump();
      std::printf("  dev%d %s: best %s %s ms%s", d.device, d.device_name.c_str(), knobs.c_str(), fmt_ms(d.best_ms).c_str(),
                  d.from_db ? " (database hit: nothing timed)" : "");
      if (d.default_ms > 0 && d.best_ms > 0)
        std::printf(", default %s ms, speedup %.3fx", fmt_ms(d.default_ms).c_str(), d.default_ms / d.best_ms);
      std::printf("\n");
    }
    if (!g.devices_agree) std::printf("  devices DISAGREE on the best knobs\n");
  }
  std::printf("\ncompile %.2f s (jobs %u, %s), timing %.2f s, total %.2f s; database %s (%zu records written)\n",
              rep.compile_seconds, rep.jobs, rep.archs.empty() ? "" : rep.archs.front().c_str(), rep.timing_seconds,
              rep.total_seconds, rep.db_path.c_str(), rep.db_written);
}

}  // namespace

int cmd_tune(const Argv& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
  Args args(argv, {"json", "force", "compile-only"},
            {"shape", "jobs", "reps", "warmup", "csv", "cache-dir", "arch", "devices"});
  args.at_most(1);
  std::string config_arch;
  const auto groups = load_tune_groups(args.need(0, "CONFIG.json"), &config_arch);

  TuneOptions opts;
  opts.arch = args.get_or("arch", "");
  opts.fallback_arch = config_arch;
  opts.jobs = static_cast<unsigned>(args.get_int("jobs", default_jobs(), 1, 1024));
  opts.reps = static_cast<int>(args.get_int("reps", 20, 1, 100000));
  opts.warmup = static_cast<int>(args.get_int("warmup", 3, 0, 100000));
  opts.force = args.flag("force");
  opts.compile_only = args.flag("compile-only");
  if (auto s = args.get("shape")) opts.shapes = parse_shapes(*s, groups);
  if (auto d = args.get("devices")) opts.devices = parse_devices(*d);
  if (auto dir = args.get("cache-dir")) {
    // The runtime that loads the kernels during timing reads MLAJIT_CACHE_DIR once, at first use:
    // point it at the same directory so the cubins compiled here are the ones timed.
    ::setenv("MLAJIT_CACHE_DIR", dir->c_str(), 1);
    opts.cache_dir = *dir;
  }

  std::mutex progress_mu;
  std::unique_ptr<Progress> bar;
  std::string bar_phase;
  opts.progress = [&](const std::string& phase, size_t, size_t total, const std::string& item) {
    std::lock_guard<std::mutex> lk(progress_mu);
    if (phase != bar_phase) {
      bar.reset();
      bar = std::make_unique<Progress>(phase == "compile" ? "compiling candidates" : "timing candidates", total);
      bar_phase = phase;
    }
    bar->advance(item);
  };

  const TuneReport rep = tune(groups, opts);
  bar.reset();

  if (auto csv = args.get("csv")) {
    std::ofstream f(*csv);
    if (!f) throw_error(ErrorKind::Io, "cannot write --csv {}", *csv);
    f << rep.to_csv();
    if (!f.flush()) throw_error(ErrorKind::Io, "cannot write --csv {}", *csv);
  }
  if (args.flag("json")) std::puts(rep.to_json().dump(2).c_str());
  else print_table(rep);

  // Exit code: 3 when a group has no compiled candidate, 4 when one has no verified winner, no GPU
  // was usable for a tune that needed one, or the winners could not be saved.
  int code = 0;
  for (const auto& g : rep.groups) {
    bool any_compiled = false;
    for (const auto& c : g.candidates) any_compiled |= c.compiled;
    const bool all_db = !g.devices.empty() &&
                        std::all_of(g.devices.begin(), g.devices.end(), [](const GroupDeviceResult& d) { return d.from_db; });
    if (!any_compiled && !all_db) code = std::max(code, 3);
    for (const auto& d : g.devices)
      if (d.winner < 0 && !d.from_db) code = std::max(code, any_compiled ? 4 : 3);
  }
  if (!rep.db_error.empty()) code = std::max(code, 4);
  if (!rep.gpu && !opts.compile_only) {
    std::fprintf(stderr, "mlajit tune: no usable GPU (%s): compiled the candidates, timed nothing; "
                         "use --compile-only to only compile\n", rep.no_gpu_reason.c_str());
    code = std::max(code, 4);
  }
  return code;
}

}  // namespace mlajit::cli
