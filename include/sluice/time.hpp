// Clocks and the config file's duration style, shared by every module.
#pragma once

#include <chrono>
#include <string>

#include "sluice/config.hpp"

namespace sluice {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

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
