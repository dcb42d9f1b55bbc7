#include "balance/maglev.hpp"

#include <algorithm>
#include <limits>

#include "balance/balancer.hpp"

namespace sluice {

namespace {

constexpr std::uint32_t kEmpty = std::numeric_limits<std::uint32_t>::max();

bool is_prime(std::size_t n) {
  if (n < 2) return false;
  for (std::size_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

// splitmix64's finaliser: a second, independent hash of the seed for the skip.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::size_t MaglevTable::size_for(std::size_t servers) {
  std::size_t n = std::max<std::size_t>(65537, servers * 100);
  while (!is_prime(n)) ++n;
  return n;
}

void MaglevTable::build(std::vector<Server> servers, std::size_t size) {
  entries_.clear();
  if (servers.empty()) return;
  std::sort(servers.begin(), servers.end(),
            [](const Server& a, const Server& b) { return a.seed != b.seed ? a.seed < b.seed : a.index < b.index; });
  struct Walk {
    std::uint64_t target = 0;  // a turn is due in the first round r with r * weight >= target
    std::size_t position;
    std::size_t skip;
  };
  std::vector<Walk> walks;
  walks.reserve(servers.size());
  std::uint64_t max_weight = 1;
  for (const Server& s : servers) {
    walks.push_back(Walk{0, s.seed % size, mix(s.seed) % (size - 1) + 1});
    max_weight = std::max<std::uint64_t>(max_weight, s.weight);
  }
  // Rounds go over the servers in seed order; a server of the largest
  // weight takes a turn every round, one of a third of it every third round.
  // Servers wait in the bucket of the round their next turn is due (never
  // more than max_weight rounds ahead), so a round visits only those due.
  std::vector<std::vector<std::size_t>> due(max_weight + 1);
  for (std::size_t i = 0; i < servers.size(); ++i) due[1 % due.size()].push_back(i);
  entries_.assign(size, kEmpty);
  std::size_t filled = 0;
  std::vector<std::size_t> now;
  for (std::uint64_t round = 1; filled < size; ++round) {
    now.swap(due[round % due.size()]);
    // Servers arrive from several earlier rounds: take them in seed order.
    if (!std::is_sorted(now.begin(), now.end())) std::sort(now.begin(), now.end());
    for (std::size_t k = 0; k < now.size() && filled < size; ++k) {
      const std::size_t i = now[k];
      Walk& w = walks[i];
      while (entries_[w.position] != kEmpty) {
        w.position += w.skip;
        if (w.position >= size) w.position -= size;
      }
      entries_[w.position] = static_cast<std::uint32_t>(servers[i].index);
      ++filled;
      w.target += max_weight;
      const std::uint64_t weight = servers[i].weight;
      const std::uint64_t next = std::max(round + 1, (w.target + weight - 1) / weight);
      due[next % due.size()].push_back(i);
    }
    now.clear();
  }
}

std::size_t MaglevTable::lookup(std::uint64_t key_hash) const {
  if (entries_.empty()) return kNoCandidate;
  return entries_[key_hash % entries_.size()];
}

}  // namespace sluice
