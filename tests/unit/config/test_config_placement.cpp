// Mistakes an operator makes with valid keys: a key in the wrong table, a
// catch-all route, a check that could never pass. Each names the position
// and says what to write instead.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "config_cases.hpp"

using namespace config_test;

namespace {

const std::string kListenerHome =
    " is a listener key: set it in the [[listener]] that sends to this upstream (each listener has its own)";
const std::string kUpstreamHome = " is an upstream key: set it under [upstream.NAME]";
const std::string kServerHome =
    " is a server key: set it on each server, like servers = [{ address = \"10.0.0.1:5432\", max_conns = 100 }]";
const std::string kHealthHome = " is a health check key: set it under [upstream.NAME.health]";
const std::string kServers = "servers = [{ address = \"127.0.0.1:9001\" }]\n";

}  // namespace

TEST_CASE("a listener key on an upstream says it belongs on the listener") {
  check_cases({
      {"[upstream.u]\n" + kServers + "connect_timeout = \"2s\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"connect_timeout\"" + kListenerHome},
      {"[upstream.u]\ntries = 3\n" + kServers + kListenerL, "x.toml:2:1: upstream \"u\": \"tries\"" + kListenerHome},
      {"[upstream.u]\n" + kServers + "idle_timeout = \"1m\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"idle_timeout\"" + kListenerHome},
      {"[upstream.u]\n" + kServers + "preread_timeout = \"1s\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"preread_timeout\"" + kListenerHome},
      {"[upstream.u]\n" + kServers + "accept_proxy = true\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"accept_proxy\"" + kListenerHome},
      // The first misplaced key written is the one reported.
      {"[upstream.u]\n" + kServers + "next_upstream_timeout = \"1s\"\ntries = 2\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"next_upstream_timeout\"" + kListenerHome},
      // On a server too.
      {"[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\", connect_timeout = \"1s\" }]\n" + kListenerL,
       "x.toml:2:42: upstream \"u\" server 1: \"connect_timeout\"" + kListenerHome},
  });
}

TEST_CASE("server and health keys on an upstream, upstream keys on a server") {
  check_cases({
      {"[upstream.u]\n" + kServers + "max_conns = 100\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"max_conns\"" + kServerHome},
      {"[upstream.u]\n" + kServers + "weight = 2\n" + kListenerL, "x.toml:3:1: upstream \"u\": \"weight\"" + kServerHome},
      {"[upstream.u]\n" + kServers + "interval = \"1s\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"interval\"" + kHealthHome},
      {"[upstream.u]\n" + kServers + "expect_body = \"ok\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": \"expect_body\"" + kHealthHome},
      {"[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\", max_fails = 3 }]\n" + kListenerL,
       "x.toml:2:42: upstream \"u\" server 1: \"max_fails\"" + kUpstreamHome},
  });
}

TEST_CASE("an upstream key on a listener says it belongs on the upstream") {
  check_cases({
      {kL + "balance = \"round_robin\"\n" + kUpstreamU, "x.toml:5:1: listener \"l\": \"balance\"" + kUpstreamHome},
      {kL + "max_fails = 3\n" + kUpstreamU, "x.toml:5:1: listener \"l\": \"max_fails\"" + kUpstreamHome},
      {kL + "servers = [{ address = \"127.0.0.1:9002\" }]\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": \"servers\"" + kUpstreamHome},
      {kL + "max_conns = 10\n" + kUpstreamU, "x.toml:5:1: listener \"l\": \"max_conns\"" + kServerHome},
      {kL + "rise = 2\n" + kUpstreamU, "x.toml:5:1: listener \"l\": \"rise\"" + kHealthHome},
      // Before the listener's name is known to be valid, it is counted.
      {"[[listener]]\nname = \"a b\"\nfail_timeout = \"10s\"\n" + kUpstreamU,
       "x.toml:3:1: listener #1: \"fail_timeout\"" + kUpstreamHome},
      {kL + "proxy_protocol = \"v2\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": \"proxy_protocol\" (sending a PROXY header to the servers) is an upstream key: "
       "set it under [upstream.NAME]; to accept a PROXY header from clients, use accept_proxy and trusted_proxies"},
  });
}

TEST_CASE("keys that are merely unknown are still reported as unknown") {
  CHECK(error_of("[upstream.u]\n" + kServers + "conect_timeout = \"2s\"\n" + kListenerL)
            .starts_with("x.toml:3:1: upstream \"u\": unknown key \"conect_timeout\"; allowed: "));
  CHECK(error_of(kL + "balanse = 1\n" + kUpstreamU).starts_with("x.toml:5:1: listener \"l\": unknown key \"balanse\""));
}

TEST_CASE("sni = \"*\" points to default_upstream") {
  const std::string star =
      "sni = \"*\" is not a route: connections that no route matches go to default_upstream; set "
      "default_upstream = \"NAME\" on the listener instead";
  check_cases({
      {kT + "routes = [{ sni = \"*\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + star},
      {kT + "default_upstream = \"u\"\nroutes = [\n  { sni = \"a.test\", upstream = \"u\" },\n  { sni = \"*\", upstream = "
            "\"u\" },\n]\n" + kUpstreamU,
       "x.toml:8:11: listener \"t\" route 2: " + star},
  });
}

TEST_CASE("method = \"HEAD\" with expect_body could never pass") {
  const std::string head = "[upstream.u]\n" + kServers + "[upstream.u.health]\ntype = \"http\"\n";
  const std::string never =
      "upstream \"u\" health: expect_body can never match with method = \"HEAD\" (the answer to HEAD has no body); "
      "use method = \"GET\" or leave expect_body out";
  check_cases({
      {head + "method = \"HEAD\"\nexpect_body = \"ok\"\n" + kListenerL, "x.toml:6:15: " + never},
      {head + "expect_body = \"ok\"\nmethod = \"HEAD\"\n" + kListenerL, "x.toml:5:15: " + never},
  });
  CHECK(error_of(head + "method = \"HEAD\"\n" + kListenerL) == "no error");
  CHECK(error_of(head + "method = \"GET\"\nexpect_body = \"ok\"\n" + kListenerL) == "no error");
}
