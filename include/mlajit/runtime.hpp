#pragma once
// Runtime: KernelSpec -> launchable Kernel on the current device. Lookup order: memory cache
// (per spec and device, single flight) -> disk cache -> NVRTC compile (then disk put) -> module
// load through the driver. Thread-safe; the hot path (a memory hit) takes no global lock for long.
#include <cstddef>
#include <memory>
#include <string>

#include "mlajit/codegen.hpp"
#include "mlajit/tensor.hpp"

namespace mlajit {

struct LaunchDims {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;
};

// One loaded module of one KernelSpec on one device/context.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const KernelSource& source() const = 0;
  // Launches entry `entry` (index into source().entries) with the by-value argument struct `args`
  // through cuLaunchKernelEx. The dynamic shared memory limit was raised once at load.
  virtual void launch(int entry, const LaunchDims& dims, Stream stream, const void* args, size_t args_size) const = 0;
  template <typename Args>
  void launch(int entry, const LaunchDims& dims, Stream stream, const Args& args) const {
    launch(entry, dims, stream, &args, sizeof(Args));
  }
};

struct CompileStats;  // see compiler.hpp

class Runtime {
 public:
  static Runtime& global();
  virtual ~Runtime() = default;
  // The kernel for `spec` on the current device (primary context of MLAJIT device / current
  // context). Compiles at most once per key across threads.
  virtual std::shared_ptr<const Kernel> get(const KernelSpec& spec) = 0;
  // Number of SMs of the current device (cached).
  virtual int sm_count() = 0;
  // Target architecture of the current device, e.g. "sm_90a".
  virtual std::string arch() = 0;
};

}  // namespace mlajit
