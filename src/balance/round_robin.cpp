#include "balance/round_robin.hpp"

#include "balance/swrr.hpp"

namespace sluice {

std::size_t RoundRobinBalancer::choose(std::span<const Candidate> candidates, std::string_view /*key*/) {
  eligible_.clear();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].eligible) eligible_.push_back(i);
  }
  if (eligible_.empty()) return kNoCandidate;
  return swrr_choose(current_, candidates, eligible_);
}

}  // namespace sluice
