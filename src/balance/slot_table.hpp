// hash's first choice: a table of kSlots slots, each owned by the weighted
// rendezvous (highest random weight) winner among the servers that are up.
// A key goes to slot hash(key) % kSlots: one read per pick, whatever the
// number of servers.
//
// Every (slot, server) pair has a score that depends only on the slot, the
// server's seed (from its address text) and its weight: the server's rank at
// the slot, a permutation of [0, kSlots) keyed by the seed, turned into
//   weight / -ln((rank + 0.5) / kSlots)
// (weighted rendezvous: with u uniform in (0,1), weight / -ln(u) wins with a
// probability proportional to the weight). Equal scores go to the lower seed,
// then the lower index. A slot's owner is therefore a function of the set of
// (seed, weight) pairs up, not of the list's order or of the history that led
// there: every process with the same servers up has the same table, and a
// change of one server moves only the slots that server wins or won.
//
// kSlots is the same for every pool size: were it to grow with the pool,
// adding or removing a server would move keys between the others.
//
// Costs (tools/bench_balance and docs/decisions.md give the figures):
//   - a server up (or a weight raised): one rank per slot, O(kSlots);
//   - a server out (or a weight lowered): its own slots are filled again from
//     the others, O(kSlots) for a server with an average share;
//   - a full build: the servers' ranks are visited from the top down (the
//     permutation is invertible), so a slot is settled as soon as the first
//     server reaches it, and the last few are asked of every server: about
//     kSlots * (ln(servers) + 1) ranks instead of kSlots * servers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace sluice {

class SlotTable {
 public:
  static constexpr unsigned kBits = 16;
  static constexpr std::uint32_t kSlots = 1U << kBits;
  static constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

  // What the table knows of a server.
  struct Server {
    std::uint64_t seed = 0;
    std::uint32_t weight = 1;  // > 0
    bool up = false;           // owns slots
  };

  // The server's rank at `slot` (< kSlots), and its inverse: the slot where
  // the server has `rank`.
  static std::uint32_t rank_at(std::uint64_t seed, std::uint32_t slot);
  static std::uint32_t slot_at(std::uint64_t seed, std::uint32_t rank);
  // weight / -ln((rank + 0.5) / kSlots). Higher wins.
  static double score(std::uint32_t rank, std::uint32_t weight);
  // Does (seed_a, weight_a) at rank_a rank before (seed_b, weight_b) at
  // rank_b? Indices break the tie between servers with the same seed.
  static bool beats(std::uint64_t seed_a, std::uint32_t weight_a, std::uint32_t rank_a, std::size_t index_a,
                    std::uint64_t seed_b, std::uint32_t weight_b, std::uint32_t rank_b, std::size_t index_b);

  // Replaces every server and builds the table afresh.
  void assign(std::vector<Server> servers);
  // Server `index` (< the size given to assign()) is now `s`.
  void set(std::size_t index, Server s);

  // The index owning `slot`, or kNone when no server is up.
  std::uint32_t owner(std::uint32_t slot) const { return owner_.empty() ? kNone : owner_[slot]; }
  const Server& server(std::size_t index) const { return servers_[index]; }
  std::size_t size() const { return servers_.size(); }

 private:
  bool beats_owner(std::size_t index, std::uint32_t rank, std::uint32_t slot) const;
  // Takes every slot that server `index` (up) beats the owner of.
  void take_wins(std::size_t index);
  // Gives up server `index`'s slots; returns them, without an owner.
  std::vector<std::uint32_t> vacate(std::size_t index);
  // Gives each of `slots` (without an owner) to its best server up.
  void fill(const std::vector<std::uint32_t>& slots);
  void fill_each(const std::vector<std::uint32_t>& slots, const std::vector<std::uint32_t>& up);
  void fill_from_the_top(const std::vector<std::uint32_t>& slots, const std::vector<std::uint32_t>& up);

  std::vector<Server> servers_;
  std::vector<std::uint32_t> owner_;  // kSlots entries once assigned
  std::vector<std::uint16_t> rank_;   // the owner's rank at each slot
  static_assert(kSlots - 1 <= std::numeric_limits<std::uint16_t>::max());
};

}  // namespace sluice
