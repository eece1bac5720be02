// The tuner: every candidate compiled in parallel first (so that timing never waits on NVRTC), then
// on each device (one worker thread per device) every candidate is run once on the group's
// workload and its output compared with the default configuration's before it may be timed -- a
// fast wrong kernel never wins -- then timed, and the fastest verified candidate per device is
// merged into the tuning database.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <set>
#include <thread>

#include "mlajit/autotune.hpp"
#include "autotune/test_hooks.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"
#include "autotune/remote_tuning.hpp"
#include "core/parallel.hpp"

namespace mlajit::autotune {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string describe_error(const std::exception& e) {
  if (auto* me = dynamic_cast<const Error*>(&e)) return fmt::format("{}: {}", error_kind_name(me->kind()), me->what());
  return e.what();
}

// A launch the device refuses for its size (registers, shared memory, block size) rather than a
// bug: reported as exceeds_resources.
bool is_resource_error(const std::string& what) {
  return what.find("OUT_OF_RESOURCES") != std::string::npos || what.find("out of resources") != std::string::npos ||
         what.find("dynamic shared memory") != std::string::npos;
}

struct Device {
  driver::DeviceInfo info;
  std::string arch;
};

struct Progressor {
  const TuneOptions& opts;
  std::string phase;
  size_t total;
  std::atomic<size_t> done{0};
  void step(const std::string& item) {
    const size_t d = ++done;
    if (opts.progress) opts.progress(phase, d, total, item);
  }
};

// Times every candidate of one group on the calling thread's device and fills `g`'s results for
// device slot `di`. Throws only when the device itself is lost (a sticky CUDA error).
void time_group(GroupResult& g, size_t di, const Device& dev, const TuneOptions& opts, Progressor& prog) {
  GroupDeviceResult& gd = g.devices[di];
  auto set_all = [&](const std::string& status, const std::string& reason) {
    for (auto& c : g.candidates)
      if (c.devices[di].status == "pending") c.devices[di] = {dev.info.ordinal, status, reason, {}};
  };
  const auto def_it = std::find_if(g.candidates.begin(), g.candidates.end(), [](const CandidateResult& c) { return c.is_default; });
  if (def_it == g.candidates.end() || !def_it->compiled) {
    set_all("no_reference", "the default configuration did not compile, so no output can be verified: " +
                                (def_it == g.candidates.end() ? std::string("missing") : def_it->compile_error));
    for (size_t i = 0; i < g.candidates.size(); ++i) prog.step(g.candidates[i].spec.name());
    return;
  }

  std::unique_ptr<Workload> wl;
  std::vector<uint8_t> reference;
  try {
    wl = make_workload(g.group.default_spec, g.shape, /*seed=*/1);
    wl->poison_output();
    wl->run(g.group.default_spec, nullptr);
    driver::synchronize();
    reference = wl->read_output();
  } catch (const std::exception& e) {
    const std::string why = "the default configuration could not run on this shape: " + describe_error(e);
    set_all("no_reference", why);
    for (size_t i = 0; i < g.candidates.size(); ++i) prog.step(g.candidates[i].spec.name());
    driver::synchronize();  // throws when the context is lost: the caller stops using the device
    return;
  }

  for (auto& c : g.candidates) {
    CandidateDeviceResult& r = c.devices[di];
    r.device = dev.info.ordinal;
    if (!c.compiled) {
      r.status = "not_compiled";
      r.reason = c.compile_error;
    } else if (dev.info.max_smem_per_block_optin > 0 &&
               c.smem_bytes > static_cast<unsigned>(dev.info.max_smem_per_block_optin)) {
      r.status = "exceeds_resources";
      r.reason = fmt::format("needs {} bytes of shared memory per block, the device allows {}", c.smem_bytes,
                             dev.info.max_smem_per_block_optin);
    } else {
      try {
        wl->poison_output();
        wl->run(c.spec, nullptr);
        driver::synchronize();
        std::vector<uint8_t> out = wl->read_output();
        if (opts.test_hooks && opts.test_hooks->tamper_output) opts.test_hooks->tamper_output(c.spec, out);
        std::string why = wl->compare(reference, out);
        if (!why.empty()) {
          r.status = "wrong_output";
          r.reason = why;
        } else {
          r.timing = time_launches([&](Stream s) { wl->run(c.spec, s); }, opts.warmup, opts.reps, nullptr);
          r.status = "ok";
        }
      } catch (const std::exception& e) {
        const std::string why = describe_error(e);
        r.status = is_resource_error(why) ? "exceeds_resources" : "failed";
        r.reason = why;
        driver::synchronize();  // a sticky error (illegal address, ...) ends this device's work
      }
    }
    if (r.status != "ok") log::info("tune {} on device {}: {}: {}", c.spec.name(), dev.info.ordinal, r.status, r.reason);
    prog.step(c.spec.name());
  }

  for (size_t i = 0; i < g.candidates.size(); ++i) {
    const auto& r = g.candidates[i].devices[di];
    if (r.status != "ok") continue;
    if (g.candidates[i].is_default) gd.default_ms = r.timing.median_ms;
    if (gd.winner < 0 || r.timing.median_ms < gd.best_ms) {
      gd.winner = static_cast<int>(i);
      gd.best_ms = r.timing.median_ms;
    }
  }
}

}  // namespace

