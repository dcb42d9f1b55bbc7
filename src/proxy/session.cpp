#include "proxy/session.hpp"

#include <spdlog/spdlog.h>

#include "config/values.hpp"
#include "log/access_log.hpp"
#include "net/runtime.hpp"
#include "net/worker.hpp"
#include "preread/sni_router.hpp"
#include "upstream/upstream.hpp"

namespace sluice {

namespace {

uv_handle_t* as_handle(void* h) { return static_cast<uv_handle_t*>(h); }
uv_stream_t* as_stream(uv_tcp_t* t) { return reinterpret_cast<uv_stream_t*>(t); }

std::uint64_t ms(Duration d) { return static_cast<std::uint64_t>(d.count()); }

// Address text without the port, for hashing on the client IP.
std::string ip_only(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    uv_ip4_name(reinterpret_cast<const sockaddr_in*>(sa), buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    uv_ip6_name(reinterpret_cast<const sockaddr_in6*>(sa), buf, sizeof buf);
  }
  return buf;
}

}  // namespace

Session::Session(Worker& worker, const ListenerRuntime& lr)
    : worker_(worker), lr_(lr), runtime_(worker.runtime()) {
  client_.data = &c2s_;
  server_.data = &s2c_;
  timer_.data = this;
  connect_req_.data = this;
  c2s_.session = this;
  c2s_.src = as_stream(&client_);
  c2s_.dst = as_stream(&server_);
  c2s_.name = "client->server";
  c2s_.src_is_client = true;
  s2c_.session = this;
  s2c_.src = as_stream(&server_);
  s2c_.dst = as_stream(&client_);
  s2c_.name = "server->client";
  s2c_.src_is_client = false;
}

Session::~Session() { runtime_->connections.fetch_sub(1, std::memory_order_relaxed); }

BufferPool& Session::pool() { return worker_.pool(); }

void Session::touch() { last_activity_ms_ = uv_now(worker_.loop()); }

bool Session::accept(Worker& worker, const ListenerRuntime& lr, uv_stream_t* listener) {
  auto* s = new Session(worker, lr);
  uv_loop_t* loop = worker.loop();
  uv_tcp_init(loop, &s->client_);
  uv_timer_init(loop, &s->timer_);
  s->open_handles_ = 2;
  s->runtime_->connections.fetch_add(1, std::memory_order_relaxed);
  if (int r = uv_accept(listener, as_stream(&s->client_)); r < 0) {
    spdlog::warn("listener \"{}\": accept failed: {}", lr.config->name, uv_strerror(r));
    // Never a session: close quietly, no access-log record.
    s->state_ = State::closing;
    s->cause_ = Cause::none;
    uv_close(as_handle(&s->client_), on_close_cb);
    uv_close(as_handle(&s->timer_), on_close_cb);
    return false;
  }
  worker.link(s);
  s->begin();
  return true;
}

void Session::set_state(State s) {
  // The one place where the state changes (HAProxy's habit): handy for a
  // trace and for asserting the order of states.
  SPDLOG_TRACE("session {}: state {} -> {}", static_cast<void*>(this), static_cast<int>(state_),
               static_cast<int>(s));
  state_ = s;
}

void Session::begin() {
  uv_loop_t* loop = worker_.loop();
  start_ms_ = last_activity_ms_ = uv_now(loop);

  // Read now: after a reset the kernel no longer knows it. Skipped (one
  // system call per connection) when nothing would use it.
  if (lr_.needs_client_address || spdlog::should_log(spdlog::level::debug)) {
    int len = sizeof peer_;
    if (uv_tcp_getpeername(&client_, &peer_.sa, &len) != 0) peer_.sa.sa_family = AF_UNSPEC;
  }

  const Config& cfg = *runtime_->config;
  if (runtime_->connections.load(std::memory_order_relaxed) > cfg.global.max_connections) {
    finish(Cause::limit_reached);
    return;
  }
  uv_tcp_nodelay(&client_, 1);

  if (lr_.config->preread == Preread::tls) {
    begin_preread();
  } else {
    route_and_connect(lr_.upstream);
  }
}

// ---- PREREADING ------------------------------------------------------------

void Session::begin_preread() {
  set_state(State::prereading);
  parser_ = std::make_unique<preread::ClientHelloParser>(lr_.config->preread_max_bytes);
  if (int r = uv_read_start(as_stream(&client_), on_client_alloc, on_client_read); r < 0) {
    finish(Cause::client_reset);
    return;
  }
  client_reading_ = true;
  arm_timer();
}

void Session::on_client_alloc(uv_handle_t* h, std::size_t /*suggested*/, uv_buf_t* buf) {
  Session* s = static_cast<Pump*>(h->data)->session;
  Buffer* b = s->pool().get();
  *buf = uv_buf_init(b->data, Buffer::kSize);
}

// The client's read callback from the start of a preread until its pump takes
// over. It stays installed while connecting and into PROXYING, so that the
// client is never stopped and restarted (each restart costs epoll_ctl calls).
void Session::on_client_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
  Session* s = static_cast<Pump*>(st->data)->session;
  if (s->state_ == State::proxying) {
    Pump::on_read(st, nread, buf);
    return;
  }
  if (nread > 0 && s->state_ == State::prereading) {
    s->on_preread_data(buf->base, static_cast<std::size_t>(nread));
  } else if (nread > 0 && s->state_ == State::connecting) {
    // Bytes after the hello, before the server is there: they follow the
    // hello, and reading waits for the pump.
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf->base);
    s->preread_bytes_.insert(s->preread_bytes_.end(), bytes, bytes + nread);
    s->stop_client_reading();
  }
  if (buf->base != nullptr) s->pool().put(Buffer::from_data(buf->base));
  if (nread >= 0) return;
  if (s->state_ == State::prereading) {
    s->finish(nread == UV_EOF ? Cause::client_closed : Cause::client_reset);
  } else if (s->state_ == State::connecting) {
    // EOF or an error while connecting: the pump handles it once it starts.
    s->client_end_ = nread;
    s->stop_client_reading();
  }
}

