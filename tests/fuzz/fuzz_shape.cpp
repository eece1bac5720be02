// libFuzzer target: the `--shape k=v,...` argument of `mlajit bench`. Input: "<op>\n<shape text>"
// (the op picks which keys are consumed). An accepted integer must equal the decimal text given.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "cli/shape_arg.hpp"
#include "fuzz_util.hpp"

using namespace mlajit;

namespace {

// The keys of every op's --shape (cmd_bench.cpp), by kind.
const char* const kIntKeys[] = {"heads", "head_size", "page_size", "layers", "threads", "top_k",
                                "quantization_granularity", "stages", "block_kv", "ctas"};
const char* const kWideKeys[] = {"tokens", "keys", "split_parts"};
const char* const kBoolKeys[] = {"mla", "sink", "lse"};
const char* const kDtypeKeys[] = {"dtype", "io_dtype", "kv_dtype"};

// The value text of `key` in `text`, found independently of ShapeArg (keys are unique once the
// ShapeArg constructor accepted the text).
std::optional<std::string> value_of(const std::string& text, const std::string& key) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    size_t eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) == key) return item.substr(eq + 1);
    start = end + 1;
  }
  return std::nullopt;
}

template <typename T>
void check_int(cli::ShapeArg& shape, const char* key, const std::string& text) {
  const T sentinel = -7;  // never a value take_int may store
  T v = sentinel;
  shape.take_int(key, v);  // throws for a malformed value
  auto s = value_of(text, key);
  if (!s) {
    if (v != sentinel) fuzz::broken("take_int stored a value for an absent key");
    return;
  }
  if (v < 0) fuzz::broken("an accepted --shape integer is negative (wrapped)");
  size_t nz = s->find_first_not_of('0');
  std::string stripped = nz == std::string::npos ? "0" : s->substr(nz);
  if (stripped != std::to_string(v)) fuzz::broken("an accepted --shape integer differs from its text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  size_t nl = in.find('\n');
  std::string op = nl == std::string::npos ? "" : in.substr(0, nl);
  std::string text = nl == std::string::npos ? in : in.substr(nl + 1);
  fuzz::refused_or_ok([&] {
    cli::ShapeArg shape(text);
    for (const char* k : kIntKeys) check_int<int>(shape, k, text);
    for (const char* k : kWideKeys) check_int<int64_t>(shape, k, text);
    for (const char* k : kBoolKeys) {
      bool b = false;
      shape.take_bool(k, b);
    }
    for (const char* k : kDtypeKeys) {
      DType d = DType::f32;
      shape.take_dtype(k, d);
    }
    (void)shape.take(op.c_str());
    (void)shape.take("mask");
    (void)shape.take("path");
    (void)shape.take("scale_fmt");
    shape.done(op);
  });
  return 0;
}
