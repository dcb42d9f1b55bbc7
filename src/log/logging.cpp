#include "log/logging.hpp"

#include <memory>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace sluice {

void init_error_log(const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("sluice");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e [%l] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace sluice