void Session::stop_client_reading() {
  if (client_reading_) uv_read_stop(as_stream(&client_));
  client_reading_ = false;
}

void Session::on_preread_data(const char* data, std::size_t len) {
  touch();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(data);
  const ListenerConfig& lc = *lr_.config;
  Upstream* up = nullptr;
  const std::size_t held = parser_->input_size();
  switch (parser_->feed({bytes, len})) {
    case preread::Status::need_more:
      return;
    case preread::Status::done: {
      const preread::ClientHelloInfo& info = parser_->info();
      if (info.has_sni) sni_ = preread::normalize_host(info.sni);
      for (const std::string& p : info.alpn) {
        if (!alpn_.empty()) alpn_ += ',';
        alpn_ += p;
      }
      const std::string* name = info.has_sni ? lr_.router->match(sni_) : nullptr;
      up = name ? runtime_->find_upstream(*name) : lr_.default_upstream;
      if (!up) {
        finish(Cause::no_server);
        return;
      }
      break;
    }
    case preread::Status::not_tls:
      if (lc.on_not_tls == OnNotTls::close || !lr_.default_upstream) {
        finish(lc.on_not_tls == OnNotTls::close ? Cause::rejected_not_tls : Cause::no_server);
        return;
      }
      up = lr_.default_upstream;
      break;
    case preread::Status::malformed:
      SPDLOG_DEBUG("listener \"{}\" client {}: malformed ClientHello: {}", lc.name, client_address(),
                   parser_->error());
      if (lc.on_malformed == OnMalformed::close || !lr_.default_upstream) {
        finish(Cause::preread_malformed);
        return;
      }
      up = lr_.default_upstream;
      break;
  }
  // What the server gets first, byte for byte: the input the parser holds,
  // then whatever this read carried past the parser's cap.
  const std::size_t taken = parser_->input_size() - held;
  preread_bytes_ = parser_->take_input();
  preread_bytes_.insert(preread_bytes_.end(), bytes + taken, bytes + len);
  // The client keeps being read while connecting (see on_client_read).
  parser_.reset();
  route_and_connect(up);
}

