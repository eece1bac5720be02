// NVRTC compilation of generated sources to CUBIN (see include/mlajit/compiler.hpp).
#include "mlajit/compiler.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <fstream>

#include "mlajit/cache.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "jit/module_image.hpp"
#include "jit/nvrtc_api.hpp"

namespace mlajit {

namespace {

constexpr const char* kArchs[] = {"sm_80",  "sm_86",   "sm_87",  "sm_89",   "sm_90",  "sm_90a",
                                  "sm_100", "sm_100a", "sm_103", "sm_103a", "sm_120", "sm_120a"};

std::string arch_list() {
  std::string s;
  for (auto* a : kArchs) s += (s.empty() ? "" : " | ") + std::string(a);
  return s;
}

int arch_number(const std::string& arch) { return std::stoi(arch.substr(3)); }
bool arch_specific(const std::string& arch) { return !arch.empty() && arch.back() == 'a'; }

const nvrtc::Api& api() {
  std::string why;
  const nvrtc::Api* a = nvrtc::load(&why);
  if (!a) throw Error(ErrorKind::Compile, why);
  return *a;
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw_error(ErrorKind::Io, "cannot write {}", path);
}

// Where a failed compile leaves its source when MLAJIT_DUMP_DIR is unset: a per-user folder.
std::string failure_dir() {
  if (auto d = config::dump_dir()) return *d;
  std::string base = config::env("TMPDIR").value_or("/tmp");
  std::string dir = fmt::format("{}/mlajit-{}", base, static_cast<unsigned>(getuid()));
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

}  // namespace

std::string dump_base_name(const KernelSource& src, const std::string& arch, const std::string& key) {
  // Kernel names are readable, not unique (a generator may name two variants alike, and one
  // variant is built for several targets): the key prefix and the arch keep every build's files
  // apart, while a rebuild of the same variant for the same target overwrites its own files.
  return fmt::format("{}-{}-{}", src.name, key.substr(0, kDumpKeyChars), arch);
}

namespace {

struct ProgramGuard {
  const nvrtc::Api& api;
  nvrtc::Program prog = nullptr;
  ~ProgramGuard() {
    if (prog) api.DestroyProgram(&prog);
  }
};

struct NvrtcRun {
  nvrtc::Result rc = nvrtc::kSuccess;
  std::string log;
  std::string output;  // CUBIN or PTX
};

NvrtcRun run_nvrtc(const KernelSource& src, const std::vector<std::string>& options, bool want_ptx) {
  const auto& a = api();
  auto headers = included_templates(src.code);
  std::vector<const char*> contents, names;
  for (auto* t : headers) {
    contents.push_back(t->content.c_str());
    names.push_back(t->path.c_str());
  }
  ProgramGuard g{a};
  std::string prog_name = src.name + ".cu";
  nvrtc::Result rc = a.CreateProgram(&g.prog, src.code.c_str(), prog_name.c_str(), static_cast<int>(headers.size()),
                                     contents.data(), names.data());
  if (rc != nvrtc::kSuccess) throw_error(ErrorKind::Compile, "nvrtcCreateProgram({}) failed: {}", prog_name, a.GetErrorString(rc));
  std::vector<const char*> opts;
  for (auto& o : options) opts.push_back(o.c_str());

  NvrtcRun run;
  run.rc = a.CompileProgram(g.prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  if (a.GetProgramLogSize(g.prog, &log_size) == nvrtc::kSuccess && log_size > 1) {
    run.log.resize(log_size);
    a.GetProgramLog(g.prog, run.log.data());
    run.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (run.rc != nvrtc::kSuccess) return run;
  size_t size = 0;
  rc = want_ptx ? a.GetPTXSize(g.prog, &size) : a.GetCUBINSize(g.prog, &size);
  if (rc == nvrtc::kSuccess) {
    run.output.resize(size);
    rc = want_ptx ? a.GetPTX(g.prog, run.output.data()) : a.GetCUBIN(g.prog, run.output.data());
  }
  if (rc != nvrtc::kSuccess)
    throw_error(ErrorKind::Compile, "fetching the {} of {} failed: {}", want_ptx ? "PTX" : "CUBIN", prog_name,
                a.GetErrorString(rc));
  if (want_ptx && !run.output.empty() && run.output.back() == '\0') run.output.pop_back();
  return run;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

void validate_arch(const std::string& arch, const std::string& what) {
  for (auto* a : kArchs)
    if (arch == a) return;
  throw_invalid(what, fmt::format("\"{}\"", arch), arch_list());
}

std::string arch_for_compute_capability(int major, int minor) {
  std::string arch = fmt::format("sm_{}{}", major, minor);
  if (arch == "sm_90" || arch == "sm_100" || arch == "sm_103" || arch == "sm_120") arch += "a";
  return arch;
}

bool arch_satisfies(const std::string& arch, const std::string& min_arch) {
  if (min_arch.empty()) return true;
  if (arch_specific(min_arch)) return arch == min_arch;
  return arch_number(arch) >= arch_number(min_arch);
}

namespace {
std::atomic<unsigned long> g_compiles{0};
}

unsigned long Compiler::compile_count() { return g_compiles.load(); }

Compiler& Compiler::global() {
  static Compiler c;
  return c;
}

bool Compiler::available(std::string* reason) { return nvrtc::load(reason) != nullptr; }

std::string Compiler::nvrtc_version() const {
  const auto& a = api();
  std::string file = a.library.substr(a.library.rfind('/') + 1);
  return fmt::format("{}.{} ({})", a.major, a.minor, file);
}

std::string Compiler::nvrtc_key_version() const {
  const auto& a = api();
  return fmt::format("{}.{}", a.major, a.minor);
}

std::vector<std::string> Compiler::options_with(const std::string& arch,
                                                const std::vector<std::string>& kernel_options) const {
  validate_arch(arch);
  std::vector<std::string> o = {"-std=c++17", "--gpu-architecture=" + arch, "-default-device", "-DNDEBUG"};
  if (line_info_.load(std::memory_order_relaxed)) o.push_back("-lineinfo");
  if (use_pch_.load(std::memory_order_relaxed)) o.push_back("--pch");
  o.insert(o.end(), kernel_options.begin(), kernel_options.end());
  // Development knob (A/B of compiler options with one binary): appended last so that a repeated
  // option overrides the fixed one (or a kernel's own) where NVRTC lets the last occurrence win.
  // Being part of the returned list, it is part of every cache key: cubins built with and without
  // it never mix.
  for (auto& x : config::nvrtc_extra_options()) o.push_back(std::move(x));
  return o;
}

std::vector<std::string> Compiler::options(const std::string& arch) const { return options_with(arch, {}); }

std::vector<std::string> Compiler::options(const std::string& arch, const KernelSource& src) const {
  return options_with(arch, src.nvrtc_options);
}

CompiledKernel Compiler::compile(const KernelSource& src, const std::string& arch) const {
  validate_arch(arch);
  if (!arch_satisfies(arch, src.min_arch))
    throw_invalid(fmt::format("target arch of {}", src.name), arch,
                  arch_specific(src.min_arch)
                      ? fmt::format("exactly {} ({})", src.min_arch,
                                    src.min_arch_why.empty() ? "the kernel uses arch-specific instructions" : src.min_arch_why)
                      : fmt::format("{} or newer{}", src.min_arch, src.min_arch_why.empty() ? "" : " (" + src.min_arch_why + ")"));
  const auto opts = options(arch, src);
  auto t0 = std::chrono::steady_clock::now();
  if (src.compile_units < 1 || static_cast<size_t>(src.compile_units) > kMaxModuleImageUnits)
    throw_error(ErrorKind::Internal, "{}: {} compile units (expected 1..{})", src.name, src.compile_units,
                kMaxModuleImageUnits);
  NvrtcRun run;
  if (src.compile_units == 1) {
    run = run_nvrtc(src, opts, /*want_ptx=*/false);
  } else {
    // One NVRTC program per unit, in parallel (NVRTC compiles separate programs concurrently): the
    // kernel's compile time is its slowest unit's, not the sum. The first failing unit's result
    // is reported, with the unit named in its log.
    std::vector<NvrtcRun> runs(static_cast<size_t>(src.compile_units));
    std::vector<std::exception_ptr> errors(runs.size());
    std::vector<std::thread> threads;
    for (size_t u = 0; u < runs.size(); ++u)
      threads.emplace_back([&, u] {
        try {
          auto unit_opts = opts;
          unit_opts.push_back(fmt::format("-DMLAJIT_UNIT={}", u));
          runs[u] = run_nvrtc(src, unit_opts, /*want_ptx=*/false);
        } catch (...) {
          errors[u] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    std::vector<std::string> cubins;
    for (size_t u = 0; u < runs.size(); ++u) {
      if (runs[u].rc != nvrtc::kSuccess) {
        run = std::move(runs[u]);
        run.log = fmt::format("(compile unit {} of {}, -DMLAJIT_UNIT={})\n{}", u, runs.size(), u, run.log);
        break;
      }
      if (!runs[u].log.empty()) run.log += fmt::format("(compile unit {})\n{}", u, runs[u].log);
      cubins.push_back(std::move(runs[u].output));
    }
    if (cubins.size() == runs.size()) {
      run.rc = nvrtc::kSuccess;
      run.output = pack_module_image(cubins);
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  auto dump = config::dump_dir();
  // The files of one build are named after its cache key, as `mlajit cache ls` lists it.
  const auto dump_name = [&] { return dump_base_name(src, arch, cache_key(src, arch, options(arch), nvrtc_key_version())); };
  if (run.rc != nvrtc::kSuccess) {
    std::string dir = failure_dir();
    std::string base = dir + "/" + dump_name();
    std::string where;
    try {
      write_file(base + ".cu", expand_includes(src.code));
      write_file(base + ".log", run.log);
      where = base + ".cu";
    } catch (const Error& e) {
      where = fmt::format("(not written: {})", e.what());
    }
    throw_error(ErrorKind::Compile, "NVRTC failed to compile {} for {} ({}); source: {}\noptions: {}\nNVRTC log:\n{}",
                src.name, arch, api().GetErrorString(run.rc), where, join(opts), run.log);
  }
  if (!run.log.empty()) log::debug("NVRTC log of {}:\n{}", src.name, run.log);

  g_compiles.fetch_add(1);
  CompiledKernel out;
  out.cubin = std::move(run.output);
  out.log = std::move(run.log);
  out.stats.seconds = seconds;
  out.stats.cubin_bytes = out.cubin.size();
  out.stats.nvrtc_version = nvrtc_version();
  log::info("compiled {} for {} in {:.3f} s ({} bytes)", src.name, arch, seconds, out.cubin.size());

  if (dump) {
    // The PTX needs a second, virtual-arch compile; only paid for when dumping.
    std::string base = *dump + "/" + dump_name();
    ::mkdir(dump->c_str(), 0755);
    write_file(base + ".cu", expand_includes(src.code));
    write_file(base + ".cubin", out.cubin);
    write_file(base + ".log", fmt::format("options: {}\nseconds: {:.3f}\n{}", join(opts), seconds, out.log));
    auto ptx_opts = opts;
    for (auto& o : ptx_opts)
      if (o.rfind("--gpu-architecture=", 0) == 0) o = "--gpu-architecture=compute_" + arch.substr(3);
    for (auto it = ptx_opts.begin(); it != ptx_opts.end();)
      it = (*it == "--pch") ? ptx_opts.erase(it) : it + 1;
    NvrtcRun ptx = run_nvrtc(src, ptx_opts, /*want_ptx=*/true);
    if (ptx.rc == nvrtc::kSuccess) write_file(base + ".ptx", ptx.output);
    else log::warn("PTX dump of {} failed: {}", src.name, ptx.log);
  }
  return out;
}

}  // namespace mlajit
