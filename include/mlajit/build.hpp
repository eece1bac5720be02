#pragma once
// Ahead-of-time builds without a GPU (build pipelines, `mlajit build`, autotune's parallel
// compile): KernelSpec + arch -> cubin in the disk cache. Safe to call from many threads and
// processes at once.
#include <string>

#include "mlajit/params.hpp"

namespace mlajit {

class DiskCache;

struct BuildResult {
  std::string name;         // KernelSource::name
  std::string key;          // cache key (hex)
  std::string arch;
  bool cache_hit = false;   // the entry was already on disk (nothing compiled)
  double seconds = 0;       // wall time of this call (codegen + key + lookup + compile + put)
  double compile_seconds = 0;  // NVRTC time (0 on a hit)
  size_t cubin_bytes = 0;
};

// Builds `spec` for `arch` into `cache` (nullptr: the default cache of the environment).
BuildResult build_kernel(const KernelSpec& spec, const std::string& arch, DiskCache* cache = nullptr);

}  // namespace mlajit
