// hash: weighted rendezvous hashing (highest random weight).
//
// Every (key, server) pair gets a score that depends only on the key, the
// server's address text (its seed) and its weight, so every sluice process
// with the same server list ranks servers the same way for a key, whatever
// the list's order and without coordination. Removing a server moves only the
// keys it owned; adding one takes only the keys it now wins. A retry (the
// first choice is no longer eligible) falls through to the key's next-ranked
// server.
//
// Optional bounded load (hash_balance_factor f > 0): a candidate is skipped
// when taking this connection would put it above
// ceil(f * (total active + 1) / eligible candidates); the highest-ranked
// candidate that stays within that bound wins, or the highest-ranked one if
// none does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "balance/balancer.hpp"

namespace sluice {

// Seed for a server's scores: XXH3-64 of its address text as configured.
std::uint64_t rendezvous_server_seed(std::string_view address_text);
// The server's score for `key`: weight / -ln(u), u uniform in (0,1) from
// XXH3_64bits_withSeed(key, server_seed). Higher wins.
double rendezvous_score(std::string_view key, std::uint64_t server_seed, std::uint32_t weight);

// Every index of `candidates` (eligible or not), best first, for `key` (ties:
// lower index first).
std::vector<std::size_t> rendezvous_rank(std::span<const Candidate> candidates, std::string_view key);

class HashBalancer final : public Balancer {
 public:
  // balance_factor <= 0 turns bounded load off.
  explicit HashBalancer(double balance_factor = 0.0) : balance_factor_(balance_factor) {}

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;

 private:
  struct Scored {
    double score;
    std::size_t index;
  };
  double balance_factor_;
  std::vector<Scored> scored_;  // reused scratch for bounded load
};

}  // namespace sluice
