// CONNECTING: pick a server, connect with connect_timeout, and on failure
// report it to the server's state and try the next server (never one already
// tried), up to `tries` attempts within next_upstream_timeout. Nothing has
// been sent to the client yet, so retrying is always safe. When an upstream
// has no eligible server left to try, the attempt goes on to its `fallback`
// (and that one's, to the end of the chain); only when none of the chain has
// one does fail_open apply, in chain order.
//
// An upstream with a `queue` makes a client that finds every eligible
// server full wait (its bytes stay in the kernel; nothing is read) until the
// upstream's WaitQueue hands it a server, or queue_timeout passes (cause
// queue_timeout). A full queue refuses as a full upstream without one does.
// Without a queue none of this costs anything: no allocation, no atomic.
//
// Errors are classified by origin: a refused or timed-out connect is the
// server's (it counts against its passive health); running out of our own
// fds or ports is ours (local_resource: the server is not blamed and the
// session ends at once, since another server would fail the same way).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "proxy/reactor.hpp"
#include "sluice/cause.hpp"
#include "upstream/server_state.hpp"
#include "upstream/tried_set.hpp"

namespace sluice {

class Session;
class Upstream;
class WaitQueue;

// The server's socket is made non-blocking by socket(2) itself, connected,
// and only then added to the worker's Reactor (edge-triggered, for reading
// and writing, once for its whole life): the connect's end is its first
// EPOLLOUT, or EPOLLERR with the error in SO_ERROR. A connect to a loopback
// address is asked about at once instead (TCP_INFO), since it is usually
// done when connect(2) returns.
class Connector final : public Deferred {
 public:
  explicit Connector(Session& session) : session_(session) {}

  // Starts the first attempt on `upstream` (hashing on the session's key if
  // the upstream hashes).
  void start(Upstream* upstream);
  // The server socket's events while connecting.
  void on_io(std::uint32_t events);
  // The current attempt's deadline (or the queue's) passed.
  void on_timeout();
  // The next attempt, after a failed one (deferred, so that it never opens
  // a socket inside the events of the one just closed).
  void run_deferred() override { attempt(); }
  // When the current attempt (or the wait in a queue) times out (loop ms);
  // 0 when none is in flight.
  std::uint64_t deadline_ms() const { return deadline_ms_; }
  // The session no longer counts on this server (it ended, or moved on),
  // nor waits in a queue.
  void release();
  // A session a binary upgrade handed over, connected to server `index` of
  // `upstream` (routed to `origin`) after `attempts` tries.
  void adopt(Upstream* upstream, Upstream* origin, long index, unsigned attempts);

  // The upstream in use: the one routed to, or a fallback it led to.
  Upstream* upstream() const { return upstream_; }
  // Whether the session was sent on to a fallback upstream.
  bool used_fallback() const { return upstream_ != origin_; }
  Upstream* origin() const { return origin_; }
  // The server chosen last (connected, or the last one tried); null if none.
  ServerState* server() const;
  // The server the session counts on now (connecting or connected); null
  // between a failed attempt and the next one, and once released.
  ServerState* current() const { return holding_ ? server() : nullptr; }
  long index() const { return index_; }
  unsigned attempts() const { return attempts_; }
  // A queue this session tried to enter was full (a no_server refusal then
  // says so).
  bool met_full_queue() const { return queue_full_; }

 private:
  struct Ticket;
  static constexpr long kQueued = -2;

  void attempt();
  // Connects to member `idx` of upstream_ (picked for this session).
  void connect_to(long idx, std::uint64_t now);
  // Picks a server for the next attempt, following fallbacks; -1 if none,
  // kQueued when the session now waits in upstream_'s queue.
  long pick_along_fallbacks(TimePoint now);
  // A pick through `q`: the index, kQueued, or -1 (nothing to wait for, or the queue is full).
  long enter_queue(WaitQueue& q, TimePoint now, bool panic);
  // The queue picked server `idx` for this session (on the worker's thread).
  void on_granted();
  // Leaves the queue; the server it had picked meanwhile, or -1.
  long leave_queue(bool timed_out);
  // The connect succeeded: `at_once` when connect_to saw it done as it
  // returned, rather than from the socket's EPOLLOUT.
  void connected(bool at_once);
  void failed(ConnectResult result, int err);

  Session& session_;
  Upstream* upstream_ = nullptr;
  Upstream* origin_ = nullptr;  // the upstream routed to
  long index_ = -1;
  bool holding_ = false;  // counted in the server's `active`
  bool queue_full_ = false;
  unsigned attempts_ = 0;
  TriedSet tried_;
  WaitQueue* waiting_in_ = nullptr;  // the queue this session waits in; null when not waiting
  std::shared_ptr<Ticket> ticket_;   // its place there (made only for a queue)
  std::shared_ptr<Upstream> pool_;   // a newer configuration's pool the queue handed this session to
  std::uint64_t first_attempt_ms_ = 0;
  std::uint64_t deadline_ms_ = 0;
  std::uint64_t attempt_start_ns_ = 0;
};

}  // namespace sluice
