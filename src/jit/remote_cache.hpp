#pragma once
// RemoteCache: the fleet-shared tier behind the disk cache (memory -> disk -> remote -> NVRTC).
//
// A cubin entry is stored under <prefix>cubin:<cache key> as
//   0   "MLAJITR\n"            magic (8 bytes)
//   8   u32 format version     1 (little-endian)
//   12  u32 flags              bit 0: signed
//   16  HMAC-SHA256 (32 bytes) over field("mlajit-remote-entry-v1") field(cache key) field(entry);
//                              zeros when unsigned
//   48  entry                  exactly the bytes of the disk entry file (cache.hpp: header, key,
//                              both checksums, metadata, cubin)
// so a remote entry is content-addressed by the same key and verified twice: the signature under
// the fleet key (MLAJIT_REMOTE_CACHE_KEY_FILE), then every check of a disk entry. An entry that
// fails either is never loaded: it is reported (one warning per entry, the bad_signature or
// corrupt counter) and the kernel is compiled (and uploaded, replacing it).
// Tuning records are members of the collection <prefix>tuning, each under the SHA-256 of its
// JSON (content-addressed: a member is added, never overwritten), signed the same way with the
// domain "mlajit-remote-tuning-v1"; readers merge them into their tuning.json.
//
// Without a key the tier is off (it never loads unsigned code) unless
// MLAJIT_REMOTE_CACHE_ALLOW_UNSIGNED=1; then entries are neither signed nor required to be.
// Failures are never fatal: a store that is down, slow (bounded connect and command timeouts) or
// full makes the lookup a miss; the first failure warns once per process, the tier then rests for
// kRetrySeconds before it tries the network again. The runtime consults the tier only on a memory
// and disk miss, so a loaded kernel never waits on the network.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jit/remote_store.hpp"
#include "mlajit/cache.hpp"

namespace mlajit {

struct RemoteConfig {
  std::string url;                   // MLAJIT_REMOTE_CACHE
  std::string prefix = "mlajit:";    // MLAJIT_REMOTE_CACHE_PREFIX
  long ttl_s = 30L * 24 * 3600;      // MLAJIT_REMOTE_CACHE_TTL (seconds; 0 = never expires)
  RemoteTimeouts timeouts;           // MLAJIT_REMOTE_CACHE_CONNECT_TIMEOUT_MS / _TIMEOUT_MS
  std::string key_file;              // MLAJIT_REMOTE_CACHE_KEY_FILE
  bool allow_unsigned = false;       // MLAJIT_REMOTE_CACHE_ALLOW_UNSIGNED

  // The environment's configuration, or nullopt when MLAJIT_REMOTE_CACHE is unset. Throws
  // Error(InvalidArgument) for a malformed value.
  static std::optional<RemoteConfig> from_env();
};

// Reads a fleet key file: a regular file owned by the current user with no group/other
// permission bits, holding at least 16 bytes (a trailing newline is not part of the key).
// Throws Error(Cache) saying what is wrong and how to fix it.
std::string read_fleet_key(const std::string& path);

struct RemoteStats {
  uint64_t hits = 0, misses = 0, puts = 0;
  uint64_t errors = 0;         // store unreachable / timed out / refused a command
  uint64_t bad_signature = 0;  // signature missing or wrong: refused
  uint64_t corrupt = 0;        // signature fine (or unsigned) but the entry failed its checks
  uint64_t skipped = 0;        // calls not made while the tier rested after a failure
};

class RemoteCache {
 public:
  static constexpr int kRetrySeconds = 30;

  // `key`: the fleet key (empty: unsigned, allowed only with cfg.allow_unsigned; else
  // Error(Cache)). Touches no network.
  RemoteCache(std::unique_ptr<RemoteStore> store, RemoteConfig cfg, std::string key);
  // The environment's remote tier: nullptr when MLAJIT_REMOTE_CACHE is unset. Throws Error for
  // a bad configuration (malformed value, unsafe or missing key file, no key without opt-in).
  static std::unique_ptr<RemoteCache> from_env();
  // The process-wide from_env() tier, made on first use; a bad configuration is warned about
  // once and leaves the tier off (nullptr): the remote is an accelerator, never a dependency.
  static RemoteCache* global();
  // Why global() is off although MLAJIT_REMOTE_CACHE is set ("" when it is on or unset).
  static std::string global_error();

  // The verified entry, or nullopt (absent, refused, or the store failed). Never throws.
  std::optional<CacheEntry> get(const std::string& key);
  // Uploads (replacing) the entry; false when the store failed. Never throws.
  bool put(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin);
  // Adds a signed record to `collection` under the SHA-256 of `payload`; false when it was there
  // already or the store failed. Never throws.
  bool add_record(const std::string& collection, const std::string& payload);
  // Every record of `collection` whose signature verifies (refused ones are counted and warned
  // about). Never throws (a failed store gives an empty list).
  std::vector<std::string> records(const std::string& collection);
  // One round trip; false (and `why`) when the store is unreachable. Counts like any call.
  bool ping(std::string* why = nullptr);

  bool signing() const { return !key_.empty(); }
  const RemoteConfig& config() const { return cfg_; }
  std::string describe() const { return store_->describe(); }
  RemoteStats stats() const;

  // The store-side name of an entry / collection (for tests and tools).
  std::string entry_name(const std::string& key) const { return cfg_.prefix + "cubin:" + key; }
  std::string collection_name(const std::string& c) const { return cfg_.prefix + c; }
  // Wraps / unwraps an entry blob (layout above). unwrap: the entry bytes when the blob is
  // well-formed and its signature verifies (or unsigned is allowed); else nullopt and `why`.
  std::string wrap(const std::string& domain, const std::string& id, const std::string& body) const;
  std::optional<std::string> unwrap(const std::string& domain, const std::string& id, const std::string& blob,
                                    std::string* why, bool* bad_signature) const;

 private:
  template <typename F>
  bool guarded(const char* what, F&& f);

  std::unique_ptr<RemoteStore> store_;
  RemoteConfig cfg_;
  std::string key_;
  std::atomic<int64_t> rest_until_ms_{0};  // steady-clock ms before which the network is not tried
  std::atomic<bool> warned_{false};
  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, puts{0}, errors{0}, bad_signature{0}, corrupt{0}, skipped{0};
  } n_;
};

}  // namespace mlajit
