#pragma once
// Little-endian fixed-width integers in byte strings: every integer of the on-disk cache entry,
// the cache archive and the remote (fleet) entry is stored this way. Readers bound-check `off`
// against the string themselves (each format checks its header size first).
#include <cstddef>
#include <cstdint>
#include <string>

namespace mlajit::le {

inline void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s += static_cast<char>(v >> (8 * i));
}
inline void put_u32(std::string& s, uint32_t v) { put(s, v, 4); }
inline void put_u64(std::string& s, uint64_t v) { put(s, v, 8); }

inline uint64_t get(const std::string& s, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(s[off + i])) << (8 * i);
  return v;
}
inline uint32_t get_u32(const std::string& s, size_t off) { return static_cast<uint32_t>(get(s, off, 4)); }

}  // namespace mlajit::le
