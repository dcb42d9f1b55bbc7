#include "proxy/session.hpp"

#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>

#include <spdlog/spdlog.h>

#include "log/access_log.hpp"
#include "log/rate_limited_warning.hpp"
#include "preread/postgres.hpp"
#include "preread/proxy_protocol.hpp"
#include "preread/refusal.hpp"
#include "proxy/buffer_pool.hpp"
#include "proxy/postgres_stage.hpp"
#include "proxy/proxy_header_stage.hpp"
#include "proxy/socket_options.hpp"
#include "proxy/splice.hpp"
#include "proxy/tls_stage.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/address.hpp"
#include "sluice/cidr.hpp"
#include "sluice/local_error.hpp"
#include "sluice/peak.hpp"
#include "sluice/time.hpp"
#include "upstream/upstream.hpp"

namespace sluice {

// What only some sessions need: the PROXY header being read, the preread
// stage, the bytes that go to the server before the client's, and what the
// preread learnt. A plain listener's sessions never allocate it.
struct Session::Extra {
  std::unique_ptr<PrereadStage> stage;     // while the preread runs
  std::uint8_t next_step = 0;              // of the listener's chain (see next_stage())
  std::vector<std::uint8_t> forward;       // sent to the server first; freed once written
  std::uint64_t pg_deadline_ms = 0;        // waiting for the server's 'S' until then
  std::string sni;
  std::string alpn;
  SockAddr proxied_destination{};          // from a PROXY header
  bool pg_ssl = false;                     // the server must be asked for TLS (SSLRequest) first
  bool refusing_counted = false;           // counted in the process's `refusing`
  std::unique_ptr<preread::Refusal> refusal;  // while refusing
  std::uint64_t refuse_deadline_ms = 0;    // the refusal gives up (closes) then
  RouteStats* route_stats = nullptr;       // the SNI route (or default) a preread chose
  // Bytes already in the byte counters: kept only once a session has
  // counted before its end (interim records, adoption), so that a short
  // session carries neither (every idle session would pay 16 bytes).
  std::uint64_t counted_in = 0;
  std::uint64_t counted_out = 0;
  // log_phases: each phase's time after phase_base_ns (uv_hrtime at accept).
  std::uint64_t phase_base_ns = 0;
  PhaseTimes phases{};
};

Session::Extra& Session::extra() {
  if (!extra_) extra_ = std::make_unique<Extra>();
  return *extra_;
}

namespace {

// Microseconds from `from_ns` to `to_ns` (uv_hrtime), as an access record
// field holds them.
std::int32_t micros_between(std::uint64_t from_ns, std::uint64_t to_ns) {
  return static_cast<std::int32_t>(std::min<std::uint64_t>((to_ns - from_ns) / 1000, INT32_MAX));
}

}  // namespace

void Session::start_timing() {
  timed_ = true;
  Extra& x = extra();
  x.phase_base_ns = uv_hrtime();
  std::fill(std::begin(x.phases.at_us), std::end(x.phases.at_us), -1);
  const Reactor& r = reactor();
  if (r.woke_ns() != 0 && r.woke_ns() <= x.phase_base_ns) {
    x.phases.turn_us = micros_between(r.woke_ns(), x.phase_base_ns);
  }
  x.phases.turn_events = static_cast<std::uint32_t>(r.last_events());
}

void Session::mark_phase(Phase p) {
  std::int32_t& at = extra_->phases.at_us[static_cast<std::size_t>(p)];
  if (at >= 0) return;
  at = micros_between(extra_->phase_base_ns, uv_hrtime());
}

const std::string& Session::sni() const {
  static const std::string none;
  return extra_ ? extra_->sni : none;
}

const std::string& Session::alpn() const {
  static const std::string none;
  return extra_ ? extra_->alpn : none;
}

namespace {

// Sessions that may be telling a refused client why at once, in the whole
// process: each holds its socket for up to preread_timeout, and a flood of
// refused clients must not hold more. Beyond it a refusal closes at once.
constexpr std::uint64_t kMaxRefusing = 1024;
// What a refusal reads and drops after the client's first message, so that
// its close is a FIN rather than a reset that could overtake the reply.
constexpr std::size_t kRefusalDrain = 64 * 1024;

// Writes all of `data` to a socket that has taken nothing yet (a reply of a
// few bytes): the kernel takes it whole, or something is wrong.
bool write_whole(int fd, const void* data, std::size_t len) {
  return ::send(fd, data, len, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

}  // namespace

Session::Session(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv)
    : host_(host), snapshot_(std::move(snapshot)), lv_(lv), connector_(*this) {
  client_.session = this;
  client_.is_client = true;
  server_.session = this;
  c2s_.session = this;
  c2s_.src = &client_;
  c2s_.dst = &server_;
  c2s_.src_is_client = true;
  s2c_.session = this;
  s2c_.src = &server_;
  s2c_.dst = &client_;
  s2c_.src_is_client = false;
  timer_.owner = this;
}

Session::~Session() { uncount(); }

// The connection is no longer open: out of the counts max_connections
// reads, at once (not when the object goes after the round), so that a
// client refused by a limit frees its place before the next accept.
void Session::uncount() {
  if (counted_) {
    counted_ = false;
    snapshot_->registry->counters().connections.fetch_sub(1, std::memory_order_relaxed);
    lv_.stats->active.fetch_sub(1, std::memory_order_relaxed);
  }
}

BufferPool& Session::pool() { return host_.pool(); }

void Session::touch() { last_activity_ms_ = uv_now(host_.loop()); }

const ListenerConfig& Session::listener_config() const { return *lv_.config; }

void Session::accept(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv, int fd,
                     const sockaddr* peer) {
  auto* s = new Session(host, std::move(snapshot), lv);
  // accept4 made it non-blocking; it joins the Reactor once admitted (a
  // preread at once, else as its server's connect starts).
  s->client_.fd = fd;
  copy_inet(&s->peer_, peer);
  s->counted_ = true;
  s->snapshot_->registry->counters().connections.fetch_add(1, std::memory_order_relaxed);
  raise_peak(lv.stats->peak_active, lv.stats->active.fetch_add(1, std::memory_order_relaxed) + 1);
  lv.stats->accepted.fetch_add(1, std::memory_order_relaxed);
  host.link(*s);
  s->begin();
}

void Session::set_state(State s) {
  // The one place where the state changes (HAProxy's habit): handy for a
  // trace and for asserting the order of states.
  SPDLOG_TRACE("session {}: state {} -> {}", static_cast<void*>(this), static_cast<int>(state_),
               static_cast<int>(s));
  state_ = s;
}

void Session::begin() {
  uv_loop_t* loop = host_.loop();
  start_ms_ = uv_now(loop);
  last_activity_ms_ = start_ms_;
  if (snapshot_->config->global.log_phases) start_timing();
  if (lv_.config->accept_proxy) {
    // Only trusted peers may say who the client is. The ACL and the
    // per-client limits wait for the address the header carries.
    if (!any_contains(lv_.config->trusted_proxies, &peer_.sa)) {
      refuse(Cause::rejected_proxy);
      return;
    }
    begin_preread();
    return;
  }
  if (!admit()) return;
  after_admission();
}

void Session::after_admission() {
  if (lv_.config->preread != Preread::none) {
    begin_preread();
  } else {
    route_and_connect(lv_.upstream);
  }
}

// Access control and limits, checked right after accept, before any byte is
// read or any server contacted. Returns false when the session was closed.
bool Session::admit() {
  const Config& cfg = *snapshot_->config;
  const ListenerConfig& lc = *lv_.config;
  const auto* peer = &peer_.sa;
  if ((!lc.deny.empty() && any_contains(lc.deny, peer)) || (!lc.allow.empty() && !any_contains(lc.allow, peer))) {
    refuse(Cause::acl_denied);
    return false;
  }
  if (snapshot_->registry->counters().connections.load(std::memory_order_relaxed) > cfg.global.max_connections ||
      (lc.max_connections > 0 && lv_.stats->active.load(std::memory_order_relaxed) > lc.max_connections)) {
    finish(Cause::limit_reached);
    return false;
  }
  if (lc.client_max_connections > 0 || lc.client_rate_limit.per_second > 0) {
    const ClientTable::Limits limits{lc.client_max_connections, lc.client_rate_limit.per_second};
    const Cause c = lv_.stats->clients.admit(peer, limits, uv_now(host_.loop()));
    if (c != Cause::none) {
      refuse(c);
      return false;
    }
    client_counted_ = lc.client_max_connections > 0;
  }
  return true;
}

// A refusal by policy (ACL, per-client limits) is counted by cause and
// reported in the error log at most once a second per cause, not with one
// access record per connection: a flood must not fill the disk.
void Session::refuse(Cause cause) {
  static RateLimitedWarning acl_warning;
  static RateLimitedWarning limit_warning;
  static RateLimitedWarning rate_warning;
  static RateLimitedWarning proxy_warning;
  RateLimitedWarning& w = cause == Cause::acl_denied     ? acl_warning
                          : cause == Cause::client_limit ? limit_warning
                          : cause == Cause::rate_limited ? rate_warning
                                                         : proxy_warning;
  w.warn(fmt::format("listener \"{}\": connection from {} refused ({})", lv_.config->name, client_address(),
                     to_string(cause)));
  quiet_ = true;
  finish(cause);
}

// ---- REFUSING --------------------------------------------------------------
//
// A client refused before any server answered (no server, a full or
// timed-out queue, a limit, the access list), on a listener that knows its
// clients' protocol, is told why in that protocol before the close
// (preread/refusal.hpp): its first message is read (PostgreSQL's startup
// packet, a Redis command; a MySQL client waits for the server to speak and
// is answered at once), within preread_timeout and a few KiB, then the
// error goes out. Every other refusal closes at once, as it always did.

bool Session::begin_refusal(Cause cause) {
  const ClientProtocol protocol = lv_.config->protocol;
  if (protocol == ClientProtocol::none || !preread::is_told_refusal(cause) || !client_.open()) return false;
  if (state_ != State::accepted && state_ != State::prereading && state_ != State::connecting) return false;
  std::atomic<std::uint64_t>& refusing = snapshot_->registry->counters().refusing;
  if (refusing.fetch_add(1, std::memory_order_relaxed) >= kMaxRefusing) {
    refusing.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  Extra& x = extra();
  x.refusing_counted = true;
  cause_ = cause;
  set_state(State::refusing);
  // Nothing of a server is kept: its connect, its count, a place in its queue.
  reactor().cancel(connector_);
  connector_.release();
  server_.close(false);
  x.pg_deadline_ms = 0;
  x.stage.reset();
  x.refusal = std::make_unique<preread::Refusal>(protocol, cause, refused_upstream(), connector_.met_full_queue());
  x.refuse_deadline_ms = uv_now(host_.loop()) + timer_ms(lv_.config->preread_timeout);
  // A preread's bytes are the start of the client's first message.
  const std::vector<std::uint8_t> seen = std::move(x.forward);
  x.forward = {};
  const preread::Refusal::Step step = x.refusal->feed(seen);
  if (!act_on_refusal(step.send, step.status == preread::Refusal::Status::done)) return true;
  if (!client_.registered && !register_client()) return true;
  arm_timer();
  read_refusal();
  return true;
}

// The upstream the client was refused from: the one routed to, else the
// listener's own (an admission refusal comes before any routing).
std::string Session::refused_upstream() const {
  if (const Upstream* up = connector_.origin()) return up->name();
  return lv_.upstream != nullptr ? lv_.upstream->name() : std::string();
}

void Session::read_refusal() {
  while (state_ == State::refusing && client_.readable) {
    Buffer* b = pool().get();
    const ssize_t n = ::recv(client_.fd, b->data, Buffer::kSize, 0);
    if (n > 0) {
      if (static_cast<std::size_t>(n) < Buffer::kSize && !client_.rdhup) client_.readable = false;
      const preread::Refusal::Step step =
          extra_->refusal->feed({reinterpret_cast<const std::uint8_t*>(b->data), static_cast<std::size_t>(n)});
      pool().put(b);
      if (!act_on_refusal(step.send, step.status == preread::Refusal::Status::done)) return;
      continue;
    }
    pool().put(b);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      client_.readable = false;
      return;
    }
    finish(cause_);  // the client left (or reset) before its first message was whole
    return;
  }
}

bool Session::act_on_refusal(const std::string& send, bool done) {
  // A few hundred bytes at most, on a socket that has taken next to nothing:
  // the kernel takes them whole, or the client is gone.
  if (!send.empty() && !write_whole(client_.fd, send.data(), send.size())) {
    finish(cause_);
    return false;
  }
  if (!done) return true;
  // What else the client sent is read and dropped: a close with unread
  // input is a reset, which could overtake the reply.
  char sink[4096];
  for (std::size_t dropped = 0; dropped < kRefusalDrain;) {
    const ssize_t n = ::recv(client_.fd, sink, sizeof sink, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    dropped += static_cast<std::size_t>(n);
  }
  finish(cause_);
  return false;
}

// ---- PREREADING ------------------------------------------------------------

void Session::begin_preread() {
  set_state(State::prereading);
  extra().stage = next_stage();
  if (!register_client()) return;
  arm_timer();
}

bool Session::register_client() {
  if (reactor().add(client_.fd, Reactor::kStream, &client_) < 0) {
    finish(Cause::local_resource);  // the kernel's epoll limits: ours
    return false;
  }
  client_.registered = true;
  return true;
}

// The listener's chain of stages, one after the other: the PROXY header
// (accept_proxy), then the protocol's (preread). Null at the end.
std::unique_ptr<PrereadStage> Session::next_stage() {
  std::uint8_t& step = extra().next_step;
  const ListenerConfig& lc = *lv_.config;
  if (step == 0) {
    step = 1;
    if (lc.accept_proxy) return std::make_unique<ProxyHeaderStage>();
  }
  if (step == 1) {
    step = 2;
    if (lc.preread == Preread::postgres) return std::make_unique<PostgresStage>(lv_, *snapshot_);
    if (lc.preread == Preread::tls) return std::make_unique<TlsStage>(lv_, *snapshot_);
  }
  return nullptr;
}

void Session::on_leg_io(Leg& leg, std::uint32_t events) {
  switch (state_) {
    case State::prereading:
      if (leg.is_client) read_preread();
      return;
    case State::refusing:
      if (leg.is_client) read_refusal();
      return;
    case State::connecting:
      // The client waits in the kernel until its pump starts (its flags keep
      // what the edges said); the server's events are the connect's, or
      // the answer to a PostgreSQL SSLRequest.
      if (leg.is_client) return;
      if (extra_ && extra_->pg_deadline_ms != 0) {
        on_pg_answer();
      } else {
        connector_.on_io(events);
      }
      return;
    case State::proxying: {
      if (spliced_) {
        splicer_->on_io(leg);
        return;
      }
      // Writes first: room at a destination lets its pump read on at once.
      Pump& writer = leg.is_client ? s2c_ : c2s_;
      Pump& reader = leg.is_client ? c2s_ : s2c_;
      if (leg.writable) writer.flush();
      if (closing()) return;
      if (leg.readable) reader.pull();
      return;
    }
    case State::accepted:
    case State::moving:
    case State::closing:
      return;
  }
}

// The client's bytes from the start of a preread until a stage routes the
// session. What the stages did not use goes to the server first; anything
// the client sends after that waits in the kernel for the pump.
void Session::read_preread() {
  while (state_ == State::prereading && client_.readable) {
    Buffer* b = pool().get();
    const ssize_t n = ::recv(client_.fd, b->data, Buffer::kSize, 0);
    if (n > 0) {
      if (static_cast<std::size_t>(n) < Buffer::kSize && !client_.rdhup) client_.readable = false;
      mark_read(true);
      on_preread_data(b->data, static_cast<std::size_t>(n));
      pool().put(b);
      continue;
    }
    pool().put(b);
    if (n == 0) {
      client_.readable = false;
      finish(Cause::client_closed);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      client_.readable = false;
      return;
    }
    finish(Cause::client_reset);
    return;
  }
}

void Session::on_preread_data(const char* data, std::size_t len) {
  touch();
  Extra& x = extra();
  PrereadStage& stage = *x.stage;
  const PrereadResult r = stage.feed({reinterpret_cast<const std::uint8_t*>(data), len});
  if (!r.reply.empty()) {
    // PostgreSQL's 'S': one byte on a socket we have not written to yet, so
    // the kernel takes it whole.
    if (!write_whole(client_.fd, r.reply.data(), r.reply.size())) {
      finish(Cause::client_reset);
      return;
    }
  }
  switch (r.kind) {
    case PrereadResult::Kind::need_more:
      return;
    case PrereadResult::Kind::close:
      x.sni = std::move(stage.sni);
      x.alpn = std::move(stage.alpn);
      if (*stage.error() != '\0') {
        SPDLOG_DEBUG("listener \"{}\" client {}: refused preread: {}", lv_.config->name, client_address(),
                     stage.error());
      }
      // What the client sent so far: a refusal told in its protocol reads on from there.
      if (lv_.config->protocol != ClientProtocol::none) x.forward = stage.take_forward();
      finish(r.cause);
      return;
    case PrereadResult::Kind::next:
      on_stage_done();
      return;
    case PrereadResult::Kind::route:
      break;
  }
  x.sni = std::move(stage.sni);
  x.alpn = std::move(stage.alpn);
  x.forward = stage.take_forward();
  x.pg_ssl = stage.server_needs_ssl_request();
  // The preread state is released now.
  x.stage.reset();
  if (lv_.default_route_stats) {
    x.route_stats = r.route >= 0 ? lv_.route_stats[static_cast<std::size_t>(r.route)].get()
                                 : lv_.default_route_stats.get();
    x.route_stats->sessions.fetch_add(1, std::memory_order_relaxed);
  }
  route_and_connect(r.upstream);
}

// A stage finished without routing. What it learnt of the client applies
// now: a PROXY header's address replaces the peer's for logs, hashing and
// the access checks, which waited for it (see begin()). The bytes it did not
// use go to the next stage, or to the listener's upstream at the end.
void Session::on_stage_done() {
  Extra& x = extra();
  std::unique_ptr<PrereadStage> done = std::move(x.stage);
  std::vector<std::uint8_t> rest = done->take_forward();
  copy_inet(&peer_, reinterpret_cast<const sockaddr*>(&done->client));
  copy_inet(&x.proxied_destination, reinterpret_cast<const sockaddr*>(&done->destination));
  const bool admit_now = done->names_client();
  done.reset();
  if (admit_now) {
    x.forward = std::move(rest);  // what a refusal told in the client's protocol reads first
    if (!admit()) return;
    rest = std::move(x.forward);
    x.forward = {};
  }
  x.stage = next_stage();
  if (!x.stage) {
    x.forward = std::move(rest);
    route_and_connect(lv_.upstream);
    return;
  }
  if (!rest.empty()) on_preread_data(reinterpret_cast<const char*>(rest.data()), rest.size());
}

// ---- CONNECTING ------------------------------------------------------------

void Session::route_and_connect(Upstream* up) {
  if (up == nullptr) {
    finish(Cause::internal_error);
    return;
  }
  set_state(State::connecting);
  connector_.start(up);
  if (closing() || client_.registered) return;
  // The client joins the set as soon as its server's connect is under way:
  // when the server is near (on the same host, always), the connect's end
  // and the client's first bytes then come with one wait instead of two.
  // Until the pump starts, its events only set the Leg's flags (on_leg_io).
  register_client();
}

std::string Session::client_address() const {
  if (peer_.sa.sa_family != AF_INET && peer_.sa.sa_family != AF_INET6) return {};
  return format_sockaddr(&peer_.sa);
}

std::string Session::client_ip() const { return format_ip(&peer_.sa); }

std::string Session::hash_key(const Upstream& up) const {
  const UpstreamConfig& uc = up.config();
  if (uc.balance != Balance::hash) return {};
  switch (uc.hash_key) {
    case HashKey::sni: return sni();
    case HashKey::client_ip: return client_ip();
    case HashKey::sni_or_client_ip: return sni().empty() ? client_ip() : sni();
  }
  return {};
}

Leg& Session::open_server(int fd) {
  server_.fd = fd;
  server_.registered = false;
  server_.readable = false;
  server_.writable = true;
  server_.rdhup = false;
  return server_;
}

void Session::close_server_for_retry() { server_.close(false); }

void Session::on_connected(bool at_once) {
  mark(Phase::connected);
  connected_ms_ = uv_now(host_.loop());
  connected_ = true;
  // Connected as connect(2) returned (on the first attempt, in the turn
  // that accepted the client), and the client's bytes never read (nothing
  // preread): they are most likely there already, sent right after the
  // client's own connect. One read now sends them on in this turn; if they
  // are not there it says EAGAIN, and their edge comes as it would have.
  if (at_once && lv_.config->preread == Preread::none && !lv_.config->accept_proxy) client_.readable = true;
  if (const Duration every = snapshot_->config->global.log_interval; every.count() > 0) {
    interim_at_ms_ = start_ms_ + timer_ms(every);
  }
  std::vector<std::uint8_t> head;
  if (const Upstream* up = connector_.upstream(); up != nullptr && up->config().proxy_protocol != ProxyProtocol::none) {
    append_proxy_header(head, up->config().proxy_protocol);
  }
  if (extra_ && extra_->pg_ssl) {
    begin_pg_handshake(std::move(head));
    return;
  }
  if (!head.empty()) {
    std::vector<std::uint8_t>& forward = extra().forward;
    head.insert(head.end(), forward.begin(), forward.end());
    forward = std::move(head);
  }
  start_proxying();
}

// The PROXY protocol header for the server goes before every other byte: the
// client's address (or the one a trusted proxy gave us) and the address it
// connected to.
void Session::append_proxy_header(std::vector<std::uint8_t>& out, ProxyProtocol version) {
  sockaddr_storage destination{};
  if (extra_) std::memcpy(&destination, &extra_->proxied_destination, sizeof extra_->proxied_destination);
  if (destination.ss_family == 0) {
    socklen_t len = sizeof destination;
    ::getsockname(client_.fd, reinterpret_cast<sockaddr*>(&destination), &len);
  }
  if (version == ProxyProtocol::v1) {
    preread::append_v1(out, &peer_.sa, reinterpret_cast<const sockaddr*>(&destination));
  } else {
    preread::append_v2(out, &peer_.sa, reinterpret_cast<const sockaddr*>(&destination), alpn(), sni());
  }
}

// preread = "postgres" after an SSLRequest: ask the chosen server for TLS the
// same way, and replay the ClientHello only once it has said 'S'. The wait is
// bounded by connect_timeout.
void Session::begin_pg_handshake(std::vector<std::uint8_t> head) {
  const auto req = preread::pg_ssl_request();
  head.insert(head.end(), req.begin(), req.end());
  // A few dozen bytes on a fresh connection: the kernel takes them whole.
  if (!write_whole(server_.fd, head.data(), head.size())) {
    finish(Cause::server_reset);
    return;
  }
  extra().pg_deadline_ms = uv_now(host_.loop()) + timer_ms(lv_.config->connect_timeout);
  arm_timer();
  if (server_.readable) on_pg_answer();
}

// The server's one-byte answer to our SSLRequest; its events come here
// until then (see on_leg_io).
void Session::on_pg_answer() {
  if (!server_.readable) return;
  Buffer* b = pool().get();
  const ssize_t n = ::recv(server_.fd, b->data, Buffer::kSize, 0);
  const char answer = n > 0 ? b->data[0] : '\0';
  pool().put(b);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    if (errno != EINTR) server_.readable = false;
    return;
  }
  if (n > 0 && static_cast<std::size_t>(n) < Buffer::kSize && !server_.rdhup) server_.readable = false;
  extra().pg_deadline_ms = 0;
  if (n == 1 && answer == 'S') {
    extra().pg_ssl = false;
    start_proxying();
  } else if (n > 0 && answer == 'N') {
    SPDLOG_DEBUG("listener \"{}\" client {}: the server refused TLS", lv_.config->name, client_address());
    finish(Cause::server_no_tls);
  } else {
    // EOF, an error, an error message, or bytes after 'S' (which a TLS
    // handshake must never find in its input).
    finish(Cause::server_reset);
  }
}

// ---- PROXYING --------------------------------------------------------------

void Session::start_proxying() {
  set_state(State::proxying);
  touch();
  if (extra_ && !extra_->forward.empty()) {
    // The preread bytes go to the server first, byte for byte.
    c2s_.queue_initial(extra_->forward.data(), extra_->forward.size());
    extra_->forward = {};
  }
  c2s_.start();
  if (closing()) return;
  s2c_.start();
  if (closing()) return;
  if (lv_.config->splice == Splice::pipe) {
    want_splice();  // arms the timer
  } else {
    arm_timer();
  }
}

// ---- SPLICE ----------------------------------------------------------------
//
// The switch happens from the session's timer, once both write queues are
// empty: nothing copied may be left behind a pipe.

bool Session::lv_splice_auto() const { return lv_.config->splice == Splice::automatic; }

bool Session::half_close() const { return lv_.config->half_close; }

void Session::want_splice() {
  splice_wanted_ = true;
  arm_timer();
}

// Both sockets quiet: no write, no preread replay and no shutdown in flight
// on either, and something left to move.
bool Session::splice_ready() const {
  if (state_ != State::proxying || (extra_ && !extra_->forward.empty())) return false;
  for (const Pump* p : {&c2s_, &s2c_}) {
    if (!p->drained() || (p->eof && !p->fin_sent)) return false;
  }
  return !(c2s_.eof && s2c_.eof);
}

void Session::switch_to_splice() {
  splice_wanted_ = false;
  c2s_.stop();
  s2c_.stop();
  c2s_.paused = false;
  s2c_.paused = false;
  splicer_ = std::make_unique<Splicer>();
  if (splicer_->start(c2s_, s2c_)) {
    spliced_ = true;
    return;
  }
  // Out of descriptors for a pipe: carry on copying. The Splicer stays
  // until the session ends, so that a switch is never tried twice.
  SPDLOG_DEBUG("listener \"{}\" client {}: splice unavailable, copying", lv_.config->name, client_address());
  if (!c2s_.eof) c2s_.start();
  if (closing()) return;
  if (!s2c_.eof) s2c_.start();
}

void Session::on_pump_eof(Pump& p) {
  if (!half_closed_) {
    half_closed_ = true;
    client_fin_first_ = p.src_is_client;
    touch();  // the FIN is activity: fin_timeout counts from it, not from the last byte before it
    arm_timer();
  }
}

// Without half-close the first FIN passed on ends the session: what the
// other side still sends is not read (nginx's proxy_half_close off). But a
// close(2) with unread input is a reset, and a reset throws away what the
// kernel has not sent yet: when bytes of ours still wait there (a slow
// reader's window is full), the FIN goes with shutdown(2) instead, and the
// session ends as with half-close. Bytes sent but not yet acknowledged are
// the receiver's already (loopback and most peers delay that ACK, so
// counting them would make the shortcut rare). One ioctl per session,
// instead of the shutdown, the server's EOF and the wake-up that brings it.
bool Session::fin_ends_session(const Pump& p) {
  if ((&p == &c2s_ ? s2c_ : c2s_).fin_sent) return true;
  if (half_close()) return false;
  int unsent = 0;
  if (::ioctl(p.dst->fd, SIOCOUTQNSD, &unsent) != 0 || unsent > 0) return false;
  cut_on_fin_ = true;
  return true;
}

void Session::on_pump_fin_sent(Pump& /*p*/) {
  if ((c2s_.fin_sent && s2c_.fin_sent) || cut_on_fin_) {
    finish(client_fin_first_ ? Cause::client_closed : Cause::server_closed);
  } else {
    on_pump_settled();
  }
}

void Session::on_pump_error(Pump& p, int err, bool at_dst) {
  bool client_side = at_dst ? !p.src_is_client : p.src_is_client;
  SPDLOG_DEBUG("listener \"{}\" client {}: {} {} error: {}", lv_.config->name, client_address(),
               p.src_is_client ? "client->server" : "server->client", at_dst ? "write" : "read", uv_strerror(err));
  // A side that already sent its FIN, all of whose bytes and its FIN have
  // been passed on, and that then refuses our remaining bytes has closed.
  // Anything else is a reset: in particular a FIN followed by a reset while
  // some of that side's bytes still wait for the other peer (a FIN now
  // would pass the cut-short stream off as complete).
  const Pump& from_side = client_side ? c2s_ : s2c_;
  if (from_side.fin_sent) {
    finish(client_side ? Cause::client_closed : Cause::server_closed);
  } else {
    finish(client_side ? Cause::client_reset : Cause::server_reset);
  }
}

// ---- timers ----------------------------------------------------------------

void Session::close_at(std::uint64_t at_ms, Cause cause) {
  if (state_ == State::closing) return;
  if (close_at_ms_ != 0 && close_at_ms_ <= at_ms) return;
  close_at_ms_ = at_ms == 0 ? 1 : at_ms;
  close_at_cause_ = cause;
  arm_timer();
}

void Session::arm_timer() {
  if (state_ == State::moving) return;
  const ListenerConfig& lc = *lv_.config;
  std::uint64_t deadline = 0;
  auto consider = [&deadline](std::uint64_t d) {
    if (d != 0 && (deadline == 0 || d < deadline)) deadline = d;
  };
  consider(close_at_ms_);
  switch (state_) {
    case State::prereading:
      consider(start_ms_ + timer_ms(lc.preread_timeout));
      break;
    case State::refusing:
      consider(extra_->refuse_deadline_ms);
      break;
    case State::connecting:
      consider(connector_.deadline_ms());
      if (extra_) consider(extra_->pg_deadline_ms);
      break;
    case State::proxying:
      if (splice_wanted_ && splice_ready()) consider(uv_now(host_.loop()));
      consider(interim_at_ms_);
      if (lc.max_lifetime.count() > 0) consider(start_ms_ + timer_ms(lc.max_lifetime));
      if (lc.tcp_keepalive && !server_keepalive_) consider(server_keepalive_at());
      if (recheck_ms_ != 0) {
        // An inactivity timeout is due but the kernel still held our bytes:
        // the recheck replaces it until then.
        consider(recheck_ms_);
        break;
      }
      if (lc.idle_timeout.count() > 0) consider(last_activity_ms_ + timer_ms(lc.idle_timeout));
      if (half_closed_) consider(last_activity_ms_ + timer_ms(lc.fin_timeout));
      break;
    case State::accepted:
    case State::moving:
    case State::closing:
      break;
  }
  if (deadline == 0) {
    host_.timers().cancel(timer_);
    return;
  }
  // A timer due no later than the new deadline is left alone: on_timer()
  // checks every deadline and re-arms when it fires early. Most sessions end
  // before their first deadline, so they arm the timer once and never move it.
  if (timer_.queued() && timer_.due <= deadline) return;
  host_.timers().arm(timer_, deadline);
}

// The server leg's TCP keepalive is set when the session has lasted half of
// tcp_keepalive_idle rather than at the connect: four setsockopt calls
// (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT) that a short
// session never needs, since no probe can be due before the idle time. Late
// costs nothing in detection: TCP_KEEPIDLE set after SO_KEEPALIVE re-arms the
// kernel's timer counting from the last packet received, not from the call,
// so the first probe goes when it would have gone had it been set at the
// connect (the timer fires with half the idle time still to go).
std::uint64_t Session::server_keepalive_at() const {
  return connected_ms_ + timer_ms(lv_.config->tcp_keepalive_idle) / 2;
}

void Session::fire_timer(void* owner) { static_cast<Session*>(owner)->on_timer(); }

void Session::on_timer() {
  if (state_ == State::moving) return;  // no deadline while moving; stay() arms them again
  const ListenerConfig& lc = *lv_.config;
  std::uint64_t now = uv_now(host_.loop());
  if (close_at_ms_ != 0 && now >= close_at_ms_) {
    finish(close_at_cause_);
    return;
  }
  switch (state_) {
    case State::prereading:
      if (now >= start_ms_ + timer_ms(lc.preread_timeout)) {
        finish(Cause::preread_timeout);
        return;
      }
      break;
    case State::refusing:
      if (now >= extra_->refuse_deadline_ms) {
        finish(cause_);  // the client's first message never came whole: nothing more to tell it
        return;
      }
      break;
    case State::connecting:
      if (connector_.deadline_ms() != 0 && now >= connector_.deadline_ms()) {
        connector_.on_timeout();
        return;
      }
      if (extra_ && extra_->pg_deadline_ms != 0 && now >= extra_->pg_deadline_ms) {
        finish(Cause::connect_failed);  // the server did not answer the SSLRequest in time
        return;
      }
      break;
    case State::proxying:
      if (splice_wanted_ && splice_ready()) {
        switch_to_splice();
        if (closing()) return;
      }
      if (interim_at_ms_ != 0 && now >= interim_at_ms_) {
        interim_at_ms_ = now + timer_ms(snapshot_->config->global.log_interval);
        count_bytes(true);
        if (snapshot_->access_log->enabled()) write_access_record(true);
      }
      if (lc.max_lifetime.count() > 0 && now >= start_ms_ + timer_ms(lc.max_lifetime)) {
        finish(Cause::max_lifetime);
        return;
      }
      if (lc.tcp_keepalive && !server_keepalive_ && now >= server_keepalive_at()) {
        // Set late, counted from the last packet received: see server_keepalive_at().
        server_keepalive_ = true;
        if (server_.fd >= 0) set_keepalive(server_.fd, lc);
      }
      if (recheck_ms_ != 0) {
        if (now < recheck_ms_) break;  // woke early for another deadline
        recheck_ms_ = 0;
      }
      // After a FIN, fin_timeout is an inactivity timeout: every byte moved
      // either way re-arms it (HAProxy's client-fin/server-fin).
      if ((half_closed_ && now >= last_activity_ms_ + timer_ms(lc.fin_timeout)) ||
          (lc.idle_timeout.count() > 0 && now >= last_activity_ms_ + timer_ms(lc.idle_timeout))) {
        const Duration timeout = half_closed_ && now >= last_activity_ms_ + timer_ms(lc.fin_timeout) ? lc.fin_timeout
                                                                                              : lc.idle_timeout;
        switch (peers_draining()) {
          case Drain::moving:
            recheck_ms_ = 0;
            touch();  // a peer is still taking bytes out of the kernel's buffers
            break;
          case Drain::unknown:
            // Bytes are queued but we have no earlier sample: look again soon.
            recheck_ms_ = now + std::max<std::uint64_t>(timer_ms(timeout) / 4, 10);
            break;
          case Drain::stalled:
            finish(timeout == lc.fin_timeout && half_closed_ ? Cause::fin_timeout : Cause::idle_timeout);
            return;
        }
      }
      break;
    case State::accepted:
    case State::moving:
    case State::closing:
      return;
  }
  arm_timer();  // woke early (activity moved a deadline): sleep until the next one
}

// Bytes we wrote may still sit in the kernel's send buffers (megabytes on
// loopback) while a slow peer reads them: that is activity too, invisible to
// our reads and writes. Checked only when an inactivity timeout is due, so it
// costs nothing on the data path: a send queue that shrank since the last
// check means the peer is reading. A queue that emptied since the last check
// moved too: its last bytes left only now, and the peer may still be reading
// them out of its own receive buffer.
Session::Drain Session::peers_draining() {
  Drain out = Drain::stalled;
  auto check = [&out](const Leg& leg, std::uint32_t& last) {
    int queued = 0;
    if (!leg.open() || ::ioctl(leg.fd, SIOCOUTQ, &queued) != 0) return;
    const auto q = static_cast<std::uint32_t>(queued);
    if (q > 0 && last == kUnsampled && out == Drain::stalled) out = Drain::unknown;
    if (last != kUnsampled && q != last) out = Drain::moving;
    last = q;
  };
  check(client_, outq_client_);
  check(server_, outq_server_);
  return out;
}

// ---- CLOSED ----------------------------------------------------------------

void Session::finish(Cause cause) {
  if (state_ == State::closing) return;
  if (state_ == State::moving) {
    // The new process may have it already: only if it stays here does it
    // end, and then for the first reason given.
    if (moving_end_ == Cause::none) moving_end_ = cause;
    return;
  }
  if (state_ != State::refusing && begin_refusal(cause)) return;
  cause_ = cause;
  set_state(State::closing);
  c2s_.stop();
  s2c_.stop();
  reactor().cancel(connector_);
  host_.timers().cancel(timer_);
  connector_.release();
  if (extra_) {
    extra_->stage.reset();
    extra_->refusal.reset();
    if (extra_->refusing_counted) {
      extra_->refusing_counted = false;
      snapshot_->registry->counters().refusing.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (splicer_) splicer_->close();
  // A peer that aborted is reported to the other peer the only way TCP can:
  // with a reset. A FIN would tell it the stream was complete.
  client_.close(cause == Cause::server_reset);
  server_.close(cause == Cause::client_reset && connected_);

  snapshot_->registry->counters().closed.add(cause_);
  lv_.stats->closed.add(cause_);
  count_bytes(false);
  // Sessions refused by policy are counted by cause, not timed.
  if (!quiet_) lv_.stats->session_seconds.observe(static_cast<double>(uv_now(host_.loop()) - start_ms_) / 1000.0);
  if (client_counted_) lv_.stats->clients.release(&peer_.sa);
  uncount();
  if (!quiet_ && snapshot_->access_log->enabled()) write_access_record();
  host_.unlink(*this);
  host_.retire(*this);
}

// Adds what moved since the last call to the listener's and the server's
// byte counters: at the end, and at each interim record (log_interval), so
// that a long session shows in /metrics before it ends without an atomic
// add per send.
void Session::count_bytes(bool again) {
  const std::uint64_t in = c2s_.bytes - (extra_ ? extra_->counted_in : 0);
  const std::uint64_t out = s2c_.bytes - (extra_ ? extra_->counted_out : 0);
  if (in == 0 && out == 0) return;
  if (again || extra_) {
    Extra& x = extra();
    x.counted_in = c2s_.bytes;
    x.counted_out = s2c_.bytes;
  }
  lv_.stats->bytes_in.fetch_add(in, std::memory_order_relaxed);
  lv_.stats->bytes_out.fetch_add(out, std::memory_order_relaxed);
  if (ServerState* st = connector_.server(); st != nullptr && connected_) {
    st->bytes_in.fetch_add(in, std::memory_order_relaxed);
    st->bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
  if (RouteStats* rs = extra_ ? extra_->route_stats : nullptr; rs != nullptr) {
    rs->bytes_in.fetch_add(in, std::memory_order_relaxed);
    rs->bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
}

void Session::write_access_record(bool interim) {
  const std::uint64_t now = uv_now(host_.loop());
  const std::string client = client_address();
  AccessRecord r;
  r.listener = lv_.config->name;
  r.client = client;
  if (const ServerState* st = connector_.server()) r.server = st->address.text;
  if (const Upstream* up = connector_.upstream()) r.upstream = up->name();
  r.fallback = connector_.used_fallback();
  r.sni = sni();
  r.alpn = alpn();
  r.tries = connector_.attempts();
  r.bytes_in = c2s_.bytes;
  r.bytes_out = s2c_.bytes;
  r.connect_ms = connected_ ? static_cast<std::int64_t>(connected_ms_ - start_ms_) : -1;
  r.duration_ms = static_cast<std::int64_t>(now - start_ms_);
  r.cause = cause_;
  r.interim = interim;
  if (timed_) {
    if (!interim) mark(Phase::close);
    r.phases = &extra_->phases;
  }
  snapshot_->access_log->write(r);
}

}  // namespace sluice

namespace sluice {

// ---- binary upgrade --------------------------------------------------------
//
// A session moves between two rounds of its worker. What the kernel holds
// stays in the sockets' buffers and is read by the new process; what
// sluice holds (bytes read and not yet written, in copy mode) goes along in
// a memory file and is written first there. A splice pipe cannot go along
// as bytes without being emptied, so a spliced session waits until its
// pipes are empty.

bool Session::movable() const {
  if (state_ != State::proxying || unmovable_ || half_closed_ || close_at_ms_ != 0) return false;
  if (extra_ && (!extra_->forward.empty() || extra_->pg_deadline_ms != 0)) return false;
  if (c2s_.eof || s2c_.eof || c2s_.fin_sent || s2c_.fin_sent) return false;
  if (!client_.open() || !server_.open()) return false;
  return !spliced_ || splicer_->idle();
}

bool Session::hand_over_message(upgrade::Message& out, std::uint64_t worker, std::uint64_t seq) const {
  const std::uint64_t now = uv_now(host_.loop());
  upgrade::SessionRecord r;
  r.worker = worker;
  r.seq = seq;
  r.listener = lv_.config->name;
  if (const Upstream* up = connector_.upstream()) r.upstream = up->name();
  if (const Upstream* origin = connector_.origin()) r.origin_upstream = origin->name();
  if (const ServerState* st = connector_.server()) r.server_identity = server_identity(st->address);
  if (peer_.sa.sa_family == AF_INET) r.peer.assign(reinterpret_cast<const char*>(&peer_.in4), sizeof peer_.in4);
  if (peer_.sa.sa_family == AF_INET6) r.peer.assign(reinterpret_cast<const char*>(&peer_.in6), sizeof peer_.in6);
  if (extra_) {
    const SockAddr& d = extra_->proxied_destination;
    if (d.sa.sa_family == AF_INET) r.destination.assign(reinterpret_cast<const char*>(&d.in4), sizeof d.in4);
    if (d.sa.sa_family == AF_INET6) r.destination.assign(reinterpret_cast<const char*>(&d.in6), sizeof d.in6);
  }
  r.sni = sni();
  r.alpn = alpn();
  r.bytes_in = c2s_.bytes;
  r.bytes_out = s2c_.bytes;
  r.age_ms = now - start_ms_;
  r.connect_ms = connected_ ? connected_ms_ - start_ms_ : 0;
  r.idle_ms = now >= last_activity_ms_ ? now - last_activity_ms_ : 0;
  r.tries = connector_.attempts();
  std::string pending;
  c2s_.append_queued(pending);
  r.pending_in = pending.size();
  s2c_.append_queued(pending);
  r.pending_out = pending.size() - r.pending_in;
  int pending_fd = -1;
  if (!pending.empty()) {
    pending_fd = ::memfd_create("sluice-pending", MFD_CLOEXEC);
    if (pending_fd < 0) return false;
    std::size_t at = 0;
    while (at < pending.size()) {
      const ssize_t n = ::write(pending_fd, pending.data() + at, pending.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(pending_fd);
        return false;
      }
      at += static_cast<std::size_t>(n);
    }
  }
  out = r.to_message(client_.fd, server_.fd, pending_fd);
  return true;
}

void Session::begin_move() {
  set_state(State::moving);
  c2s_.hold();
  s2c_.hold();
  reactor().cancel(connector_);
  host_.timers().cancel(timer_);
  if (spliced_) {
    // Its pipes are empty (movable()): should it stay, it copies.
    splicer_->close();
    spliced_ = false;
  }
  // The new process may read and write these sockets from now on: out of
  // this epoll set (the descriptors stay open, in case it does not).
  for (Leg* leg : {&client_, &server_}) {
    if (leg->registered) reactor().remove(leg->fd);
    leg->registered = false;
  }
}

void Session::moved() {
  if (state_ == State::closing) return;
  set_state(State::closing);
  c2s_.stop();
  s2c_.stop();
  reactor().cancel(connector_);
  host_.timers().cancel(timer_);
  connector_.release();  // this process's count; the new one counts it now
  if (splicer_) splicer_->close();
  // The new process holds the same sockets: out of this epoll set first
  // (a close(2) leaves it there while another descriptor refers to the
  // socket), then this process's descriptors go, with neither FIN nor reset.
  for (Leg* leg : {&client_, &server_}) {
    if (leg->registered) reactor().remove(leg->fd);
    leg->registered = false;
    leg->close(false);
  }
  if (client_counted_) {
    // Its client counts in the new process now (client_max_connections).
    lv_.stats->clients.release(&peer_.sa);
    client_counted_ = false;
  }
  count_bytes(false);  // this process's figures, up to now
  uncount();
  host_.unlink(*this);
  host_.retire(*this);
}

void Session::stay(bool declined) {
  if (state_ != State::moving) return;
  unmovable_ = declined;
  set_state(State::proxying);
  for (Leg* leg : {&client_, &server_}) {
    if (reactor().add(leg->fd, Reactor::kStream, leg) < 0) {
      finish(Cause::local_resource);  // the kernel's epoll limits: ours
      return;
    }
    leg->registered = true;
    // Whatever arrived meanwhile waits in the kernel; a write that meets a
    // full buffer clears the flag again.
    leg->readable = true;
    leg->writable = true;
  }
  if (moving_end_ != Cause::none) {
    finish(moving_end_);
    return;
  }
  c2s_.start();
  if (closing()) return;
  s2c_.start();
  if (closing()) return;
  arm_timer();
}

Session* Session::adopt(SessionHost& host, std::shared_ptr<const Snapshot> snapshot, const ListenerView& lv,
                        int client_fd, int server_fd, int pending_fd, const upgrade::SessionRecord& r) {
  // The bytes the old process had read and not written: first out here.
  std::string pending;
  if (pending_fd >= 0) {
    pending.resize(r.pending_in + r.pending_out);
    std::size_t at = 0;
    while (at < pending.size()) {
      const ssize_t n = ::pread(pending_fd, pending.data() + at, pending.size() - at, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    // Bytes of the stream would be lost: carrying on would corrupt it.
    if (at != pending.size()) return nullptr;
  }
  auto* s = new Session(host, std::move(snapshot), lv);
  auto give_back = [s] {
    for (Leg* leg : {&s->client_, &s->server_}) {
      if (leg->registered) s->reactor().remove(leg->fd);
      leg->fd = -1;  // still the caller's
    }
    delete s;
    return nullptr;
  };
  s->client_.fd = client_fd;
  s->server_.fd = server_fd;
  for (Leg* leg : {&s->client_, &s->server_}) {
    if (s->reactor().add(leg->fd, Reactor::kStream, leg) < 0) return give_back();
    leg->registered = true;
    // The old process holds these sockets until it hears that they
    // arrived; a close here before then must not leave them in the set.
    leg->shared = true;
  }
  if (r.peer.size() == sizeof(sockaddr_in) || r.peer.size() == sizeof(sockaddr_in6)) {
    std::memcpy(&s->peer_, r.peer.data(), r.peer.size());
  }
  // The client's open sessions count here as they did in the old process,
  // so client_max_connections stays exact once they have moved. Never
  // refused: the session is open already (only a table full of open
  // clients leaves it uncounted).
  if (lv.config->client_max_connections > 0 && s->peer_.sa.sa_family != AF_UNSPEC) {
    const ClientTable::Limits count_only{std::numeric_limits<std::uint32_t>::max(), 0};
    s->client_counted_ = lv.stats->clients.admit(&s->peer_.sa, count_only, uv_now(host.loop())) == Cause::none;
  }
  s->counted_ = true;
  s->snapshot_->registry->counters().connections.fetch_add(1, std::memory_order_relaxed);
  raise_peak(lv.stats->peak_active, lv.stats->active.fetch_add(1, std::memory_order_relaxed) + 1);
  host.link(*s);
  const std::uint64_t now = uv_now(host.loop());
  s->start_ms_ = now - std::min(r.age_ms, now);
  s->last_activity_ms_ = now - std::min(r.idle_ms, now);
  s->connected_ = true;
  s->connected_ms_ = s->start_ms_ + std::min(r.connect_ms, r.age_ms);
  // The old process counted these bytes in its own counters.
  s->c2s_.bytes = r.bytes_in;
  s->s2c_.bytes = r.bytes_out;
  if (r.bytes_in != 0 || r.bytes_out != 0) {
    Extra& x = s->extra();
    x.counted_in = r.bytes_in;
    x.counted_out = r.bytes_out;
  }
  if (!r.sni.empty() || !r.alpn.empty() || !r.destination.empty()) {
    Extra& x = s->extra();
    x.sni = r.sni;
    x.alpn = r.alpn;
    if (r.destination.size() == sizeof(sockaddr_in) || r.destination.size() == sizeof(sockaddr_in6)) {
      std::memcpy(&x.proxied_destination, r.destination.data(), r.destination.size());
    }
  }
  if (Upstream* up = s->snapshot_->find_upstream(r.upstream); up != nullptr && !r.server_identity.empty()) {
    for (std::size_t i = 0; i < up->size(); ++i) {
      if (server_identity(up->server(i).address) == r.server_identity) {
        Upstream* origin = r.origin_upstream.empty() ? nullptr : s->snapshot_->find_upstream(r.origin_upstream);
        s->connector_.adopt(up, origin, static_cast<long>(i), static_cast<unsigned>(r.tries));
        break;
      }
    }
  }
  if (const Duration every = s->snapshot_->config->global.log_interval; every.count() > 0) {
    s->interim_at_ms_ = now + timer_ms(every);
  }
  // Queued now, written first once it runs; until then its events only
  // mark the sockets ready (state accepted).
  s->c2s_.queue_initial(reinterpret_cast<const std::uint8_t*>(pending.data()), r.pending_in);
  s->s2c_.queue_initial(reinterpret_cast<const std::uint8_t*>(pending.data()) + r.pending_in, r.pending_out);
  return s;
}

void Session::run_adopted() {
  // Whatever arrived meanwhile waits in the kernel: read at once.
  client_.readable = true;
  server_.readable = true;
  start_proxying();
}

}  // namespace sluice
