#pragma once
// The largest byte extent of a tensor view: no 64-bit address space holds more (57 bits with
// 5-level paging), and every byte offset of a view then fits in int64 with room to spare.
#include <cstdint>

namespace mlajit {

constexpr int kMaxTensorBytesLog2 = 57;
constexpr int64_t kMaxTensorBytes = int64_t{1} << kMaxTensorBytesLog2;

}  // namespace mlajit
