// [[listener]] keys for keepalive, PROXY protocol, address lists, limits,
// splice, half-close and PostgreSQL preread.
#include <string>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace std::chrono_literals;
using namespace config_test;

namespace {

// Line 5 is the first line after kL.
std::string at5(int column) { return "x.toml:5:" + std::to_string(column) + ": listener \"l\": "; }
std::string at6(int column) { return "x.toml:6:" + std::to_string(column) + ": listener \"l\": "; }
Case listener_case(const std::string& lines, const std::string& error) { return {kL + lines + kUpstreamU, error}; }

const std::string kWhole = "must be whole seconds from \"1s\" to \"32767s\", got ";

}  // namespace

TEST_CASE("[[listener]]: tcp keepalive") {
  check_cases({
      listener_case("tcp_keepalive = \"yes\"\n",
                    at5(17) + "tcp_keepalive must be a boolean (true or false), got string \"yes\""),
      listener_case("tcp_keepalive = false\ntcp_keepalive_idle = \"30s\"\n",
                    at6(1) + "tcp_keepalive_idle is allowed only with tcp_keepalive = true"),
      listener_case("tcp_keepalive = false\ntcp_keepalive_count = 3\n",
                    at6(1) + "tcp_keepalive_count is allowed only with tcp_keepalive = true"),
      listener_case("tcp_keepalive_idle = \"500ms\"\n", at5(22) + "tcp_keepalive_idle " + kWhole + "\"500ms\""),
      listener_case("tcp_keepalive_idle = \"1500ms\"\n", at5(22) + "tcp_keepalive_idle " + kWhole + "\"1500ms\""),
      listener_case("tcp_keepalive_interval = \"0s\"\n", at5(26) + "tcp_keepalive_interval " + kWhole + "\"0s\""),
      listener_case("tcp_keepalive_interval = \"10h\"\n", at5(26) + "tcp_keepalive_interval " + kWhole + "\"10h\""),
      listener_case("tcp_keepalive_idle = 0\n", at5(22) + "tcp_keepalive_idle must be 1..32767, got 0"),
      listener_case("tcp_keepalive_interval = 40000\n",
                    at5(26) + "tcp_keepalive_interval must be 1..32767, got 40000"),
      listener_case("tcp_keepalive_count = 0\n", at5(23) + "tcp_keepalive_count must be 1..127, got 0"),
      listener_case("tcp_keepalive_count = 128\n", at5(23) + "tcp_keepalive_count must be 1..127, got 128"),
  });
  const auto d = sluice::parse_config(kTail, "x.toml").listeners[0];
  CHECK(d.tcp_keepalive);
  CHECK(d.tcp_keepalive_idle == 60s);
  CHECK(d.tcp_keepalive_interval == 10s);
  CHECK(d.tcp_keepalive_count == 6);
  const auto c = sluice::parse_config(kL + "tcp_keepalive_idle = \"2m\"\ntcp_keepalive_interval = \"1s\"\n"
                                           "tcp_keepalive_count = 127\n" + kUpstreamU,
                                      "x.toml")
                     .listeners[0];
  CHECK(c.tcp_keepalive_idle == 120s);
  CHECK(c.tcp_keepalive_interval == 1s);
  CHECK(c.tcp_keepalive_count == 127);
  // Integers are seconds.
  const auto n = sluice::parse_config(kL + "tcp_keepalive_idle = 30\ntcp_keepalive_interval = 5\n" + kUpstreamU, "x.toml")
                     .listeners[0];
  CHECK(n.tcp_keepalive_idle == 30s);
  CHECK(n.tcp_keepalive_interval == 5s);
  CHECK(sluice::parse_config(kL + "tcp_keepalive_idle = \"32767s\"\n" + kUpstreamU, "x.toml")
            .listeners[0]
            .tcp_keepalive_idle == 32767s);
  CHECK_FALSE(sluice::parse_config(kL + "tcp_keepalive = false\n" + kUpstreamU, "x.toml").listeners[0].tcp_keepalive);
}

