#pragma once
// The on-disk kernel cache and the cache key.
//
// Key (cache_key): SHA-256, hex, over length-prefixed fields: the cache format version, the mlajit
// version, the target arch, the NVRTC version, every compile option (the compiler's and, when it has
// any, the kernel's own KernelSource::nvrtc_options), the generated source, and the
// path and contents of every template the source includes (transitively). Anything that can change
// the cubin is in the key, so an entry is never stale -- only unused (LRU eviction handles that).
//
// DiskCache: one file per entry, <dir>/<key>.mjc:
//   0   "MLAJITC\n"                 magic (8 bytes)
//   8   u32 format version           kCacheFormatVersion (little-endian, as every integer here)
//   12  u32 metadata length M
//   16  u64 payload length N
//   24  key (64 hex chars)           must equal the file name's key
//   88  sha256(payload)              32 bytes
//   120 sha256(metadata)             32 bytes
//   152 metadata JSON (M bytes)      name, op, params, entries, arch, nvrtc_version, compile_seconds, ...
//   152+M cubin (N bytes)
// Writes go to a temp file in the same directory, fsync, rename, fsync(dir): readers see a whole
// entry or none. Reads verify magic, version, key, lengths and both checksums; a bad entry is
// logged, removed and reported as a miss (the caller recompiles) -- never loaded.
// The directory is created 0700; a directory writable by group/others or owned by someone else is
// refused with Error(Cache): loading a cubin runs its code on the GPU. Each entry file is held to
// the same rule when it is read: one that is not a regular file (a symlink), is owned by another
// user or is writable by group/others is treated as corrupt (logged, removed, recompiled).
//
// Layers (MLAJIT_CACHE_PATH=/opt/mlajit/cache:~/.cache/mlajit): a cache is a search path of
// directories, looked up in order. The first one the caller can write (owned by the caller with
// the owner's write bit set; a missing one is created) takes every put, eviction, prune and clear;
// the others are read-only. A read-only layer may also belong to root (an image built as root and
// served by a non-root user); its entry files may be owned by the caller or root. Every other rule
// holds for every layer: a directory writable by group/others, or owned by a user who is neither
// the caller nor root, is refused; entries are checked as above. A bad entry in a read-only layer
// is logged and skipped (never removed, never loaded) and the lookup goes on to the next layer.
// Nothing is ever written into a read-only layer (not even an LRU touch or a lock file).
// A per-key lock file (<key>.lock, flock) only keeps concurrent processes from compiling the same
// kernel twice; correctness never depends on it (a lock that is not released in time is ignored).
// A lock is removed with its entry (bad entry, eviction, verify --fix, prune) unless a process
// holds it; prune also removes the unheld locks of missing entries, clear every lock. A lock
// orphaned by a writer that died (entry missing, unheld, older than 2 s) is listed by verify and
// removed by verify --remove and by the first writer of a process in that directory. A writer
// flocks its temp file until the rename; an unlocked temp file older than 2 s (its writer died)
// is removed when a DiskCache is opened, by verify --remove and by prune.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mlajit/codegen.hpp"

namespace mlajit {

std::string cache_key(const KernelSource& src, const std::string& arch, const std::vector<std::string>& options,
                      const std::string& nvrtc_version);
// The key without the NVRTC version: stored in each entry's metadata so that a machine without
// NVRTC can still find a cubin built for exactly this source, arch and options.
std::string cache_base_key(const KernelSource& src, const std::string& arch, const std::vector<std::string>& options);

struct CacheEntryMeta {
  std::string name;
  std::string base_key;  // cache_base_key(...)
  std::string op;
  std::string params_json;  // params_to_json(spec.params).dump()
  std::vector<EntryPoint> entries;
  std::string arch;
  std::string min_arch;
  std::string nvrtc_version;
  double compile_seconds = 0;
  std::string mlajit_version;
  int64_t created = 0;  // unix seconds

