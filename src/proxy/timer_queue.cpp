#include "proxy/timer_queue.hpp"

#include <utility>

namespace sluice {

TimerQueue::TimerQueue(uv_loop_t* loop, Callback cb) : loop_(loop), cb_(cb) {
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
}

TimerQueue::~TimerQueue() {
  for (TimerNode* n : heap_) n->slot = TimerNode::kIdle;
}

void TimerQueue::close() {
  if (closed_) return;
  closed_ = true;
  uv_timer_stop(&timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
}

void TimerQueue::arm(TimerNode& n, std::uint64_t due_ms) {
  if (n.queued()) {
    const std::uint64_t old = n.due;
    n.due = due_ms;
    if (due_ms < old) {
      sift_up(n.slot);
    } else {
      sift_down(n.slot);
    }
  } else {
    n.due = due_ms;
    heap_.push_back(&n);
    n.slot = static_cast<std::uint32_t>(heap_.size() - 1);
    sift_up(n.slot);
  }
  reschedule();
}

void TimerQueue::cancel(TimerNode& n) {
  if (!n.queued()) return;
  remove_at(n.slot);
  reschedule();
}

void TimerQueue::remove_at(std::uint32_t i) {
  TimerNode* gone = heap_[i];
  gone->slot = TimerNode::kIdle;
  TimerNode* last = heap_.back();
  heap_.pop_back();
  if (i == heap_.size()) return;
  place(i, last);
  sift_up(i);
  sift_down(last->slot);
}

void TimerQueue::place(std::uint32_t i, TimerNode* n) {
  heap_[i] = n;
  n->slot = i;
}

void TimerQueue::sift_up(std::uint32_t i) {
  TimerNode* n = heap_[i];
  while (i > 0) {
    const std::uint32_t parent = (i - 1) / 2;
    if (heap_[parent]->due <= n->due) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, n);
}

void TimerQueue::sift_down(std::uint32_t i) {
  TimerNode* n = heap_[i];
  const auto size = static_cast<std::uint32_t>(heap_.size());
  for (;;) {
    std::uint32_t child = 2 * i + 1;
    if (child >= size) break;
    if (child + 1 < size && heap_[child + 1]->due < heap_[child]->due) ++child;
    if (n->due <= heap_[child]->due) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, n);
}

// Keeps the uv timer set for the heap's top. Most changes leave the top
// alone, and then the handle is not touched.
void TimerQueue::reschedule() {
  if (closed_) return;
  const std::uint64_t due = next_due();
  if (due == armed_for_) return;
  armed_for_ = due;
  if (due == 0) {
    uv_timer_stop(&timer_);
    return;
  }
  const std::uint64_t now = uv_now(loop_);
  uv_timer_start(&timer_, on_timer, due > now ? due - now : 0, 0);
}

void TimerQueue::on_timer(uv_timer_t* t) { static_cast<TimerQueue*>(t->data)->run(); }

void TimerQueue::run() {
  armed_for_ = 0;
  const std::uint64_t now = uv_now(loop_);
  // Only nodes due now at entry fire in this pass; whatever a callback arms
  // for "now" is due by the next pass (its due time is compared with the
  // same `now`, so it does fire then).
  std::size_t budget = heap_.size();
  while (!heap_.empty() && heap_.front()->due <= now && budget-- > 0) {
    TimerNode* n = heap_.front();
    remove_at(0);
    cb_(n->owner);
  }
  if (!heap_.empty() && heap_.front()->due <= now) {
    // Re-armed for "now" more often than there were nodes: come back in a
    // millisecond (libuv would run a 0 ms timer started here in this same
    // timer phase).
    armed_for_ = heap_.front()->due;
    uv_timer_start(&timer_, on_timer, 1, 0);
    return;
  }
  reschedule();
}

}  // namespace sluice
