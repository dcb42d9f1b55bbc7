// Smooth weighted round-robin (nginx's ngx_http_upstream_get_peer): the scan
// behind round_robin's choose(), and the sequence its heaps reproduce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

// `current` holds one value per pool index (resized here if the pool size
// changed). Each index in `chosen` (non-empty) gains its candidate's weight;
// the largest current wins (the first on a tie) and gives back the total
// weight. Indices outside `chosen` keep their value.
inline std::size_t swrr_choose(std::vector<std::int64_t>& current, std::span<const Candidate> pool,
                               std::span<const std::size_t> chosen) {
  if (current.size() != pool.size()) current.assign(pool.size(), 0);
  std::int64_t total = 0;
  std::size_t best = chosen.front();
  bool have_best = false;
  for (std::size_t i : chosen) {
    const auto w = static_cast<std::int64_t>(pool[i].weight);
    current[i] += w;
    total += w;
    if (!have_best || current[i] > current[best]) {
      best = i;
      have_best = true;
    }
  }
  current[best] -= total;
  return best;
}

}  // namespace sluice
