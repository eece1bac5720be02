// doctest main of the remote-cache suite. It needs a redis-server binary (Debian package
// redis-server); without one the suite exits 77, which CTest reports as skipped (never passed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "remote/redis_fixture.hpp"

int main(int argc, char** argv) {
  if (mlajit::testing::redis_server_path().empty()) {
    std::fprintf(stderr, "redis-server not found on PATH: remote cache suite SKIPPED (apt-get install redis-server)\n");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
