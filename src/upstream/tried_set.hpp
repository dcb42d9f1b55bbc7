// The servers one session has already tried, so that a retry never goes back
// to them. Sessions make few attempts, so a handful of indices live inline;
// only an unusually high `tries` spills to the heap.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace sluice {

class TriedSet {
 public:
  bool contains(std::size_t index) const {
    const auto v = static_cast<std::uint32_t>(index);
    for (std::size_t i = 0; i < inline_count_; ++i) {
      if (inline_[i] == v) return true;
    }
    if (overflow_) {
      for (std::uint32_t x : *overflow_) {
        if (x == v) return true;
      }
    }
    return false;
  }
  bool empty() const { return inline_count_ == 0; }
  void add(std::size_t index) {
    const auto v = static_cast<std::uint32_t>(index);
    if (inline_count_ < inline_.size()) {
      inline_[inline_count_++] = v;
      return;
    }
    if (!overflow_) overflow_ = std::make_unique<std::vector<std::uint32_t>>();
    overflow_->push_back(v);
  }
  void clear() {
    inline_count_ = 0;
    overflow_.reset();
  }

 private:
  std::array<std::uint32_t, 6> inline_{};
  std::uint32_t inline_count_ = 0;
  std::unique_ptr<std::vector<std::uint32_t>> overflow_;
};

}  // namespace sluice
