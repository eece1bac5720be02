// HMAC-SHA256 per RFC 2104: H((K ^ opad) || H((K ^ ipad) || m)), K padded (or hashed) to 64 bytes.
#include "core/hmac.hpp"

#include <cstring>

namespace mlajit {

HmacSha256::HmacSha256(std::string_view key) {
  uint8_t k[64] = {};
  if (key.size() > sizeof k) {
    auto d = sha256(key);  // keys longer than the block are hashed first (RFC 2104 section 2)
    std::memcpy(k, d.data(), d.size());
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t inner_pad[64];
  for (int i = 0; i < 64; ++i) {
    inner_pad[i] = k[i] ^ 0x36;
    outer_pad_[i] = k[i] ^ 0x5c;
  }
  inner_.update(inner_pad, sizeof inner_pad);
  std::memset(k, 0, sizeof k);
}

Sha256::Digest HmacSha256::finish() {
  Sha256::Digest inner = inner_.finish();
  Sha256 outer;
  outer.update(outer_pad_, sizeof outer_pad_);
  outer.update(inner.data(), inner.size());
  std::memset(outer_pad_, 0, sizeof outer_pad_);
  return outer.finish();
}

Sha256::Digest hmac_sha256(std::string_view key, std::string_view message) {
  HmacSha256 h(key);
  h.update(message);
  return h.finish();
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t diff = 0;  // volatile: the compiler must not turn the loop into an early exit
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (static_cast<uint8_t>(a[i]) ^ static_cast<uint8_t>(b[i]));
  return diff == 0;
}

}  // namespace mlajit
