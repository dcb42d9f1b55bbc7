// Scalar values: durations, addresses, socket address formatting.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include <doctest/doctest.h>

#include "config/quote.hpp"
#include "config/values.hpp"

using namespace std::chrono_literals;
using sluice::Duration;

namespace {

std::string duration_error(std::string_view text) {
  std::string error;
  if (sluice::parse_duration(text, error)) return "ok";
  return error;
}

std::string address_error(std::string_view text, bool allow_port_zero) {
  std::string error;
  if (sluice::parse_address(text, allow_port_zero, error)) return "ok";
  return error;
}

}  // namespace

TEST_CASE("parse_duration accepts one integer and one unit") {
  struct Case {
    const char* text;
    Duration expected;
  };
  const Case cases[] = {
      {"250ms", 250ms}, {"0s", 0ms},        {"0ms", 0ms},        {"3s", 3000ms},
      {"5m", 300000ms}, {"1h", 3600000ms},  {"168h", 168h},      {"10080m", 168h},
      {"007s", 7s},     {"604800s", 168h},  {"604800000ms", 168h},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    std::string error;
    const auto parsed = sluice::parse_duration(c.text, error);
    REQUIRE(parsed.has_value());
    CHECK(*parsed == c.expected);
    CHECK(error.empty());
  }
}

TEST_CASE("parse_duration rejects everything else") {
  const std::string like = "must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got ";
  struct Case {
    const char* text;
    std::string expected;
  };
  const Case cases[] = {
      {"", like + "\"\""},
      {"3", like + "\"3\""},
      {"s", like + "\"s\""},
      {"3 seconds", like + "\"3 seconds\""},
      {"3 s", like + "\"3 s\""},
      {" 3s", like + "\" 3s\""},
      {"3s ", like + "\"3s \""},
      {"-1s", like + "\"-1s\""},
      {"+1s", like + "\"+1s\""},
      {"1.5s", like + "\"1.5s\""},
      {"1h30m", like + "\"1h30m\""},
      {"3S", like + "\"3S\""},
      {"3d", like + "\"3d\""},
      {"3us", like + "\"3us\""},
      {"99999999999999999999999x", like + "\"99999999999999999999999x\""},
      {"169h", "must be at most 7 days (\"168h\"), got \"169h\""},
      {"604801s", "must be at most 7 days (\"168h\"), got \"604801s\""},
      {"604800001ms", "must be at most 7 days (\"168h\"), got \"604800001ms\""},
      {"99999999999999999999999h", "must be at most 7 days (\"168h\"), got \"99999999999999999999999h\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(duration_error(c.text) == c.expected);
  }
}

TEST_CASE("parse_address: numeric IPv4 and IPv6") {
  std::string error;
  auto v4 = sluice::parse_address("10.1.2.3:5432", false, error);
  REQUIRE(v4.has_value());
  CHECK(v4->text == "10.1.2.3:5432");
  CHECK(v4->host == "10.1.2.3");
  CHECK(v4->port == 5432);
  REQUIRE(v4->addr.ss_family == AF_INET);
  CHECK(v4->addr_len == sizeof(sockaddr_in));
  sockaddr_in sin{};
  std::memcpy(&sin, &v4->addr, sizeof sin);
  CHECK(ntohs(sin.sin_port) == 5432);
  CHECK(ntohl(sin.sin_addr.s_addr) == 0x0a010203U);
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&v4->addr)) == "10.1.2.3:5432");

  auto v6 = sluice::parse_address("[::1]:80", false, error);
  REQUIRE(v6.has_value());
  CHECK(v6->text == "[::1]:80");
  CHECK(v6->host == "::1");
  CHECK(v6->port == 80);
  REQUIRE(v6->addr.ss_family == AF_INET6);
  CHECK(v6->addr_len == sizeof(sockaddr_in6));
  sockaddr_in6 sin6{};
  std::memcpy(&sin6, &v6->addr, sizeof sin6);
  CHECK(ntohs(sin6.sin6_port) == 80);
  CHECK(IN6_IS_ADDR_LOOPBACK(&sin6.sin6_addr));
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&v6->addr)) == "[::1]:80");

  auto any6 = sluice::parse_address("[::]:65535", false, error);
  REQUIRE(any6.has_value());
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&any6->addr)) == "[::]:65535");

  auto mapped = sluice::parse_address("[2001:db8::a:1]:443", false, error);
  REQUIRE(mapped.has_value());
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&mapped->addr)) == "[2001:db8::a:1]:443");

  auto any4 = sluice::parse_address("0.0.0.0:1", false, error);
  REQUIRE(any4.has_value());
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&any4->addr)) == "0.0.0.0:1");
}

