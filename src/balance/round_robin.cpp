#include "balance/round_robin.hpp"

#include "balance/swrr.hpp"

namespace sluice {

std::size_t RoundRobinBalancer::choose(std::span<const Candidate> candidates, std::string_view /*key*/) {
  eligible_.clear();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].eligible) eligible_.push_back(i);
  }
  if (eligible_.empty()) return kNoCandidate;
  fold();
  const std::size_t chosen = swrr_choose(current_, candidates, eligible_);
  // The scan moved values under the heaps: put them back in order.
  for (const std::size_t g : live_) heap_make(groups_[g].heap, above_fn(), placer(groups_[g]));
  return chosen;
}

void RoundRobinBalancer::reset(std::span<const Candidate> candidates) {
  Balancer::reset(candidates);
  fold();
  current_.resize(pool_.size(), 0);
  indexed_weight_.assign(pool_.size(), 0);
  group_of_.assign(pool_.size(), 0);
  heap_pos_.assign(pool_.size(), 0);
  groups_.clear();
  free_groups_.clear();
  group_by_weight_.clear();
  live_.clear();
  total_ = 0;
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    if (pool_[i].eligible) join(i, pool_[i].weight);
  }
}

void RoundRobinBalancer::update(std::size_t index, const Candidate& c) {
  pool_[index] = c;
  const std::uint32_t weight = c.eligible ? c.weight : 0;
  if (weight == indexed_weight_[index]) return;
  if (indexed_weight_[index] != 0) leave(index);
  if (weight != 0) join(index, weight);
}

std::size_t RoundRobinBalancer::choose_indexed(std::string_view /*key*/) {
  if (live_.empty()) return kNoCandidate;
  ++rounds_;  // every indexed server gains its weight
  std::size_t best = kNoCandidate;
  std::int64_t best_value = 0;
  for (const std::size_t g : live_) {
    const std::size_t i = groups_[g].heap.front();
    const std::int64_t value = current_[i] + rounds_ * groups_[g].weight;
    if (best == kNoCandidate || value > best_value || (value == best_value && i < best)) {
      best = i;
      best_value = value;
    }
  }
  current_[best] -= total_;
  sift_down(groups_[group_of_[best]], heap_pos_[best]);
  if (rounds_ >= rebase_at_) fold();
  return best;
}

void RoundRobinBalancer::fold() {
  if (rounds_ == 0) return;
  for (std::size_t i = 0; i < current_.size(); ++i) current_[i] += rounds_ * indexed_weight_[i];
  rounds_ = 0;  // the same shift within a group: the heaps stay in order
}

void RoundRobinBalancer::join(std::size_t index, std::uint32_t weight) {
  current_[index] -= rounds_ * weight;
  indexed_weight_[index] = weight;
  total_ += weight;
  auto [it, added] = group_by_weight_.try_emplace(weight, 0);
  if (added) {
    if (free_groups_.empty()) {
      it->second = groups_.size();
      groups_.emplace_back();
    } else {
      it->second = free_groups_.back();
      free_groups_.pop_back();
    }
    Group& g = groups_[it->second];
    g.weight = weight;
    g.live_pos = live_.size();
    live_.push_back(it->second);
  }
  Group& g = groups_[it->second];
  group_of_[index] = it->second;
  g.heap.push_back(index);
  heap_pos_[index] = g.heap.size() - 1;
  sift_up(g, g.heap.size() - 1);
}

void RoundRobinBalancer::leave(std::size_t index) {
  const std::uint32_t weight = indexed_weight_[index];
  current_[index] += rounds_ * weight;
  indexed_weight_[index] = 0;
  total_ -= weight;
  const std::size_t id = group_of_[index];
  Group& g = groups_[id];
  const std::size_t pos = heap_pos_[index];
  const std::size_t last = g.heap.back();
  g.heap.pop_back();
  if (pos < g.heap.size()) {
    place(g, pos, last);
    heap_fix(g.heap, pos, above_fn(), placer(g));
  }
  if (!g.heap.empty()) return;
  // The last of its weight: the group goes.
  live_[g.live_pos] = live_.back();
  groups_[live_.back()].live_pos = g.live_pos;
  live_.pop_back();
  group_by_weight_.erase(weight);
  free_groups_.push_back(id);
}

void RoundRobinBalancer::place(Group& g, std::size_t pos, std::size_t index) {
  g.heap[pos] = index;
  heap_pos_[index] = pos;
}

}  // namespace sluice
