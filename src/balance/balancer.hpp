// One small interface for every balancing algorithm (HAProxy's lb_ops). The
// algorithms are pure: they see candidates (weight, active count, hash seed,
// eligibility) by their index in the pool's stable order and return an index.
// Who is eligible (health, drain, max_conns, tiers, servers already tried) is
// the caller's business.
//
// Two ways to ask, over the same per-server state (so they can be mixed):
//   - choose(): a scan over a span of every candidate, built for this pick;
//   - choose_indexed(): over the balancer's own copy of the candidates, kept
//     current by reset() and update(); an algorithm keeps whatever index lets
//     it answer without looking at every candidate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/config.hpp"

namespace sluice {

struct Candidate {
  std::uint64_t seed = 0;    // rendezvous seed: rendezvous_server_seed(address text)
  std::uint32_t weight = 1;  // > 0; relative share (effective weight, e.g. during slow start)
  std::uint32_t active = 0;  // sessions on this server now
  bool eligible = false;     // may take this connection
  // Health and admin state let the server take connections: it is eligible
  // unless it is full (max_conns) or excluded for this pick. Consistent hash
  // tables are built over the servers that are up, so that a server filling
  // up does not move keys. Only choose_indexed() looks at it.
  bool up = false;
};

// The weight a balancer counts: a weight of 0 (never configured, but a
// table must not divide by it) counts as 1.
inline std::uint32_t weight_of(const Candidate& c) { return c.weight == 0 ? 1 : c.weight; }

inline constexpr std::size_t kNoCandidate = std::numeric_limits<std::size_t>::max();

class Balancer {
 public:
  virtual ~Balancer() = default;
  // Returns the index of an eligible candidate, or kNoCandidate when none is
  // eligible. `key` is the hash key (empty if none). `candidates` always has
  // the same length and order for one Balancer (the whole pool), so that
  // implementations may keep per-server state by index. Not thread-safe: the
  // caller serialises calls to all methods.
  virtual std::size_t choose(std::span<const Candidate> candidates, std::string_view key) = 0;

  // Replaces the balancer's copy of the whole pool.
  virtual void reset(std::span<const Candidate> candidates) { pool_.assign(candidates.begin(), candidates.end()); }
  // One candidate changed (index < the size given to reset()).
  virtual void update(std::size_t index, const Candidate& c) { pool_[index] = c; }
  // choose() over the copy. The default scans it; algorithms override this
  // with an index of their own.
  virtual std::size_t choose_indexed(std::string_view key) { return choose(pool_, key); }

 protected:
  std::vector<Candidate> pool_;  // the copy kept by reset() and update()
};

// `seed` seeds the random balancer (ignored by the others).
std::unique_ptr<Balancer> make_balancer(Balance balance, double hash_balance_factor, std::uint64_t seed);

}  // namespace sluice
