#pragma once
// Autotuning: sweep an op's tuning knobs, compile every variant in parallel, time them on every
// visible GPU (verified against the default configuration's output), and remember the winner per
// device and problem-shape bucket in a persistent tuning database that the ops consult at run time.
//
// The pieces, in pipeline order:
//   knobs        which params fields are tuning knobs (change speed, not results) and each op's
//                default knob space (src/autotune/knobs.cpp)
//   shapes       named dynamic sizes of a problem (tokens, batch, ...) and their power-of-two
//                buckets (src/autotune/shape.cpp)
//   candidates   a config's entries -> groups of competing specs (src/autotune/candidates.cpp)
//   workloads    per op: inputs on the GPU for a shape, run a spec, read the output back, compare
//                (src/ops/<family>/tuning_workload.cpp)
//   timing       CUDA-event timing with an L2 flush between repetitions (src/autotune/timing.cpp)
//   tuner        parallel compile -> per-device verify + time -> winners (src/autotune/tune.cpp)
//   database     <cache_dir>/tuning.json, merged under a file lock (src/autotune/database.cpp)
//   lookup       the in-memory index the ops query on every call (src/autotune/lookup.cpp)
//
// How an op uses the tuning database (hot path, no JSON, no allocation, no lock):
//
//   KvCacheStoreParams p = caller_params;                       // knobs 0 = "auto"
//   const auto bucket = autotune::bucket_kv_cache_store(x.size(0), input_row_offsets.size(0) - 1);
//   if (const OpParams* t = autotune::tuned_params(p, bucket))  // best for this device and bucket
//     p = autotune::fill_auto_knobs(p, std::get<KvCacheStoreParams>(*t));
//   ...otherwise the op's built-in heuristic fills the auto knobs...
//
// or in one call: `KernelSpec spec = autotune::apply_tuning(KernelSpec{p}, bucket);` which returns
// the spec with every auto knob replaced by the tuned value (unchanged when nothing is tuned).
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlajit/kernel_set.hpp"
#include "mlajit/params.hpp"
#include "mlajit/tensor.hpp"

namespace mlajit::autotune {

// ================================================================================================
// Knobs
// ================================================================================================

// The tuning knobs of `op` (params fields that change speed, never the result beyond float
// rounding), e.g. {"threads"} for the kv ops, {"block_q", "block_kv", "num_stages"} for the indexer.
const std::vector<std::string>& knob_names(Op op);
// The knob space tried when a config entry has no `sweep`, as a sweep object:
//   kv_cache_store / kv_cache_gather / sparse_index_remap: {"threads": [64, 128, 256, 512]}
//   mla_indexer:    {"num_stages": [2, 3, 4, 5]} (its only swept knob; block_q / block_kv are pinnable)
//   sparse_prefill: {} (no knobs: the launch plan picks the kernel and its geometry)
nlohmann::json default_knob_space(Op op);
// The knob values of `p` as a JSON object, e.g. {"threads": 256}.
nlohmann::json knobs_of(const OpParams& p);
// `p` with its knobs reset to the op's defaults (the params struct defaults, auto knobs resolved
// by the built-in heuristic, params.hpp with_heuristic_knobs): the "default configuration" every
// candidate is checked against.
OpParams default_knobs(const OpParams& p);
// `p` with every knob whose value means "auto" (0) taken from `tuned` (same op). Knobs without an
// auto value are left as they are.
KvCacheStoreParams fill_auto_knobs(const KvCacheStoreParams& p, const KvCacheStoreParams& tuned);
KvCacheGatherParams fill_auto_knobs(const KvCacheGatherParams& p, const KvCacheGatherParams& tuned);
SparseIndexRemapParams fill_auto_knobs(const SparseIndexRemapParams& p, const SparseIndexRemapParams& tuned);
MlaIndexerParams fill_auto_knobs(const MlaIndexerParams& p, const MlaIndexerParams& tuned);
SparsePrefillParams fill_auto_knobs(const SparsePrefillParams& p, const SparsePrefillParams& tuned);
// True when `p` leaves at least one knob at "auto" (0): exactly the knobs fill_auto_knobs fills.
// Ops skip the tuning lookup when it is false.
bool has_auto_knobs(const OpParams& p);
// A 64-bit hash of the op and every non-knob field of `p`: two params share tuning entries iff
// their problem hashes are equal (an fp8 store and a bf16 store never do). No JSON, no allocation.
uint64_t problem_hash(const OpParams& p);

// ================================================================================================
// Shapes and buckets
// ================================================================================================

// A problem shape: the op's dynamic sizes by name, e.g. {"tokens": 65536, "batch": 8}.
using Shape = std::map<std::string, int64_t>;

struct ShapeKey {
  const char* name;
  int64_t default_value;
  bool bucketed;     // part of the tuning bucket (an op knows it on the host at call time)
  const char* help;
};
// The shape keys of `op`, bucketed ones first in bucket order.
const std::vector<ShapeKey>& shape_keys(Op op);
Shape default_shape(Op op);
// Sets `key=value` pairs of "k=v,k=v" on top of `shape`; a key `op` does not have is an
// Error(InvalidArgument) listing the keys it has.
Shape parse_shape(Op op, const std::string& text, Shape shape);
std::string describe_shape(const Shape& s);  // "batch=8,tokens=65536"

// The tuning bucket of a shape: every bucketed size rounded up to a power of two (stored as log2).
// Sizes <= 1 map to 2^0. Cheap to build and hash (the ops build one per call).
struct ShapeBucket {
  static constexpr int kMaxDims = 4;
  uint8_t log2[kMaxDims] = {0, 0, 0, 0};
  uint8_t ndim = 0;

