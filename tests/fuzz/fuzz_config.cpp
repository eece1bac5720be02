// libFuzzer target: kernel-set configs and kernel specs (the JSON of `mlajit build --config`,
// `mlajit_op_create` and `mlajit_precompile`), parsed as the library parses every JSON input
// (parse_json_input: nesting limit, duplicate keys refused). Properties: every accepted spec
// round-trips through its JSON form to an equal spec with the same canonical text; every refusal
// is an mlajit::Error whose message is bounded and has no NUL byte (excerpts of hostile values).
// Besides libFuzzer's own mutations, a custom mutator duplicates an object member and wraps a
// value in nested arrays/objects around the nesting limit (tests/fuzz/json.dict has the tokens).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "fuzz_util.hpp"
#include "mlajit/kernel_set.hpp"
#include "mlajit/params.hpp"

using namespace mlajit;

namespace {

void check_round_trip(const KernelSpec& spec) {
  KernelSpec again = kernel_spec_from_json(to_json(spec), "round_trip");
  if (!(again == spec)) fuzz::broken("spec does not round-trip through to_json");
  if (again.canonical() != spec.canonical()) fuzz::broken("canonical text changed in a round trip");
  if (again.hash() != spec.hash()) fuzz::broken("hash changed in a round trip");
  (void)spec.name();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  bool parsed = false;
  fuzz::refused_or_ok_message([&] {
    j = parse_json_input(text, "config", "config");
    parsed = true;
  });
  if (!parsed) return 0;
  fuzz::refused_or_ok_message([&] {
    KernelSet set = kernel_set_from_json(j);
    for (auto& k : set.kernels) check_round_trip(k.spec);
  });
  fuzz::refused_or_ok_message([&] { check_round_trip(kernel_spec_from_json(j, "spec")); });
  return 0;
}

// The structural mutations (libFuzzer only: the unit suite's replay renames the entry point).
#ifndef LLVMFuzzerTestOneInput
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

// The end of the value starting at `i` (a scalar up to the next ',' '}' ']' at depth 0, or a
// bracketed value through its closing bracket); strings are skipped.
size_t value_end(const std::string& s, size_t i) {
  int depth = 0;
  bool in_string = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') ++depth;
    else if (c == ']' || c == '}') {
      if (depth == 0) return i;
      if (--depth == 0) return i + 1;
    } else if (c == ',' && depth == 0) return i;
  }
  return s.size();
}

// `"key": value` members: (start of the key's quote, end of the value).
std::vector<std::pair<size_t, size_t>> members(const std::string& s) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; (i = s.find("\":", i)) != std::string::npos; ++i) {
    size_t q = s.rfind('"', i == 0 ? 0 : i - 1);
    if (q == std::string::npos || q == i) continue;
    out.emplace_back(q, value_end(s, i + 2));
  }
  return out;
}

size_t store(const std::string& s, uint8_t* data, size_t max_size) {
  if (s.size() > max_size) return 0;
  std::memcpy(data, s.data(), s.size());
  return s.size();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  const unsigned pick = rng() % 8;
  if (pick >= 2 || size == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::string s(reinterpret_cast<const char*>(data), size);
  auto m = members(s);
  if (m.empty()) return LLVMFuzzerMutate(data, size, max_size);
  auto [begin, end] = m[rng() % m.size()];
  if (pick == 0) {
    // Duplicate key: the member again, in front of itself ({"a":1} -> {"a":1,"a":1}); a later
    // mutation may change the copy's value.
    s.insert(begin, s.substr(begin, end - begin) + ",");
  } else {
    // Nested value: the member's value wrapped in n arrays or objects, n around the limit.
    static const size_t kDepths[] = {1, 2, 63, 64, 65, 200, 5000};
    size_t n = kDepths[rng() % (sizeof kDepths / sizeof kDepths[0])];
    const size_t colon = s.find(':', begin);
    if (colon == std::string::npos || colon + 1 > end) return LLVMFuzzerMutate(data, size, max_size);
    const bool obj = rng() % 2;
    std::string open, close;
    for (size_t k = 0; k < n; ++k) {
      open += obj ? "{\"k\":" : "[";
      close += obj ? "}" : "]";
    }
    if (s.size() + open.size() + close.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
    s.insert(end, close);
    s.insert(colon + 1, open);
  }
  const size_t n = store(s, data, max_size);
  return n ? n : LLVMFuzzerMutate(data, size, max_size);
}
#endif
