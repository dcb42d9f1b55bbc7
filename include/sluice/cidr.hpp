// Does an address fall inside a CIDR block? Used by allow/deny and
// trusted_proxies on the data path, and by the config loader.
//
// An IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a dual-stack listener
// reports for IPv4 clients) is matched as the IPv4 address it carries, so an
// IPv4 block matches it; an IPv6 block sees every IPv4 address in its mapped
// form, so "::ffff:0:0/96" and "::/0" match IPv4 clients too. Other families
// and null never match. The port is ignored. Pure and allocation-free.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>

#include "sluice/config.hpp"

namespace sluice {

namespace cidr_detail {

// True when the first `prefix` bits of a and b are equal.
inline bool same_prefix(const std::uint8_t* a, const std::uint8_t* b, unsigned prefix) {
  const unsigned whole = prefix / 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  const unsigned rest = prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xffU << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace cidr_detail

inline bool cidr_contains(const Cidr& block, const sockaddr* sa) {
  if (sa == nullptr) return false;
  // The address as 16 bytes in IPv6 form (IPv4 as ::ffff:a.b.c.d).
  std::array<std::uint8_t, 16> bytes{};
  if (sa->sa_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, sa, sizeof sin);
    bytes[10] = 0xff;
    bytes[11] = 0xff;
    std::memcpy(bytes.data() + 12, &sin.sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, sa, sizeof sin6);
    std::memcpy(bytes.data(), &sin6.sin6_addr, 16);
  } else {
    return false;
  }
  if (block.family == AF_INET6) return cidr_detail::same_prefix(bytes.data(), block.addr.data(), block.prefix);
  if (block.family != AF_INET) return false;
  static constexpr std::uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(bytes.data(), kMapped, sizeof kMapped) != 0) return false;
  return cidr_detail::same_prefix(bytes.data() + 12, block.addr.data(), block.prefix);
}

inline bool any_contains(const std::vector<Cidr>& blocks, const sockaddr* sa) {
  for (const Cidr& b : blocks) {
    if (cidr_contains(b, sa)) return true;
  }
  return false;
}

}  // namespace sluice