  static ShapeBucket of(std::initializer_list<int64_t> sizes);
  uint64_t hash() const;
  bool operator==(const ShapeBucket& o) const;
  bool operator!=(const ShapeBucket& o) const { return !(*this == o); }
  // {"tokens": 65536, "batch": 8} with the names of `op`'s bucketed keys.
  nlohmann::json to_json(Op op) const;
  static ShapeBucket from_json(Op op, const nlohmann::json& j, const std::string& path);
};
ShapeBucket bucket_of(Op op, const Shape& shape);

// The bucket an op builds at call time from the sizes it has on the host:
inline ShapeBucket bucket_kv_cache_store(int64_t tokens, int64_t batch) { return ShapeBucket::of({tokens, batch}); }
inline ShapeBucket bucket_kv_cache_gather(int64_t tokens) { return ShapeBucket::of({tokens}); }
inline ShapeBucket bucket_sparse_index_remap(int64_t tokens, int64_t top_k) { return ShapeBucket::of({tokens, top_k}); }
inline ShapeBucket bucket_mla_indexer(int64_t tokens, int64_t batch, int64_t max_keys_per_seq) {
  return ShapeBucket::of({tokens, batch, max_keys_per_seq});
}
inline ShapeBucket bucket_sparse_prefill(int64_t tokens, int64_t indices_stride) {
  return ShapeBucket::of({tokens, indices_stride});
}

// ================================================================================================
// Candidates
// ================================================================================================

// Specs that compete: one config entry's expansion with equal non-knob params (a sweep over a
// non-knob field such as dtype splits an entry into several groups).
struct TuneGroup {
  int entry = 0;                       // index of the config entry
  std::string origin;                  // "kernels[2]"
  KernelSpec default_spec;             // the candidates' params with default knobs (the reference)
  std::vector<KernelSetEntry> candidates;  // includes the default spec (exactly once)
  bool default_space = false;          // the entry had no sweep: the op's default knob space was used
  uint64_t sweep_signature = 0;        // hash of the candidates' knob sets (order-independent)
};
// Expands a config ({"kernels": [...]}, the kernel-set format) into tune groups. Entries without
// a `sweep` get the op's default knob space minus the knobs their params fix.
std::vector<TuneGroup> tune_groups_from_config(const nlohmann::json& config);
std::vector<TuneGroup> load_tune_groups(const std::string& config_path, std::string* arch = nullptr);

// ================================================================================================
// Workloads (GPU)
// ================================================================================================

// One op's problem on the current device: inputs allocated and filled (plain pseudo-random data,
// deterministic per seed) for a shape, an output that can be poisoned and read back.
class Workload {
 public:
  virtual ~Workload() = default;
  // Launches `spec` (same op and problem params as the workload) on the inputs.
  virtual void run(const KernelSpec& spec, Stream stream) = 0;
  // Fills the output with NaN bytes so that anything a kernel fails to write shows.
  virtual void poison_output() = 0;
  // The output bytes (call after the run finished).
  virtual std::vector<uint8_t> read_output() const = 0;
  // "" when `candidate` is an acceptable output given `reference` (the default configuration's),
  // else why not (exact equality for the kv ops, per-row index sets for the indexer, relative
  // Frobenius < 1e-2 for the prefill).
  virtual std::string compare(const std::vector<uint8_t>& reference, const std::vector<uint8_t>& candidate) const = 0;
  // Bytes the op moves and FLOPs it does (for bandwidth / throughput columns; 0 if meaningless).
  virtual double bytes_moved() const = 0;
  virtual double flops() const = 0;
};
// Makes the workload of `problem.op()` for `shape` (keys missing from `shape` take the defaults).
std::unique_ptr<Workload> make_workload(const KernelSpec& problem, const Shape& shape, uint64_t seed = 1);

// ================================================================================================
// Timing (GPU)
// ================================================================================================

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int reps = 0;
};
// Runs `launch` `warmup` times, then `reps` times each timed with CUDA events on `stream`, the L2
// flushed before each timed repetition (a scratch buffer of 2x the L2 size is overwritten).
Timing time_launches(const std::function<void(Stream)>& launch, int warmup, int reps, Stream stream = nullptr);
// Several launches timed interleaved (rep r runs launches[0], launches[1], ... each after an L2
// flush), so that they see the same machine state: the tuner, `mlajit bench` and its --anchor
// comparisons all time through this one loop. One Timing per launch, in order.
std::vector<Timing> time_interleaved(const std::vector<std::function<void(Stream)>>& launches, int warmup, int reps,
                                     Stream stream = nullptr);

