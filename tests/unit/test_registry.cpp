// The op registry (src/ops/registry.cpp): one definition per op, in op order, and every knob table
// consistent with the op's own validation and generator.
#include <doctest/doctest.h>

#include "core/param_checks.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"

using namespace mlajit;

TEST_CASE("registry: one definition per op, in MLAJIT_FOR_EACH_OP order") {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const auto& d = ops::definition(op);
    CHECK(d.op == op);
    CHECK((d.generate != nullptr && d.make_workload != nullptr && d.bucket != nullptr && d.kernel_name != nullptr));
    CHECK(!d.shape_keys.empty());
    // Bucketed shape keys come first (the bucket's dimension order).
    bool seen_unbucketed = false;
    for (const auto& k : d.shape_keys) {
      if (!k.bucketed) seen_unbucketed = true;
      else CHECK_MESSAGE(!seen_unbucketed, op_name(op), ": bucketed key ", k.name, " after an unbucketed one");
    }
    // The default shape's bucket has one dimension per bucketed key.
    int bucketed = 0;
    for (const auto& k : d.shape_keys) bucketed += k.bucketed;
    CHECK(autotune::bucket_of(op, autotune::default_shape(op)).ndim == bucketed);
    CHECK(parse_op(op_name(op)) == op);
  }
}

TEST_CASE("registry: every knob is an int field, and every value of every default space is legal") {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const auto& d = ops::definition(op);
    OpParams base = default_params(op);
    if (op == Op::mla_indexer) std::get<MlaIndexerParams>(base).num_heads = 64;
    REQUIRE(ops::knob_layout(op).position.size() == d.knobs.size());  // the registry resolved each
    for (size_t ki = 0; ki < d.knobs.size(); ++ki) {
      const auto& k = d.knobs[ki];
      INFO(op_name(op), ".", k.name);
      for (int v : k.space) {
        OpParams p = base;
        ops::knob_at(p, ki) = v;
        KernelSpec spec{p};
        CHECK_NOTHROW(spec.validate());
        // The generator (and the launch plan behind it) accepts it too: a knob value the plan
        // rejects must not be in the sweep.
        CHECK_NOTHROW(generate(spec));
      }
      if (k.has_auto) {
        OpParams p = base;
        ops::knob_at(p, ki) = 0;
        CHECK(autotune::has_auto_knobs(p));
        CHECK_NOTHROW(generate(KernelSpec{p}));
      }
    }
  }
}

TEST_CASE("registry: knob access by position reaches the named struct field") {
  OpParams p = MlaIndexerParams{};
  const auto& knobs = ops::definition(Op::mla_indexer).knobs;
  REQUIRE(knobs.size() == 3);
  for (size_t k = 0; k < knobs.size(); ++k) ops::knob_at(p, k) = 100 + static_cast<int>(k);
  const auto& m = std::get<MlaIndexerParams>(p);
  CHECK(m.block_kv == 100);    // knobs[0]
  CHECK(m.block_q == 101);     // knobs[1]
  CHECK(m.num_stages == 102);  // knobs[2]
  CHECK(m.num_heads == MlaIndexerParams{}.num_heads);  // nothing else written
  CHECK(m.top_k == MlaIndexerParams{}.top_k);
  // The mask marks exactly the knobs' positions in fields() order.
  const auto& layout = ops::knob_layout(Op::mla_indexer);
  CHECK(layout.mask == ((uint64_t{1} << layout.position[0]) | (uint64_t{1} << layout.position[1]) |
                        (uint64_t{1} << layout.position[2])));
  // The prefill has no knobs: b_topk has one legal value and the launch plan picks the rest.
  CHECK(ops::definition(Op::sparse_prefill).knobs.empty());
  CHECK(ops::knob_layout(Op::sparse_prefill).mask == 0);
}
