#include "log/rate_limited_warning.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

namespace sluice {

namespace {

void write(spdlog::level::level_enum level, std::string_view message, std::uint64_t held) {
  if (held > 0) {
    spdlog::log(level, "{} (and {} more like it since the last report)", message, held);
  } else {
    spdlog::log(level, "{}", message);
  }
}

}  // namespace

bool RateLimitedWarning::due() {
  using namespace std::chrono;
  const auto now = static_cast<std::uint64_t>(
      duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count());
  std::uint64_t next = next_ms_.load(std::memory_order_relaxed);
  if (now < next || !next_ms_.compare_exchange_strong(next, now + interval_ms_, std::memory_order_relaxed)) {
    held_back_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void RateLimitedWarning::warn(std::string_view message) {
  if (due()) write(spdlog::level::warn, message, held_back_.exchange(0, std::memory_order_relaxed));
}

void RateLimitedWarning::info(std::string_view message) {
  if (due()) write(spdlog::level::info, message, held_back_.exchange(0, std::memory_order_relaxed));
}

}  // namespace sluice
