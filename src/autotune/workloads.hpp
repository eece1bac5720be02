#pragma once
// The per-family workload factories behind autotune::make_workload (include/mlajit/autotune.hpp).
// `shape` has every key of the op (defaults filled in by make_workload).
#include <memory>

#include "mlajit/autotune.hpp"

namespace mlajit::autotune {

std::unique_ptr<Workload> make_kv_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed);
std::unique_ptr<Workload> make_indexer_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed);
std::unique_ptr<Workload> make_prefill_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed);

}  // namespace mlajit::autotune
