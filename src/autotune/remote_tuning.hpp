#pragma once
// The tuning database shared through the fleet's remote cache (jit/remote_cache.hpp): every
// record is a signed, content-addressed member of the "tuning" collection, so uploads add and
// never overwrite, and a download is merged into the local tuning.json by TuningDb::merge (equal
// keys keep the faster record; nothing is lost).
#include <cstddef>
#include <string>

#include "mlajit/autotune.hpp"

namespace mlajit {
class RemoteCache;
}

namespace mlajit::autotune {

struct TuningShare {
  size_t local = 0;     // records in the local database
  size_t uploaded = 0;  // of them, new to the remote
  size_t remote = 0;    // verified records downloaded (unverifiable ones are refused and counted)
  size_t merged = 0;    // records in the local database after merging them
};

// Uploads every record of `db`. Never throws for a failing remote (it is counted and warned about).
TuningShare push_tuning(const TuningDb& db, RemoteCache& remote);
// Downloads every verified record and merges those this build understands into `db`.
TuningShare pull_tuning(const TuningDb& db, RemoteCache& remote);
// Merges the remote's verified records into the database at `db_path` through the environment's
// remote tier, if one is configured (the run-time index calls it once, before it loads the file).
// Never throws.
void pull_remote_tuning(const std::string& db_path);
// Uploads freshly tuned records through the environment's remote tier, if one is configured.
void share_tuned_records(const std::vector<TuningRecord>& records);

}  // namespace mlajit::autotune
