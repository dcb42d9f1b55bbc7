#include "balance/random.hpp"

#include <bit>

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

std::size_t RandomBalancer::lighter(std::span<const Candidate> candidates, std::size_t first, std::size_t second) {
  const std::uint64_t a1 = candidates[first].active;
  const std::uint64_t a2 = candidates[second].active;
  const std::uint64_t w1 = candidates[first].weight;
  const std::uint64_t w2 = candidates[second].weight;
  return a2 * w1 < a1 * w2 ? second : first;
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
  return lighter(candidates, first, second);
}

void RandomBalancer::reset(std::span<const Candidate> candidates) {
  Balancer::reset(candidates);
  tree_.assign(pool_.size() + 1, 0);
  total_ = 0;
  eligible_count_ = 0;
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    add(i, static_cast<std::int64_t>(weight_in_tree(pool_[i])));
    if (pool_[i].eligible) ++eligible_count_;
  }
}

void RandomBalancer::update(std::size_t index, const Candidate& c) {
  Candidate& old = pool_[index];
  const std::uint64_t before = weight_in_tree(old);
  const std::uint64_t after = weight_in_tree(c);
  if (before != after) add(index, static_cast<std::int64_t>(after) - static_cast<std::int64_t>(before));
  eligible_count_ = eligible_count_ - (old.eligible ? 1 : 0) + (c.eligible ? 1 : 0);
  old = c;
}

void RandomBalancer::add(std::size_t index, std::int64_t delta) {
  total_ += static_cast<std::uint64_t>(delta);  // two's complement: a negative delta subtracts
  for (std::size_t i = index + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] += static_cast<std::uint64_t>(delta);
}

std::size_t RandomBalancer::find(std::uint64_t r) const {
  std::size_t pos = 0;
  for (std::size_t step = std::bit_floor(tree_.size() - 1); step > 0; step >>= 1) {
    if (pos + step < tree_.size() && tree_[pos + step] <= r) {
      pos += step;
      r -= tree_[pos];
    }
  }
  return pos;  // 1-based position pos + 1, that is index pos
}

std::size_t RandomBalancer::choose_indexed(std::string_view /*key*/) {
  if (eligible_count_ == 0) return kNoCandidate;
  if (eligible_count_ == 1) return find(0);
  // The same draws as choose(): the scan's walk over the eligible candidates
  // in index order stops where the running total passes r, as find() does.
  const std::size_t first = find(next() % total_);
  const auto w = static_cast<std::int64_t>(pool_[first].weight);
  add(first, -w);
  const std::size_t second = find(next() % total_);
  add(first, w);
  return lighter(pool_, first, second);
}

}  // namespace sluice