TEST_CASE("parse_address: port 0 only when allowed") {
  std::string error;
  auto zero = sluice::parse_address("1.2.3.4:0", true, error);
  REQUIRE(zero.has_value());
  CHECK(zero->port == 0);
  CHECK(address_error("1.2.3.4:0", false) == "must have a port 1..65535, got \"1.2.3.4:0\"");
  CHECK(address_error("[::1]:0", false) == "must have a port 1..65535, got \"[::1]:0\"");
  CHECK(address_error("[::1]:0", true) == "ok");
}

TEST_CASE("parse_address: host names resolve") {
  std::string error;
  auto local = sluice::parse_address("localhost:80", false, error);
  REQUIRE_MESSAGE(local.has_value(), error);
  CHECK(local->host == "localhost");
  CHECK(local->port == 80);
  CHECK(local->text == "localhost:80");
  const auto text = sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&local->addr));
  CHECK((text == "127.0.0.1:80" || text == "[::1]:80"));

  // .invalid never resolves (RFC 6761); the reason comes from the resolver.
  const auto bad = address_error("nothing.invalid:80", false);
  CHECK(bad.rfind("must name a host that resolves, got \"nothing.invalid:80\": ", 0) == 0);
  CHECK(bad.size() > std::string("must name a host that resolves, got \"nothing.invalid:80\": ").size());
}

