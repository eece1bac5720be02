// The op registry: one line per op, in MLAJIT_FOR_EACH_OP order (include/mlajit/params.hpp).
#include "mlajit/error.hpp"
#include "ops/op_definition.hpp"

namespace mlajit::ops {

// Each family's definition.cpp.
const OpDefinition& kv_cache_store_definition();
const OpDefinition& kv_cache_gather_definition();
const OpDefinition& sparse_index_remap_definition();
const OpDefinition& mla_indexer_definition();
const OpDefinition& sparse_prefill_definition();

namespace {

struct Registry {
  const OpDefinition* defs[kNumOps];
  Registry() {
    const OpDefinition* list[] = {
        &kv_cache_store_definition(),
        &kv_cache_gather_definition(),
        &sparse_index_remap_definition(),
        &mla_indexer_definition(),
        &sparse_prefill_definition(),
    };
    static_assert(sizeof(list) / sizeof(list[0]) == kNumOps, "one registry line per MLAJIT_FOR_EACH_OP entry");
    for (int i = 0; i < kNumOps; ++i) {
      if (static_cast<int>(list[i]->op) != i)
        throw_error(ErrorKind::Internal, "op registry: entry {} defines op {}, expected {} (keep MLAJIT_FOR_EACH_OP order)",
                    i, op_name(list[i]->op), op_name(static_cast<Op>(i)));
      defs[i] = list[i];
    }
  }
};

}  // namespace

const OpDefinition& definition(Op op) {
  static const Registry r;
  const int i = static_cast<int>(op);
  if (i < 0 || i >= kNumOps) throw_error(ErrorKind::Internal, "op registry: no op with index {}", i);
  return *r.defs[i];
}

namespace {

struct KnobFinder {
  const char* name;
  int* found = nullptr;
  void operator()(const char* n, int& v) {
    if (std::string_view(n) == name) found = &v;
  }
  template <class T>
  void operator()(const char*, T&) {}
};

}  // namespace

int* knob_field(OpParams& p, const char* name) {
  return std::visit(
      [&](auto& x) {
        KnobFinder f{name};
        std::decay_t<decltype(x)>::fields(x, f);
        return f.found;
      },
      p);
}

}  // namespace mlajit::ops
