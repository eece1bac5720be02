#pragma once
// What this process would use: versions, NVRTC, cache directory and the environment knobs, devices.
// Shared by `mlajit info --json` and the C API's mlajit_info_json (Python: mlajit.info()).
#include <nlohmann/json.hpp>

namespace mlajit {

// Never throws for a missing driver/NVRTC/cache dir: those become "*_error" strings.
nlohmann::json runtime_info();

}  // namespace mlajit
