#include "balance/slot_table.hpp"

#include <algorithm>
#include <array>
#include <cmath>

namespace sluice {

namespace {

constexpr unsigned kHalf = SlotTable::kBits / 2;
constexpr std::uint32_t kHalfMask = (1U << kHalf) - 1;
static_assert(SlotTable::kBits % 2 == 0, "the permutation splits a slot number into two equal halves");

// One key per round of the permutation, so that the rounds differ.
constexpr std::array<std::uint64_t, 4> kRoundKeys = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL,
                                                     0x165667B19E3779F9ULL, 0xD6E8FEB86659FD93ULL};

// splitmix64's finaliser.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The round function of the Feistel network: half a slot number in, half
// out, keyed by the server's seed and the round.
std::uint32_t round_of(std::uint64_t seed, unsigned round, std::uint32_t half) {
  return static_cast<std::uint32_t>(mix(seed ^ (kRoundKeys[round] + half)) >> (64 - kHalf));
}

// -ln((rank + 0.5) / kSlots) for every rank, computed once per process:
// strictly decreasing in the rank, so for one weight a higher rank is a
// strictly higher score.
const double* neg_logs() {
  static const std::vector<double> table = [] {
    std::vector<double> t(SlotTable::kSlots);
    for (std::uint32_t r = 0; r < SlotTable::kSlots; ++r) {
      t[r] = -std::log((static_cast<double>(r) + 0.5) / static_cast<double>(SlotTable::kSlots));
    }
    return t;
  }();
  return table.data();
}

}  // namespace

// A four-round Feistel network over the slot number's two halves: a
// permutation of [0, kSlots) for each seed, cheap both ways.
std::uint32_t SlotTable::rank_at(std::uint64_t seed, std::uint32_t slot) {
  std::uint32_t l = slot >> kHalf;
  std::uint32_t r = slot & kHalfMask;
  for (unsigned k = 0; k < kRoundKeys.size(); ++k) {
    const std::uint32_t t = l ^ round_of(seed, k, r);
    l = r;
    r = t;
  }
  return (l << kHalf) | r;
}

std::uint32_t SlotTable::slot_at(std::uint64_t seed, std::uint32_t rank) {
  std::uint32_t l = rank >> kHalf;
  std::uint32_t r = rank & kHalfMask;
  for (unsigned k = kRoundKeys.size(); k-- > 0;) {
    const std::uint32_t t = r ^ round_of(seed, k, l);
    r = l;
    l = t;
  }
  return (l << kHalf) | r;
}

double SlotTable::score(std::uint32_t rank, std::uint32_t weight) {
  return static_cast<double>(weight) / neg_logs()[rank];
}

bool SlotTable::beats(std::uint64_t seed_a, std::uint32_t weight_a, std::uint32_t rank_a, std::size_t index_a,
                      std::uint64_t seed_b, std::uint32_t weight_b, std::uint32_t rank_b, std::size_t index_b) {
  if (weight_a == weight_b) {
    // The same order as the scores' (see neg_logs), without the division.
    if (rank_a != rank_b) return rank_a > rank_b;
  } else {
    const double a = score(rank_a, weight_a);
    const double b = score(rank_b, weight_b);
    if (a != b) return a > b;
  }
  if (seed_a != seed_b) return seed_a < seed_b;
  return index_a < index_b;
}

bool SlotTable::beats_owner(std::size_t index, std::uint32_t rank, std::uint32_t slot) const {
  const std::uint32_t o = owner_[slot];
  if (o == kNone) return true;
  const Server& a = servers_[index];
  const Server& b = servers_[o];
  return beats(a.seed, a.weight, rank, index, b.seed, b.weight, rank_[slot], o);
}

void SlotTable::assign(std::vector<Server> servers) {
  servers_ = std::move(servers);
  for (Server& s : servers_) s.weight = std::max<std::uint32_t>(s.weight, 1);
  owner_.assign(kSlots, kNone);
  rank_.assign(kSlots, 0);
  std::vector<std::uint32_t> all(kSlots);
  for (std::uint32_t s = 0; s < kSlots; ++s) all[s] = s;
  fill(all);
}

void SlotTable::set(std::size_t index, Server s) {
  s.weight = std::max<std::uint32_t>(s.weight, 1);
  Server& old = servers_[index];
  if (!old.up && !s.up) {
    old = s;
    return;
  }
  if (old.up && s.up && old.seed == s.seed) {
    if (s.weight == old.weight) return;
    if (s.weight > old.weight) {
      // Every score of this server rose: it keeps its slots and may win more.
      old = s;
      take_wins(index);
    } else {
      // Every score fell: only its own slots may go to another.
      const std::vector<std::uint32_t> freed = vacate(index);
      old = s;
      fill(freed);
    }
    return;
  }
  if (old.up) {
    old.up = false;
    fill(vacate(index));
  }
  old = s;
  if (s.up) take_wins(index);
}

