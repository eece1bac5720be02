// Problem shapes of the tuner (named dynamic sizes per op) and their tuning buckets (the sizes an
// op knows on the host at call time, rounded up to powers of two).
#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/input.hpp"
#include "mlajit/autotune.hpp"
#include "mlajit/error.hpp"
#include "core/op_definition.hpp"
#include "core/renamed_keys.hpp"

namespace mlajit::autotune {

using nlohmann::json;

namespace {

int ceil_log2(int64_t v) {
  int l = 0;
  while (l < 62 && (int64_t{1} << l) < v) ++l;
  return l;
}

}  // namespace

const std::vector<ShapeKey>& shape_keys(Op op) { return ops::definition(op).shape_keys; }

Shape default_shape(Op op) {
  Shape s;
  for (const auto& k : shape_keys(op)) s[k.name] = k.default_value;
  return s;
}

Shape parse_shape(Op op, const std::string& text, Shape shape) {
  const auto& keys = shape_keys(op);
  auto known = [&] {
    std::string s;
    for (const auto& k : keys) s += (s.empty() ? "" : ", ") + std::string(k.name);
    return s;
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw_invalid("--shape item", item, "key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::none_of(keys.begin(), keys.end(), [&](const ShapeKey& k) { return key == k.name; }))
      throw_invalid(fmt::format("--shape key of {}", op_name(op)), key, known() + renamed_key_hint(key));
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || value.empty() || v < 1 || v > (int64_t{1} << 40))
      throw_invalid(fmt::format("--shape {}", key), value, "a positive integer");
    shape[key] = v;
  }
  return shape;
}

std::string describe_shape(const Shape& s) {
  std::string out;
  for (const auto& [k, v] : s) out += fmt::format("{}{}={}", out.empty() ? "" : ",", k, v);
  return out;
}

ShapeBucket ShapeBucket::of(std::initializer_list<int64_t> sizes) {
  ShapeBucket b;
  for (int64_t v : sizes) {
    if (b.ndim == kMaxDims) break;
    b.log2[b.ndim++] = static_cast<uint8_t>(ceil_log2(v));
  }
  return b;
}

uint64_t ShapeBucket::hash() const {
  uint64_t h = ndim;
  for (int i = 0; i < kMaxDims; ++i) h = (h << 8) ^ (h >> 56) ^ log2[i];
  return h * 0x9e3779b97f4a7c15ull;
}

bool ShapeBucket::operator==(const ShapeBucket& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (log2[i] != o.log2[i]) return false;
  return true;
}

json ShapeBucket::to_json(Op op) const {
  json j = json::object();
  int d = 0;
  for (const auto& k : shape_keys(op))
    if (k.bucketed && d < ndim) j[k.name] = int64_t{1} << log2[d++];
  return j;
}

ShapeBucket ShapeBucket::from_json(Op op, const json& j, const std::string& path) {
  if (!j.is_object()) throw_invalid(path, json_excerpt(j), "an object of bucketed sizes");
  ShapeBucket b;
  for (const auto& k : shape_keys(op)) {
    if (!k.bucketed) continue;
    auto it = j.find(k.name);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 1)
      throw_invalid(path + "." + k.name, it == j.end() ? std::string("nothing") : json_excerpt(*it),
                    "a positive power of two");
    const int64_t v = it->get<int64_t>();
    if ((v & (v - 1)) != 0) throw_invalid(path + "." + k.name, v, "a power of two");
    if (b.ndim < kMaxDims) b.log2[b.ndim++] = static_cast<uint8_t>(ceil_log2(v));
  }
  if (j.size() != b.ndim) throw_invalid(path, json_excerpt(j), "exactly the bucketed sizes of " + std::string(op_name(op)));
  return b;
}

ShapeBucket bucket_of(Op op, const Shape& shape) {
  Shape s = default_shape(op);
  for (const auto& [k, v] : shape) s[k] = v;
  return ops::definition(op).bucket(s);
}

}  // namespace mlajit::autotune
