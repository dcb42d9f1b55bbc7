// hash: consistent hashing on a key, weighted rendezvous (highest random
// weight) over a fixed set of slots.
//
// A key falls in one of SlotTable::kSlots slots (XXH3-64 of the key). Every
// (slot, server) pair has a score that depends only on the slot, the
// server's address text (its seed) and its weight (balance/slot_table.hpp),
// so a slot ranks the servers alike in every process, whatever the order of
// the list. A key's first choice is its slot's best server among those that
// are up, read from a table kept current as servers go up and down: a server
// going out moves exactly the keys of its own slots, and coming back it takes
// back exactly those. The table does not change when a server fills up.
//
// When the first choice cannot take the connection (it is full, or this
// session already tried it), or it is over the bounded-load limit, the key
// goes to the best-ranked eligible server of its slot instead. choose() (the
// scan that callers use for retries) ranks the same way: with every server
// up and eligible it answers what choose_indexed() answers.
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
#include "balance/slot_table.hpp"

namespace sluice {

// Seed for a server's scores: XXH3-64 of its address text as configured.
std::uint64_t rendezvous_server_seed(std::string_view address_text);
// The slot of `key`: XXH3-64 of the key, modulo SlotTable::kSlots.
std::uint32_t hash_slot(std::string_view key);
// The server's score for `key`: SlotTable::score() of its rank at the key's
// slot. Higher wins; equal scores go to the lower seed.
double rendezvous_score(std::string_view key, std::uint64_t server_seed, std::uint32_t weight);

// Every index of `candidates` (eligible or not), best first, for `key` (ties:
// lower seed, then lower index, first).
std::vector<std::size_t> rendezvous_rank(std::span<const Candidate> candidates, std::string_view key);

class HashBalancer final : public Balancer {
 public:
  // balance_factor <= 0 turns bounded load off.
  explicit HashBalancer(double balance_factor = 0.0) : balance_factor_(balance_factor) {}

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;
  void reset(std::span<const Candidate> candidates) override;
  void update(std::size_t index, const Candidate& c) override;
  std::size_t choose_indexed(std::string_view key) override;

  // The slot table over the servers up (for tests).
  const SlotTable& table() const { return table_; }

 private:
  struct Ranked {
    std::uint64_t seed;
    std::uint32_t weight;
    std::uint32_t rank;  // at the key's slot
    std::size_t index;
  };
  std::size_t choose_in_slot(std::span<const Candidate> candidates, std::uint32_t slot);
  // May `index` take one more connection under bounded load?
  bool within_bound(std::size_t index) const;

  double balance_factor_;
  std::vector<Ranked> ranked_;  // reused scratch for bounded load
  SlotTable table_;
  std::uint64_t total_active_ = 0;  // over pool_
  std::size_t eligible_ = 0;        // eligible entries of pool_
};

}  // namespace sluice