// ================================================================================================
// Tuner
// ================================================================================================

namespace detail {
struct TestHooks;  // src/autotune/test_hooks.hpp: the test suite's fault injection
}

struct TuneOptions {
  std::string arch;              // compile target; "" = each device's own (no GPU: MLAJIT_ARCH)
  std::string fallback_arch;     // used only without a GPU and without arch / MLAJIT_ARCH (the config's)
  std::string cache_dir;         // cubins and tuning.json; "" = the environment's writable cache layer
  unsigned jobs = 0;             // parallel compiles; 0 = all cores
  int reps = 20;                 // timed repetitions per candidate
  int warmup = 3;                // untimed launches before them
  std::map<Op, Shape> shapes;    // per op; missing ops / keys take the defaults
  std::vector<int> devices;      // ordinals to time on; empty = every visible device
  bool force = false;            // retune even when the database already holds this sweep
  bool compile_only = false;     // stop after compiling (no GPU needed)
  bool persist = true;           // merge winners into the tuning database
  // Progress: phase ("compile" | "time"), items done, total, the item just finished.
  std::function<void(const std::string&, size_t, size_t, const std::string&)> progress;
  std::shared_ptr<const detail::TestHooks> test_hooks;  // tests only; null in production
};

struct CandidateDeviceResult {
  int device = 0;
  // ok                 verified against the default configuration's output, then timed
  // wrong_output       its output differs from the default configuration's (never timed, never wins)
  // exceeds_resources  needs more shared memory than the device allows, or the launch was refused
  //                    for resources (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
  // failed             the op threw (launch failure, shape it does not support, lost device)
  // not_compiled       its compile failed (see compile_error)
  // no_reference       the default configuration could not run, so nothing could be verified
  // db_hit             the database already held this sweep for this device: nothing was timed
  std::string status;
  std::string reason;
  Timing timing;
};

struct CandidateResult {
  KernelSpec spec;
  std::string origin;
  bool is_default = false;
  std::string arch;
  bool compiled = false;
  bool cache_hit = false;        // the cubin was already in the disk cache
  double compile_seconds = 0;    // build_kernel wall time: codegen + key + cache + NVRTC
  double nvrtc_seconds = 0;      // the NVRTC part (0 on a cache hit)
  std::string compile_error;     // "" when compiled
  unsigned smem_bytes = 0;       // largest dynamic shared memory of its entries
  std::vector<CandidateDeviceResult> devices;  // one per timed device
};

struct GroupDeviceResult {
  int device = 0;
  std::string device_name;
  int sm_count = 0;
  int winner = -1;               // index into candidates, -1: none
  double best_ms = 0;
  double default_ms = 0;         // 0 when the default was not timed (db_hit)
  bool from_db = false;          // the database already held this sweep: nothing was timed
  nlohmann::json db_knobs;       // the stored winner's knobs when from_db
};

struct GroupResult {
  TuneGroup group;
  Shape shape;
  ShapeBucket bucket;
  std::vector<CandidateResult> candidates;
  std::vector<GroupDeviceResult> devices;
  bool devices_agree = true;     // every device picked the same knobs
};

struct TuneReport {
  std::vector<GroupResult> groups;
  unsigned jobs = 0;
  std::vector<std::string> archs;
  double compile_seconds = 0;    // wall time of the parallel compile phase
  double timing_seconds = 0;     // wall time of the timing phase (all devices)
  double total_seconds = 0;
  std::string db_path;
  size_t db_written = 0;         // records merged into the database
  std::string db_error;          // why the merge failed ("" when it did not)
  bool gpu = false;              // timing ran (false: compile only or no driver)
  std::string no_gpu_reason;

  nlohmann::json to_json() const;
  // One row per (candidate, device), one column per knob; untimed rows: empty timings + reason.
  std::string to_csv() const;
};

