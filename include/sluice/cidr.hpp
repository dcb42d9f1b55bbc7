// Does an address fall inside a CIDR block? Used by allow/deny and
// trusted_proxies. An IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a
// dual-stack listener reports for IPv4 clients) matches IPv4 blocks.
#pragma once

#include <cstring>

#include <netinet/in.h>
#include <sys/socket.h>

#include "sluice/config.hpp"

namespace sluice {

inline bool cidr_contains(const Cidr& block, const sockaddr* sa) {
  const unsigned char* bytes = nullptr;
  int family = 0;
  if (sa->sa_family == AF_INET) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
    family = AF_INET;
  } else if (sa->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a6) && block.family == AF_INET) {
      bytes = a6->s6_addr + 12;
      family = AF_INET;
    } else {
      bytes = a6->s6_addr;
      family = AF_INET6;
    }
  } else {
    return false;
  }
  if (family != block.family) return false;
  const unsigned full = block.prefix / 8;
  if (std::memcmp(bytes, block.addr.data(), full) != 0) return false;
  const unsigned rest = block.prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<unsigned char>(0xffu << (8 - rest));
  return (bytes[full] & mask) == (block.addr[full] & mask);
}

inline bool any_contains(const std::vector<Cidr>& blocks, const sockaddr* sa) {
  for (const Cidr& b : blocks) {
    if (cidr_contains(b, sa)) return true;
  }
  return false;
}

}  // namespace sluice
