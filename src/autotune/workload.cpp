// make_workload: fills the shape's missing keys with the op's defaults and dispatches to the
// op's workload (its definition: src/ops/<family>/tuning_workload.cpp).
#include "autotune/workloads.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"

namespace mlajit::autotune {

std::unique_ptr<Workload> make_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed) {
  problem.validate();
  Shape s = default_shape(problem.op());
  for (const auto& [k, v] : shape) {
    if (!s.count(k)) throw_invalid(fmt::format("shape key of {}", op_name(problem.op())), k, describe_shape(s));
    MLAJIT_EXPECT(v >= 1, fmt::format("shape {}", k), v, "a positive size");
    s[k] = v;
  }
  return ops::definition(problem.op()).make_workload(problem, s, seed);
}

}  // namespace mlajit::autotune
