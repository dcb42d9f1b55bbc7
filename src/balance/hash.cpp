#include "balance/hash.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include <xxhash.h>

#include "upstream/server_state.hpp"

namespace sluice {

std::uint64_t rendezvous_server_seed(std::string_view address_text) {
  return XXH3_64bits(address_text.data(), address_text.size());
}

double rendezvous_score(std::string_view key, std::uint64_t server_seed, std::uint32_t weight) {
  const std::uint64_t h = XXH3_64bits_withSeed(key.data(), key.size(), server_seed);
  // The top 53 bits, centred in their bucket: u is strictly inside (0,1), so
  // -ln(u) is finite and positive.
  const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
  return static_cast<double>(weight) / -std::log(u);
}

namespace {

// Better = higher score; equal scores go to the lower index.
bool ranks_before(double score_a, std::size_t index_a, double score_b, std::size_t index_b) {
  return score_a > score_b || (score_a == score_b && index_a < index_b);
}

double score_of(const ServerState& s, std::string_view key) {
  return rendezvous_score(key, rendezvous_server_seed(s.address.text), s.weight);
}

}  // namespace

std::vector<std::size_t> rendezvous_rank(std::span<ServerState* const> servers,
                                         std::string_view key) {
  std::vector<double> scores(servers.size());
  std::vector<std::size_t> order(servers.size());
  for (std::size_t i = 0; i < servers.size(); ++i) {
    scores[i] = score_of(*servers[i], key);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranks_before(scores[a], a, scores[b], b);
  });
  return order;
}

std::size_t HashBalancer::choose(std::span<ServerState* const> servers,
                                 std::span<const std::size_t> candidates,
                                 std::string_view key) {
  if (balance_factor_ <= 0.0 || candidates.size() == 1) {
    std::size_t best = candidates.front();
    double best_score = score_of(*servers[best], key);
    for (std::size_t i : candidates.subspan(1)) {
      const double s = score_of(*servers[i], key);
      if (ranks_before(s, i, best_score, best)) {
        best = i;
        best_score = s;
      }
    }
    return best;
  }

  std::uint64_t total_active = 0;
  for (ServerState* s : servers) total_active += s->active.load(std::memory_order_relaxed);
  const double bound = std::ceil(balance_factor_ * static_cast<double>(total_active + 1) /
                                 static_cast<double>(candidates.size()));

  scored_.clear();
  for (std::size_t i : candidates) scored_.push_back({score_of(*servers[i], key), i});
  std::sort(scored_.begin(), scored_.end(), [](const Scored& a, const Scored& b) {
    return ranks_before(a.score, a.index, b.score, b.index);
  });
  for (const Scored& c : scored_) {
    const auto active = servers[c.index]->active.load(std::memory_order_relaxed);
    if (static_cast<double>(active) + 1.0 <= bound) return c.index;
  }
  return scored_.front().index;
}

}  // namespace sluice
