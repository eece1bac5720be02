#pragma once
// The `--shape k=v,k=v,...` argument of `mlajit bench`: parsed into a key -> text map whose keys
// the op's parser consumes one by one; a key left over, repeated, or with a malformed value is a
// usage error naming the key, the value and what was expected. Each key has one spelling; a key
// that was renamed is refused with a hint naming its new spelling (src/core/renamed_keys.hpp).
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "mlajit/dtype.hpp"

namespace mlajit::cli {

class ShapeArg {
 public:
  explicit ShapeArg(const std::string& text);

  // Each take_* consumes `key` when present and leaves `v` unchanged when absent.
  // Integers: decimal digits only (no sign, blanks or exponent), at most INT_MAX, so that no value
  // wraps around when stored in an int.
  void take_int(const char* key, int& v);
  void take_int(const char* key, int64_t& v);
  void take_bool(const char* key, bool& v);  // "0" or "1"
  void take_dtype(const char* key, DType& v);
  std::optional<std::string> take(const char* key);
  // Usage error for the first key no take_* consumed.
  void done(const std::string& op) const;

 private:
  long long take_integer(const char* key, long long max, bool& present);
  std::map<std::string, std::string> kv_;
};

}  // namespace mlajit::cli
