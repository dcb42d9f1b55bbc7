#include "balance/hash.hpp"

#include <algorithm>
#include <cmath>

#include <xxhash.h>

namespace sluice {

std::uint64_t rendezvous_server_seed(std::string_view address_text) {
  return XXH3_64bits(address_text.data(), address_text.size());
}

std::uint32_t hash_slot(std::string_view key) {
  return static_cast<std::uint32_t>(XXH3_64bits(key.data(), key.size()) % SlotTable::kSlots);
}

double rendezvous_score(std::string_view key, std::uint64_t server_seed, std::uint32_t weight) {
  return SlotTable::score(SlotTable::rank_at(server_seed, hash_slot(key)), std::max<std::uint32_t>(weight, 1));
}

std::vector<std::size_t> rendezvous_rank(std::span<const Candidate> candidates, std::string_view key) {
  const std::uint32_t slot = hash_slot(key);
  std::vector<std::uint32_t> ranks(candidates.size());
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    ranks[i] = SlotTable::rank_at(candidates[i].seed, slot);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return SlotTable::beats(candidates[a].seed, weight_of(candidates[a]), ranks[a], a, candidates[b].seed,
                            weight_of(candidates[b]), ranks[b], b);
  });
  return order;
}

std::size_t HashBalancer::choose(std::span<const Candidate> candidates, std::string_view key) {
  return choose_in_slot(candidates, hash_slot(key));
}

std::size_t HashBalancer::choose_in_slot(std::span<const Candidate> candidates, std::uint32_t slot) {
  const auto before = [](const Ranked& a, const Ranked& b) {
    return SlotTable::beats(a.seed, a.weight, a.rank, a.index, b.seed, b.weight, b.rank, b.index);
  };
  if (balance_factor_ <= 0.0) {
    Ranked best{0, 0, 0, kNoCandidate};
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      if (!c.eligible) continue;
      const Ranked r{c.seed, weight_of(c), SlotTable::rank_at(c.seed, slot), i};
      if (best.index == kNoCandidate || before(r, best)) best = r;
    }
    return best.index;
  }

  std::uint64_t total_active = 0;
  ranked_.clear();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    total_active += c.active;
    if (c.eligible) ranked_.push_back({c.seed, weight_of(c), SlotTable::rank_at(c.seed, slot), i});
  }
  if (ranked_.empty()) return kNoCandidate;
  if (ranked_.size() == 1) return ranked_.front().index;
  const double bound =
      std::ceil(balance_factor_ * static_cast<double>(total_active + 1) / static_cast<double>(ranked_.size()));
  std::sort(ranked_.begin(), ranked_.end(), before);
  for (const Ranked& r : ranked_) {
    if (static_cast<double>(candidates[r.index].active) + 1.0 <= bound) return r.index;
  }
  return ranked_.front().index;
}

void HashBalancer::reset(std::span<const Candidate> candidates) {
  Balancer::reset(candidates);
  total_active_ = 0;
  eligible_ = 0;
  std::vector<SlotTable::Server> servers;
  servers.reserve(pool_.size());
  for (const Candidate& c : pool_) {
    total_active_ += c.active;
    if (c.eligible) ++eligible_;
    servers.push_back({c.seed, weight_of(c), c.up});
  }
  table_.assign(std::move(servers));
}

void HashBalancer::update(std::size_t index, const Candidate& c) {
  Candidate& old = pool_[index];
  total_active_ = total_active_ - old.active + c.active;
  eligible_ = eligible_ - (old.eligible ? 1 : 0) + (c.eligible ? 1 : 0);
  // Filling up or emptying does not change the table; going up or down, or
  // a new weight, changes the slots this server wins or won, and no others.
  if (old.up != c.up || old.weight != c.weight || old.seed != c.seed) table_.set(index, {c.seed, weight_of(c), c.up});
  old = c;
}

bool HashBalancer::within_bound(std::size_t index) const {
  if (balance_factor_ <= 0.0) return true;
  const double bound =
      std::ceil(balance_factor_ * static_cast<double>(total_active_ + 1) / static_cast<double>(eligible_));
  return static_cast<double>(pool_[index].active) + 1.0 <= bound;
}

std::size_t HashBalancer::choose_indexed(std::string_view key) {
  const std::uint32_t slot = hash_slot(key);
  const std::uint32_t first = table_.owner(slot);
  if (first != SlotTable::kNone && pool_[first].eligible && within_bound(first)) return first;
  return choose_in_slot(pool_, slot);
}

}  // namespace sluice