// ---- CONNECTING ------------------------------------------------------------

void Session::route_and_connect(Upstream* up) {
  upstream_ = up;
  tried_.assign(up->size(), false);
  set_state(State::connecting);
  first_attempt_ms_ = uv_now(worker_.loop());
  connect_next();
}

std::string Session::client_address() const {
  if (peer_.sa.sa_family != AF_INET && peer_.sa.sa_family != AF_INET6) return {};
  return format_sockaddr(&peer_.sa);
}

std::string Session::client_ip() const { return ip_only(&peer_.sa); }

std::string Session::hash_key() const {
  const UpstreamConfig& uc = upstream_->config();
  if (uc.balance != Balance::hash) return {};
  switch (uc.hash_key) {
    case HashKey::sni: return sni_;
    case HashKey::client_ip: return client_ip();
    case HashKey::sni_or_client_ip: return sni_.empty() ? client_ip() : sni_;
  }
  return {};
}

void Session::connect_next() {
  const ListenerConfig& lc = *lr_.config;
  uv_loop_t* loop = worker_.loop();
  std::uint64_t now = uv_now(loop);
  if (attempts_ >= lc.tries ||
      (attempts_ > 0 && lc.next_upstream_timeout.count() > 0 &&
       now - first_attempt_ms_ >= ms(lc.next_upstream_timeout))) {
    finish(Cause::connect_failed);
    return;
  }
  long idx = upstream_->pick(tried_, hash_key(), Clock::now());
  if (idx < 0) {
    finish(attempts_ == 0 ? Cause::no_server : Cause::connect_failed);
    return;
  }
  tried_[static_cast<std::size_t>(idx)] = true;
  server_index_ = idx;
  holding_server_ = true;
  ++attempts_;

  uv_tcp_init(loop, &server_);
  server_open_ = true;
  ++open_handles_;
  const Endpoint& ep = upstream_->server(static_cast<std::size_t>(idx)).address;
  int r = uv_tcp_connect(&connect_req_, &server_, reinterpret_cast<const sockaddr*>(&ep.addr),
                         on_connect_cb);
  if (r < 0) {
    attempt_failed(ConnectResult::failed, r);
    return;
  }
  // Reading the server starts with the connect: libuv delivers nothing before
  // the connect callback, and epoll then only has to drop POLLOUT instead of
  // re-adding the socket once the connect completes.
  if (r = s2c_.start(); r < 0) {
    attempt_failed(ConnectResult::failed, r);
    return;
  }
  attempt_deadline_ms_ = now + ms(lc.connect_timeout);
  arm_timer();
}

void Session::on_connect_cb(uv_connect_t* req, int status) {
  auto* s = static_cast<Session*>(req->data);
  // ECANCELED: we closed the handle ourselves (timeout or session end).
  if (status == UV_ECANCELED || s->state_ != State::connecting || s->server_closing_) return;
  if (status < 0) {
    s->attempt_failed(ConnectResult::failed, status);
    return;
  }
  s->on_connected();
}

void Session::attempt_failed(ConnectResult result, int err) {
  ServerState& st = upstream_->server(static_cast<std::size_t>(server_index_));
  const char* why = result == ConnectResult::timed_out ? "connect timed out" : uv_strerror(err);
  SPDLOG_DEBUG("listener \"{}\" client {}: connect to {} failed (attempt {}): {}", lr_.config->name,
               client_address(), st.address.text, attempts_, why);
  st.report(result, why, Clock::now());
  release_server();
  // The next attempt needs a fresh handle; it starts from the close callback.
  s2c_.stop();
  server_closing_ = true;
  uv_close(as_handle(&server_), on_close_cb);
}

