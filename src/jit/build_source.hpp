#pragma once
// The pipeline after codegen, shared by build_kernel (build.cpp) and the Runtime (runtime.cpp):
// key -> disk cache lookup -> (per-key lock, second lookup) -> NVRTC compile -> disk cache put.
#include <string>

#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"

namespace mlajit {

struct KernelSource;
struct BuiltKernel {
  BuildResult result;
  std::string cubin;
};
// `cache` nullptr: no disk cache (always compiles). Without NVRTC, an entry built for the same
// source/arch/options by any NVRTC version is used (so a warm cache needs no NVRTC); else Error(Compile).
BuiltKernel build_source(const KernelSource& src, const std::string& arch, DiskCache* cache);

}  // namespace mlajit
