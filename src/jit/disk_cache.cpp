// The on-disk cubin cache (layout and guarantees: include/mlajit/cache.hpp).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iterator>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "mlajit/cache.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"
#include "core/input.hpp"
#include "core/sha256.hpp"
#include "jit/lock_files.hpp"
#include "core/little_endian.hpp"

namespace mlajit {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'J', 'I', 'T', 'C', '\n'};
constexpr size_t kHeaderSize = 152;
constexpr const char* kEntrySuffix = ".mjc";
constexpr const char* kLockSuffix = ".lock";
constexpr const char* kTempSuffix = ".tmp";
// Far above any cubin (a few MB); an entry file is read whole.
constexpr uint64_t kMaxEntryBytes = 1ull << 30;

using le::put_u32;
using le::put_u64;

std::string errno_text() { return std::strerror(errno); }

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool is_key(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The directory's names (no "." / "..").
std::vector<std::string> list_names(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) throw_error(ErrorKind::Io, "cannot list cache directory {}: {}", dir, errno_text());
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_all(int fd, size_t size, const std::string& path) {
  std::string data(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, data.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  data.resize(got);
  return data;
}

void write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw_error(ErrorKind::Io, "cannot write cache file {}: {}", path, errno_text());
    done += static_cast<size_t>(w);
  }
}

// Why an entry file others could have written is refused (cache.hpp: the entry files are held to
// the directory's rule, since a file can be made writable after it was written).
std::string writable_by_others(const struct stat& st) {
  return fmt::format("writable by {} (mode {:04o}); only entries writable by the current user alone are loaded",
                     (st.st_mode & S_IWOTH) ? "other users" : "its group", st.st_mode & 07777);
}

// Removes <key>.lock unless a process holds it (it is compiling that key right now; its lock stays
// useful). A process that opened the file but has not locked it yet then locks an unlinked file
// and may compile the key a second time -- harmless, the lock never promised more (KeyLock).
void remove_lock(const std::string& dir, const std::string& key) {
  std::string path = dir + "/" + key + kLockSuffix;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
  ::close(fd);  // releases the flock
}

// Removes an entry file and its lock; true when the entry is gone (removed now or before).
bool remove_entry(const std::string& dir, const std::string& key, const std::string& path) {
  bool gone = ::unlink(path.c_str()) == 0 || errno == ENOENT;
  if (gone) remove_lock(dir, key);
  return gone;
}

// A writer holds an flock on its temp file from creation to rename; an unlocked temp file older
// than kDeadTempSeconds was left by a writer that died (SIGKILL, power loss) and is removed. The
// age guards the instant between mkstemps and flock in a live writer.
constexpr int kDeadTempSeconds = 2;

void remove_dead_temps(const std::string& dir, const std::vector<std::string>& names) {
  const time_t now = ::time(nullptr);
  for (auto& n : names) {
    if (n[0] != '.' || !ends_with(n, kTempSuffix)) continue;
    std::string path = dir + "/" + n;
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime >= kDeadTempSeconds &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      ::unlink(path.c_str());
      log::debug("removed {}, left by a writer that died", path);
    }
    ::close(fd);
  }
}

// A lock file is orphaned when its entry does not exist and no process holds it: its writer died
// between taking the lock and storing the entry (SIGKILL, OOM, power loss). A live writer holds its
// flock from just after creating the file to after the put, so a lock we can flock is not in use;
// the age guards the instant between open(O_CREAT) and flock in a live writer. (A process that
// opened an old lock file and is about to flock it then locks an unlinked file and may compile the
// key a second time -- harmless, see remove_lock.)
constexpr int kDeadLockSeconds = 2;