void Session::on_connected() {
  ServerState& st = upstream_->server(static_cast<std::size_t>(server_index_));
  st.report(ConnectResult::connected, "", Clock::now());
  connected_ms_ = uv_now(worker_.loop());
  connected_ = true;
  start_proxying();
}

// ---- PROXYING --------------------------------------------------------------

void Session::start_proxying() {
  set_state(State::proxying);
  uv_tcp_nodelay(&server_, 1);
  touch();
  if (!preread_bytes_.empty()) {
    // The ClientHello goes to the server first, byte for byte.
    char* hello = reinterpret_cast<char*>(preread_bytes_.data());
    if (int r = c2s_.write_initial(hello, preread_bytes_.size(), &preread_write_); r < 0) {
      finish(Cause::server_reset);
      return;
    }
  }
  if (client_end_ != 0) {
    // The client ended while connecting: the pump sees it as if just read.
    uv_buf_t none = uv_buf_init(nullptr, 0);
    Pump::on_read(as_stream(&client_), client_end_, &none);
    if (closing()) return;
  } else if (client_reading_) {
    c2s_.adopt_reading();
    client_reading_ = false;  // the pump's now
  } else if (c2s_.start() < 0) {
    finish(Cause::client_reset);
    return;
  }
  arm_timer();
}

void Session::on_pump_eof(Pump& p) {
  if (fin_deadline_ms_ == 0) {
    client_fin_first_ = p.src_is_client;
    fin_deadline_ms_ = uv_now(worker_.loop()) + ms(lr_.config->fin_timeout);
    arm_timer();
  }
}

void Session::on_pump_fin_sent(Pump& /*p*/) {
  if (c2s_.fin_sent && s2c_.fin_sent) finish(client_fin_first_ ? Cause::client_closed : Cause::server_closed);
}

void Session::on_pump_error(Pump& p, int err, bool at_dst) {
  bool client_side = at_dst ? !p.src_is_client : p.src_is_client;
  SPDLOG_DEBUG("listener \"{}\" client {}: {} {} error: {}", lr_.config->name, client_address(), p.name,
               at_dst ? "write" : "read", uv_strerror(err));
  // A side that already sent its FIN and then refuses our remaining bytes has
  // closed; anything else is a reset.
  const Pump& from_side = client_side ? c2s_ : s2c_;
  if (from_side.eof) {
    finish(client_side ? Cause::client_closed : Cause::server_closed);
  } else {
    finish(client_side ? Cause::client_reset : Cause::server_reset);
  }
}

// ---- timers ----------------------------------------------------------------

void Session::arm_timer() {
  const ListenerConfig& lc = *lr_.config;
  std::uint64_t deadline = 0;
  auto consider = [&deadline](std::uint64_t d) {
    if (d != 0 && (deadline == 0 || d < deadline)) deadline = d;
  };
  switch (state_) {
    case State::prereading:
      consider(start_ms_ + ms(lc.preread_timeout));
      break;
    case State::connecting:
      consider(attempt_deadline_ms_);
      break;
    case State::proxying:
      if (lc.idle_timeout.count() > 0) consider(last_activity_ms_ + ms(lc.idle_timeout));
      if (lc.max_lifetime.count() > 0) consider(start_ms_ + ms(lc.max_lifetime));
      consider(fin_deadline_ms_);
      break;
    case State::accepted:
    case State::closing:
      break;
  }
  if (deadline == 0) {
    if (timer_due_ms_ != 0) uv_timer_stop(&timer_);
    timer_due_ms_ = 0;
    return;
  }
  // A timer due no later than the new deadline is left alone: on_timer()
  // checks every deadline and re-arms when it fires early. Most sessions end
  // before their first deadline, so they arm the timer once and never move it.
  if (timer_due_ms_ != 0 && timer_due_ms_ <= deadline) return;
  std::uint64_t now = uv_now(worker_.loop());
  uv_timer_start(&timer_, on_timer_cb, deadline > now ? deadline - now : 0, 0);
  timer_due_ms_ = deadline;
}

