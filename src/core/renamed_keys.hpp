#pragma once
// Keys that were renamed. A config, a tuning shape or a bench shape that still uses an old name is
// rejected like any unknown key; the error then names the key that replaced it. One table for the
// params JSON (src/core/params.cpp), `mlajit tune --shape` (src/autotune/shape.cpp) and
// `mlajit bench --shape` (src/cli/shape_arg.cpp); an old name is never accepted as an alias.
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace mlajit {

struct RenamedKey {
  std::string_view old_name;
  std::string_view new_name;
  std::string_view note;  // what else changed with the name, or empty
};

inline constexpr RenamedKey kRenamedKeys[] = {
    {"scale_block_size", "quantization_granularity", ""},
    {"granularity", "quantization_granularity", ""},
    {"topk", "top_k", ""},
    {"s_q", "tokens", ""},
    {"s_kv", "keys", ""},
    {"new_tokens", "tokens", ""},
    {"cached_tokens", "keys", "keys counts the new tokens too: keys = cached + new"},
};

// For a renamed key, "; \"<old>\" is now \"<new>\"" (and the note); for any other key, "". Appended
// to the `expected` part of an unknown-key error.
inline std::string renamed_key_hint(std::string_view key) {
  for (const auto& r : kRenamedKeys)
    if (r.old_name == key)
      return r.note.empty() ? fmt::format("; \"{}\" is now \"{}\"", r.old_name, r.new_name)
                            : fmt::format("; \"{}\" is now \"{}\" ({})", r.old_name, r.new_name, r.note);
  return "";
}

}  // namespace mlajit
