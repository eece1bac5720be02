// Tune candidates: a config's entries expanded into groups of competing specs. An entry with a
// `sweep` expands as the kernel-set format says; an entry without one gets its op's default knob
// space. Specs of one entry with different non-knob params (a sweep over dtype, say) compute
// different things, so they are split into separate groups; every group also contains its default
// configuration, the reference all candidates' outputs are checked against.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/error.hpp"

namespace mlajit::autotune {

using nlohmann::json;

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<KernelSetEntry> expand_entry(const json& entry, const std::string& path, int index, bool* default_space) {
  *default_space = false;
  if (!entry.is_object()) throw_invalid(path, json_excerpt(entry), "an object {\"op\", \"params\", \"sweep\"}");
  if (entry.contains("sweep")) return expand_sweep(entry, path, index);
  auto op_it = entry.find("op");
  if (op_it == entry.end() || !op_it->is_string()) throw_invalid(path + ".op", json_excerpt(entry), "an op name string");
  const Op op = parse_op(op_it->get<std::string>(), path + ".op");
  const json params = entry.value("params", json::object());
  json space = json::object();
  const json defaults = default_knob_space(op);
  for (auto it = defaults.begin(); it != defaults.end(); ++it)
    if (!params.is_object() || !params.contains(it.key())) space[it.key()] = it.value();
  json swept = entry;
  if (!space.empty()) {
    swept["sweep"] = space;
    *default_space = true;
  }
  return expand_sweep(swept, path, index);
}

}  // namespace

std::vector<TuneGroup> tune_groups_from_config(const json& config) {
  // The kernel-set parser checks the top level (unknown fields, arch type, empty list) and every
  // entry with its JSON path, so a bad config fails here exactly as `mlajit build` would.
  (void)kernel_set_from_json(config);
  const json& kernels = config.at("kernels");
  std::vector<TuneGroup> groups;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const std::string path = fmt::format("kernels[{}]", i);
    bool default_space = false;
    auto entries = expand_entry(kernels[i], path, static_cast<int>(i), &default_space);
    const size_t first_group = groups.size();
    for (auto& e : entries) {
      const uint64_t problem = problem_hash(e.spec.params);
      auto it = std::find_if(groups.begin() + first_group, groups.end(),
                             [&](const TuneGroup& g) { return problem_hash(g.default_spec.params) == problem; });
      if (it == groups.end()) {
        TuneGroup g;
        g.entry = static_cast<int>(i);
        g.origin = path;
        g.default_spec = KernelSpec{default_knobs(e.spec.params)};
        g.default_spec.validate();
        g.default_space = default_space;
        groups.push_back(std::move(g));
        it = groups.end() - 1;
      }
      const std::string canon = e.spec.canonical();
      const bool dup = std::any_of(it->candidates.begin(), it->candidates.end(),
                                   [&](const KernelSetEntry& c) { return c.spec.canonical() == canon; });
      if (!dup) it->candidates.push_back(std::move(e));
    }
    for (auto g = groups.begin() + first_group; g != groups.end(); ++g) {
      const std::string def = g->default_spec.canonical();
      const bool has_default = std::any_of(g->candidates.begin(), g->candidates.end(),
                                           [&](const KernelSetEntry& c) { return c.spec.canonical() == def; });
      if (!has_default) g->candidates.insert(g->candidates.begin(), {g->default_spec, path + " (default)", g->entry});
      // The signature identifies the sweep regardless of order, so that a rerun of the same sweep
      // is a database hit and a different sweep is tuned again.
      std::vector<std::string> knob_sets;
      for (const auto& c : g->candidates) knob_sets.push_back(knobs_of(c.spec.params).dump());
      std::sort(knob_sets.begin(), knob_sets.end());
      uint64_t sig = 1469598103934665603ull;
      for (const auto& k : knob_sets) sig = fnv1a(k + ";", sig);
      g->sweep_signature = sig;
    }
  }
  return groups;
}

std::vector<TuneGroup> load_tune_groups(const std::string& config_path, std::string* arch) {
  const json j = parse_json_input(read_input_file(config_path, "config file", kMaxJsonFileBytes),
                                  fmt::format("config file {}", config_path), "config");
  auto groups = tune_groups_from_config(j);
  if (arch) *arch = j.is_object() && j.contains("arch") && j["arch"].is_string() ? j["arch"].get<std::string>() : "";
  return groups;
}

}  // namespace mlajit::autotune
