// The KV bench's same-harness copy reference on the GPU: DeviceBuffer::copy_from (the
// cuMemcpyDtoDAsync it times) copies exactly the bytes asked for and range-checks both buffers;
// bench_kv_cache reports the copy in "same_harness_copy" consistently with the op's own figures;
// `mlajit bench kv_cache_*` prints the line.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_util.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "ops/kv_cache/bench.hpp"
#include "shell_command.hpp"

using namespace mlajit;

namespace {
// The CLI beside this test binary when it is there (the GPU machine runs copies of both from one
// folder), else the one of the build tree.
std::string cli_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    const auto beside = std::filesystem::path(self).parent_path() / "mlajit";
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return MLAJIT_CLI_PATH;
}
}  // namespace

TEST_SUITE("kv_cache gpu") {

TEST_CASE("DeviceBuffer::copy_from copies the first bytes on a stream and range-checks both buffers") {
  const size_t n = (size_t{1} << 20) + 13;  // not a multiple of any copy width
  std::mt19937 gen(5);
  std::vector<uint8_t> host(n + 64);
  for (auto& b : host) b = static_cast<uint8_t>(gen());
  driver::DeviceBuffer src = mlajit_test::upload(host);
  driver::DeviceBuffer dst = mlajit_test::poisoned<uint8_t>(n + 128);

  Stream s = driver::create_stream();
  dst.copy_from(src, n, s);
  driver::stream_synchronize(s);
  driver::destroy_stream(s);
  const auto out = mlajit_test::download<uint8_t>(dst, n + 128);
  size_t wrong = 0, past_end = 0;
  for (size_t i = 0; i < n; ++i) wrong += out[i] != host[i];
  for (size_t i = n; i < n + 128; ++i) past_end += out[i] != mlajit_test::kPoisonByte;
  CHECK(wrong == 0);
  CHECK(past_end == 0);  // nothing written past the bytes asked for

  // The legacy default stream, and zero bytes (a no-op).
  driver::DeviceBuffer dst2 = mlajit_test::poisoned<uint8_t>(n);
  dst2.copy_from(src, n);
  dst2.copy_from(src, 0);
  driver::synchronize();
  CHECK(mlajit_test::download<uint8_t>(dst2, 16) == std::vector<uint8_t>(host.begin(), host.begin() + 16));

  CHECK_THROWS_AS(dst2.copy_from(src, n + 1), Error);      // past the destination
  CHECK_THROWS_AS(dst.copy_from(src, n + 65), Error);      // past the source (n + 64 bytes)
  CHECK_THROWS_AS(src.copy_from(dst, n + 128), Error);     // past the destination this time
  CHECK_THROWS_AS(dst2.copy_from(dst2, 16), Error);        // onto itself: overlapping ranges
  dst2.copy_from(dst2, 0);                                  // zero bytes stay a no-op
}

TEST_CASE("bench kv_cache_store / gather: same_harness_copy times a copy of the op's bytes") {
  for (const std::string op : {"kv_cache_store", "kv_cache_gather"}) {
    INFO("op ", op);  // std::string: doctest prints a const char* as an address
    bench::KvCacheBenchShape s;
    s.tokens = 4096;
    s.quantization_granularity = 64;
    s.reps = 5;
    const nlohmann::json r = bench::bench_kv_cache(op, s);
    REQUIRE(r.contains("same_harness_copy"));
    const auto& cp = r["same_harness_copy"];
    const int64_t bytes = r["bytes"].get<int64_t>();
    CHECK(cp["bytes"].get<int64_t>() == bytes / 2 * 2);  // read + written: the op's count, rounded to even
    CHECK(cp["ms_min"].get<double>() > 0);
    CHECK(cp["ms_min"].get<double>() <= cp["ms_median"].get<double>());
    const double copy_gbps = cp["gbps"].get<double>();
    CHECK(copy_gbps == doctest::Approx(cp["bytes"].get<double>() / (cp["ms_median"].get<double>() * 1e-3) / 1e9));
    CHECK(cp["pct"].get<double>() == doctest::Approx(100.0 * r["gbps"].get<double>() / copy_gbps));
    // The nominal reference stays as it was.
    CHECK(r["copy_bw_gbps"].get<double>() == bench::kDeviceCopyGBps);
    CHECK(r["pct_of_copy_bw"].get<double>() == doctest::Approx(100.0 * r["gbps"].get<double>() / bench::kDeviceCopyGBps));
    MESSAGE(op << " 4096 tokens: " << r["gbps"].get<double>() << " GB/s, same-harness copy " << copy_gbps
                << " GB/s, op = " << cp["pct"].get<double>() << "% of it");
  }
}

TEST_CASE("mlajit bench kv_cache_gather prints the same-harness copy line") {
  const auto r = mlajit::testing::run_shell("'" + cli_path() + "'" +
                                            " bench kv_cache_gather --shape tokens=4096,dtype=bf16 --reps 3 2>&1");
  INFO(r.text);
  CHECK(r.code == 0);
  CHECK(r.text.find("kv_cache_gather: ") != std::string::npos);
  CHECK(r.text.find("% of 3000 GB/s copy bandwidth") != std::string::npos);
  CHECK(r.text.find("  same harness, cuMemcpyDtoD of the same bytes: ") != std::string::npos);
  CHECK(r.text.find("; op = ") != std::string::npos);
}

}  // TEST_SUITE
