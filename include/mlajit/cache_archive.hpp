#pragma once
// A cache archive: a set of disk-cache entries (a config's kernels, for one or several archs) as
// one file, to ship a warm cache into an image or onto a machine (`mlajit cache export|import`).
//
//   0   "MLAJITA\n"                 magic (8 bytes)
//   8   u32 archive format version  kCacheArchiveVersion (little-endian, as every integer here)
//   12  u32 manifest length M
//   16  u32 signature length S      0 (unsigned) or 32
//   20  sha256(manifest)            32 bytes
//   52  manifest JSON (M bytes)     {"format", "mlajit_version", "created", "entries": [{"key",
//                                   "name", "arch", "bytes", "sha256"}, ...]}
//   52+M signature (S bytes)        HMAC-SHA256(key, fields "mlajit cache archive v1", manifest)
//   52+M+S the entries' files        each exactly as a disk-cache entry file (cache.hpp), in
//                                   manifest order, `bytes` long each
//
// Trust: the manifest's checksum, its per-entry SHA-256 and every entry's own checks (magic, key, lengths, both
// checksums, metadata) make a damaged or truncated archive an error; they do not say who made it.
// The signature does: with a key, an archive whose signature does not verify is refused, and an
// unsigned one unless the caller allows it. Without a key the signature cannot be checked and an
// archive is as trusted as the person who imports it (as when copying files into the cache).
#include <cstdint>
#include <string>
#include <vector>

#include "mlajit/cache.hpp"

namespace mlajit {

constexpr uint32_t kCacheArchiveVersion = 1;

struct ArchiveEntry {
  std::string key;
  CacheEntry entry;  // decoded (and verified) entry
};

// The archive of `entries` (in this order), signed when `hmac_key` is not empty.
std::string pack_cache_archive(const std::vector<ArchiveEntry>& entries, const std::string& hmac_key);

struct UnpackedArchive {
  std::vector<ArchiveEntry> entries;
  bool is_signed = false;           // the archive carries a signature
  bool signature_verified = false;  // ... and it verified with the caller's key
};

// Verifies the whole archive -- layout, manifest, signature, each entry's SHA-256 and its own
// checks, that its metadata says the manifest's name and arch -- and returns every entry; throws
// Error(Cache) naming the first problem. `hmac_key` empty: the signature is not checked. With a
// key, an unsigned archive is refused unless `allow_unsigned`.
UnpackedArchive unpack_cache_archive(const std::string& data, const std::string& hmac_key, bool allow_unsigned);

}  // namespace mlajit
