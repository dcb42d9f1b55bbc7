// hash: consistent hashing on a key, in two parts.
//
// First choice: a Maglev lookup table (balance/maglev.hpp) over the servers
// that are up, weighted, built from the servers' address texts: one table
// read per pick, the same in every sluice process with the same server list
// whatever the list's order. The table is rebuilt only when a server goes up
// or down or its weight changes, not when it fills up.
//
// Everything else: weighted rendezvous hashing (highest random weight). Every
// (key, server) pair gets a score that depends only on the key, the server's
// address text (its seed) and its weight, so the ranking too is the same in
// every process. When the first choice cannot take the connection (it is
// full, or this session already tried it), or it is over the bounded-load
// limit, the key goes to its best-ranked eligible server instead. choose()
// (the scan that callers use for retries) is rendezvous hashing alone.
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
#include "balance/maglev.hpp"

namespace sluice {

// Seed for a server's scores: XXH3-64 of its address text as configured.
std::uint64_t rendezvous_server_seed(std::string_view address_text);
// The server's score for `key`: weight / -ln(u), u uniform in (0,1) from
// XXH3_64bits_withSeed(key, server_seed). Higher wins.
double rendezvous_score(std::string_view key, std::uint64_t server_seed, std::uint32_t weight);
// Where `key` falls in a Maglev table: XXH3-64 of the key.
std::uint64_t maglev_key_hash(std::string_view key);

// Every index of `candidates` (eligible or not), best first, for `key` (ties:
// lower index first).
std::vector<std::size_t> rendezvous_rank(std::span<const Candidate> candidates, std::string_view key);

class HashBalancer final : public Balancer {
 public:
  // balance_factor <= 0 turns bounded load off.
  explicit HashBalancer(double balance_factor = 0.0) : balance_factor_(balance_factor) {}

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;
  void reset(std::span<const Candidate> candidates) override;
  void update(std::size_t index, const Candidate& c) override;
  std::size_t choose_indexed(std::string_view key) override;

  // The Maglev table as of the last choose_indexed() or reset() (for tests).
  const MaglevTable& table() const { return table_; }

 private:
  struct Scored {
    double score;
    std::size_t index;
  };
  void rebuild();
  // May `index` take one more connection under bounded load?
  bool within_bound(std::size_t index) const;

  double balance_factor_;
  std::vector<Scored> scored_;  // reused scratch for bounded load
  MaglevTable table_;
  bool table_stale_ = false;
  std::uint64_t total_active_ = 0;  // over pool_
  std::size_t eligible_ = 0;        // eligible entries of pool_
};

}  // namespace sluice
