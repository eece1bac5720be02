#include "mlajit/dtype.hpp"

#include "core/input.hpp"
#include "mlajit/error.hpp"

namespace mlajit {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "f32", 4},  {DType::f16, "f16", 2}, {DType::bf16, "bf16", 2},
    {DType::fp8_e4m3, "fp8_e4m3", 1}, {DType::u32, "u32", 4}, {DType::i32, "i32", 4},
    {DType::u8, "u8", 1},
};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

DType parse_dtype(std::string_view name, const std::string& field) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  throw_invalid(field, json_quoted(name), "one of f32, f16, bf16, fp8_e4m3, u32, i32, u8");
}

}  // namespace mlajit
