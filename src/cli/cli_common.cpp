#include "cli/cli_common.hpp"

#include <algorithm>

#include "mlajit/compiler.hpp"
#include "mlajit/config.hpp"
#include "mlajit/driver.hpp"
#include "mlajit/error.hpp"
#include "mlajit/runtime.hpp"

namespace mlajit::cli {

std::unique_ptr<DiskCache> open_cache(const Args& args) {
  if (auto dir = args.get("cache-dir")) return std::make_unique<DiskCache>(*dir, config::cache_max_bytes());
  auto c = DiskCache::from_env();
  if (!c)
    throw_error(ErrorKind::Cache, "the disk cache is disabled (MLAJIT_DISABLE_DISK_CACHE is set); pass --cache-dir D");
  return c;
}

std::vector<std::string> resolve_archs(const Args& args, const std::string& config_arch) {
  auto a = args.get("arch");
  if (!a || a->find(',') == std::string::npos) return {resolve_arch(args, config_arch)};
  std::vector<std::string> archs;
  size_t start = 0;
  while (start <= a->size()) {
    size_t end = std::min(a->find(',', start), a->size());
    std::string one = a->substr(start, end - start);
    validate_arch(one, "--arch");
    if (std::find(archs.begin(), archs.end(), one) == archs.end()) archs.push_back(one);
    start = end + 1;
  }
  return archs;
}

std::string resolve_arch(const Args& args, const std::string& config_arch) {
  std::string arch;
  if (auto a = args.get("arch")) arch = *a;
  else if (!config_arch.empty()) arch = config_arch;
  else if (auto a = config::arch_override()) arch = *a;
  else {
    std::string why;
    if (!driver::available(&why))
      throw_invalid("target arch", "none given and no GPU (" + why + ")", "--arch A, a config \"arch\", or MLAJIT_ARCH");
    arch = Runtime::global().arch();
  }
  validate_arch(arch, "--arch");
  return arch;
}

}  // namespace mlajit::cli
