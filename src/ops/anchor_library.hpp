#pragma once
// The shared library behind `mlajit bench OP --anchor LIB.so` (the C ABIs in
// src/ops/*/bench.hpp), dlopen'ed once and closed on destruction. A path with a slash must name
// a regular file (dlopen would block on a FIFO); a bare name is looked up in the loader's search
// path, as dlopen does. Harness code (the benches), not libmlajit.
#include <dlfcn.h>

#include <string>

#include "core/input.hpp"
#include "mlajit/error.hpp"

namespace mlajit::bench {

class AnchorLibrary {
 public:
  explicit AnchorLibrary(const std::string& path) : path_(path) {
    if (path.find('/') != std::string::npos) require_regular_file(path, "--anchor");
    handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = ::dlerror();
      throw_invalid("--anchor", path, std::string("a loadable shared library (dlopen: ") + (e ? e : "?") + ")");
    }
  }
  ~AnchorLibrary() { ::dlclose(handle_); }
  AnchorLibrary(const AnchorLibrary&) = delete;
  AnchorLibrary& operator=(const AnchorLibrary&) = delete;

  // The exported function `name` as type Fn, or nullptr when the library does not export it.
  template <class Fn>
  Fn symbol(const char* name) const {
    return reinterpret_cast<Fn>(::dlsym(handle_, name));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
};

}  // namespace mlajit::bench
