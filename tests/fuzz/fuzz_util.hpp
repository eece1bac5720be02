#pragma once
// Shared by the libFuzzer targets: the one rule every target checks besides the sanitizers.
// Bad input must be refused with mlajit::Error (a message naming what was wrong); any other
// exception escaping a parser is a bug and is turned into a crash that libFuzzer records.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "mlajit/error.hpp"

namespace mlajit::fuzz {

template <typename F>
void refused_or_ok(F&& f) {
  try {
    f();
  } catch (const mlajit::Error&) {
    // Expected for most inputs.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FUZZ BUG: non-mlajit exception escaped: %s\n", e.what());
    std::abort();
  }
}

// refused_or_ok, and a refusal's message is bounded (hostile values are quoted as excerpts) and
// free of NUL bytes (a C caller would see it cut off).
template <typename F>
void refused_or_ok_message(F&& f) {
  try {
    f();
  } catch (const mlajit::Error& e) {
    const std::string msg = e.what();
    if (msg.size() > 4096) {
      std::fprintf(stderr, "FUZZ BUG: a %zu-byte error message: %.300s...\n", msg.size(), msg.c_str());
      std::abort();
    }
    if (msg.find('\0') != std::string::npos) {
      std::fprintf(stderr, "FUZZ BUG: a NUL byte in the error message: %s\n", msg.c_str());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FUZZ BUG: non-mlajit exception escaped: %s\n", e.what());
    std::abort();
  }
}

// A property the parser promised and broke (e.g. an accepted value that does not round-trip).
[[noreturn]] inline void broken(const char* what) {
  std::fprintf(stderr, "FUZZ BUG: %s\n", what);
  std::abort();
}

}  // namespace mlajit::fuzz
