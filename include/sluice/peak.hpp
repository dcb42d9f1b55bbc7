// Keeps a high-water mark beside a counter that many threads move.
#pragma once

#include <atomic>

namespace sluice {

// Raises `peak` to `value` when `value` is higher. The common case (no new
// peak) is one relaxed load; a compare-exchange runs only to set a new peak,
// retried while another thread raised it meanwhile to something lower.
template <typename T>
void raise_peak(std::atomic<T>& peak, T value) {
  T seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace sluice
