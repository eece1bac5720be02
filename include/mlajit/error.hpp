#pragma once
// mlajit::Error: every failure is a value with context. An error says what was wrong, the
// offending value, and what was expected, and carries a category that maps to a C status code
// and to the CLI's exit code.
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace mlajit {

enum class ErrorKind {
  InvalidArgument = 1,  // bad params, shapes, JSON, CLI usage        (CLI exit 2)
  Compile = 2,          // NVRTC rejected the generated source         (CLI exit 3)
  Driver = 3,           // CUDA driver missing or a driver call failed (CLI exit 4)
  Cache = 4,            // cache directory unusable / refused          (CLI exit 4)
  Io = 5,               // file system failure                         (CLI exit 4)
  Internal = 6,         // a bug in mlajit                             (CLI exit 4)
};

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// "<what>: got <value>, expected <expected>" for invalid arguments.
template <typename V>
[[noreturn]] void throw_invalid(std::string_view what, const V& value, std::string_view expected) {
  throw Error(ErrorKind::InvalidArgument, fmt::format("{}: got {}, expected {}", what, value, expected));
}

template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

// Checks a condition on an argument: MLAJIT_EXPECT(x > 0, "params.num_heads", x, "a positive integer")
#define MLAJIT_EXPECT(cond, what, value, expected)  \
  do {                                              \
    if (!(cond)) ::mlajit::throw_invalid((what), (value), (expected)); \
  } while (0)

}  // namespace mlajit
