// Kernel timing for the tuner and `mlajit bench`: CUDA events around each launch, the L2 flushed before every timed
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

namespace {

Timing stats_of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  Timing t;
  t.reps = static_cast<int>(n);
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return t;
}

}  // namespace

// The one timing loop of mlajit (tuner, `mlajit bench`, the anchors): warm-up, then per repetition
// each launch in turn, each after an L2 flush, between two CUDA events; medians per launch.
std::vector<Timing> time_interleaved(const std::vector<std::function<void(Stream)>>& launches, int warmup, int reps,
                                     Stream stream) {
  MLAJIT_EXPECT(!launches.empty(), "timed launches", 0, "at least one");
  MLAJIT_EXPECT(reps >= 1, "timing repetitions", reps, ">= 1");
  MLAJIT_EXPECT(warmup >= 0, "timing warm-up launches", warmup, ">= 0");
  const int device = driver::ensure_context();
  driver::DeviceBuffer& scratch = flush_buffer(device);
  for (int i = 0; i < warmup; ++i)
    for (const auto& launch : launches) launch(stream);
  driver::synchronize();

  driver::EventTimer timer;
  std::vector<std::vector<double>> ms(launches.size());
  for (auto& m : ms) m.reserve(static_cast<size_t>(reps));
  unsigned flushes = 0;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < launches.size(); ++i) {
      // cuMemsetD8 runs on the legacy default stream; on another stream, wait for it explicitly so
      // the flush is complete before the start event.
      scratch.fill_bytes(static_cast<uint8_t>(++flushes & 1 ? 0xA5 : 0x5A));
      if (stream) driver::synchronize();
      timer.start(stream);
      launches[i](stream);
      timer.stop(stream);
      ms[i].push_back(timer.elapsed_ms());
    }
  }
  std::vector<Timing> out;
  out.reserve(ms.size());
  for (auto& m : ms) out.push_back(stats_of(std::move(m)));
  return out;
}

Timing time_launches(const std::function<void(Stream)>& launch, int warmup, int reps, Stream stream) {
  return time_interleaved({launch}, warmup, reps, stream).front();
}

}  // namespace mlajit::autotune
