#include "mlajit/error.hpp"

namespace mlajit {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::Compile: return "compile error";
    case ErrorKind::Driver: return "driver error";
    case ErrorKind::Cache: return "cache error";
    case ErrorKind::Io: return "i/o error";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

}  // namespace mlajit
