#include "balance/least_conn.hpp"

#include <atomic>

#include "balance/swrr.hpp"

namespace sluice {

std::size_t LeastConnBalancer::choose(std::span<ServerState* const> servers,
                                      std::span<const std::size_t> candidates,
                                      std::string_view /*key*/) {
  // Compare active/weight without division: a/wa < b/wb  <=>  a*wb < b*wa.
  // Actives are read once each, so the comparison sees one consistent value.
  tied_.clear();
  std::uint64_t best_active = 0;
  std::uint64_t best_weight = 1;
  for (std::size_t i : candidates) {
    const std::uint64_t a = servers[i]->active.load(std::memory_order_relaxed);
    const std::uint64_t w = servers[i]->weight;
    if (tied_.empty() || a * best_weight < best_active * w) {
      tied_.clear();
      tied_.push_back(i);
      best_active = a;
      best_weight = w;
    } else if (a * best_weight == best_active * w) {
      tied_.push_back(i);
    }
  }
  if (tied_.size() == 1) return tied_.front();
  return swrr_choose(current_, servers, tied_);
}

}  // namespace sluice
