#include "upgrade/channel.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

namespace sluice::upgrade {

namespace {

constexpr std::uint32_t kMagic = 0x50554c53;  // "SLUP"
constexpr std::size_t kMaxMessage = 64 * 1024;
constexpr std::size_t kMaxFds = 253;  // SCM_MAX_FD

void put32(std::string& out, std::uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

bool get32(const char*& p, const char* end, std::uint32_t& v) {
  if (static_cast<std::size_t>(end - p) < sizeof v) return false;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return true;
}

bool wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

std::atomic<std::uint64_t> g_exit_after{0};
std::atomic<std::uint64_t> g_adopted{0};
std::atomic<std::uint64_t> g_stall_ms{0};

}  // namespace

void exit_after_adopting(std::uint64_t n) { g_exit_after.store(n, std::memory_order_relaxed); }

void before_adopted_answer() {
  const std::uint64_t limit = g_exit_after.load(std::memory_order_relaxed);
  if (limit == 0) return;
  if (g_adopted.fetch_add(1, std::memory_order_relaxed) >= limit) {
    std::fprintf(stderr, "sluice: test fault: exiting before acknowledging session %llu of the hand-over\n",
                 static_cast<unsigned long long>(limit + 1));
    std::_Exit(70);
  }
}

void stall_receiving(std::uint64_t ms) { g_stall_ms.store(ms, std::memory_order_relaxed); }

void on_session_received() {
  const std::uint64_t ms = g_stall_ms.exchange(0, std::memory_order_relaxed);
  if (ms == 0) return;
  std::fprintf(stderr, "sluice: test fault: the control thread stops reading the hand-over for %llu ms\n",
               static_cast<unsigned long long>(ms));
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void Message::close_fds() {
  for (int f : fds) {
    if (f >= 0) ::close(f);
  }
  fds.clear();
}

Channel::~Channel() {
  if (fd_ >= 0) ::close(fd_);
}

void tell_failure(int fd, std::string_view level, std::string_view message) {
  if (fd < 0) return;
  Message m;
  m.kind = Kind::failed;
  m.fields = {std::string(level), std::string(message.substr(0, 16 * 1024))};
  send(fd, m, 1000);
}

std::string field(std::uint64_t v) { return std::to_string(v); }

std::uint64_t number(std::string_view s) {
  std::uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

bool parse_number(std::string_view s, std::uint64_t& v) {
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, v);
  return !s.empty() && r.ec == std::errc() && r.ptr == end;
}

namespace {

// Sends `m`, waiting up to `timeout_ms` for room (0: not at all).
SendStatus send_within(int fd, const Message& m, int timeout_ms, std::string& error) {
  if (m.fds.size() > kMaxFds) {
    error = "too many descriptors in one message";
    return SendStatus::error;
  }
  std::string body;
  put32(body, kMagic);
  const std::uint32_t vk = static_cast<std::uint32_t>(m.version) | (static_cast<std::uint32_t>(m.kind) << 16);
  put32(body, vk);
  put32(body, static_cast<std::uint32_t>(m.fields.size()));
  for (const std::string& f : m.fields) {
    put32(body, static_cast<std::uint32_t>(f.size()));
    body += f;
  }
  if (body.size() > kMaxMessage) {
    error = "message too large";
    return SendStatus::error;
  }
  iovec iov{body.data(), body.size()};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  std::vector<char> control;
  if (!m.fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * m.fds.size()), 0);
    h.msg_control = control.data();
    h.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    if (c == nullptr) {
      error = "no room for the descriptors";
      return SendStatus::error;
    }
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * m.fds.size());
    std::memcpy(CMSG_DATA(c), m.fds.data(), sizeof(int) * m.fds.size());
  }
  while (true) {
    const ssize_t n = ::sendmsg(fd, &h, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return SendStatus::ok;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (timeout_ms > 0 && wait_for(fd, POLLOUT, timeout_ms)) continue;
      error = "the other process takes nothing";
      return SendStatus::full;
    }
    error = std::strerror(errno);
    return SendStatus::error;
  }
}

}  // namespace

std::string send(int fd, const Message& m, int timeout_ms) {
  std::string error;
  return send_within(fd, m, timeout_ms, error) == SendStatus::ok ? std::string() : error;
}

SendStatus try_send(int fd, const Message& m, std::string& error) { return send_within(fd, m, 0, error); }

RecvStatus receive(int fd, Message& m, std::string& error) {
  m = Message{};
  std::string buf(kMaxMessage, '\0');
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds), 0);
  iovec iov{buf.data(), buf.size()};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = control.data();
  h.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(fd, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return RecvStatus::again;
    error = std::strerror(errno);
    return RecvStatus::error;
  }
  // Descriptors first: whatever the body says, none may leak.
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int f = -1;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      m.fds.push_back(f);
    }
  }
  if (n == 0) {
    m.close_fds();
    return RecvStatus::closed;
  }
  if ((h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    m.close_fds();
    error = "message truncated";
    return RecvStatus::error;
  }
  const char* p = buf.data();
  const char* end = p + n;
  std::uint32_t magic = 0, vk = 0, count = 0;
  if (!get32(p, end, magic) || magic != kMagic || !get32(p, end, vk)) {
    m.close_fds();
    error = "not a hand-over message";
    return RecvStatus::error;
  }
  m.version = static_cast<std::uint16_t>(vk & 0xffff);
  m.kind = static_cast<Kind>(vk >> 16);
  if (!get32(p, end, count)) {
    m.close_fds();
    error = "message cut short";
    return RecvStatus::error;
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t len = 0;
    if (!get32(p, end, len) || static_cast<std::size_t>(end - p) < len) {
      m.close_fds();
      error = "message cut short";
      return RecvStatus::error;
    }
    m.fields.emplace_back(p, len);
    p += len;
  }
  return RecvStatus::ok;
}

RecvStatus receive_wait(int fd, Message& m, std::string& error, int timeout_ms) {
  RecvStatus s = receive(fd, m, error);
  if (s != RecvStatus::again) return s;
  if (!wait_for(fd, POLLIN, timeout_ms)) return RecvStatus::again;
  return receive(fd, m, error);
}

}  // namespace sluice::upgrade
