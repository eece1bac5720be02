// Progress lines fit the terminal: cut to its width (never inside a UTF-8 character), so that a
// long kernel name does not wrap and break the \r redraw.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "cli/progress.hpp"

using mlajit::cli::fit_to_width;
using mlajit::cli::terminal_columns;

TEST_CASE("progress: a line is cut to the terminal width, leaving the last column free") {
  const std::string line = "build [########................] 3/12 ETA 4s sparse_prefill_fp8_e4m3_h128_p64_g64_sink_fp8math";
  CHECK(fit_to_width(line, 200) == line);  // fits: unchanged
  CHECK(fit_to_width(line, static_cast<int>(line.size()) + 1) == line);
  CHECK(fit_to_width(line, static_cast<int>(line.size())) == line.substr(0, line.size() - 1));
  CHECK(fit_to_width(line, 40) == line.substr(0, 39));
  CHECK(fit_to_width(line, 1) == line.substr(0, 1));  // degenerate widths still print something
  CHECK(fit_to_width(line, 0) == line.substr(0, 1));
  CHECK(fit_to_width("", 10).empty());
  // Multi-byte characters count once and are never split: "é" is 2 bytes, "→" 3.
  const std::string utf8 = "caf\xC3\xA9 \xE2\x86\x92 kernel";
  CHECK(fit_to_width(utf8, 5) == "caf\xC3\xA9");
  CHECK(fit_to_width(utf8, 7) == "caf\xC3\xA9 \xE2\x86\x92");
  CHECK(fit_to_width(utf8, 8) == "caf\xC3\xA9 \xE2\x86\x92 ");
}

TEST_CASE("progress: the width comes from the terminal, else $COLUMNS, else 80") {
  if (isatty(STDERR_FILENO)) {
    CHECK(terminal_columns() > 0);  // the real terminal's width
    return;
  }
  const char* saved = std::getenv("COLUMNS");
  const std::string restore = saved ? saved : "";
  ::setenv("COLUMNS", "57", 1);
  CHECK(terminal_columns() == 57);
  ::setenv("COLUMNS", "wide", 1);
  CHECK(terminal_columns() == 80);  // garbage is ignored
  ::unsetenv("COLUMNS");
  CHECK(terminal_columns() == 80);
  if (saved) ::setenv("COLUMNS", restore.c_str(), 1);
}
