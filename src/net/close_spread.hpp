// When each of n sessions closed together should close, so that their
// clients do not all reconnect in the same second ([global] close_spread).
//
// The window is cut into n equal slices and the i-th session closes at a
// random moment within the i-th slice: every part of the window gets its
// share whatever n is (plain random moments would bunch: with 1 000
// sessions over 5 s, some seconds would get a third more than others), the
// moments do not fall on a grid that several workers would share, and none
// is at or after the window's end. Pure: the caller brings the random
// numbers' seed and the clock.
#pragma once

#include <cstdint>

namespace sluice {

class CloseSpread {
 public:
  // `count` sessions over `window_ms` (0: every one at offset 0).
  CloseSpread(std::uint64_t count, std::uint64_t window_ms, std::uint64_t seed)
      : count_(count), window_(window_ms), rng_(seed | 1) {}

  // The offset from the window's start of the next session, in
  // milliseconds: nondecreasing slice by slice, always below the window
  // (0 for a window of 0). Called at most `count` times.
  std::uint64_t next() {
    const std::uint64_t i = taken_++;
    if (window_ == 0 || count_ == 0) return 0;
    // Slice i is [i * window / count, (i + 1) * window / count).
    const std::uint64_t lo = start_of(i);
    const std::uint64_t hi = start_of(i + 1);
    const std::uint64_t width = hi > lo ? hi - lo : 1;
    const std::uint64_t at = lo + random() % width;
    return at < window_ ? at : window_ - 1;
  }

 private:
  // i * window / count without the product: i * (window / count) is at
  // most the window, and i * (window % count) below count², which fits for
  // any count of sessions below 2^32.
  std::uint64_t start_of(std::uint64_t i) const {
    return i * (window_ / count_) + i * (window_ % count_) / count_;
  }

  std::uint64_t random() {  // xorshift64
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  }

  std::uint64_t count_;
  std::uint64_t window_;
  std::uint64_t rng_;
  std::uint64_t taken_ = 0;
};

}  // namespace sluice
