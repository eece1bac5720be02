// dlopen of libcuda.so.1 and cuInit, done once per process; the result or the reason is kept.
#include "jit/cuda_api.hpp"

#include <dlfcn.h>

#include "mlajit/error.hpp"
#include "mlajit/log.hpp"

namespace mlajit::cuda {

namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;

  template <typename F>
  bool bind(void* lib, const char* sym, F& fn) {
    fn = reinterpret_cast<F>(dlsym(lib, sym));
    if (!fn && why.empty()) why = std::string("libcuda.so.1 lacks ") + sym + " (driver too old; CUDA 12.0+ needed)";
    return fn != nullptr;
  }

  Loaded() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      why = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") + (e ? e : "not found");
      return;
    }
    auto& a = api;
    bool all = bind(lib, "cuInit", a.cuInit) & bind(lib, "cuDriverGetVersion", a.cuDriverGetVersion) &
               bind(lib, "cuGetErrorName", a.cuGetErrorName) & bind(lib, "cuGetErrorString", a.cuGetErrorString) &
               bind(lib, "cuDeviceGetCount", a.cuDeviceGetCount) & bind(lib, "cuDeviceGet", a.cuDeviceGet) &
               bind(lib, "cuDeviceGetName", a.cuDeviceGetName) & bind(lib, "cuDeviceGetAttribute", a.cuDeviceGetAttribute) &
               bind(lib, "cuDeviceTotalMem_v2", a.cuDeviceTotalMem) &
               bind(lib, "cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain) &
               bind(lib, "cuCtxSetCurrent", a.cuCtxSetCurrent) & bind(lib, "cuCtxGetCurrent", a.cuCtxGetCurrent) &
               bind(lib, "cuCtxGetDevice", a.cuCtxGetDevice) & bind(lib, "cuCtxSynchronize", a.cuCtxSynchronize) &
               bind(lib, "cuModuleLoadData", a.cuModuleLoadData) & bind(lib, "cuModuleUnload", a.cuModuleUnload) &
               bind(lib, "cuModuleGetFunction", a.cuModuleGetFunction) &
               bind(lib, "cuFuncSetAttribute", a.cuFuncSetAttribute) & bind(lib, "cuLaunchKernel", a.cuLaunchKernel) &
               bind(lib, "cuLaunchKernelEx", a.cuLaunchKernelEx) & bind(lib, "cuMemAlloc_v2", a.cuMemAlloc) &
               bind(lib, "cuMemFree_v2", a.cuMemFree) & bind(lib, "cuMemcpyHtoD_v2", a.cuMemcpyHtoD) &
               bind(lib, "cuMemcpyDtoH_v2", a.cuMemcpyDtoH) & bind(lib, "cuMemsetD8_v2", a.cuMemsetD8) &
               bind(lib, "cuMemcpyDtoDAsync_v2", a.cuMemcpyDtoDAsync) &
               bind(lib, "cuStreamCreate", a.cuStreamCreate) & bind(lib, "cuStreamDestroy_v2", a.cuStreamDestroy) &
               bind(lib, "cuStreamSynchronize", a.cuStreamSynchronize) & bind(lib, "cuEventCreate", a.cuEventCreate) &
               bind(lib, "cuEventDestroy_v2", a.cuEventDestroy) & bind(lib, "cuEventRecord", a.cuEventRecord) &
               bind(lib, "cuEventSynchronize", a.cuEventSynchronize);
    a.cuStreamIsCapturing = reinterpret_cast<decltype(a.cuStreamIsCapturing)>(dlsym(lib, "cuStreamIsCapturing"));
    a.cuTensorMapEncodeTiled =
        reinterpret_cast<decltype(a.cuTensorMapEncodeTiled)>(dlsym(lib, "cuTensorMapEncodeTiled"));
    a.cuOccupancyMaxActiveClusters =
        reinterpret_cast<decltype(a.cuOccupancyMaxActiveClusters)>(dlsym(lib, "cuOccupancyMaxActiveClusters"));
    // CUDA 13 headers map cuEventElapsedTime to _v2; older drivers only have the original.
    a.cuEventElapsedTime = reinterpret_cast<decltype(a.cuEventElapsedTime)>(dlsym(lib, "cuEventElapsedTime_v2"));
    if (!a.cuEventElapsedTime) all = all && bind(lib, "cuEventElapsedTime", a.cuEventElapsedTime);
    if (!all) return;
    CUresult r = a.cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      a.cuGetErrorName(r, &name);
      why = fmt::format("cuInit failed: {} (no usable GPU or driver)", name ? name : std::to_string(r));
      return;
    }
    int n = 0;
    if (a.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
      why = "the CUDA driver reports no devices";
      return;
    }
    ok = true;
  }
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

}  // namespace

const Api* load(std::string* why) {
  auto& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.api : nullptr;
}

const Api& api() {
  auto& l = loaded();
  if (!l.ok) throw Error(ErrorKind::Driver, l.why);
  return l.api;
}

void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* desc = nullptr;
  const Api& a = loaded().api;
  if (a.cuGetErrorName) a.cuGetErrorName(r, &name);
  if (a.cuGetErrorString) a.cuGetErrorString(r, &desc);
  throw Error(ErrorKind::Driver, fmt::format("{} failed: {} ({})", call, name ? name : fmt::format("CUresult {}", r),
                                             desc ? desc : "no description"));
}

}  // namespace mlajit::cuda
