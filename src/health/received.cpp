// In a file of its own: <linux/tcp.h> (which has tcpi_bytes_received, Linux
// 4.1 on) and glibc's <netinet/tcp.h> (which does not) cannot be included
// together.
#include "health/received.hpp"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace sluice::health {

std::optional<std::uint64_t> bytes_received(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (fd < 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received) return std::nullopt;
  return info.tcpi_bytes_received;
}

}  // namespace sluice::health
