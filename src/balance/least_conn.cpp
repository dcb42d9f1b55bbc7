#include "balance/least_conn.hpp"

#include <algorithm>

namespace sluice {

namespace {

// A tie won by a candidate of weight w adds kTagScale / w to its tag. Weights
// reach 100 000 (1 000, in hundredths); the scale keeps the rounding of the
// smallest step under 0.1 %.
constexpr std::uint64_t kTagScale = 1024 * 100000;
constexpr std::size_t kAbsent = kNoCandidate;

}  // namespace

bool LeastConnBalancer::before(const Slot& a, const Slot& b) {
  const std::uint64_t l = std::uint64_t{a.active} * b.weight;
  const std::uint64_t r = std::uint64_t{b.active} * a.weight;
  if (l != r) return l < r;
  if (a.tag != b.tag) return a.tag < b.tag;
  return a.index < b.index;
}

void LeastConnBalancer::grow(std::size_t n) {
  if (tag_.size() < n) {
    tag_.resize(n, vtime_);
    pos_.resize(n, kAbsent);
  }
}

std::size_t LeastConnBalancer::choose(std::span<const Candidate> candidates, std::string_view /*key*/) {
  grow(candidates.size());
  // Compare active/weight without division: a/wa < b/wb  <=>  a*wb < b*wa.
  std::size_t best = kNoCandidate;
  std::uint64_t best_active = 0;
  std::uint64_t best_weight = 1;
  std::size_t tied = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.eligible) continue;
    const std::uint64_t a = c.active;
    const std::uint64_t w = weight_of(c);
    if (best == kNoCandidate || a * best_weight < best_active * w) {
      best = i;
      best_active = a;
      best_weight = w;
      tied = 1;
    } else if (a * best_weight == best_active * w) {
      ++tied;
      if (tag_[i] < tag_[best]) {
        best = i;
        best_active = a;
        best_weight = w;
      }
    }
  }
  if (best != kNoCandidate) picked(best, tied > 1, best_weight);
  return best;
}

void LeastConnBalancer::reset(std::span<const Candidate> candidates) {
  grow(candidates.size());
  heap_.clear();
  std::fill(pos_.begin(), pos_.end(), kAbsent);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.eligible) continue;
    tag_[i] = std::max(tag_[i], vtime_);
    pos_[i] = heap_.size();
    heap_.push_back(Slot{tag_[i], c.active, weight_of(c), static_cast<std::uint32_t>(i)});
  }
  heapify();
}

void LeastConnBalancer::update(std::size_t index, const Candidate& c) {
  grow(index + 1);
  const std::size_t pos = pos_[index];
  if (!c.eligible) {
    if (pos != kAbsent) remove(index);
    return;
  }
  Slot s{tag_[index], c.active, weight_of(c), static_cast<std::uint32_t>(index)};
  if (pos == kAbsent || lighter(s, heap_[pos])) {
    // Back in the pool, or less loaded than it was: no credit for the time
    // it was not competing.
    tag_[index] = std::max(tag_[index], vtime_);
    s.tag = tag_[index];
  }
  if (pos == kAbsent) {
    heap_.push_back(s);
    pos_[index] = heap_.size() - 1;
    sift_up(heap_.size() - 1);
    return;
  }
  put(pos, s);
  fix(pos);
}

std::size_t LeastConnBalancer::choose_indexed(std::string_view /*key*/) {
  if (heap_.empty()) return kNoCandidate;
  const Slot& top = heap_[0];
  // The top is no heavier than its children; the next lightest candidate is
  // one of them, so a tie shows there.
  const bool tie = (heap_.size() > 1 && !lighter(top, heap_[1])) || (heap_.size() > 2 && !lighter(top, heap_[2]));
  const std::size_t index = top.index;
  picked(index, tie, top.weight);
  return index;
}

void LeastConnBalancer::picked(std::size_t index, bool tie, std::uint64_t weight) {
  if (!tie) return;
  vtime_ = std::max(vtime_, tag_[index]);
  tag_[index] += kTagScale / weight;
  if (const std::size_t pos = pos_[index]; pos != kAbsent) {
    heap_[pos].tag = tag_[index];
    sift_down(pos);
  }
  if (vtime_ >= rebase_at_) rebase();
}

void LeastConnBalancer::rebase() {
  for (std::uint64_t& t : tag_) t = t > vtime_ ? t - vtime_ : 0;
  vtime_ = 0;
  for (Slot& s : heap_) s.tag = tag_[s.index];
  heapify();
}

void LeastConnBalancer::put(std::size_t pos, const Slot& s) {
  heap_[pos] = s;
  pos_[s.index] = pos;
}

void LeastConnBalancer::remove(std::size_t index) {
  const std::size_t pos = pos_[index];
  pos_[index] = kAbsent;
  const Slot last = heap_.back();
  heap_.pop_back();
  if (pos == heap_.size()) return;
  put(pos, last);
  fix(pos);
}

}  // namespace sluice
