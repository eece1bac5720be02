#pragma once
// A kernel set: the JSON config that build pipelines pre-compile and tuning sweeps expand.
//
//   {"arch": "sm_90a", "kernels": [
//     {"op": "sparse_prefill", "params": {"kv_dtype": "bf16", "num_q_heads": 128},
//      "sweep": {"page_size": [64, 16]}}]}
//
// Each entry's `sweep` object expands fields into their cartesian product (in the order the fields
// appear sorted by name, last field fastest). Every expanded spec is validated; errors name the
// JSON path (e.g. "kernels[2].sweep.page_size[1]"). One entry expands to at most 4096 kernels, a config
// to at most 16384; larger products are refused before anything is expanded.
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mlajit/params.hpp"

namespace mlajit {

struct KernelSetEntry {
  KernelSpec spec;
  std::string origin;  // JSON path it came from, e.g. "kernels[1]" or "kernels[1] page_size=16"
  int group = 0;       // index of the config entry it was expanded from
};

struct KernelSet {
  std::string arch;  // "" = the current device's (or MLAJIT_ARCH)
  std::vector<KernelSetEntry> kernels;
};

KernelSet kernel_set_from_json(const nlohmann::json& j);
// Reads and parses a config file; a missing file or bad JSON is Error(InvalidArgument) naming the file.
KernelSet load_kernel_set(const std::string& path);
// Expands one `{"op", "params", "sweep"}` entry (sweep optional).
std::vector<KernelSetEntry> expand_sweep(const nlohmann::json& entry, const std::string& path, int group = 0);

}  // namespace mlajit
