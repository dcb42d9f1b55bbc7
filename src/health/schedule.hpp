// When checks run. `interval` is measured from the end of one check to the
// start of the next; `jitter` (a fraction of the interval, 0..1) spreads the
// checks of many servers so they are not all probed at once. Pure: the caller
// supplies `u`, a uniform random number in [0, 1).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

#include "sluice/config.hpp"

namespace sluice::health {

// The first check: at a random offset within interval * jitter (at once
// without jitter), so a start or reload does not probe every server at once.
inline Duration first_delay(Duration interval, double jitter, double u) {
  const double span = static_cast<double>(interval.count()) * std::clamp(jitter, 0.0, 1.0);
  return Duration(static_cast<Duration::rep>(std::floor(span * std::clamp(u, 0.0, 1.0))));
}

// Every later pause: interval minus up to interval * jitter. Jitter only
// shortens a pause, so the detection bounds in `fall x interval` and
// `rise x interval` hold whatever its value.
inline Duration next_delay(Duration interval, double jitter, double u) {
  const double base = static_cast<double>(interval.count());
  const double cut = base * std::clamp(jitter, 0.0, 1.0) * std::clamp(u, 0.0, 1.0);
  return Duration(static_cast<Duration::rep>(std::max(0.0, std::round(base - cut))));
}

}  // namespace sluice::health
