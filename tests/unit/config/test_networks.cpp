// parse_cidr and cidr_contains: the address lists of listeners (allow, deny,
// trusted_proxies) and the data path's membership test.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include <doctest/doctest.h>

#include "config/values.hpp"

using sluice::Cidr;

namespace {

Cidr cidr(std::string_view text) {
  std::string error;
  auto parsed = sluice::parse_cidr(text, error);
  REQUIRE_MESSAGE(parsed.has_value(), error);
  return *parsed;
}

std::string cidr_error(std::string_view text) {
  std::string error;
  if (sluice::parse_cidr(text, error)) return "ok";
  return error;
}

sockaddr_storage v4(const char* text, std::uint16_t port = 1234) {
  sockaddr_storage ss{};
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  REQUIRE(::inet_pton(AF_INET, text, &sin.sin_addr) == 1);
  std::memcpy(&ss, &sin, sizeof sin);
  return ss;
}

sockaddr_storage v6(const char* text) {
  sockaddr_storage ss{};
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(443);
  REQUIRE(::inet_pton(AF_INET6, text, &sin6.sin6_addr) == 1);
  std::memcpy(&ss, &sin6, sizeof sin6);
  return ss;
}

bool contains(std::string_view network, const sockaddr_storage& ss) {
  return sluice::cidr_contains(cidr(network), reinterpret_cast<const sockaddr*>(&ss));
}

}  // namespace

TEST_CASE("parse_cidr: networks and bare addresses") {
  const Cidr a = cidr("10.0.0.0/8");
  CHECK(a.text == "10.0.0.0/8");
  CHECK(a.family == AF_INET);
  CHECK(a.prefix == 8);
  CHECK(a.addr[0] == 10);
  CHECK(a.addr[1] == 0);

  const Cidr host = cidr("192.0.2.7");
  CHECK(host.family == AF_INET);
  CHECK(host.prefix == 32);
  CHECK(host.addr[3] == 7);

  const Cidr six = cidr("2001:db8::/32");
  CHECK(six.family == AF_INET6);
  CHECK(six.prefix == 32);
  CHECK(six.addr[0] == 0x20);
  CHECK(six.addr[3] == 0xb8);

  CHECK(cidr("::1").prefix == 128);
  CHECK(cidr("::/0").prefix == 0);
  CHECK(cidr("0.0.0.0/0").prefix == 0);
  CHECK(cidr("10.1.2.3/32").prefix == 32);
  CHECK(cidr("10.1.2.0/23").addr[2] == 2);
}

