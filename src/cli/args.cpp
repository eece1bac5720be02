#include "cli/args.hpp"

#include <cctype>

namespace mlajit::cli {

bool looks_like_option(const std::string& a) {
  // "-" alone (stdin, by convention) and negative numbers ("-1") are values.
  return a.size() >= 2 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1])) && a[1] != '.';
}

bool is_value_option(const std::string& arg) {
  // Every option of any command that takes a value (the Args declarations of cmd_*.cpp); "-o" is
  // cache export's short --output.
  static const std::set<std::string> kValueOptions = {"--anchor", "--arch",  "--cache-dir", "--csv",
                                                      "--devices", "--jobs", "--kernel",    "--max-bytes",
                                                      "--output",  "--reps", "--seed",      "--shape",
                                                      "--warmup",  "-o"};
  return kValueOptions.count(arg) > 0;
}

Args::Args(const std::vector<std::string>& argv, std::set<std::string> flags, std::set<std::string> options) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 2 && a.rfind("--", 0) == 0) {
      std::string name = a.substr(2), value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (flags.count(name)) {
        if (has_value) throw_invalid("option --" + name, value, "no value (it is a flag)");
        flags_set_.insert(name);
      } else if (options.count(name)) {
        if (!has_value) {
          if (i + 1 >= argv.size()) throw_invalid("option --" + name, "nothing", "a value after it");
          value = argv[++i];
          // `--arch --help`: a value that looks like an option is a forgotten value, not a value
          // (a value that does start with '-' can be given as --name=VALUE).
          if (looks_like_option(value))
            throw_invalid("option --" + name, fmt::format("\"{}\" (an option)", value),
                          fmt::format("a value after it (write --{}=VALUE for a value starting with '-')", name));
        }
        values_[name] = value;
      } else {
        std::string known;
        for (auto& f : flags) known += " --" + f;
        for (auto& o : options) known += " --" + o;
        throw_invalid("option", a, known.empty() ? std::string("no options") : "one of" + known);
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

long long Args::get_int(const std::string& name, long long fallback, long long lo, long long hi) const {
  auto v = get(name);
  if (!v) return fallback;
  size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(*v, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != v->size() || v->empty()) throw_invalid("option --" + name, *v, "an integer");
  if (x < lo || x > hi) throw_invalid("option --" + name, x, fmt::format("an integer in [{}, {}]", lo, hi));
  return x;
}

const std::string& Args::need(size_t i, const std::string& what) const {
  if (i >= positional_.size()) throw_invalid(what, "nothing", "an argument");
  return positional_[i];
}

void Args::at_most(size_t n) const {
  if (positional_.size() > n) throw_invalid("argument", positional_[n], "no further arguments");
}

}  // namespace mlajit::cli
