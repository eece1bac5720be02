// runtime_info(): the facts `mlajit info` prints (include/mlajit/info.hpp).
#include "mlajit/info.hpp"

#include <fmt/format.h>

#include "mlajit/cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/version.hpp"

namespace mlajit {

nlohmann::json runtime_info() {
  nlohmann::json j;
  j["mlajit_version"] = MLAJIT_VERSION_STRING;
  j["cache_format_version"] = kCacheFormatVersion;
  std::string why;
  if (Compiler::available(&why)) j["nvrtc"] = Compiler::global().nvrtc_version();
  else j["nvrtc"] = nullptr, j["nvrtc_error"] = why;
  try {
    // The directory misses go to; with MLAJIT_CACHE_PATH, its writable layer (null: none).
    if (!config::env("MLAJIT_CACHE_PATH")) j["cache_dir"] = config::cache_dir();
    else if (auto w = writable_cache_dir_from_env()) j["cache_dir"] = *w;
    else j["cache_dir"] = nullptr, j["cache_dir_error"] = "every layer of MLAJIT_CACHE_PATH is read-only";
    nlohmann::json layers = nlohmann::json::array();
    for (auto& l : cache_layers_from_env())
      layers.push_back({{"dir", l.dir}, {"writable", l.writable}, {"exists", l.exists}});
    j["cache_layers"] = layers;
  } catch (const Error& e) {
    if (!j.contains("cache_dir")) j["cache_dir"] = nullptr;
    j["cache_layers"] = nullptr, j["cache_dir_error"] = e.what();
  }
  j["disk_cache_disabled"] = config::disk_cache_disabled();
  if (auto m = config::cache_max_bytes()) j["cache_max_bytes"] = *m;
  if (auto a = config::arch_override()) j["arch_override"] = *a;
  nlohmann::json env = nlohmann::json::object();
  for (const char* name : config::variables())
    if (auto v = config::env(name)) env[name] = *v;
  j["env"] = env;
  nlohmann::json devices = nlohmann::json::array();
  if (driver::available(&why)) {
    for (int d = 0; d < driver::device_count(); ++d) {
      auto info = driver::device_info(d);
      j["driver_version"] = info.driver_version;
      devices.push_back({{"ordinal", d},
                         {"name", info.name},
                         {"compute_capability", fmt::format("{}.{}", info.cc_major, info.cc_minor)},
                         {"arch", arch_for_compute_capability(info.cc_major, info.cc_minor)},
                         {"sm_count", info.sm_count},
                         {"memory_bytes", info.total_mem},
                         {"l2_bytes", info.l2_bytes},
                         {"max_smem_per_block_optin", info.max_smem_per_block_optin}});
    }
  } else {
    j["driver_error"] = why;
  }
  j["devices"] = devices;
  return j;
}

}  // namespace mlajit
