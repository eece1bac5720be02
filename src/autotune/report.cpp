// The tune report as JSON (`mlajit tune --json`: every candidate's params, compile time, status and
// timings per device) and as CSV (`--csv F`: one row per candidate and device, one column per
// knob, for plotting; timing cells are empty for candidates that were not timed, `reason` says why).
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mlajit/autotune.hpp"

namespace mlajit::autotune {

using nlohmann::json;

namespace {

json timing_json(const Timing& t) {
  return json{{"median_ms", t.median_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms}, {"reps", t.reps}};
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return out + "\"";
}

// Why a row has no timings when the tuner recorded no reason of its own.
std::string untimed_reason(const std::string& status) {
  if (status == "compiled") return "compiled only: no GPU timing in this run";
  if (status == "not_compiled") return "not compiled";
  if (status == "db_hit") return "tuned before: the database already held this sweep";
  if (status == "pending") return "not reached: timing stopped before this candidate";
  return status;
}

}  // namespace

json TuneReport::to_json() const {
  json j = {{"jobs", jobs},
            {"archs", archs},
            {"gpu", gpu},
            {"compile_seconds", compile_seconds},
            {"timing_seconds", timing_seconds},
            {"total_seconds", total_seconds},
            {"database", db_path},
            {"database_records_written", db_written},
            {"groups", json::array()}};
  if (!gpu) j["no_gpu_reason"] = no_gpu_reason;
  if (!db_error.empty()) j["database_error"] = db_error;
  size_t compiled = 0, cache_hits = 0, failed = 0;
  for (const auto& g : groups) {
    const Op op = g.group.default_spec.op();
    json jg = {{"origin", g.group.origin},
               {"op", std::string(op_name(op))},
               {"name", g.group.default_spec.name()},
               {"params", params_to_json(g.group.default_spec.params)},
               {"default_knob_space", g.group.default_space},
               {"shape", g.shape},
               {"bucket", g.bucket.to_json(op)},
               {"devices_agree", g.devices_agree},
               {"candidates", json::array()},
               {"devices", json::array()}};
    for (const auto& c : g.candidates) {
      compiled += c.compiled;
      cache_hits += c.compiled && c.cache_hit;
      failed += !c.compile_error.empty();
      json jc = {{"origin", c.origin},
                 {"knobs", knobs_of(c.spec.params)},
                 {"params", params_to_json(c.spec.params)},
                 {"is_default", c.is_default},
                 {"compiled", c.compiled},
                 {"cache_hit", c.cache_hit},
                 {"compile_seconds", c.compile_seconds},
                 {"nvrtc_seconds", c.nvrtc_seconds},
                 {"smem_bytes", c.smem_bytes},
                 {"devices", json::array()}};
      if (!c.compile_error.empty()) jc["compile_error"] = c.compile_error;
      for (const auto& d : c.devices) {
        json jd = {{"device", d.device}, {"status", d.status}};
        if (!d.reason.empty()) jd["reason"] = d.reason;
        if (d.status == "ok") jd.update(timing_json(d.timing));
        if (d.status == "db_hit" && d.timing.median_ms > 0) jd["median_ms"] = d.timing.median_ms;
        jc["devices"].push_back(jd);
      }
      jg["candidates"].push_back(jc);
    }
    for (const auto& d : g.devices) {
      json jd = {{"device", d.device}, {"name", d.device_name}, {"sm_count", d.sm_count}, {"from_db", d.from_db}};
      if (d.winner >= 0) {
        jd["winner"] = d.winner;
        jd["winner_knobs"] = knobs_of(g.candidates[d.winner].spec.params);
      } else if (d.from_db) {
        jd["winner_knobs"] = d.db_knobs;
      } else {
        jd["winner"] = nullptr;
      }
      jd["best_ms"] = d.best_ms;
      jd["default_ms"] = d.default_ms;
      if (d.best_ms > 0 && d.default_ms > 0) jd["speedup_over_default"] = d.default_ms / d.best_ms;
      jg["devices"].push_back(jd);
    }
    j["groups"].push_back(jg);
  }
  j["candidates_compiled"] = compiled;
  j["cache_hits"] = cache_hits;
  j["compile_failures"] = failed;
  return j;
}

std::string TuneReport::to_csv() const {
  // One column per knob of the ops in the report (first seen first), so that a plot reads a knob
  // as a number; a cell stays empty where the row's op has no such knob.
  std::vector<std::string> knob_columns;
  for (const auto& g : groups)
    for (const auto& k : knob_names(g.group.default_spec.op()))
      if (std::find(knob_columns.begin(), knob_columns.end(), k) == knob_columns.end()) knob_columns.push_back(k);

  std::string out = "group,origin,op,name";
  for (const auto& k : knob_columns) out += "," + csv_field(k);
  out += ",is_default,compiled,cache_hit,compile_seconds,device,status,median_ms,min_ms,max_ms,reps,winner,reason\n";
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    for (size_t ci = 0; ci < g.candidates.size(); ++ci) {
      const auto& c = g.candidates[ci];
      const json knobs = knobs_of(c.spec.params);
      std::string knob_cells;
      for (const auto& k : knob_columns) knob_cells += "," + (knobs.contains(k) ? knobs[k].dump() : std::string());
      // Timings only where the candidate was timed (status ok, or a stored median); every other
      // row leaves them empty and says why in `reason`.
      auto row = [&](const std::string& device, const std::string& status, const Timing& t, bool winner,
                     std::string reason) {
        const bool timed = status == "ok";
        const bool stored_median = status == "db_hit" && t.median_ms > 0;
        if (reason.empty() && !timed) reason = untimed_reason(status);
        out += fmt::format("{},{},{},{}{},{},{},{},{},{},{},{},{},{},{},{},{}\n", gi, csv_field(c.origin),
                           op_name(c.spec.op()), csv_field(c.spec.name()), knob_cells, c.is_default ? 1 : 0,
                           c.compiled ? 1 : 0, c.cache_hit ? 1 : 0,
                           c.compiled ? fmt::format("{:.4f}", c.compile_seconds) : std::string(), device, status,
                           timed || stored_median ? fmt::format("{:.6f}", t.median_ms) : std::string(),
                           timed ? fmt::format("{:.6f}", t.min_ms) : std::string(),
                           timed ? fmt::format("{:.6f}", t.max_ms) : std::string(),
                           timed ? std::to_string(t.reps) : std::string(), winner ? 1 : 0, csv_field(reason));
      };
      if (c.devices.empty()) {
        row("", c.compiled ? "compiled" : "not_compiled", {}, false, c.compile_error);
        continue;
      }
      for (size_t di = 0; di < c.devices.size(); ++di) {
        const auto& d = c.devices[di];
        const bool win = di < g.devices.size() && g.devices[di].winner == static_cast<int>(ci);
        row(std::to_string(d.device), d.status, d.timing, win, d.reason);
      }
    }
  }
  return out;
}

}  // namespace mlajit::autotune
