#include "cli/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace mlajit::cli {

int terminal_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n < 100000) return static_cast<int>(n);
  }
  return 80;
}

std::string fit_to_width(std::string_view line, int columns) {
  // Counts characters as code points: the progress line is ASCII apart from what a kernel name or
  // a path might carry, and none of it is double-width.
  const size_t keep = columns > 1 ? static_cast<size_t>(columns - 1) : 1;
  size_t chars = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;  // a continuation byte
    if (chars++ == keep) return std::string(line.substr(0, i));
  }
  return std::string(line);
}

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
  char counts[64];
  std::snprintf(counts, sizeof counts, " %zu/%zu ", done_, total_);
  const std::string line = label_ + " [" + bar + "]" + counts + eta + " " + last_;
  // The width is read per draw: the user may resize the terminal while a long build runs.
  std::fprintf(stderr, "\r\033[K%s", fit_to_width(line, terminal_columns()).c_str());
  std::fflush(stderr);
}

}  // namespace mlajit::cli
