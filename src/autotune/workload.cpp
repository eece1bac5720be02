// make_workload: fills the shape's missing keys with the op's defaults and dispatches to the
// family's workload (src/autotune_workload_<family>.cpp).
#include "autotune/workloads.hpp"
#include "mlajit/error.hpp"

namespace mlajit::autotune {

std::unique_ptr<Workload> make_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed) {
  problem.validate();
  Shape s = default_shape(problem.op());
  for (const auto& [k, v] : shape) {
    if (!s.count(k)) throw_invalid(fmt::format("shape key of {}", op_name(problem.op())), k, describe_shape(s));
    MLAJIT_EXPECT(v >= 1, fmt::format("shape {}", k), v, "a positive size");
    s[k] = v;
  }
  switch (problem.op()) {
    case Op::kv_cache_store:
    case Op::kv_cache_gather:
    case Op::sparse_index_remap: return make_kv_workload(problem, s, seed);
    case Op::mla_indexer: return make_indexer_workload(problem, s, seed);
    case Op::sparse_prefill: return make_prefill_workload(problem, s, seed);
  }
  throw_error(ErrorKind::Internal, "make_workload: unknown op {}", static_cast<int>(problem.op()));
}

}  // namespace mlajit::autotune
