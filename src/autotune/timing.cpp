// Kernel timing for the tuner: CUDA events around each launch, the L2 flushed before every timed
// repetition so that a kernel whose inputs happen to sit in L2 from the previous repetition (50 MB
// on an H100) is not credited with bandwidth it will not have in a model step.
#include <algorithm>
#include <map>
#include <mutex>

#include "mlajit/autotune.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"

namespace mlajit::autotune {

namespace {

// One scratch buffer of 2x the L2 size per device, allocated on first use and kept (a tune times
// hundreds of candidates; reallocating per call would add a cuMemAlloc/cuMemFree each).
driver::DeviceBuffer& flush_buffer(int device) {
  static std::mutex mu;
  static auto* buffers = new std::map<int, driver::DeviceBuffer>();  // never freed: lives with the contexts
  std::lock_guard<std::mutex> lk(mu);
  auto it = buffers->find(device);
  if (it == buffers->end()) {
    const auto info = driver::device_info(device);
    const size_t bytes = std::max<size_t>(2 * static_cast<size_t>(std::max(info.l2_bytes, 0)), size_t{8} << 20);
    it = buffers->emplace(device, driver::DeviceBuffer(bytes)).first;
  }
  return it->second;
}

}  // namespace

Timing time_launches(const std::function<void(Stream)>& launch, int warmup, int reps, Stream stream) {
  MLAJIT_EXPECT(reps >= 1, "timing repetitions", reps, ">= 1");
  MLAJIT_EXPECT(warmup >= 0, "timing warm-up launches", warmup, ">= 0");
  const int device = driver::ensure_context();
  driver::DeviceBuffer& scratch = flush_buffer(device);
  for (int i = 0; i < warmup; ++i) launch(stream);
  driver::synchronize();

  driver::EventTimer timer;
  std::vector<double> ms;
  ms.reserve(reps);
  for (int r = 0; r < reps; ++r) {
    // cuMemsetD8 runs on the legacy default stream; on another stream, wait for it explicitly so
    // the flush is complete before the start event.
    scratch.fill_bytes(static_cast<uint8_t>(r & 1 ? 0xA5 : 0x5A));
    if (stream) driver::synchronize();
    timer.start(stream);
    launch(stream);
    timer.stop(stream);
    ms.push_back(timer.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.reps = reps;
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
  return t;
}

}  // namespace mlajit::autotune
