// mlajit check CONFIG.json [--cache-dir D] [--seed S] [--json]: runs every op of a config once on
// random data on the GPU and compares it with the CPU reference (tests/reference/).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/kernel_set.hpp"
#include "reference/selfcheck.hpp"

namespace mlajit::cli {

int cmd_check(const Argv& argv) {
  Args args(argv, {"json", "require-gpu"}, {"cache-dir", "seed"});
  args.at_most(1);
  const KernelSet set = load_kernel_set(args.need(0, "CONFIG.json"));
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 1, 0, 1LL << 62));
  // The runtime reads the cache location from the environment: point it at --cache-dir.
  if (auto dir = args.get("cache-dir")) setenv("MLAJIT_CACHE_DIR", dir->c_str(), 1);
  std::string why;
  if (!driver::available(&why)) {
    // Scripts that must not mistake "nothing checked" for "passed" ask for --require-gpu.
    const bool required = args.flag("require-gpu");
    if (args.flag("json"))
      std::puts(nlohmann::json({{"skipped", true}, {"reason", why}}).dump(2).c_str());
    else
      std::printf("check: no GPU (%s): the %zu kernels were built; GPU checks skipped\n", why.c_str(), set.kernels.size());
    if (required) std::fprintf(stderr, "mlajit check: nothing was checked and --require-gpu was given: failing (exit 4)\n");
    return required ? 4 : 0;
  }
  nlohmann::json rows = nlohmann::json::array();
  size_t failed = 0;
  if (!args.flag("json")) std::printf("%-58s %-6s %9s  %s\n", "kernel", "result", "first_ms", "vs CPU reference");
  for (const auto& k : set.kernels) {
    ref::CheckResult r;
    std::string error;
    try {
      r = ref::check_spec(k.spec, seed);
    } catch (const Error& e) {
      error = e.what();
    }
    const bool ok = error.empty() && r.passed;
    failed += !ok;
    rows.push_back({{"kernel", k.spec.name()}, {"passed", ok}, {"metric", error.empty() ? r.metric : error},
                    {"first_launch_ms", r.gpu_ms}});
    if (!args.flag("json"))
      std::printf("%-58s %-6s %9.2f  %s\n", k.spec.name().c_str(), ok ? "PASS" : "FAIL", r.gpu_ms,
                  (error.empty() ? r.metric : error).c_str());
  }
  if (args.flag("json")) std::puts(nlohmann::json({{"kernels", rows}, {"failed", failed}}).dump(2).c_str());
  else std::printf("%zu kernels checked, %zu failed\n", set.kernels.size(), failed);
  return failed ? 4 : 0;
}

}  // namespace mlajit::cli
