#include "proxy/connector.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "log/rate_limited_warning.hpp"
#include "proxy/session.hpp"
#include "proxy/socket_options.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/local_error.hpp"
#include "upstream/upstream.hpp"

namespace sluice {

namespace {

std::uint64_t ms(Duration d) { return static_cast<std::uint64_t>(d.count()); }

RateLimitedWarning g_local_warning;

}  // namespace

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
  if (holding_) {
    upstream_->release(static_cast<std::size_t>(index_));
    holding_ = false;
  }
}

namespace {

ConnectResult classify(int err) {
  return is_local_resource_error(err) ? ConnectResult::local_error : ConnectResult::failed;
}

}  // namespace

void Connector::attempt() {
  const ListenerConfig& lc = session_.listener_config();
  const std::uint64_t now = uv_now(session_.loop());
  deadline_ms_ = 0;
  if (attempts_ >= lc.tries ||
      (attempts_ > 0 && lc.next_upstream_timeout.count() > 0 &&
       now - first_attempt_ms_ >= ms(lc.next_upstream_timeout))) {
    session_.finish(Cause::connect_failed);
    return;
  }
  const long idx = pick_along_fallbacks(Clock::now());
  if (idx < 0) {
    session_.finish(attempts_ == 0 ? Cause::no_server : Cause::connect_failed);
    return;
  }
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
  // The server leg's keepalive, set as the socket is made so that a server
  // host that vanishes is found after tcp_keepalive_idle whatever the
  // session's age. (A new socket has SO_KEEPALIVE off: nothing to do when
  // the listener turns it off.)
  if (lc.tcp_keepalive) set_keepalive(fd, lc);
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
  deadline_ms_ = now + ms(lc.connect_timeout);
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
    const long idx = upstream_->pick(tried_, session_.hash_key(*upstream_), now, next == nullptr);
    if (idx >= 0) return idx;
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

void Connector::on_io(std::uint32_t events) {
  if (deadline_ms_ == 0) return;  // no attempt in flight
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
  if ((events & EPOLLOUT) != 0) connected();
}

void Connector::connected() {
  deadline_ms_ = 0;
  ServerState& st = *server();
  st.report(ConnectResult::connected, "", Clock::now());
  st.observe_connect(static_cast<double>(uv_hrtime() - attempt_start_ns_) / 1e9);
  session_.on_connected();
}

void Connector::on_timeout() {
  if (deadline_ms_ == 0) return;
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
