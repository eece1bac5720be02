#pragma once
// HMAC-SHA256 (RFC 2104 over the FIPS 180-4 SHA-256 of core/sha256.hpp), used to sign entries of
// the fleet-shared remote cache. tests/unit/test_hmac.cpp checks it against the RFC 4231 vectors.
#include <cstddef>
#include <string>
#include <string_view>

#include "core/sha256.hpp"

namespace mlajit {

class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  void update(std::string_view data) { inner_.update(data); }
  // Appends <8-byte little-endian length><bytes> (Sha256::update_field), so that a signature over
  // several fields cannot be replayed for a different split of the same bytes.
  void update_field(std::string_view data) { inner_.update_field(data); }
  Sha256::Digest finish();  // the object must not be updated afterwards

 private:
  Sha256 inner_;
  uint8_t outer_pad_[64];
};

Sha256::Digest hmac_sha256(std::string_view key, std::string_view message);

// Compares two byte strings in time that depends only on their lengths (never on where they
// first differ), so that a forger cannot learn a signature byte by byte from response times.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace mlajit
