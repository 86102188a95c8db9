#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace towerflow {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("TOWERFLOW_LOG_LEVEL");
  std::string v = env ? env : "";
  if (v == "debug") return LogLevel::Debug;
  if (v == "warning") return LogLevel::Warning;
  if (v == "error") return LogLevel::Error;
  return LogLevel::Info;
}

struct LogState {
  std::mutex mu;
  LogLevel level = initial_level();
  LogSink sink;
};

LogState& state() {
  static LogState s;
  return s;
}

const char* prefix(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "D";
    case LogLevel::Info: return "I";
    case LogLevel::Warning: return "W";
    case LogLevel::Error: return "E";
  }
  return "?";
}

}  // namespace

void log(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard lock(s.mu);
  if (level < s.level) return;
  if (s.sink) {
    s.sink(level, message);
    return;
  }
  std::fprintf(stderr, "[towerflow %s] %.*s\n", prefix(level), static_cast<int>(message.size()),
               message.data());
}

void set_log_level(LogLevel level) {
  std::lock_guard lock(state().mu);
  state().level = level;
}

LogLevel log_level() {
  std::lock_guard lock(state().mu);
  return state().level;
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lock(state().mu);
  std::swap(state().sink, sink);
  return sink;
}

}  // namespace towerflow
