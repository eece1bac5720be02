#pragma once
// Test-only fault injection for the tuner (TuneOptions::test_hooks). Never set in production code:
// they let the test suite exercise the tuner's failure paths deterministically.
#include <cstdint>
#include <functional>
#include <vector>

#include "mlajit/autotune.hpp"

namespace mlajit::autotune::detail {

struct TestHooks {
  // Called before a candidate is compiled; throwing an mlajit::Error there is recorded as that
  // candidate's compile failure.
  std::function<void(const KernelSpec&)> before_compile;
  // Called on every candidate's read-back output before it is compared with the reference; a
  // test corrupts one candidate's bytes to check that a wrong kernel is rejected.
  std::function<void(const KernelSpec&, std::vector<uint8_t>& output)> tamper_output;
};


}  // namespace mlajit::autotune::detail
