#include "proxy/connector.hpp"

#include <spdlog/spdlog.h>

#include "log/rate_limited_warning.hpp"
#include "proxy/buffer_pool.hpp"
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
  first_attempt_ms_ = uv_now(session_.loop());
  attempt();
}

void Connector::retry() { attempt(); }

void Connector::release() {
  if (holding_) {
    upstream_->release(static_cast<std::size_t>(index_));
    holding_ = false;
  }
}

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
  // The hash key is made again for a retry rather than kept for the
  // session's life: a retry is rare, and 32 bytes per session are not.
  const long idx = upstream_->pick(tried_, session_.hash_key(*upstream_), Clock::now());
  if (idx < 0) {
    session_.finish(attempts_ == 0 ? Cause::no_server : Cause::connect_failed);
    return;
  }
  tried_.add(static_cast<std::size_t>(idx));
  index_ = idx;
  holding_ = true;
  ++attempts_;

  uv_tcp_t* tcp = session_.open_server();
  const Endpoint& ep = upstream_->member(static_cast<std::size_t>(idx)).config.address;
  attempt_start_ns_ = uv_hrtime();
  // TCP_NODELAY is applied by libuv as the socket is created.
  uv_tcp_nodelay(tcp, 1);
  req_ = session_.pool().borrow<uv_connect_t>();
  req_->data = this;
  int r = uv_tcp_connect(req_, tcp, reinterpret_cast<const sockaddr*>(&ep.addr), on_connect_cb);
  if (r < 0) {
    give_back_request();
    failed(is_local_resource_error(r) ? ConnectResult::local_error : ConnectResult::failed, r);
    return;
  }
  // The server leg's keepalive, set as the socket is made so that a server
  // host that vanishes is found after tcp_keepalive_idle whatever the
  // session's age. (A new socket has SO_KEEPALIVE off: nothing to do when
  // the listener turns it off.)
  if (lc.tcp_keepalive) {
    uv_os_fd_t fd = -1;
    if (uv_fileno(reinterpret_cast<const uv_handle_t*>(tcp), &fd) == 0) set_keepalive(fd, lc);
  }
  // Reading the server starts with the connect: libuv delivers nothing before
  // the connect callback, and epoll then only has to drop POLLOUT instead of
  // re-adding the socket once the connect completes.
  if (r = session_.start_server_reading(); r < 0) {
    failed(is_local_resource_error(r) ? ConnectResult::local_error : ConnectResult::failed, r);
    return;
  }
  deadline_ms_ = now + ms(lc.connect_timeout);
  session_.arm_timer();
}

void Connector::on_connect_cb(uv_connect_t* req, int status) {
  auto* c = static_cast<Connector*>(req->data);
  c->give_back_request();
  Session& s = c->session_;
  // ECANCELED: we closed the handle ourselves (timeout or session end).
  if (status == UV_ECANCELED || s.state_ != Session::State::connecting || s.server_closing_) return;
  if (status < 0) {
    c->failed(is_local_resource_error(status) ? ConnectResult::local_error : ConnectResult::failed, status);
    return;
  }
  c->deadline_ms_ = 0;
  ServerState& st = *c->server();
  st.report(ConnectResult::connected, "", Clock::now());
  st.observe_connect(static_cast<double>(uv_hrtime() - c->attempt_start_ns_) / 1e9);
  s.on_connected();
}

// Every connect request ends in on_connect_cb (ECANCELED when its handle is
// closed first), so that is where it goes back.
void Connector::give_back_request() {
  session_.pool().give_back(req_);
  req_ = nullptr;
}

void Connector::on_timeout() {
  if (deadline_ms_ == 0) return;
  failed(ConnectResult::timed_out, 0);
}

void Connector::failed(ConnectResult result, int err) {
  deadline_ms_ = 0;
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
  // The next attempt needs a fresh handle; it starts from the close callback.
  session_.close_server_for_retry();
}

}  // namespace sluice
