// Run-time lookup of tuned params: the ops' hot path. The database is read once per process into
// an immutable open-addressing table keyed by (device, problem hash, bucket); a lookup is a few
// integer hashes and probes, with no JSON, no allocation and no lock. Reloading publishes a new
// table with an atomic pointer swap; old tables stay alive (reloads are rare and small) so that a
// lookup racing a reload never reads freed memory.
#include <atomic>
#include <iterator>
#include <memory>
#include <mutex>

#include "autotune/remote_tuning.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"

namespace mlajit::autotune {

namespace {

uint64_t mix(uint64_t device, uint64_t problem, uint64_t bucket) {
  uint64_t z = device ^ (problem * 0x9e3779b97f4a7c15ull) ^ ((bucket << 17) | (bucket >> 47));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr int kMaxDevices = 64;

struct Global {
  std::mutex mu;
  std::atomic<const TuningIndex*> index{nullptr};
  std::vector<std::unique_ptr<TuningIndex>> all;  // every index ever published (kept alive)
  std::atomic<uint64_t> device_keys[kMaxDevices] = {};
};

Global& global() {
  static Global* g = new Global();  // never destroyed: ops may look up during static destruction
  return *g;
}

const TuningIndex* publish(std::unique_ptr<TuningIndex> idx) {
  Global& g = global();
  const TuningIndex* p = idx.get();
  g.all.push_back(std::move(idx));
  g.index.store(p, std::memory_order_release);
  return p;
}

// The records of one tuning.json (empty, with a warning, when it cannot be used).
std::vector<TuningRecord> load_records(const std::string& path) {
  try {
    return TuningDb(path).load();
  } catch (const Error& e) {
    log::warn("tuning database {} unusable, ops use their built-in heuristics for its records: {}", path, e.what());
    return {};
  }
}

// The index over the environment's (or one directory's) layers, the fleet's records pulled into
// the writable layer's file first.
std::unique_ptr<TuningIndex> load_index(const std::vector<std::string>& dirs, const std::string& writable_dir) {
  if (!writable_dir.empty()) pull_remote_tuning(TuningDb::default_path(writable_dir));  // no-op without MLAJIT_REMOTE_CACHE
  auto idx = std::make_unique<TuningIndex>(load_layered_tuning_index(dirs));
  log::debug("tuning database in {} layer(s): {} records for mlajit {}", dirs.size(), idx->size(), kVersion);
  return idx;
}

// The environment's layers (MLAJIT_CACHE_PATH / MLAJIT_CACHE_DIR / ...) as load_index wants them.
std::unique_ptr<TuningIndex> load_env_index() {
  std::vector<std::string> dirs;
  std::string writable;
  try {
    for (auto& layer : cache_layers_from_env()) {
      dirs.push_back(layer.dir);
      if (layer.writable) writable = layer.dir;
    }
  } catch (const Error& e) {
    log::warn("no usable cache directory, so no tuning database: {}", e.what());
    return std::make_unique<TuningIndex>();
  }
  return load_index(dirs, writable);
}

const TuningIndex& current_index() {
  Global& g = global();
  if (const TuningIndex* p = g.index.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lk(g.mu);
  if (const TuningIndex* p = g.index.load(std::memory_order_acquire)) return *p;
  return *publish(load_env_index());
}

}  // namespace

uint64_t device_key(const std::string& name, int sm_count) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return mix(h, static_cast<uint64_t>(sm_count), 0x5bd1e995);
}

struct TuningIndex::Table {
  struct Slot {
    uint64_t device = 0, problem = 0, bucket = 0;
    OpParams params;
    bool used = false;
  };
  std::vector<Slot> slots;  // open addressing, power-of-two size, load <= 1/2
  size_t count = 0;
};

TuningIndex::TuningIndex(const std::vector<TuningRecord>& records, const std::string& version) {
  const std::string want = version.empty() ? std::string(kVersion) : version;
  size_t n = 0;
  for (const auto& r : records) n += r.version == want;
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  auto t = std::make_shared<Table>();
  t->slots.resize(cap);
  for (const auto& r : records) {
    if (r.version != want) continue;
    Table::Slot s;
    s.device = device_key(r.device, r.sm_count);
    s.problem = problem_hash(r.params);
    s.bucket = r.bucket.hash();
    s.params = r.params;
    s.used = true;
    size_t i = mix(s.device, s.problem, s.bucket) & (cap - 1);
    while (t->slots[i].used) {
      const Table::Slot& o = t->slots[i];
      if (o.device == s.device && o.problem == s.problem && o.bucket == s.bucket) break;  // duplicate: last wins
      i = (i + 1) & (cap - 1);
    }
    if (!t->slots[i].used) ++t->count;
    t->slots[i] = std::move(s);
  }
  table_ = std::move(t);
}

size_t TuningIndex::size() const { return table_ ? table_->count : 0; }

const OpParams* TuningIndex::find(uint64_t device, const OpParams& problem, const ShapeBucket& bucket) const {
  if (!table_ || table_->count == 0) return nullptr;
  const uint64_t ph = problem_hash(problem), bh = bucket.hash();
  const auto& slots = table_->slots;
  const size_t mask = slots.size() - 1;
  for (size_t i = mix(device, ph, bh) & mask;; i = (i + 1) & mask) {
    const Table::Slot& s = slots[i];
    if (!s.used) return nullptr;
    // The variant index is part of the problem hash, but check it so that even a 64-bit hash
    // collision can never hand an op another op's params.
    if (s.device == device && s.problem == ph && s.bucket == bh && s.params.index() == problem.index())
      return &s.params;
  }
}

namespace {
thread_local bool tl_lookup_off = false;
}  // namespace

ScopedTuningLookupOff::ScopedTuningLookupOff() : previous_(tl_lookup_off) { tl_lookup_off = true; }
ScopedTuningLookupOff::~ScopedTuningLookupOff() { tl_lookup_off = previous_; }

const OpParams* tuned_params(const OpParams& problem, const ShapeBucket& bucket, int device_ordinal) {
  if (tl_lookup_off) return nullptr;
  if (device_ordinal < 0 || device_ordinal >= kMaxDevices) return nullptr;
  const TuningIndex& idx = current_index();
  if (idx.size() == 0) return nullptr;
  auto& slot = global().device_keys[device_ordinal];
  uint64_t dev = slot.load(std::memory_order_relaxed);
  if (dev == 0) {
    try {
      const auto info = driver::device_info(device_ordinal);
      dev = device_key(info.name, info.sm_count);
    } catch (const Error& e) {
      log::debug("tuning lookup: no device {}: {}", device_ordinal, e.what());
      return nullptr;
    }
    slot.store(dev, std::memory_order_relaxed);
  }
  return idx.find(dev, problem, bucket);
}

const OpParams* tuned_params(const OpParams& problem, const ShapeBucket& bucket) {
  if (tl_lookup_off) return nullptr;
  int ordinal = 0;
  try {
    ordinal = driver::ensure_context();
  } catch (const Error&) {
    return nullptr;
  }
  return tuned_params(problem, bucket, ordinal);
}

KernelSpec apply_tuning(const KernelSpec& spec, const ShapeBucket& bucket) {
  const OpParams* t = tuned_params(spec.params, bucket);
  if (!t) return spec;
  return std::visit(
      [&](const auto& p) -> KernelSpec {
        using P = std::decay_t<decltype(p)>;
        return KernelSpec{fill_auto_knobs(p, std::get<P>(*t))};
      },
      spec.params);
}

TuningIndex load_layered_tuning_index(const std::vector<std::string>& dirs) {
  // The index keeps the last of duplicate records, so the layers go in backwards.
  std::vector<TuningRecord> records;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    auto layer = load_records(TuningDb::default_path(*it));
    records.insert(records.end(), std::make_move_iterator(layer.begin()), std::make_move_iterator(layer.end()));
  }
  return TuningIndex(records);
}

void reload_tuning_index(const std::string& cache_dir) {
  Global& g = global();
  std::lock_guard<std::mutex> lk(g.mu);
  publish(cache_dir.empty() ? load_env_index() : load_index({cache_dir}, cache_dir));
}

}  // namespace mlajit::autotune
