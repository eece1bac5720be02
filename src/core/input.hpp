#pragma once
// Reading untrusted input: files given by path (configs, specs, tuning files, cache archives) and
// the JSON in them. Every reader goes through these helpers, so that each input is bounded:
//   - read_input_file: regular files only (a FIFO, device or socket is refused without blocking on
//     it; a directory is reported as a directory), at most max_bytes, with a message naming the
//     path and what it is.
//   - parse_json_input: at most kMaxJsonDepth nested arrays/objects (refused while parsing, before
//     any deeper value is built), each key at most once per object (a duplicate is an error naming
//     the key and its JSON path), and parse errors as mlajit::Error values.
//   - json_excerpt / quoted: bounded, escaped quotes of untrusted values for error messages (no
//     recursion over the value's depth, control characters such as NUL escaped).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mlajit {

// Size caps of the inputs read by path (far above any real input).
constexpr uint64_t kMaxJsonFileBytes = 16ull << 20;      // configs, specs, tuning records
constexpr uint64_t kMaxTuningFileBytes = 256ull << 20;   // a tuning database
constexpr uint64_t kMaxArchiveFileBytes = 4ull << 30;    // a cache archive
// Nested arrays/objects allowed in any JSON input (a config is 5 deep).
constexpr int kMaxJsonDepth = 64;
// Characters of an untrusted value quoted in an error message.
constexpr size_t kMaxExcerptChars = 200;

// "a directory", "a FIFO", "a character device", ... for a stat mode.
const char* file_type_name(unsigned mode);

// Refuses `path` unless it is a regular file (stat only, nothing is opened), naming what it is;
// for inputs handed to another loader (dlopen of a bench anchor), which would block on a FIFO.
void require_regular_file(const std::string& path, std::string_view what);

// The whole content of the regular file `path`, at most `max_bytes` long. `what` names the input
// in messages ("config file", "cache archive"). Errors: ErrorKind::InvalidArgument when the path
// cannot be opened, is not a regular file or is too large; ErrorKind::Io when a read fails.
std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes);

// Parses untrusted JSON text. `what` names the input in messages; `root` is the name of the
// top-level value in JSON paths ("config" gives "config.kernels[0].params"). Throws
// ErrorKind::InvalidArgument on a syntax error, a nesting deeper than max_depth or a duplicate key.
nlohmann::json parse_json_input(std::string_view text, std::string_view what, std::string_view root,
                                int max_depth = kMaxJsonDepth);

// Refuses a value (built by a caller, not parsed by parse_json_input) that nests more than
// max_depth arrays/objects, as parse_json_input does; iterative.
void check_json_depth(const nlohmann::json& j, std::string_view what, int max_depth = kMaxJsonDepth);

// A compact JSON rendering of `j` cut at about max_chars (ending in "..." when cut); iterative, so
// any depth is safe.
std::string json_excerpt(const nlohmann::json& j, size_t max_chars = kMaxExcerptChars);

// `s` as a JSON string literal (quotes, control characters and invalid UTF-8 escaped), cut at about
// max_chars.
std::string json_quoted(std::string_view s, size_t max_chars = kMaxExcerptChars);

// A key as a JSON path step: ".page_size", or ["a key with \u0000..."] (quoted, bounded) when the
// key is not a short identifier.
std::string path_key(std::string_view key);

}  // namespace mlajit
