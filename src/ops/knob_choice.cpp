// The once-per-choice knob log of the ops (ops/knob_choice.hpp).
#include "ops/knob_choice.hpp"

#include <mutex>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "mlajit/log.hpp"
#include "core/op_definition.hpp"

namespace mlajit::ops {

namespace {

// Where the value of knob k came from.
const char* knob_origin(const KnobDef& knob, int requested, int chosen, bool tuned) {
  if (!knob.has_auto || requested != 0) return "params";  // set in the call's params
  if (chosen == 0) return "plan";                       // still auto: the op's launch plan sizes it
  if (tuned) return "tuned";
  return "heuristic";
}

std::string bucket_text(Op op, const autotune::ShapeBucket& bucket) {
  const nlohmann::json sizes = bucket.to_json(op);  // named: items() must not outlive it
  std::string s;
  for (const auto& [key, value] : sizes.items()) s += fmt::format("{}{}={}", s.empty() ? "" : ",", key, value.dump());
  return s;
}

}  // namespace

std::string describe_knob_choice(const OpParams& requested, const OpParams& chosen, bool tuned,
                                 const autotune::ShapeBucket& bucket) {
  const Op op = static_cast<Op>(chosen.index());
  const auto& knobs = definition(op).knobs;
  std::string text;
  for (size_t k = 0; k < knobs.size(); ++k) {
    const int value = knob_at(chosen, k);
    text += fmt::format("{}{}={} ({})", text.empty() ? "" : " ", knobs[k].name, value == 0 ? "auto" : std::to_string(value),
                        knob_origin(knobs[k], knob_at(requested, k), value, tuned));
  }
  return fmt::format("{} for bucket {} runs {}: {}", op_name(op), bucket_text(op, bucket), KernelSpec{chosen}.name(),
                     text.empty() ? "no knobs" : text);
}

void log_knob_choice(const OpParams& requested, const OpParams& chosen, bool tuned, const autotune::ShapeBucket& bucket) {
  // A 64-bit digest per choice: a collision would only drop one log line.
  uint64_t id = KernelSpec{requested}.hash();
  for (uint64_t h : {static_cast<uint64_t>(KernelSpec{chosen}.hash()), bucket.hash(), uint64_t{tuned}})
    id = (id ^ h) * 0x100000001b3ull + (id >> 29);
  static std::mutex mu;
  static std::unordered_set<uint64_t> seen;  // buckets are powers of two: the set stays small
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!seen.insert(id).second) return;
  }
  log::info("{}", describe_knob_choice(requested, chosen, tuned, bucket));
}

}  // namespace mlajit::ops
