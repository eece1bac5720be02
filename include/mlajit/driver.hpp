#pragma once
// Driver: the CUDA driver API loaded with dlopen (libcuda.so.1), so that mlajit starts, compiles
// and tests on a machine without a GPU; a missing driver is a clear Error(Driver), not a crash.
// Also the small device-memory and timing helpers that ops' callers, tests and benchmarks use.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mlajit/tensor.hpp"

namespace mlajit::driver {

// True when libcuda loads, cuInit succeeds and at least one device exists; else `reason` says why.
bool available(std::string* reason = nullptr);
int device_count();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_mem = 0;
  int l2_bytes = 0;
  int max_smem_per_block_optin = 0;
  std::string driver_version;  // e.g. "13.0"
};
DeviceInfo device_info(int ordinal);

// Makes the primary context of the current device (env MLAJIT_DEVICE, default 0, or whatever
// set_device chose on this thread) current on the calling thread; returns the device ordinal.
int ensure_context();
void set_device(int ordinal);

void synchronize();  // cuCtxSynchronize; throws Error(Driver) with the failing status name

// Owning device allocation (cuMemAlloc). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill_bytes(uint8_t value);  // cuMemsetD8 (e.g. 0xFF = NaN poison for f32/bf16)
  // The first `bytes` of `src` into the first `bytes` of this buffer, device to device, enqueued on
  // `s` (cuMemcpyDtoDAsync; nullptr = the legacy default stream). Throws Error(InvalidArgument)
  // when `bytes` exceeds either buffer.
  void copy_from(const DeviceBuffer& src, size_t bytes, Stream s = nullptr);
  TensorView view(DType t, std::initializer_list<int64_t> dims) const { return TensorView(ptr_, t, dims); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// CUDA-event timing on a stream.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  void start(Stream s = nullptr);
  void stop(Stream s = nullptr);
  float elapsed_ms();  // waits for the stop event
 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

Stream create_stream();
void destroy_stream(Stream s);
void stream_synchronize(Stream s);
// Whether work sent to `s` now would be captured into a CUDA graph (or is illegal because another
// stream's global capture is active): cuStreamIsCapturing says anything but "none".
bool stream_capturing(Stream s);

// TMA descriptors (cuTensorMapEncodeTiled; sm_90+). A descriptor is host data: 128 bytes, 64-byte
// aligned, passed to a kernel by value (a __grid_constant__ parameter) and read by the TMA unit.
enum class TmaDataType { u8 = 0, u32 = 2 };          // CUtensorMapDataType
enum class TmaSwizzle { none = 0, bytes128 = 3 };    // CUtensorMapSwizzle
// Encodes a tiled descriptor of the tensor at `global` (16-byte aligned) with `rank` (1..5)
// dimensions dims[0] (innermost, elements) ... dims[rank - 1], byte strides of dimensions 1..rank-1
// in strides_bytes[0 .. rank - 2], and boxes of box[0 .. rank - 1] elements; no interleave,
// element strides 1, L2 promotion 256 B, out-of-bounds elements read as zeros. Throws
// Error(Driver) naming the arguments when the driver lacks the call or rejects them.
void encode_tma_tiled(void* map, TmaDataType type, unsigned rank, const void* global, const uint64_t* dims,
                      const uint64_t* strides_bytes, const uint32_t* box, TmaSwizzle swizzle);

// ---- modules and launches (the runtime's building blocks; tests use them for raw baselines) ----
using Function = void*;  // a CUfunction

// A module loaded from a CUBIN image into the current context (cuModuleLoadData). Move-only;
// unloads on destruction.
class Module {
 public:
  explicit Module(const std::string& cubin);
  ~Module();
  Module(Module&& o) noexcept : mod_(o.mod_) { o.mod_ = nullptr; }
  Module& operator=(Module&& o) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // cuModuleGetFunction; throws Error(Driver) naming the symbol when absent.
  Function function(const std::string& symbol) const;

 private:
  void* mod_ = nullptr;
};

// Raises CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (needed for more than 48 KB).
void set_max_dynamic_smem(Function f, unsigned bytes);
// cuLaunchKernelEx with `args` (a by-value struct) as kernelParams[0]; `cluster` (nullable, or
// {1, 1, 1}: none) launches thread-block clusters of that shape; `programmatic` allows the launch to
// overlap the stream's previous kernel (LaunchDims::programmatic).
void launch(Function f, const unsigned grid[3], const unsigned block[3], unsigned smem_bytes, Stream s,
            const void* args, const unsigned* cluster = nullptr, bool programmatic = false);
// How many clusters of shape `cluster` with `block` threads and `smem_bytes` of dynamic shared memory
// can be resident on the device at once (cuOccupancyMaxActiveClusters): fewer than SMs / cluster
// size where a GPC's usable SMs do not divide into whole clusters. 0 where the driver cannot say (no
// such entry point, or it refuses the shape).
int max_active_clusters(Function f, const unsigned block[3], unsigned smem_bytes, const unsigned cluster[3], Stream s);
// The same launch through plain cuLaunchKernel: the baseline that runtime overhead is measured against.
void launch_raw(Function f, const unsigned grid[3], const unsigned block[3], unsigned smem_bytes, Stream s,
                const void* args);

}  // namespace mlajit::driver
