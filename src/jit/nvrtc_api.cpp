// dlopen of libnvrtc: tried once per process, the result (or the reason it failed) is kept.
#include "jit/nvrtc_api.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <mutex>
#include <vector>

#include "mlajit/config.hpp"
#include "mlajit/log.hpp"

namespace mlajit::nvrtc {

namespace {

std::vector<std::string> candidates() {
  const char* names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  std::vector<std::string> out(std::begin(names), std::end(names));
  std::vector<std::string> dirs;
  if (auto home = config::env("CUDA_HOME")) dirs.push_back(*home + "/lib64");
  if (auto path = config::env("CUDA_PATH")) dirs.push_back(*path + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  for (auto& d : dirs)
    for (auto* n : names) out.push_back(d + "/" + n);
  return out;
}

template <typename F>
bool bind(void* lib, const char* sym, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, sym));
  return fn != nullptr;
}

struct Loaded {
  Api api;
  bool ok = false;
  std::string why;

  Loaded() {
    void* lib = nullptr;
    std::string tried;
    for (auto& c : candidates()) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      tried += "\n  " + c + ": " + (e ? e : "not found");
    }
    if (!lib) {
      why = "NVRTC (libnvrtc.so.13 / .12) could not be loaded; install the CUDA toolkit's NVRTC or set CUDA_HOME. Tried:" + tried;
      return;
    }
    bool all = bind(lib, "nvrtcGetErrorString", api.GetErrorString) && bind(lib, "nvrtcVersion", api.Version) &&
               bind(lib, "nvrtcCreateProgram", api.CreateProgram) && bind(lib, "nvrtcDestroyProgram", api.DestroyProgram) &&
               bind(lib, "nvrtcCompileProgram", api.CompileProgram) && bind(lib, "nvrtcGetPTXSize", api.GetPTXSize) &&
               bind(lib, "nvrtcGetPTX", api.GetPTX) && bind(lib, "nvrtcGetCUBINSize", api.GetCUBINSize) &&
               bind(lib, "nvrtcGetCUBIN", api.GetCUBIN) && bind(lib, "nvrtcGetProgramLogSize", api.GetProgramLogSize) &&
               bind(lib, "nvrtcGetProgramLog", api.GetProgramLog);
    if (!all) {
      why = "the loaded libnvrtc lacks a required symbol (nvrtcGetCUBIN needs NVRTC 11.1+)";
      return;
    }
    bind(lib, "nvrtcGetPCHCreateStatus", api.GetPCHCreateStatus);  // optional
    if (api.Version(&api.major, &api.minor) != kSuccess) {
      why = "nvrtcVersion failed";
      return;
    }
    // The real file name carries the patch level (libnvrtc.so.13.0.88), which the cache key wants.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(api.Version), &info) && info.dli_fname) {
      char real[PATH_MAX];
      api.library = realpath(info.dli_fname, real) ? real : info.dli_fname;
    }
    ok = true;
    log::debug("loaded NVRTC {}.{} from {}", api.major, api.minor, api.library);
  }
};

}  // namespace

const Api* load(std::string* why) {
  static Loaded loaded;  // thread-safe one-time initialization
  if (!loaded.ok && why) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace mlajit::nvrtc
