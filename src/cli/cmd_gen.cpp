// mlajit gen CONFIG.json [--kernel NAME] [--expand]: print the generated source.
#include <cstdio>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "mlajit/codegen.hpp"
#include "mlajit/kernel_set.hpp"

namespace mlajit::cli {

int cmd_gen(const Argv& argv) {
  Args args(argv, {"expand"}, {"kernel"});
  args.at_most(1);
  const KernelSet set = load_kernel_set(args.need(0, "CONFIG.json"));
  const auto only = args.get("kernel");
  bool found = false;
  for (const auto& k : set.kernels) {
    KernelSource src = generate(k.spec);
    if (only && src.name != *only) continue;
    found = true;
    std::fputs((args.flag("expand") ? expand_includes(src.code) : src.code).c_str(), stdout);
    std::fputs("\n", stdout);
  }
  if (only && !found) {
    std::string names;
    for (const auto& k : set.kernels) names += (names.empty() ? "" : ", ") + k.spec.name();
    throw_invalid("--kernel", *only, "one of the config's kernels: " + names);
  }
  return 0;
}

}  // namespace mlajit::cli
