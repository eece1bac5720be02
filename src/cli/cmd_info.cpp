// mlajit info [--json]: versions, devices, cache dir, remote cache state.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/remote_report.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/info.hpp"
#include "mlajit/version.hpp"

namespace mlajit::cli {

int cmd_info(const Argv& argv) {
  Args args(argv, {"json"}, {});
  args.at_most(0);
  nlohmann::json j = runtime_info();
  const nlohmann::json& devices = j["devices"];
  // The remote tier: configured? the key acceptable? reachable (one PING, bounded by the timeouts)?
  nlohmann::json remote = {{"configured", false}};
  if (auto cfg = RemoteConfig::from_env()) {
    remote = {{"configured", true}, {"prefix", cfg->prefix}, {"ttl_s", cfg->ttl_s},
              {"connect_timeout_ms", cfg->timeouts.connect.count()}, {"timeout_ms", cfg->timeouts.command.count()},
              {"key_file", cfg->key_file}, {"allow_unsigned", cfg->allow_unsigned}};
    try {
      auto rc = RemoteCache::from_env();
      remote["url"] = rc->describe();
      remote["signed"] = rc->signing();
      std::string ping_error;
      remote["reachable"] = rc->ping(&ping_error);
      if (!ping_error.empty()) remote["error"] = ping_error;
      remote["counters"] = remote_counters_json(*rc);
    } catch (const Error& e) {
      remote["enabled"] = false;
      remote["error"] = e.what();
    }
    if (!remote.contains("enabled")) remote["enabled"] = true;
  }
  j["remote_cache"] = remote;
  if (args.flag("json")) {
    std::puts(j.dump(2).c_str());
    return 0;
  }
  std::printf("mlajit %s (cache format %u)\n", MLAJIT_VERSION_STRING, kCacheFormatVersion);
  std::printf("nvrtc:     %s\n", j["nvrtc"].is_null() ? ("unavailable: " + j["nvrtc_error"].get<std::string>()).c_str()
                                                       : j["nvrtc"].get<std::string>().c_str());
  std::printf("cache dir: %s%s\n",
              j["cache_dir"].is_null() ? j["cache_dir_error"].get<std::string>().c_str()
                                       : j["cache_dir"].get<std::string>().c_str(),
              config::disk_cache_disabled() ? " (disabled by MLAJIT_DISABLE_DISK_CACHE)" : "");
  if (j["cache_layers"].is_array() && j["cache_layers"].size() > 1)
    for (auto& l : j["cache_layers"])
      std::printf("  layer:   %s (%s)\n", l["dir"].get<std::string>().c_str(),
                  l["writable"].get<bool>() ? (l["exists"].get<bool>() ? "writable" : "writable, created on first use")
                                            : "read-only");
  if (!remote["configured"].get<bool>()) {
    std::printf("remote:    not configured (MLAJIT_REMOTE_CACHE)\n");
  } else if (!remote["enabled"].get<bool>()) {
    std::printf("remote:    OFF: %s\n", remote["error"].get<std::string>().c_str());
  } else {
    std::printf("remote:    %s, %s, prefix \"%s\", ttl %ld s, %s\n", remote["url"].get<std::string>().c_str(),
                remote["signed"].get<bool>() ? "signed (HMAC-SHA256)" : "UNSIGNED entries allowed",
                remote["prefix"].get<std::string>().c_str(), remote["ttl_s"].get<long>(),
                remote["reachable"].get<bool>() ? "reachable"
                                                : ("unreachable: " + remote["error"].get<std::string>()).c_str());
  }
  if (devices.empty()) std::printf("devices:   none (%s)\n", j["driver_error"].get<std::string>().c_str());
  for (auto& d : devices)
    std::printf("device %d:  %s, %s (cc %s), %d SMs, %.1f GiB, L2 %.0f MiB\n", d["ordinal"].get<int>(),
                d["name"].get<std::string>().c_str(), d["arch"].get<std::string>().c_str(),
                d["compute_capability"].get<std::string>().c_str(), d["sm_count"].get<int>(),
                d["memory_bytes"].get<double>() / (1 << 30), d["l2_bytes"].get<double>() / (1 << 20));
  return 0;
}

}  // namespace mlajit::cli