TuneReport tune(const std::vector<TuneGroup>& groups, const TuneOptions& opts) {
  const auto t0 = Clock::now();
  MLAJIT_EXPECT(opts.reps >= 1 && opts.reps <= 100000, "tune repetitions (--reps)", opts.reps, "an integer in [1, 100000]");
  MLAJIT_EXPECT(opts.warmup >= 0, "tune warm-up launches", opts.warmup, ">= 0");
  TuneReport rep;
  rep.jobs = opts.jobs ? opts.jobs : default_jobs();
  std::string cache_dir = opts.cache_dir;
  if (cache_dir.empty()) {
    // Tuning results go where misses go: the first cache layer the caller can write.
    auto writable = writable_cache_dir_from_env();
    if (!writable && opts.persist)
      throw_error(ErrorKind::Cache, "no writable cache layer to keep tuning results in (MLAJIT_CACHE_PATH: every "
                                    "directory is read-only); add one of yours or pass a cache directory");
    cache_dir = writable.value_or(std::string());
  }
  if (!cache_dir.empty()) rep.db_path = TuningDb::default_path(cache_dir);

  // ---- devices and targets ----
  std::vector<Device> devs;
  if (opts.compile_only) {
    rep.no_gpu_reason = "compile only";
  } else if (!driver::available(&rep.no_gpu_reason)) {
    log::warn("no usable CUDA driver/device ({}): compiling only, nothing is timed", rep.no_gpu_reason);
  } else {
    std::vector<int> ordinals = opts.devices;
    const int n = driver::device_count();
    if (ordinals.empty())
      for (int i = 0; i < n; ++i) ordinals.push_back(i);
    for (int o : ordinals) {
      MLAJIT_EXPECT(o >= 0 && o < n, "tune device ordinal", o, fmt::format("0..{}", n - 1));
      Device d{driver::device_info(o), ""};
      d.arch = arch_for_compute_capability(d.info.cc_major, d.info.cc_minor);
      if (!opts.arch.empty() && opts.arch != d.arch)
        throw_invalid("--arch", opts.arch,
                      fmt::format("the arch of device {} ({}: {}), since tuning times the kernels there", o,
                                  d.info.name, d.arch));
      devs.push_back(std::move(d));
    }
  }
  rep.gpu = !devs.empty();
  if (rep.gpu) {
    for (const auto& d : devs)
      if (std::find(rep.archs.begin(), rep.archs.end(), d.arch) == rep.archs.end()) rep.archs.push_back(d.arch);
  } else {
    std::string arch = opts.arch;
    if (arch.empty()) arch = config::arch_override().value_or(opts.fallback_arch);
    if (arch.empty())
      throw_invalid("target arch", "none", "--arch, MLAJIT_ARCH or the config's \"arch\" (there is no GPU to take it from)");
    validate_arch(arch, "target arch");
    rep.archs.push_back(arch);
  }

  // ---- groups, shapes, buckets ----
  rep.groups.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    GroupResult& g = rep.groups[gi];
    g.group = groups[gi];
    const Op op = g.group.default_spec.op();
    g.shape = default_shape(op);
    if (auto it = opts.shapes.find(op); it != opts.shapes.end())
      for (const auto& [k, v] : it->second) g.shape[k] = v;
    g.bucket = bucket_of(op, g.shape);
    const std::string def = g.group.default_spec.canonical();
    for (const auto& e : g.group.candidates) {
      CandidateResult c;
      c.spec = e.spec;
      c.origin = e.origin;
      c.is_default = e.spec.canonical() == def;
      c.arch = rep.archs.front();
      c.devices.resize(devs.size());
      for (size_t di = 0; di < devs.size(); ++di) c.devices[di] = {devs[di].info.ordinal, "pending", "", {}};
      g.candidates.push_back(std::move(c));
    }
    for (const auto& d : devs) {
      GroupDeviceResult gd;
      gd.device = d.info.ordinal;
      gd.device_name = d.info.name;
      gd.sm_count = d.info.sm_count;
      g.devices.push_back(gd);
    }
  }

  // ---- database hits: a sweep already tuned for this device, bucket and version is not redone ----
  if (rep.gpu && !opts.force) {
    const auto records = TuningDb(rep.db_path).load();
    for (auto& g : rep.groups) {
      const uint64_t problem = problem_hash(g.group.default_spec.params);
      for (size_t di = 0; di < devs.size(); ++di) {
        for (const auto& r : records) {
          if (r.op != g.group.default_spec.op() || r.device != devs[di].info.name ||
              r.sm_count != devs[di].info.sm_count || r.bucket != g.bucket || r.version != kVersion ||
              r.sweep_signature != g.group.sweep_signature || problem_hash(r.params) != problem)
            continue;
          auto& gd = g.devices[di];
          gd.from_db = true;
          gd.best_ms = r.median_ms;
          gd.default_ms = r.default_ms;
          gd.db_knobs = knobs_of(r.params);
          for (size_t ci = 0; ci < g.candidates.size(); ++ci) {
            auto& cd = g.candidates[ci].devices[di];
            cd.status = "db_hit";
            cd.reason = "tuned before (" + rep.db_path + ")";
            if (knobs_of(g.candidates[ci].spec.params) == gd.db_knobs) {
              gd.winner = static_cast<int>(ci);
              cd.timing.median_ms = r.median_ms;
            }
          }
          break;
        }
      }
    }
  }
  auto needs_timing = [&](const GroupResult& g, size_t di) { return !g.devices[di].from_db; };
  auto needs_compile = [&](const GroupResult& g) {
    if (!rep.gpu) return true;
    for (size_t di = 0; di < devs.size(); ++di)
      if (needs_timing(g, di)) return true;
    return false;
  };

  // ---- parallel compile of every candidate that will be timed ----
  const auto tc = Clock::now();
  std::unique_ptr<DiskCache> own_cache;
  DiskCache* cache = nullptr;
  if (!opts.cache_dir.empty()) {
    own_cache = std::make_unique<DiskCache>(opts.cache_dir, config::cache_max_bytes());
    cache = own_cache.get();
  }
  struct Job {
    size_t g, c;
    std::string arch;
  };
  std::vector<Job> jobs;
  for (size_t gi = 0; gi < rep.groups.size(); ++gi)
    if (needs_compile(rep.groups[gi]))
      for (size_t ci = 0; ci < rep.groups[gi].candidates.size(); ++ci)
        for (const auto& arch : rep.archs) jobs.push_back({gi, ci, arch});
  struct JobResult {
    BuildResult build;
    std::string error;
    unsigned smem = 0;
    double seconds = 0;
  };
  std::vector<JobResult> results(jobs.size());
  Progressor cprog{opts, "compile", jobs.size()};
  parallel_for(jobs.size(), rep.jobs, [&](size_t i) {
    const Job& j = jobs[i];
    const KernelSpec& spec = rep.groups[j.g].candidates[j.c].spec;
    JobResult& r = results[i];
    const auto tb = Clock::now();
    try {
      if (opts.test_hooks && opts.test_hooks->before_compile) opts.test_hooks->before_compile(spec);
      for (const auto& e : generate(spec).entries) r.smem = std::max(r.smem, e.smem_bytes);
      r.build = build_kernel(spec, j.arch, cache);
    } catch (const std::exception& e) {
      r.error = describe_error(e);
      log::info("tune: {} did not compile for {}: {}", spec.name(), j.arch, r.error);
    }
    r.seconds = since(tb);
    cprog.step(spec.name());
  });
  // A candidate counts as compiled only when every target arch built.
  for (size_t i = 0; i < jobs.size(); ++i) {
    CandidateResult& c = rep.groups[jobs[i].g].candidates[jobs[i].c];
    const JobResult& r = results[i];
    const bool first = c.compile_seconds == 0 && !c.compiled && c.compile_error.empty();
    c.compile_seconds += r.seconds;
    c.nvrtc_seconds += r.build.compile_seconds;
    c.smem_bytes = std::max(c.smem_bytes, r.smem);
    if (!r.error.empty()) {
      c.compiled = false;
      c.compile_error = c.compile_error.empty() ? r.error : c.compile_error + "; " + r.error;
    } else if (first) {
      c.compiled = true;
      c.cache_hit = r.build.cache_hit;
    } else {
      c.cache_hit = c.cache_hit && r.build.cache_hit;
    }
  }
  rep.compile_seconds = since(tc);

  if (!rep.gpu) {
    rep.total_seconds = since(t0);
    return rep;
  }

  // ---- verify and time: one worker thread per device ----
  const auto tt = Clock::now();
  size_t timed = 0;
  for (const auto& g : rep.groups)
    for (size_t di = 0; di < devs.size(); ++di)
      if (needs_timing(g, di)) timed += g.candidates.size();
  Progressor tprog{opts, "time", timed};
  std::vector<std::thread> workers;
  for (size_t di = 0; di < devs.size(); ++di) {
    workers.emplace_back([&, di] {
      const Device& dev = devs[di];
      try {
        driver::set_device(dev.info.ordinal);
        ScopedTuningLookupOff no_lookup;
        for (auto& g : rep.groups)
          if (needs_timing(g, di)) time_group(g, di, dev, opts, tprog);
      } catch (const std::exception& e) {
        const std::string why = "device " + std::to_string(dev.info.ordinal) + " unusable: " + describe_error(e);
        log::error("tune: {}", why);
        for (auto& g : rep.groups)
          for (auto& c : g.candidates)
            if (c.devices[di].status == "pending") c.devices[di] = {dev.info.ordinal, "failed", why, {}};
      }
    });
  }
  for (auto& w : workers) w.join();
  rep.timing_seconds = since(tt);

  // ---- agreement between devices, then persist the winners ----
  std::vector<TuningRecord> records;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  for (auto& g : rep.groups) {
    std::set<std::string> picks;
    for (auto& gd : g.devices) {
      if (gd.winner >= 0) picks.insert(knobs_of(g.candidates[gd.winner].spec.params).dump());
      else if (gd.from_db) picks.insert(gd.db_knobs.dump());
      if (gd.from_db || gd.winner < 0) continue;
      TuningRecord r;
      r.op = g.group.default_spec.op();
      r.device = gd.device_name;
      r.sm_count = gd.sm_count;
      r.bucket = g.bucket;
      r.version = kVersion;
      r.params = g.candidates[gd.winner].spec.params;
      r.median_ms = gd.best_ms;
      r.default_ms = gd.default_ms;
      r.sweep_signature = g.group.sweep_signature;
      r.tuned_at = now;
      records.push_back(std::move(r));
    }
    g.devices_agree = picks.size() <= 1;
  }
  if (opts.persist && !records.empty()) {
    try {
      TuningDb(rep.db_path).merge(records);
      rep.db_written = records.size();
      reload_tuning_index(opts.cache_dir);  // "": every layer of the environment's
      share_tuned_records(records);  // the fleet's copy (a no-op without MLAJIT_REMOTE_CACHE)
    } catch (const Error& e) {
      rep.db_error = e.what();
      log::error("tune: the winners were not saved: {}", e.what());
    }
  }
  rep.total_seconds = since(t0);
  return rep;
}

}  // namespace mlajit::autotune
