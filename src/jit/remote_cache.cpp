// The fleet-shared remote tier (layout, trust and failure policy: jit/remote_cache.hpp).
#include "jit/remote_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/hmac.hpp"
#include "core/little_endian.hpp"
#include "core/sha256.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"

namespace mlajit {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'J', 'I', 'T', 'R', '\n'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kSignedFlag = 1;
constexpr size_t kWrapHeader = 48;
constexpr const char* kEntryDomain = "mlajit-remote-entry-v1";
constexpr size_t kMinKeyBytes = 16;

using le::get_u32;
using le::put_u32;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

long env_long(const char* name, long fallback, long lo, long hi, const char* expected) {
  auto v = config::env(name);
  if (!v) return fallback;
  size_t pos = 0;
  long n = 0;
  try {
    n = std::stol(*v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != v->size() || n < lo || n > hi) throw_invalid(name, fmt::format("\"{}\"", *v), expected);
  return n;
}

std::string signature(const std::string& key, const std::string& domain, const std::string& id, const std::string& body) {
  HmacSha256 h(key);
  h.update_field(domain);
  h.update_field(id);
  h.update_field(body);
  auto d = h.finish();
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

// ---- configuration ------------------------------------------------------------------------------

std::optional<RemoteConfig> RemoteConfig::from_env() {
  auto url = config::env("MLAJIT_REMOTE_CACHE");
  if (!url) return std::nullopt;
  RemoteConfig c;
  c.url = *url;
  if (auto p = config::env("MLAJIT_REMOTE_CACHE_PREFIX")) c.prefix = *p;
  c.ttl_s = env_long("MLAJIT_REMOTE_CACHE_TTL", c.ttl_s, 0, 10L * 365 * 24 * 3600, "seconds, 0 (never expires) or more");
  c.timeouts.connect = std::chrono::milliseconds(env_long("MLAJIT_REMOTE_CACHE_CONNECT_TIMEOUT_MS", 200, 1, 600000,
                                                          "milliseconds, 1..600000"));
  c.timeouts.command = std::chrono::milliseconds(env_long("MLAJIT_REMOTE_CACHE_TIMEOUT_MS", 1000, 1, 600000,
                                                          "milliseconds, 1..600000"));
  if (auto k = config::env("MLAJIT_REMOTE_CACHE_KEY_FILE")) c.key_file = *k;
  c.allow_unsigned = config::env_flag("MLAJIT_REMOTE_CACHE_ALLOW_UNSIGNED");
  return c;
}

std::string read_fleet_key(const std::string& path) {
  constexpr size_t kMaxKeyFileBytes = 64 << 10;
  // O_NONBLOCK: a FIFO at this path is refused below (not a regular file), not waited on.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    throw_error(ErrorKind::Cache, "cannot open the remote cache key file {} (MLAJIT_REMOTE_CACHE_KEY_FILE): {}", path,
                std::strerror(errno));
  struct stat st;
  std::string why;
  if (::fstat(fd, &st) != 0) why = fmt::format("cannot stat it: {}", std::strerror(errno));
  else if (!S_ISREG(st.st_mode)) why = "it is not a regular file";
  else if (st.st_uid != ::geteuid())
    why = fmt::format("it is owned by uid {}, not by the current user (uid {})", st.st_uid, ::geteuid());
  else if (st.st_mode & (S_IRWXG | S_IRWXO))
    why = fmt::format("it is accessible to {} (mode {:04o}); the fleet key signs code that GPUs run, so it must be "
                      "readable by its owner only: `chmod 600 {}`",
                      (st.st_mode & S_IRWXO) ? "other users" : "its group", st.st_mode & 07777, path);
  std::string key;
  if (why.empty()) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && key.size() <= kMaxKeyFileBytes) key.append(buf, static_cast<size_t>(n));
    if (key.size() > kMaxKeyFileBytes) why = fmt::format("it holds more than {} bytes", kMaxKeyFileBytes);
    else if (n < 0) why = fmt::format("cannot read it: {}", std::strerror(errno));
  }
  ::close(fd);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (why.empty() && key.size() < kMinKeyBytes)
    why = fmt::format("it holds {} bytes, expected at least {} (e.g. `head -c 32 /dev/urandom > {}`)", key.size(),
                      kMinKeyBytes, path);
  if (!why.empty()) throw_error(ErrorKind::Cache, "refusing the remote cache key file {}: {}", path, why);
  return key;
}

