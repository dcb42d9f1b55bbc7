#include "balance/random.hpp"

#include <atomic>

#include "upstream/server_state.hpp"

namespace sluice {

RandomBalancer::RandomBalancer(std::uint64_t seed) {
  // splitmix64 spreads small or similar seeds; xorshift needs a non-zero state.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  state_ = z != 0 ? z : 0x9E3779B97F4A7C15ULL;
}

std::uint64_t RandomBalancer::next() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return state_ * 0x2545F4914F6CDD1DULL;
}

std::size_t RandomBalancer::draw(std::span<ServerState* const> servers,
                                 std::span<const std::size_t> candidates, std::size_t skip) {
  std::uint64_t total = 0;
  for (std::size_t p = 0; p < candidates.size(); ++p) {
    if (p != skip) total += servers[candidates[p]]->weight;
  }
  if (total == 0) return skip == 0 ? 1 : 0;  // all weights zero: any will do
  std::uint64_t r = next() % total;
  for (std::size_t p = 0; p < candidates.size(); ++p) {
    if (p == skip) continue;
    const std::uint64_t w = servers[candidates[p]]->weight;
    if (r < w) return p;
    r -= w;
  }
  return skip == 0 ? 1 : 0;  // not reached
}

std::size_t RandomBalancer::choose(std::span<ServerState* const> servers,
                                   std::span<const std::size_t> candidates,
                                   std::string_view /*key*/) {
  if (candidates.size() == 1) return candidates.front();
  const std::size_t first_pos = draw(servers, candidates, candidates.size());
  const std::size_t first = candidates[first_pos];
  const std::size_t second = candidates[draw(servers, candidates, first_pos)];
  const std::uint64_t a1 = servers[first]->active.load(std::memory_order_relaxed);
  const std::uint64_t a2 = servers[second]->active.load(std::memory_order_relaxed);
  const std::uint64_t w1 = servers[first]->weight;
  const std::uint64_t w2 = servers[second]->weight;
  return a2 * w1 < a1 * w2 ? second : first;
}

}  // namespace sluice
