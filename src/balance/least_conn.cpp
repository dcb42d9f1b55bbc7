#include "balance/least_conn.hpp"

#include "balance/swrr.hpp"

namespace sluice {

std::size_t LeastConnBalancer::choose(std::span<const Candidate> candidates, std::string_view /*key*/) {
  // Compare active/weight without division: a/wa < b/wb  <=>  a*wb < b*wa.
  tied_.clear();
  std::uint64_t best_active = 0;
  std::uint64_t best_weight = 1;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.eligible) continue;
    const std::uint64_t a = c.active;
    const std::uint64_t w = c.weight;
    if (tied_.empty() || a * best_weight < best_active * w) {
      tied_.clear();
      tied_.push_back(i);
      best_active = a;
      best_weight = w;
    } else if (a * best_weight == best_active * w) {
      tied_.push_back(i);
    }
  }
  if (tied_.empty()) return kNoCandidate;
  if (tied_.size() == 1) return tied_.front();
  return swrr_choose(current_, candidates, tied_);
}

}  // namespace sluice
