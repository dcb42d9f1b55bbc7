// least_conn (the default): the eligible candidate with the smallest
// active/weight. Among equally loaded candidates, a weighted fair rotation
// (start-time fair queueing), so idle servers still share new connections by
// weight: each candidate carries a tag, the lowest tag wins a tie (then the
// lowest index), and winning a tie adds 1/weight to the winner's tag. A pick
// without a tie leaves the tags alone. A candidate whose load drops, or that
// becomes eligible again, starts from no lower than the tag of the last tie
// winner, so time spent busy or out of the pool earns no burst of picks later.
//
// choose_indexed() keeps the eligible candidates in a binary heap ordered by
// (active/weight, tag, index): a pick reads the top and its two children
// (O(1)); update() moves one candidate (O(log n)). choose() scans a span with
// the same rule and the same tags, so the two may be mixed.
#pragma once

#include <cstdint>
#include <vector>

#include "balance/balancer.hpp"
#include "sluice/tracked_heap.hpp"

namespace sluice {

class LeastConnBalancer final : public Balancer {
 public:
  // Tags are rebased (every tag lowered by the virtual time, never below 0)
  // when the virtual time reaches `rebase_at`: with the default that takes
  // billions of tied picks. Tests pass a small value.
  static constexpr std::uint64_t kRebaseAt = std::uint64_t{1} << 62;
  explicit LeastConnBalancer(std::uint64_t rebase_at = kRebaseAt) : rebase_at_(rebase_at) {}

  std::size_t choose(std::span<const Candidate> candidates, std::string_view key) override;
  void reset(std::span<const Candidate> candidates) override;
  void update(std::size_t index, const Candidate& c) override;
  std::size_t choose_indexed(std::string_view key) override;

 private:
  struct Slot {
    std::uint64_t tag;     // copy of tag_[index]
    std::uint32_t active;
    std::uint32_t weight;  // >= 1
    std::uint32_t index;
  };
  static bool lighter(const Slot& a, const Slot& b) {
    return std::uint64_t{a.active} * b.weight < std::uint64_t{b.active} * a.weight;
  }
  static bool before(const Slot& a, const Slot& b);

  void grow(std::size_t n);
  // `index` won a pick; `tie` says whether another eligible candidate was as
  // lightly loaded.
  void picked(std::size_t index, bool tie, std::uint64_t weight);
  void rebase();
  void put(std::size_t pos, const Slot& s);
  auto placer() {
    return [this](std::size_t pos, const Slot& s) { put(pos, s); };
  }
  void sift_up(std::size_t pos) { heap_sift_up(heap_, pos, before, placer()); }
  void sift_down(std::size_t pos) { heap_sift_down(heap_, pos, before, placer()); }
  // Restores the order around `pos` after its slot changed.
  void fix(std::size_t pos) { heap_fix(heap_, pos, before, placer()); }
  void remove(std::size_t index);
  void heapify() { heap_make(heap_, before, placer()); }

  std::uint64_t rebase_at_;
  std::uint64_t vtime_ = 0;         // tag of the last tie winner when it won
  std::vector<std::uint64_t> tag_;  // one per pool index
  std::vector<Slot> heap_;          // the eligible candidates
  std::vector<std::size_t> pos_;    // pool index -> position in heap_, or kAbsent
};

}  // namespace sluice
