// Smooth weighted round-robin (nginx's ngx_http_upstream_get_peer), shared by
// round_robin and least_conn's tie-break.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "upstream/server_state.hpp"

namespace sluice {

// `current` holds one value per server index (resized here if the pool size
// changed). Each of `candidates` (non-empty) gains its weight; the largest
// current wins (the first on a tie) and gives back the candidates' total
// weight. Servers outside `candidates` keep their value.
inline std::size_t swrr_choose(std::vector<std::int64_t>& current,
                               std::span<ServerState* const> servers,
                               std::span<const std::size_t> candidates) {
  if (current.size() != servers.size()) current.assign(servers.size(), 0);
  std::int64_t total = 0;
  std::size_t best = candidates.front();
  bool have_best = false;
  for (std::size_t i : candidates) {
    const auto w = static_cast<std::int64_t>(servers[i]->weight);
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