  std::string to_json() const;
  static CacheEntryMeta from_json(const std::string& text);  // throws Error(Cache) when malformed
};

struct CacheEntry {
  std::string key;
  CacheEntryMeta meta;
  std::string cubin;
};

// One directory of a cache's search path.
struct CacheLayer {
  std::string dir;
  bool writable = false;  // the layer that takes misses (at most one per cache)
  bool exists = true;     // false only from resolve_cache_layers(..., create = false)
  uint32_t owner_uid = 0;
};

// Checks each directory of a search path in order (layout above) and returns the usable layers.
// Throws Error(Cache) for a directory writable by group/others, owned by a user who is neither the
// caller nor root, or not a directory. A missing directory becomes the writable layer when none
// was found before it (created 0700 when `create`, else returned with exists = false); other
// missing directories, and one that cannot be created, are skipped (logged). Throws Error(Cache)
// when no layer is left.
std::vector<CacheLayer> resolve_cache_layers(const std::vector<std::string>& dirs, bool create);
// The environment's layers (config::cache_path()) without creating anything, and the directory
// among them that takes writes (tuning results as well as cubins); nullopt when all are read-only.
std::vector<CacheLayer> cache_layers_from_env();
// `dir` as a read-only layer if it exists and passes the layer rules above (owner: the caller or
// root; not writable by group or others); else nullopt and `why`.
std::optional<CacheLayer> read_only_cache_layer(const std::string& dir, std::string* why);
std::optional<std::string> writable_cache_dir_from_env();

struct CacheListing {
  std::string key, name, arch, path;
  std::string layer;       // the directory it is in
  bool read_only = false;  // it is in a read-only layer
  uint64_t size = 0;   // file size in bytes
  int64_t mtime = 0;   // unix seconds; refreshed on every hit (LRU order)
};

struct CorruptEntry {
  std::string path;
  std::string reason;
  bool read_only = false;  // in a read-only layer: reported, never removed
};

struct VerifyReport {
  size_t entries = 0;
  size_t ok = 0;
  std::vector<CorruptEntry> corrupt;
};

struct PruneReport {
  size_t removed = 0;
  uint64_t removed_bytes = 0;
  uint64_t remaining_bytes = 0;
};

class DiskCache {
 public:
  // Opens (creating it 0700 if missing, parents included) and checks `dir`: a one-layer cache,
  // read-only when the caller cannot write it (see Layers above). max_bytes: LRU cap enforced
  // after every put (nullopt: none). Throws Error(Cache) for an unsafe or unusable dir.
  explicit DiskCache(std::string dir, std::optional<uint64_t> max_bytes = std::nullopt);
  // A cache over a search path (resolve_cache_layers(dirs, create = true)).
  explicit DiskCache(const std::vector<std::string>& dirs, std::optional<uint64_t> max_bytes = std::nullopt);
  // The cache the environment describes (MLAJIT_CACHE_PATH, else MLAJIT_CACHE_DIR /
  // XDG_CACHE_HOME / HOME; MLAJIT_CACHE_MAX_BYTES), or nullptr when MLAJIT_DISABLE_DISK_CACHE is set.
  static std::unique_ptr<DiskCache> from_env();
  // The process-wide from_env() cache, created on first use (nullptr when disabled). Throws the
  // Error(Cache) of an unsafe directory on every call.
  static DiskCache* default_cache();

  // The writable layer's directory (the first layer's when every layer is read-only).
  const std::string& dir() const { return dir_; }
  const std::vector<CacheLayer>& layers() const { return layers_; }
  // Appends `dir` as a read-only layer after the others (the packaged layer, config::
  // prebuilt_cache_dir): skipped (logged) when missing or unsafe by the layer rules, never written.
  void add_read_only_layer(const std::string& dir);
  // False when every layer is read-only: put() throws Error(Cache), prune and clear remove nothing.
  bool writable() const { return writable_ >= 0; }
  std::optional<uint64_t> max_bytes() const { return max_bytes_; }
  std::string path_of(const std::string& key) const;

  // The verified entry, or nullopt (missing, or bad: then it was logged and removed). A hit
  // refreshes the entry's mtime/atime for LRU.
  std::optional<CacheEntry> get(const std::string& key);
  // Atomically writes (or replaces) the entry, then evicts least-recently-used entries over the cap.
  void put(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin);

  // The newest valid entry whose metadata has this base key (a directory scan; used only when
  // NVRTC is unavailable and the full key cannot be computed).
  std::optional<CacheEntry> find_by_base_key(const std::string& base_key);

  std::vector<CacheListing> list() const;  // layer by layer in search order, oldest first in each
  // Reads and checks every entry of every layer; bad ones in the writable layer are removed when
  // remove_corrupt (those of read-only layers are only reported).
  VerifyReport verify(bool remove_corrupt = false);
  // Removes least-recently-used entries of the writable layer until its total is <= max_bytes.
  PruneReport prune(uint64_t max_bytes);
  // Removes every entry, lock and leftover temp file of the writable layer; returns the number of
  // entries removed.
  size_t clear();

  // Holds <key>.lock (flock) in the writable layer for its lifetime; waits at most `timeout_s`,
  // then proceeds unlocked (at once when the cache has no writable layer).
  class KeyLock {
   public:
    KeyLock(const DiskCache& cache, const std::string& key, double timeout_s = 300);
    ~KeyLock();
    KeyLock(const KeyLock&) = delete;
    KeyLock& operator=(const KeyLock&) = delete;
    bool locked() const { return fd_ >= 0; }

   private:
    int fd_ = -1;
  };

 private:
  std::vector<CacheLayer> layers_;
  int writable_ = -1;  // index of the writable layer in layers_, -1: none
  std::string dir_;
  std::optional<uint64_t> max_bytes_;
  std::vector<CacheListing> list_layer(const CacheLayer& layer) const;  // oldest first
  void evict_over_cap(const std::string& keep_key);
};

// The bytes of one entry file (layout above), and their verified parse (nullopt and `why` when
// any check fails); the remote tier ships exactly these bytes.
std::string encode_cache_entry(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin);
std::optional<CacheEntry> decode_cache_entry(const std::string& data, const std::string& key, std::string* why = nullptr);

// Throws Error(InvalidArgument) unless `key` is 64 lowercase hex characters.
void validate_cache_key(const std::string& key);

}  // namespace mlajit
