#include "net/listener.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config/values.hpp"

namespace sluice {

namespace {

int open_one(const sockaddr* addr, socklen_t len, int backlog, std::string& error) {
  int fd = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (addr->sa_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd, addr, len) < 0 || ::listen(fd, backlog) < 0) {
    error = std::strerror(errno);
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
  for (unsigned i = 0; i < count; ++i) {
    std::string error;
    int fd = open_one(reinterpret_cast<const sockaddr*>(&addr), len, static_cast<int>(listener.backlog), error);
    if (fd < 0) {
      for (int f : out.fds) ::close(f);
      throw std::runtime_error("listener \"" + listener.name + "\": cannot listen on " + listener.listen.text +
                               ": " + error);
    }
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

}  // namespace sluice
