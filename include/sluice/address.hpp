// Socket addresses as text, the one format used in logs, status and metrics:
// "127.0.0.1:80", "[::1]:80", "[fe80::1%eth0]:80".
#pragma once

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace sluice {

// Copies an IPv4 or IPv6 address from `from` to `to`, which has room for a
// sockaddr_in6; returns false, leaving `to` alone, for any other family.
inline bool copy_inet(void* to, const sockaddr* from) {
  if (from == nullptr) return false;
  if (from->sa_family == AF_INET) {
    std::memcpy(to, from, sizeof(sockaddr_in));
  } else if (from->sa_family == AF_INET6) {
    std::memcpy(to, from, sizeof(sockaddr_in6));
  } else {
    return false;
  }
  return true;
}

// Sets the port of an IPv4 or IPv6 address; other families are left alone.
inline void set_port(sockaddr_storage& ss, std::uint16_t port) {
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    sin.sin_port = htons(port);
    std::memcpy(&ss, &sin, sizeof sin);
  } else if (ss.ss_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    sin6.sin6_port = htons(port);
    std::memcpy(&ss, &sin6, sizeof sin6);
  }
}

// 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104.
inline bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, &ss, sizeof sin);
    return (ntohl(sin.sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, &ss, sizeof sin6);
    const in6_addr& a = sin6.sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

// Without the port: "127.0.0.1", "::1" (no brackets). Empty for other families.
inline std::string format_ip(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa == nullptr) return {};
  if (sa->sa_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, sa, sizeof sin);
    ::inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, sa, sizeof sin6);
    ::inet_ntop(AF_INET6, &sin6.sin6_addr, buf, sizeof buf);
  }
  return buf;
}

inline std::string format_sockaddr(const sockaddr* sa) {
  if (sa == nullptr) return "-";
  if (sa->sa_family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, sa, sizeof sin);
    return format_ip(sa) + ":" + std::to_string(ntohs(sin.sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, sa, sizeof sin6);
    std::string out = "[" + format_ip(sa);
    if (sin6.sin6_scope_id != 0) {
      char ifname[IF_NAMESIZE] = {};
      out += '%';
      out += ::if_indextoname(sin6.sin6_scope_id, ifname) != nullptr ? std::string(ifname)
                                                                     : std::to_string(sin6.sin6_scope_id);
    }
    return out + "]:" + std::to_string(ntohs(sin6.sin6_port));
  }
  return "unknown";
}

// Same family and address (and IPv6 scope); ports are not compared.
inline bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    sockaddr_in x{};
    sockaddr_in y{};
    std::memcpy(&x, &a, sizeof x);
    std::memcpy(&y, &b, sizeof y);
    return x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    sockaddr_in6 x{};
    sockaddr_in6 y{};
    std::memcpy(&x, &a, sizeof x);
    std::memcpy(&y, &b, sizeof y);
    return std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0 && x.sin6_scope_id == y.sin6_scope_id;
  }
  return false;
}

}  // namespace sluice
