// Cache archives: pack and verify (layout and trust: include/mlajit/cache_archive.hpp).
#include "mlajit/cache_archive.hpp"

#include <cstring>
#include <ctime>
#include <set>

#include <nlohmann/json.hpp>

#include "core/hmac.hpp"
#include "core/input.hpp"
#include "core/little_endian.hpp"
#include "core/sha256.hpp"
#include "mlajit/error.hpp"
#include "mlajit/version.hpp"

namespace mlajit {

namespace {

constexpr char kArchiveMagic[8] = {'M', 'L', 'A', 'J', 'I', 'T', 'A', '\n'};
constexpr size_t kArchiveHeader = 52;
constexpr size_t kSignatureBytes = 32;
constexpr const char* kSignatureDomain = "mlajit cache archive v1";

using le::get_u32;
using le::put_u32;

std::string sign(const std::string& key, const std::string& manifest) {
  HmacSha256 h(key);
  h.update_field(kSignatureDomain);
  h.update_field(manifest);
  auto d = h.finish();
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

[[noreturn]] void bad_archive(const std::string& why) {
  throw Error(ErrorKind::Cache, "refusing the cache archive: " + why + "; nothing was imported");
}

}  // namespace

std::string pack_cache_archive(const std::vector<ArchiveEntry>& entries, const std::string& hmac_key) {
  nlohmann::json list = nlohmann::json::array();
  std::string body;
  for (const auto& e : entries) {
    std::string file = encode_cache_entry(e.key, e.entry.meta, e.entry.cubin);
    list.push_back({{"key", e.key},
                    {"name", e.entry.meta.name},
                    {"arch", e.entry.meta.arch},
                    {"bytes", file.size()},
                    {"sha256", sha256_hex(file)}});
    body += file;
  }
  const std::string manifest = nlohmann::json{{"format", kCacheArchiveVersion},
                                              {"mlajit_version", MLAJIT_VERSION_STRING},
                                              {"created", static_cast<int64_t>(std::time(nullptr))},
                                              {"entries", list}}
                                   .dump();
  const std::string signature = hmac_key.empty() ? std::string() : sign(hmac_key, manifest);
  std::string out(kArchiveMagic, 8);
  put_u32(out, kCacheArchiveVersion);
  put_u32(out, static_cast<uint32_t>(manifest.size()));
  put_u32(out, static_cast<uint32_t>(signature.size()));
  const auto manifest_sum = sha256(manifest);
  out.append(reinterpret_cast<const char*>(manifest_sum.data()), manifest_sum.size());
  out += manifest;
  out += signature;
  out += body;
  return out;
}

UnpackedArchive unpack_cache_archive(const std::string& data, const std::string& hmac_key, bool allow_unsigned) {
  if (data.size() < kArchiveHeader)
    bad_archive(fmt::format("{} bytes, shorter than the {}-byte header (truncated?)", data.size(), kArchiveHeader));
  if (std::memcmp(data.data(), kArchiveMagic, 8) != 0) bad_archive("bad magic (not an mlajit cache archive)");
  if (uint32_t v = get_u32(data, 8); v != kCacheArchiveVersion)
    bad_archive(fmt::format("archive format {}, this mlajit reads {}", v, kCacheArchiveVersion));
  const size_t manifest_len = get_u32(data, 12), signature_len = get_u32(data, 16);
  if (signature_len != 0 && signature_len != kSignatureBytes)
    bad_archive(fmt::format("signature of {} bytes, expected 0 or {}", signature_len, kSignatureBytes));
  if (manifest_len + signature_len > data.size() - kArchiveHeader)
    bad_archive(fmt::format("the header promises a {}-byte manifest and a {}-byte signature, but only {} bytes follow "
                            "(truncated?)",
                            manifest_len, signature_len, data.size() - kArchiveHeader));
  const std::string manifest = data.substr(kArchiveHeader, manifest_len);
  const std::string signature = data.substr(kArchiveHeader + manifest_len, signature_len);
  const auto manifest_sum = sha256(manifest);
  if (std::memcmp(manifest_sum.data(), data.data() + 20, manifest_sum.size()) != 0)
    bad_archive("manifest checksum mismatch (damaged or altered)");

  UnpackedArchive out;
  out.is_signed = signature_len != 0;
  if (!hmac_key.empty()) {
    if (!out.is_signed && !allow_unsigned)
      bad_archive("it is unsigned and a key is configured (MLAJIT_REMOTE_CACHE_KEY_FILE); import it with "
                  "--allow-unsigned if you trust its source");
    if (out.is_signed) {
      if (!constant_time_equal(signature, sign(hmac_key, manifest)))
        bad_archive("its signature does not verify with the configured key (made with another key, or altered)");
      out.signature_verified = true;
    }
  }

  nlohmann::json j;
  try {
    // Nesting limit and duplicate keys refused, as in every JSON input.
    j = parse_json_input(manifest, "the manifest", "manifest");
  } catch (const Error& e) {
    bad_archive(e.what());
  }
  if (!j.is_object() || !j.contains("entries") || !j["entries"].is_array())
    bad_archive("the manifest is not a JSON object with an \"entries\" list");
  const nlohmann::json format = j.contains("format") ? j["format"] : nlohmann::json();
  if (!format.is_number_unsigned() || format.get<uint64_t>() != kCacheArchiveVersion)
    bad_archive(fmt::format("the manifest says format {}, expected {}", json_excerpt(format), kCacheArchiveVersion));
  size_t offset = kArchiveHeader + manifest_len + signature_len;
  std::set<std::string> keys;
  for (const auto& m : j["entries"]) {
    const size_t index = out.entries.size();
    auto field = [&](const char* name) -> std::string {
      if (!m.is_object() || !m.contains(name) || !m[name].is_string())
        bad_archive(fmt::format("manifest entry {} has no string \"{}\"", index, name));
      return m[name].get<std::string>();
    };
    ArchiveEntry e;
    e.key = field("key");
    // Quoted in messages (bounded, control characters escaped); compared below as they are.
    const std::string name = field("name"), arch = field("arch"), sum = field("sha256");
    const std::string qname = json_quoted(name, 80), qarch = json_quoted(arch, 40);
    try {
      validate_cache_key(e.key);
    } catch (const Error&) {
      bad_archive(fmt::format("manifest entry {} ({}): key {} is not 64 lowercase hex characters", index, qname,
                              json_quoted(e.key, 80)));
    }
    if (!keys.insert(e.key).second) bad_archive(fmt::format("entry {} ({}) is listed twice", e.key, qname));
    if (!m.contains("bytes") || !m["bytes"].is_number_unsigned())
      bad_archive(fmt::format("manifest entry {} ({}) has no byte count", index, qname));
    const uint64_t bytes = m["bytes"].get<uint64_t>();
    if (bytes > data.size() - offset)
      bad_archive(fmt::format("entry {} ({}) needs {} bytes at offset {}, but the archive ends at {} (truncated?)",
                              index, qname, bytes, offset, data.size()));
    const std::string file = data.substr(offset, bytes);
    offset += bytes;
    if (sha256_hex(file) != sum)
      bad_archive(fmt::format("entry {} ({} for {}): SHA-256 mismatch (damaged or altered)", index, qname, qarch));
    std::string why;
    auto decoded = decode_cache_entry(file, e.key, &why);
    if (!decoded) bad_archive(fmt::format("entry {} ({} for {}): {}", index, qname, qarch, why));
    if (decoded->meta.name != name || decoded->meta.arch != arch)
      bad_archive(fmt::format("entry {}: the manifest says {} for {}, the entry {} for {}", index, qname, qarch,
                              json_quoted(decoded->meta.name, 80), json_quoted(decoded->meta.arch, 40)));
    e.entry = std::move(*decoded);
    out.entries.push_back(std::move(e));
  }
  if (offset != data.size())
    bad_archive(fmt::format("{} bytes after the last entry (the manifest lists {} entries ending at {})",
                            data.size() - offset, out.entries.size(), offset));
  return out;
}

}  // namespace mlajit
