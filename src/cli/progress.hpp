#pragma once
// Progress on a terminal: a one-line bar with count and ETA on stderr when stderr is a TTY; silent
// when piped (so `--json` output and logs stay clean). Thread-safe.
#include <chrono>
#include <mutex>
#include <string>

namespace mlajit::cli {

class Progress {
 public:
  Progress(std::string label, size_t total);
  ~Progress();
  void advance(const std::string& item = "");
  void finish();
  static bool enabled();

 private:
  void draw();
  std::string label_;
  size_t total_, done_ = 0;
  bool active_, finished_ = false;
  std::string last_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
};

}  // namespace mlajit::cli
