// random: power of two random choices. Two distinct eligible candidates are
// drawn with probability proportional to weight; the one with the smaller
// active/weight wins (the first drawn on a tie).
//
// choose_indexed() keeps the eligible weights in a Fenwick tree: a draw is a
// descent (O(log n)) that lands where the scan's walk over the eligible
// candidates would, so both ways make the same choices from the same state.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

class RandomBalancer final : public Balancer {
 public:
  explicit RandomBalancer(std::uint64_t seed);

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;
  void reset(std::span<const Candidate> candidates) override;
  void update(std::size_t index, const Candidate& c) override;
  std::size_t choose_indexed(std::string_view key) override;

 private:
  std::uint64_t next();  // xorshift64*
  // Position in eligible_, drawn by weight, skipping position `skip`
  // (eligible_.size() to skip none).
  std::size_t draw(std::span<const Candidate> candidates, std::size_t skip);
  // The less loaded of two drawn candidates (the first on a tie).
  static std::size_t lighter(std::span<const Candidate> candidates, std::size_t first, std::size_t second);

  // Fenwick tree over each candidate's weight when eligible, 0 when not.
  void add(std::size_t index, std::int64_t delta);
  // The first index whose running total of weights passes `r` (< total).
  std::size_t find(std::uint64_t r) const;
  static std::uint64_t weight_in_tree(const Candidate& c) { return c.eligible ? c.weight : 0; }

  std::uint64_t state_;
  std::vector<std::size_t> eligible_;  // reused scratch
  std::vector<std::uint64_t> tree_;    // 1-based
  std::uint64_t total_ = 0;            // of the weights in the tree
  std::size_t eligible_count_ = 0;
};

}  // namespace sluice