void SlotTable::take_wins(std::size_t index) {
  const std::uint64_t seed = servers_[index].seed;
  for (std::uint32_t slot = 0; slot < kSlots; ++slot) {
    const std::uint32_t rank = rank_at(seed, slot);
    if (beats_owner(index, rank, slot)) {
      owner_[slot] = static_cast<std::uint32_t>(index);
      rank_[slot] = static_cast<std::uint16_t>(rank);
    }
  }
}

std::vector<std::uint32_t> SlotTable::vacate(std::size_t index) {
  std::vector<std::uint32_t> freed;
  for (std::uint32_t slot = 0; slot < kSlots; ++slot) {
    if (owner_[slot] == index) {
      owner_[slot] = kNone;
      freed.push_back(slot);
    }
  }
  return freed;
}

void SlotTable::fill(const std::vector<std::uint32_t>& slots) {
  if (slots.empty()) return;
  std::vector<std::uint32_t> up;
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i].up) up.push_back(static_cast<std::uint32_t>(i));
  }
  if (up.empty()) return;
  // Asking every server about every slot costs slots * servers ranks;
  // walking down from the top costs about kSlots * ln(slots), whatever the
  // number of servers, but more per rank.
  if (static_cast<std::uint64_t>(slots.size()) * up.size() <= 2ULL * kSlots) {
    fill_each(slots, up);
  } else {
    fill_from_the_top(slots, up);
  }
}

void SlotTable::fill_each(const std::vector<std::uint32_t>& slots, const std::vector<std::uint32_t>& up) {
  for (const std::uint32_t slot : slots) {
    std::uint32_t best = kNone;
    std::uint32_t best_rank = 0;
    for (const std::uint32_t i : up) {
      const Server& s = servers_[i];
      const std::uint32_t rank = rank_at(s.seed, slot);
      if (best == kNone) {
        best = i;
        best_rank = rank;
        continue;
      }
      const Server& b = servers_[best];
      if (beats(s.seed, s.weight, rank, i, b.seed, b.weight, best_rank, best)) {
        best = i;
        best_rank = rank;
      }
    }
    owner_[slot] = best;
    rank_[slot] = static_cast<std::uint16_t>(best_rank);
  }
}

// The servers' ranks are visited in falling score order: all servers of one
// weight together, rank by rank from kSlots - 1 down, and the weights merged
// by the score of their next rank. The first server to reach a slot is its
// best one (one of the same score may still take it on the tie-break). The
// last slots take the longest to reach (a coupon collector's tail), so once
// no more are left than asking every server about them costs about kSlots
// ranks, and no score equal to the last one is left, the walk stops and
// those slots are asked of every server.
void SlotTable::fill_from_the_top(const std::vector<std::uint32_t>& slots, const std::vector<std::uint32_t>& up) {
  struct Group {
    std::uint32_t weight;
    std::uint32_t next;  // the rank its servers visit next
    double score;        // score(next, weight)
    std::vector<std::uint32_t> members;
  };
  std::vector<std::uint32_t> by_weight = up;
  std::stable_sort(by_weight.begin(), by_weight.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return servers_[a].weight < servers_[b].weight; });
  std::vector<Group> groups;
  for (const std::uint32_t i : by_weight) {
    const std::uint32_t w = servers_[i].weight;
    if (groups.empty() || groups.back().weight != w) groups.push_back(Group{w, kSlots - 1, score(kSlots - 1, w), {}});
    groups.back().members.push_back(i);
  }
  std::vector<std::uint8_t> open(kSlots, 0);
  for (const std::uint32_t slot : slots) open[slot] = 1;
  std::size_t left = slots.size();
  const std::size_t tail = kSlots / up.size();

  std::vector<std::size_t> heap(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) heap[g] = g;
  const auto lower = [&](std::size_t a, std::size_t b) { return groups[a].score < groups[b].score; };
  std::make_heap(heap.begin(), heap.end(), lower);
  // Slots taken at the score being visited: settled (closed) once the walk
  // goes below it, until then open to a tie.
  std::vector<std::uint32_t> taken;
  double last = HUGE_VAL;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower);
    Group& g = groups[heap.back()];
    if (g.score < last) {
      if (left <= tail) break;
      for (const std::uint32_t slot : taken) open[slot] = 0;
      taken.clear();
    }
    last = g.score;
    const std::uint32_t rank = g.next;
    for (const std::uint32_t i : g.members) {
      const std::uint32_t slot = slot_at(servers_[i].seed, rank);
      if (open[slot] == 0) continue;
      if (owner_[slot] == kNone) {
        --left;
        taken.push_back(slot);
      } else if (!beats_owner(i, rank, slot)) {
        continue;
      }
      owner_[slot] = i;
      rank_[slot] = static_cast<std::uint16_t>(rank);
    }
    if (rank == 0) {
      heap.pop_back();
    } else {
      g.next = rank - 1;
      g.score = score(g.next, g.weight);
      std::push_heap(heap.begin(), heap.end(), lower);
    }
  }
  if (left == 0) return;
  std::vector<std::uint32_t> rest;
  for (const std::uint32_t slot : slots) {
    if (owner_[slot] == kNone) rest.push_back(slot);
  }
  fill_each(rest, up);
}

}  // namespace sluice
