// CUDA driver wrappers: contexts, device info, memory, events, streams, modules and launches.
// Every failing call becomes Error(Driver) naming the call and the CUDA error (jit/cuda_api.cpp).
#include "mlajit/driver.hpp"

#include <mutex>
#include <vector>

#include "jit/cuda_api.hpp"
#include "mlajit/config.hpp"
#include "mlajit/error.hpp"

namespace mlajit::driver {

using namespace mlajit::cuda;

namespace {

thread_local int tl_requested = -1;  // set_device on this thread
thread_local int tl_device = -1;     // device whose context this thread made current (-1: not yet)

CUcontext primary_context(int ordinal) {
  static std::mutex mu;
  static std::vector<CUcontext> contexts;  // retained once per device, for the life of the process
  std::lock_guard<std::mutex> lk(mu);
  const Api& a = api();
  int n = 0;
  check(a.cuDeviceGetCount(&n), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= n) throw_invalid("CUDA device ordinal (MLAJIT_DEVICE / set_device)", ordinal,
                                                 fmt::format("0..{}", n - 1));
  if (contexts.size() < static_cast<size_t>(n)) contexts.resize(n, nullptr);
  if (!contexts[ordinal]) {
    CUdevice dev = 0;
    check(a.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    check(a.cuDevicePrimaryCtxRetain(&contexts[ordinal], dev), "cuDevicePrimaryCtxRetain");
  }
  return contexts[ordinal];
}

int default_device() {
  auto v = config::env("MLAJIT_DEVICE");
  if (!v) return 0;
  try {
    size_t used = 0;
    int d = std::stoi(*v, &used);
    if (used == v->size() && d >= 0) return d;
  } catch (const std::exception&) {
  }
  throw_invalid("MLAJIT_DEVICE", *v, "a device ordinal (0, 1, ...)");
}

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

bool available(std::string* reason) { return load(reason) != nullptr; }

int device_count() {
  int n = 0;
  check(api().cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

DeviceInfo device_info(int ordinal) {
  const Api& a = api();
  CUdevice dev = 0;
  check(a.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  check(a.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  info.name = name;
  auto attr = [&](int which) {
    int v = 0;
    check(a.cuDeviceGetAttribute(&v, which, dev), "cuDeviceGetAttribute");
    return v;
  };
  info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info.max_smem_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  check(a.cuDeviceTotalMem(&info.total_mem, dev), "cuDeviceTotalMem");
  int v = 0;
  check(a.cuDriverGetVersion(&v), "cuDriverGetVersion");
  info.driver_version = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  return info;
}

int ensure_context() {
  if (tl_device >= 0) return tl_device;  // hot path: one thread-local load
  const Api& a = api();
  if (tl_requested < 0) {
    // A context the caller already made current (e.g. a framework's) is respected.
    CUcontext cur = nullptr;
    check(a.cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
    if (cur) {
      CUdevice dev = 0;
      check(a.cuCtxGetDevice(&dev), "cuCtxGetDevice");
      return tl_device = dev;
    }
  }
  int ordinal = tl_requested >= 0 ? tl_requested : default_device();
  check(a.cuCtxSetCurrent(primary_context(ordinal)), "cuCtxSetCurrent");
  return tl_device = ordinal;
}

void set_device(int ordinal) {
  primary_context(ordinal);  // validates the ordinal
  tl_requested = ordinal;
  tl_device = -1;
  ensure_context();
}

void synchronize() {
  ensure_context();
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");
}

// ---- DeviceBuffer -------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  ensure_context();
  CUdeviceptr p = 0;
  if (bytes > 0) check(api().cuMemAlloc(&p, bytes), "cuMemAlloc");
  ptr_ = reinterpret_cast<void*>(p);
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) api().cuMemFree(dptr(ptr_));  // no throw from a destructor; a failed free leaks
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) api().cuMemFree(dptr(ptr_));
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

static void check_range(size_t bytes, size_t offset, size_t size, const char* what) {
  if (offset > size || bytes > size - offset)
    throw_invalid(what, fmt::format("{} bytes at offset {}", bytes, offset),
                  fmt::format("a range inside the {}-byte buffer", size));
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  check_range(bytes, offset, bytes_, "DeviceBuffer::upload");
  if (bytes) check(api().cuMemcpyHtoD(dptr(ptr_) + offset, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  check_range(bytes, offset, bytes_, "DeviceBuffer::download");
  if (bytes) check(api().cuMemcpyDtoH(host, dptr(ptr_) + offset, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::fill_bytes(uint8_t value) {
  if (bytes_) check(api().cuMemsetD8(dptr(ptr_), value, bytes_), "cuMemsetD8");
}

void DeviceBuffer::copy_from(const DeviceBuffer& src, size_t bytes, Stream s) {
  // cuMemcpyDtoD on overlapping ranges is undefined; two distinct allocations never overlap.
  if (&src == this && bytes)
    throw_invalid("DeviceBuffer::copy_from source", "the destination buffer itself", "a different buffer");
  check_range(bytes, 0, bytes_, "DeviceBuffer::copy_from (destination)");
  check_range(bytes, 0, src.bytes_, "DeviceBuffer::copy_from (source)");
  if (bytes)
    check(api().cuMemcpyDtoDAsync(dptr(ptr_), dptr(src.ptr_), bytes, static_cast<CUstream>(s)), "cuMemcpyDtoDAsync");
}

// ---- events and streams -------------------------------------------------------------------------

EventTimer::EventTimer() {
  ensure_context();
  CUevent a = nullptr, b = nullptr;
  check(api().cuEventCreate(&a, CU_EVENT_DEFAULT), "cuEventCreate");
  check(api().cuEventCreate(&b, CU_EVENT_DEFAULT), "cuEventCreate");
  start_ = a;
  stop_ = b;
}

EventTimer::~EventTimer() {
  if (start_) api().cuEventDestroy(static_cast<CUevent>(start_));
  if (stop_) api().cuEventDestroy(static_cast<CUevent>(stop_));
}

void EventTimer::start(Stream s) { check(api().cuEventRecord(static_cast<CUevent>(start_), static_cast<CUstream>(s)), "cuEventRecord"); }
void EventTimer::stop(Stream s) { check(api().cuEventRecord(static_cast<CUevent>(stop_), static_cast<CUstream>(s)), "cuEventRecord"); }

float EventTimer::elapsed_ms() {
  check(api().cuEventSynchronize(static_cast<CUevent>(stop_)), "cuEventSynchronize");
  float ms = 0;
  check(api().cuEventElapsedTime(&ms, static_cast<CUevent>(start_), static_cast<CUevent>(stop_)), "cuEventElapsedTime");
  return ms;
}

Stream create_stream() {
  ensure_context();
  CUstream s = nullptr;
  check(api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return s;
}

void destroy_stream(Stream s) {
  if (s) check(api().cuStreamDestroy(static_cast<CUstream>(s)), "cuStreamDestroy");
}

void stream_synchronize(Stream s) { check(api().cuStreamSynchronize(static_cast<CUstream>(s)), "cuStreamSynchronize"); }

// ---- modules and launches -----------------------------------------------------------------------

Module::Module(const std::string& cubin) {
  ensure_context();
  CUmodule m = nullptr;
  check(api().cuModuleLoadData(&m, cubin.data()), "cuModuleLoadData");
  mod_ = m;
}

Module::~Module() {
  if (mod_) api().cuModuleUnload(static_cast<CUmodule>(mod_));
}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    if (mod_) api().cuModuleUnload(static_cast<CUmodule>(mod_));
    mod_ = o.mod_;
    o.mod_ = nullptr;
  }
  return *this;
}

Function Module::function(const std::string& symbol) const {
  CUfunction f = nullptr;
  CUresult r = api().cuModuleGetFunction(&f, static_cast<CUmodule>(mod_), symbol.c_str());
  if (r != CUDA_SUCCESS) check(r, fmt::format("cuModuleGetFunction(\"{}\")", symbol).c_str());
  return f;
}

void set_max_dynamic_smem(Function f, unsigned bytes) {
  check(api().cuFuncSetAttribute(static_cast<CUfunction>(f), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 static_cast<int>(bytes)),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

bool stream_capturing(Stream s) {
  const Api& a = api();
  if (a.cuStreamIsCapturing == nullptr) return false;  // drivers before graphs cannot capture
  int status = 0;                                     // CU_STREAM_CAPTURE_STATUS_NONE
  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream while another stream captures globally.
  if (a.cuStreamIsCapturing(static_cast<CUstream>(s), &status) != CUDA_SUCCESS) return true;
  return status != 0;
}

void encode_tma_tiled(void* map, TmaDataType type, unsigned rank, const void* global, const uint64_t* dims,
                      const uint64_t* strides_bytes, const uint32_t* box, TmaSwizzle swizzle) {
  static_assert(sizeof(CUtensorMap) == 128 && alignof(CUtensorMap) == 64, "CUtensorMap layout of cuda.h");
  const Api& a = api();
  if (a.cuTensorMapEncodeTiled == nullptr)
    throw Error(ErrorKind::Driver, "libcuda.so.1 lacks cuTensorMapEncodeTiled (TMA descriptors; CUDA 12.0+ driver needed)");
  if (rank < 1 || rank > 5) throw_invalid("TMA descriptor rank", rank, "1..5");
  if (reinterpret_cast<uintptr_t>(map) % 64 != 0)
    throw_invalid("TMA descriptor address", fmt::format("{}", map), "64-byte aligned");
  unsigned long long d[5], st[4];
  unsigned b[5], es[5];
  for (unsigned i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    es[i] = 1;
    if (i + 1 < rank) st[i] = strides_bytes[i];
  }
  const CUresult r = a.cuTensorMapEncodeTiled(static_cast<CUtensorMap*>(map), static_cast<int>(type), rank,
                                              const_cast<void*>(global), d, st, b, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                              static_cast<int>(swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape;
    for (unsigned i = 0; i < rank; ++i)
      shape += fmt::format("{}dim {} box {}{}", i ? ", " : "", d[i], b[i], i + 1 < rank ? fmt::format(" stride {} B", st[i]) : "");
    check(r, fmt::format("cuTensorMapEncodeTiled(type {}, rank {}, address {}, {})", static_cast<int>(type), rank,
                         global, shape)
                 .c_str());
  }
}

void launch(Function f, const unsigned grid[3], const unsigned block[3], unsigned smem_bytes, Stream s,
            const void* args, const unsigned* cluster, bool programmatic) {
  CUlaunchConfig cfg{grid[0], grid[1], grid[2], block[0], block[1], block[2], smem_bytes,
                     static_cast<CUstream>(s), nullptr, 0};
  CUlaunchAttribute attrs[2]{};
  const bool clustered = cluster && cluster[0] * cluster[1] * cluster[2] > 1;
  if (clustered) {
    CUlaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim = {cluster[0], cluster[1], cluster[2]};
  }
  if (programmatic) {
    CUlaunchAttribute& a = attrs[cfg.numAttrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
  }
  if (cfg.numAttrs > 0) cfg.attrs = attrs;
  void* params[1] = {const_cast<void*>(args)};
  CUresult r = api().cuLaunchKernelEx(&cfg, static_cast<CUfunction>(f), params, nullptr);
  if (r != CUDA_SUCCESS)
    check(r, fmt::format("cuLaunchKernelEx(grid {}x{}x{}, block {}x{}x{}, smem {}, cluster {}x{}x{}{})", grid[0],
                         grid[1], grid[2], block[0], block[1], block[2], smem_bytes, clustered ? cluster[0] : 1,
                         clustered ? cluster[1] : 1, clustered ? cluster[2] : 1, programmatic ? ", programmatic" : "")
              .c_str());
}

int max_active_clusters(Function f, const unsigned block[3], unsigned smem_bytes, const unsigned cluster[3],
                        Stream s) {
  const Api& a = api();
  if (a.cuOccupancyMaxActiveClusters == nullptr) return 0;
  // The grid of one cluster: the query asks how many of them fit, not how a grid is laid out.
  CUlaunchConfig cfg{cluster[0], cluster[1], cluster[2], block[0], block[1], block[2], smem_bytes,
                     static_cast<CUstream>(s), nullptr, 0};
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim = {cluster[0], cluster[1], cluster[2]};
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (a.cuOccupancyMaxActiveClusters(&n, static_cast<CUfunction>(f), &cfg) != CUDA_SUCCESS) return 0;
  return n;
}

void launch_raw(Function f, const unsigned grid[3], const unsigned block[3], unsigned smem_bytes, Stream s,
                const void* args) {
  void* params[1] = {const_cast<void*>(args)};
  check(api().cuLaunchKernel(static_cast<CUfunction>(f), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                             smem_bytes, static_cast<CUstream>(s), params, nullptr),
        "cuLaunchKernel");
}

}  // namespace mlajit::driver
