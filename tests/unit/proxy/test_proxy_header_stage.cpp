// The PROXY header stage: learns the client's addresses and hands on the
// bytes that follow the header, whatever the pieces they arrive in.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "preread/proxy_protocol.hpp"
#include "proxy/proxy_header_stage.hpp"
#include "sluice/address.hpp"

namespace sluice {
namespace {

sockaddr_storage v4(const char* ip, std::uint16_t port) {
  sockaddr_storage ss{};
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sin.sin_addr);
  std::memcpy(&ss, &sin, sizeof sin);
  return ss;
}

const sockaddr* sa(const sockaddr_storage& ss) { return reinterpret_cast<const sockaddr*>(&ss); }

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("PROXY stage: a v2 header in pieces, then the client's bytes go on") {
  const sockaddr_storage src = v4("192.0.2.7", 40000);
  const sockaddr_storage dst = v4("198.51.100.1", 443);
  std::vector<std::uint8_t> input;
  preread::append_v2(input, sa(src), sa(dst), "", "");
  const std::vector<std::uint8_t> after = bytes("hello after the header");
  input.insert(input.end(), after.begin(), after.end());

  for (std::size_t piece : {std::size_t{1}, std::size_t{5}, input.size()}) {
    CAPTURE(piece);
    ProxyHeaderStage stage;
    CHECK(stage.names_client());
    PrereadResult r;
    std::size_t at = 0;
    while (at < input.size()) {
      const std::size_t n = std::min(piece, input.size() - at);
      r = stage.feed({input.data() + at, n});
      at += n;
      if (r.kind != PrereadResult::Kind::need_more) break;
    }
    REQUIRE(r.kind == PrereadResult::Kind::next);
    CHECK(r.upstream == nullptr);
    CHECK(format_sockaddr(sa(stage.client)) == "192.0.2.7:40000");
    CHECK(format_sockaddr(sa(stage.destination)) == "198.51.100.1:443");
    // What arrived with the header's last byte, and nothing of the header.
    std::vector<std::uint8_t> rest = stage.take_forward();
    rest.insert(rest.end(), input.begin() + static_cast<std::ptrdiff_t>(at), input.end());
    CHECK(rest == after);
  }
}

TEST_CASE("PROXY stage: v1 LOCAL-style UNKNOWN keeps the connection's own addresses") {
  ProxyHeaderStage stage;
  const auto in = bytes("PROXY UNKNOWN\r\nrest");
  const PrereadResult r = stage.feed(in);
  REQUIRE(r.kind == PrereadResult::Kind::next);
  CHECK(stage.client.ss_family == 0);
  CHECK(stage.destination.ss_family == 0);
  CHECK(stage.take_forward() == bytes("rest"));
}

TEST_CASE("PROXY stage: anything but a header closes with rejected_proxy and says why") {
  ProxyHeaderStage stage;
  const PrereadResult r = stage.feed(bytes("GET / HTTP/1.1\r\n\r\n"));
  CHECK(r.kind == PrereadResult::Kind::close);
  CHECK(r.cause == Cause::rejected_proxy);
  CHECK(std::string(stage.error()) != "");
}

}  // namespace sluice
