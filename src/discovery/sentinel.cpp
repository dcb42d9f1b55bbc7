#include "discovery/sentinel.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>

#include "config/quote.hpp"
#include "config/values.hpp"
#include "discovery/resp.hpp"
#include "discovery/run_until.hpp"
#include "sluice/address.hpp"
#include "sluice/time.hpp"

namespace sluice::discovery {

namespace {

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
    // The reader keeps where it is in a reply between reads: each byte is
    // looked at once, however the sentinel cuts its replies.
    std::string_view rest(buf->base, static_cast<std::size_t>(n));
    while (!c->closing_ && !rest.empty()) {
      rest.remove_prefix(c->reader_.read(rest));
      if (c->reader_.bad()) {
        c->fail("a bad reply: " + c->reader_.error());
        return;
      }
      if (c->reader_.ready()) c->on_reply_(c->reader_.take());
    }
  }

  uv_tcp_t tcp_{};
  uv_timer_t timer_{};
  uv_connect_t connect_{};
  int open_ = 0;
  bool closing_ = false;
  std::string pending_;
  std::string request_;
  RespReader reader_;  // bounds what a reply may hold (resp.hpp)
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

std::optional<FailoverSign> failover_sign(std::string_view channel, const std::string& message,
                                          const std::string& master) {
  std::istringstream in(message);
  if (channel == "+switch-master") {
    std::string name, old_ip, old_port, new_ip, new_port, extra;
    if (!(in >> name >> old_ip >> old_port >> new_ip >> new_port) || (in >> extra) || name != master) {
      return std::nullopt;
    }
    FailoverSign s{sentinel_address(old_ip, old_port), sentinel_address(new_ip, new_port)};
    if (s.from.empty() || s.to.empty()) return std::nullopt;
    return s;
  }
  if (channel == "+failover-state-send-slaveof-noone" || channel == "+promoted-slave") {
    std::string type, id, ip, port, at, name, master_ip, master_port, extra;
    if (!(in >> type >> id >> ip >> port >> at >> name >> master_ip >> master_port) || (in >> extra) ||
        type != "slave" || at != "@" || name != master) {
      return std::nullopt;
    }
    FailoverSign s{sentinel_address(master_ip, master_port), sentinel_address(ip, port)};
    if (s.from.empty() || s.to.empty()) return std::nullopt;
    return s;
  }
  return std::nullopt;
}

std::string majority(const std::vector<std::string>& words) {
  std::map<std::string, std::size_t> count;
  for (const std::string& w : words) {
    if (!w.empty() && ++count[w] * 2 > words.size()) return w;
  }
  return {};
}

class Sentinels::Watch {
 public:
  Watch(Sentinels* owner, std::string upstream, SentinelConfig config, std::string master,
        std::string node_password_file)
      : owner_(owner),
        upstream_(std::move(upstream)),
        config_(std::move(config)),
        node_password_file_(std::move(node_password_file)),
        master_(std::move(master)) {
    poll_timer_ = new_timer(owner_->loop_, this);
    episode_timer_ = new_timer(owner_->loop_, this);
    peers_.resize(config_.addresses.size());
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      peers_[i].watch = this;
      peers_[i].index = i;
      peers_[i].retry = new_timer(owner_->loop_, &peers_[i]);
    }
    poll_round();
    for (Peer& p : peers_) sub_connect(p);
  }

  ~Watch() {
    for (Peer& p : peers_) {
      if (p.poll != nullptr) p.poll->close();
      if (p.sub != nullptr) p.sub->close();
      close_timer(p.retry);
    }
    if (probe_ != nullptr) probe_->close();
    if (replid_conn_ != nullptr) replid_conn_->close();
    close_timer(poll_timer_);
    close_timer(episode_timer_);
  }

  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  const SentinelConfig& config() const { return config_; }
  const std::string& node_password_file() const { return node_password_file_; }

