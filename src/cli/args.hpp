#pragma once
// A small command-line parser for the mlajit subcommands: positional arguments plus --flag and
// --key value / --key=value options, each declared up front so unknown options are usage errors.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mlajit/error.hpp"

namespace mlajit::cli {

// An argument that looks like an option ("--help", "-h"; not "-" or a negative number).
bool looks_like_option(const std::string& arg);
// Whether `arg` ("--arch") is an option that takes a value in some command (so the argument
// after it is its value, not an option of its own).
bool is_value_option(const std::string& arg);

class Args {
 public:
  // `flags`: options without value (e.g. "json"); `options`: options taking a value (e.g. "arch").
  Args(const std::vector<std::string>& argv, std::set<std::string> flags, std::set<std::string> options);

  bool flag(const std::string& name) const { return flags_set_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  long long get_int(const std::string& name, long long fallback, long long lo, long long hi) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // The positional argument `i`, or a usage error naming `what`.
  const std::string& need(size_t i, const std::string& what) const;
  // Usage error if there are more than `n` positional arguments.
  void at_most(size_t n) const;

 private:
  std::set<std::string> flags_set_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace mlajit::cli
