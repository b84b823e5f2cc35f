#include "common/log.h"

#include "spdlog/sinks/stdout_sinks.h"

namespace muster {

std::shared_ptr<spdlog::logger> Logger(const char* component) {
  std::string name = std::string("muster:") + component;
  if (auto existing = spdlog::get(name)) return existing;
  try {
    auto logger = spdlog::stderr_logger_mt(name);
    logger->set_pattern("[%n] %^%l%$: %v");
    return logger;
  } catch (const spdlog::spdlog_ex&) {
    return spdlog::get(name);  // another thread registered it first
  }
}

void SetLogLevel(spdlog::level::level_enum level) { spdlog::set_level(level); }

}  // namespace muster
