// HMAC-SHA256 against the RFC 4231 test vectors (cases 1-4, 6, 7; case 5 is a truncated MAC) and
// the constant-time comparison.
#include <doctest/doctest.h>

#include <string>

#include "core/hmac.hpp"

using namespace mlajit;

namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string mac_hex(const std::string& key, const std::string& msg) {
  auto d = hmac_sha256(key, msg);
  return to_hex(d.data(), d.size());
}

}  // namespace

TEST_CASE("hmac-sha256 matches the RFC 4231 vectors") {
  CHECK(mac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(mac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(mac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(mac_hex(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 6 and 7: a 131-byte key, longer than the block, is hashed first.
  CHECK(mac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(mac_hex(std::string(131, '\xaa'),
                "This is a test using a larger than block-size key and a larger than block-size data. The key "
                "needs to be hashed before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // Case 5, truncated to 128 bits.
  CHECK(mac_hex(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32) == "a3b6167473100ee06e0c796c2955552b");
}

TEST_CASE("hmac-sha256 streaming equals one-shot; fields are length-prefixed") {
  HmacSha256 h("k");
  h.update("ab");
  h.update("c");
  CHECK(h.finish() == hmac_sha256("k", "abc"));
  HmacSha256 a("k"), b("k");
  a.update_field("ab");
  a.update_field("c");
  b.update_field("a");
  b.update_field("bc");
  CHECK(a.finish() != b.finish());
  CHECK(hmac_sha256("k1", "m") != hmac_sha256("k2", "m"));
}

TEST_CASE("constant_time_equal") {
  CHECK(constant_time_equal("", ""));
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "xbc"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
}
