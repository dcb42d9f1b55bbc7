#include "upstream/wait_queue.hpp"

#include <algorithm>

#include "upstream/upstream.hpp"

namespace sluice {

namespace {

double seconds_between(TimePoint from, TimePoint to) {
  return to > from ? std::chrono::duration<double>(to - from).count() : 0.0;
}

}  // namespace

WaitQueue::Outcome WaitQueue::enter(const std::shared_ptr<QueueTicket>& ticket, TimePoint now, long& index) {
  QueueTicket& t = *ticket;
  std::lock_guard lock(mu_);
  // Waiters first: a slot freed a moment ago is theirs, not the newcomer's.
  serve_locked(now);
  // Then the newcomer's own pick: it fails whenever the head's did, unless
  // the head's tried servers are the only ones with room.
  bool full = false;
  index = t.upstream->pick(*t.tried, t.key, now, t.panic, &full);
  if (index >= 0) return Outcome::picked;
  if (!full) return Outcome::none;
  if (waiting_.size() >= t.upstream->config().queue) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return Outcome::full;
  }
  t.since_ = now;
  t.index_ = -1;
  t.waiting_ = true;
  waiting_.push_back(ticket);
  length_.store(waiting_.size(), std::memory_order_relaxed);
  queued_total_.fetch_add(1, std::memory_order_relaxed);
  return Outcome::waiting;
}

long WaitQueue::leave(QueueTicket& t, TimePoint now, bool timed_out) {
  std::lock_guard lock(mu_);
  if (t.waiting_) {
    const auto it = std::find_if(waiting_.begin(), waiting_.end(), [&t](const auto& p) { return p.get() == &t; });
    if (it != waiting_.end()) waiting_.erase(it);
    length_.store(waiting_.size(), std::memory_order_relaxed);
    t.waiting_ = false;
    ended_locked(t, now);
    if (timed_out) timeouts_.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  // Granted, and the news is on its way to the waiter's thread: the server
  // picked for it is the caller's to release.
  const long index = t.index_;
  t.index_ = -1;
  return index;
}

void WaitQueue::set_current(std::weak_ptr<Upstream> pool) {
  std::lock_guard lock(mu_);
  current_ = std::move(pool);
}

void WaitQueue::serve(TimePoint now) {
  std::lock_guard lock(mu_);
  serve_locked(now);
}

void WaitQueue::serve_locked(TimePoint now) {
  // Strictly in order: when the oldest waiter cannot have a server, nobody
  // behind it gets one either (a later waiter could only differ by the
  // servers it already tried).
  while (!waiting_.empty()) {
    QueueTicket& head = *waiting_.front();
    long index = head.upstream->pick(*head.tried, head.key, now, head.panic);
    std::shared_ptr<Upstream> pool;
    if (index < 0) {
      pool = current_.lock();
      if (!pool || pool.get() == head.upstream) return;
      index = pool->pick(TriedSet{}, head.key, now, head.panic);
      if (index < 0) return;
    }
    std::shared_ptr<QueueTicket> t = std::move(waiting_.front());
    t->pool = std::move(pool);
    waiting_.pop_front();
    length_.store(waiting_.size(), std::memory_order_relaxed);
    t->waiting_ = false;
    t->index_ = index;
    ended_locked(*t, now);
    t->granted(t);
  }
}

void WaitQueue::ended_locked(QueueTicket& t, TimePoint now) { wait_seconds_.observe(seconds_between(t.since_, now)); }

double WaitQueue::oldest_wait(TimePoint now) const {
  std::lock_guard lock(mu_);
  return waiting_.empty() ? 0.0 : seconds_between(waiting_.front()->since_, now);
}

}  // namespace sluice
