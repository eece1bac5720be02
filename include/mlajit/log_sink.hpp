#pragma once
// Where log lines go: stderr by default, or a host's function (C API mlajit_set_log_callback,
// Python mlajit.set_log_handler) so that embedders route mlajit's messages into their own logging.
#include <string_view>

#include "mlajit/log.hpp"

namespace mlajit::log {

// fn(level, message without prefix or newline, user). Called from any thread that logs, possibly
// concurrently; nullptr restores stderr. Lines at a level above log::level() are never formed.
using SinkFn = void (*)(Level level, std::string_view message, void* user);
void set_sink(SinkFn fn, void* user);

}  // namespace mlajit::log
