// Which Host a request that changes something may carry (DNS rebinding).
#include <doctest/doctest.h>

#include <string>

#include "admin/allowed_hosts.hpp"
#include "config/values.hpp"

using namespace sluice;
using namespace sluice::admin;

namespace {

AdminConfig admin_at(const std::string& listen, std::vector<std::string> names = {}) {
  std::string error;
  AdminConfig c;
  c.enabled = true;
  c.listen = *parse_address(listen, true, error);
  c.allowed_hosts = std::move(names);
  return c;
}

}  // namespace

TEST_CASE("localhost and literal IPs are always this admin API's names") {
  const AllowedHosts h = allowed_hosts(admin_at("127.0.0.1:9090"), 9090);
  for (const char* host : {"127.0.0.1:9090", "127.0.0.1", "127.0.0.1:1", "10.1.2.3", "0.0.0.0:80", "localhost",
                           "localhost:9090", "LOCALHOST:1234", "localhost.", "[::1]", "[::1]:9090",
                           "[2001:db8::7]:443", "[::ffff:127.0.0.1]:9090", " localhost:9090 "}) {
    CAPTURE(host);
    CHECK(host_allowed(host, h));
  }
}

TEST_CASE("any other name is refused unless it is the listen address's or listed") {
  const AllowedHosts h = allowed_hosts(admin_at("127.0.0.1:9090"), 9090);
  for (const char* host : {"rebind.attacker.example", "rebind.attacker.example:9090", "localhost.attacker.example",
                           "127.0.0.1.attacker.example", "attacker-localhost", "lb1.example", "", " ", "::1",
                           "[::1", "::1]:80", "[localhost]:80", "[fe80::1%25eth0]:80", "127.0.0.1:", "127.0.0.1:99999",
                           "127.0.0.1:80x", "127.0.0.1:80:80", "127.0.0.1, evil.example", "a b", "127.1",
                           "0x7f.0.0.1", "localhost:9090, evil.example"}) {
    CAPTURE(host);
    CHECK_FALSE(host_allowed(host, h));
  }
}

TEST_CASE("the listen address's own name, with its port, the bound port or none") {
  // A name as written in listen (non-loopback ones need a token; the rule is the same).
  AllowedHosts h;
  h.listen_host = "admin.lb1.example";
  h.listen_port = 0;
  h.bound_port = 40123;
  CHECK(host_allowed("admin.lb1.example", h));
  CHECK(host_allowed("ADMIN.lb1.example.:40123", h));
  CHECK(host_allowed("admin.lb1.example:0", h));
  CHECK_FALSE(host_allowed("admin.lb1.example:40124", h));
  CHECK_FALSE(host_allowed("lb1.example", h));
  h.listen_port = 9090;
  h.bound_port = 9090;
  CHECK(host_allowed("admin.lb1.example:9090", h));
  CHECK_FALSE(host_allowed("admin.lb1.example:8080", h));
}

TEST_CASE("allowed_hosts: a bare name with any port, NAME:PORT with that port only") {
  const AllowedHosts h = allowed_hosts(admin_at("127.0.0.1:9090", {"lb1.example", "ops.example:8443"}), 9090);
  CHECK(host_allowed("lb1.example", h));
  CHECK(host_allowed("LB1.Example:9090", h));
  CHECK(host_allowed("lb1.example.:1", h));
  CHECK(host_allowed("ops.example:8443", h));
  CHECK_FALSE(host_allowed("ops.example", h));
  CHECK_FALSE(host_allowed("ops.example:8444", h));
  CHECK_FALSE(host_allowed("ops.example:08443", h));
  CHECK_FALSE(host_allowed("x.lb1.example", h));
  CHECK_FALSE(host_allowed("lb1.example.attacker.example", h));
}

TEST_CASE("allowed_hosts entries as the configuration reads them") {
  std::string error;
  CHECK(parse_allowed_host("LB1.Example.", error) == "lb1.example");
  CHECK(parse_allowed_host("lb1.example:8443", error) == "lb1.example:8443");
  CHECK(parse_allowed_host("a-b.c_d.example", error) == "a-b.c_d.example");
  CHECK(parse_allowed_host("lb1", error) == "lb1");
  for (const char* bad : {"", "*.example.com", "bad name", "http://lb1.example", "lb1.example:99999",
                          "lb1.example:0", "lb1.example:", "lb1..example", ".example", "10.0.0.1", "[::1]",
                          "lb1.example/path", "lb1.example:80:80", "ünicode.example"}) {
    CAPTURE(bad);
    error.clear();
    CHECK_FALSE(parse_allowed_host(bad, error).has_value());
    CHECK_FALSE(error.empty());
  }
}
