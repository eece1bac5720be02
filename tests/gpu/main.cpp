// doctest main of the GPU suite. Without a usable CUDA driver/device every test would fail for a
// reason that has nothing to do with mlajit, so the suite says why, prints how many cases it
// skipped and exits 77 (CTest's SKIP_RETURN_CODE for this test).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "mlajit/driver.hpp"

int main(int argc, char** argv) {
  std::string reason;
  if (!mlajit::driver::available(&reason)) {
    std::printf("mlajit_gpu_tests: SKIPPED all %zu GPU test cases: %s\n", doctest::detail::getRegisteredTests().size(),
                reason.c_str());
    return 77;
  }
  auto info = mlajit::driver::device_info(mlajit::driver::ensure_context());
  std::printf("mlajit_gpu_tests: %s (sm_%d%d, %d SMs, driver %s)\n", info.name.c_str(), info.cc_major, info.cc_minor,
              info.sm_count, info.driver_version.c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