// ---- RemoteCache --------------------------------------------------------------------------------

RemoteCache::RemoteCache(std::unique_ptr<RemoteStore> store, RemoteConfig cfg, std::string key)
    : store_(std::move(store)), cfg_(std::move(cfg)), key_(std::move(key)) {
  if (key_.empty() && !cfg_.allow_unsigned)
    throw_error(ErrorKind::Cache,
                "remote cache {} has no signing key: set MLAJIT_REMOTE_CACHE_KEY_FILE to the fleet key (a file "
                "readable by its owner only), or MLAJIT_REMOTE_CACHE_ALLOW_UNSIGNED=1 to trust whatever the store "
                "returns",
                store_->describe());
}

std::unique_ptr<RemoteCache> RemoteCache::from_env() {
  auto cfg = RemoteConfig::from_env();
  if (!cfg) return nullptr;
  auto store = open_remote_store(cfg->url, cfg->timeouts);
  std::string key;
  if (!cfg->key_file.empty()) key = read_fleet_key(cfg->key_file);
  return std::make_unique<RemoteCache>(std::move(store), std::move(*cfg), std::move(key));
}

namespace {
struct GlobalRemote {
  std::once_flag once;
  std::unique_ptr<RemoteCache> cache;
  std::string error;
};
GlobalRemote& global_remote() {
  static GlobalRemote* g = new GlobalRemote();  // never destroyed: used until process exit
  return *g;
}
}  // namespace

RemoteCache* RemoteCache::global() {
  GlobalRemote& g = global_remote();
  std::call_once(g.once, [&] {
    try {
      g.cache = from_env();
      if (g.cache)
        log::info("remote cache {} ({}, prefix \"{}\")", g.cache->describe(),
                  g.cache->signing() ? "signed" : "UNSIGNED entries allowed", g.cache->config().prefix);
    } catch (const Error& e) {
      g.error = e.what();
      log::warn("remote cache off: {}", e.what());
    }
  });
  return g.cache.get();
}

std::string RemoteCache::global_error() {
  global();
  return global_remote().error;
}

RemoteStats RemoteCache::stats() const {
  RemoteStats s;
  s.hits = n_.hits;
  s.misses = n_.misses;
  s.puts = n_.puts;
  s.errors = n_.errors;
  s.bad_signature = n_.bad_signature;
  s.corrupt = n_.corrupt;
  s.skipped = n_.skipped;
  return s;
}

template <typename F>
bool RemoteCache::guarded(const char* what, F&& f) {
  if (now_ms() < rest_until_ms_.load(std::memory_order_relaxed)) {
    ++n_.skipped;
    return false;
  }
  try {
    f();
    return true;
  } catch (const RemoteError& e) {
    ++n_.errors;
    // Unreachable or slow: rest, so that every later miss does not pay the timeout again. An
    // error reply (full, read-only replica, ...) only fails this call.
    if (e.unavailable) rest_until_ms_.store(now_ms() + kRetrySeconds * 1000, std::memory_order_relaxed);
    if (!warned_.exchange(true))
      log::warn("remote cache {} failed ({}: {}); continuing with the local caches{}", store_->describe(), what,
                e.what(), e.unavailable ? fmt::format(" (next try in {} s; further failures are logged at debug level)", kRetrySeconds) : "");
    else
      log::debug("remote cache {}: {}: {}", store_->describe(), what, e.what());
    return false;
  }
}

std::string RemoteCache::wrap(const std::string& domain, const std::string& id, const std::string& body) const {
  std::string blob;
  blob.reserve(kWrapHeader + body.size());
  blob.append(kMagic, 8);
  put_u32(blob, kVersion);
  put_u32(blob, signing() ? kSignedFlag : 0);
  blob += signing() ? signature(key_, domain, id, body) : std::string(32, '\0');
  blob += body;
  return blob;
}

