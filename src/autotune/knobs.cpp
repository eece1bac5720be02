// Tuning knobs: which params fields an autotuner may change (speed only, never the result beyond
// float rounding), each op's default knob space, and the hash of everything that is *not* a knob
// (the problem identity of a tuning-database entry). The hash walks the struct fields directly so
// that the ops' per-call lookup does no JSON and no allocation; tests/unit/test_autotune.cpp checks
// that every field params_to_json writes is either a knob or changes the hash, so a field added to
// params.hpp later cannot silently share tuning entries.
#include <type_traits>

#include <nlohmann/json.hpp>

#include "mlajit/autotune.hpp"
#include "core/param_checks.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"

namespace mlajit::autotune {

using nlohmann::json;

namespace {

// A multiply-xorshift over whole 64-bit words (two dependent operations per field: this runs on
// every op call), finished with a splitmix64 mix so that nearby inputs spread. The hash is never
// stored (the database keeps the params; indexes rehash them at load), so it may change freely.
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
  }
  uint64_t done() const {
    uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// Hashes every field of a params struct except its knobs (by position: no name compares).
struct NonKnobHasher {
  Hasher& h;
  uint64_t knob_mask;
  int pos = 0;
  bool skip() { return (knob_mask >> pos++) & 1; }
  void operator()(const char*, const int& v) {
    if (!skip()) h.add(static_cast<uint64_t>(v));
  }
  void operator()(const char*, const bool& v) {
    if (!skip()) h.add(v ? 1 : 0);
  }
  template <class E>
  void operator()(const char*, const E& v) {
    if (!skip()) h.add(static_cast<uint64_t>(v));
  }
};

// The knob table of `op`, as names (std::string, for the JSON-facing API).
const std::vector<std::vector<std::string>>& all_knob_names() {
  static const std::vector<std::vector<std::string>> names = [] {
    std::vector<std::vector<std::string>> out(kNumOps);
    for (int i = 0; i < kNumOps; ++i)
      for (const auto& k : ops::definition(static_cast<Op>(i)).knobs) out[i].push_back(k.name);
    return out;
  }();
  return names;
}

template <class P>
P fill_auto(const P& p, const P& tuned) {
  OpParams out{p};
  const OpParams t{tuned};
  const auto& knobs = ops::definition(static_cast<Op>(out.index())).knobs;
  for (size_t k = 0; k < knobs.size(); ++k)
    if (knobs[k].has_auto && ops::knob_at(out, k) == 0) ops::knob_at(out, k) = ops::knob_at(t, k);
  return std::get<P>(out);
}

}  // namespace

const std::vector<std::string>& knob_names(Op op) { return all_knob_names().at(static_cast<size_t>(op)); }

json default_knob_space(Op op) {
  json space = json::object();
  for (const auto& k : ops::definition(op).knobs)
    if (!k.space.empty()) space[k.name] = k.space;
  return space;
}

json knobs_of(const OpParams& p) {
  json out = json::object();
  const auto& knobs = ops::definition(static_cast<Op>(p.index())).knobs;
  for (size_t k = 0; k < knobs.size(); ++k) out[knobs[k].name] = ops::knob_at(p, k);
  return out;
}

OpParams default_knobs(const OpParams& p) {
  OpParams out = p;
  const OpParams defaults = default_params(static_cast<Op>(p.index()));
  for (size_t k = 0; k < ops::definition(static_cast<Op>(p.index())).knobs.size(); ++k)
    ops::knob_at(out, k) = ops::knob_at(defaults, k);
  // Auto knobs as the ops would resolve them without a tuning record.
  return with_heuristic_knobs(out);
}

// "auto" is 0 for the knobs that have an auto value; the others are never overridden, because a
// value there is the caller's explicit choice.
#define MLAJIT_FILL_AUTO_(name, P) \
  P fill_auto_knobs(const P& p, const P& tuned) { return fill_auto(p, tuned); }
MLAJIT_FOR_EACH_OP(MLAJIT_FILL_AUTO_)
#undef MLAJIT_FILL_AUTO_

bool has_auto_knobs(const OpParams& params) {
  const auto& knobs = ops::definition(static_cast<Op>(params.index())).knobs;
  for (size_t k = 0; k < knobs.size(); ++k)
    if (knobs[k].has_auto && ops::knob_at(params, k) == 0) return true;
  return false;
}

uint64_t problem_hash(const OpParams& params) {
  Hasher h;
  h.add(static_cast<uint64_t>(params.index()) + 0x100);
  NonKnobHasher v{h, ops::knob_layout(static_cast<Op>(params.index())).mask};
  std::visit([&](const auto& p) { std::decay_t<decltype(p)>::fields(p, v); }, params);
  return h.done();
}

}  // namespace mlajit::autotune
