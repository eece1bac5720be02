#pragma once
// Orphaned per-key lock files of a disk cache (include/mlajit/cache.hpp: <key>.lock, flock).
// A lock file is orphaned when its entry does not exist, no process holds it and it is older than
// 2 s: its writer died between taking the lock and storing the entry (SIGKILL, OOM, power loss).
// Orphans are removed by the first writer of a process in the directory (a KeyLock or a put), by
// verify with removal and by prune; `mlajit cache verify` lists them.
#include <string>
#include <vector>

#include "mlajit/cache.hpp"

namespace mlajit {

// The orphaned lock files of the cache's writable layer (none without one); removed when `remove`.
// Never touches a lock a process holds.
std::vector<std::string> orphaned_lock_files(const DiskCache& cache, bool remove);

}  // namespace mlajit