// Runs the whole sweep: compile every candidate in parallel, then (with a GPU) verify and time
// them on every device, one thread per device, and merge the winners into the database. A single
// candidate's failure (compile error, resources, launch failure, wrong output) is recorded, never
// thrown. Without a usable driver the report has gpu = false and no_gpu_reason after compiling.
// Throws Error(InvalidArgument) for bad options (an --arch that is not the devices' arch, ...).
TuneReport tune(const std::vector<TuneGroup>& groups, const TuneOptions& opts);

// ================================================================================================
// Tuning database
// ================================================================================================

struct TuningRecord {
  Op op = Op::kv_cache_store;
  std::string device;            // device name, e.g. "NVIDIA H100 80GB HBM3"
  int sm_count = 0;
  ShapeBucket bucket;
  std::string version;           // mlajit version that tuned it
  OpParams params;               // the winner: problem params + best knobs
  double median_ms = 0;
  double default_ms = 0;
  uint64_t sweep_signature = 0;
  int64_t tuned_at = 0;          // unix seconds

  // The identity: op, device, SM count, bucket, version and the non-knob params. Two records with
  // equal keys compete; the faster one is kept.
  std::string key() const;
  nlohmann::json to_json() const;
  static TuningRecord from_json(const nlohmann::json& j, const std::string& path);
};

class TuningDb {
 public:
  explicit TuningDb(std::string path);
  // <cache_dir>/tuning.json
  static std::string default_path(const std::string& cache_dir);
  const std::string& path() const { return path_; }

  // The records in the file. A missing file is empty; a corrupt file is reported (log warn),
  // ignored (empty result, *corrupt = true) and left in place.
  std::vector<TuningRecord> load(bool* corrupt = nullptr) const;
  // Read-merge-write under an exclusive flock on "<path>.lock": records of other processes are
  // kept, equal keys keep the faster record. Written atomically (temp file, fsync, rename). A
  // corrupt file is first copied to "<path>.corrupt" and then replaced. Returns the record count.
  size_t merge(const std::vector<TuningRecord>& records) const;

 private:
  std::string path_;
};

// ================================================================================================
// Run-time lookup (the ops' hot path)
// ================================================================================================

// Identity of a device in the database: a hash of its name and SM count.
uint64_t device_key(const std::string& name, int sm_count);

// An immutable in-memory index of records (one mlajit version), hashed by (device, problem, bucket).
class TuningIndex {
 public:
  TuningIndex() = default;
  // Keeps the records of `version` ("" = this build's) only.
  explicit TuningIndex(const std::vector<TuningRecord>& records, const std::string& version = "");
  // The tuned params, or nullptr. O(1), no allocation.
  const OpParams* find(uint64_t device, const OpParams& problem, const ShapeBucket& bucket) const;
  size_t size() const;

 private:
  struct Table;                        // src/autotune/lookup.cpp
  std::shared_ptr<const Table> table_;  // immutable once built; copies share it
};

// The index over <dir>/tuning.json of each cache layer, `dirs` in lookup order: the first layer's
// record for a (device, problem, bucket) wins. A missing or corrupt file adds nothing (warned).
TuningIndex load_layered_tuning_index(const std::vector<std::string>& dirs);

// The process-wide index: loaded once (first lookup) from the tuning.json of every cache layer
// (MLAJIT_CACHE_PATH, else the cache directory); the first layer's record for a problem wins.
// The best params for `problem` on the calling thread's current device (driver::ensure_context)
// and `bucket`, or nullptr (no entry, no database, no driver).
const OpParams* tuned_params(const OpParams& problem, const ShapeBucket& bucket);
// Same for an explicit device ordinal (no driver call after the first lookup per device).
const OpParams* tuned_params(const OpParams& problem, const ShapeBucket& bucket, int device_ordinal);
// `spec` with its auto knobs filled from the database (unchanged when there is no entry).
KernelSpec apply_tuning(const KernelSpec& spec, const ShapeBucket& bucket);
// Re-reads the database (after a tune in this process, or to pick up another process's tune);
// `cache_dir` "": the environment's layers.
void reload_tuning_index(const std::string& cache_dir = "");

// While alive, lookups on the constructing thread find nothing. The tuner's timing threads hold
// one, so that the default configuration it measures is the built-in heuristic even when an op
// fills auto knobs from an earlier tune.
class ScopedTuningLookupOff {
 public:
  ScopedTuningLookupOff();
  ~ScopedTuningLookupOff();
  ScopedTuningLookupOff(const ScopedTuningLookupOff&) = delete;
  ScopedTuningLookupOff& operator=(const ScopedTuningLookupOff&) = delete;

 private:
  bool previous_;
};

}  // namespace mlajit::autotune
