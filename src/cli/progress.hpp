#pragma once
// Progress on a terminal: a one-line bar with count and ETA on stderr when stderr is a TTY; silent
// when piped (so `--json` output and logs stay clean). Thread-safe. The line is cut to the
// terminal's width, so that a long kernel name never wraps (a wrapped line breaks the \r redraw:
// every update would leave a line behind).
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

namespace mlajit::cli {

// The columns of the terminal on stderr (TIOCGWINSZ), else $COLUMNS, else 80.
int terminal_columns();
// `line` cut to at most columns - 1 characters (the last column stays free: writing it makes some
// terminals wrap at once), never inside a UTF-8 sequence. Unchanged when it fits.
std::string fit_to_width(std::string_view line, int columns);

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
