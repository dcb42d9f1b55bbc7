// Slow start: after a server comes back, its effective weight ramps linearly
// from 10% to 100% of its weight over `slow_start`.
#pragma once

#include <algorithm>

#include "sluice/config.hpp"
#include "sluice/time.hpp"

namespace sluice {

inline double slow_start_factor(Duration since_up, Duration slow_start) {
  if (slow_start.count() <= 0 || since_up >= slow_start) return 1.0;
  if (since_up.count() <= 0) return 0.1;
  const double f = static_cast<double>(since_up.count()) / static_cast<double>(slow_start.count());
  return std::clamp(0.1 + 0.9 * f, 0.1, 1.0);
}

}  // namespace sluice
