#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "preread/proxy_protocol.hpp"

#include "bytes.hpp"

using namespace sluice::preread;
using sluice::test::bytes;

namespace {

sockaddr_storage addr(const char* ip, std::uint16_t port) {
  sockaddr_storage ss{};
  if (std::strchr(ip, ':') != nullptr) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    inet_pton(AF_INET, ip, &a->sin_addr);
  }
  return ss;
}

const sockaddr* sa(const sockaddr_storage& ss) { return reinterpret_cast<const sockaddr*>(&ss); }

std::string text_of(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
}

}  // namespace

TEST_CASE("v1 headers are written as the specification shows") {
  std::vector<std::uint8_t> out;
  const auto s = addr("192.0.2.1", 56324);
  const auto d = addr("192.0.2.9", 443);
  append_v1(out, sa(s), sa(d));
  CHECK(std::string(out.begin(), out.end()) == "PROXY TCP4 192.0.2.1 192.0.2.9 56324 443\r\n");
  out.clear();
  const auto s6 = addr("2001:db8::1", 1000);
  const auto d6 = addr("::1", 5432);
  append_v1(out, sa(s6), sa(d6));
  CHECK(std::string(out.begin(), out.end()) == "PROXY TCP6 2001:db8::1 ::1 1000 5432\r\n");
  out.clear();
  const auto mapped = addr("::ffff:10.0.0.1", 7);
  append_v1(out, sa(mapped), sa(d));
  CHECK(std::string(out.begin(), out.end()) == "PROXY TCP4 10.0.0.1 192.0.2.9 7 443\r\n");
  out.clear();
  append_v1(out, sa(s), sa(d6));
  CHECK(std::string(out.begin(), out.end()) == "PROXY UNKNOWN\r\n");
}

TEST_CASE("v2 round trip with TLVs") {
  std::vector<std::uint8_t> out;
  const auto s = addr("192.0.2.1", 56324);
  const auto d = addr("192.0.2.9", 443);
  append_v2(out, sa(s), sa(d), "h2,http/1.1", "db.example");
  REQUIRE(out.size() == 16 + 12 + 3 + 2 + 3 + 10);
  CHECK(out[12] == 0x21);
  CHECK(out[13] == 0x11);
  const ProxyHeader h = parse_proxy_header(out);
  REQUIRE(h.status == ProxyHeader::Status::ok);
  CHECK(h.length == out.size());
  CHECK(text_of(h.source) == "192.0.2.1:56324");
  CHECK(text_of(h.destination) == "192.0.2.9:443");
  // Mixed families become IPv6.
  out.clear();
  const auto d6 = addr("2001:db8::9", 443);
  append_v2(out, sa(s), sa(d6), "", "");
  const ProxyHeader h6 = parse_proxy_header(out);
  REQUIRE(h6.status == ProxyHeader::Status::ok);
  CHECK(text_of(h6.source) == "[::ffff:192.0.2.1]:56324");
  CHECK(text_of(h6.destination) == "[2001:db8::9]:443");
}

TEST_CASE("v1 parsing: whole, split, and followed by data") {
  const auto in = bytes("PROXY TCP4 203.0.113.7 192.0.2.9 40000 443\r\nGET / HTTP/1.0\r\n");
  const ProxyHeader h = parse_proxy_header(in);
  REQUIRE(h.status == ProxyHeader::Status::ok);
  CHECK(h.length == 44);
  CHECK(text_of(h.source) == "203.0.113.7:40000");
  for (std::size_t cut = 0; cut < 44; ++cut) {
    CHECK(parse_proxy_header(std::span(in).first(cut)).status == ProxyHeader::Status::need_more);
  }
  const auto six = bytes("PROXY TCP6 2001:db8::7 ::1 1 2\r\n");
  const ProxyHeader h6 = parse_proxy_header(six);
  REQUIRE(h6.status == ProxyHeader::Status::ok);
  CHECK(text_of(h6.source) == "[2001:db8::7]:1");
  const ProxyHeader unknown = parse_proxy_header(bytes("PROXY UNKNOWN\r\n"));
  REQUIRE(unknown.status == ProxyHeader::Status::ok);
  CHECK(unknown.local);
}

