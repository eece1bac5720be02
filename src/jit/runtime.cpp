// Runtime: KernelSpec -> loaded Kernel on the current device. Memory cache (single flight) ->
// build_source (disk cache -> remote cache -> NVRTC -> disk and remote put) -> module load
// (include/mlajit/runtime.hpp). A memory hit never reaches build_source, so never the network.
#include "mlajit/runtime.hpp"

#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "jit/module_image.hpp"
#include "jit/memory_cache.hpp"
#include "jit/build_source.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"

namespace mlajit {

namespace {

// The stream of the launch the calling thread is resolving a kernel for (Runtime::get_for_launch),
// consulted only on a memory-cache miss.
thread_local bool tl_has_launch_stream = false;
thread_local Stream tl_launch_stream = nullptr;

// Above this a kernel must opt in to more dynamic shared memory (cuFuncSetAttribute).
constexpr unsigned kDefaultSmemLimit = 48 * 1024;

class LoadedKernel final : public Kernel {
 public:
  // `cubin`: one ELF image, or the module image of a source of several compile units (one module
  // per unit; each entry is looked up in its unit's).
  LoadedKernel(KernelSource src, const std::string& cubin, std::string arch, std::string key)
      : src_(std::move(src)), arch_(std::move(arch)), key_(std::move(key)) {
    const std::vector<std::string_view> units = unpack_module_image(cubin);
    if (units.size() != static_cast<size_t>(std::max(src_.compile_units, 1)))
      throw_error(ErrorKind::Cache, "{}: a compiled image of {} modules for a source of {} compile units", src_.name,
                  units.size(), src_.compile_units);
    for (auto u : units) modules_.emplace_back(std::string(u));
    for (auto& e : src_.entries) {
      if (e.unit < 0 || e.unit >= static_cast<int>(modules_.size()))
        throw_error(ErrorKind::Internal, "{}: entry {} in compile unit {} of {}", src_.name, e.symbol, e.unit,
                    modules_.size());
      driver::Function f = modules_[static_cast<size_t>(e.unit)].function(e.symbol);
      if (e.smem_bytes > kDefaultSmemLimit) driver::set_max_dynamic_smem(f, e.smem_bytes);
      functions_.push_back(f);
    }
  }

  const KernelSource& source() const override { return src_; }
  const std::string& arch() const override { return arch_; }
  const std::string& cache_key() const override { return key_; }

  void* function(int entry) const override {
    check_entry(entry);
    return functions_[entry];
  }

  int max_active_clusters(int entry, const LaunchDims& d) const override {
    check_entry(entry);
    const std::array<unsigned, 8> shape{static_cast<unsigned>(entry), d.block[0], d.block[1], d.block[2],
                                        d.smem_bytes, d.cluster[0], d.cluster[1], d.cluster[2]};
    std::lock_guard<std::mutex> lock(clusters_mutex_);
    auto it = clusters_.find(shape);
    if (it == clusters_.end())
      it = clusters_
               .emplace(shape, driver::max_active_clusters(functions_[entry], d.block, d.smem_bytes, d.cluster, nullptr))
               .first;
    return it->second;
  }

  void launch(int entry, const LaunchDims& d, Stream stream, const void* args, size_t args_size) const override {
    check_entry(entry);
    const EntryPoint& e = src_.entries[entry];
    if (e.threads && d.block[0] * d.block[1] * d.block[2] > e.threads)
      throw_invalid(fmt::format("block size of {}", e.symbol), d.block[0] * d.block[1] * d.block[2],
                    fmt::format("at most the {} threads it was compiled for", e.threads));
    if (d.smem_bytes > std::max(e.smem_bytes, kDefaultSmemLimit))
      throw_invalid(fmt::format("dynamic shared memory of {}", e.symbol), d.smem_bytes,
                    fmt::format("at most {} bytes (the limit raised at load)", std::max(e.smem_bytes, kDefaultSmemLimit)));
    if (!args || args_size == 0) throw_invalid(fmt::format("argument struct of {}", e.symbol), "none", "a by-value struct");
    const unsigned ctas = d.cluster[0] * d.cluster[1] * d.cluster[2];
    if (ctas < 1 || ctas > 8 || d.grid[0] % d.cluster[0] || d.grid[1] % d.cluster[1] || d.grid[2] % d.cluster[2])
      throw_invalid(fmt::format("cluster shape of {}", e.symbol),
                    fmt::format("{}x{}x{} (grid {}x{}x{})", d.cluster[0], d.cluster[1], d.cluster[2], d.grid[0],
                                d.grid[1], d.grid[2]),
                    "1 to 8 CTAs that divide the grid in every dimension");
    driver::launch(functions_[entry], d.grid, d.block, d.smem_bytes, stream, args, d.cluster, d.programmatic);
  }

 private:
  void check_entry(int entry) const {
    if (entry < 0 || entry >= static_cast<int>(functions_.size()))
      throw_invalid(fmt::format("entry index of {}", src_.name), entry,
                    fmt::format("0..{}", static_cast<int>(functions_.size()) - 1));
  }