  // A failover a previous process saw begin (Sentinels::resume_failover).
  void resume(const std::string& from, const std::string& candidate) {
    if (peers_.empty()) return;
    sign(peers_.front(), "a failover the previous process saw begin", FailoverSign{from, candidate});
  }
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
  // One listed sentinel: its subscription, its poll, and its latest word.
  struct Peer {
    Watch* watch = nullptr;
    std::size_t index = 0;
    Conn* sub = nullptr;
    bool subscribed = false;
    Duration backoff = kFirstBackoff;
    uv_timer_t* retry = nullptr;
    Conn* poll = nullptr;
    std::string word;  // the master it named last; "" when none yet
  };

  std::string label(std::size_t index) const { return "sentinel " + config_.addresses[index].text; }

  std::string request(const std::string& password, bool subscribe) const {
    std::string out;
    if (!password.empty()) out += resp_command({"AUTH", password});
    out += resp_command({"SENTINEL", "get-master-addr-by-name", config_.master});
    if (subscribe) {
      out += resp_command({"SUBSCRIBE", "+switch-master", "+failover-state-send-slaveof-noone", "+promoted-slave"});
    }
    return out;
  }

  void note_error(const std::string& what) {
    ++owner_->errors_;
    last_error_ = what;
    last_error_ms_ = wall_now_ms();
  }

  // --- the master: a majority's word, or a proven promotion ---

  void heard(Peer& p, const std::string& addr) {
    last_answer_ms_ = wall_now_ms();
    p.word = addr;
    decide();
  }

  void decide() {
    std::vector<std::string> words;
    for (const Peer& p : peers_) words.push_back(p.word);
    std::string agreed = majority(words);
    if (!agreed.empty() && agreed == left_ && wall_now_ms() < left_until_ms_) {
      // The sentinels that still name the master a proven promotion left
      // behind have not heard of it yet.
      return;
    }
    if (agreed.empty() && master_.empty() && asked_) {
      // Fewer than a majority answer at all: at start, the word of those
      // that do (the first listed among the most named) rather than no
      // server; the master's own ROLE check still has the last word.
      std::map<std::string, std::size_t> count;
      std::size_t best = 0;
      for (const std::string& w : words) {
        if (!w.empty() && ++count[w] > best) {
          best = count[w];
          agreed = w;
        }
      }
    }
    if (agreed.empty() || agreed == master_) return;
    move_to(agreed, master_.empty() ? "named by the sentinels" : "named by a majority of the sentinels");
  }

  void move_to(const std::string& addr, const std::string& via) {
    end_episode();
    const std::string old = std::exchange(master_, addr);
    master_replid_.clear();
    if (old.empty()) {
      spdlog::info("sentinel: upstream \"{}\" master {} is {} ({})", upstream_, quote(config_.master), addr, via);
    } else {
      spdlog::warn("sentinel: upstream \"{}\" master {} moved from {} to {} ({}): sessions on {} are closed", upstream_,
                   quote(config_.master), old, addr, via, old);
      owner_->replaced_.emplace_back(upstream_, old);
    }
    owner_->changed();
    read_replid();
  }

  // --- a failover under way ---


  void sign(Peer& p, std::string_view channel, const FailoverSign& s) {
    if (master_.empty() || s.from != master_ || s.to == master_) return;  // old news, or another master
    if (refuted_.count({p.index, s.to}) != 0) {
      spdlog::debug("sentinel: upstream \"{}\": {} announces {} again for {}; ignored (refuted before)", upstream_,
                    label(p.index), channel, s.to);
      return;
    }
    if (!candidate_.empty()) return;  // already under way
    candidate_ = s.to;
    announced_by_ = p.index;
    const std::string reason = "a failover of master " + quote(config_.master) + " to " + s.to + " began (" +
                               std::string(channel) + " from " + label(p.index) + ")";
    spdlog::warn("sentinel: upstream \"{}\": {}: {} is fenced until {} takes over (at most {} unless it does)",
                 upstream_, reason, master_, s.to, format_duration(kPromotionWait));
    if (owner_->on_fence_) owner_->on_fence_(upstream_, master_, true, s.to, reason);
    uv_timer_start(episode_timer_, [](uv_timer_t* t) { static_cast<Watch*>(t->data)->refute("it did not take over"); },
                   timer_ms(kPromotionWait), 0);
    probe_candidate();
  }

