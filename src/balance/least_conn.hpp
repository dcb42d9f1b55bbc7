// least_conn (the default): the eligible candidate with the smallest
// active/weight; among equally loaded candidates, smooth weighted round-robin,
// so idle servers still share new connections by weight.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

class LeastConnBalancer final : public Balancer {
 public:
  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;

 private:
  std::vector<std::int64_t> current_;  // SWRR state, one per pool index
  std::vector<std::size_t> tied_;      // reused scratch
};

}  // namespace sluice
