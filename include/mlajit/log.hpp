#pragma once
// Logging to stderr, filtered by MLAJIT_LOG=error|warn|info|debug (default warn). The level is
// read once; messages below it cost one integer compare and never format their arguments.
#include <fmt/format.h>

#include <string_view>

namespace mlajit::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

// The active level (from MLAJIT_LOG on first use, or set_level).
Level level();
void set_level(Level l);
// Parses "error" | "warn" | "info" | "debug"; throws Error(InvalidArgument) otherwise.
Level parse_level(std::string_view name);

// Writes one line "mlajit [<level>] <message>" to stderr (atomically per line).
void write(Level l, std::string_view message);

template <typename... Args>
void at(Level l, fmt::format_string<Args...> f, Args&&... args) {
  if (static_cast<int>(l) <= static_cast<int>(level())) write(l, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) { at(Level::error, f, std::forward<Args>(args)...); }
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) { at(Level::warn, f, std::forward<Args>(args)...); }
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) { at(Level::info, f, std::forward<Args>(args)...); }
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) { at(Level::debug, f, std::forward<Args>(args)...); }

}  // namespace mlajit::log
