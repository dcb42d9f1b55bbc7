#include "discovery/resolver.hpp"
#include "sluice/uv_handle.hpp"

#include <ares_nameser.h>

#include <memory>
#include <mutex>
#include <stdexcept>

namespace sluice::discovery {

struct Resolver::Poll {
  uv_poll_t handle{};
  Resolver* owner = nullptr;
  ares_socket_t fd = ARES_SOCKET_BAD;
};

namespace {

struct Pending {
  Resolver::Callback cb;
  RecordType type;
};

QueryStatus status_of(int ares_status) {
  switch (ares_status) {
    case ARES_SUCCESS:
    case ARES_ENODATA: return QueryStatus::answer;
    case ARES_ENOTFOUND: return QueryStatus::nxdomain;
    case ARES_ETIMEOUT: return QueryStatus::timeout;
    case ARES_ESERVFAIL: return QueryStatus::servfail;
    case ARES_EREFUSED: return QueryStatus::refused;
    case ARES_ECONNREFUSED: return QueryStatus::network;
    case ARES_ECANCELLED:
    case ARES_EDESTRUCTION: return QueryStatus::cancelled;
    default: return QueryStatus::other;
  }
}

std::string server_csv(const ResolverConfig& config) {
  std::string csv;
  for (const Endpoint& ep : config.nameservers) {
    if (!csv.empty()) csv += ',';
    // c-ares wants "ip:port", with brackets around an IPv6 address.
    csv += ep.host.find(':') != std::string::npos && !ep.host.starts_with('[') ? "[" + ep.host + "]" : ep.host;
    csv += ':' + std::to_string(ep.port);
  }
  return csv;
}

}  // namespace

std::string_view to_string(QueryStatus s) {
  switch (s) {
    case QueryStatus::answer: return "answer";
    case QueryStatus::nxdomain: return "nxdomain";
    case QueryStatus::timeout: return "timeout";
    case QueryStatus::servfail: return "servfail";
    case QueryStatus::refused: return "refused";
    case QueryStatus::network: return "network";
    case QueryStatus::other: return "other";
    case QueryStatus::cancelled: return "cancelled";
  }
  return "other";
}

Resolver::Resolver(uv_loop_t* loop, const ResolverConfig& config) : loop_(loop) {
  static std::once_flag init_once;
  std::call_once(init_once, [] { ares_library_init(ARES_LIB_INIT_ALL); });
  ares_options opts{};
  // NOCHECKRESP: a SERVFAIL or REFUSED comes to us as such (c-ares 1.18
  // would try the next server and then report every one of them as a
  // refused connection); ROTATE: the next query, a second later, goes to the
  // next name server, so one broken server does not hold a name's answer
  // back for long. Truncated UDP answers are asked again over TCP.
  int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_FLAGS | ARES_OPT_ROTATE;
  opts.flags = ARES_FLAG_NOCHECKRESP;
  opts.sock_state_cb = on_sock_state;
  opts.sock_state_cb_data = this;
  opts.timeout = static_cast<int>(config.timeout.count());
  opts.tries = static_cast<int>(config.attempts);
  // Without nameservers c-ares reads /etc/resolv.conf (ours win over its
  // timeout and attempts options).
  if (const int rc = ares_init_options(&channel_, &opts, mask); rc != ARES_SUCCESS) {
    throw std::runtime_error(std::string("cannot start the DNS resolver: ") + ares_strerror(rc));
  }
  if (!config.nameservers.empty()) {
    const std::string csv = server_csv(config);
    if (const int rc = ares_set_servers_ports_csv(channel_, csv.c_str()); rc != ARES_SUCCESS) {
      ares_destroy(channel_);
      throw std::runtime_error("cannot use nameservers " + csv + ": " + ares_strerror(rc));
    }
  }
  uv_timer_init(loop_, &timer_);
  timer_.data = this;
  ++open_handles_;
}

Resolver::~Resolver() = default;

void Resolver::query(const std::string& name, RecordType type, Callback cb) {
  if (closing_) {
    cb(QueryStatus::cancelled, nullptr);
    return;
  }
  auto* p = new Pending{std::move(cb), type};
  ares_query(channel_, name.c_str(), ns_c_in, static_cast<int>(type), on_answer, p);
  arm_timer();
}

void Resolver::on_answer(void* arg, int status, int, unsigned char* abuf, int alen) {
  std::unique_ptr<Pending> p(static_cast<Pending*>(arg));
  QueryStatus s = status_of(status);
  std::optional<Answer> answer;
  if (s == QueryStatus::answer || s == QueryStatus::nxdomain) {
    if (abuf != nullptr && alen > 0) answer = parse_answer(abuf, static_cast<std::size_t>(alen), p->type);
    if (!answer) {
      if (abuf != nullptr && alen > 0) {
        s = QueryStatus::other;  // a message we cannot read is no answer
      } else {
        answer = Answer{};
      }
    }
  }
  p->cb(s, answer ? &*answer : nullptr);
}

void Resolver::on_sock_state(void* data, ares_socket_t fd, int readable, int writable) {
  auto* r = static_cast<Resolver*>(data);
  auto it = r->polls_.find(fd);
  if (readable == 0 && writable == 0) {
    // c-ares closes the socket after this returns: stop watching it first.
    if (it == r->polls_.end()) return;
    Poll* p = it->second;
    r->polls_.erase(it);
    close_poll(p);
    return;
  }
  Poll* p = nullptr;
  if (it == r->polls_.end()) {
    p = new Poll;
    p->owner = r;
    p->fd = fd;
    if (uv_poll_init_socket(r->loop_, &p->handle, fd) != 0) {
      delete p;  // c-ares sees no progress and times the query out
      return;
    }
    p->handle.data = p;
    ++r->open_handles_;
    r->polls_.emplace(fd, p);
  } else {
    p = it->second;
  }
  const int events = (readable != 0 ? UV_READABLE : 0) | (writable != 0 ? UV_WRITABLE : 0);
  uv_poll_start(&p->handle, events, on_poll);
}

void Resolver::close_poll(Poll* p) {
  uv_close(as_handle(&p->handle), [](uv_handle_t* h) {
    auto* poll = static_cast<Poll*>(h->data);
    Resolver* owner = poll->owner;
    delete poll;
    --owner->open_handles_;
    owner->maybe_closed();
  });
}

void Resolver::on_poll(uv_poll_t* h, int status, int events) {
  auto* p = static_cast<Poll*>(h->data);
  Resolver* r = p->owner;
  const ares_socket_t fd = p->fd;  // `p` may be closed while c-ares runs
  // An error on the socket: let c-ares read it and find out.
  const bool read = status < 0 || (events & UV_READABLE) != 0;
  const bool write = status == 0 && (events & UV_WRITABLE) != 0;
  ares_process_fd(r->channel_, read ? fd : ARES_SOCKET_BAD, write ? fd : ARES_SOCKET_BAD);
  r->arm_timer();
}

void Resolver::on_timer(uv_timer_t* t) {
  auto* r = static_cast<Resolver*>(t->data);
  ares_process_fd(r->channel_, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
  r->arm_timer();
}

void Resolver::arm_timer() {
  if (closing_) return;
  timeval tv{};
  const timeval* next = ares_timeout(channel_, nullptr, &tv);
  if (next == nullptr) {
    uv_timer_stop(&timer_);
    return;
  }
  const auto ms = static_cast<std::uint64_t>(next->tv_sec) * 1000 + static_cast<std::uint64_t>(next->tv_usec) / 1000;
  // +1: c-ares rounds down, a timer that fires early would only come again.
  uv_timer_start(&timer_, on_timer, ms + 1, 0);
}

void Resolver::close(std::function<void()> done) {
  closed_ = std::move(done);
  closing_ = true;
  // Ends every query (callbacks with ARES_EDESTRUCTION) and closes its
  // sockets (on_sock_state with 0, 0 for each).
  ares_destroy(channel_);
  channel_ = nullptr;
  for (auto& [fd, p] : polls_) {
    close_poll(p);
  }
  polls_.clear();
  uv_close(as_handle(&timer_), [](uv_handle_t* h) {
    auto* r = static_cast<Resolver*>(h->data);
    --r->open_handles_;
    r->maybe_closed();
  });
}

void Resolver::maybe_closed() {
  if (!closing_ || open_handles_ != 0 || !closed_) return;
  auto done = std::move(closed_);
  closed_ = nullptr;
  done();
}

}  // namespace sluice::discovery
