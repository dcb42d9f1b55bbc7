// random: power of two random choices. Two distinct candidates are drawn with
// probability proportional to weight; the one with the smaller active/weight
// wins (the first drawn on a tie).
#pragma once

#include <cstdint>

#include "balance/balancer.hpp"

namespace sluice {

class RandomBalancer final : public Balancer {
 public:
  explicit RandomBalancer(std::uint64_t seed);

  std::size_t choose(std::span<ServerState* const> servers,
                     std::span<const std::size_t> candidates, std::string_view key) override;

 private:
  std::uint64_t next();  // xorshift64*
  // Index into `candidates`, drawn by weight, skipping position `skip`
  // (candidates.size() to skip none).
  std::size_t draw(std::span<ServerState* const> servers,
                   std::span<const std::size_t> candidates, std::size_t skip);

  std::uint64_t state_;
};

}  // namespace sluice
