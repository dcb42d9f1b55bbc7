// A Prometheus-style histogram of durations kept in relaxed atomics: one
// fetch_add for the bucket and one for the sum per observation, so writers
// on any thread never lock. The count is the sum of the buckets (read at
// scrape time), which keeps the +Inf bucket and _count equal by construction.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace sluice {

template <std::size_t N>
class Histogram {
 public:
  // `bounds`: the buckets' upper bounds in seconds, increasing; it must
  // outlive the histogram (a constant).
  explicit constexpr Histogram(const std::array<double, N>& bounds) : bounds_(bounds) {}

  void observe(double seconds) {
    std::size_t i = 0;
    while (i < N && seconds > bounds_[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(seconds > 0 ? static_cast<std::uint64_t>(seconds * 1e6) : 0, std::memory_order_relaxed);
  }

  std::span<const double> bounds() const { return bounds_; }
  // Observations in bucket `i` alone (not cumulative); i == N is above the last bound.
  std::uint64_t bucket(std::size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
  double sum_seconds() const { return static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6; }
  std::uint64_t count() const {
    std::uint64_t n = 0;
    for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
    return n;
  }

 private:
  const std::array<double, N>& bounds_;
  std::array<std::atomic<std::uint64_t>, N + 1> counts_{};
  std::atomic<std::uint64_t> sum_us_{0};
};

}  // namespace sluice
