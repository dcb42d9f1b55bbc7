// One small interface for every balancing algorithm (HAProxy's lb_ops). The
// algorithms are pure: they see a span of candidates (weight, active count,
// hash seed, eligibility) in the pool's stable order and return an index. Who
// is eligible (health, drain, max_conns, tiers, servers already tried) is the
// caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>

#include "sluice/config.hpp"

namespace sluice {

struct Candidate {
  std::uint64_t seed = 0;    // rendezvous seed: rendezvous_server_seed(address text)
  std::uint32_t weight = 1;  // > 0; relative share (effective weight, e.g. during slow start)
  std::uint32_t active = 0;  // sessions on this server now
  bool eligible = false;     // may take this connection
};

inline constexpr std::size_t kNoCandidate = std::numeric_limits<std::size_t>::max();

class Balancer {
 public:
  virtual ~Balancer() = default;
  // Returns the index of an eligible candidate, or kNoCandidate when none is
  // eligible. `key` is the hash key (empty if none). `candidates` always has
  // the same length and order for one Balancer (the whole pool), so that
  // implementations may keep per-server state by index. Not thread-safe: the
  // caller serialises calls.
  virtual std::size_t choose(std::span<const Candidate> candidates, std::string_view key) = 0;
};

// `seed` seeds the random balancer (ignored by the others).
std::unique_ptr<Balancer> make_balancer(Balance balance, double hash_balance_factor, std::uint64_t seed);

}  // namespace sluice
