// random: power of two random choices. Two distinct eligible candidates are
// drawn with probability proportional to weight; the one with the smaller
// active/weight wins (the first drawn on a tie).
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

class RandomBalancer final : public Balancer {
 public:
  explicit RandomBalancer(std::uint64_t seed);

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;

 private:
  std::uint64_t next();  // xorshift64*
  // Position in eligible_, drawn by weight, skipping position `skip`
  // (eligible_.size() to skip none).
  std::size_t draw(std::span<const Candidate> candidates, std::size_t skip);

  std::uint64_t state_;
  std::vector<std::size_t> eligible_;  // reused scratch
};

}  // namespace sluice
