// libFuzzer target: kernel-set configs and kernel specs (the JSON of `mlajit build --config`,
// `mlajit_op_create` and `mlajit_precompile`). Every accepted spec must round-trip through its
// JSON form to an equal spec with the same canonical text.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

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
  std::string text(reinterpret_cast<const char*>(data), size);
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  fuzz::refused_or_ok([&] {
    KernelSet set = kernel_set_from_json(j);
    for (auto& k : set.kernels) check_round_trip(k.spec);
  });
  fuzz::refused_or_ok([&] { check_round_trip(kernel_spec_from_json(j, "spec")); });
  return 0;
}
