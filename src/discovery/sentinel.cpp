#include "discovery/sentinel.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "config/quote.hpp"
#include "config/values.hpp"
#include "discovery/resp.hpp"
#include "discovery/run_until.hpp"
#include "sluice/address.hpp"

namespace sluice::discovery {

namespace {

std::int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::uint64_t timer_ms(Duration d) { return d.count() <= 0 ? 0 : static_cast<std::uint64_t>(d.count()); }

// Peer text in a log line or status field: quoted (control bytes escaped)
// and cut short.
std::string peer_text(std::string_view text) {
  constexpr std::size_t kMax = 80;
  return quote(text.substr(0, kMax)) + (text.size() > kMax ? "..." : "");
}

uv_timer_t* new_timer(uv_loop_t* loop, void* data) {
  auto* t = new uv_timer_t;
  uv_timer_init(loop, t);
  t->data = data;
  return t;
}

void close_timer(uv_timer_t*& t) {
  if (t == nullptr) return;
  uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
  t = nullptr;
}

// The first line of password_file, read at each connection so a rotated
// file takes effect without a reload.
bool read_password(const std::string& path, std::string& out, std::string& error) {
  out.clear();
  if (path.empty()) return true;
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot read password_file " + path + ": " + std::strerror(errno != 0 ? errno : EIO);
    return false;
  }
  if (!std::getline(in, out) || out.empty()) {
    error = "password_file " + path + " is empty";
    return false;
  }
  if (out.back() == '\r') out.pop_back();
  return true;
}

// One TCP connection to a sentinel: connects, writes `request`, hands each
// reply to on_reply. A failure (refused, reset, closed, deadline, a reply
// over the caps) calls on_fail once, after the connection is closed. After
// close() neither runs. It deletes itself once its handles are closed.
class Conn {
 public:
  using Reply = std::function<void(const RespValue&)>;
  using Fail = std::function<void(const std::string&)>;

  static Conn* start(uv_loop_t* loop, const Endpoint& to, std::string request, Reply on_reply, Fail on_fail) {
    auto* c = new Conn;
    c->request_ = std::move(request);
    c->on_reply_ = std::move(on_reply);
    c->on_fail_ = std::move(on_fail);
    uv_tcp_init(loop, &c->tcp_);
    c->tcp_.data = c;
    uv_timer_init(loop, &c->timer_);
    c->timer_.data = c;
    c->open_ = 2;
    c->connect_.data = c;
    const int rc = uv_tcp_connect(&c->connect_, &c->tcp_, reinterpret_cast<const sockaddr*>(&to.addr), on_connect);
    if (rc < 0) {
      // Reported from the loop, never from inside the caller.
      c->pending_ = uv_strerror(rc);
      uv_timer_start(&c->timer_, on_deadline, 0, 0);
    } else {
      uv_timer_start(&c->timer_, on_deadline, timer_ms(kSentinelTimeout), 0);
    }
    return c;
  }

  // The connection is established as its user wants it (subscribed): no
  // deadline any more.
  void settle() { uv_timer_stop(&timer_); }