TEST_CASE("[[listener]]: accept_proxy and trusted_proxies") {
  check_cases({
      listener_case("accept_proxy = true\n",
                    at5(16) + "accept_proxy = true needs trusted_proxies (the networks of the proxies allowed to send "
                              "a PROXY header)"),
      listener_case("trusted_proxies = [\"10.0.0.0/8\"]\n",
                    at5(1) + "trusted_proxies is allowed only with accept_proxy = true"),
      listener_case("accept_proxy = false\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
                    at6(1) + "trusted_proxies is allowed only with accept_proxy = true"),
      listener_case("accept_proxy = true\ntrusted_proxies = []\n", at6(19) + "trusted_proxies must not be empty"),
      listener_case("accept_proxy = true\ntrusted_proxies = \"10.0.0.0/8\"\n",
                    at6(19) + "trusted_proxies must be an array of networks like [\"10.0.0.0/8\", \"::1\"], got string "
                              "\"10.0.0.0/8\""),
      listener_case("accept_proxy = true\ntrusted_proxies = [\"10.0.0.1/8\"]\n",
                    at6(20) + "trusted_proxies entry 1 must not have host bits set (bits after the prefix length): "
                              "\"10.0.0.1/8\" has them; the network is \"10.0.0.0/8\""),
      listener_case("accept_proxy = 1\n", at5(16) + "accept_proxy must be a boolean (true or false), got integer 1"),
  });
  const auto c = sluice::parse_config(kL + "accept_proxy = true\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n" +
                                          kUpstreamU,
                                      "x.toml")
                     .listeners[0];
  CHECK(c.accept_proxy);
  REQUIRE(c.trusted_proxies.size() == 2);
  CHECK(c.trusted_proxies[0].text == "10.0.0.0/8");
  CHECK(c.trusted_proxies[0].prefix == 8);
  CHECK(c.trusted_proxies[1].prefix == 128);
  const auto d = sluice::parse_config(kTail, "x.toml").listeners[0];
  CHECK_FALSE(d.accept_proxy);
  CHECK(d.trusted_proxies.empty());
}

TEST_CASE("[[listener]]: allow and deny") {
  check_cases({
      listener_case("allow = [\"10.0.0.0/8\", \"10.1.0.0/8\"]\n",
                    at5(24) + "allow entry 2 must not have host bits set (bits after the prefix length): "
                              "\"10.1.0.0/8\" has them; the network is \"10.0.0.0/8\""),
      listener_case("allow = []\n",
                    at5(9) + "allow = [] would refuse every client; leave allow out to admit everyone not denied"),
      listener_case("deny = [1]\n", at5(9) + "deny entry 1 must be a network string like \"10.0.0.0/8\", got integer 1"),
      listener_case("deny = [\"10.0.0.0/8\", \"10.0.0.0/8\"]\n",
                    at5(23) + "deny entry 2 \"10.0.0.0/8\" is the same network as entry 1"),
      listener_case("deny = [\"::1\", \"0:0::1/128\"]\n", at5(16) + "deny entry 2 \"0:0::1/128\" is the same network as "
                                                                   "entry 1"),
      listener_case("deny = [\"not-an-ip\"]\n",
                    at5(9) + "deny entry 1 must be a network like \"10.0.0.0/8\" or \"2001:db8::/32\", or one address, "
                             "got \"not-an-ip\""),
      listener_case("deny = \"10.0.0.0/8\"\n",
                    at5(8) + "deny must be an array of networks like [\"10.0.0.0/8\", \"::1\"], got string "
                             "\"10.0.0.0/8\""),
  });
  const auto c = sluice::parse_config(kL + "allow = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.7\"]\n"
                                           "deny = [\"10.9.0.0/16\"]\n" + kUpstreamU,
                                      "x.toml")
                     .listeners[0];
  REQUIRE(c.allow.size() == 3);
  CHECK(c.allow[1].family == AF_INET6);
  CHECK(c.allow[2].prefix == 32);
  REQUIRE(c.deny.size() == 1);
  CHECK(c.deny[0].prefix == 16);
  CHECK(sluice::parse_config(kL + "deny = []\n" + kUpstreamU, "x.toml").listeners[0].deny.empty());
}

