// Environment variable parsing (see include/mlajit/config.hpp).
#include <dlfcn.h>
#include <sys/stat.h>

#include <climits>
#include <cstdlib>

#include "mlajit/config.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "mlajit/error.hpp"

namespace mlajit::config {

const std::vector<const char*>& variables() {
  static const std::vector<const char*> names = {
      "MLAJIT_CACHE_DIR",
      "MLAJIT_CACHE_PATH",
      "MLAJIT_CACHE_MAX_BYTES",
      "MLAJIT_PREBUILT_CACHE",
      "MLAJIT_DISABLE_DISK_CACHE",
      "MLAJIT_DUMP_DIR",
      "MLAJIT_LOG",
      "MLAJIT_ARCH",
      "MLAJIT_DEVICE",
      "MLAJIT_TEMPLATE_DIR",
      "MLAJIT_NVRTC_EXTRA_OPTIONS",
      "MLAJIT_REMOTE_CACHE",
      "MLAJIT_REMOTE_CACHE_KEY_FILE",
      "MLAJIT_REMOTE_CACHE_ALLOW_UNSIGNED",
      "MLAJIT_REMOTE_CACHE_PREFIX",
      "MLAJIT_REMOTE_CACHE_TTL",
      "MLAJIT_REMOTE_CACHE_CONNECT_TIMEOUT_MS",
      "MLAJIT_REMOTE_CACHE_TIMEOUT_MS",
  };
  return names;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool env_flag(const char* name) {
  auto v = env(name);
  if (!v) return false;
  std::string s;
  for (char c : *v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw_invalid(name, fmt::format("\"{}\"", *v), "1 | true | yes | on | 0 | false | no | off");
}

std::string cache_dir() {
  if (auto d = env("MLAJIT_CACHE_DIR")) return *d;
  if (auto x = env("XDG_CACHE_HOME")) return *x + "/mlajit";
  if (auto h = env("HOME")) return *h + "/.cache/mlajit";
  throw Error(ErrorKind::Cache,
              "no cache directory: MLAJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset "
              "(set MLAJIT_CACHE_DIR or MLAJIT_DISABLE_DISK_CACHE=1)");
}

std::vector<std::string> cache_path() {
  auto path = env("MLAJIT_CACHE_PATH");
  if (!path) return {cache_dir()};
  if (auto dir = env("MLAJIT_CACHE_DIR"))
    throw_invalid("MLAJIT_CACHE_PATH and MLAJIT_CACHE_DIR", fmt::format("both set (\"{}\" and \"{}\")", *path, *dir),
                  "one of them: MLAJIT_CACHE_PATH=/ro/layer:/writable/layer lists every directory");
  std::vector<std::string> dirs;
  size_t start = 0;
  while (start <= path->size()) {
    size_t end = std::min(path->find(':', start), path->size());
    if (end > start) dirs.push_back(path->substr(start, end - start));
    start = end + 1;
  }
  if (dirs.empty()) throw_invalid("MLAJIT_CACHE_PATH", fmt::format("\"{}\"", *path), "directories separated by ':'");
  return dirs;
}

std::optional<std::string> prebuilt_cache_dir() {
  if (auto v = env("MLAJIT_PREBUILT_CACHE")) {
    if (*v == "off" || *v == "0" || v->empty()) return std::nullopt;
    return *v;
  }
  // The file this code was loaded from: libmlajit.so, or an executable linking it statically.
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&prebuilt_cache_dir), &info) == 0 || info.dli_fname == nullptr) return std::nullopt;
  std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash);
  for (const std::string& candidate : {dir + "/prebuilt-cache", dir + "/../share/mlajit/prebuilt-cache"}) {
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      char resolved[PATH_MAX];
      return ::realpath(candidate.c_str(), resolved) ? std::string(resolved) : candidate;
    }
  }
  return std::nullopt;
}

bool disk_cache_disabled() { return env_flag("MLAJIT_DISABLE_DISK_CACHE"); }

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  const char* expected = "a byte count such as 1000000, 64K, 512M or 2G";
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) throw_invalid(what, text, expected);
  size_t pos = 0;
  uint64_t n = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    uint64_t d = static_cast<uint64_t>(text[pos] - '0');
    if (n > (UINT64_MAX - d) / 10) throw_invalid(what, text, "a byte count below 2^64");
    n = n * 10 + d;
    ++pos;
  }
  uint64_t mult = 1;
  if (pos < text.size()) {
    char u = static_cast<char>(std::toupper(static_cast<unsigned char>(text[pos])));
    if (u == 'K') mult = 1ull << 10;
    else if (u == 'M') mult = 1ull << 20;
    else if (u == 'G') mult = 1ull << 30;
    else throw_invalid(what, text, expected);
    ++pos;
    if (pos < text.size() && (text[pos] == 'B' || text[pos] == 'b')) ++pos;
  }
  if (pos != text.size()) throw_invalid(what, text, expected);
  if (n > UINT64_MAX / mult) throw_invalid(what, text, "a byte count below 2^64");
  return n * mult;
}

std::optional<uint64_t> cache_max_bytes() {
  auto v = env("MLAJIT_CACHE_MAX_BYTES");
  if (!v) return std::nullopt;
  return parse_bytes(*v, "MLAJIT_CACHE_MAX_BYTES");
}

std::optional<std::string> dump_dir() { return env("MLAJIT_DUMP_DIR"); }
std::optional<std::string> arch_override() { return env("MLAJIT_ARCH"); }
std::optional<std::string> template_dir() { return env("MLAJIT_TEMPLATE_DIR"); }

std::vector<std::string> nvrtc_extra_options() {
  constexpr const char* kName = "MLAJIT_NVRTC_EXTRA_OPTIONS";
  std::vector<std::string> out;
  auto v = env(kName);
  if (!v) return out;
  const std::string& s = *v;
  for (size_t i = 0; i < s.size();) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    std::string o = s.substr(i, j - i);
    i = j;
    if (o[0] != '-')
      throw_invalid(kName, fmt::format("\"{}\" (item \"{}\")", s, o), "NVRTC options separated by spaces, each starting with '-'");
    // The target is the build's arch (and a cache key input of its own): a second one here would
    // store a cubin for another GPU under this arch's key.
    if (o.rfind("-arch", 0) == 0 || o.rfind("--gpu-architecture", 0) == 0)
      throw_invalid(kName, fmt::format("\"{}\" (item \"{}\")", s, o), "options other than the target (set it with --arch / MLAJIT_ARCH)");
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace mlajit::config
