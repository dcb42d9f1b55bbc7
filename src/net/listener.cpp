#include "net/listener.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "proxy/socket_options.hpp"
#include "sluice/address.hpp"

namespace sluice {

namespace {

int open_one(const sockaddr* addr, socklen_t len, const ListenerConfig& l, bool reuseport, bool listen,
             int& error) {
  int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = errno;
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuseport) ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (addr->sa_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (listen) {
    set_nodelay(fd);
    set_keepalive(fd, l);
  }
  if (::bind(fd, addr, len) < 0 || (listen && ::listen(fd, static_cast<int>(l.backlog)) < 0)) {
    error = errno;
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

ListeningSockets open_listening_sockets(const ListenerConfig& listener, unsigned count) {
  ListeningSockets out;
  sockaddr_storage addr = listener.listen.addr;
  socklen_t len = listener.listen.addr_len;
  auto fail = [&](int error, const std::string& extra) {
    for (int f : out.fds) ::close(f);
    throw std::runtime_error("listener \"" + listener.name + "\": cannot listen on " + listener.listen.text + ": " +
                             std::strerror(error) + extra);
  };
  if (listener.listen.port != 0) {
    // A bind without SO_REUSEPORT fails while anyone else listens here.
    int error = 0;
    const int probe = open_one(reinterpret_cast<const sockaddr*>(&addr), len, listener, false, false, error);
    if (probe < 0) {
      // Which process holds it is not knowable here: it may be another
      // program or another sluice, so the message names neither.
      fail(error, error == EADDRINUSE ? " (the address is taken: another process is listening on it)" : "");
    }
    ::close(probe);
  }
  for (unsigned i = 0; i < count; ++i) {
    int error = 0;
    const int fd = open_one(reinterpret_cast<const sockaddr*>(&addr), len, listener, true, true, error);
    if (fd < 0) fail(error, "");
    if (i == 0) {
      // Learn the real port (listen = "host:0") so the other workers share it.
      socklen_t alen = sizeof addr;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen);
      len = alen;
      out.bound = format_sockaddr(reinterpret_cast<const sockaddr*>(&addr));
    }
    out.fds.push_back(fd);
  }
  return out;
}

ListeningSockets adopt_listening_sockets(const ListenerConfig& listener, std::vector<int> fds, unsigned count) {
  ListeningSockets out;
  out.fds = std::move(fds);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (out.fds.empty() || ::getsockname(out.fds[0], reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = out.fds.empty() ? EBADF : errno;
    for (int f : out.fds) ::close(f);
    throw std::runtime_error("listener \"" + listener.name + "\": the socket handed over is unusable: " +
                             std::strerror(error));
  }
  out.bound = format_sockaddr(reinterpret_cast<const sockaddr*>(&addr));
  while (out.fds.size() < count) {
    int error = 0;
    const int fd = open_one(reinterpret_cast<const sockaddr*>(&addr), len, listener, true, true, error);
    if (fd < 0) {
      for (int f : out.fds) ::close(f);
      throw std::runtime_error("listener \"" + listener.name + "\": cannot listen on " + out.bound + ": " +
                               std::strerror(error));
    }
    out.fds.push_back(fd);
  }
  return out;
}

}  // namespace sluice