std::vector<std::string> orphaned_locks(const std::string& dir, const std::vector<std::string>& names, bool remove) {
  std::vector<std::string> found;
  const time_t now = ::time(nullptr);
  for (auto& n : names) {
    if (!ends_with(n, kLockSuffix)) continue;
    const std::string key = n.substr(0, n.size() - std::strlen(kLockSuffix));
    if (!is_key(key)) continue;
    const std::string entry = dir + "/" + key + kEntrySuffix, path = dir + "/" + n;
    struct stat st;
    if (::lstat(entry.c_str(), &st) == 0 || errno != ENOENT) continue;
    // O_NONBLOCK: a FIFO planted under this name is not waited on (and is not a regular file).
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime >= kDeadLockSeconds &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::lstat(entry.c_str(), &st) != 0 && errno == ENOENT) {
      found.push_back(path);
      if (remove && ::unlink(path.c_str()) == 0) log::debug("removed {}, left by a writer that died", path);
    }
    ::close(fd);  // releases the flock
  }
  return found;
}

// The first writer of this process into `dir` (a KeyLock or a put) removes the orphaned locks
// there, so that crashes do not leave lock files behind for ever; once per process and directory.
void remove_orphaned_locks_once(const std::string& dir) {
  static std::mutex mu;
  static std::vector<std::string> done;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (std::find(done.begin(), done.end(), dir) != done.end()) return;
    done.push_back(dir);
  }
  try {
    orphaned_locks(dir, list_names(dir), /*remove=*/true);
  } catch (const Error& e) {
    log::debug("cannot sweep orphaned locks in {}: {}", dir, e.what());
  }
}

struct Parsed {
  std::optional<CacheEntry> entry;
  std::string reason;  // why it is bad, when entry is empty
};

// Checks one entry file's bytes against the layout and the key its name promises.
Parsed parse_entry(const std::string& data, const std::string& key) {
  Parsed p;
  auto bad = [&](std::string why) {
    p.reason = std::move(why);
    return p;
  };
  if (data.size() < kHeaderSize) return bad(fmt::format("truncated: {} bytes, shorter than the {}-byte header", data.size(), kHeaderSize));
  if (std::memcmp(data.data(), kMagic, 8) != 0) return bad("bad magic (not an mlajit cache entry)");
  uint64_t version = le::get(data, 8, 4);
  if (version != kCacheFormatVersion) return bad(fmt::format("format version {}, expected {}", version, kCacheFormatVersion));
  uint64_t meta_len = le::get(data, 12, 4), payload_len = le::get(data, 16, 8);
  if (data.compare(24, 64, key) != 0) return bad("the key in the header does not match the file name");
  if (kHeaderSize + meta_len + payload_len != data.size())
    return bad(fmt::format("size {} bytes, header says {}", data.size(), kHeaderSize + meta_len + payload_len));
  std::string_view meta(data.data() + kHeaderSize, meta_len);
  std::string_view payload(data.data() + kHeaderSize + meta_len, payload_len);
  auto payload_sum = sha256(payload);
  if (std::memcmp(payload_sum.data(), data.data() + 88, 32) != 0) return bad("payload checksum mismatch");
  auto meta_sum = sha256(meta);
  if (std::memcmp(meta_sum.data(), data.data() + 120, 32) != 0) return bad("metadata checksum mismatch");
  CacheEntry e;
  try {
    e.meta = CacheEntryMeta::from_json(std::string(meta));
  } catch (const Error& err) {
    return bad(err.what());
  }
  e.key = key;
  e.cubin.assign(payload.data(), payload.size());
  p.entry = std::move(e);
  return p;
}

// Opens and reads an entry file. nullopt data = no such file.
struct ReadResult {
  bool exists = false;
  std::string data;
  std::string reason;  // non-empty: unreadable / not ours
};

// `read_only`: the file is in a read-only layer, where root may own it too (cache.hpp, Layers);
// it is then never touched.
ReadResult read_entry_file(const std::string& path, bool read_only, bool touch) {
  ReadResult r;
  // O_NONBLOCK: a FIFO planted under an entry's name is refused below, not waited on.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return r;
    r.exists = true;
    r.reason = fmt::format("cannot open: {}", errno_text());
    return r;
  }
  r.exists = true;
  struct stat st;
  if (fstat(fd, &st) != 0) r.reason = fmt::format("cannot stat: {}", errno_text());
  else if (!S_ISREG(st.st_mode)) r.reason = fmt::format("not a regular file ({})", file_type_name(st.st_mode));
  else if (static_cast<uint64_t>(st.st_size) > kMaxEntryBytes)
    r.reason = fmt::format("{} bytes, more than the {} an entry may have", st.st_size, kMaxEntryBytes);
  else if (st.st_uid != geteuid() && !(read_only && st.st_uid == 0))
    r.reason = fmt::format("owned by uid {}, not by the current user{}", st.st_uid, read_only ? " or root" : "");
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) r.reason = writable_by_others(st);
  else {
    r.data = read_all(fd, static_cast<size_t>(st.st_size), path);
    // The entry was used: refresh atime/mtime so that LRU eviction keeps it.
    if (touch && !read_only) ::futimens(fd, nullptr);
  }
  ::close(fd);
  return r;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