  KernelSource src_;
  std::vector<driver::Module> modules_;  // one per compile unit
  std::vector<driver::Function> functions_;
  std::string arch_;
  std::string key_;
  // max_active_clusters' answers by (entry, block, shared memory, cluster shape).
  mutable std::mutex clusters_mutex_;
  mutable std::map<std::array<unsigned, 8>, int> clusters_;
};

struct SpecOnDevice {
  KernelSpec spec;
  int device;
  bool operator==(const SpecOnDevice& o) const { return device == o.device && spec == o.spec; }
};

class RuntimeImpl final : public Runtime {
 public:
  explicit RuntimeImpl(RuntimeOptions o) : opts_(std::move(o)) {}

  std::shared_ptr<const Kernel> get(const KernelSpec& spec) override {
    int device = driver::ensure_context();
    size_t hash = spec.hash() ^ (static_cast<size_t>(device) * 0x9E3779B97F4A7C15ull);
    return kernels_.get(SpecOnDevice{spec, device}, hash, [&] { return build_and_load(spec, device); });
  }

  std::shared_ptr<const Kernel> load_source(const KernelSource& src) override {
    int device = driver::ensure_context();
    return load(src, arch_of(device));
  }

  size_t cached_kernels() const override { return kernels_.size(); }

  int sm_count() override { return device_props(driver::ensure_context()).sm_count; }

  std::string arch() override { return arch_of(driver::ensure_context()); }

 private:
  struct DeviceProps {
    int sm_count = 0;
    std::string arch;
  };

  const DeviceProps& device_props(int device) {
    std::lock_guard<std::mutex> lk(props_mu_);
    DeviceProps& p = props_[device];  // map nodes never move: the reference stays valid
    if (p.arch.empty()) {
      auto info = driver::device_info(device);
      p.sm_count = info.sm_count;
      p.arch = arch_for_compute_capability(info.cc_major, info.cc_minor);
    }
    return p;
  }

  std::string arch_of(int device) {
    if (auto a = config::arch_override()) {
      validate_arch(*a, "MLAJIT_ARCH");
      return *a;
    }
    return device_props(device).arch;
  }

  DiskCache* disk() {
    if (!opts_.disk_cache_enabled) return nullptr;
    if (opts_.disk_cache) return opts_.disk_cache.get();
    return DiskCache::default_cache();
  }

  RemoteCache* remote() {
    if (!opts_.remote_cache_enabled) return nullptr;
    if (opts_.remote_cache) return opts_.remote_cache.get();
    return RemoteCache::global();
  }

  std::shared_ptr<const Kernel> build_and_load(const KernelSpec& spec, int device) {
    if (tl_has_launch_stream && driver::stream_capturing(tl_launch_stream))
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("kernel {} is not loaded on device {} and the launch stream is being captured into a "
                              "CUDA graph, where compiling or loading a module is not allowed: precompile or load "
                              "before capture (mlajit_op_load, op.load(), or one launch before capturing)",
                              spec.canonical(), device));
    KernelSource src = opts_.codegen ? opts_.codegen(spec) : generate(spec);
    return load(src, arch_of(device));
  }

  std::shared_ptr<const Kernel> load(const KernelSource& src, const std::string& arch) {
    auto t0 = std::chrono::steady_clock::now();
    BuiltKernel b = build_source(src, arch, disk(), remote());
    auto kernel = std::make_shared<LoadedKernel>(src, b.cubin, arch, b.result.key);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log::info("{} ready for {} in {:.2f} ms ({}{})", src.name, arch, ms,
              b.result.remote_hit ? "remote hit" : b.result.cache_hit ? "disk hit" : "compiled in ",
              b.result.cache_hit ? std::string() : fmt::format("{:.3f} s", b.result.compile_seconds));
    return kernel;
  }

  RuntimeOptions opts_;
  detail::SingleFlightCache<SpecOnDevice, Kernel> kernels_;
  std::mutex props_mu_;
  std::map<int, DeviceProps> props_;
};

}  // namespace

std::shared_ptr<const Kernel> Runtime::get_for_launch(const KernelSpec& spec, Stream stream) {
  struct Scope {
    bool prev_has;
    Stream prev;
    Scope(Stream s) : prev_has(tl_has_launch_stream), prev(tl_launch_stream) {
      tl_has_launch_stream = true;
      tl_launch_stream = s;
    }
    ~Scope() {
      tl_has_launch_stream = prev_has;
      tl_launch_stream = prev;
    }
  } scope(stream);
  return get(spec);
}

namespace {
thread_local Runtime* tl_scoped_runtime = nullptr;  // Runtime::Scope
}  // namespace

Runtime::Scope::Scope(Runtime* rt) : previous_(tl_scoped_runtime) { tl_scoped_runtime = rt; }
Runtime::Scope::~Scope() { tl_scoped_runtime = previous_; }

Runtime& Runtime::global() {
  if (Runtime* scoped = tl_scoped_runtime) return *scoped;
  // Leaked on purpose: unloading modules during static destruction races the driver's own teardown.
  static Runtime* rt = new RuntimeImpl(RuntimeOptions{});
  return *rt;
}

std::unique_ptr<Runtime> Runtime::create(RuntimeOptions options) {
  return std::make_unique<RuntimeImpl>(std::move(options));
}

}  // namespace mlajit
