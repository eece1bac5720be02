// libFuzzer target: the cache archive reader (`mlajit cache import`; layout and trust:
// include/mlajit/cache_archive.hpp). Input byte 0 picks how the remaining bytes are used:
//   bit 0 clear: the bytes are the archive, read without a key (bit 1 clear) or with one (set);
//                whatever is accepted must pack again into an archive that reads back the same.
//   bit 0 set:   "<position u16><xor byte><cubin>": one signed archive of two entries built from
//                the cubin, then the byte at `position` (modulo the size) xored; read with the key,
//                it must be accepted exactly when nothing changed (every byte is covered by the
//                header, the manifest checksum, the signature or an entry's SHA-256).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/sha256.hpp"
#include "fuzz_util.hpp"
#include "mlajit/cache_archive.hpp"
#include "mlajit/error.hpp"

using namespace mlajit;

namespace {

const std::string kFuzzKey = "fuzz archive key, 32 bytes long.";

ArchiveEntry entry(int i, const std::string& cubin) {
  ArchiveEntry e;
  e.key = sha256_hex("fuzz archive " + std::to_string(i));
  e.entry.key = e.key;
  e.entry.meta.name = "fuzz_" + std::to_string(i);
  e.entry.meta.op = "sparse_index_remap";
  e.entry.meta.params_json = R"({"page_size":64})";
  e.entry.meta.entries = {{"mj_entry", 256, 0}};
  e.entry.meta.arch = i ? "sm_100a" : "sm_90a";
  e.entry.meta.nvrtc_version = "13.0 (fuzz)";
  e.entry.cubin = cubin;
  return e;
}

bool same(const UnpackedArchive& a, const UnpackedArchive& b) {
  if (a.entries.size() != b.entries.size()) return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    if (x.key != y.key || x.entry.cubin != y.entry.cubin || x.entry.meta.to_json() != y.entry.meta.to_json())
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (!(data[0] & 1)) {
    const std::string key = (data[0] & 2) ? kFuzzKey : std::string();
    fuzz::refused_or_ok([&] {
      UnpackedArchive a = unpack_cache_archive(in, key, /*allow_unsigned=*/true);
      UnpackedArchive b = unpack_cache_archive(pack_cache_archive(a.entries, key), key, /*allow_unsigned=*/false);
      if (!same(a, b)) fuzz::broken("an accepted archive did not survive pack + unpack");
    });
    return 0;
  }
  if (in.size() < 3) return 0;
  const size_t position = static_cast<uint8_t>(in[0]) | (static_cast<uint8_t>(in[1]) << 8);
  const uint8_t flip = static_cast<uint8_t>(in[2]);
  const std::string cubin = in.substr(3);
  std::string archive = pack_cache_archive({entry(0, cubin), entry(1, cubin + "!")}, kFuzzKey);
  archive[position % archive.size()] ^= static_cast<char>(flip);
  bool accepted = false;
  fuzz::refused_or_ok([&] {
    UnpackedArchive a = unpack_cache_archive(archive, kFuzzKey, /*allow_unsigned=*/false);
    accepted = true;
    if (flip == 0 && (a.entries.size() != 2 || a.entries[0].entry.cubin != cubin || !a.signature_verified))
      fuzz::broken("an intact archive read back different entries");
  });
  if (flip != 0 && accepted) fuzz::broken("an archive with a changed byte was accepted");
  if (flip == 0 && !accepted) fuzz::broken("an intact signed archive was refused");
  return 0;
}
