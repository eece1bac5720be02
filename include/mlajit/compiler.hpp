#pragma once
// Compiler: KernelSource -> CUBIN for one target arch with NVRTC (loaded with dlopen; the binary
// never links libnvrtc). The templates a source includes are handed to NVRTC as named headers, so
// no CUDA toolkit include path is used. Options are fixed and part of every cache key:
//   -std=c++17 --gpu-architecture=sm_XX[a] -default-device -DNDEBUG [-lineinfo] [--pch]
//   [MLAJIT_NVRTC_EXTRA_OPTIONS, split at spaces: development A/B of compiler options]
// --use_fast_math is never passed: the kernels rely on IEEE division and expf/exp2f accuracy.
//
// MLAJIT_DUMP_DIR: every compile writes <base>.cu (includes expanded), <base>.ptx, <base>.cubin and
// <base>.log there, <base> = dump_base_name() (kernel name, cache key prefix, arch), so variants and
// targets never overwrite each other. A failed compile always writes the source and log (to the
// dump dir, else a private temp folder) and names the path in the Error(Compile) it throws.
#include <atomic>
#include <string>
#include <vector>

#include "mlajit/codegen.hpp"

namespace mlajit {

// Checks a target name: sm_80 | sm_86 | sm_87 | sm_89 | sm_90 | sm_90a | sm_100 | sm_100a | sm_103 |
// sm_103a | sm_120 | sm_120a. Throws Error(InvalidArgument) naming `what` otherwise.
void validate_arch(const std::string& arch, const std::string& what = "target arch");
// The target mlajit uses for a device of compute capability major.minor: sm_90 -> sm_90a,
// sm_100 -> sm_100a (arch-specific features such as wgmma / tcgen05), else sm_<major><minor>.
std::string arch_for_compute_capability(int major, int minor);
// True when a kernel whose lowest target is `min_arch` can be built for `arch`. Arch-specific
// targets ("sm_90a") only run on exactly that arch; plain ones on every later one.
bool arch_satisfies(const std::string& arch, const std::string& min_arch);

// How many hex digits of the cache key a dump's file name carries.
inline constexpr size_t kDumpKeyChars = 12;
// "<src.name>-<first kDumpKeyChars of key>-<arch>", e.g.
// "sparse_index_remap_p64_thr256-3f9c0a1b2c4d-sm_90a": the file name (without extension) of the
// dumps of one build, `key` being its cache_key().
std::string dump_base_name(const KernelSource& src, const std::string& arch, const std::string& key);

struct CompileStats {
  double seconds = 0;         // wall time of nvrtcCompileProgram (+ CUBIN fetch)
  size_t cubin_bytes = 0;
  std::string nvrtc_version;  // Compiler::nvrtc_version()
};

struct CompiledKernel {
  std::string cubin;  // ELF image for cuModuleLoadData
  std::string log;    // NVRTC log (warnings), may be empty
  CompileStats stats;
};

class Compiler {
 public:
  // The process-wide compiler (NVRTC loaded on first use, PCH off unless enabled).
  static Compiler& global();

  // True when NVRTC loads; else `reason` says what was tried.
  static bool available(std::string* reason = nullptr);
  // e.g. "13.0 (libnvrtc.so.13.0.88)"; throws Error(Compile) when NVRTC is missing.
  std::string nvrtc_version() const;
  // The NVRTC release a cache key holds: "13.0". Not the file name that loaded: the same release
  // installed as libnvrtc.so.13 on a build machine and libnvrtc.so.13.0.88 on a server must share
  // keys, or a cache built on one (the packaged layer, an image) never serves the other.
  std::string nvrtc_key_version() const;

  // The compiler's option list for `arch` (validated) -- a cache key input, with the kernel's own
  // options (which cache_key adds itself).
  std::vector<std::string> options(const std::string& arch) const;
  // What NVRTC gets for `src`: options(arch) with src.nvrtc_options inserted before the
  // MLAJIT_NVRTC_EXTRA_OPTIONS ones.
  std::vector<std::string> options(const std::string& arch, const KernelSource& src) const;

  // Compiles `src` for `arch`. Throws Error(InvalidArgument) for a bad arch or an arch below
  // src.min_arch, Error(Compile) with the NVRTC log and the written source path on failure.
  CompiledKernel compile(const KernelSource& src, const std::string& arch) const;

  // Automatic precompiled headers (--pch, NVRTC 12.8+). Off by default: measured on our kernels it
  // does not pay (see tests/unit/test_compiler.cpp "pch timing" and the infra report).
  // Settings may change while other threads compile (they read them once per compile): atomics.
  void set_use_pch(bool on) { use_pch_.store(on, std::memory_order_relaxed); }
  bool use_pch() const { return use_pch_.load(std::memory_order_relaxed); }
  void set_line_info(bool on) { line_info_.store(on, std::memory_order_relaxed); }

  // Successful compile() calls in this process (tests check single-flight with it).
  static unsigned long compile_count();

 private:
  // The fixed options, then `kernel_options`, then MLAJIT_NVRTC_EXTRA_OPTIONS (read once).
  std::vector<std::string> options_with(const std::string& arch, const std::vector<std::string>& kernel_options) const;
  std::atomic<bool> use_pch_{false};
  std::atomic<bool> line_info_{false};
};

}  // namespace mlajit
