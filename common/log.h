// Minimal leveled logging to stderr, thread-safe per line. DSF_LOG_LEVEL (env: debug, info,
// warn, error) sets the threshold; default info. Not for hot loops.
#pragma once

#include <string_view>

#include "absl/strings/str_format.h"

namespace dsflash::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// True when messages of `level` are printed.
bool enabled(Level level);
// Writes one line "[LEVEL] message" to stderr.
void write(Level level, std::string_view message);

template <typename... Args>
void info(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (enabled(Level::kInfo)) write(Level::kInfo, absl::StrFormat(fmt, args...));
}
template <typename... Args>
void warn(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (enabled(Level::kWarn)) write(Level::kWarn, absl::StrFormat(fmt, args...));
}
template <typename... Args>
void error(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (enabled(Level::kError)) write(Level::kError, absl::StrFormat(fmt, args...));
}
template <typename... Args>
void debug(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (enabled(Level::kDebug)) write(Level::kDebug, absl::StrFormat(fmt, args...));
}

}  // namespace dsflash::log
