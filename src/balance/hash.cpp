#include "balance/hash.hpp"

#include <algorithm>
#include <cmath>

#include <xxhash.h>

namespace sluice {

std::uint64_t rendezvous_server_seed(std::string_view address_text) {
  return XXH3_64bits(address_text.data(), address_text.size());
}

std::uint64_t maglev_key_hash(std::string_view key) { return XXH3_64bits(key.data(), key.size()); }

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

double score_of(const Candidate& c, std::string_view key) { return rendezvous_score(key, c.seed, c.weight); }

}  // namespace

std::vector<std::size_t> rendezvous_rank(std::span<const Candidate> candidates, std::string_view key) {
  std::vector<double> scores(candidates.size());
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    scores[i] = score_of(candidates[i], key);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return ranks_before(scores[a], a, scores[b], b); });
  return order;
}

std::size_t HashBalancer::choose(std::span<const Candidate> candidates, std::string_view key) {
  if (balance_factor_ <= 0.0) {
    std::size_t best = kNoCandidate;
    double best_score = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (!candidates[i].eligible) continue;
      const double s = score_of(candidates[i], key);
      if (best == kNoCandidate || ranks_before(s, i, best_score, best)) {
        best = i;
        best_score = s;
      }
    }
    return best;
  }

  std::uint64_t total_active = 0;
  scored_.clear();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    total_active += candidates[i].active;
    if (candidates[i].eligible) scored_.push_back({score_of(candidates[i], key), i});
  }
  if (scored_.empty()) return kNoCandidate;
  if (scored_.size() == 1) return scored_.front().index;
  const double bound =
      std::ceil(balance_factor_ * static_cast<double>(total_active + 1) / static_cast<double>(scored_.size()));
  std::sort(scored_.begin(), scored_.end(),
            [](const Scored& a, const Scored& b) { return ranks_before(a.score, a.index, b.score, b.index); });
  for (const Scored& c : scored_) {
    if (static_cast<double>(candidates[c.index].active) + 1.0 <= bound) return c.index;
  }
  return scored_.front().index;
}

void HashBalancer::reset(std::span<const Candidate> candidates) {
  Balancer::reset(candidates);
  total_active_ = 0;
  eligible_ = 0;
  for (const Candidate& c : pool_) {
    total_active_ += c.active;
    if (c.eligible) ++eligible_;
  }
  rebuild();
}

void HashBalancer::update(std::size_t index, const Candidate& c) {
  Candidate& old = pool_[index];
  total_active_ = total_active_ - old.active + c.active;
  eligible_ = eligible_ - (old.eligible ? 1 : 0) + (c.eligible ? 1 : 0);
  // Filling up or emptying does not change the table; going up or down does.
  if (old.up != c.up || (c.up && (old.weight != c.weight || old.seed != c.seed))) table_stale_ = true;
  old = c;
}

void HashBalancer::rebuild() {
  std::vector<MaglevTable::Server> up;
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    if (pool_[i].up) up.push_back({pool_[i].seed, pool_[i].weight == 0 ? 1 : pool_[i].weight, i});
  }
  table_.build(std::move(up), MaglevTable::size_for(pool_.size()));
  table_stale_ = false;
}

bool HashBalancer::within_bound(std::size_t index) const {
  if (balance_factor_ <= 0.0) return true;
  const double bound =
      std::ceil(balance_factor_ * static_cast<double>(total_active_ + 1) / static_cast<double>(eligible_));
  return static_cast<double>(pool_[index].active) + 1.0 <= bound;
}

std::size_t HashBalancer::choose_indexed(std::string_view key) {
  if (table_stale_) rebuild();
  const std::size_t first = table_.lookup(maglev_key_hash(key));
  if (first != kNoCandidate && pool_[first].eligible && within_bound(first)) return first;
  return choose(pool_, key);
}

}  // namespace sluice