  void close() {
    if (closing_) return;
    // The callbacks stay until the object is deleted: close() may be
    // called from inside on_reply_, whose captures must outlive the call.
    // closing_ keeps them from running again.
    closing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), on_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), on_closed);
  }

 private:
  // Bytes of replies held at most: one reply at its caps, and some.
  static constexpr std::size_t kMaxBuffered = kRespMaxBulk + 4096;

  Conn() = default;

  void fail(const std::string& reason) {
    if (closing_) return;
    Fail f = std::move(on_fail_);
    close();
    if (f) f(reason);
  }

  static void on_closed(uv_handle_t* h) {
    auto* c = static_cast<Conn*>(h->data);
    if (--c->open_ == 0) delete c;
  }

  static void on_deadline(uv_timer_t* t) {
    auto* c = static_cast<Conn*>(t->data);
    c->fail(c->pending_.empty() ? "no answer within " + format_duration(kSentinelTimeout) : c->pending_);
  }

  static void on_connect(uv_connect_t* req, int status) {
    auto* c = static_cast<Conn*>(req->data);
    if (c->closing_) return;
    if (status < 0) {
      c->fail(uv_strerror(status));
      return;
    }
    // A sentinel host that vanishes without a reset is found by keepalive
    // (and by the periodic poll meanwhile).
    uv_tcp_nodelay(&c->tcp_, 1);
    uv_tcp_keepalive(&c->tcp_, 1, 10);
    struct Write {
      uv_write_t req{};
      std::string data;
    };
    auto* w = new Write;
    w->data = std::move(c->request_);
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    w->req.data = w;
    const int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->tcp_), &buf, 1,
                            [](uv_write_t* r, int) { delete static_cast<Write*>(r->data); });
    if (rc < 0) {
      delete w;
      c->fail(uv_strerror(rc));
      return;
    }
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp_),
                  [](uv_handle_t* h, std::size_t, uv_buf_t* b) {
                    auto* cc = static_cast<Conn*>(h->data);
                    *b = uv_buf_init(cc->read_buf_, sizeof cc->read_buf_);
                  },
                  on_read);
  }

  static void on_read(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    auto* c = static_cast<Conn*>(s->data);
    if (c->closing_ || n == 0) return;
    if (n < 0) {
      c->fail(n == UV_EOF ? "the sentinel closed the connection" : uv_strerror(static_cast<int>(n)));
      return;
    }
    c->in_.append(buf->base, static_cast<std::size_t>(n));
    while (!c->closing_ && !c->in_.empty()) {
      RespValue v;
      std::size_t used = 0;
      std::string error;
      const RespResult r = parse_resp(c->in_, v, used, error);
      if (r == RespResult::bad) {
        c->fail("a bad reply: " + error);
        return;
      }
      if (r == RespResult::more) break;
      c->in_.erase(0, used);
      c->on_reply_(v);
    }
    if (!c->closing_ && c->in_.size() > kMaxBuffered) {
      c->fail("a reply over " + std::to_string(kMaxBuffered) + " bytes");
    }
  }

  uv_tcp_t tcp_{};
  uv_timer_t timer_{};
  uv_connect_t connect_{};
  int open_ = 0;
  bool closing_ = false;
  std::string pending_;
  std::string request_;
  std::string in_;
  char read_buf_[16384];
  Reply on_reply_;
  Fail on_fail_;
};

// The master address in a get-master-addr-by-name reply, or "" and why not.
std::string master_of(const RespValue& v, const std::string& master, std::string& why) {
  if (v.type == RespValue::Type::array && v.items.size() == 2 && v.items[0].type == RespValue::Type::bulk &&
      v.items[1].type == RespValue::Type::bulk) {
    std::string addr = sentinel_address(v.items[0].text, v.items[1].text);
    if (addr.empty()) why = "a master address that is not numeric: " + peer_text(v.items[0].text + ":" + v.items[1].text);
    return addr;
  }
  if (v.type == RespValue::Type::null) {
    why = "it does not know master " + quote(master);
  } else if (v.type == RespValue::Type::error) {
    why = "it answered " + peer_text(v.text);
  } else {
    why = "an unexpected reply";
  }
  return {};
}

bool is_text(const RespValue& v, std::string_view want) {
  return (v.type == RespValue::Type::bulk || v.type == RespValue::Type::simple) && v.text == want;
}

}  // namespace

std::string sentinel_address(const std::string& ip, const std::string& port) {
  in_addr a4{};
  in6_addr a6{};
  const bool v4 = ::inet_pton(AF_INET, ip.c_str(), &a4) == 1;
  const bool v6 = !v4 && ::inet_pton(AF_INET6, ip.c_str(), &a6) == 1;
  if (!v4 && !v6) return {};
  if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return {};
  }
  std::string error;
  // Numeric: the parser looks nothing up.
  const std::optional<Endpoint> ep = parse_address(v6 ? "[" + ip + "]:" + port : ip + ":" + port, false, error);
  if (!ep) return {};
  return format_sockaddr(reinterpret_cast<const sockaddr*>(&ep->addr));
}

std::string switched_to(const std::string& message, const std::string& master) {
  std::istringstream in(message);
  std::string name, old_ip, old_port, new_ip, new_port, extra;
  if (!(in >> name >> old_ip >> old_port >> new_ip >> new_port) || (in >> extra) || name != master) return {};
  return sentinel_address(new_ip, new_port);
}