TEST_CASE("parse_cidr rejects malformed networks and says why") {
  const std::string like = "must be a network like \"10.0.0.0/8\" or \"2001:db8::/32\", or one address, got ";
  struct Case {
    const char* text;
    std::string expected;
  };
  const Case cases[] = {
      {"", like + "\"\""},
      {"10.0.0", like + "\"10.0.0\""},
      {"256.0.0.0/8", like + "\"256.0.0.0/8\""},
      {"example.com", like + "\"example.com\""},
      {"[::1]/128", like + "\"[::1]/128\""},
      {"fe80::1%eth0", like + "\"fe80::1%eth0\""},
      {" 10.0.0.0/8", like + "\" 10.0.0.0/8\""},
      {"10.0.0.0/33", "must have a prefix length 0..32 after \"/\", got \"10.0.0.0/33\""},
      {"10.0.0.0/", "must have a prefix length 0..32 after \"/\", got \"10.0.0.0/\""},
      {"10.0.0.0/-1", "must have a prefix length 0..32 after \"/\", got \"10.0.0.0/-1\""},
      {"10.0.0.0/8/8", "must have a prefix length 0..32 after \"/\", got \"10.0.0.0/8/8\""},
      {"10.0.0.0/0008", "must have a prefix length 0..32 after \"/\", got \"10.0.0.0/0008\""},
      {"::/129", "must have a prefix length 0..128 after \"/\", got \"::/129\""},
      {"10.1.2.3/8",
       "must not have host bits set (bits after the prefix length): \"10.1.2.3/8\" has them; the network is "
       "\"10.0.0.0/8\""},
      {"192.168.1.1/24",
       "must not have host bits set (bits after the prefix length): \"192.168.1.1/24\" has them; the network is "
       "\"192.168.1.0/24\""},
      {"2001:db8::1/64",
       "must not have host bits set (bits after the prefix length): \"2001:db8::1/64\" has them; the network is "
       "\"2001:db8::/64\""},
      {"10.0.0.1/31",
       "must not have host bits set (bits after the prefix length): \"10.0.0.1/31\" has them; the network is "
       "\"10.0.0.0/31\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(cidr_error(c.text) == c.expected);
  }
}

TEST_CASE("cidr_contains: IPv4") {
  CHECK(contains("10.0.0.0/8", v4("10.255.1.2")));
  CHECK_FALSE(contains("10.0.0.0/8", v4("11.0.0.0")));
  CHECK(contains("192.168.1.0/25", v4("192.168.1.127")));
  CHECK_FALSE(contains("192.168.1.0/25", v4("192.168.1.128")));
  CHECK(contains("192.0.2.7", v4("192.0.2.7", 1)));
  CHECK(contains("192.0.2.7", v4("192.0.2.7", 65535)));  // the port does not matter
  CHECK_FALSE(contains("192.0.2.7", v4("192.0.2.6")));
  CHECK(contains("0.0.0.0/0", v4("203.0.113.9")));
  CHECK(contains("10.1.2.0/23", v4("10.1.3.255")));
  CHECK_FALSE(contains("10.1.2.0/23", v4("10.1.4.0")));
}

TEST_CASE("cidr_contains: IPv6, and IPv4 clients seen through a dual-stack socket") {
  CHECK(contains("2001:db8::/32", v6("2001:db8:ffff::1")));
  CHECK_FALSE(contains("2001:db8::/32", v6("2001:db9::1")));
  CHECK(contains("::1", v6("::1")));
  CHECK_FALSE(contains("::1", v6("::2")));
  CHECK(contains("::/0", v6("fe80::1")));
  CHECK(contains("2001:db8::/127", v6("2001:db8::1")));
  CHECK_FALSE(contains("2001:db8::/127", v6("2001:db8::2")));

  // An IPv4-mapped address is matched as the IPv4 address it carries.
  CHECK(contains("10.0.0.0/8", v6("::ffff:10.1.2.3")));
  CHECK_FALSE(contains("10.0.0.0/8", v6("::ffff:11.1.2.3")));
  // ...but a plain IPv6 address never matches an IPv4 network, even with the same low bits.
  CHECK_FALSE(contains("10.0.0.0/8", v6("::a01:203")));
  CHECK_FALSE(contains("0.0.0.0/0", v6("2001:db8::1")));
  // IPv6 networks see IPv4 addresses in their mapped form.
  CHECK(contains("::ffff:0:0/96", v4("198.51.100.1")));
  CHECK(contains("::ffff:10.0.0.0/104", v4("10.9.9.9")));
  CHECK_FALSE(contains("::ffff:10.0.0.0/104", v4("11.9.9.9")));
  CHECK(contains("::/0", v4("127.0.0.1")));
  CHECK_FALSE(contains("2001:db8::/32", v4("32.1.13.184")));
}

TEST_CASE("cidr_contains: other families and null never match") {
  const Cidr all = cidr("0.0.0.0/0");
  CHECK_FALSE(sluice::cidr_contains(all, nullptr));
  sockaddr_storage unix_like{};
  unix_like.ss_family = AF_UNIX;
  CHECK_FALSE(sluice::cidr_contains(all, reinterpret_cast<const sockaddr*>(&unix_like)));
  CHECK_FALSE(sluice::cidr_contains(cidr("::/0"), reinterpret_cast<const sockaddr*>(&unix_like)));
  Cidr empty;  // family 0: matches nothing
  const auto addr = v4("10.0.0.1");
  CHECK_FALSE(sluice::cidr_contains(empty, reinterpret_cast<const sockaddr*>(&addr)));
}
