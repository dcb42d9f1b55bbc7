// round_robin: nginx's smooth weighted round-robin over the eligible servers.
// Weights 2:1 give a, b, a, a, b, a, ... (spread out, not a, a, b).
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

class RoundRobinBalancer final : public Balancer {
 public:
  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;

 private:
  std::vector<std::int64_t> current_;  // one per pool index
  std::vector<std::size_t> eligible_;  // reused scratch
};

}  // namespace sluice