  // The candidate's own word: INFO replication, every 100 ms while the
  // failover is under way.
  void probe_candidate() {
    if (candidate_.empty() || probe_ != nullptr) return;
    std::string error;
    const std::optional<Endpoint> ep = parse_address(candidate_, false, error);
    std::string password;
    if (!ep || !read_password(node_password_file_, password, error)) return;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    std::string req = password.empty() ? std::string() : resp_command({"AUTH", password});
    req += resp_command({"INFO", "replication"});
    probe_ = Conn::start(
        owner_->loop_, *ep, req,
        [this, step](const RespValue& v) {
          if ((*step)++ == 0) return;  // AUTH's answer; INFO says whether it worked
          probe_->close();
          probe_ = nullptr;
          if (v.type == RespValue::Type::bulk) judge_candidate(v.text);
          retry_probe();
        },
        [this](const std::string&) {
          probe_ = nullptr;
          retry_probe();
        });
  }

  void retry_probe() {
    if (candidate_.empty()) return;
    auto* t = new uv_timer_t;
    uv_timer_init(owner_->loop_, t);
    t->data = this;
    probe_waits_.push_back(t);
    uv_timer_start(t, [](uv_timer_t* timer) {
      auto* w = static_cast<Watch*>(timer->data);
      std::erase(w->probe_waits_, timer);
      close_timer(timer);
      w->probe_candidate();
    }, 100, 0);
  }

  void judge_candidate(const std::string& info) {
    const std::string role = info_value(info, "role");
    if (role != "master") return;  // not promoted yet
    const std::string replid2 = info_value(info, "master_replid2");
    if (master_replid_.empty()) return;  // nothing to compare with: the sentinels' majority decides
    if (replid2 == master_replid_) {
      const std::string from = master_;
      left_ = from;
      left_until_ms_ = wall_now_ms() + kLeftBehind.count();
      move_to(candidate_, "promoted from " + from + ", as " + label(announced_by_) +
                              " announced: its master_replid2 is the old master's master_replid");
      return;
    }
    refute("it is a master that did not take over from " + master_ + " (its master_replid2 is not " + master_ +
           "'s master_replid)");
  }

  void refute(const std::string& why) {
    if (candidate_.empty()) return;
    const std::string candidate = candidate_;
    const std::size_t by = announced_by_;
    end_episode();
    refuted_.insert({by, candidate});
    spdlog::warn("sentinel: upstream \"{}\": the failover {} announced to {} is not happening ({}): {} is no longer "
                 "fenced; its later announcements of {} are ignored",
                 upstream_, label(by), candidate, why, master_, candidate);
    if (owner_->on_fence_) owner_->on_fence_(upstream_, master_, false, candidate, "the failover to " + candidate +
                                             " announced by " + label(by) + " is not happening (" + why + ")");
  }

  void end_episode() {
    candidate_.clear();
    uv_timer_stop(episode_timer_);
    if (probe_ != nullptr) {
      probe_->close();
      probe_ = nullptr;
    }
    for (uv_timer_t* t : probe_waits_) close_timer(t);
    probe_waits_.clear();
  }

  // The master's replication id, which a replica promoted from it keeps as
  // its master_replid2.
  void read_replid() {
    if (master_.empty() || replid_conn_ != nullptr) return;
    std::string error;
    const std::optional<Endpoint> ep = parse_address(master_, false, error);
    std::string password;
    if (!ep || !read_password(node_password_file_, password, error)) return;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    std::string req = password.empty() ? std::string() : resp_command({"AUTH", password});
    req += resp_command({"INFO", "replication"});
    const std::string asked = master_;
    replid_conn_ = Conn::start(
        owner_->loop_, *ep, req,
        [this, step, asked](const RespValue& v) {
          if ((*step)++ == 0) return;
          replid_conn_->close();
          replid_conn_ = nullptr;
          if (v.type == RespValue::Type::bulk && asked == master_ && info_value(v.text, "role") == "master") {
            master_replid_ = info_value(v.text, "master_replid");
          }
        },
        [this](const std::string&) { replid_conn_ = nullptr; });
  }