TEST_CASE("malformed, truncated-forever and oversized headers are invalid") {
  for (const char* bad : {
           "GET / HTTP/1.1\r\n",
           "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
           "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
           "PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n",
           "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
           "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
           "PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
           "PROXY TCP4 ::1 ::1 1 2\r\n",
           "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
       }) {
    CAPTURE(bad);
    CHECK(parse_proxy_header(bytes(bad)).status == ProxyHeader::Status::invalid);
  }
  std::string longline = "PROXY TCP4 " + std::string(200, '1');
  CHECK(parse_proxy_header(bytes(longline)).status == ProxyHeader::Status::invalid);
  // v2 claiming more than we accept.
  std::vector<std::uint8_t> v2 = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
                                  0x21, 0x11, 0xff, 0xff};
  CHECK(parse_proxy_header(v2).status == ProxyHeader::Status::invalid);
  v2[14] = 0;
  v2[15] = 4;  // IPv4 needs 12 bytes
  v2.insert(v2.end(), 4, 0);
  CHECK(parse_proxy_header(v2).status == ProxyHeader::Status::invalid);
  v2[12] = 0x31;  // version 3
  CHECK(parse_proxy_header(v2).status == ProxyHeader::Status::invalid);
  v2[12] = 0x20;  // LOCAL
  const ProxyHeader local = parse_proxy_header(v2);
  REQUIRE(local.status == ProxyHeader::Status::ok);
  CHECK(local.local);
}

namespace {

// A v2 PROXY header: the signature, version 2 with `command`, the family and
// protocol byte, and `body` (addresses, then any TLVs).
std::vector<std::uint8_t> v2_header(std::uint8_t command, std::uint8_t family, const std::vector<std::uint8_t>& body) {
  const std::uint8_t head[16] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
                                 static_cast<std::uint8_t>(0x20 | command), family,
                                 static_cast<std::uint8_t>(body.size() >> 8),
                                 static_cast<std::uint8_t>(body.size() & 0xff)};
  std::vector<std::uint8_t> out(sizeof head + body.size());
  std::copy(std::begin(head), std::end(head), out.begin());
  std::copy(body.begin(), body.end(), out.begin() + sizeof head);
  return out;
}

// Two sun_path fields of 108 bytes each, as a proxy on a UNIX socket sends them.
std::vector<std::uint8_t> unix_addresses() {
  std::vector<std::uint8_t> body(216, 0);
  const std::string src = "/run/client.sock";
  const std::string dst = "/run/haproxy/pg.sock";
  std::copy(src.begin(), src.end(), body.begin());
  std::copy(dst.begin(), dst.end(), body.begin() + 108);
  return body;
}

}  // namespace

TEST_CASE("v2 with a family that carries no usable address falls back to the connection's own addresses") {
  struct Case {
    const char* what;
    std::uint8_t family;
    std::size_t address_bytes;
  };
  for (const Case& c : {Case{"UNSPEC", 0x00, 0}, Case{"UNIX stream", 0x31, 216}, Case{"UNIX datagram", 0x32, 216},
                        Case{"UDP over IPv4", 0x12, 12}, Case{"UDP over IPv6", 0x22, 36}}) {
    CAPTURE(c.what);
    std::vector<std::uint8_t> body = c.family >> 4 == 3 ? unix_addresses() : std::vector<std::uint8_t>(c.address_bytes, 7);
    // A TLV after the addresses is skipped with them.
    for (std::uint8_t b : {kTlvAuthority, std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{'x'}}) body.push_back(b);
    auto data = v2_header(1, c.family, body);
    const std::size_t header_size = data.size();
    data.push_back('Q');  // the client's first byte
    const ProxyHeader h = parse_proxy_header(data);
    REQUIRE(h.status == ProxyHeader::Status::ok);
    CHECK(h.local);
    CHECK(h.length == header_size);
    // Until the whole address block is here, wait.
    CHECK(parse_proxy_header(std::span(data).first(16 + c.address_bytes / 2)).status ==
          ProxyHeader::Status::need_more);
  }
  // LOCAL with UNIX addresses: the same.
  const ProxyHeader local = parse_proxy_header(v2_header(0, 0x31, unix_addresses()));
  REQUIRE(local.status == ProxyHeader::Status::ok);
  CHECK(local.local);
}

TEST_CASE("v2 families the specification does not define, and short address blocks, are invalid") {
  for (std::uint8_t family : {0x01, 0x02, 0x10, 0x13, 0x20, 0x30, 0x33, 0x41, 0xf1}) {
    CAPTURE(static_cast<int>(family));
    const ProxyHeader h = parse_proxy_header(v2_header(1, family, std::vector<std::uint8_t>(216, 0)));
    CHECK(h.status == ProxyHeader::Status::invalid);
  }
  for (std::uint8_t family : {0x31, 0x32}) {
    CAPTURE(static_cast<int>(family));
    CHECK(parse_proxy_header(v2_header(1, family, std::vector<std::uint8_t>(215, 0))).status ==
          ProxyHeader::Status::invalid);
  }
  CHECK(parse_proxy_header(v2_header(1, 0x22, std::vector<std::uint8_t>(35, 0))).status ==
        ProxyHeader::Status::invalid);
  CHECK(parse_proxy_header(v2_header(1, 0x12, std::vector<std::uint8_t>(11, 0))).status ==
        ProxyHeader::Status::invalid);
}
