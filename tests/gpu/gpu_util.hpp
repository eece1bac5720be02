#pragma once
// Helpers for GPU tests: device vectors with poison, upload/download, and wall/event timing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mlajit/driver.hpp"

namespace mlajit_test {

// Bytes 0xFF: NaN for f32 and bf16, so a kernel that skips an output element is caught.
constexpr uint8_t kPoisonByte = 0xFF;

template <typename T>
mlajit::driver::DeviceBuffer upload(const std::vector<T>& host) {
  mlajit::driver::DeviceBuffer buf(host.size() * sizeof(T));
  buf.upload(host.data(), host.size() * sizeof(T));
  return buf;
}

template <typename T>
std::vector<T> download(const mlajit::driver::DeviceBuffer& buf, size_t count) {
  std::vector<T> host(count);
  buf.download(host.data(), count * sizeof(T));
  return host;
}

// A device buffer of `count` elements filled with the poison pattern.
template <typename T>
mlajit::driver::DeviceBuffer poisoned(size_t count) {
  mlajit::driver::DeviceBuffer buf(count * sizeof(T));
  buf.fill_bytes(kPoisonByte);
  return buf;
}

// True when every float's bits are the poison pattern (the kernel wrote nothing).
inline bool all_poison(const std::vector<float>& v) {
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u != 0xFFFFFFFFu) return false;
  }
  return true;
}

template <typename T>
const T* dptr(const mlajit::driver::DeviceBuffer& b) {
  return static_cast<const T*>(b.get());
}
template <typename T>
T* dptr(mlajit::driver::DeviceBuffer& b) {
  return static_cast<T*>(b.get());
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median of the host wall time (ns) per call of f() over `reps` rounds of `iters` calls.
template <typename F>
double ns_per_call(F&& f, int iters, int reps = 5) {
  std::vector<double> r;
  for (int k = 0; k < reps; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) f();
    r.push_back(seconds_since(t0) * 1e9 / iters);
  }
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

}  // namespace mlajit_test
