#pragma once
// A small hand-written kernel (not a product op) for the compiler, cache and runtime tests:
//   y[i] = a * x[i] + y[i] / (divisor + 1)   (IEEE division: mlajit never compiles with fast math;
//   divisor + 1 is not a power of two, so the division cannot become a multiplication)
// `divisor` is baked in as a constexpr from the spec (sparse_index_remap's page_size stands in for
// "some param"), so different specs give different sources, keys and modules.
#include <string>

#include "mlajit/codegen.hpp"

namespace mlajit_test {

struct AxpyArgs {
  const float* x;
  float* y;
  float a;
  unsigned n;
};

inline mlajit::KernelSpec axpy_spec(int divisor) {
  mlajit::SparseIndexRemapParams p;
  p.page_size = divisor;  // power of two keeps it a valid spec
  return mlajit::KernelSpec{p};
}

inline mlajit::KernelSource axpy_source(const mlajit::KernelSpec& spec, const std::string& extra = "") {
  int divisor = std::get<mlajit::SparseIndexRemapParams>(spec.params).page_size;
  mlajit::KernelSource s;
  s.spec = spec;
  s.name = "test_axpy_d" + std::to_string(divisor);
  s.min_arch = "sm_80";
  s.entries = {{"mj_test_axpy", 256, 0}};
  s.code = mlajit::source_header(spec) +
           "#include \"common/convert.cuh\"\n"
           "struct AxpyArgs { const float* x; float* y; float a; unsigned n; };\n"
           "constexpr float kDivisor = " + std::to_string(divisor + 1) + ".0f;\n" + extra +
           "extern \"C\" __global__ void __launch_bounds__(256) mj_test_axpy(AxpyArgs args) {\n"
           "  mj::u32 i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "  if (i < args.n) args.y[i] = args.a * args.x[i] + args.y[i] / kDivisor;\n"
           "}\n";
  return s;
}

}  // namespace mlajit_test