// ---- metadata -----------------------------------------------------------------------------------

std::string CacheEntryMeta::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  j["base_key"] = base_key;
  j["op"] = op;
  j["params"] = params_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(params_json);
  j["entries"] = nlohmann::json::array();
  for (auto& e : entries) j["entries"].push_back({{"symbol", e.symbol}, {"threads", e.threads}, {"smem", e.smem_bytes}});
  j["arch"] = arch;
  j["min_arch"] = min_arch;
  j["nvrtc_version"] = nvrtc_version;
  j["compile_seconds"] = compile_seconds;
  j["mlajit_version"] = mlajit_version;
  j["created"] = created;
  return j.dump();
}

namespace {
// An unsigned integer field of the metadata. nlohmann's get<unsigned>() would convert a float or
// a negative number unchecked (1e300 -> undefined behaviour); a planted entry must not get there.
unsigned meta_uint(const nlohmann::json& j, const char* name) {
  const auto& v = j.at(name);
  if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() > UINT32_MAX
                                                          : (v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t{UINT32_MAX})))
    throw_error(ErrorKind::Cache, "bad metadata JSON: {} is {}, expected an integer in [0, 2^32)", name, json_excerpt(v));
  return static_cast<unsigned>(v.get<int64_t>());
}
}  // namespace

CacheEntryMeta CacheEntryMeta::from_json(const std::string& text) {
  try {
    nlohmann::json j;
    try {
      j = parse_json_input(text, "metadata", "meta");  // nesting limit, duplicate keys refused
    } catch (const Error& e) {
      throw_error(ErrorKind::Cache, "bad metadata JSON: {}", e.what());
    }
    CacheEntryMeta m;
    m.name = j.at("name").get<std::string>();
    m.base_key = j.value("base_key", "");
    m.op = j.at("op").get<std::string>();
    m.params_json = j.at("params").dump();
    for (auto& e : j.at("entries"))
      m.entries.push_back({e.at("symbol").get<std::string>(), meta_uint(e, "threads"), meta_uint(e, "smem")});
    m.arch = j.at("arch").get<std::string>();
    m.min_arch = j.value("min_arch", "");
    m.nvrtc_version = j.at("nvrtc_version").get<std::string>();
    m.compile_seconds = j.at("compile_seconds").get<double>();
    m.mlajit_version = j.value("mlajit_version", "");
    // An integer or absent (an older entry); j.value() would convert a float unchecked.
    if (j.contains("created") && !j["created"].is_number_integer())
      throw_error(ErrorKind::Cache, "bad metadata JSON: created is {}, expected unix seconds", json_excerpt(j["created"]));
    m.created = j.value("created", int64_t{0});
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorKind::Cache, "bad metadata JSON: {}", e.what());
  }
}

// ---- entry bytes (shared with the remote tier) ---------------------------------------------------

std::string encode_cache_entry(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin) {
  validate_cache_key(key);
  std::string meta_text = meta.to_json();
  std::string data;
  data.reserve(kHeaderSize + meta_text.size() + cubin.size());
  data.append(kMagic, 8);
  put_u32(data, kCacheFormatVersion);
  put_u32(data, static_cast<uint32_t>(meta_text.size()));
  put_u64(data, cubin.size());
  data += key;
  auto ps = sha256(cubin);
  data.append(reinterpret_cast<const char*>(ps.data()), 32);
  auto ms = sha256(meta_text);
  data.append(reinterpret_cast<const char*>(ms.data()), 32);
  data += meta_text;
  data += cubin;
  return data;
}