TEST_CASE("[[listener]]: limits and splice") {
  check_cases({
      listener_case("max_connections = -1\n", at5(19) + "max_connections must be at least 0, got -1"),
      listener_case("client_max_connections = 1000001\n",
                    at5(26) + "client_max_connections must be 0..1000000, got 1000001"),
      listener_case("client_rate_limit = \"100\"\n",
                    at5(21) + "client_rate_limit must be a rate like \"100/s\", \"6000/m\" or \"10000/h\" (a count up "
                              "to 1000000000), got \"100\""),
      listener_case("client_rate_limit = 100\n",
                    at5(21) + "client_rate_limit must be a rate string like \"100/s\", got integer 100"),
      listener_case("client_rate_limit = \"0/m\"\n",
                    at5(21) + "client_rate_limit must allow at least 1 connection, got \"0/m\" (leave the key out for "
                              "no limit)"),
      listener_case("splice = \"on\"\n", at5(10) + "splice must be one of off|pipe|auto, got \"on\""),
      listener_case("splice = true\n", at5(10) + "splice must be a string, got boolean true"),
      listener_case("half_close = \"off\"\n",
                    at5(14) + "half_close must be a boolean (true or false), got string \"off\""),
      listener_case("half_close = false\nfin_timeout = \"10s\"\n",
                    at6(1) + "fin_timeout is allowed only with half_close = true (without half-close a FIN "
                             "ends the session)"),
  });
  const auto d = sluice::parse_config(kTail, "x.toml").listeners[0];
  CHECK(d.max_connections == 0);
  CHECK(d.client_max_connections == 0);
  CHECK(d.client_rate_limit.per_second == 0.0);
  CHECK(d.splice == sluice::Splice::off);
  CHECK(d.half_close);
  CHECK_FALSE(sluice::parse_config(kL + "half_close = false\n" + kUpstreamU, "x.toml").listeners[0].half_close);
  const auto c = sluice::parse_config(kL + "max_connections = 5000\nclient_max_connections = 10\n"
                                           "client_rate_limit = \"6000/m\"\nsplice = \"auto\"\n" + kUpstreamU,
                                      "x.toml")
                     .listeners[0];
  CHECK(c.max_connections == 5000);
  CHECK(c.client_max_connections == 10);
  CHECK(c.client_rate_limit.text == "6000/m");
  CHECK(c.client_rate_limit.per_second == doctest::Approx(100.0));
  CHECK(c.splice == sluice::Splice::automatic);
  CHECK(sluice::parse_config(kL + "splice = \"pipe\"\n" + kUpstreamU, "x.toml").listeners[0].splice ==
        sluice::Splice::pipe);
}

TEST_CASE("[[listener]]: preread = \"postgres\" follows the TLS rules") {
  const std::string kP = "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\npreread = \"postgres\"\n";
  check_cases({
      {kP + "upstream = \"u\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"p\": upstream is not allowed with preread = \"postgres\"; use default_upstream and "
       "routes"},
      {kP + kUpstreamU, "x.toml:1:1: listener \"p\": preread = \"postgres\" needs routes or default_upstream (or both)"},
      {kP + "default_upstream = \"x\"\n" + kUpstreamU,
       "x.toml:5:20: listener \"p\": default_upstream \"x\" is not defined; known upstreams: u"},
  });
  const auto c = sluice::parse_config(kP + "routes = [{ sni = \"db.test\", upstream = \"u\" }]\ndefault_upstream = "
                                           "\"u\"\non_not_tls = \"close\"\npreread_timeout = \"2s\"\n" + kUpstreamU,
                                      "x.toml")
                     .listeners[0];
  CHECK(c.preread == sluice::Preread::postgres);
  CHECK(c.upstream.empty());
  REQUIRE(c.routes.size() == 1);
  CHECK(c.routes[0].sni == "db.test");
  CHECK(c.default_upstream == "u");
  CHECK(c.on_not_tls == sluice::OnNotTls::close);
  CHECK(c.preread_timeout == 2s);
}

TEST_CASE("[upstream.NAME]: all_down, proxy_protocol, drain_timeout") {
  const std::string head = "[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\" }]\n";
  check_cases({
      {head + "all_down = \"open\"\n" + kListenerL,
       "x.toml:3:12: upstream \"u\": all_down must be one of fail_closed|fail_open, got \"open\""},
      {head + "proxy_protocol = \"v3\"\n" + kListenerL,
       "x.toml:3:18: upstream \"u\": proxy_protocol must be one of none|v1|v2, got \"v3\""},
      {head + "proxy_protocol = 2\n" + kListenerL,
       "x.toml:3:18: upstream \"u\": proxy_protocol must be a string, got integer 2"},
      {head + "drain_timeout = \"soon\"\n" + kListenerL,
       "x.toml:3:17: upstream \"u\": drain_timeout must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got "
       "\"soon\""},
  });
  const auto d = sluice::parse_config(kTail, "x.toml").upstreams.at("u");
  CHECK(d.all_down == sluice::AllDown::fail_closed);
  CHECK(d.proxy_protocol == sluice::ProxyProtocol::none);
  const auto c = sluice::parse_config(head + "all_down = \"fail_open\"\nproxy_protocol = \"v2\"\n"
                                             "drain_timeout = \"1m\"\n" + kListenerL,
                                      "x.toml")
                     .upstreams.at("u");
  CHECK(c.all_down == sluice::AllDown::fail_open);
  CHECK(c.proxy_protocol == sluice::ProxyProtocol::v2);
  CHECK(c.drain_timeout == 60s);
  CHECK(sluice::parse_config(head + "proxy_protocol = \"v1\"\n" + kListenerL, "x.toml").upstreams.at("u").proxy_protocol ==
        sluice::ProxyProtocol::v1);
}
