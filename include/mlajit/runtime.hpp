#pragma once
// Runtime: KernelSpec -> launchable Kernel on the current device. Lookup order: memory cache
// (per spec and device, single flight) -> disk cache -> remote cache (MLAJIT_REMOTE_CACHE) ->
// NVRTC compile (then disk and remote put) -> module load through the driver. Thread-safe; the hot path (a memory hit) takes no global lock for long.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "mlajit/codegen.hpp"
#include "mlajit/tensor.hpp"

namespace mlajit {

struct LaunchDims {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem_bytes = 0;
  // Thread-block cluster shape (CTAs per cluster along each grid dimension; the grid must be a
  // multiple of it). {1, 1, 1}: no cluster attribute. Up to 8 CTAs (the portable cluster size).
  unsigned cluster[3] = {1, 1, 1};
  // Programmatic dependent launch (sm_90+): the kernel may start before the one ahead of it on
  // the stream has finished, once every CTA of that one has signalled or exited; it must wait for
  // it before reading its outputs (templates/common/grid_dependency.cuh). Stream order still holds
  // for everything else, and a CUDA graph capture records the edge as programmatic.
  bool programmatic = false;
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
  // How many clusters of dims.cluster (dims.block threads, dims.smem_bytes) of entry `entry` the
  // device holds at once (driver::max_active_clusters), asked once per entry and shape and then
  // remembered, so that launches may size their grids by it; 0 where the driver cannot say.
  virtual int max_active_clusters(int entry, const LaunchDims& dims) const {
    (void)entry;
    (void)dims;
    return 0;
  }
  // The CUfunction of entry `entry` (for raw-launch baselines and external launchers).
  virtual void* function(int entry) const = 0;
  // Target the cubin was built for and its cache key.
  virtual const std::string& arch() const = 0;
  virtual const std::string& cache_key() const = 0;
};

class DiskCache;
class RemoteCache;

// Construction options of a non-global runtime (tests, embedders with their own cache policy).
struct RuntimeOptions {
  // Source generator; empty: mlajit::generate. Tests plug hand-written kernels in here.
  std::function<KernelSource(const KernelSpec&)> codegen;
  // Disk cache; empty: DiskCache::default_cache() (the environment's). Ignored when disabled.
  std::shared_ptr<DiskCache> disk_cache;
  bool disk_cache_enabled = true;  // false: never read or write the disk cache
  // Fleet-shared tier behind the disk cache; empty: RemoteCache::global() (MLAJIT_REMOTE_CACHE).
  std::shared_ptr<RemoteCache> remote_cache;
  bool remote_cache_enabled = true;  // false: never consult the remote tier
};

struct CompileStats;  // see compiler.hpp

class Runtime {
 public:
  // The runtime the ops launch through: the calling thread's scoped one (Runtime::Scope), else
  // the process-wide runtime: mlajit::generate, the environment's disk cache (unless
  // MLAJIT_DISABLE_DISK_CACHE), never destroyed (modules stay loaded until process exit).
  static Runtime& global();
  // While alive, global() on the constructing thread returns `rt` (scopes nest). The C API runs
  // each call on an op made in an mlajit_runtime inside one, so that its kernels come from that
  // runtime's memory and disk caches.
  class Scope {
   public:
    explicit Scope(Runtime* rt);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Runtime* previous_;
  };
  static std::unique_ptr<Runtime> create(RuntimeOptions options = {});
  virtual ~Runtime() = default;
  // The kernel for `spec` on the current device (primary context of MLAJIT device / current
  // context). Compiles at most once per key across threads.
  virtual std::shared_ptr<const Kernel> get(const KernelSpec& spec) = 0;
  // get(spec) for a launch on `stream` (what the ops call): a miss while `stream` is being
  // captured into a CUDA graph throws Error(InvalidArgument) "... precompile or load before
  // capture" instead of compiling or loading a module inside the capture. Hits cost nothing more.
  std::shared_ptr<const Kernel> get_for_launch(const KernelSpec& spec, Stream stream);
  // Builds (disk cache -> NVRTC) and loads an already generated source on the current device,
  // bypassing the memory cache: every call loads a new module.
  virtual std::shared_ptr<const Kernel> load_source(const KernelSource& src) = 0;
  // Kernels held in the memory cache.
  virtual size_t cached_kernels() const = 0;
  // Number of SMs of the current device (cached).
  virtual int sm_count() = 0;
  // Target architecture of the current device, e.g. "sm_90a".
  virtual std::string arch() = 0;
};

}  // namespace mlajit
