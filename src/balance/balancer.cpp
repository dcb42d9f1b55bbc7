#include "balance/balancer.hpp"

#include "balance/hash.hpp"
#include "balance/least_conn.hpp"
#include "balance/random.hpp"
#include "balance/round_robin.hpp"

namespace sluice {

std::unique_ptr<Balancer> make_balancer(Balance balance, double hash_balance_factor, std::uint64_t seed) {
  switch (balance) {
    case Balance::least_conn:
      return std::make_unique<LeastConnBalancer>();
    case Balance::round_robin:
      return std::make_unique<RoundRobinBalancer>();
    case Balance::hash:
      return std::make_unique<HashBalancer>(hash_balance_factor);
    case Balance::random:
      return std::make_unique<RandomBalancer>(seed);
  }
  return std::make_unique<LeastConnBalancer>();
}

}  // namespace sluice
