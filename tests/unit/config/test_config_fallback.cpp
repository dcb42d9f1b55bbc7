// An upstream's fallback, and routes on ALPN: what loads and what is refused.
#include <string>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace config_test;

namespace {

// Listener "l" on upstream "a" (lines 1-4), then the upstreams.
const std::string kFallbackHead = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"a\"\n";

std::string up(const std::string& name, const std::string& fallback, const std::string& address) {
  std::string text = "[upstream." + name + "]\n";
  if (!fallback.empty()) text += "fallback = \"" + fallback + "\"\n";
  return text + "servers = [{ address = \"" + address + "\" }]\n";
}

}  // namespace

TEST_CASE("fallback names another upstream") {
  const sluice::Config c = sluice::parse_config(
      kFallbackHead + up("a", "b", "10.0.0.1:5432") + up("b", "c", "10.0.0.2:5432") + up("c", "", "10.0.0.3:5432"), "x.toml");
  CHECK(c.upstreams.at("a").fallback == "b");
  CHECK(c.upstreams.at("b").fallback == "c");
  CHECK(c.upstreams.at("c").fallback.empty());
}

TEST_CASE("fallback: unknown names and loops are refused at the key") {
  check_cases({
      {kFallbackHead + up("a", "nope", "10.0.0.1:1") + up("b", "", "10.0.0.2:1"),
       "x.toml:6:12: upstream \"a\": fallback \"nope\" is not defined; known upstreams: b"},
      {kFallbackHead + up("a", "a", "10.0.0.1:1"),
       "x.toml:6:12: upstream \"a\": fallback chain loops (a -> a): when every upstream in it is down, sessions "
       "would go round it; end the chain at an upstream without fallback"},
      {kFallbackHead + up("a", "b", "10.0.0.1:1") + up("b", "a", "10.0.0.2:1"),
       "x.toml:6:12: upstream \"a\": fallback chain loops (a -> b -> a): when every upstream in it is down, "
       "sessions would go round it; end the chain at an upstream without fallback"},
      // The loop need not come back to the first upstream.
      {kFallbackHead + up("a", "b", "10.0.0.1:1") + up("b", "c", "10.0.0.2:1") + up("c", "b", "10.0.0.3:1"),
       "x.toml:6:12: upstream \"a\": fallback chain loops (a -> b -> c -> b): when every upstream in it is down, "
       "sessions would go round it; end the chain at an upstream without fallback"},
      {kFallbackHead + up("a", "", "10.0.0.1:1") + "[upstream.b]\nfallback = 3\nservers = [{ address = \"10.0.0.2:1\" }]\n",
       "x.toml:8:12: upstream \"b\": fallback must be a string, got integer 3"},
  });
}

TEST_CASE("fallback on a listener says where it belongs") {
  CHECK(error_of("[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\nfallback = \"u\"\n" +
                 kUpstreamU)
            .find("x.toml:5:1: listener \"l\": \"fallback\" is an upstream key") == 0);
}

TEST_CASE("a fallback that points back at the listener is a loop") {
  const std::string text = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:7000\"\nupstream = \"a\"\n" +
                           up("a", "b", "10.0.0.1:1") + up("b", "", "127.0.0.1:7000");
  CHECK(error_of(text).find("x.toml:9:24: upstream \"b\" server 1: address \"127.0.0.1:7000\" is where listener") ==
        0);
}

TEST_CASE("routes on alpn") {
  const std::string tls = "[[listener]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\npreread = \"tls\"\n";
  const sluice::Config c = sluice::parse_config(
      tls + "routes = [\n  { sni = \"db.test\", alpn = \"postgresql\", upstream = \"u\" },\n"
            "  { alpn = \"h2\", upstream = \"u\" },\n  { sni = \"db.test\", upstream = \"u\" },\n]\n" + kUpstreamU,
      "x.toml");
  const auto& routes = c.listeners.at(0).routes;
  REQUIRE(routes.size() == 3);
  CHECK(routes[0].sni == "db.test");
  CHECK(routes[0].alpn == "postgresql");
  CHECK(routes[1].sni.empty());
  CHECK(routes[1].alpn == "h2");
  CHECK(routes[2].alpn.empty());

  check_cases({
      {tls + "routes = [{ upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:11: listener \"t\" route 1: a route needs sni, alpn or both (and upstream)"},
      {tls + "routes = [{ alpn = \"\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:20: listener \"t\" route 1: alpn must be one ALPN protocol name of 1 to 255 bytes, like "
       "\"postgresql\", \"h2\" or \"http/1.1\", got \"\""},
      {tls + "routes = [{ alpn = \"h2\", upstream = \"u\" }, { alpn = \"h2\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:53: listener \"t\" route 2: alpn \"h2\" is already used by route 1"},
      {tls + "routes = [{ sni = \"a.test\", alpn = \"h2\", upstream = \"u\" }, { sni = \"A.test\", alpn = \"h2\", "
             "upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:68: listener \"t\" route 2: sni \"a.test\" with alpn \"h2\" is already used by route 1"},
      {tls + "routes = [{ alpn = \"h2\", upstream = \"nope\" }]\n" + kUpstreamU,
       "x.toml:5:37: listener \"t\" route 1: upstream \"nope\" is not defined; known upstreams: u"},
  });
}

TEST_CASE("SNI hashing is checked on the upstreams a listener falls back to") {
  const std::string text = kFallbackHead + up("a", "h", "10.0.0.1:1") +
                           "[upstream.h]\nbalance = \"hash\"\nhash_key = \"sni\"\nservers = [{ address = \"10.0.0.2:1\" }]\n";
  CHECK(error_of(text) ==
        "x.toml:10:12: upstream \"h\": hash_key = \"sni\" needs an SNI, but listener \"l\" uses this upstream "
        "without preread = \"tls\" or \"postgres\": every key would be empty and all connections would go to one "
        "server; use \"sni_or_client_ip\" or \"client_ip\"");
}

TEST_CASE("queue: a bounded wait behind max_conns, checked at its keys") {
  const std::string head = kFallbackHead + "[upstream.a]\n";
  const std::string limited = "servers = [{ address = \"10.0.0.1:5432\", max_conns = 2 }]\n";
  const sluice::Config c = sluice::parse_config(head + "queue = 3\nqueue_timeout = \"250ms\"\n" + limited, "x.toml");
  CHECK(c.upstreams.at("a").queue == 3);
  CHECK(c.upstreams.at("a").queue_timeout == std::chrono::milliseconds(250));
  const sluice::Config d = sluice::parse_config(head + limited, "x.toml");
  CHECK(d.upstreams.at("a").queue == 0);
  CHECK(d.upstreams.at("a").queue_timeout == std::chrono::seconds(10));
  check_cases({
      {head + "queue = -1\n" + limited, "x.toml:6:9: upstream \"a\": queue must be 0..1000000, got -1"},
      {head + "queue = 2\nservers = [{ address = \"10.0.0.1:5432\" }]\n",
       "x.toml:6:9: upstream \"a\": queue needs max_conns on the servers: a queue holds clients only while every "
       "eligible server is at its max_conns (or, in a primary pool, through a failover)"},
      {head + "queue_timeout = \"1s\"\n" + limited,
       "x.toml:6:1: upstream \"a\": queue_timeout needs queue = N (N > 0): without a queue nobody waits"},
      {head + "queue = 2\nqueue_timeout = \"0s\"\n" + limited,
       "x.toml:7:17: upstream \"a\": queue_timeout must be greater than 0, got \"0s\""},
  });
}