class Sentinels::Watch {
 public:
  Watch(Sentinels* owner, std::string upstream, SentinelConfig config, std::string master)
      : owner_(owner), upstream_(std::move(upstream)), config_(std::move(config)), master_(std::move(master)) {
    poll_timer_ = new_timer(owner_->loop_, this);
    sub_timer_ = new_timer(owner_->loop_, this);
    poll_round();
    sub_connect();
  }

  ~Watch() {
    if (poll_ != nullptr) poll_->close();
    if (sub_ != nullptr) sub_->close();
    close_timer(poll_timer_);
    close_timer(sub_timer_);
  }

  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  const SentinelConfig& config() const { return config_; }
  const std::string& master() const { return master_; }
  bool settled() const { return asked_ || !master_.empty(); }

  DnsEntryStatus status() const {
    DnsEntryStatus st;
    st.upstream = upstream_;
    st.entry = "sentinel " + config_.master;
    st.type = "sentinel";
    st.name = config_.master;
    if (!master_.empty()) st.servers.push_back(master_);
    st.next_refresh_ms = next_poll_ms_;
    st.last_answer_ms = last_answer_ms_;
    st.last_error = last_error_;
    st.last_error_ms = last_error_ms_;
    return st;
  }

 private:
  std::string label(std::size_t index) const { return "sentinel " + config_.addresses[index].text; }

  std::string request(const std::string& password, bool subscribe) const {
    std::string out;
    if (!password.empty()) out += resp_command({"AUTH", password});
    out += resp_command({"SENTINEL", "get-master-addr-by-name", config_.master});
    if (subscribe) out += resp_command({"SUBSCRIBE", "+switch-master"});
    return out;
  }

  void note_error(const std::string& what) {
    ++owner_->errors_;
    last_error_ = what;
    last_error_ms_ = wall_now_ms();
  }

  // A sentinel named `addr` as the master.
  void answered(const std::string& addr, const std::string& via) {
    last_answer_ms_ = wall_now_ms();
    if (addr == master_) return;
    const std::string old = std::exchange(master_, addr);
    if (old.empty()) {
      spdlog::info("sentinel: upstream \"{}\" master {} is {} ({})", upstream_, quote(config_.master), addr, via);
    } else {
      spdlog::warn("sentinel: upstream \"{}\" master {} moved from {} to {} ({}): sessions on {} are closed", upstream_,
                   quote(config_.master), old, addr, via, old);
      owner_->replaced_.emplace_back(upstream_, old);
    }
    owner_->changed();
  }

  // --- the safety-net poll: each sentinel in order, first answer wins ---

  // One round over the sentinels. It starts at the one the subscription is
  // on, when there is one: that sentinel sent the last +switch-master, so
  // its answer agrees with it, while another may not have heard of a
  // failover yet and would name the old master for a moment.
  void poll_round() {
    poll_tried_ = 0;
    poll_from(subscribed_ ? sub_index_ : 0);
  }

  void poll_from(std::size_t index) {
    poll_index_ = index;
    ++poll_tried_;
    std::string password, error;
    if (!read_password(config_.password_file, password, error)) {
      poll_failed(error);
      return;
    }
    ++owner_->queries_;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    poll_ = Conn::start(
        owner_->loop_, config_.addresses[index], request(password, false),
        [this, step](const RespValue& v) {
          if ((*step)++ == 0) {
            if (v.type == RespValue::Type::error) poll_failed("AUTH failed: " + peer_text(v.text));
            return;
          }
          std::string why;
          const std::string addr = master_of(v, config_.master, why);
          if (addr.empty()) {
            poll_failed(why);
            return;
          }
          poll_->close();
          poll_ = nullptr;
          answered(addr, "asked " + label(poll_index_));
          poll_round_done(true);
        },
        [this](const std::string& reason) {
          poll_ = nullptr;
          poll_failed(reason);
        });
  }