std::optional<CacheEntry> decode_cache_entry(const std::string& data, const std::string& key, std::string* why) {
  Parsed p = parse_entry(data, key);
  if (!p.entry && why) *why = p.reason;
  return std::move(p.entry);
}

// ---- DiskCache ----------------------------------------------------------------------------------

DiskCache::DiskCache(std::string dir, std::optional<uint64_t> max_bytes)
    : DiskCache(std::vector<std::string>{std::move(dir)}, max_bytes) {}

DiskCache::DiskCache(const std::vector<std::string>& dirs, std::optional<uint64_t> max_bytes)
    : layers_(resolve_cache_layers(dirs, /*create=*/true)), max_bytes_(max_bytes) {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i].writable) writable_ = static_cast<int>(i);
  dir_ = layers_[writable_ >= 0 ? writable_ : 0].dir;
  if (writable_ >= 0) remove_dead_temps(dir_, list_names(dir_));
  else log::info("no writable cache layer among {} director{}: kernels compiled on a miss are not kept", layers_.size(),
                 layers_.size() == 1 ? "y" : "ies");
}

std::unique_ptr<DiskCache> DiskCache::from_env() {
  if (config::disk_cache_disabled()) return nullptr;
  auto cache = std::make_unique<DiskCache>(config::cache_path(), config::cache_max_bytes());
  if (auto dir = config::prebuilt_cache_dir()) cache->add_read_only_layer(*dir);
  return cache;
}

void DiskCache::add_read_only_layer(const std::string& dir) {
  for (const CacheLayer& l : layers_)
    if (l.dir == dir) return;
  std::string why;
  if (auto layer = read_only_cache_layer(dir, &why)) {
    log::debug("cache layer {} (read-only, packaged) searched after {}", dir, layers_.back().dir);
    layers_.push_back(std::move(*layer));
  } else {
    log::warn("packaged cache layer not used: {}", why);
  }
}

DiskCache* DiskCache::default_cache() {
  static std::unique_ptr<DiskCache> cache;
  static bool disabled = false;
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  if (!cache && !disabled) {
    cache = from_env();  // throws for an unsafe directory; retried on the next call
    disabled = !cache;
  }
  return cache.get();
}

std::string DiskCache::path_of(const std::string& key) const { return dir_ + "/" + key + kEntrySuffix; }

std::optional<CacheEntry> DiskCache::get(const std::string& key) {
  validate_cache_key(key);
  for (const CacheLayer& layer : layers_) {
    std::string path = layer.dir + "/" + key + kEntrySuffix;
    ReadResult r = read_entry_file(path, !layer.writable, /*touch=*/true);
    if (!r.exists) continue;
    Parsed p;
    if (r.reason.empty()) p = parse_entry(r.data, key);
    else p.reason = r.reason;
    if (p.entry) {
      if (!layer.writable) log::info("{} ({}) served by the read-only cache layer {}", p.entry->meta.name, p.entry->meta.arch, layer.dir);
      return std::move(p.entry);
    }
    if (layer.writable) {
      log::warn("cache entry {} is bad ({}); removed, it will be recompiled", path, p.reason);
      remove_entry(layer.dir, key, path);
    } else {
      log::warn("cache entry {} in a read-only layer is bad ({}); skipped, not loaded", path, p.reason);
    }
  }
  return std::nullopt;
}

