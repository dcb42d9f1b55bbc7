#include "preread/proxy_protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "sluice/address.hpp"

namespace sluice::preread {

namespace {

constexpr std::uint8_t kV2Signature[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};
constexpr std::string_view kV1Prefix = "PROXY ";
constexpr std::size_t kV1Max = 107;

// An address as the family it really is: IPv4-mapped IPv6 becomes IPv4.
sockaddr_storage canonical(const sockaddr* sa) {
  sockaddr_storage out{};
  if (sa->sa_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&out);
      a4->sin_family = AF_INET;
      a4->sin_port = a6->sin6_port;
      std::memcpy(&a4->sin_addr, a6->sin6_addr.s6_addr + 12, 4);
      return out;
    }
    std::memcpy(&out, sa, sizeof(sockaddr_in6));
  } else if (sa->sa_family == AF_INET) {
    std::memcpy(&out, sa, sizeof(sockaddr_in));
  }
  return out;
}

sockaddr_in6 as_v6(const sockaddr_storage& ss) {
  sockaddr_in6 out{};
  out.sin6_family = AF_INET6;
  if (ss.ss_family == AF_INET6) return *reinterpret_cast<const sockaddr_in6*>(&ss);
  const auto* a4 = reinterpret_cast<const sockaddr_in*>(&ss);
  out.sin6_port = a4->sin_port;
  out.sin6_addr.s6_addr[10] = 0xff;
  out.sin6_addr.s6_addr[11] = 0xff;
  std::memcpy(out.sin6_addr.s6_addr + 12, &a4->sin_addr, 4);
  return out;
}

std::uint16_t port_of(const sockaddr_storage& ss) {
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
}

void append(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

void append_u16(std::vector<std::uint8_t>& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v & 0xff));
}

void append_tlv(std::vector<std::uint8_t>& out, std::uint8_t type, std::string_view value) {
  const std::size_t n = std::min<std::size_t>(value.size(), 0xffff);
  out.push_back(type);
  append_u16(out, static_cast<std::uint16_t>(n));
  append(out, value.data(), n);
}

ProxyHeader invalid(std::string why) {
  ProxyHeader h;
  h.status = ProxyHeader::Status::invalid;
  h.error = std::move(why);
  return h;
}

bool parse_port(std::string_view s, std::uint16_t& port) {
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return false;
  unsigned v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > 65535) return false;
  port = static_cast<std::uint16_t>(v);
  return true;
}

bool parse_addr(std::string_view text, int family, std::uint16_t port, sockaddr_storage& out) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (text.empty() || text.size() >= sizeof buf) return false;
  std::memcpy(buf, text.data(), text.size());
  out = {};
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&out);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    return inet_pton(AF_INET, buf, &a->sin_addr) == 1;
  }
  auto* a = reinterpret_cast<sockaddr_in6*>(&out);
  a->sin6_family = AF_INET6;
  a->sin6_port = htons(port);
  return inet_pton(AF_INET6, buf, &a->sin6_addr) == 1;
}

ProxyHeader parse_v1(std::span<const std::uint8_t> data) {
  const std::string_view text(reinterpret_cast<const char*>(data.data()), std::min(data.size(), kV1Max));
  const std::size_t crlf = text.find("\r\n");
  if (crlf == std::string_view::npos) {
    if (data.size() >= kV1Max) return invalid("PROXY v1 header longer than 107 bytes");
    if (text.find('\n') != std::string_view::npos) return invalid("PROXY v1 header without CRLF");
    return {};
  }
  std::string_view line = text.substr(kV1Prefix.size(), crlf - kV1Prefix.size());
  ProxyHeader h;
  h.status = ProxyHeader::Status::ok;
  h.length = crlf + 2;
  if (line.starts_with("UNKNOWN")) {
    h.local = true;
    return h;
  }
  std::string_view parts[5];
  std::size_t n = 0;
  for (;;) {
    const std::size_t sp = line.find(' ');
    if (n == 5) return invalid("PROXY v1 header: wrong number of fields");
    parts[n++] = line.substr(0, sp);
    if (sp == std::string_view::npos) break;
    line.remove_prefix(sp + 1);
  }
  if (n != 5) return invalid("PROXY v1 header: wrong number of fields");
  int family = 0;
  if (parts[0] == "TCP4") {
    family = AF_INET;
  } else if (parts[0] == "TCP6") {
    family = AF_INET6;
  } else {
    return invalid("PROXY v1 header: unknown protocol");
  }
  std::uint16_t sport = 0;
  std::uint16_t dport = 0;
  if (!parse_port(parts[3], sport) || !parse_port(parts[4], dport)) return invalid("PROXY v1 header: bad port");
  if (!parse_addr(parts[1], family, sport, h.source) || !parse_addr(parts[2], family, dport, h.destination)) {
    return invalid("PROXY v1 header: bad address");
  }
  return h;
}

