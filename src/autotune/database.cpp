// The tuning database: one JSON file (<cache_dir>/tuning.json) of winner records keyed by op,
// device name and SM count, shape bucket, mlajit version and the non-knob params.
//
// Concurrency: writers take an exclusive flock on "<path>.lock" around read-merge-write, so two
// tuners (threads or processes) never lose each other's records; readers take no lock because
// every write is a rename of a complete, fsync'ed temp file (a reader sees the old or the new
// file, never a torn one). A corrupt file is reported and ignored by readers; the next merge
// keeps a copy as "<path>.corrupt" before replacing it. Records this build cannot parse (another
// mlajit version's params, say) are carried through merges untouched.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"

namespace mlajit::autotune {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "mlajit-tuning";
constexpr int kFormatVersion = 1;

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t parse_hex64(const json& j, const std::string& path) {
  if (!j.is_string() || j.get<std::string>().size() != 16) throw_invalid(path, json_excerpt(j), "16 hex digits");
  try {
    return std::stoull(j.get<std::string>(), nullptr, 16);
  } catch (const std::exception&) {
    throw_invalid(path, json_excerpt(j), "16 hex digits");
  }
}

[[noreturn]] void throw_io(const std::string& what, const std::string& path) {
  throw_error(ErrorKind::Io, "tuning database: {} {}: {}", what, path, std::strerror(errno));
}

// Holds an exclusive flock for the lifetime of the object.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) throw_io("cannot open lock file", path);
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw_io("cannot lock", path);
      }
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

struct ParsedFile {
  bool exists = false;
  bool corrupt = false;
  std::string why;
  std::vector<TuningRecord> records;
  std::vector<json> foreign;  // records this build cannot parse, kept verbatim
};

ParsedFile read_file(const std::string& path) {
  ParsedFile out;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return out;
  out.exists = true;
  json j;
  try {
    // Bounded, regular files only (a FIFO or device at this path is refused, not waited on), and
    // parsed with the nesting limit and duplicate keys refused.
    j = parse_json_input(read_input_file(path, "tuning database", kMaxTuningFileBytes), "tuning database", "tuning");
  } catch (const Error& e) {
    out.corrupt = true;
    out.why = e.what();
    return out;
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat || !j.contains("records") ||
      !j["records"].is_array()) {
    out.corrupt = true;
    out.why = fmt::format("not a {{\"format\": \"{}\", \"records\": [...]}} object", kFormat);
    return out;
  }
  const auto& recs = j["records"];
  for (size_t i = 0; i < recs.size(); ++i) {
    try {
      out.records.push_back(TuningRecord::from_json(recs[i], fmt::format("records[{}]", i)));
    } catch (const Error& e) {
      log::debug("tuning database {}: keeping unparsed record: {}", path, e.what());
      out.foreign.push_back(recs[i]);
    }
  }
  return out;
}

