// Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer", NSDI 2016), weighted the way Envoy's
// maglev load balancer does it: a lookup table of prime size M in which each
// server owns a share of the entries proportional to its weight. A key goes
// to table[hash(key) % M]: one read, whatever the number of servers.
//
// Each server walks its own permutation of the table's positions
// (offset + j * skip mod M, both derived from its seed) and takes the first
// free one on its turn. Turns go round the servers in the order of their
// seeds, a server of weight w taking a turn in w of every max-weight rounds.
// The table therefore depends only on the set of (seed, weight) pairs, not on
// the order they are listed in: processes with the same servers build the
// same table. Removing a server hands its entries to the others and moves a
// few more (tests/unit/balance/test_maglev.cpp measures how many).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice {

class MaglevTable {
 public:
  struct Server {
    std::uint64_t seed;    // from the address text
    std::uint32_t weight;  // > 0
    std::size_t index;     // what lookup() returns for this server's entries
  };

  // The table size for a pool of `servers`: the smallest prime that is at
  // least 100 entries per server and at least 65537 (the paper's advice: with
  // M >= 100 N a removal moves few keys beyond the removed server's own).
  static std::size_t size_for(std::size_t servers);

  // Fills a table of `size` entries (a prime, > 1) over `servers`, in any
  // order. With no servers the table is empty.
  void build(std::vector<Server> servers, std::size_t size);

  // The index owning `key_hash`, or kNoCandidate when the table is empty.
  std::size_t lookup(std::uint64_t key_hash) const;

  std::size_t size() const { return entries_.size(); }
  // Entry `position` (for tests): the index that owns it.
  std::size_t at(std::size_t position) const { return entries_[position]; }

 private:
  std::vector<std::uint32_t> entries_;
};

}  // namespace sluice
