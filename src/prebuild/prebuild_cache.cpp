// mlajit_prebuild_cache CONFIG.json OUT_DIR ARCH[,ARCH...]: compiles every kernel of a kernel set
// into OUT_DIR with NVRTC (no GPU), the packaged read-only cache layer that installs ship
// (docs/design.md, "The disk cache and its trust rules"). Run by the build at package time; an
// arch a kernel does not support is skipped (e.g. the Hopper-only kernels for sm_100a), any other
// failure fails the tool, so a package never ships a partial layer unknowingly. Entries already in OUT_DIR are hits (a rebuild
// after an unrelated change compiles nothing); entries of other keys (an older library, another
// config) are removed, so OUT_DIR holds exactly the set. Prints one summary line.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel.hpp"
#include "mlajit/build.hpp"
#include "mlajit/cache.hpp"
#include "mlajit/error.hpp"
#include "mlajit/kernel_set.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mlajit_prebuild_cache CONFIG.json OUT_DIR ARCH[,ARCH...]\n");
    return 2;
  }
  try {
    const mlajit::KernelSet set = mlajit::load_kernel_set(argv[1]);
    mlajit::DiskCache cache{std::string(argv[2])};
    std::vector<std::string> archs;
    std::stringstream ss(argv[3]);
    for (std::string a; std::getline(ss, a, ',');)
      if (!a.empty()) archs.push_back(a);
    struct Job {
      const mlajit::KernelSpec* spec;
      std::string arch;
    };
    std::vector<Job> jobs;
    for (const auto& a : archs)
      for (const auto& k : set.kernels) jobs.push_back({&k.spec, a});
    std::atomic<size_t> built{0}, skipped{0};
    std::mutex mu;
    std::string first_error;
    std::set<std::string> keys;
    mlajit::parallel_for(jobs.size(), mlajit::default_jobs(), [&](size_t i) {
      try {
        const mlajit::BuildResult r = mlajit::build_kernel(*jobs[i].spec, jobs[i].arch, &cache);
        ++built;
        std::lock_guard<std::mutex> lk(mu);
        keys.insert(r.key);
      } catch (const mlajit::Error& e) {
        // A kernel whose every path needs another arch (its min_arch; build_kernel's error names
        // the "target arch of" it) is not built for this one.
        const std::string what = e.what();
        if (e.kind() == mlajit::ErrorKind::InvalidArgument && what.find("target arch of") != std::string::npos) {
          ++skipped;
          return;
        }
        std::lock_guard<std::mutex> lk(mu);
        if (first_error.empty()) first_error = what;
      }
    });
    if (!first_error.empty()) {
      std::fprintf(stderr, "mlajit_prebuild_cache: %s\n", first_error.c_str());
      return 1;
    }
    size_t removed = 0;
    for (const auto& e : std::filesystem::directory_iterator(argv[2])) {
      const std::string name = e.path().filename().string();
      const bool entry = name.size() > 4 && name.compare(name.size() - 4, 4, ".mjc") == 0;
      if (entry && !keys.count(name.substr(0, name.size() - 4))) removed += std::filesystem::remove(e.path());
    }
    if (removed) std::printf("mlajit_prebuild_cache: removed %zu entries of other keys\n", removed);
    std::printf("mlajit_prebuild_cache: %zu kernels built into %s (%zu skipped: not for that arch)\n", built.load(),
                argv[2], skipped.load());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlajit_prebuild_cache: %s\n", e.what());
    return 1;
  }
}
