#pragma once
// Runs a shell command line and returns its standard output and exit status (the tests that drive
// the `mlajit` CLI). The caller adds the stderr redirection it wants (2>/dev/null, 2>&1, 2>FILE).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace mlajit::testing {

struct ShellOutput {
  int code = -1;     // exit status, -1 when the command did not exit normally
  std::string text;  // everything it wrote to stdout
};

inline ShellOutput run_shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  ShellOutput r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.text.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace mlajit::testing
