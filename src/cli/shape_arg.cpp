// Parsing of `--shape k=v,...` (see shape_arg.hpp).
#include "cli/shape_arg.hpp"

#include <climits>

#include "core/renamed_keys.hpp"
#include "mlajit/error.hpp"

namespace mlajit::cli {

ShapeArg::ShapeArg(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string kv = text.substr(start, end - start);
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw_invalid("--shape item", kv, "key=value");
    std::string key = kv.substr(0, eq);
    // A repeated key is refused: silently keeping the last one would hide a typo.
    if (!kv_.emplace(key, kv.substr(eq + 1)).second) throw_invalid("--shape key", key, "each key at most once");
    start = end + 1;
  }
}

long long ShapeArg::take_integer(const char* key, long long max, bool& present) {
  auto s = take(key);
  present = s.has_value();
  if (!s) return 0;
  // Digits only, checked before any conversion: std::stoll would accept " 5", "+5" and wrap
  // nothing, but a later cast to int would silently wrap 4294967295 to -1.
  bool ok = !s->empty();
  long long x = 0;
  for (char c : *s) {
    if (!ok) break;
    if (c < '0' || c > '9' || x > (LLONG_MAX - (c - '0')) / 10) ok = false;  // not a digit, or overflow
    else x = x * 10 + (c - '0');
  }
  if (!ok || x > max)
    throw_invalid(std::string("--shape ") + key, *s, fmt::format("a non-negative integer <= {}", max));
  return x;
}

void ShapeArg::take_int(const char* key, int& v) {
  bool present = false;
  long long x = take_integer(key, INT_MAX, present);
  if (present) v = static_cast<int>(x);
}

void ShapeArg::take_int(const char* key, int64_t& v) {
  bool present = false;
  long long x = take_integer(key, LLONG_MAX, present);
  if (present) v = x;
}

void ShapeArg::take_bool(const char* key, bool& v) {
  if (auto s = take(key)) {
    if (*s != "0" && *s != "1") throw_invalid(std::string("--shape ") + key, *s, "0 or 1");
    v = *s == "1";
  }
}

void ShapeArg::take_dtype(const char* key, DType& v) {
  if (auto s = take(key)) v = parse_dtype(*s, std::string("--shape ") + key);
}

std::optional<std::string> ShapeArg::take(const char* key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  std::string v = it->second;
  kv_.erase(it);
  return v;
}

void ShapeArg::done(const std::string& op) const {
  if (!kv_.empty()) {
    const std::string& key = kv_.begin()->first;
    throw_invalid("--shape key for " + op, key, "a key listed by `mlajit bench --help`" + renamed_key_hint(key));
  }
}

}  // namespace mlajit::cli
