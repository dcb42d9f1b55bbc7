// Clocks and the config file's duration style, shared by every module.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "sluice/config.hpp"

namespace sluice {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// Milliseconds since the epoch, for status fields and Sentinel's answers.
inline std::int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A duration as libuv's timer milliseconds; a negative one is due now.
inline std::uint64_t timer_ms(Duration d) { return d.count() <= 0 ? 0 : static_cast<std::uint64_t>(d.count()); }

// "250ms", "10s", "1.5s", "5m", "1h": the config file's duration style.
inline std::string format_duration(Duration d) {
  const auto ms = d.count();
  if (ms < 0) {
    // Built by append: GCC 12 at -O3 misreports "-" + std::string as -Wrestrict.
    std::string out = "-";
    out += format_duration(Duration(-ms));
    return out;
  }
  if (ms == 0) return "0s";
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  if (ms < 1000) return std::to_string(ms) + "ms";
  // Seconds with up to three decimals, trailing zeros dropped: "1.5s", "12.345s".
  std::string frac = std::to_string(1000 + ms % 1000).substr(1);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return std::to_string(ms / 1000) + "." + frac + "s";
}

}  // namespace sluice