  void poll_failed(const std::string& reason) {
    if (poll_ != nullptr) {
      poll_->close();
      poll_ = nullptr;
    }
    note_error(label(poll_index_) + ": " + reason);
    if (poll_tried_ < config_.addresses.size()) {
      poll_from((poll_index_ + 1) % config_.addresses.size());
      return;
    }
    if (!poll_failing_) {
      spdlog::warn("sentinel: upstream \"{}\": no sentinel named master {} (last: {}); {}", upstream_,
                   quote(config_.master), last_error_,
                   master_.empty() ? "no server until one does" : "keeping " + master_);
    }
    poll_failing_ = true;
    poll_round_done(false);
  }

  void poll_round_done(bool ok) {
    if (ok && poll_failing_) {
      spdlog::info("sentinel: upstream \"{}\": the sentinels answer again", upstream_);
      poll_failing_ = false;
    }
    if (ok) last_error_.clear();
    asked_ = true;
    const Duration next = ok ? kSentinelPoll : kSentinelTimeout;
    next_poll_ms_ = wall_now_ms() + next.count();
    uv_timer_start(poll_timer_, [](uv_timer_t* t) { static_cast<Watch*>(t->data)->poll_round(); }, timer_ms(next), 0);
  }

  // --- the subscription to +switch-master ---

  void sub_connect() {
    std::string password, error;
    if (!read_password(config_.password_file, password, error)) {
      sub_failed(error);
      return;
    }
    ++owner_->queries_;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    sub_ = Conn::start(
        owner_->loop_, config_.addresses[sub_index_], request(password, true),
        [this, step](const RespValue& v) {
          const int at = (*step)++;
          if (at == 0) {
            if (v.type == RespValue::Type::error) sub_failed("AUTH failed: " + peer_text(v.text));
            return;
          }
          if (at == 1) {
            std::string why;
            const std::string addr = master_of(v, config_.master, why);
            if (addr.empty()) {
              sub_failed(why);
              return;
            }
            answered(addr, "asked " + label(sub_index_));
            return;
          }
          if (v.type != RespValue::Type::array || v.items.size() != 3) {
            sub_failed("an unexpected message on the subscription");
            return;
          }
          if (at == 2) {
            if (!is_text(v.items[0], "subscribe")) {
              sub_failed("SUBSCRIBE was not confirmed");
              return;
            }
            sub_->settle();
            subscribed_ = true;
            backoff_ = kFirstBackoff;
            spdlog::info("sentinel: upstream \"{}\" follows +switch-master at {}", upstream_, label(sub_index_));
            return;
          }
          if (!is_text(v.items[0], "message") || !is_text(v.items[1], "+switch-master")) return;
          const std::string addr = switched_to(v.items[2].text, config_.master);
          if (!addr.empty()) answered(addr, "+switch-master from " + label(sub_index_));
        },
        [this](const std::string& reason) {
          sub_ = nullptr;
          sub_failed(reason);
        });
  }

  void sub_failed(const std::string& reason) {
    if (sub_ != nullptr) {
      sub_->close();
      sub_ = nullptr;
    }
    if (subscribed_) {
      subscribed_ = false;
      spdlog::warn("sentinel: upstream \"{}\": the subscription at {} ended ({}); subscribing again", upstream_,
                   label(sub_index_), reason);
      sub_index_ = 0;
    } else {
      note_error(label(sub_index_) + ": " + reason);
      if (sub_index_ + 1 < config_.addresses.size()) {
        ++sub_index_;
        sub_connect();
        return;
      }
      sub_index_ = 0;
    }
    const Duration wait = backoff_;
    backoff_ = std::min<Duration>(backoff_ * 2, kMaxBackoff);
    uv_timer_start(sub_timer_, [](uv_timer_t* t) { static_cast<Watch*>(t->data)->sub_connect(); }, timer_ms(wait), 0);
  }

  static constexpr Duration kFirstBackoff = std::chrono::milliseconds(100);
  static constexpr Duration kMaxBackoff = std::chrono::seconds(5);

  Sentinels* owner_;
  std::string upstream_;
  SentinelConfig config_;
  std::string master_;  // canonical "ip:port"; empty until a sentinel names it
  bool asked_ = false;  // a first poll round has ended
  Conn* poll_ = nullptr;
  std::size_t poll_index_ = 0;
  std::size_t poll_tried_ = 0;  // sentinels asked in this round
  bool poll_failing_ = false;
  Conn* sub_ = nullptr;
  std::size_t sub_index_ = 0;
  bool subscribed_ = false;
  Duration backoff_ = kFirstBackoff;
  uv_timer_t* poll_timer_ = nullptr;
  uv_timer_t* sub_timer_ = nullptr;
  std::int64_t next_poll_ms_ = 0;
  std::int64_t last_answer_ms_ = 0;
  std::string last_error_;
  std::int64_t last_error_ms_ = 0;
};

