#pragma once
// Shared by the libFuzzer targets: the one rule every target checks besides the sanitizers.
// Bad input must be refused with mlajit::Error (a message naming what was wrong); any other
// exception escaping a parser is a bug and is turned into a crash that libFuzzer records.
#include <cstdio>
#include <cstdlib>
#include <exception>

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

// A property the parser promised and broke (e.g. an accepted value that does not round-trip).
[[noreturn]] inline void broken(const char* what) {
  std::fprintf(stderr, "FUZZ BUG: %s\n", what);
  std::abort();
}

}  // namespace mlajit::fuzz
