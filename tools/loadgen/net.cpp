#include "net.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <unistd.h>

namespace loadgen {

bool parse_target(const std::string& text, Target& out, std::string& error) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      error = "bad address '" + text + "' (want [v6]:port)";
      return false;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) {
      error = "bad address '" + text + "' (want host:port)";
      return false;
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    error = "cannot resolve '" + text + "': " + gai_strerror(rc);
    return false;
  }
  std::memcpy(&out.addr, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  out.text = text;
  freeaddrinfo(res);
  return true;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int start_connect(const Target& target) {
  int fd = socket(target.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  set_nodelay(fd);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&target.addr), target.len) != 0 &&
      errno != EINPROGRESS) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

int connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

int listen_on(const std::string& host, std::uint16_t port, std::uint16_t& bound_port) {
  Target t;
  std::string error;
  if (!parse_target(host + ":" + std::to_string(port), t, error)) {
    errno = EINVAL;
    return -1;
  }
  int fd = socket(t.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&t.addr), t.len) != 0 || listen(fd, 4096) != 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  if (local.ss_family == AF_INET6) {
    bound_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
  } else {
    bound_port = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
  }
  return fd;
}

void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

double cpu_seconds_self() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

Poller::Poller() : fd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (fd_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
}

Poller::~Poller() {
  if (fd_ >= 0) close(fd_);
}

void Poller::add(int fd, std::uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(fd_, EPOLL_CTL_ADD, fd, &ev);
}

void Poller::modify(int fd, std::uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(fd_, EPOLL_CTL_MOD, fd, &ev);
}

void Poller::remove(int fd) { epoll_ctl(fd_, EPOLL_CTL_DEL, fd, nullptr); }

int Poller::poll(int timeout_ms) {
  constexpr int kBatch = 256;
  epoll_event events[kBatch];
  int n = epoll_wait(fd_, events, kBatch, timeout_ms);
  for (int i = 0; i < n; ++i) {
    static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
  }
  return n < 0 ? 0 : n;
}

int ms_until(Clock::time_point deadline, int cap_ms) {
  auto now = Clock::now();
  if (now >= deadline) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
  return ms > cap_ms ? cap_ms : static_cast<int>(ms);
}

}  // namespace loadgen
