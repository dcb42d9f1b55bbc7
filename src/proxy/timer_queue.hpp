// One timer per worker for all its sessions' deadlines.
//
// A session has several deadlines (connect, preread, idle, fin, lifetime,
// interim log, drain) but only ever waits for the earliest, so it needs one
// slot in a queue, not a timer handle of its own: a uv_timer_t is 152 bytes,
// a TimerNode 24. The queue is a binary min-heap of nodes ordered by due time
// (milliseconds of the loop's clock) behind a single uv_timer_t that is armed
// for the heap's top. Arming, moving and cancelling a node cost O(log n), as
// libuv's own timer heap would.
//
// A node fires once per arm. Nodes due when the timer runs are fired in due
// order, at most as many per pass as were queued when it began; so a
// callback that keeps re-arming a node for "now" cannot keep the loop in the
// timer phase (the rest waits a millisecond).
#pragma once

#include <uv.h>

#include <cstdint>
#include <vector>

#include "sluice/tracked_heap.hpp"

namespace sluice {

struct TimerNode {
  static constexpr std::uint32_t kIdle = 0xffffffff;
  std::uint64_t due = 0;        // meaningful while queued
  void* owner = nullptr;        // handed back to the callback
  std::uint32_t slot = kIdle;   // index in the heap, kIdle when not queued
  bool queued() const { return slot != kIdle; }
};

class TimerQueue {
 public:
  using Callback = void (*)(void* owner);

  TimerQueue(uv_loop_t* loop, Callback cb);
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Queues the node for `due_ms` (the loop's clock), or moves it there.
  void arm(TimerNode& n, std::uint64_t due_ms);
  // Takes the node out of the queue; a no-op when it is not queued.
  void cancel(TimerNode& n);
  // Closes the timer handle; the loop can then end. Nodes must be cancelled.
  void close();

  std::size_t size() const { return heap_.size(); }
  // The earliest due time, 0 when empty.
  std::uint64_t next_due() const { return heap_.empty() ? 0 : heap_.front()->due; }

 private:
  static void on_timer(uv_timer_t* t);
  void run();
  void reschedule();
  void remove_at(std::uint32_t i);
  static bool earlier(const TimerNode* a, const TimerNode* b) { return a->due < b->due; }
  void place(std::size_t i, TimerNode* n) {
    heap_[i] = n;
    n->slot = static_cast<std::uint32_t>(i);
  }
  auto placer() {
    return [this](std::size_t i, TimerNode* n) { place(i, n); };
  }

  uv_loop_t* loop_;
  Callback cb_;
  uv_timer_t timer_{};
  bool closed_ = false;
  std::uint64_t armed_for_ = 0;  // due time the uv timer is set for; 0 = stopped
  std::vector<TimerNode*> heap_;
};

}  // namespace sluice
