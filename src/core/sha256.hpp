#pragma once
// SHA-256 (FIPS 180-4), used for cache keys and entry checksums. Small and dependency-free;
// tests/unit/test_cache.cpp checks it against the NIST vectors.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mlajit {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Appends a field as <8-byte little-endian length><bytes>, so that concatenations of different
  // fields can never collide ("ab"+"c" vs "a"+"bc").
  void update_field(std::string_view s);
  Digest finish();  // the object must not be updated afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string to_hex(const uint8_t* data, size_t size);
std::string sha256_hex(std::string_view data);
Sha256::Digest sha256(std::string_view data);

}  // namespace mlajit
