// A warning for errors that come in storms (or an info line for routine
// events that may): at most one line per interval, process-wide, however
// many threads report; the next line says how many were held back.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace sluice {

class RateLimitedWarning {
 public:
  explicit RateLimitedWarning(std::uint64_t interval_ms = 1000) : interval_ms_(interval_ms) {}
  // `message` is only formatted into the log when the line is written.
  void warn(std::string_view message);
  // The same, at info level: for what happens routinely, but may come in storms.
  void info(std::string_view message);

 private:
  // Whether a line may be written now; counts one held back when not.
  bool due();

  std::uint64_t interval_ms_;
  std::atomic<std::uint64_t> next_ms_{0};
  std::atomic<std::uint64_t> held_back_{0};
};

}  // namespace sluice
