#include "proxy/timer_queue.hpp"

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
  n.due = due_ms;
  if (!n.queued()) {
    heap_.push_back(&n);
    n.slot = static_cast<std::uint32_t>(heap_.size() - 1);
  }
  heap_fix(heap_, n.slot, earlier, placer());
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
  heap_fix(heap_, i, earlier, placer());
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
  // At most as many nodes fire in one pass as were queued at its start: a
  // node that a callback re-arms for "now" may fire again in this pass, but
  // a callback that keeps doing so cannot hold the loop here.
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
