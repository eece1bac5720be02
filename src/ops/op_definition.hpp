#pragma once
// One op, one definition. Everything the generic code (codegen front, params JSON and naming, the
// autotuner's knobs / shapes / buckets / workloads) needs to know about an op is one OpDefinition,
// written in the op's own folder (src/ops/<family>/definition.cpp) and listed once in
// src/ops/registry.cpp. Generic code loops over or indexes the registry; it never switches on Op.
//
// Adding an op (README "Adding an op" counts the files):
//   include/mlajit/params.hpp   its params struct (with fields()) and one MLAJIT_FOR_EACH_OP line
//   include/mlajit/ops.hpp      its typed entry point
//   src/ops/<family>/           definition.cpp, generate.cpp, op.cpp, tuning_workload.cpp
//   templates/<family>/         its device code and args struct
//   src/ops/registry.cpp        one line
#include <memory>
#include <string>
#include <vector>

#include "mlajit/autotune.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/params.hpp"

namespace mlajit::ops {

// A tuning knob: an int params field that changes speed, never the result beyond float rounding.
struct KnobDef {
  const char* name;            // the params field (as in fields())
  bool has_auto;               // 0 means "auto": the tuning database, then `heuristic`
  int heuristic;               // what auto becomes without a tuning record; 0 = the op's launch plan
                               // resolves it (it depends on other params or on the device)
  std::vector<int> space;      // the values a sweep tries when a config entry has no `sweep`;
                               // every one is legal for every spec of the op (a unit test checks
                               // each against validate() and the generator)
};

struct OpDefinition {
  Op op;
  std::vector<KnobDef> knobs;
  // The named dynamic sizes of a problem, bucketed keys first, in bucket order.
  std::vector<autotune::ShapeKey> shape_keys;
  // The tuning bucket of a complete shape (every key present). Must agree with what the op's entry
  // point builds at call time (autotune.hpp bucket_<op>).
  autotune::ShapeBucket (*bucket)(const autotune::Shape& shape);
  // Short readable kernel name (KernelSpec::name), e.g. "mla_indexer_h64_d128_k2048_p64_causal_logical".
  std::string (*kernel_name)(const OpParams& p);
  // The specialized source (codegen.hpp generate() validates and resolves heuristics first).
  KernelSource (*generate)(const KernelSpec& spec);
  // The tuner's problem on the current device (shape complete, spec validated).
  std::unique_ptr<autotune::Workload> (*make_workload)(const KernelSpec& problem, const autotune::Shape& shape,
                                                         uint64_t seed);
};

// The definition of `op` (registry order == Op order; checked once at first use).
const OpDefinition& definition(Op op);

// Knob access by name through the params' fields(): nullptr when `p` has no such int field.
int* knob_field(OpParams& p, const char* name);
inline const int* knob_field(const OpParams& p, const char* name) {
  return knob_field(const_cast<OpParams&>(p), name);
}

}  // namespace mlajit::ops
