// The bounded wait queue behind max_conns (`queue`, `queue_timeout` on an
// upstream; HAProxy's maxqueue and timeout queue). When every eligible
// server of an upstream is full, a new client waits here instead of being
// refused, and the first slot that frees goes to the client that has waited
// longest, whichever worker holds it: one queue per upstream name for the
// whole process (the Registry's), shared by the configurations that overlap
// during a reload.
//
// A freed slot is handed over, not announced: the thread that frees it (a
// session's release on any worker, or the control loop's tick) picks a
// server for the head of the queue under the queue's lock, with the same
// Upstream::pick a newcomer uses (least_conn's choice is made at that
// moment, on the counts of that moment), so the server's count already
// holds the waiter's place and no newcomer can take it in between. The
// waiter's own thread hears of it through QueueTicket::granted.
//
// Locks: the queue's lock is taken before an upstream's pick lock, never
// after; a ticket's granted() may take only a leaf lock (a worker's mailbox).
// Nothing here is touched by upstreams without a queue.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "sluice/histogram.hpp"
#include "sluice/time.hpp"
#include "upstream/tried_set.hpp"

namespace sluice {

class Upstream;

// Seconds spent waiting in a queue: a burst absorbed in milliseconds to a
// client that waited out a long queue_timeout.
inline constexpr std::array<double, 12> kQueueBuckets = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25,
                                                         0.5,   1.0,   2.5,  5.0,  10.0, 30.0};

// One waiting client. The waiter fills in what a pick needs before
// enter(); while it waits only the queue reads them (under its lock).
class QueueTicket {
 public:
  virtual ~QueueTicket() = default;

  Upstream* upstream = nullptr;     // the waiter's own configuration's pool
  const TriedSet* tried = nullptr;  // servers this waiter tried already
  std::string key;                  // the hash key (hash balancing only)
  bool panic = true;                // fail_open allowed (see Upstream::pick)

  // Called once a server was picked for this waiter (`index`, its place in
  // upstream's members, counted in the server's `active`), on the thread
  // that freed the slot and under the queue's lock: it must only pass the
  // news to the waiter's own thread. `self` keeps the ticket alive for that.
  virtual void granted(const std::shared_ptr<QueueTicket>& self) = 0;

  // Set with the grant when the server was picked in the newest
  // configuration's pool rather than the waiter's own (whose servers were
  // all fenced or replaced meanwhile); `index` is then that pool's. Keeps
  // its configuration alive while the session uses it.
  std::shared_ptr<Upstream> pool;

 private:
  friend class WaitQueue;
  TimePoint since_{};  // when it started waiting
  long index_ = -1;    // the server picked for it, once granted (under the queue's lock)
  bool waiting_ = false;
};

class WaitQueue {
 public:
  enum class Outcome {
    picked,   // a server had room and nobody waited: `index` is the pick
    waiting,  // every eligible server is full: the ticket waits in the queue
    full,     // the servers are full and so is the queue (upstream's `queue` waiters)
    none,     // no server is eligible at all: waiting would not help
  };

  // A newcomer: a pick at once when nobody waits, else a place at the back
  // (when servers are full, not when none is eligible). Waiters ahead are
  // served first, so a newcomer never overtakes them. Thread-safe.
  Outcome enter(const std::shared_ptr<QueueTicket>& ticket, TimePoint now, long& index);

  // The waiter gives up (its queue_timeout, or the session ends otherwise).
  // Returns -1 when it was still waiting (now out of the queue), else the
  // server already picked for it: the caller must release that server.
  // `timed_out`: counted as a queue timeout. Thread-safe.
  long leave(QueueTicket& ticket, TimePoint now, bool timed_out);

  // Hands free slots to waiters, oldest first, until a pick fails. Called
  // after every release of a server of a queued upstream and on the control
  // loop's tick (a server that comes back up frees no slot). Thread-safe.
  void serve(TimePoint now);

  // The pool of this name in the configuration the workers use now (an
  // alias of its Snapshot, held weakly): a waiter whose own pool has no
  // server for it (a sentinel failover replaced the master, a reload the
  // servers) is served from there. Set by the control loop.
  void set_current(std::weak_ptr<Upstream> pool);

  // For /status and /metrics.
  std::size_t length() const { return length_.load(std::memory_order_relaxed); }
  std::uint64_t queued_total() const { return queued_total_.load(std::memory_order_relaxed); }
  std::uint64_t timeouts() const { return timeouts_.load(std::memory_order_relaxed); }
  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Seconds the longest waiter has waited now; 0 when nobody waits.
  double oldest_wait(TimePoint now) const;
  // Every wait that ended (granted, timed out or given up), in seconds.
  const Histogram<kQueueBuckets.size()>& wait_seconds() const { return wait_seconds_; }

 private:
  void serve_locked(TimePoint now);
  void ended_locked(QueueTicket& t, TimePoint now);

  mutable std::mutex mu_;
  std::weak_ptr<Upstream> current_;  // under mu_
  std::deque<std::shared_ptr<QueueTicket>> waiting_;  // under mu_, oldest first
  std::atomic<std::size_t> length_{0};                // waiting_.size(), for readers without the lock
  std::atomic<std::uint64_t> queued_total_{0};
  std::atomic<std::uint64_t> timeouts_{0};
  std::atomic<std::uint64_t> refused_{0};
  Histogram<kQueueBuckets.size()> wait_seconds_{kQueueBuckets};
};

}  // namespace sluice
