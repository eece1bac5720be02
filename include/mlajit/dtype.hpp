#pragma once
// Element types of tensors and kernel parameters, with their names as used in JSON configs.
#include <cstddef>
#include <string>
#include <string_view>

namespace mlajit {

// u8: raw bytes (a cache whose records mix element types, e.g. the fp8_ds_mla layout).
enum class DType { f32, f16, bf16, fp8_e4m3, u32, i32, u8 };

std::string_view dtype_name(DType t);
// Parses "f32" | "f16" | "bf16" | "fp8_e4m3" | "u32" | "i32" | "u8"; throws Error naming `field`.
DType parse_dtype(std::string_view name, const std::string& field = "dtype");
size_t dtype_size(DType t);

}  // namespace mlajit
