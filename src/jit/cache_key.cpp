// The cache key: everything that determines the cubin, hashed (see include/mlajit/cache.hpp).
#include "mlajit/cache.hpp"
#include "mlajit/error.hpp"
#include "mlajit/version.hpp"
#include "core/sha256.hpp"

namespace mlajit {

std::string cache_key(const KernelSource& src, const std::string& arch, const std::vector<std::string>& options,
                      const std::string& nvrtc_version) {
  Sha256 h;
  h.update_field("mlajit cache key");
  h.update_field(std::to_string(kCacheFormatVersion));
  h.update_field(MLAJIT_VERSION_STRING);
  h.update_field(arch);
  h.update_field(nvrtc_version);
  h.update_field(std::to_string(options.size()));
  for (auto& o : options) h.update_field(o);
  // The kernel's own options (KernelSource::nvrtc_options). Hashed only when present, so the keys
  // of kernels without any are what they were before these existed.
  if (!src.nvrtc_options.empty()) {
    h.update_field("kernel options");
    h.update_field(std::to_string(src.nvrtc_options.size()));
    for (auto& o : src.nvrtc_options) h.update_field(o);
  }
  // Hashed only when the source compiles as several units, so other keys stay as they were.
  if (src.compile_units > 1) {
    h.update_field("compile units");
    h.update_field(std::to_string(src.compile_units));
  }
  h.update_field(src.code);
  auto templates = included_templates(src.code);
  h.update_field(std::to_string(templates.size()));
  for (auto* t : templates) {
    h.update_field(t->path);
    h.update_field(t->content);
  }
  auto d = h.finish();
  return to_hex(d.data(), d.size());
}

std::string cache_base_key(const KernelSource& src, const std::string& arch, const std::vector<std::string>& options) {
  // An NVRTC version can never be the empty string, so base keys never equal full keys.
  return cache_key(src, arch, options, "");
}

void validate_cache_key(const std::string& key) {
  bool ok = key.size() == 64;
  for (char c : key) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (!ok) throw_invalid("cache key", fmt::format("\"{}\"", key), "64 lowercase hex characters (a SHA-256)");
}

}  // namespace mlajit