void Session::on_timer_cb(uv_timer_t* t) {
  auto* s = static_cast<Session*>(t->data);
  s->timer_due_ms_ = 0;
  s->on_timer();
}

void Session::on_timer() {
  const ListenerConfig& lc = *lr_.config;
  std::uint64_t now = uv_now(worker_.loop());
  switch (state_) {
    case State::prereading:
      if (now >= start_ms_ + ms(lc.preread_timeout)) {
        finish(Cause::preread_timeout);
      } else {
        arm_timer();
      }
      return;
    case State::connecting:
      if (now < attempt_deadline_ms_) {
        arm_timer();  // armed for an earlier deadline (preread, an earlier attempt)
      } else if (!server_closing_) {
        attempt_failed(ConnectResult::timed_out, 0);
      }
      return;
    case State::proxying:
      if (lc.max_lifetime.count() > 0 && now >= start_ms_ + ms(lc.max_lifetime)) {
        finish(Cause::max_lifetime);
      } else if (fin_deadline_ms_ != 0 && now >= fin_deadline_ms_) {
        finish(Cause::fin_timeout);
      } else if (lc.idle_timeout.count() > 0 && now >= last_activity_ms_ + ms(lc.idle_timeout)) {
        finish(Cause::idle_timeout);
      } else {
        arm_timer();  // activity moved the idle deadline: sleep until the new one
      }
      return;
    case State::accepted:
    case State::closing:
      return;
  }
}

// ---- CLOSED ----------------------------------------------------------------

void Session::release_server() {
  if (holding_server_) {
    upstream_->release(static_cast<std::size_t>(server_index_));
    holding_server_ = false;
  }
}

void Session::finish(Cause cause) {
  if (state_ == State::closing) return;
  cause_ = cause;
  set_state(State::closing);
  c2s_.stop();
  s2c_.stop();
  stop_client_reading();
  uv_timer_stop(&timer_);
  timer_due_ms_ = 0;
  release_server();
  uv_close(as_handle(&client_), on_close_cb);
  uv_close(as_handle(&timer_), on_close_cb);
  if (server_open_ && !server_closing_) {
    server_closing_ = true;
    uv_close(as_handle(&server_), on_close_cb);
  }
}

void Session::on_close_cb(uv_handle_t* h) {
  Session* s = h->type == UV_TIMER ? static_cast<Session*>(h->data) : static_cast<Pump*>(h->data)->session;
  s->on_handle_closed(h);
}

void Session::on_handle_closed(uv_handle_t* h) {
  --open_handles_;
  if (h == as_handle(&server_)) {
    server_open_ = false;
    server_closing_ = false;
    if (state_ == State::connecting) {
      connect_next();
      return;
    }
  }
  if (state_ != State::closing || open_handles_ > 0) return;

  if (cause_ != Cause::none) {
    runtime_->causes[static_cast<std::size_t>(cause_)].fetch_add(1, std::memory_order_relaxed);
    if (runtime_->access_log->enabled()) {
      std::uint64_t now = uv_now(worker_.loop());
      const std::string client = client_address();
      AccessRecord r;
      r.listener = lr_.config->name;
      r.client = client;
      if (server_index_ >= 0) r.server = upstream_->server(static_cast<std::size_t>(server_index_)).address.text;
      r.sni = sni_;
      r.alpn = alpn_;
      r.tries = attempts_;
      r.bytes_in = c2s_.bytes;
      r.bytes_out = s2c_.bytes;
      r.connect_ms = connected_ ? static_cast<std::int64_t>(connected_ms_ - start_ms_) : -1;
      r.duration_ms = static_cast<std::int64_t>(now - start_ms_);
      r.cause = cause_;
      runtime_->access_log->write(r);
    }
    worker_.unlink(this);
  }
  delete this;
}

}  // namespace sluice
