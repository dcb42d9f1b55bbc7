#include "balance/random.hpp"

namespace sluice {

RandomBalancer::RandomBalancer(std::uint64_t seed) {
  // splitmix64 spreads small or similar seeds; xorshift needs a non-zero state.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  state_ = z != 0 ? z : 0x9E3779B97F4A7C15ULL;
}

std::uint64_t RandomBalancer::next() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return state_ * 0x2545F4914F6CDD1DULL;
}

std::size_t RandomBalancer::draw(std::span<const Candidate> candidates, std::size_t skip) {
  std::uint64_t total = 0;
  for (std::size_t p = 0; p < eligible_.size(); ++p) {
    if (p != skip) total += candidates[eligible_[p]].weight;
  }
  if (total == 0) return skip == 0 ? 1 : 0;  // all weights zero: any will do
  std::uint64_t r = next() % total;
  for (std::size_t p = 0; p < eligible_.size(); ++p) {
    if (p == skip) continue;
    const std::uint64_t w = candidates[eligible_[p]].weight;
    if (r < w) return p;
    r -= w;
  }
  return skip == 0 ? 1 : 0;  // not reached
}

std::size_t RandomBalancer::choose(std::span<const Candidate> candidates, std::string_view /*key*/) {
  eligible_.clear();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].eligible) eligible_.push_back(i);
  }
  if (eligible_.empty()) return kNoCandidate;
  if (eligible_.size() == 1) return eligible_.front();
  const std::size_t first_pos = draw(candidates, eligible_.size());
  const std::size_t first = eligible_[first_pos];
  const std::size_t second = eligible_[draw(candidates, first_pos)];
  const std::uint64_t a1 = candidates[first].active;
  const std::uint64_t a2 = candidates[second].active;
  const std::uint64_t w1 = candidates[first].weight;
  const std::uint64_t w2 = candidates[second].weight;
  return a2 * w1 < a1 * w2 ? second : first;
}

}  // namespace sluice