std::optional<std::string> RemoteCache::unwrap(const std::string& domain, const std::string& id, const std::string& blob,
                                               std::string* why, bool* bad_signature) const {
  auto fail = [&](std::string w, bool sig) -> std::optional<std::string> {
    if (why) *why = std::move(w);
    if (bad_signature) *bad_signature = sig;
    return std::nullopt;
  };
  if (blob.size() < kWrapHeader || std::memcmp(blob.data(), kMagic, 8) != 0)
    return fail("not an mlajit remote entry (bad magic or truncated)", signing());
  // With a key, whatever cannot be verified counts as a bad signature, whatever the reason.
  if (get_u32(blob, 8) != kVersion)
    return fail(fmt::format("remote format version {}, expected {}", get_u32(blob, 8), kVersion), signing());
  std::string body = blob.substr(kWrapHeader);
  if (signing()) {
    if (!(get_u32(blob, 12) & kSignedFlag)) return fail("unsigned entry, and this node requires signatures", true);
    if (!constant_time_equal(std::string_view(blob.data() + 16, 32), signature(key_, domain, id, body)))
      return fail("signature does not verify under the fleet key", true);
  }
  // Unsigned mode (explicit opt-in) trusts the store; the disk checks still apply to entries.
  return body;
}

std::optional<CacheEntry> RemoteCache::get(const std::string& key) {
  std::optional<std::string> blob;
  if (!guarded("get", [&] { blob = store_->get(entry_name(key)); })) return std::nullopt;
  if (!blob) {
    ++n_.misses;
    return std::nullopt;
  }
  std::string why;
  bool bad_sig = false;
  auto body = unwrap(kEntryDomain, key, *blob, &why, &bad_sig);
  std::optional<CacheEntry> e;
  if (body) e = decode_cache_entry(*body, key, &why);
  if (e) {
    ++n_.hits;
    return e;
  }
  ++(bad_sig ? n_.bad_signature : n_.corrupt);
  ++n_.misses;
  log::warn("remote cache {}: refused entry {} ({}); not loaded", store_->describe(),
            entry_name(key), why);
  return std::nullopt;
}

bool RemoteCache::put(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin) {
  std::string blob = wrap(kEntryDomain, key, encode_cache_entry(key, meta, cubin));
  bool ok = guarded("put", [&] { store_->put(entry_name(key), blob, cfg_.ttl_s); });
  if (ok) ++n_.puts;
  return ok;
}

bool RemoteCache::add_record(const std::string& collection, const std::string& payload) {
  const std::string id = sha256_hex(payload);
  const std::string domain = "mlajit-remote-" + collection + "-v1";
  bool added = false;
  guarded("add_record", [&] { added = store_->add_member(collection_name(collection), id, wrap(domain, id, payload), cfg_.ttl_s); });
  if (added) ++n_.puts;
  return added;
}

std::vector<std::string> RemoteCache::records(const std::string& collection) {
  std::vector<std::pair<std::string, std::string>> raw;
  if (!guarded("records", [&] { raw = store_->members(collection_name(collection)); })) return {};
  const std::string domain = "mlajit-remote-" + collection + "-v1";
  std::vector<std::string> out;
  for (auto& [id, blob] : raw) {
    std::string why;
    bool bad_sig = false;
    auto body = unwrap(domain, id, blob, &why, &bad_sig);
    // Content addressing: the member's name is the hash of what it holds.
    if (body && sha256_hex(*body) != id) {
      body.reset();
      why = "the record does not hash to its name";
    }
    if (!body) {
      ++(bad_sig ? n_.bad_signature : n_.corrupt);
      log::warn("remote cache {}: refused {} record {} ({})", store_->describe(), collection, id, why);
      continue;
    }
    ++n_.hits;
    out.push_back(std::move(*body));
  }
  return out;
}

bool RemoteCache::ping(std::string* why) {
  // An explicit check (mlajit info, tests) always goes to the network, resting or not.
  try {
    store_->ping();
    rest_until_ms_.store(0, std::memory_order_relaxed);
    return true;
  } catch (const RemoteError& e) {
    ++n_.errors;
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace mlajit
