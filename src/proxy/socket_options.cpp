#include "proxy/socket_options.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>

namespace sluice {

namespace {

int opt(int fd, int level, int name, int value) {
  return ::setsockopt(fd, level, name, &value, sizeof value) == 0 ? 0 : -errno;
}

int seconds(Duration d) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(d).count();
  return s < 1 ? 1 : static_cast<int>(s);
}

}  // namespace

int set_keepalive(int fd, const ListenerConfig& l) {
  if (!l.tcp_keepalive) return opt(fd, SOL_SOCKET, SO_KEEPALIVE, 0);
  if (int r = opt(fd, SOL_SOCKET, SO_KEEPALIVE, 1); r != 0) return r;
  if (int r = opt(fd, IPPROTO_TCP, TCP_KEEPIDLE, seconds(l.tcp_keepalive_idle)); r != 0) return r;
  if (int r = opt(fd, IPPROTO_TCP, TCP_KEEPINTVL, seconds(l.tcp_keepalive_interval)); r != 0) return r;
  return opt(fd, IPPROTO_TCP, TCP_KEEPCNT, static_cast<int>(l.tcp_keepalive_count));
}

int set_nodelay(int fd) { return opt(fd, IPPROTO_TCP, TCP_NODELAY, 1); }

}  // namespace sluice
