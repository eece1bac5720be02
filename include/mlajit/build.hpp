#pragma once
// Ahead-of-time builds without a GPU (build pipelines, `mlajit build`, autotune's parallel
// compile): KernelSpec + arch -> cubin in the disk cache. Safe to call from many threads and
// processes at once.
#include <string>

#include "mlajit/params.hpp"

namespace mlajit {

class DiskCache;
class RemoteCache;  // the fleet-shared tier (src/jit/remote_cache.hpp)

struct BuildResult {
  std::string name;         // KernelSource::name
  std::string key;          // cache key (hex)
  std::string arch;
  bool cache_hit = false;   // the entry was already on disk or in the remote cache (nothing compiled)
  bool remote_hit = false;  // ... and it came from the remote cache (now also on disk)
  double seconds = 0;       // wall time of this call (codegen + key + lookup + compile + put)
  double compile_seconds = 0;  // NVRTC time (0 on a hit)
  size_t cubin_bytes = 0;
};

// Builds `spec` for `arch` into `cache` (nullptr: the default cache of the environment), through
// `remote` (nullptr: RemoteCache::global(), the environment's, off unless MLAJIT_REMOTE_CACHE).
BuildResult build_kernel(const KernelSpec& spec, const std::string& arch, DiskCache* cache = nullptr,
                         RemoteCache* remote = nullptr);

}  // namespace mlajit