  static std::string info_value(const std::string& info, const std::string& field) {
    std::istringstream in(info);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 && line[field.size()] == ':') {
        return line.substr(field.size() + 1);
      }
    }
    return {};
  }

  // --- the safety-net poll: every sentinel at once ---

  void poll_round() {
    polls_left_ = peers_.size();
    poll_ok_ = false;
    for (Peer& p : peers_) poll_one(p);
  }

  void poll_one(Peer& p) {
    std::string password, error;
    if (!read_password(config_.password_file, password, error)) {
      poll_done(p, false, error);
      return;
    }
    ++owner_->queries_;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    p.poll = Conn::start(
        owner_->loop_, config_.addresses[p.index], request(password, false),
        [this, &p, step](const RespValue& v) {
          if ((*step)++ == 0) {
            if (v.type == RespValue::Type::error) poll_done(p, false, "AUTH failed: " + peer_text(v.text));
            return;
          }
          std::string why;
          const std::string addr = master_of(v, config_.master, why);
          if (addr.empty()) {
            poll_done(p, false, why);
            return;
          }
          p.poll->close();
          p.poll = nullptr;
          p.word = addr;
          poll_done(p, true, {});
        },
        [this, &p](const std::string& reason) {
          p.poll = nullptr;
          poll_done(p, false, reason);
        });
  }

  void poll_done(Peer& p, bool ok, const std::string& error) {
    if (p.poll != nullptr) {
      p.poll->close();
      p.poll = nullptr;
    }
    if (!ok) note_error(label(p.index) + ": " + error);
    poll_ok_ = poll_ok_ || ok;
    if (--polls_left_ > 0) return;
    if (poll_ok_) last_answer_ms_ = wall_now_ms();
    if (!poll_ok_ && !poll_failing_) {
      spdlog::warn("sentinel: upstream \"{}\": no sentinel named master {} (last: {}); {}", upstream_,
                   quote(config_.master), last_error_,
                   master_.empty() ? "no server until one does" : "keeping " + master_);
    } else if (poll_ok_ && poll_failing_) {
      spdlog::info("sentinel: upstream \"{}\": the sentinels answer again", upstream_);
    }
    poll_failing_ = !poll_ok_;
    if (poll_ok_) last_error_.clear();
    asked_ = true;
    decide();
    read_replid();
    const Duration next = poll_ok_ ? kSentinelPoll : kSentinelTimeout;
    next_poll_ms_ = wall_now_ms() + next.count();
    uv_timer_start(poll_timer_, [](uv_timer_t* t) { static_cast<Watch*>(t->data)->poll_round(); }, timer_ms(next), 0);
  }

  // --- the subscriptions, one per sentinel ---

  void sub_connect(Peer& p) {
    std::string password, error;
    if (!read_password(config_.password_file, password, error)) {
      sub_failed(p, error);
      return;
    }
    ++owner_->queries_;
    auto step = std::make_shared<int>(password.empty() ? 1 : 0);
    p.sub = Conn::start(
        owner_->loop_, config_.addresses[p.index], request(password, true),
        [this, &p, step](const RespValue& v) {
          const int at = (*step)++;
          if (at == 0) {
            if (v.type == RespValue::Type::error) sub_failed(p, "AUTH failed: " + peer_text(v.text));
            return;
          }
          if (at == 1) {
            std::string why;
            const std::string addr = master_of(v, config_.master, why);
            if (addr.empty()) {
              sub_failed(p, why);
              return;
            }
            heard(p, addr);
            return;
          }
          if (v.type != RespValue::Type::array || v.items.size() != 3) {
            sub_failed(p, "an unexpected message on the subscription");
            return;
          }
          if (at <= 4) {
            if (!is_text(v.items[0], "subscribe")) {
              sub_failed(p, "SUBSCRIBE was not confirmed");
              return;
            }
            if (at < 4) return;
            p.sub->settle();
            p.subscribed = true;
            p.backoff = kFirstBackoff;
            spdlog::info("sentinel: upstream \"{}\" follows the failovers announced at {}", upstream_, label(p.index));
            return;
          }
          if (!is_text(v.items[0], "message") || v.items[1].type != RespValue::Type::bulk) return;
          const std::string& channel = v.items[1].text;
          const std::optional<FailoverSign> s = failover_sign(channel, v.items[2].text, config_.master);
          if (!s) return;
          sign(p, channel, *s);
          if (channel == "+switch-master") heard(p, s->to);
        },
        [this, &p](const std::string& reason) {
          p.sub = nullptr;
          sub_failed(p, reason);
        });
  }

  void sub_failed(Peer& p, const std::string& reason) {
    if (p.sub != nullptr) {
      p.sub->close();
      p.sub = nullptr;
    }
    if (p.subscribed) {
      p.subscribed = false;
      spdlog::warn("sentinel: upstream \"{}\": the subscription at {} ended ({}); subscribing again", upstream_,
                   label(p.index), reason);
    } else {
      note_error(label(p.index) + ": " + reason);
    }
    const Duration wait = p.backoff;
    p.backoff = std::min<Duration>(p.backoff * 2, kMaxBackoff);
    uv_timer_start(p.retry, [](uv_timer_t* t) {
      auto* peer = static_cast<Peer*>(t->data);
      peer->watch->sub_connect(*peer);
    }, timer_ms(wait), 0);
  }

  static constexpr Duration kFirstBackoff = std::chrono::milliseconds(100);
  static constexpr Duration kMaxBackoff = std::chrono::seconds(5);
  // After a proven promotion, how long a majority still naming the old
  // master is taken for sentinels that have not heard of it yet.
  static constexpr Duration kLeftBehind = std::chrono::seconds(30);

  Sentinels* owner_;
  std::string upstream_;
  SentinelConfig config_;
  std::string node_password_file_;  // the Redis servers' AUTH (the upstream's check's password_file)
  std::string master_;  // canonical "ip:port"; empty until the sentinels name it
  std::string master_replid_;  // its INFO replication master_replid, once read
  bool asked_ = false;  // a first poll round has ended
  std::vector<Peer> peers_;  // one per listed sentinel; never resized after the constructor
  std::size_t polls_left_ = 0;
  bool poll_ok_ = false;
  bool poll_failing_ = false;
  // The failover under way: the candidate one sentinel announced.
  std::string candidate_;
  std::size_t announced_by_ = 0;
  Conn* probe_ = nullptr;
  std::vector<uv_timer_t*> probe_waits_;
  std::set<std::pair<std::size_t, std::string>> refuted_;  // (sentinel, candidate) announcements that did not hold
  std::string left_;  // the master a proven promotion left
  std::int64_t left_until_ms_ = 0;
  Conn* replid_conn_ = nullptr;
  uv_timer_t* poll_timer_ = nullptr;
  uv_timer_t* episode_timer_ = nullptr;
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

Sentinels::Sentinels(uv_loop_t* loop, ChangeCallback on_change, FenceCallback on_fence)
    : loop_(loop), on_change_(std::move(on_change)), on_fence_(std::move(on_fence)) {
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
    const std::string node_password = up.health ? up.health->password_file : std::string();
    if (it != watches_.end() && same_sentinels(it->second->config(), *up.sentinel) &&
        it->second->node_password_file() == node_password) {
      next.emplace(name, std::move(it->second));
      continue;
    }
    // New sentinels for the same master: keep the master known until they
    // answer, so the upstream does not lose its server meanwhile.
    std::string known;
    if (it != watches_.end() && it->second->config().master == up.sentinel->master) known = it->second->master();
    next.emplace(name, std::make_unique<Watch>(this, name, *up.sentinel, known, node_password));
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

void Sentinels::resume_failover(const std::string& upstream, const std::string& from, const std::string& candidate) {
  auto it = watches_.find(upstream);
  if (it != watches_.end()) it->second->resume(from, candidate);
}

void Sentinels::stop() {
  stopping_ = true;
  watches_.clear();
  close_timer(notify_timer_);
}

}  // namespace sluice::discovery
