#include "proxy/connector.hpp"

#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "log/rate_limited_warning.hpp"
#include "proxy/session.hpp"
#include "proxy/socket_options.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/address.hpp"
#include "sluice/local_error.hpp"
#include "sluice/time.hpp"
#include "upstream/upstream.hpp"
#include "upstream/wait_queue.hpp"

namespace sluice {

namespace {

RateLimitedWarning g_local_warning;

}  // namespace

// A session's place in a wait queue. The grant comes on whichever thread
// freed the slot and is passed to the session's worker; `owner` is read
// and cleared only there, so a session that ended meanwhile is never
// reached.
struct Connector::Ticket final : QueueTicket {
  SessionHost* host = nullptr;
  Connector* owner = nullptr;

  void granted(const std::shared_ptr<QueueTicket>& self) override {
    host->run_on_loop([t = std::static_pointer_cast<Ticket>(self)] {
      if (t->owner != nullptr) t->owner->on_granted();
    });
  }
};

ServerState* Connector::server() const {
  return index_ >= 0 ? &upstream_->server(static_cast<std::size_t>(index_)) : nullptr;
}

void Connector::start(Upstream* upstream) {
  upstream_ = upstream;
  origin_ = upstream;
  first_attempt_ms_ = uv_now(session_.loop());
  attempt();
}

void Connector::adopt(Upstream* upstream, Upstream* origin, long index, unsigned attempts) {
  upstream_ = upstream;
  origin_ = origin != nullptr ? origin : upstream;
  index_ = index;
  attempts_ = attempts;
  upstream->adopt(static_cast<std::size_t>(index));
  holding_ = true;
}

void Connector::release() {
  if (waiting_in_ != nullptr) {
    const long idx = leave_queue(false);
    // Granted just now, the news still on its way: the slot goes back (to
    // the next waiter, if any).
    if (idx >= 0) upstream_->release(static_cast<std::size_t>(idx));
  }
  if (holding_) {
    upstream_->release(static_cast<std::size_t>(index_));
    holding_ = false;
  }
}

namespace {

ConnectResult classify(int err) {
  return is_local_resource_error(err) ? ConnectResult::local_error : ConnectResult::failed;
}

// Whether the three-way handshake of `fd` is over (one getsockopt).
bool established(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && info.tcpi_state == TCP_ESTABLISHED;
}

}  // namespace

void Connector::attempt() {
  const ListenerConfig& lc = session_.listener_config();
  const std::uint64_t now = uv_now(session_.loop());
  deadline_ms_ = 0;
  if (attempts_ >= lc.tries ||
      (attempts_ > 0 && lc.next_upstream_timeout.count() > 0 &&
       now - first_attempt_ms_ >= timer_ms(lc.next_upstream_timeout))) {
    session_.finish(Cause::connect_failed);
    return;
  }
  const long idx = pick_along_fallbacks(Clock::now());
  if (idx == kQueued) {
    deadline_ms_ = now + timer_ms(upstream_->config().queue_timeout);
    session_.arm_timer();
    return;
  }
  if (idx < 0) {
    session_.finish(attempts_ == 0 ? Cause::no_server : Cause::connect_failed);
    return;
  }
  connect_to(idx, now);
}

void Connector::connect_to(long idx, std::uint64_t now) {
  session_.mark(Phase::pick);  // a server is chosen (kept from the first attempt)
  const ListenerConfig& lc = session_.listener_config();
  tried_.add(static_cast<std::size_t>(idx));
  index_ = idx;
  holding_ = true;
  ++attempts_;

  const Endpoint& ep = upstream_->member(static_cast<std::size_t>(idx)).config.address;
  attempt_start_ns_ = uv_hrtime();
  const int fd = ::socket(ep.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = -errno;
    failed(classify(err), err);
    return;
  }
  Leg& leg = session_.open_server(fd);
  set_nodelay(fd);
  // The server leg's keepalive is not set here but by the session once it
  // has lasted half of tcp_keepalive_idle (see Session::arm_timer): most
  // sessions end sooner and never needed it.
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.addr_len) != 0 && errno != EINPROGRESS) {
    const int err = -errno;
    failed(classify(err), err);
    return;
  }
  // Added after connect(2): the connect's end is the first edge, EPOLLOUT
  // (or EPOLLERR), and a connect that already finished reports it at once.
  if (const int r = session_.reactor().add(fd, Reactor::kStream, &leg); r < 0) {
    failed(ConnectResult::local_error, r);
    return;
  }
  leg.registered = true;
  session_.mark(Phase::connect);
  // To a server on loopback, connect(2) returns EINPROGRESS with the
  // handshake already done (the kernel runs the SYN, the SYN-ACK and the
  // ACK before it returns), unless the server's accept queue was full or
  // nothing listens. Asking now, instead of waiting for the EPOLLOUT the
  // next wait brings, lets the client's first bytes reach the server in
  // this loop turn: under load the rest of a turn and the next one's events
  // are what kept the slowest sessions waiting (docs/decisions.md, "Where a
  // slow short connection's time goes"). The EPOLLOUT still comes and finds
  // the session proxying. Other servers take a round trip: no call is spent.
  if (is_loopback(ep.addr) && established(fd)) {
    connected(true);
    return;
  }
  deadline_ms_ = now + timer_ms(lc.connect_timeout);
  session_.arm_timer();
}

