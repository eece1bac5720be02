// libFuzzer target: the cache entry reader (DiskCache::get / list / verify / find_by_base_key),
// i.e. header, lengths, checksums and metadata JSON of <key>.mjc files (layout: cache.hpp).
// Input byte 0 picks how the remaining bytes become an entry file:
//   even: written as they are (header parsing, length and checksum checks);
//   odd:  "<header tweak byte><meta length u16><meta JSON><payload>" wrapped in a header with the
//         right magic, version, key and checksums, so that the metadata parser and the length
//         arithmetic are reached; the tweak byte corrupts one header field (0 = none).
// Properties: an entry get() returns is exactly what was written (never a corrupt one), and a bad
// entry is gone afterwards (removed, reported as a miss).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/sha256.hpp"
#include "fuzz_util.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/log.hpp"
#include "mlajit/version.hpp"

using namespace mlajit;

namespace {

const std::string kKey = sha256_hex("fuzz entry");

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s += static_cast<char>(v >> (8 * i));
}

std::string wrap(const std::string& meta, const std::string& payload) {
  std::string d("MLAJITC\n", 8);
  put_le(d, kCacheFormatVersion, 4);
  put_le(d, meta.size(), 4);
  put_le(d, payload.size(), 8);
  d += kKey;
  auto ps = sha256(payload), ms = sha256(meta);
  d.append(reinterpret_cast<const char*>(ps.data()), 32);
  d.append(reinterpret_cast<const char*>(ms.data()), 32);
  return d + meta + payload;
}

std::string g_dir;

DiskCache& cache() {
  static std::unique_ptr<DiskCache> c = [] {
    char tmpl[] = "/tmp/mlajit_fuzz_cache_XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    g_dir = tmpl;
    std::atexit([] {
      ::unlink((g_dir + "/" + kKey + ".lock").c_str());
      ::rmdir(g_dir.c_str());
    });
    return std::make_unique<DiskCache>(tmpl);
  }();
  return *c;
}

void write_file(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) std::abort();
  ::close(fd);
}

}  // namespace

// Only libFuzzer calls this (the unit suite's replay keeps its log level).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::set_level(log::Level::error);  // a bad entry is logged as a warning on every run
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  DiskCache& c = cache();
  std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file;
  std::string expect_meta, expect_payload;
  bool well_formed = false;
  if (data[0] & 1) {
    if (in.size() < 3) return 0;
    uint8_t tweak = static_cast<uint8_t>(in[0]);
    size_t mlen = (static_cast<uint8_t>(in[1]) | (static_cast<uint8_t>(in[2]) << 8));
    std::string rest = in.substr(3);
    mlen = std::min(mlen, rest.size());
    expect_meta = rest.substr(0, mlen);
    expect_payload = rest.substr(mlen);
    file = wrap(expect_meta, expect_payload);
    well_formed = tweak == 0;
    // Corrupt one byte of the header (offset < 152) with the tweak's value.
    if (tweak) file[(tweak * 7u) % 152u] ^= static_cast<char>(tweak | 1);
  } else {
    file = in;
  }
  const std::string path = c.path_of(kKey);
  write_file(path, file);

  fuzz::refused_or_ok([&] { (void)c.list(); });
  fuzz::refused_or_ok([&] { (void)c.verify(/*remove_corrupt=*/false); });
  fuzz::refused_or_ok([&] { (void)c.find_by_base_key(sha256_hex("fuzz base")); });
  fuzz::refused_or_ok([&] {
    auto e = c.get(kKey);
    struct stat st;
    bool still_there = ::lstat(path.c_str(), &st) == 0;
    if (!e) {
      if (still_there) fuzz::broken("a bad entry was reported as a miss but left on disk");
      return;
    }
    // Every header byte is checked (magic, version, lengths, key, both checksums).
    if ((data[0] & 1) && !well_formed) fuzz::broken("an entry with a corrupted header was accepted");
    if ((data[0] & 1) && e->cubin != expect_payload) fuzz::broken("get() returned a payload that was not written");
    // A loaded entry's metadata must serialize again (the cache writes it back that way).
    (void)CacheEntryMeta::from_json(e->meta.to_json());
  });
  ::unlink(path.c_str());
  return 0;
}
