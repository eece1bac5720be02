#include "cli/progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace mlajit::cli {

bool Progress::enabled() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)), total_(total), active_(enabled() && total > 0), start_(std::chrono::steady_clock::now()) {
  if (active_) draw();
}

Progress::~Progress() { finish(); }

void Progress::advance(const std::string& item) {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  last_ = item;
  if (active_) draw();
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ && !finished_) std::fputs("\r\033[K", stderr);
  finished_ = true;
}

void Progress::draw() {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ ? static_cast<double>(done_) / total_ : 1.0;
  const int width = 24, filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  char eta[32] = "";
  if (done_ > 0 && done_ < total_) std::snprintf(eta, sizeof eta, "ETA %.0fs", elapsed / done_ * (total_ - done_));
  std::fprintf(stderr, "\r\033[K%s [%s] %zu/%zu %s %s", label_.c_str(), bar.c_str(), done_, total_,
               eta, last_.substr(0, 40).c_str());
  std::fflush(stderr);
}

}  // namespace mlajit::cli
