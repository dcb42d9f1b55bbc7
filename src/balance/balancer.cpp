#include "balance/balancer.hpp"

#include <random>

#include "balance/hash.hpp"
#include "balance/least_conn.hpp"
#include "balance/random.hpp"
#include "balance/round_robin.hpp"

namespace sluice {

std::unique_ptr<Balancer> make_balancer(const UpstreamConfig& config) {
  switch (config.balance) {
    case Balance::least_conn:
      return std::make_unique<LeastConnBalancer>();
    case Balance::round_robin:
      return std::make_unique<RoundRobinBalancer>();
    case Balance::hash:
      return std::make_unique<HashBalancer>(config.hash_balance_factor);
    case Balance::random: {
      std::random_device rd;
      const std::uint64_t seed = (std::uint64_t{rd()} << 32) ^ rd();
      return std::make_unique<RandomBalancer>(seed);
    }
  }
  return std::make_unique<LeastConnBalancer>();
}

}  // namespace sluice
