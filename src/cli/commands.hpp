#pragma once
// The mlajit subcommands. Each takes the arguments after its name and returns the exit code
// (0 success); errors are thrown as mlajit::Error and mapped to exit codes by main.
#include <string>
#include <vector>

namespace mlajit::cli {

using Argv = std::vector<std::string>;

int cmd_build(const Argv& argv);
int cmd_gen(const Argv& argv);
int cmd_cache(const Argv& argv);
int cmd_info(const Argv& argv);
int cmd_bench(const Argv& argv);
int cmd_tune(const Argv& argv);
int cmd_check(const Argv& argv);

}  // namespace mlajit::cli
