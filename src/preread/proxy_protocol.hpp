// The PROXY protocol (v1 text, v2 binary), as HAProxy specifies it: a header
// a proxy sends before any other byte so the server learns the real client
// and destination addresses. Pure: no I/O, no allocation beyond the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

namespace sluice::preread {

// v2 TLV types sluice writes.
inline constexpr std::uint8_t kTlvAlpn = 0x01;
inline constexpr std::uint8_t kTlvAuthority = 0x02;  // the SNI

// Largest header a parser accepts: v1 is at most 107 bytes; v2 is 16 bytes
// plus up to 65 535 more, but nothing legitimate needs more than this.
inline constexpr std::size_t kMaxProxyHeader = 4096;

// Appends a v1 header ("PROXY TCP4 src dst sport dport\r\n") for a
// connection from `src` to `dst`. An IPv4-mapped IPv6 address is written as
// IPv4; when the families still differ, "PROXY UNKNOWN\r\n".
void append_v1(std::vector<std::uint8_t>& out, const sockaddr* src, const sockaddr* dst);

// Appends a v2 header (PROXY command, TCP over IPv4 or IPv6). When the
// families differ, IPv4 addresses are written as IPv4-mapped IPv6. `alpn`
// (first protocol only) and `authority` (the SNI) become TLVs when not empty.
void append_v2(std::vector<std::uint8_t>& out, const sockaddr* src, const sockaddr* dst, std::string_view alpn,
               std::string_view authority);

// Parsing, for listeners with accept_proxy.
struct ProxyHeader {
  enum class Status { need_more, ok, invalid };
  Status status = Status::need_more;
  std::size_t length = 0;         // header bytes, with ok
  // v1 UNKNOWN, v2 LOCAL, or a v2 family without a usable address (UNSPEC,
  // AF_UNIX, UDP): keep the connection's own addresses.
  bool local = false;
  sockaddr_storage source{};      // with ok and !local
  sockaddr_storage destination{};
  std::string error;              // with invalid
};

// Looks at the first bytes of a connection. need_more until a whole header
// (v1 or v2, detected by its signature) is present; invalid for anything
// else, a malformed header, or one longer than kMaxProxyHeader.
ProxyHeader parse_proxy_header(std::span<const std::uint8_t> data);

}  // namespace sluice::preread
