// The op registry: one line per op, in MLAJIT_FOR_EACH_OP order (include/mlajit/params.hpp).
#include "mlajit/error.hpp"
#include "core/param_checks.hpp"
#include "core/op_definition.hpp"

namespace mlajit::ops {

// Each family's definition.cpp.
const OpDefinition& kv_cache_store_definition();
const OpDefinition& kv_cache_gather_definition();
const OpDefinition& sparse_index_remap_definition();
const OpDefinition& mla_indexer_definition();
const OpDefinition& sparse_prefill_definition();

namespace {

// Resolves knob names to positions in fields() order (once per op, in the registry).
struct KnobPositions {
  const std::vector<KnobDef>& knobs;
  KnobLayout layout;
  int pos = 0;
  void operator()(const char* name, int&) {
    for (size_t k = 0; k < knobs.size(); ++k)
      if (std::string_view(knobs[k].name) == name) {
        layout.position[k] = pos;
        layout.mask |= uint64_t{1} << pos;
      }
    ++pos;
  }
  template <class T>
  void operator()(const char*, T&) {
    ++pos;
  }
};

// The int field at a position in fields() order.
struct IntFieldAt {
  int want;
  int pos = 0;
  int* found = nullptr;
  void operator()(const char*, int& v) {
    if (pos++ == want) found = &v;
  }
  template <class T>
  void operator()(const char*, T&) {
    ++pos;
  }
};

template <class V>
void visit_fields(OpParams& p, V& v) {
  std::visit([&](auto& x) { std::decay_t<decltype(x)>::fields(x, v); }, p);
}

// Kernel names mark knobs as "_<tag><value>": a tag must be letters only (so the value that follows
// is unambiguous) and unique within its op.
void check_knob_tags(const OpDefinition& d) {
  for (size_t k = 0; k < d.knobs.size(); ++k) {
    const std::string_view tag = d.knobs[k].tag ? d.knobs[k].tag : "";
    bool letters = !tag.empty();
    for (char c : tag) letters = letters && c >= 'a' && c <= 'z';
    if (!letters)
      throw_error(ErrorKind::Internal, "op registry: knob {} of {} has name tag \"{}\", expected lowercase letters",
                  d.knobs[k].name, op_name(d.op), tag);
    for (size_t o = 0; o < k; ++o)
      if (tag == d.knobs[o].tag)
        throw_error(ErrorKind::Internal, "op registry: knobs {} and {} of {} share the name tag \"{}\"", d.knobs[o].name,
                    d.knobs[k].name, op_name(d.op), tag);
  }
}

struct Registry {
  const OpDefinition* defs[kNumOps];
  KnobLayout layouts[kNumOps];
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
      KnobPositions f{list[i]->knobs, {std::vector<int>(list[i]->knobs.size(), -1), 0}};
      OpParams p = default_params(static_cast<Op>(i));
      visit_fields(p, f);
      if (f.pos > 64) throw_error(ErrorKind::Internal, "op registry: {} has {} fields, KnobLayout holds 64", op_name(list[i]->op), f.pos);
      check_knob_tags(*list[i]);
      for (size_t k = 0; k < list[i]->knobs.size(); ++k)
        if (f.layout.position[k] < 0)
          throw_error(ErrorKind::Internal, "op registry: knob {} of {} is not an int field of its params",
                      list[i]->knobs[k].name, op_name(list[i]->op));
      layouts[i] = std::move(f.layout);
    }
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

int checked_index(Op op) {
  const int i = static_cast<int>(op);
  if (i < 0 || i >= kNumOps) throw_error(ErrorKind::Internal, "op registry: no op with index {}", i);
  return i;
}

}  // namespace

const OpDefinition& definition(Op op) { return *registry().defs[checked_index(op)]; }

const KnobLayout& knob_layout(Op op) { return registry().layouts[checked_index(op)]; }

int& knob_at(OpParams& p, size_t k) {
  IntFieldAt f{knob_layout(static_cast<Op>(p.index())).position.at(k)};
  visit_fields(p, f);
  return *f.found;
}

}  // namespace mlajit::ops
