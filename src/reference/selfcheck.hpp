#pragma once
// Self-check of one kernel spec on the GPU: random inputs per SPEC §4 (ragged batch with cache
// lengths, shuffled pages, last layer of several, invalid indices), the op launched through ops::,
// the result compared with the CPU reference. Used by `mlajit check` (the README's main job).
#include <cstdint>
#include <string>

#include "mlajit/params.hpp"

namespace mlajit::ref {

struct CheckResult {
  bool passed = false;
  std::string metric;  // what was compared, e.g. "bytes equal", "rel_frob 3.1e-3 cos 0.99999"
  double gpu_ms = 0;   // wall time of the launch (incl. first-use load), for the table
};

CheckResult check_spec(const KernelSpec& spec, uint64_t seed = 1);

}  // namespace mlajit::ref
