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

}  // namespace mlajit::driver
