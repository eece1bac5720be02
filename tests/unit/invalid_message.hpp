#pragma once
// The unit tests' check of a refused argument: the message of the mlajit::Error that `f` throws,
// which must be an InvalidArgument; "" when it throws nothing (the caller's CHECK on the message
// then fails).
#include <doctest/doctest.h>

#include <string>

#include "mlajit/error.hpp"

template <typename F>
std::string invalid_message(F&& f) {
  try {
    f();
  } catch (const mlajit::Error& e) {
    CHECK(e.kind() == mlajit::ErrorKind::InvalidArgument);
    return e.what();
  }
  return "";
}
