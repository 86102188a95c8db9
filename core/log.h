#pragma once
// Logging: one line per message to stderr, with a level prefix, safe from any thread.
// A sink can be installed (tests capture messages; the trainer may redirect them).

#include <functional>
#include <string>
#include <string_view>

namespace towerflow {

enum class LogLevel { Debug, Info, Warning, Error };

void log(LogLevel level, std::string_view message);
inline void log_info(std::string_view m) { log(LogLevel::Info, m); }
inline void log_warning(std::string_view m) { log(LogLevel::Warning, m); }
inline void log_error(std::string_view m) { log(LogLevel::Error, m); }

// Messages below this level are dropped. Default Info; TOWERFLOW_LOG_LEVEL=debug|info|warning|error.
void set_log_level(LogLevel level);
LogLevel log_level();

// Replaces the sink (nullptr restores stderr). Returns the previous one.
using LogSink = std::function<void(LogLevel, std::string_view)>;
LogSink set_log_sink(LogSink sink);

}  // namespace towerflow