namespace {

bool same_sentinels(const SentinelConfig& a, const SentinelConfig& b) {
  if (a.master != b.master || a.password_file != b.password_file || a.addresses.size() != b.addresses.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.addresses.size(); ++i) {
    if (a.addresses[i].port != b.addresses[i].port || !same_ip(a.addresses[i].addr, b.addresses[i].addr)) return false;
  }
  return true;
}

}  // namespace

Sentinels::Sentinels(uv_loop_t* loop, ChangeCallback on_change) : loop_(loop), on_change_(std::move(on_change)) {
  notify_timer_ = new_timer(loop_, this);
}

Sentinels::~Sentinels() {
  if (!stopping_) stop();
}

void Sentinels::configure(const Config& config) {
  if (stopping_) return;
  std::map<std::string, std::unique_ptr<Watch>> next;
  for (const auto& [name, up] : config.upstreams) {
    if (!up.sentinel) continue;
    auto it = watches_.find(name);
    if (it != watches_.end() && same_sentinels(it->second->config(), *up.sentinel)) {
      next.emplace(name, std::move(it->second));
      continue;
    }
    // New sentinels for the same master: keep the master known until they
    // answer, so the upstream does not lose its server meanwhile.
    std::string known;
    if (it != watches_.end() && it->second->config().master == up.sentinel->master) known = it->second->master();
    next.emplace(name, std::make_unique<Watch>(this, name, *up.sentinel, known));
  }
  watches_ = std::move(next);  // the others close here
}

std::shared_ptr<const Config> Sentinels::expand(const std::shared_ptr<const Config>& config) const {
  if (watches_.empty()) return config;
  auto out = std::make_shared<Config>(*config);
  for (auto& [name, up] : out->upstreams) {
    if (!up.sentinel) continue;
    auto it = watches_.find(name);
    if (it == watches_.end() || it->second->master().empty()) continue;
    std::string error;
    std::optional<Endpoint> ep = parse_address(it->second->master(), false, error);
    if (!ep) continue;  // canonical numeric text: cannot happen
    ServerConfig s;
    s.address = std::move(*ep);
    s.from = "sentinel " + up.sentinel->master;
    up.servers.push_back(std::move(s));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Sentinels::take_replaced() { return std::exchange(replaced_, {}); }

bool Sentinels::settled() const {
  return std::all_of(watches_.begin(), watches_.end(), [](const auto& w) { return w.second->settled(); });
}

Duration Sentinels::settle_limit(const Config& config) {
  std::size_t most = 0;
  for (const auto& [name, up] : config.upstreams) {
    if (up.sentinel) most = std::max(most, up.sentinel->addresses.size());
  }
  return std::min<Duration>(kSentinelTimeout * static_cast<Duration::rep>(most) + std::chrono::milliseconds(500),
                            std::chrono::seconds(30));
}

void Sentinels::wait_settled(Duration max) {
  run_until(loop_, [this] { return settled(); }, max);
}

void Sentinels::add_status(DnsStatus& dns) const {
  if (watches_.empty()) return;
  dns.enabled = true;
  dns.queries += queries_;
  if (errors_ != 0) dns.errors["sentinel"] += errors_;
  dns.changes += changes_;
  for (const auto& [name, w] : watches_) dns.entries.push_back(w->status());
}

void Sentinels::changed() {
  ++changes_;
  if (stopping_ || notify_timer_ == nullptr || uv_is_active(reinterpret_cast<uv_handle_t*>(notify_timer_))) return;
  uv_timer_start(notify_timer_, [](uv_timer_t* t) {
    auto* s = static_cast<Sentinels*>(t->data);
    if (s->on_change_ && !s->stopping_) s->on_change_();
  }, 0, 0);
}

void Sentinels::stop() {
  stopping_ = true;
  watches_.clear();
  close_timer(notify_timer_);
}

}  // namespace sluice::discovery
