// See module_image.hpp.
#include "jit/module_image.hpp"

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "mlajit/error.hpp"

namespace mlajit {

namespace {
constexpr char kMagic[8] = {'M', 'J', 'M', 'O', 'D', 'S', '1', '\0'};

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint64_t get_le(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}
}  // namespace

std::string pack_module_image(const std::vector<std::string>& cubins) {
  if (cubins.size() < 2 || cubins.size() > kMaxModuleImageUnits)
    throw_error(ErrorKind::Internal, "module image of {} units: expected 2..{}", cubins.size(), kMaxModuleImageUnits);
  std::string out(kMagic, sizeof kMagic);
  put_le(out, cubins.size(), 4);
  for (const auto& c : cubins) {
    if (c.empty()) throw_error(ErrorKind::Internal, "module image: an empty cubin");
    put_le(out, c.size(), 8);
  }
  for (const auto& c : cubins) out += c;
  return out;
}

std::vector<std::string_view> unpack_module_image(std::string_view image) {
  if (image.size() < sizeof kMagic || std::memcmp(image.data(), kMagic, sizeof kMagic) != 0) return {image};
  const size_t header = sizeof kMagic + 4;
  if (image.size() < header)
    throw_error(ErrorKind::Cache, "module image of {} bytes: shorter than its {}-byte header", image.size(), header);
  const uint64_t count = get_le(image, sizeof kMagic, 4);
  if (count < 2 || count > kMaxModuleImageUnits)
    throw_error(ErrorKind::Cache, "module image with {} units: expected 2..{}", count, kMaxModuleImageUnits);
  size_t at = header + 8 * count;
  if (image.size() < at)
    throw_error(ErrorKind::Cache, "module image of {} bytes: its {} sizes end at byte {}", image.size(), count, at);
  std::vector<std::string_view> out;
  for (uint64_t u = 0; u < count; ++u) {
    const uint64_t n = get_le(image, header + 8 * u, 8);
    if (n == 0 || n > image.size() - at)
      throw_error(ErrorKind::Cache, "module image: unit {} of {} bytes at byte {} runs past its {} bytes", u, n, at,
                  image.size());
    out.push_back(image.substr(at, n));
    at += n;
  }
  if (at != image.size())
    throw_error(ErrorKind::Cache, "module image: {} bytes after its last unit (at byte {} of {})", image.size() - at, at,
                image.size());
  return out;
}

}  // namespace mlajit
