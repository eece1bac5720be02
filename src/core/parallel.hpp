#pragma once
// parallel_for: runs fn(i) for i in [0, n) on `jobs` threads (work-stealing by an atomic counter).
// Exceptions inside fn are the caller's business: fn should catch and record per-item failures.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace mlajit {

inline unsigned default_jobs() { return std::max(1u, std::thread::hardware_concurrency()); }

template <typename F>
void parallel_for(size_t n, unsigned jobs, F&& fn) {
  jobs = static_cast<unsigned>(std::min<size_t>(std::max(1u, jobs), n));
  if (jobs <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  workers.reserve(jobs);
  for (unsigned w = 0; w < jobs; ++w)
    workers.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : workers) t.join();
}

}  // namespace mlajit
