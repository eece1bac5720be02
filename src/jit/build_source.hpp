#pragma once
// The pipeline after codegen, shared by build_kernel (build.cpp) and the Runtime (runtime.cpp):
// key -> disk cache lookup -> (per-key lock, second lookup) -> remote lookup (a verified hit is
// written to the disk cache) -> NVRTC compile -> disk cache put and remote put.
#include <string>

#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"

namespace mlajit {

struct KernelSource;
struct BuiltKernel {
  BuildResult result;
  std::string cubin;
};
// `cache` / `remote` nullptr: no such tier. Without NVRTC, an entry built for the same
// source/arch/options by any NVRTC version is used from the disk cache (so a warm cache needs no
// NVRTC); else Error(Compile).
BuiltKernel build_source(const KernelSource& src, const std::string& arch, DiskCache* cache,
                         RemoteCache* remote = nullptr);

}  // namespace mlajit
