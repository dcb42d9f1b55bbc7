#include "proxy/fork_guard.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>

namespace sluice::fork_guard {

namespace {

// One flag per closing thread, each on its own cache line: a close touches
// only its own thread's line.
struct alignas(64) Slot {
  std::atomic<bool> closing{false};
};

constexpr std::size_t kSlots = 256;
Slot g_slots[kSlots];
std::atomic<std::size_t> g_used{0};
std::atomic<bool> g_forking{false};
thread_local Slot* t_slot = nullptr;
thread_local bool t_no_slot = false;

Slot* slot() {
  if (t_slot == nullptr && !t_no_slot) {
    const std::size_t i = g_used.fetch_add(1, std::memory_order_seq_cst);
    if (i < kSlots) {
      t_slot = &g_slots[i];
    } else {
      t_no_slot = true;
    }
  }
  return t_slot;
}

}  // namespace

bool begin_close() {
  Slot* s = slot();
  if (s == nullptr) return true;  // more threads than slots: always the safe way
  s->closing.store(true, std::memory_order_seq_cst);
  return g_forking.load(std::memory_order_seq_cst);
}

void end_close() {
  if (t_slot != nullptr) t_slot->closing.store(false, std::memory_order_release);
}

void begin_fork() {
  g_forking.store(true, std::memory_order_seq_cst);
  const std::size_t n = std::min(g_used.load(std::memory_order_seq_cst), kSlots);
  for (std::size_t i = 0; i < n; ++i) {
    // A close takes microseconds; a thread that is not closing is passed at once.
    while (g_slots[i].closing.load(std::memory_order_seq_cst)) std::this_thread::yield();
  }
}

void end_fork() { g_forking.store(false, std::memory_order_seq_cst); }

}  // namespace sluice::fork_guard