void write_atomically(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) throw_io("cannot create", tmp);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = err;
      throw_io("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = err;
    throw_io("cannot fsync", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    throw_io("cannot rename into place", path);
  }
  // Make the rename itself durable.
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

// ---- records ------------------------------------------------------------------------------------

std::string TuningRecord::key() const {
  return fmt::format("{}|{}|{}|{}|{}|{}", op_name(op), device, sm_count, bucket.to_json(op).dump(), version,
                     params_to_json(default_knobs(params)).dump());
}

json TuningRecord::to_json() const {
  return json{{"op", std::string(op_name(op))},
              {"device", device},
              {"sm_count", sm_count},
              {"bucket", bucket.to_json(op)},
              {"version", version},
              {"params", params_to_json(params)},
              {"knobs", knobs_of(params)},
              {"median_ms", median_ms},
              {"default_ms", default_ms},
              {"sweep", hex64(sweep_signature)},
              {"tuned_at", tuned_at}};
}

TuningRecord TuningRecord::from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw_invalid(path, json_excerpt(j), "a record object");
  auto need = [&](const char* k) -> const json& {
    auto it = j.find(k);
    if (it == j.end()) throw_invalid(path + "." + k, "nothing", "a value");
    return *it;
  };
  TuningRecord r;
  const json& op = need("op");
  if (!op.is_string()) throw_invalid(path + ".op", json_excerpt(op), "an op name");
  r.op = parse_op(op.get<std::string>(), path + ".op");
  const json& dev = need("device");
  if (!dev.is_string()) throw_invalid(path + ".device", json_excerpt(dev), "a device name");
  r.device = dev.get<std::string>();
  const json& sm = need("sm_count");
  if (!sm.is_number_integer() || (sm.is_number_unsigned() ? sm.get<uint64_t>() > 2147483647u
                                                           : (sm.get<int64_t>() < 1 || sm.get<int64_t>() > 2147483647)))
    throw_invalid(path + ".sm_count", json_excerpt(sm), "a positive integer below 2^31");
  r.sm_count = sm.get<int>();
  r.bucket = ShapeBucket::from_json(r.op, need("bucket"), path + ".bucket");
  const json& ver = need("version");
  if (!ver.is_string()) throw_invalid(path + ".version", json_excerpt(ver), "a version string");
  r.version = ver.get<std::string>();
  r.params = params_from_json(r.op, need("params"), path + ".params");
  KernelSpec{r.params}.validate();
  const json& med = need("median_ms");
  if (!med.is_number() || !(med.get<double>() > 0)) throw_invalid(path + ".median_ms", json_excerpt(med), "a positive time");
  r.median_ms = med.get<double>();
  r.default_ms = j.value("default_ms", 0.0);
  r.sweep_signature = j.contains("sweep") ? parse_hex64(j["sweep"], path + ".sweep") : 0;
  r.tuned_at = j.value("tuned_at", int64_t{0});
  return r;
}

// ---- the file -----------------------------------------------------------------------------------

TuningDb::TuningDb(std::string path) : path_(std::move(path)) {}

std::string TuningDb::default_path(const std::string& cache_dir) { return (fs::path(cache_dir) / "tuning.json").string(); }

std::vector<TuningRecord> TuningDb::load(bool* corrupt) const {
  ParsedFile f = read_file(path_);
  if (corrupt) *corrupt = f.corrupt;
  if (f.corrupt) {
    log::warn("tuning database {} is corrupt ({}); ignoring it (the next tune replaces it and keeps a copy as {}.corrupt)",
              path_, f.why, path_);
    return {};
  }
  return std::move(f.records);
}

size_t TuningDb::merge(const std::vector<TuningRecord>& records) const {
  const fs::path dir = fs::path(path_).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) {
      fs::create_directories(dir, ec);
      if (ec) throw_error(ErrorKind::Io, "tuning database: cannot create directory {}: {}", dir.string(), ec.message());
      fs::permissions(dir, fs::perms::owner_all, ec);
    }
  }
  FileLock lock(path_ + ".lock");
  ParsedFile f = read_file(path_);
  if (f.corrupt) {
    log::warn("tuning database {} is corrupt ({}); replacing it, the old bytes are kept in {}.corrupt", path_, f.why,
              path_);
    std::error_code ec;
    fs::copy_file(path_, path_ + ".corrupt", fs::copy_options::overwrite_existing, ec);
    if (ec) log::warn("tuning database: cannot keep a copy of the corrupt file: {}", ec.message());
  }
  // Ordered by key so that the file is deterministic and diffs stay readable.
  std::map<std::string, TuningRecord> merged;
  auto offer = [&](const TuningRecord& r) {
    auto [it, inserted] = merged.emplace(r.key(), r);
    if (!inserted && r.median_ms < it->second.median_ms) it->second = r;
  };
  for (const auto& r : f.records) offer(r);
  for (const auto& r : records) offer(r);

  json out = {{"format", kFormat}, {"format_version", kFormatVersion}, {"records", json::array()}};
  for (const auto& [k, r] : merged) out["records"].push_back(r.to_json());
  for (const auto& raw : f.foreign) out["records"].push_back(raw);
  write_atomically(path_, out.dump(1) + "\n");
  return out["records"].size();
}

}  // namespace mlajit::autotune
