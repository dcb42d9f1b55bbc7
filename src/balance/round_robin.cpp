#include "balance/round_robin.hpp"

#include "balance/swrr.hpp"

namespace sluice {

std::size_t RoundRobinBalancer::choose(std::span<ServerState* const> servers,
                                       std::span<const std::size_t> candidates,
                                       std::string_view /*key*/) {
  return swrr_choose(current_, servers, candidates);
}

}  // namespace sluice
