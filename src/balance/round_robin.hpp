// round_robin: nginx's smooth weighted round-robin over the eligible servers.
// Weights 2:1 give a, b, a, a, b, a, ... (spread out, not a, a, b).
//
// choose_indexed() gives the same sequence without touching every server.
// Each pick adds every eligible server's weight to its current value, so
// servers of equal weight keep their order between picks except for the
// winner: they sit in one max-heap per weight, their values stored less
// `rounds * weight` (rounds = picks so far). A pick compares the tops of
// the heaps (one per distinct weight: usually a handful) and moves the
// winner down its heap: O(weights + log n). choose() runs the classic scan
// on the same values.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "balance/balancer.hpp"
#include "sluice/tracked_heap.hpp"

namespace sluice {

class RoundRobinBalancer final : public Balancer {
 public:
  // Stored values are rebased (rounds folded in) when rounds reach
  // `rebase_at`; tests pass a small value.
  static constexpr std::int64_t kRebaseAt = std::int64_t{1} << 31;
  explicit RoundRobinBalancer(std::int64_t rebase_at = kRebaseAt) : rebase_at_(rebase_at) {}

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;
  void reset(std::span<const Candidate> candidates) override;
  void update(std::size_t index, const Candidate& c) override;
  std::size_t choose_indexed(std::string_view key) override;

 private:
  struct Group {
    std::uint32_t weight = 0;
    std::vector<std::size_t> heap;  // pool indices, the largest value first (then the lowest index)
    std::size_t live_pos = 0;       // position in live_
  };

  // Adds `rounds_ * weight` to every indexed value and zeroes rounds_.
  void fold();
  void join(std::size_t index, std::uint32_t weight);
  void leave(std::size_t index);
  bool above(std::size_t a, std::size_t b) const {
    return current_[a] > current_[b] || (current_[a] == current_[b] && a < b);
  }
  void place(Group& g, std::size_t pos, std::size_t index);
  auto above_fn() const {
    return [this](std::size_t a, std::size_t b) { return above(a, b); };
  }
  auto placer(Group& g) {
    return [this, &g](std::size_t pos, std::size_t index) { place(g, pos, index); };
  }
  void sift_up(Group& g, std::size_t pos) { heap_sift_up(g.heap, pos, above_fn(), placer(g)); }
  void sift_down(Group& g, std::size_t pos) { heap_sift_down(g.heap, pos, above_fn(), placer(g)); }

  std::int64_t rebase_at_;
  // One per pool index: the smooth round-robin's current value; for an
  // indexed server, less rounds_ times its indexed weight.
  std::vector<std::int64_t> current_;
  std::vector<std::uint32_t> indexed_weight_;  // 0: not indexed
  std::vector<std::size_t> group_of_;
  std::vector<std::size_t> heap_pos_;
  std::vector<Group> groups_;
  std::vector<std::size_t> free_groups_;
  std::unordered_map<std::uint32_t, std::size_t> group_by_weight_;
  std::vector<std::size_t> live_;  // groups with members
  std::int64_t rounds_ = 0;
  std::int64_t total_ = 0;             // weights of the indexed servers
  std::vector<std::size_t> eligible_;  // reused scratch
};

}  // namespace sluice
