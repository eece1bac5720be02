#pragma once
// The op registry's interface: one op, one definition. Everything the generic code (codegen front,
// params JSON and naming, the autotuner's knobs / shapes / buckets / workloads) needs to know about
// an op is one OpDefinition, written in the op's own folder (src/ops/<family>/definition.cpp) and
// listed once in src/ops/registry.cpp, which implements the lookups declared here. Generic code
// loops over or indexes the registry; it never switches on Op.
//
// Layers (an #include only ever points to the left):
//   include/mlajit  <  core  <  jit  <  autotune  <  ops  <  api, cli
// include/mlajit is the public interface (declarations only, includes nothing from src/); src/reference
// (the CPU references) sees only include/mlajit and serves ops' bench harness, the CLI and the tests.
// This header sits in core so that core (params naming and heuristics), jit (codegen) and autotune
// (knobs, shapes, workloads) can reach an op's definition without including src/ops/: the lower
// layers call the declared functions, ops provides them at link time.
//
// Adding an op: docs/design.md, "Adding an op", lists every file it touches (counted by adding one).
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
  const char* tag;             // its mark in kernel names: "_<tag><value>" (KernelSpec::name());
                               // lowercase letters, unique within the op (the registry checks)
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
  // The readable part of a kernel name that the non-knob params make, e.g.
  // "mla_indexer_h64_d128_k2048_p64_causal_logical". KernelSpec::name() appends every knob the
  // spec sets ("_bq8_st4"), so variants of one problem never share a name.
  std::string (*kernel_name)(const OpParams& p);
  // The specialized source (codegen.hpp generate() validates and resolves heuristics first).
  KernelSource (*generate)(const KernelSpec& spec);
  // The tuner's problem on the current device (shape complete, spec validated).
  std::unique_ptr<autotune::Workload> (*make_workload)(const KernelSpec& problem, const autotune::Shape& shape,
                                                         uint64_t seed);
};

// The definition of `op` (registry order == Op order; checked once at first use).
const OpDefinition& definition(Op op);

// Where an op's knobs sit in its fields() order, resolved from the names once per op (the registry
// checks there that every knob is an int field), so that the per-call paths (has_auto_knobs,
// problem_hash, filling auto knobs) never compare names.
struct KnobLayout {
  std::vector<int> position;  // fields() position of definition(op).knobs[k]
  uint64_t mask = 0;          // bit i set: field i is a knob
};
const KnobLayout& knob_layout(Op op);
// The k-th knob (definition(op).knobs[k]) of `p`, by position.
int& knob_at(OpParams& p, size_t k);
inline int knob_at(const OpParams& p, size_t k) { return knob_at(const_cast<OpParams&>(p), k); }

}  // namespace mlajit::ops