TEST_CASE("parse_address rejects malformed input") {
  const std::string shape = "must be \"host:port\" or \"[ipv6]:port\"";
  struct Case {
    const char* text;
    bool allow_port_zero;
    std::string expected;
  };
  const Case cases[] = {
      {"", true, shape + " (missing port), got \"\""},
      {"1.2.3.4", true, shape + " (missing port), got \"1.2.3.4\""},
      {"localhost", true, shape + " (missing port), got \"localhost\""},
      {"[::1", true, shape + " (missing \"]\"), got \"[::1\""},
      {"[::1]", true, shape + " (missing port), got \"[::1]\""},
      {"[::1]80", true, shape + " (missing port), got \"[::1]80\""},
      {"::1:80", true, "must put an IPv6 address in brackets, like \"[::1]:5432\", got \"::1:80\""},
      {"::1", true, "must put an IPv6 address in brackets, like \"[::1]:5432\", got \"::1\""},
      {":80", true, "must name a host (\"0.0.0.0\" or \"[::]\" for all addresses), got \":80\""},
      {"[]:80", true, "must name a host (\"0.0.0.0\" or \"[::]\" for all addresses), got \"[]:80\""},
      {"1.2.3.4:", true, "must have a port 0..65535, got \"1.2.3.4:\""},
      {"1.2.3.4:65536", true, "must have a port 0..65535, got \"1.2.3.4:65536\""},
      {"1.2.3.4:123456", false, "must have a port 1..65535, got \"1.2.3.4:123456\""},
      {"1.2.3.4:-1", false, "must have a port 1..65535, got \"1.2.3.4:-1\""},
      {"1.2.3.4:http", false, "must have a port 1..65535, got \"1.2.3.4:http\""},
      {"1.2.3.4: 80", false, "must have a port 1..65535, got \"1.2.3.4: 80\""},
      {"[1.2.3.4]:80", false, "must have a numeric IPv6 address inside \"[]\", got \"[1.2.3.4]:80\""},
      {"[localhost]:80", false, "must have a numeric IPv6 address inside \"[]\", got \"[localhost]:80\""},
      {"1.2.3:80", false, "must have a valid IPv4 address, got \"1.2.3:80\""},
      {"256.1.1.1:80", false, "must have a valid IPv4 address, got \"256.1.1.1:80\""},
      {"a b:80", false, "must have a valid host name or IP address, got \"a b:80\""},
      {"host/x:80", false, "must have a valid host name or IP address, got \"host/x:80\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(address_error(c.text, c.allow_port_zero) == c.expected);
  }
}

TEST_CASE("format_sockaddr: unknown family and null") {
  CHECK(sluice::format_sockaddr(nullptr) == "-");
  sockaddr_storage ss{};
  ss.ss_family = AF_UNSPEC;
  CHECK(sluice::format_sockaddr(reinterpret_cast<const sockaddr*>(&ss)) == "unknown");
}

TEST_CASE("parse_rate_limit: count per second, minute or hour") {
  std::string error;
  struct Case {
    const char* text;
    double per_second;
  };
  const Case good[] = {{"100/s", 100.0}, {"6000/m", 100.0}, {"10000/h", 10000.0 / 3600}, {"1/h", 1.0 / 3600},
                       {"1000000000/s", 1e9}};
  for (const auto& c : good) {
    CAPTURE(c.text);
    const auto rate = sluice::parse_rate_limit(c.text, error);
    REQUIRE(rate.has_value());
    CHECK(rate->text == c.text);
    CHECK(rate->per_second == doctest::Approx(c.per_second));
  }
  const std::string like = "must be a rate like \"100/s\", \"6000/m\" or \"10000/h\" (a count up to 1000000000), got ";
  struct Bad {
    const char* text;
    std::string expected;
  };
  const Bad bad[] = {
      {"", like + "\"\""},
      {"100", like + "\"100\""},
      {"100/", like + "\"100/\""},
      {"100/d", like + "\"100/d\""},
      {"100/sec", like + "\"100/sec\""},
      {"/s", like + "\"/s\""},
      {"-1/s", like + "\"-1/s\""},
      {"1.5/s", like + "\"1.5/s\""},
      {"100 /s", like + "\"100 /s\""},
      {"1000000001/s", like + "\"1000000001/s\""},
      {"0/s", "must allow at least 1 connection, got \"0/s\" (leave the key out for no limit)"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.text);
    error.clear();
    CHECK_FALSE(sluice::parse_rate_limit(c.text, error).has_value());
    CHECK(error == c.expected);
  }
}

TEST_CASE("parse_hex_bytes") {
  std::string error;
  CHECK(sluice::parse_hex_bytes("2a310d0a", error) == std::string("*1\r\n"));
  CHECK(sluice::parse_hex_bytes("2A 31 0D 0a", error) == std::string("*1\r\n"));
  CHECK(sluice::parse_hex_bytes("00ff", error) == std::string("\0\xff", 2));
  struct Bad {
    const char* text;
    std::string expected;
  };
  const std::string like = "must be hex bytes like \"2a310d0a\" (single spaces allowed between bytes), got ";
  const Bad bad[] = {
      {"", "must not be empty"},
      {"2a3", "must have two hex digits per byte, got \"2a3\" (an odd number of digits)"},
      {"0x2a", like + "\"0x2a\": unexpected \"x\" at offset 1"},
      {"2g", like + "\"2g\": unexpected \"g\" at offset 1"},
      {"2 a", like + "\"2 a\": unexpected \" \" at offset 1"},
      {"2a  31", like + "\"2a  31\": unexpected \" \" at offset 2"},
      {" 2a", like + "\" 2a\": unexpected \" \" at offset 0"},
      {"2a ", like + "\"2a \": unexpected \" \" at offset 2"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.text);
    error.clear();
    CHECK_FALSE(sluice::parse_hex_bytes(c.text, error).has_value());
    CHECK(error == c.expected);
  }
}

TEST_CASE("parse_percent") {
  std::string error;
  CHECK(sluice::parse_percent("10%", error) == doctest::Approx(0.1));
  CHECK(sluice::parse_percent("0%", error) == 0.0);
  CHECK(sluice::parse_percent("100%", error) == 1.0);
  CHECK(sluice::parse_percent("12.5%", error) == doctest::Approx(0.125));
  for (const char* bad : {"", "%", "10", "10 %", "-1%", "100.1%", "101%", ".5%", "5.%", "1e1%", "ten%", "10%%"}) {
    CAPTURE(bad);
    error.clear();
    CHECK_FALSE(sluice::parse_percent(bad, error).has_value());
    CHECK(error == "must be a percentage from \"0%\" to \"100%\" like \"10%\", got " + sluice::quote(bad));
  }
}

TEST_CASE("parse_status_range") {
  std::string error;
  auto r = sluice::parse_status_range("200-399", error);
  REQUIRE(r.has_value());
  CHECK(r->low == 200);
  CHECK(r->high == 399);
  r = sluice::parse_status_range("204", error);
  REQUIRE(r.has_value());
  CHECK(r->low == 204);
  CHECK(r->high == 204);
  r = sluice::parse_status_range("100-599", error);
  REQUIRE(r.has_value());
  for (const char* bad : {"", "99", "600", "200-600", "2xx", "200-", "-200", "200 - 299", "200-299-300", "+200"}) {
    CAPTURE(bad);
    error.clear();
    CHECK_FALSE(sluice::parse_status_range(bad, error).has_value());
    CHECK(error == "must be a status code 100..599 or a range like \"200-399\", got " + sluice::quote(bad));
  }
  error.clear();
  CHECK_FALSE(sluice::parse_status_range("399-200", error).has_value());
  CHECK(error == "must be a range LOW-HIGH with LOW <= HIGH, got \"399-200\"");
}