long Connector::pick_along_fallbacks(TimePoint now) {
  const Snapshot& snap = *session_.snapshot_;
  // index_ belongs to this upstream until a new pick: with no pick, the
  // session ends naming the server it last tried, so upstream_ returns here.
  Upstream* const last = upstream_;
  // Healthy servers first, along the chain: an upstream with a fallback
  // passes on before its own fail_open, the last one may use it. The hash
  // key is made again for a retry rather than kept for the session's life:
  // a retry is rare, and 32 bytes per session are not.
  for (;;) {
    const FallbackLink* next = snap.fallback_of(upstream_);
    // Full servers and a queue: wait for this upstream rather than pass
    // on to the fallback, which is for servers that are down, not busy.
    const long idx = upstream_->queue() != nullptr
                         ? enter_queue(*upstream_->queue(), now, next == nullptr)
                         : upstream_->pick(tried_, session_.hash_key(*upstream_), now, next == nullptr);
    if (idx >= 0 || idx == kQueued) return idx;
    if (next == nullptr) break;
    next->used->fetch_add(1, std::memory_order_relaxed);
    upstream_ = next->to;
    tried_.clear();  // indexes of the upstream left behind
  }
  // The whole chain is down: fail_open, where set, in chain order (the last
  // upstream's was tried above). Servers tried in earlier upstreams are not
  // remembered: `tries` still bounds the attempts.
  for (Upstream* up = origin_; up != upstream_;) {
    const FallbackLink* next = snap.fallback_of(up);
    if (up->config().all_down == AllDown::fail_open) {
      const long idx = up->pick(TriedSet{}, session_.hash_key(*up), now, true);
      if (idx >= 0) {
        upstream_ = up;
        tried_.clear();
        return idx;
      }
    }
    up = next->to;
  }
  upstream_ = last;  // no attempt follows a failed pick: tried_ no longer matters
  return -1;
}

long Connector::enter_queue(WaitQueue& q, TimePoint now, bool panic) {
  if (!ticket_) {
    ticket_ = std::make_shared<Ticket>();
    ticket_->host = &session_.host_;
  }
  ticket_->owner = this;
  ticket_->upstream = upstream_;
  ticket_->tried = &tried_;
  ticket_->key = session_.hash_key(*upstream_);
  ticket_->panic = panic;
  long idx = -1;
  switch (q.enter(ticket_, now, idx)) {
    case WaitQueue::Outcome::picked: return idx;
    case WaitQueue::Outcome::waiting: waiting_in_ = &q; return kQueued;
    case WaitQueue::Outcome::full: queue_full_ = true; break;
    case WaitQueue::Outcome::none: break;
  }
  return -1;
}

long Connector::leave_queue(bool timed_out) {
  const long idx = waiting_in_->leave(*ticket_, Clock::now(), timed_out);
  if (idx >= 0 && ticket_->pool) {
    // Picked in the newest configuration's pool: the session uses that
    // pool (and keeps its configuration alive) from now on.
    pool_ = std::move(ticket_->pool);
    upstream_ = pool_.get();
    origin_ = upstream_;
    tried_.clear();
  }
  waiting_in_ = nullptr;
  ticket_->owner = nullptr;
  ticket_.reset();
  return idx;
}

void Connector::on_granted() {
  if (waiting_in_ == nullptr) return;
  const long idx = leave_queue(false);
  deadline_ms_ = 0;
  if (idx < 0) {
    session_.finish(Cause::internal_error);  // a grant always names a server
    return;
  }
  const std::uint64_t now = uv_now(session_.loop());
  // next_upstream_timeout bounds the retries, not the wait before the first connect.
  if (attempts_ == 0) first_attempt_ms_ = now;
  connect_to(idx, now);
}

void Connector::on_io(std::uint32_t events) {
  if (deadline_ms_ == 0 || waiting_in_ != nullptr) return;  // no attempt in flight
  if ((events & (EPOLLERR | EPOLLHUP)) != 0) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(session_.server_leg().fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == 0) err = ECONNRESET;
    failed(classify(-err), -err);
    return;
  }
  // EPOLLOUT without EPOLLERR: the connect succeeded (no getsockopt needed
  // to ask, as there is on other systems).
  if ((events & EPOLLOUT) != 0) connected(false);
}

void Connector::connected(bool at_once) {
  deadline_ms_ = 0;
  ServerState& st = *server();
  st.report(ConnectResult::connected, "", Clock::now());
  st.observe_connect(static_cast<double>(uv_hrtime() - attempt_start_ns_) / 1e9);
  session_.on_connected(at_once);
}

void Connector::on_timeout() {
  if (deadline_ms_ == 0) return;
  if (waiting_in_ != nullptr) {
    deadline_ms_ = 0;
    const long idx = leave_queue(true);
    if (idx < 0) {
      session_.finish(Cause::queue_timeout);
      return;
    }
    // A server was picked for it as the deadline passed: take it.
    const std::uint64_t now = uv_now(session_.loop());
    if (attempts_ == 0) first_attempt_ms_ = now;
    connect_to(idx, now);
    return;
  }
  failed(ConnectResult::timed_out, 0);
}

void Connector::failed(ConnectResult result, int err) {
  deadline_ms_ = 0;
  session_.close_server_for_retry();
  ServerState& st = *server();
  const char* why = result == ConnectResult::timed_out ? "connect timed out" : uv_strerror(err);
  if (result == ConnectResult::local_error) {
    // Ours, not the server's: the server is not blamed, and the next server
    // would fail the same way, so the session ends here.
    session_.snapshot_->registry->counters().local_errors.fetch_add(1, std::memory_order_relaxed);
    g_local_warning.warn(fmt::format("local resource error while connecting to upstream \"{}\" server {}: {} "
                                     "(not counted against the server)",
                                     st.upstream, st.address.text, why));
    release();
    session_.finish(Cause::local_resource);
    return;
  }
  SPDLOG_DEBUG("listener \"{}\" client {}: connect to {} failed (attempt {}): {}", session_.listener_config().name,
               session_.client_address(), st.address.text, attempts_, why);
  st.report(result, why, Clock::now());
  release();
  session_.reactor().defer(*this);
}

}  // namespace sluice
