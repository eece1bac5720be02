// The layers of a cache search path (MLAJIT_CACHE_PATH): which directories are trusted, and which
// one takes misses (rules: include/mlajit/cache.hpp, "Layers").
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mlajit/cache.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"
#include "mlajit/log.hpp"

namespace mlajit {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Refuses directories others could plant a cubin in. Root may own a layer (it can write anywhere
// anyway); any other user may not, even for a read-only layer: its owner could replace entries.
void check_layer_safe(const std::string& dir, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) throw_error(ErrorKind::Cache, "cache directory {} is not a directory", dir);
  if (st.st_uid != geteuid() && st.st_uid != 0)
    throw_error(ErrorKind::Cache,
                "refusing cache directory {}: it is owned by uid {}, neither the current user (uid {}) nor root; "
                "loading a cubin runs code on the GPU, so a cache directory may belong only to you, or to root as a "
                "read-only layer. Set MLAJIT_CACHE_DIR (or MLAJIT_CACHE_PATH) to directories of yours",
                dir, st.st_uid, geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw_error(ErrorKind::Cache,
                "refusing cache directory {}: it is writable by {} (mode {:04o}); loading a cubin runs code on the "
                "GPU, so the cache must be writable by its owner alone. Fix it with `chmod go-w {}`",
                dir, (st.st_mode & S_IWOTH) ? "other users" : "its group", st.st_mode & 07777, dir);
}

// Creates each missing component 0700, leaving existing ones as they are. false + `why` on failure.
bool make_dirs(const std::string& dir, std::string* why) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = fmt::format("cannot create {}: {}", part, errno_text());
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<CacheLayer> resolve_cache_layers(const std::vector<std::string>& dirs, bool create) {
  if (dirs.empty()) throw_invalid("cache directories", "none", "at least one directory");
  std::vector<CacheLayer> layers;
  std::vector<std::string> skipped;  // why each missing layer is not used, for the error below
  bool have_writable = false;
  for (std::string dir : dirs) {
    if (dir.empty()) throw_invalid("cache directory", "\"\"", "a directory path");
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    CacheLayer layer;
    layer.dir = dir;
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT) throw_error(ErrorKind::Cache, "cannot use cache directory {}: {}", dir, errno_text());
      if (have_writable) {
        log::debug("cache layer {} does not exist; skipped (nothing to read there)", dir);
        skipped.push_back(dir + " (missing)");
        continue;
      }
      if (!create) {
        layer.exists = false;
        layer.writable = have_writable = true;
        layer.owner_uid = geteuid();
        layers.push_back(std::move(layer));
        continue;
      }
      std::string why;
      if (!make_dirs(dir, &why)) {
        // A missing system layer (/opt/...) a user cannot create holds nothing to read either.
        log::info("cache layer {} does not exist and {}; skipped", dir, why);
        skipped.push_back(dir + " (" + why + ")");
        continue;
      }
      if (::stat(dir.c_str(), &st) != 0) throw_error(ErrorKind::Cache, "cannot use cache directory {}: {}", dir, errno_text());
      log::info("created cache directory {} (mode 0700)", dir);
    }
    check_layer_safe(dir, st);
    layer.owner_uid = st.st_uid;
    // The owner's write bit, not access(2): root passes access(W_OK) on a 0555 directory, yet a
    // layer its owner made read-only is meant to stay as built.
    layer.writable = !have_writable && st.st_uid == geteuid() && (st.st_mode & S_IWUSR);
    have_writable |= layer.writable;
    layers.push_back(std::move(layer));
  }
  if (layers.empty()) {
    std::string list;
    for (auto& s : skipped) list += (list.empty() ? "" : "; ") + s;
    throw_error(ErrorKind::Cache, "no usable cache directory: {}", list);
  }
  return layers;
}

std::optional<CacheLayer> read_only_cache_layer(const std::string& dir, std::string* why) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    *why = fmt::format("cannot use {}: {}", dir, errno_text());
    return std::nullopt;
  }
  try {
    check_layer_safe(dir, st);
  } catch (const Error& e) {
    *why = e.what();
    return std::nullopt;
  }
  CacheLayer layer;
  layer.dir = dir;
  layer.writable = false;
  layer.owner_uid = st.st_uid;
  return layer;
}

std::vector<CacheLayer> cache_layers_from_env() {
  std::vector<CacheLayer> layers = resolve_cache_layers(config::cache_path(), /*create=*/false);
  if (auto dir = config::prebuilt_cache_dir()) {
    std::string why;
    if (auto layer = read_only_cache_layer(*dir, &why)) layers.push_back(std::move(*layer));
  }
  return layers;
}

std::optional<std::string> writable_cache_dir_from_env() {
  for (auto& layer : cache_layers_from_env())
    if (layer.writable) return layer.dir;
  return std::nullopt;
}

}  // namespace mlajit
