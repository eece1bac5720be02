// stderr logging with a process-wide level taken from MLAJIT_LOG.
#include "mlajit/log.hpp"
#include "mlajit/log_sink.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "mlajit/error.hpp"

namespace mlajit::log {

namespace {

constexpr const char* kNames[] = {"error", "warn", "info", "debug"};

int initial_level() {
  const char* env = std::getenv("MLAJIT_LOG");
  if (!env || !*env) return static_cast<int>(Level::warn);
  try {
    return static_cast<int>(parse_level(env));
  } catch (const Error& e) {
    // A typo in MLAJIT_LOG must not take the process down; say so once and keep the default.
    std::fprintf(stderr, "mlajit [warn] ignoring %s\n", e.what());
    return static_cast<int>(Level::warn);
  }
}

// The host's sink, read under a mutex: logging is rare (never on the launch hot path).
std::mutex g_sink_mu;
SinkFn g_sink = nullptr;
void* g_sink_user = nullptr;

std::atomic<int>& level_ref() {
  static std::atomic<int> l{initial_level()};
  return l;
}

}  // namespace

Level level() { return static_cast<Level>(level_ref().load(std::memory_order_relaxed)); }

void set_level(Level l) { level_ref().store(static_cast<int>(l), std::memory_order_relaxed); }

Level parse_level(std::string_view name) {
  for (int i = 0; i < 4; ++i)
    if (name == kNames[i]) return static_cast<Level>(i);
  throw_invalid("MLAJIT_LOG", fmt::format("\"{}\"", name), "error | warn | info | debug");
}

void set_sink(SinkFn fn, void* user) {
  std::lock_guard<std::mutex> lk(g_sink_mu);
  g_sink = fn;
  g_sink_user = user;
}

void write(Level l, std::string_view message) {
  {
    std::lock_guard<std::mutex> lk(g_sink_mu);
    if (g_sink) {
      g_sink(l, message, g_sink_user);
      return;
    }
  }
  // One fwrite per line so that lines from concurrent threads do not interleave.
  std::string line = fmt::format("mlajit [{}] {}\n", kNames[static_cast<int>(l)], message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace mlajit::log