ProxyHeader parse_v2(std::span<const std::uint8_t> data) {
  if (data.size() < 16) return {};
  const std::uint8_t ver_cmd = data[12];
  const std::uint8_t fam = data[13];
  const std::size_t len = (static_cast<std::size_t>(data[14]) << 8) | data[15];
  if ((ver_cmd >> 4) != 2) return invalid("PROXY v2 header: bad version");
  const std::uint8_t cmd = ver_cmd & 0x0f;
  if (cmd > 1) return invalid("PROXY v2 header: bad command");
  if (16 + len > kMaxProxyHeader) return invalid("PROXY v2 header too long");
  if (data.size() < 16 + len) return {};
  ProxyHeader h;
  h.status = ProxyHeader::Status::ok;
  h.length = 16 + len;
  const std::uint8_t* body = data.data() + 16;
  if (cmd == 0) {  // LOCAL: health checks from the proxy itself
    h.local = true;
    return h;
  }
  switch (fam) {
    case 0x11: {  // TCP over IPv4
      if (len < 12) return invalid("PROXY v2 header: short IPv4 address block");
      auto* s = reinterpret_cast<sockaddr_in*>(&h.source);
      auto* d = reinterpret_cast<sockaddr_in*>(&h.destination);
      s->sin_family = d->sin_family = AF_INET;
      std::memcpy(&s->sin_addr, body, 4);
      std::memcpy(&d->sin_addr, body + 4, 4);
      std::memcpy(&s->sin_port, body + 8, 2);
      std::memcpy(&d->sin_port, body + 10, 2);
      return h;
    }
    case 0x21: {  // TCP over IPv6
      if (len < 36) return invalid("PROXY v2 header: short IPv6 address block");
      auto* s = reinterpret_cast<sockaddr_in6*>(&h.source);
      auto* d = reinterpret_cast<sockaddr_in6*>(&h.destination);
      s->sin6_family = d->sin6_family = AF_INET6;
      std::memcpy(&s->sin6_addr, body, 16);
      std::memcpy(&d->sin6_addr, body + 16, 16);
      std::memcpy(&s->sin6_port, body + 32, 2);
      std::memcpy(&d->sin6_port, body + 34, 2);
      return h;
    }
    case 0x00:  // UNSPEC: keep the real peer
      h.local = true;
      return h;
    case 0x12:  // UDP over IPv4
    case 0x22:  // UDP over IPv6
    case 0x31:  // UNIX stream
    case 0x32:  // UNIX datagram
    {
      // Valid, but no address sluice can use (a path is not a client
      // address). The specification has a receiver that does not support a
      // valid combination fall back to UNSPEC: the connection's own
      // addresses stand, as with LOCAL.
      const std::size_t need = (fam >> 4) == 1 ? 12 : (fam >> 4) == 2 ? 36 : 216;
      if (len < need) return invalid("PROXY v2 header: short address block");
      h.local = true;
      return h;
    }
    default:
      return invalid("PROXY v2 header: unknown address family or protocol");
  }
}

}  // namespace

void append_v1(std::vector<std::uint8_t>& out, const sockaddr* src, const sockaddr* dst) {
  const sockaddr_storage s = canonical(src);
  const sockaddr_storage d = canonical(dst);
  if (s.ss_family != d.ss_family || (s.ss_family != AF_INET && s.ss_family != AF_INET6)) {
    append(out, "PROXY UNKNOWN\r\n", 15);
    return;
  }
  const bool v4 = s.ss_family == AF_INET;
  const std::string line = std::string("PROXY ") + (v4 ? "TCP4 " : "TCP6 ") +
                           format_ip(reinterpret_cast<const sockaddr*>(&s)) + " " +
                           format_ip(reinterpret_cast<const sockaddr*>(&d)) + " " +
                           std::to_string(port_of(s)) + " " + std::to_string(port_of(d)) + "\r\n";
  append(out, line.data(), line.size());
}

void append_v2(std::vector<std::uint8_t>& out, const sockaddr* src, const sockaddr* dst, std::string_view alpn,
               std::string_view authority) {
  const sockaddr_storage s = canonical(src);
  const sockaddr_storage d = canonical(dst);
  append(out, kV2Signature, sizeof kV2Signature);
  out.push_back(0x21);  // version 2, PROXY
  const std::size_t len_at = out.size() + 1;
  if (s.ss_family == AF_INET && d.ss_family == AF_INET) {
    out.push_back(0x11);
    append_u16(out, 0);
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&s);
    const auto* d4 = reinterpret_cast<const sockaddr_in*>(&d);
    append(out, &s4->sin_addr, 4);
    append(out, &d4->sin_addr, 4);
    append(out, &s4->sin_port, 2);
    append(out, &d4->sin_port, 2);
  } else {
    out.push_back(0x21);
    append_u16(out, 0);
    const sockaddr_in6 s6 = as_v6(s);
    const sockaddr_in6 d6 = as_v6(d);
    append(out, &s6.sin6_addr, 16);
    append(out, &d6.sin6_addr, 16);
    append(out, &s6.sin6_port, 2);
    append(out, &d6.sin6_port, 2);
  }
  const std::string_view first_alpn = alpn.substr(0, alpn.find(','));
  if (!first_alpn.empty()) append_tlv(out, kTlvAlpn, first_alpn);
  if (!authority.empty()) append_tlv(out, kTlvAuthority, authority);
  const std::size_t len = out.size() - (len_at + 2);
  out[len_at] = static_cast<std::uint8_t>(len >> 8);
  out[len_at + 1] = static_cast<std::uint8_t>(len & 0xff);
}

ProxyHeader parse_proxy_header(std::span<const std::uint8_t> data) {
  // Decide the version from as many bytes as are here.
  const std::size_t n12 = std::min<std::size_t>(data.size(), sizeof kV2Signature);
  const bool maybe_v2 = std::memcmp(data.data(), kV2Signature, n12) == 0;
  const std::size_t n6 = std::min(data.size(), kV1Prefix.size());
  const bool maybe_v1 = std::memcmp(data.data(), kV1Prefix.data(), n6) == 0;
  if (data.empty() || (!maybe_v1 && !maybe_v2)) {
    return data.empty() ? ProxyHeader{} : invalid("no PROXY protocol header");
  }
  if (maybe_v2 && data.size() >= sizeof kV2Signature) return parse_v2(data);
  if (maybe_v1 && data.size() >= kV1Prefix.size()) return parse_v1(data);
  return {};
}

}  // namespace sluice::preread
