// Parsing of kernel-set configs and expansion of their sweeps.
#include "mlajit/kernel_set.hpp"

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "mlajit/error.hpp"

namespace mlajit {

using nlohmann::json;

namespace {
// Limits far above any real kernel set (the DeepSeek-V3.2 config has 9 kernels).
constexpr size_t kMaxSweepKernels = 4096;
constexpr size_t kMaxConfigKernels = 16384;
}  // namespace

std::vector<KernelSetEntry> expand_sweep(const json& entry, const std::string& path, int group) {
  if (!entry.is_object()) throw_invalid(path, json_excerpt(entry), "an object {\"op\", \"params\", \"sweep\"}");
  json base = json::object();
  json sweep = json::object();
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() == "sweep") sweep = it.value();
    else base[it.key()] = it.value();
  }
  if (!sweep.is_object()) throw_invalid(path + ".sweep", json_excerpt(sweep), "an object of field -> list of values");
  json params = base.contains("params") ? base["params"] : json::object();
  if (!params.is_object()) throw_invalid(path + ".params", json_excerpt(params), "a JSON object of params");

  std::vector<std::pair<std::string, json>> axes;
  for (auto it = sweep.begin(); it != sweep.end(); ++it) {
    if (!it.value().is_array() || it.value().empty())
      throw_invalid(path + ".sweep" + path_key(it.key()), json_excerpt(it.value()), "a non-empty list of values");
    if (params.contains(it.key()))
      throw_invalid(path + ".sweep" + path_key(it.key()), "a field also set in params", "each field either in params or in sweep");
    axes.emplace_back(it.key(), it.value());
  }

  // The product is checked before anything is expanded: a few short lists can multiply to more
  // kernels than any build would want (and than memory holds).
  size_t count = 1;
  for (auto& ax : axes) {
    if (ax.second.size() > kMaxSweepKernels / count)
      throw_invalid(path + ".sweep", "a product of more than " + std::to_string(kMaxSweepKernels) + " kernels",
                    fmt::format("at most {} kernels per config entry", kMaxSweepKernels));
    count *= ax.second.size();
  }

  std::vector<KernelSetEntry> out;
  std::vector<size_t> idx(axes.size(), 0);
  while (true) {
    json p = params;
    std::string label;
    for (size_t a = 0; a < axes.size(); ++a) {
      p[axes[a].first] = axes[a].second[idx[a]];
      const std::string step = path_key(axes[a].first);
      label += fmt::format(" {}={}", step[0] == '.' ? step.substr(1) : step, json_excerpt(axes[a].second[idx[a]], 60));
    }
    json k = base;
    k["params"] = p;
    if (label.size() > kMaxExcerptChars) label = label.substr(0, kMaxExcerptChars) + " ...";
    std::string where = path + (label.empty() ? "" : " (sweep" + label + ")");
    out.push_back({kernel_spec_from_json(k, where), where, group});
    // Advance the odometer, last axis fastest.
    size_t a = axes.size();
    while (a > 0) {
      --a;
      if (++idx[a] < axes[a].second.size()) break;
      idx[a] = 0;
      if (a == 0) return out;
    }
    if (axes.empty()) return out;
  }
}

KernelSet kernel_set_from_json(const json& j) {
  if (!j.is_object()) throw_invalid("config", j.type_name(), "a JSON object {\"arch\", \"kernels\"}");
  check_json_depth(j, "config");  // a value built by the caller: the walks below stay within the limit
  KernelSet set;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "arch") {
      if (!it.value().is_string()) throw_invalid("config.arch", json_excerpt(it.value()), "a string like \"sm_90a\"");
      set.arch = it.value().get<std::string>();
    } else if (k == "kernels") {
      if (!it.value().is_array()) throw_invalid("config.kernels", json_excerpt(it.value()), "a list of kernels");
    } else if (k != "description" && k != "comment") {
      throw_invalid("config", fmt::format("unknown field {}", json_quoted(k)), "arch, kernels, description");
    }
  }
  auto kit = j.find("kernels");
  if (kit == j.end() || kit->empty()) throw_invalid("config.kernels", "nothing", "a non-empty list of kernels");
  for (size_t i = 0; i < kit->size(); ++i) {
    auto entries = expand_sweep((*kit)[i], fmt::format("kernels[{}]", i), static_cast<int>(i));
    set.kernels.insert(set.kernels.end(), entries.begin(), entries.end());
    if (set.kernels.size() > kMaxConfigKernels)
      throw_invalid(fmt::format("kernels[{}]", i), fmt::format("{} kernels so far", set.kernels.size()),
                    fmt::format("at most {} kernels per config", kMaxConfigKernels));
  }
  return set;
}

KernelSet load_kernel_set(const std::string& path) {
  const std::string text = read_input_file(path, "config file", kMaxJsonFileBytes);
  return kernel_set_from_json(parse_json_input(text, fmt::format("config file {}", path), "config"));
}

}  // namespace mlajit
