// Tuning records through the remote tier (autotune/remote_tuning.hpp).
#include "autotune/remote_tuning.hpp"

#include <map>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "jit/remote_cache.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"

namespace mlajit::autotune {

namespace {
constexpr const char* kCollection = "tuning";

size_t upload(const std::vector<TuningRecord>& records, RemoteCache& remote) {
  size_t added = 0;
  for (const auto& r : records) added += remote.add_record(kCollection, r.to_json().dump()) ? 1 : 0;
  return added;
}
}  // namespace

TuningShare push_tuning(const TuningDb& db, RemoteCache& remote) {
  TuningShare s;
  auto records = db.load();
  s.local = records.size();
  s.uploaded = upload(records, remote);
  return s;
}

TuningShare pull_tuning(const TuningDb& db, RemoteCache& remote) {
  TuningShare s;
  std::vector<TuningRecord> records;
  for (const auto& text : remote.records(kCollection)) {
    ++s.remote;
    try {
      // As every JSON input: nesting limit, duplicate keys refused.
      const auto j = parse_json_input(text, "remote tuning record", "record");
      records.push_back(TuningRecord::from_json(j, "remote tuning record"));
    } catch (const Error& e) {
      // Signed by the fleet but from another mlajit version (other params): not ours to use.
      log::debug("remote tuning record not understood by this build, skipped: {}", e.what());
    }
  }
  // Merge only what would change the file (a new key, or a faster record for a known key), so
  // that nodes starting up do not rewrite an up-to-date tuning.json every time.
  auto local = db.load();
  std::map<std::string, double> best;
  for (const auto& r : local) best[r.key()] = r.median_ms;
  bool news = false;
  for (const auto& r : records) {
    auto it = best.find(r.key());
    news = news || it == best.end() || r.median_ms < it->second;
  }
  s.merged = news ? db.merge(records) : local.size();
  s.local = s.merged;
  return s;
}

void pull_remote_tuning(const std::string& db_path) {
  if (RemoteCache* remote = RemoteCache::global()) {
    try {
      TuningShare s = pull_tuning(TuningDb(db_path), *remote);
      log::debug("tuning database {}: {} verified records from the remote cache, {} records now", db_path, s.remote, s.merged);
    } catch (const Error& e) {
      log::warn("could not merge the remote cache's tuning records into {}: {}", db_path, e.what());
    }
  }
}

void share_tuned_records(const std::vector<TuningRecord>& records) {
  if (RemoteCache* remote = RemoteCache::global()) {
    size_t n = upload(records, *remote);
    log::info("tune: {} of {} records uploaded to the remote cache {}", n, records.size(), remote->describe());
  }
}

}  // namespace mlajit::autotune
