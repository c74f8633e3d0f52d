// Logging implementation: threshold read once from DSF_LOG_LEVEL.
#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dsflash::log {
namespace {

Level threshold() {
  static const Level level = [] {
    const char* env = std::getenv("DSF_LOG_LEVEL");
    if (env == nullptr) return Level::kInfo;
    if (std::strcmp(env, "debug") == 0) return Level::kDebug;
    if (std::strcmp(env, "warn") == 0) return Level::kWarn;
    if (std::strcmp(env, "error") == 0) return Level::kError;
    return Level::kInfo;
  }();
  return level;
}

}  // namespace

bool enabled(Level level) { return level >= threshold(); }

void write(Level level, std::string_view message) {
  static std::mutex mu;
  static const char* const kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[%s] %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace dsflash::log