void DiskCache::put(const std::string& key, const CacheEntryMeta& meta, const std::string& cubin) {
  std::string data = encode_cache_entry(key, meta, cubin);
  if (writable_ < 0)
    throw_error(ErrorKind::Cache, "cannot store {}: every cache layer is read-only ({}{})", meta.name, dir_,
                layers_.size() > 1 ? ", ..." : "");

  remove_orphaned_locks_once(dir_);
  std::string tmp = dir_ + "/." + key + ".XXXXXX" + kTempSuffix;
  int fd = ::mkstemps(tmp.data(), static_cast<int>(std::strlen(kTempSuffix)));  // created 0600
  if (fd < 0) throw_error(ErrorKind::Io, "cannot create a temp file in cache directory {}: {}", dir_, errno_text());
  ::flock(fd, LOCK_EX | LOCK_NB);  // marks the temp file live (remove_dead_temps); released by close
  try {
    write_all(fd, data, tmp);
    if (::fsync(fd) != 0) throw_error(ErrorKind::Io, "fsync of {} failed: {}", tmp, errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  std::string path = path_of(key);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw_error(ErrorKind::Io, "cannot rename {} to {}: {}", tmp, path, why);
  }
  fsync_dir(dir_);
  log::debug("cache put {} ({}, {} bytes)", path, meta.name, data.size());
  evict_over_cap(key);
}

std::optional<CacheEntry> DiskCache::find_by_base_key(const std::string& base_key) {
  validate_cache_key(base_key);
  std::optional<CacheEntry> best;
  int64_t best_mtime = -1;
  for (auto& l : list()) {
    if (!is_key(l.key) || l.mtime < best_mtime) continue;
    ReadResult r = read_entry_file(l.path, l.read_only, /*touch=*/false);
    if (!r.reason.empty() || r.data.size() < kHeaderSize) continue;
    uint64_t meta_len = le::get(r.data, 12, 4);
    if (kHeaderSize + meta_len > r.data.size()) continue;
    if (r.data.find("\"base_key\":\"" + base_key + "\"", kHeaderSize) >= kHeaderSize + meta_len) continue;
    if (auto e = get(l.key)) {  // full verification (and LRU touch) of the candidate
      if (e->meta.base_key == base_key) {
        best = std::move(e);
        best_mtime = l.mtime;
      }
    }
  }
  return best;
}

std::vector<CacheListing> DiskCache::list() const {
  std::vector<CacheListing> out;
  for (const CacheLayer& layer : layers_) {
    auto in_layer = list_layer(layer);
    out.insert(out.end(), std::make_move_iterator(in_layer.begin()), std::make_move_iterator(in_layer.end()));
  }
  return out;
}

std::vector<CacheListing> DiskCache::list_layer(const CacheLayer& layer) const {
  std::vector<CacheListing> out;
  for (auto& n : list_names(layer.dir)) {
    if (!ends_with(n, kEntrySuffix)) continue;
    CacheListing l;
    l.key = n.substr(0, n.size() - std::strlen(kEntrySuffix));
    l.path = layer.dir + "/" + n;
    l.layer = layer.dir;
    l.read_only = !layer.writable;
    struct stat st;
    if (::lstat(l.path.c_str(), &st) != 0) continue;  // removed meanwhile
    l.size = static_cast<uint64_t>(st.st_size);
    l.mtime = static_cast<int64_t>(st.st_mtime);
    // Name and arch from the metadata; a header that does not parse shows "?" (verify says why).
    l.name = l.arch = "?";
    ReadResult r = read_entry_file(l.path, l.read_only, /*touch=*/false);
    if (r.reason.empty() && r.data.size() >= kHeaderSize) {
      uint64_t meta_len = le::get(r.data, 12, 4);
      if (kHeaderSize + meta_len <= r.data.size()) {
        try {
          auto m = CacheEntryMeta::from_json(r.data.substr(kHeaderSize, meta_len));
          l.name = m.name;
          l.arch = m.arch;
        } catch (const Error&) {
        }
      }
    }
    out.push_back(std::move(l));
  }
  std::stable_sort(out.begin(), out.end(), [](const CacheListing& a, const CacheListing& b) { return a.mtime < b.mtime; });
  return out;
}

VerifyReport DiskCache::verify(bool remove_corrupt) {
  VerifyReport rep;
  if (remove_corrupt && writable_ >= 0) remove_dead_temps(dir_, list_names(dir_));
  if (remove_corrupt && writable_ >= 0) orphaned_locks(dir_, list_names(dir_), /*remove=*/true);
  for (const CacheLayer& layer : layers_) {
    const bool read_only = !layer.writable;
    for (auto& n : list_names(layer.dir)) {
      if (!ends_with(n, kEntrySuffix)) continue;
      ++rep.entries;
      std::string path = layer.dir + "/" + n;
      std::string key = n.substr(0, n.size() - std::strlen(kEntrySuffix));
      std::string reason;
      if (!is_key(key)) {
        reason = "file name is not <sha256>.mjc";
      } else {
        ReadResult r = read_entry_file(path, read_only, /*touch=*/false);
        if (!r.exists) {
          --rep.entries;  // removed meanwhile
          continue;
        }
        reason = r.reason.empty() ? parse_entry(r.data, key).reason : r.reason;
      }
      if (reason.empty()) {
        ++rep.ok;
        continue;
      }
      rep.corrupt.push_back({path, reason, read_only});
      if (remove_corrupt && !read_only) remove_entry(layer.dir, key, path);
    }
  }
  return rep;
}

PruneReport DiskCache::prune(uint64_t max_bytes) {
  PruneReport rep;
  if (writable_ < 0) return rep;
  auto entries = list_layer(layers_[writable_]);
  uint64_t total = 0;
  for (auto& e : entries) total += e.size;
  for (auto& e : entries) {
    if (total <= max_bytes) break;
    if (remove_entry(dir_, e.key, e.path)) {
      total -= e.size;
      ++rep.removed;
      rep.removed_bytes += e.size;
    }
  }
  rep.remaining_bytes = total;
  // Locks whose entry is gone (left by a crash or an older mlajit) go too, unless held, and the
  // temp files of writers that died.
  auto names = list_names(dir_);
  remove_dead_temps(dir_, names);
  for (auto& n : names) {
    if (!ends_with(n, kLockSuffix)) continue;
    std::string key = n.substr(0, n.size() - std::strlen(kLockSuffix));
    struct stat st;
    if (is_key(key) && ::lstat(path_of(key).c_str(), &st) != 0 && errno == ENOENT) remove_lock(dir_, key);
  }
  return rep;
}

void DiskCache::evict_over_cap(const std::string& keep_key) {
  if (!max_bytes_ || writable_ < 0) return;
  auto entries = list_layer(layers_[writable_]);
  uint64_t total = 0;
  for (auto& e : entries) total += e.size;
  for (auto& e : entries) {
    if (total <= *max_bytes_) break;
    if (e.key == keep_key) continue;  // never evict what was just written
    if (remove_entry(dir_, e.key, e.path)) {
      total -= e.size;
      log::info("cache over its {}-byte cap: evicted {} ({})", *max_bytes_, e.path, e.name);
    }
  }
  if (total > *max_bytes_)
    log::warn("cache {} holds {} bytes, over its cap of {} bytes, after evicting all older entries", dir_, total, *max_bytes_);
}

size_t DiskCache::clear() {
  size_t removed = 0;
  if (writable_ < 0) return 0;
  for (auto& n : list_names(dir_)) {
    bool entry = ends_with(n, kEntrySuffix);
    bool ours = entry || ends_with(n, kLockSuffix) || (n[0] == '.' && ends_with(n, kTempSuffix));
    if (!ours) continue;  // never delete files mlajit did not write
    if (::unlink((dir_ + "/" + n).c_str()) == 0 && entry) ++removed;
  }
  return removed;
}

std::vector<std::string> orphaned_lock_files(const DiskCache& cache, bool remove) {
  if (!cache.writable()) return {};
  return orphaned_locks(cache.dir(), list_names(cache.dir()), remove);
}

// ---- KeyLock ------------------------------------------------------------------------------------

DiskCache::KeyLock::KeyLock(const DiskCache& cache, const std::string& key, double timeout_s) {
  validate_cache_key(key);
  if (!cache.writable()) return;  // never a file in a read-only layer, not even a lock
  std::string path = cache.dir() + "/" + key + kLockSuffix;
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    log::debug("cannot open lock {}: {}; compiling without it", path, errno_text());
    return;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      ::close(fd);
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      log::warn("lock {} still held after {:.1f} s; proceeding without it", path, timeout_s);
      ::close(fd);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  fd_ = fd;
  remove_orphaned_locks_once(cache.dir());  // this lock is held: it is not one of them
}

DiskCache::KeyLock::~KeyLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace mlajit
