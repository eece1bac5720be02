#pragma once
// The compiled form of a KernelSource whose entries compile as several NVRTC programs in parallel
// (KernelSource::compile_units > 1): the units' cubins packed into one image, so that the disk
// cache, the remote tier, archives and the packaged layer keep one entry (one key, one checksum)
// per kernel. A source of one unit keeps the plain cubin (an ELF image).
//
//   bytes [0, 8)      "MJMODS1\0"
//   bytes [8, 12)     count (u32, little endian), 2 ..  kMaxModuleImageUnits
//   then count x u64  the cubins' sizes (little endian)
//   then the cubins, back to back
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mlajit {

inline constexpr size_t kMaxModuleImageUnits = 16;

// Packs the units' cubins (at least 2, at most kMaxModuleImageUnits, none empty).
std::string pack_module_image(const std::vector<std::string>& cubins);

// The cubins of `image`: its units in order, or the image itself as one cubin when it is not a
// pack. Throws Error(Cache) naming what is wrong when a pack is truncated, oversized or malformed
// (a cache entry passed its checksum, so this is a bug or a hand-made file, never silently used).
std::vector<std::string_view> unpack_module_image(std::string_view image);

}  // namespace mlajit
