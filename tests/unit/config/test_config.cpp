// The config loader: one line per bad input and the exact message it must
// produce, then good files and the values they yield.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace std::chrono_literals;
using sluice::Config;
using sluice::ConfigError;
using namespace config_test;

namespace {

const std::string kGlobalKeys =
    "allowed: workers, max_connections, shutdown_timeout, log_level, error_log, access_log, access_log_format, "
    "log_interval, log_phases, drain_timeout, shutdown_delay, pid_file, upgrade_timeout, upgrade_finish_timeout, close_spread, "
    "watch_config, control_cpu";
const std::string kListenerKeys =
    "allowed: name, listen, upstream, connect_timeout, idle_timeout, tries, next_upstream_timeout, fin_timeout, "
    "max_lifetime, backlog, preread, preread_timeout, preread_max_bytes, routes, default_upstream, on_not_tls, "
    "on_malformed, tcp_keepalive, tcp_keepalive_idle, tcp_keepalive_interval, tcp_keepalive_count, accept_proxy, "
    "trusted_proxies, allow, deny, max_connections, client_max_connections, client_rate_limit, splice, "
    "half_close, protocol";
const std::string kUpstreamKeys =
    "allowed: balance, max_fails, fail_timeout, hash_key, hash_balance_factor, all_down, fallback, proxy_protocol, "
    "drain_timeout, queue, queue_timeout, servers, sentinel, health";
const std::string kLike = "must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got ";

}  // namespace

TEST_CASE("syntax errors and the top level") {
  check_cases({
      {"[global]\nworkers = \n" + kTail,
       "x.toml:2:11: syntax error: Error while parsing key-value pair: expected value, saw '\\n'"},
      {"[global]\nworkers = 1\nworkers = 2\n" + kTail,
       "x.toml:3:11: syntax error: Error while parsing key-value pair: cannot redefine existing integer 'workers'"},
      {"[global\n" + kTail, "x.toml:1:8: syntax error: Error while parsing table header: expected ']', saw '\\n'"},
      {"foo = 1\n" + kTail, "x.toml:1:1: top level: unknown key \"foo\"; allowed: global, admin, listener, upstream, resolver"},
      {"[admin]\nlisten = \"0.0.0.0:9090\"\n" + kTail,
       "x.toml:2:10: [admin]: listen \"0.0.0.0:9090\" is not a loopback address: set token_file so that every "
       "request needs a token"},
      {"global = 5\n" + kTail, "x.toml:1:10: top level: global must be a table ([global]), got integer 5"},
      {"upstream = \"u\"\n" + kListenerL,
       "x.toml:1:12: top level: upstream must be a table of upstreams ([upstream.NAME]), got string \"u\""},
      {"[listener]\nname = \"l\"\n" + kUpstreamU,
       "x.toml:1:1: top level: listener must be an array of tables ([[listener]]), got table"},
      {"listener = [1]\n" + kUpstreamU,
       "x.toml:1:12: top level: listener must be an array of tables ([[listener]]), got array"},
  });
}

TEST_CASE("[global]") {
  check_cases({
      {"[global]\n\nwrkers = 4\n" + kTail, "x.toml:3:1: [global]: unknown key \"wrkers\"; " + kGlobalKeys},
      {"[global]\nworkers = 257\n" + kTail, "x.toml:2:11: [global]: workers must be 0..256, got 257"},
      {"[global]\nworkers = -1\n" + kTail, "x.toml:2:11: [global]: workers must be 0..256, got -1"},
      {"[global]\nworkers = \"4\"\n" + kTail, "x.toml:2:11: [global]: workers must be an integer, got string \"4\""},
      {"[global]\nworkers = 2.5\n" + kTail, "x.toml:2:11: [global]: workers must be an integer, got float 2.5"},
      {"[global]\nworkers = 2.0\n" + kTail, "x.toml:2:11: [global]: workers must be an integer, got float 2.0"},
      {"[global]\nmax_connections = 0\n" + kTail,
       "x.toml:2:19: [global]: max_connections must be at least 1, got 0"},
      {"[global]\nmax_connections = true\n" + kTail,
       "x.toml:2:19: [global]: max_connections must be an integer, got boolean true"},
      {"[global]\nshutdown_timeout = \"30 s\"\n" + kTail,
       "x.toml:2:20: [global]: shutdown_timeout " + kLike + "\"30 s\""},
      {"[global]\nshutdown_timeout = \"8d\"\n" + kTail, "x.toml:2:20: [global]: shutdown_timeout " + kLike + "\"8d\""},
      {"[global]\nshutdown_timeout = \"169h\"\n" + kTail,
       "x.toml:2:20: [global]: shutdown_timeout must be at most 7 days (\"168h\"), got \"169h\""},
      {"[global]\nshutdown_delay = \"5\"\n" + kTail, "x.toml:2:18: [global]: shutdown_delay " + kLike + "\"5\""},
      {"[global]\nupgrade_finish_timeout = \"0s\"\n" + kTail,
       "x.toml:2:26: [global]: upgrade_finish_timeout must be greater than 0, got \"0s\""},
      {"[global]\nupgrade_finish_timeout = 10\n" + kTail,
       "x.toml:2:26: [global]: upgrade_finish_timeout must be a duration string like \"3s\", got integer 10"},
      {"[global]\nshutdown_timeout = 30\n" + kTail,
       "x.toml:2:20: [global]: shutdown_timeout must be a duration string like \"3s\", got integer 30"},
      {"[global]\nlog_level = \"verbose\"\n" + kTail,
       "x.toml:2:13: [global]: log_level must be one of trace|debug|info|warn|error|critical|off, got \"verbose\""},
      {"[global]\nlog_level = \"INFO\"\n" + kTail,
       "x.toml:2:13: [global]: log_level must be one of trace|debug|info|warn|error|critical|off, got \"INFO\""},
      {"[global]\nlog_level = 3\n" + kTail, "x.toml:2:13: [global]: log_level must be a string, got integer 3"},
      {"[global]\naccess_log = \"\"\n" + kTail,
       "x.toml:2:14: [global]: access_log must be a file path, \"stderr\", \"stdout\" or \"off\", got \"\""},
      {"[global]\naccess_log = false\n" + kTail,
       "x.toml:2:14: [global]: access_log must be a string, got boolean false"},
      {"[global]\naccess_log_format = \"xml\"\n" + kTail,
       "x.toml:2:21: [global]: access_log_format must be one of text|json, got \"xml\""},
      {"[global]\naccess_log_format = [\"json\"]\n" + kTail,
       "x.toml:2:21: [global]: access_log_format must be a string, got array"},
  });
}

TEST_CASE("[[listener]]: name, listen, upstream") {
  check_cases({
      {"[[listener]]\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:1:1: listener #1: missing required key \"name\""},
      {kL + kL.substr(0, 13) + "name = \"a b\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:6:8: listener #2: name must match [A-Za-z0-9_.-]+, got \"a b\""},
      {"[[listener]]\nname = \"\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:2:8: listener #1: name must match [A-Za-z0-9_.-]+, got \"\""},
      {"[[listener]]\nname = 5\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:2:8: listener #1: name must be a string, got integer 5"},
      {"[[listener]]\nnam = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:2:1: listener #1: unknown key \"nam\"; " + kListenerKeys},
      {kL + "conect_timeout = \"1s\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": unknown key \"conect_timeout\"; " + kListenerKeys},
      {kL + "[listener.extra]\nx = 1\n" + kUpstreamU,
       "x.toml:5:11: listener \"l\": unknown key \"extra\"; " + kListenerKeys},
      {kL + kL + kUpstreamU, "x.toml:6:8: listener \"l\": name \"l\" is already used by listener #1"},
      {"[[listener]]\nname = \"l\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:1:1: listener \"l\": missing required key \"listen\""},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:3:10: listener \"l\": listen must be \"host:port\" or \"[ipv6]:port\" (missing port), "
       "got \"127.0.0.1\""},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:70000\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:3:10: listener \"l\": listen must have a port 0..65535, got \"127.0.0.1:70000\""},
      {"[[listener]]\nname = \"l\"\nlisten = \"[::1\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:3:10: listener \"l\": listen must be \"host:port\" or \"[ipv6]:port\" (missing \"]\"), got \"[::1\""},
      {"[[listener]]\nname = \"l\"\nlisten = 7000\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:3:10: listener \"l\": listen must be an address string like \"127.0.0.1:5432\", got integer 7000"},
      {"[[listener]]\nname = \"a\"\nlisten = \"127.0.0.1:7000\"\nupstream = \"u\"\n"
       "[[listener]]\nname = \"b\"\nlisten = \"127.0.0.1:7000\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:7:10: listener \"b\": listen \"127.0.0.1:7000\" is already used by listener \"a\""},
      {"[[listener]]\nname = \"a\"\nlisten = \"[::1]:7000\"\nupstream = \"u\"\n"
       "[[listener]]\nname = \"b\"\nlisten = \"[0:0:0:0:0:0:0:1]:7000\"\nupstream = \"u\"\n" + kUpstreamU,
       "x.toml:7:10: listener \"b\": listen \"[0:0:0:0:0:0:0:1]:7000\" resolves to the same address as listener \"a\" "
       "(\"[::1]:7000\")"},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\n" + kUpstreamU,
       "x.toml:1:1: listener \"l\": missing required key \"upstream\""},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"nope\"\n" + kUpstreamU,
       "x.toml:4:12: listener \"l\": upstream \"nope\" is not defined; known upstreams: u"},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\n",
       "x.toml:4:12: listener \"l\": upstream \"u\" is not defined; known upstreams: none"},
      {"[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = [\"u\"]\n" + kUpstreamU,
       "x.toml:4:12: listener \"l\": upstream must be a string, got array"},
  });
}

TEST_CASE("[[listener]]: timeouts and limits") {
  check_cases({
      {"[[listener]]\nname = \"pg\"\nlisten = \"127.0.0.1:0\"\nupstream = \"u\"\nconnect_timeout = \"3 seconds\"\n" +
           kUpstreamU,
       "x.toml:5:19: listener \"pg\": connect_timeout " + kLike + "\"3 seconds\""},
      {kL + "connect_timeout = \"0s\"\n" + kUpstreamU,
       "x.toml:5:19: listener \"l\": connect_timeout must be greater than 0, got \"0s\""},
      {kL + "connect_timeout = 3\n" + kUpstreamU,
       "x.toml:5:19: listener \"l\": connect_timeout must be a duration string like \"3s\", got integer 3"},
      {kL + "idle_timeout = \"10\"\n" + kUpstreamU, "x.toml:5:16: listener \"l\": idle_timeout " + kLike + "\"10\""},
      {kL + "idle_timeout = \"8d\"\n" + kUpstreamU, "x.toml:5:16: listener \"l\": idle_timeout " + kLike + "\"8d\""},
      {kL + "tries = 0\n" + kUpstreamU, "x.toml:5:9: listener \"l\": tries must be 1..100, got 0"},
      {kL + "tries = 101\n" + kUpstreamU, "x.toml:5:9: listener \"l\": tries must be 1..100, got 101"},
      {kL + "tries = \"3\"\n" + kUpstreamU, "x.toml:5:9: listener \"l\": tries must be an integer, got string \"3\""},
      {kL + "next_upstream_timeout = \"-1s\"\n" + kUpstreamU,
       "x.toml:5:25: listener \"l\": next_upstream_timeout " + kLike + "\"-1s\""},
      {kL + "fin_timeout = \"0ms\"\n" + kUpstreamU,
       "x.toml:5:15: listener \"l\": fin_timeout must be greater than 0, got \"0ms\""},
      {kL + "max_lifetime = \"1x\"\n" + kUpstreamU, "x.toml:5:16: listener \"l\": max_lifetime " + kLike + "\"1x\""},
      {kL + "max_lifetime = \"200h\"\n" + kUpstreamU,
       "x.toml:5:16: listener \"l\": max_lifetime must be at most 7 days (\"168h\"), got \"200h\""},
      {kL + "backlog = 0\n" + kUpstreamU, "x.toml:5:11: listener \"l\": backlog must be 1..65535, got 0"},
      {kL + "backlog = 65536\n" + kUpstreamU, "x.toml:5:11: listener \"l\": backlog must be 1..65535, got 65536"},
      {kL + "preread = \"ssl\"\n" + kUpstreamU,
       "x.toml:5:11: listener \"l\": preread must be one of none|tls|postgres, got \"ssl\""},
      {kL + "preread = true\n" + kUpstreamU, "x.toml:5:11: listener \"l\": preread must be a string, got boolean true"},
  });
}

TEST_CASE("[[listener]]: preread keys") {
  check_cases({
      {kL + "routes = []\n" + kUpstreamU, "x.toml:5:1: listener \"l\": routes is allowed only with preread = \"tls\" or \"postgres\""},
      {kL + "default_upstream = \"u\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": default_upstream is allowed only with preread = \"tls\" or \"postgres\""},
      {kL + "on_not_tls = \"close\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": on_not_tls is allowed only with preread = \"tls\" or \"postgres\""},
      {kL + "on_malformed = \"close\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": on_malformed is allowed only with preread = \"tls\" or \"postgres\""},
      {kL + "preread = \"none\"\npreread_timeout = \"1s\"\n" + kUpstreamU,
       "x.toml:6:1: listener \"l\": preread_timeout is allowed only with preread = \"tls\" or \"postgres\" (or "
       "accept_proxy, or protocol)"},
      {kL + "protocol = \"mongodb\"\n" + kUpstreamU,
       "x.toml:5:12: listener \"l\": protocol must be one of postgres|mysql|redis, got \"mongodb\""},
      {kL + "protocol = \"redis\"\npreread_timeout = \"0s\"\n" + kUpstreamU,
       "x.toml:6:19: listener \"l\": preread_timeout must be greater than 0, got \"0s\""},
      {"[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\npreread = \"postgres\"\nprotocol = \"mysql\"\n"
       "default_upstream = \"u\"\n" + kUpstreamU,
       "x.toml:5:12: listener \"p\": protocol = \"mysql\" does not go with preread = \"postgres\", whose clients "
       "speak PostgreSQL"},
      {kL + "preread_max_bytes = 1024\n" + kUpstreamU,
       "x.toml:5:1: listener \"l\": preread_max_bytes is allowed only with preread = \"tls\" or \"postgres\""},
      {kT + "upstream = \"u\"\n" + kUpstreamU,
       "x.toml:5:1: listener \"t\": upstream is not allowed with preread = \"tls\"; use default_upstream and routes"},
      {kT + kUpstreamU, "x.toml:1:1: listener \"t\": preread = \"tls\" needs routes or default_upstream (or both)"},
      {kT + "routes = []\n" + kUpstreamU,
       "x.toml:1:1: listener \"t\": preread = \"tls\" needs routes or default_upstream (or both)"},
      {kT + "default_upstream = \"x\"\n" + kUpstreamU,
       "x.toml:5:20: listener \"t\": default_upstream \"x\" is not defined; known upstreams: u"},
      {kT + "default_upstream = 1\n" + kUpstreamU,
       "x.toml:5:20: listener \"t\": default_upstream must be a string, got integer 1"},
      {kT + "default_upstream = \"u\"\npreread_timeout = \"0s\"\n" + kUpstreamU,
       "x.toml:6:19: listener \"t\": preread_timeout must be greater than 0, got \"0s\""},
      {kT + "default_upstream = \"u\"\npreread_max_bytes = 511\n" + kUpstreamU,
       "x.toml:6:21: listener \"t\": preread_max_bytes must be 512..65536, got 511"},
      {kT + "default_upstream = \"u\"\npreread_max_bytes = 65537\n" + kUpstreamU,
       "x.toml:6:21: listener \"t\": preread_max_bytes must be 512..65536, got 65537"},
      {kT + "default_upstream = \"u\"\non_not_tls = \"drop\"\n" + kUpstreamU,
       "x.toml:6:14: listener \"t\": on_not_tls must be one of default|close, got \"drop\""},
      {kT + "default_upstream = \"u\"\non_malformed = \"reject\"\n" + kUpstreamU,
       "x.toml:6:16: listener \"t\": on_malformed must be one of close|default, got \"reject\""},
  });
}

TEST_CASE("[[listener]]: routes") {
  const std::string bad_sni =
      "sni must be a host name like \"db.example.com\" or a wildcard like \"*.example.com\", got ";
  check_cases({
      {kT + "routes = \"a.test\"\n" + kUpstreamU,
       "x.toml:5:10: listener \"t\": routes must be an array of tables like "
       "[{ sni = \"db.example.com\", upstream = \"NAME\" }], got string \"a.test\""},
      {kT + "routes = [\"a.test\"]\n" + kUpstreamU,
       "x.toml:5:11: listener \"t\" route 1: must be a table like "
       "{ sni = \"db.example.com\", upstream = \"NAME\" }, got string \"a.test\""},
      {kT + "routes = [{ upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:11: listener \"t\" route 1: a route needs sni, alpn or both (and upstream)"},
      {kT + "routes = [\n  { sni = \"a.test\", upstream = \"u\" },\n  { sni = \"b.test\" },\n]\n" + kUpstreamU,
       "x.toml:7:3: listener \"t\" route 2: missing required key \"upstream\""},
      {kT + "routes = [{ sni = \"a.test\", upstream = \"u\", weight = 1 }]\n" + kUpstreamU,
       "x.toml:5:45: listener \"t\" route 1: unknown key \"weight\"; allowed: sni, alpn, upstream"},
      {kT + "routes = [{ sni = \"a..test\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + bad_sni + "\"a..test\""},
      {kT + "routes = [{ sni = \"a.*.test\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + bad_sni + "\"a.*.test\""},
      {kT + "routes = [{ sni = \"*a.test\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + bad_sni + "\"*a.test\""},
      {kT + "routes = [{ sni = \"\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + bad_sni + "\"\""},
      {kT + "routes = [{ sni = \"a b.test\", upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: " + bad_sni + "\"a b.test\""},
      {kT + "routes = [{ sni = 1, upstream = \"u\" }]\n" + kUpstreamU,
       "x.toml:5:19: listener \"t\" route 1: sni must be a string, got integer 1"},
      {kT + "routes = [\n  { sni = \"a.test\", upstream = \"u\" },\n  { sni = \"A.Test.\", upstream = \"u\" },\n]\n" +
           kUpstreamU,
       "x.toml:7:11: listener \"t\" route 2: sni \"a.test\" is already used by route 1"},
      {kT + "routes = [{ sni = \"a.test\", upstream = \"v\" }]\n" + kUpstreamU,
       "x.toml:5:40: listener \"t\" route 1: upstream \"v\" is not defined; known upstreams: u"},
  });
}

TEST_CASE("[upstream.NAME]") {
  const std::string servers = "servers = [{ address = \"127.0.0.1:9001\" }]\n";
  check_cases({
      {"[upstream.u]\n" + servers + "balanse = \"hash\"\n" + kListenerL,
       "x.toml:3:1: upstream \"u\": unknown key \"balanse\"; " + kUpstreamKeys},
      {"[upstream.u]\n" + servers + "[upstream.u.health]\ntype = \"icmp\"\n" + kListenerL,
       "x.toml:4:8: upstream \"u\" health: type must be one of tcp|http|send_expect|postgres|redis|mysql, got \"icmp\""},
      {"[upstream.\"a b\"]\n" + servers + kUpstreamU + kListenerL,
       "x.toml:1:11: upstream \"a b\": name must match [A-Za-z0-9_.-]+"},
      {"[upstream]\nu = 5\n" + kListenerL, "x.toml:2:5: upstream \"u\": must be a table ([upstream.u]), got integer 5"},
      {"[upstream.u]\nbalance = \"rr\"\n" + servers + kListenerL,
       "x.toml:2:11: upstream \"u\": balance must be one of least_conn|round_robin|hash|random, got \"rr\""},
      {"[upstream.u]\nmax_fails = 1001\n" + servers + kListenerL,
       "x.toml:2:13: upstream \"u\": max_fails must be 0..1000, got 1001"},
      {"[upstream.u]\nmax_fails = -1\n" + servers + kListenerL,
       "x.toml:2:13: upstream \"u\": max_fails must be 0..1000, got -1"},
      {"[upstream.u]\nfail_timeout = \"0s\"\n" + servers + kListenerL,
       "x.toml:2:16: upstream \"u\": fail_timeout must be greater than 0, got \"0s\""},
      {"[upstream.u]\nfail_timeout = \"10 s\"\n" + servers + kListenerL,
       "x.toml:2:16: upstream \"u\": fail_timeout " + kLike + "\"10 s\""},
      {"[upstream.u]\nhash_key = \"sni\"\n" + servers + kListenerL,
       "x.toml:2:1: upstream \"u\": hash_key is allowed only with balance = \"hash\""},
      {"[upstream.u]\nbalance = \"round_robin\"\nhash_balance_factor = 1.5\n" + servers + kListenerL,
       "x.toml:3:1: upstream \"u\": hash_balance_factor is allowed only with balance = \"hash\""},
      {"[upstream.u]\nbalance = \"hash\"\nhash_key = \"ip\"\n" + servers + kListenerL,
       "x.toml:3:12: upstream \"u\": hash_key must be one of sni|client_ip|sni_or_client_ip, got \"ip\""},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = 1.0\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got float 1.0"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = 1\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got integer 1"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = 0.5\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got float 0.5"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = 100.5\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got float 100.5"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = -2\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got integer -2"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = nan\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be 0 (off) or more than 1.0 and at most 100, "
       "got float nan"},
      {"[upstream.u]\nbalance = \"hash\"\nhash_balance_factor = \"2\"\n" + servers + kListenerL,
       "x.toml:3:23: upstream \"u\": hash_balance_factor must be a number, got string \"2\""},
      {"[upstream.u]\nmax_fails = 1\n" + kListenerL, "x.toml:1:1: upstream \"u\": needs servers = [{ address = \"host:port\" }, ...] or sentinel = { addresses = [...], master = \"...\" }"},
      {"[upstream.u]\nservers = []\n" + kListenerL, "x.toml:2:11: upstream \"u\": servers must not be empty"},
      {"[upstream.u]\nservers = \"127.0.0.1:9001\"\n" + kListenerL,
       "x.toml:2:11: upstream \"u\": servers must be an array of tables like [{ address = \"10.0.0.1:5432\" }], "
       "got string \"127.0.0.1:9001\""},
  });
}

TEST_CASE("[upstream.NAME] servers") {
  const std::string head = "[upstream.pg]\nservers = [\n  { address = \"10.0.0.1:5432\" },\n";
  const std::string tail = "]\n" + kListenerL.substr(0, kListenerL.size() - 4) + "\"pg\"\n";
  check_cases({
      {head + "  \"10.0.0.2:5432\",\n" + tail,
       "x.toml:4:3: upstream \"pg\" server 2: must be a table like { address = \"10.0.0.1:5432\" }, "
       "got string \"10.0.0.2:5432\""},
      {head + "  { weight = 2 },\n" + tail, "x.toml:4:3: upstream \"pg\" server 2: missing required key \"address\""},
      {head + "  { address = \"10.0.0.2:0\" },\n" + tail,
       "x.toml:4:15: upstream \"pg\" server 2: address must have a port 1..65535, got \"10.0.0.2:0\""},
      {head + "  { address = \"10.0.0.2\" },\n" + tail,
       "x.toml:4:15: upstream \"pg\" server 2: address must be \"host:port\" or \"[ipv6]:port\" (missing port), "
       "got \"10.0.0.2\""},
      {head + "  { address = \"10.0.0.2:5432\", weight = 0 },\n" + tail,
       "x.toml:4:41: upstream \"pg\" server 2: weight must be 1..1000, got 0"},
      {head + "  { address = \"10.0.0.2:5432\", weight = 1001 },\n" + tail,
       "x.toml:4:41: upstream \"pg\" server 2: weight must be 1..1000, got 1001"},
      {head + "  { address = \"10.0.0.2:5432\", weight = 1.5 },\n" + tail,
       "x.toml:4:41: upstream \"pg\" server 2: weight must be an integer, got float 1.5"},
      {head + "  { address = \"10.0.0.2:5432\", max_conns = -1 },\n" + tail,
       "x.toml:4:44: upstream \"pg\" server 2: max_conns must be 0..1000000, got -1"},
      {head + "  { address = \"10.0.0.2:5432\", max_conns = 1000001 },\n" + tail,
       "x.toml:4:44: upstream \"pg\" server 2: max_conns must be 0..1000000, got 1000001"},
      {head + "  { address = \"10.0.0.2:5432\", backup = \"yes\" },\n" + tail,
       "x.toml:4:41: upstream \"pg\" server 2: backup must be a boolean (true or false), got string \"yes\""},
      {head + "  { address = \"10.0.0.2:5432\", wieght = 2 },\n" + tail,
       "x.toml:4:32: upstream \"pg\" server 2: unknown key \"wieght\"; allowed: address, resolve, weight, max_conns, backup"},
      {head + "  { address = \"10.0.0.1:5432\" },\n" + tail,
       "x.toml:4:15: upstream \"pg\" server 2: address \"10.0.0.1:5432\" is already used by server 1"},
      {"[upstream.pg]\nservers = [{ address = \"[::1]:5432\" }, { address = \"[0::1]:5432\" }]\n" + tail.substr(2),
       "x.toml:2:52: upstream \"pg\" server 2: address \"[0::1]:5432\" resolves to the same address as server 1 "
       "(\"[::1]:5432\")"},
      {"[upstream.pg]\nbalance = \"hash\"\nservers = [\n  { address = \"10.0.0.1:5432\" },\n"
       "  { address = \"10.0.0.2:5432\", backup = true },\n" + tail,
       "x.toml:5:41: upstream \"pg\" server 2: backup = true is not allowed with balance = \"hash\""},
  });
}

TEST_CASE("defaults are applied") {
  const Config c = sluice::parse_config(kTail, "x.toml");
  CHECK(c.path == "x.toml");
  CHECK(c.global.workers == 0);
  CHECK(c.global.max_connections == 100000);
  CHECK(c.global.shutdown_timeout == 30s);
  CHECK(c.global.shutdown_delay == 0s);
  CHECK(c.global.upgrade_timeout == 30s);
  CHECK(c.global.upgrade_finish_timeout == 30s);
  CHECK(c.global.log_level == "info");
  CHECK(c.global.access_log == "stderr");
  CHECK(c.global.access_log_format == "text");
  REQUIRE(c.listeners.size() == 1);
  const auto& l = c.listeners[0];
  CHECK(l.name == "l");
  CHECK(l.listen.text == "127.0.0.1:0");
  CHECK(l.listen.port == 0);
  CHECK(l.upstream == "u");
  CHECK(l.connect_timeout == 5s);
  CHECK(l.idle_timeout == 0ms);
  CHECK(l.tries == 3);
  CHECK(l.next_upstream_timeout == 0ms);
  CHECK(l.fin_timeout == 30s);
  CHECK(l.max_lifetime == 0ms);
  CHECK(l.backlog == 4096);
  CHECK(l.preread == sluice::Preread::none);
  CHECK(l.preread_timeout == 5s);
  CHECK(l.preread_max_bytes == 16384);
  CHECK(l.routes.empty());
  CHECK(l.default_upstream.empty());
  CHECK(l.on_not_tls == sluice::OnNotTls::use_default);
  CHECK(l.on_malformed == sluice::OnMalformed::close);
  REQUIRE(c.upstreams.size() == 1);
  const auto& u = c.upstreams.at("u");
  CHECK(u.name == "u");
  CHECK(u.balance == sluice::Balance::least_conn);
  CHECK(u.max_fails == 1);
  CHECK(u.fail_timeout == 10s);
  CHECK(u.hash_key == sluice::HashKey::sni_or_client_ip);
  CHECK(u.hash_balance_factor == 0.0);
  REQUIRE(u.servers.size() == 1);
  CHECK(u.servers[0].address.text == "127.0.0.1:9001");
  CHECK(u.servers[0].address.port == 9001);
  CHECK(u.servers[0].weight == 1);
  CHECK(u.servers[0].max_conns == 0);
  CHECK_FALSE(u.servers[0].backup);
}

TEST_CASE("protocol: named, implied by preread = \"postgres\", and preread_timeout with it") {
  CHECK(sluice::parse_config(kTail, "x.toml").listeners[0].protocol == sluice::ClientProtocol::none);
  for (const auto& [text, want] : {std::pair{"postgres", sluice::ClientProtocol::postgres},
                                   std::pair{"mysql", sluice::ClientProtocol::mysql},
                                   std::pair{"redis", sluice::ClientProtocol::redis}}) {
    CAPTURE(text);
    const Config c = sluice::parse_config(kL + "protocol = \"" + text + "\"\npreread_timeout = \"2s\"\n" + kUpstreamU,
                                          "x.toml");
    CHECK(c.listeners[0].protocol == want);
    CHECK(c.listeners[0].preread_timeout == 2s);
  }
  const std::string pg = "[[listener]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\npreread = \"postgres\"\n"
                         "default_upstream = \"u\"\n";
  CHECK(sluice::parse_config(pg + kUpstreamU, "x.toml").listeners[0].protocol == sluice::ClientProtocol::postgres);
  CHECK(sluice::parse_config(pg + "protocol = \"postgres\"\n" + kUpstreamU, "x.toml").listeners[0].protocol ==
        sluice::ClientProtocol::postgres);
  // accept_proxy's preread_timeout is read too (it was accepted and left unused).
  const Config proxied = sluice::parse_config(
      kL + "accept_proxy = true\ntrusted_proxies = [\"127.0.0.1\"]\npreread_timeout = \"3s\"\n" + kUpstreamU, "x.toml");
  CHECK(proxied.listeners[0].preread_timeout == 3s);
}

TEST_CASE("a file with no listener is valid") {
  CHECK(sluice::parse_config("", "x.toml").listeners.empty());
  const Config c = sluice::parse_config("[global]\nworkers = 1\n[admin]\nlisten = \"127.0.0.1:0\"\n" + kUpstreamU, "x.toml");
  CHECK(c.listeners.empty());
  CHECK(c.admin.enabled);
  CHECK(c.upstreams.size() == 1);
  CHECK(sluice::parse_config("listener = []\n" + kUpstreamU, "x.toml").listeners.empty());
}

TEST_CASE("upgrade_finish_timeout defaults to upgrade_timeout, whichever order they come in") {
  CHECK(sluice::parse_config("[global]\nupgrade_timeout = \"7s\"\n" + kTail, "x.toml").global.upgrade_finish_timeout ==
        7s);
  const Config both =
      sluice::parse_config("[global]\nupgrade_finish_timeout = \"2m\"\nupgrade_timeout = \"7s\"\n" + kTail, "x.toml");
  CHECK(both.global.upgrade_timeout == 7s);
  CHECK(both.global.upgrade_finish_timeout == 2min);
}

TEST_CASE("every key is read") {
  const Config c = sluice::parse_config(R"(
[global]
workers = 4
max_connections = 5000000000
shutdown_timeout = "2m"
shutdown_delay = "15s"
log_level = "debug"
access_log = "/var/log/sluice/access.log"
access_log_format = "json"

[[listener]]
name = "pg"
listen = "[::1]:5432"
upstream = "pg"
connect_timeout = "250ms"
idle_timeout = "1h"
tries = 5
next_upstream_timeout = "10s"
fin_timeout = "7s"
max_lifetime = "168h"
backlog = 1024
preread = "none"

[[listener]]
name = "tls.front-1"
listen = "127.0.0.1:8443"
preread = "tls"
preread_timeout = "2s"
preread_max_bytes = 512
routes = [
  { sni = "DB.Example.COM.", upstream = "pg" },
  { sni = "*.Example.com", upstream = "web" },
]
default_upstream = "web"
on_not_tls = "close"
on_malformed = "default"

[[listener]]
name = "ephemeral"
listen = "127.0.0.1:0"
upstream = "pg"

[[listener]]
name = "ephemeral2"
listen = "127.0.0.1:0"
upstream = "pg"

[upstream.pg]
balance = "round_robin"
max_fails = 0
fail_timeout = "1m"
servers = [
  { address = "10.0.0.1:5432", weight = 1000, max_conns = 1000000 },
  { address = "10.0.0.2:5432", max_conns = 0, backup = true },
]

[upstream.web]
balance = "hash"
hash_key = "client_ip"
hash_balance_factor = 1.25
servers = [{ address = "10.0.1.1:443", backup = false }, { address = "10.0.1.2:443" }]

[upstream.unused]
balance = "random"
servers = [{ address = "10.0.2.1:80" }]
)",
                                           "full.toml");
  CHECK(c.global.workers == 4);
  CHECK(c.global.max_connections == 5000000000ULL);
  CHECK(c.global.shutdown_timeout == 2min);
  CHECK(c.global.shutdown_delay == 15s);
  CHECK(c.global.log_level == "debug");
  CHECK(c.global.access_log == "/var/log/sluice/access.log");
  CHECK(c.global.access_log_format == "json");

  REQUIRE(c.listeners.size() == 4);
  const auto& pg = c.listeners[0];
  CHECK(pg.name == "pg");
  CHECK(pg.listen.host == "::1");
  CHECK(pg.listen.port == 5432);
  CHECK(pg.listen.addr.ss_family == AF_INET6);
  CHECK(pg.upstream == "pg");
  CHECK(pg.connect_timeout == 250ms);
  CHECK(pg.idle_timeout == 1h);
  CHECK(pg.tries == 5);
  CHECK(pg.next_upstream_timeout == 10s);
  CHECK(pg.fin_timeout == 7s);
  CHECK(pg.max_lifetime == 168h);
  CHECK(pg.backlog == 1024);
  CHECK(pg.preread == sluice::Preread::none);

  const auto& tls = c.listeners[1];
  CHECK(tls.name == "tls.front-1");
  CHECK(tls.upstream.empty());
  CHECK(tls.preread == sluice::Preread::tls);
  CHECK(tls.preread_timeout == 2s);
  CHECK(tls.preread_max_bytes == 512);
  REQUIRE(tls.routes.size() == 2);
  CHECK(tls.routes[0].sni == "db.example.com");
  CHECK(tls.routes[0].upstream == "pg");
  CHECK(tls.routes[1].sni == "*.example.com");
  CHECK(tls.routes[1].upstream == "web");
  CHECK(tls.default_upstream == "web");
  CHECK(tls.on_not_tls == sluice::OnNotTls::close);
  CHECK(tls.on_malformed == sluice::OnMalformed::use_default);
  CHECK(c.listeners[2].listen.port == 0);
  CHECK(c.listeners[3].listen.port == 0);

  REQUIRE(c.upstreams.size() == 3);
  const auto& up = c.upstreams.at("pg");
  CHECK(up.balance == sluice::Balance::round_robin);
  CHECK(up.max_fails == 0);
  CHECK(up.fail_timeout == 1min);
  REQUIRE(up.servers.size() == 2);
  CHECK(up.servers[0].weight == 1000);
  CHECK(up.servers[0].max_conns == 1000000);
  CHECK_FALSE(up.servers[0].backup);
  CHECK(up.servers[1].weight == 1);
  CHECK(up.servers[1].backup);
  const auto& web = c.upstreams.at("web");
  CHECK(web.name == "web");
  CHECK(web.balance == sluice::Balance::hash);
  CHECK(web.hash_key == sluice::HashKey::client_ip);
  CHECK(web.hash_balance_factor == doctest::Approx(1.25));
  CHECK(c.upstreams.at("unused").balance == sluice::Balance::random);
}

TEST_CASE("tls listener with only routes, integer hash_balance_factor") {
  const Config c = sluice::parse_config(kT + "routes = [{ sni = \"a.test\", upstream = \"u\" }]\n"
                                             "[upstream.u]\nbalance = \"hash\"\nhash_key = \"sni\"\n"
                                             "hash_balance_factor = 2\nservers = [{ address = \"127.0.0.1:1\" }]\n",
                                        "x.toml");
  REQUIRE(c.listeners.size() == 1);
  CHECK(c.listeners[0].default_upstream.empty());
  REQUIRE(c.listeners[0].routes.size() == 1);
  const auto& u = c.upstreams.at("u");
  CHECK(u.hash_key == sluice::HashKey::sni);
  CHECK(u.hash_balance_factor == 2.0);
}

TEST_CASE("the installed configuration starts no listener") {
  // The template of /etc/sluice/sluice.toml: its @...@ are in comments only.
  const Config c = sluice::load_config("conf/default.toml.in");
  CHECK(c.listeners.empty());
  CHECK(c.admin.enabled);
  CHECK(c.admin.listen.text == "127.0.0.1:8489");
  CHECK(c.upstreams.empty());
}

TEST_CASE("the shipped example files load") {
  const Config demo = sluice::load_config("conf/sluice.toml");
  CHECK(demo.path == "conf/sluice.toml");
  CHECK(demo.global.access_log == "stderr");
  CHECK(demo.admin.enabled);
  CHECK(demo.admin.listen.text == "127.0.0.1:9090");
  REQUIRE(demo.listeners.size() == 2);
  CHECK(demo.listeners[0].name == "demo");
  CHECK(demo.listeners[0].listen.text == "127.0.0.1:7000");
  CHECK(demo.listeners[0].upstream == "demo");
  CHECK(demo.listeners[1].name == "demo_rr");
  CHECK(demo.listeners[1].listen.text == "127.0.0.1:7001");
  CHECK(demo.listeners[1].upstream == "demo_rr");
  const auto& u = demo.upstreams.at("demo");
  CHECK(u.balance == sluice::Balance::least_conn);
  REQUIRE(u.servers.size() == 3);
  CHECK(u.servers[0].address.text == "127.0.0.1:9101");
  CHECK(u.servers[0].weight == 2);
  CHECK(u.servers[1].address.text == "127.0.0.1:9102");
  CHECK_FALSE(u.servers[1].backup);
  CHECK(u.servers[2].address.text == "127.0.0.1:9103");
  CHECK(u.servers[2].backup);
  const auto& rr = demo.upstreams.at("demo_rr");
  CHECK(rr.balance == sluice::Balance::round_robin);
  REQUIRE(rr.servers.size() == 2);

  const Config sni = sluice::load_config("conf/sni.toml");
  REQUIRE(sni.listeners.size() >= 1);
  const auto& l = sni.listeners[0];
  CHECK(l.listen.text == "127.0.0.1:8443");
  CHECK(l.preread == sluice::Preread::tls);
  REQUIRE(l.routes.size() >= 2);
  CHECK(l.routes[0].sni == "a.example.test");
  CHECK(l.routes[0].upstream == "tls_a");
  CHECK(l.routes[1].sni == "*.b.example.test");
  CHECK(l.routes[1].upstream == "tls_b");
  CHECK(l.default_upstream == "tls_a");
  CHECK(sni.upstreams.at("tls_a").servers.at(0).address.text == "127.0.0.1:9441");
  CHECK(sni.upstreams.at("tls_b").servers.at(0).address.text == "127.0.0.1:9442");
  bool has_sni_hash = false;
  for (const auto& [name, up] : sni.upstreams) {
    if (up.balance == sluice::Balance::hash && up.hash_key == sluice::HashKey::sni) has_sni_hash = true;
  }
  CHECK(has_sni_hash);
}

TEST_CASE("load_config: unreadable files and positions") {
  CHECK_THROWS_WITH_AS(sluice::load_config("conf/no-such-file.toml"),
                       "conf/no-such-file.toml: cannot read: No such file or directory", ConfigError);
  CHECK_THROWS_WITH_AS(sluice::load_config("conf"), "conf: cannot read: Is a directory", ConfigError);
}

TEST_CASE("range limits are inclusive") {
  const Config c = sluice::parse_config(R"([global]
workers = 256
max_connections = 1
shutdown_timeout = "0s"

[[listener]]
name = "t"
listen = "127.0.0.1:65535"
preread = "tls"
default_upstream = "u"
preread_max_bytes = 65536
connect_timeout = "1ms"
tries = 100
backlog = 65535

[[listener]]
name = "l"
listen = "127.0.0.1:0"
upstream = "u"
tries = 1
backlog = 1

[upstream.u]
balance = "hash"
hash_balance_factor = 100
max_fails = 1000
servers = [
  { address = "127.0.0.1:1", weight = 1000, max_conns = 1000000 },
  { address = "127.0.0.2:65535", weight = 1, backup = false },
]
)",
                                        "x.toml");
  CHECK(c.global.workers == 256);
  CHECK(c.global.max_connections == 1);
  CHECK(c.global.shutdown_timeout == 0ms);
  REQUIRE(c.listeners.size() == 2);
  CHECK(c.listeners[0].preread_max_bytes == 65536);
  CHECK(c.listeners[0].connect_timeout == 1ms);
  CHECK(c.listeners[0].tries == 100);
  CHECK(c.listeners[0].backlog == 65535);
  CHECK(c.listeners[0].listen.port == 65535);
  CHECK(c.listeners[1].tries == 1);
  CHECK(c.listeners[1].backlog == 1);
  const auto& u = c.upstreams.at("u");
  CHECK(u.hash_balance_factor == 100.0);
  CHECK(u.max_fails == 1000);
  CHECK(u.servers[0].weight == 1000);
  CHECK(u.servers[0].max_conns == 1000000);
  CHECK(u.servers[1].address.port == 65535);
}

TEST_CASE("servers as an array of tables, and an upstream named with a dot") {
  const Config c = sluice::parse_config(R"([[listener]]
name = "l"
listen = "127.0.0.1:0"
upstream = "pg.main"

[[upstream."pg.main".servers]]
address = "127.0.0.1:5432"
weight = 3

[[upstream."pg.main".servers]]
address = "127.0.0.1:5433"
)",
                                        "x.toml");
  const auto& u = c.upstreams.at("pg.main");
  CHECK(u.name == "pg.main");
  REQUIRE(u.servers.size() == 2);
  CHECK(u.servers[0].weight == 3);
  CHECK(u.servers[1].address.port == 5433);
  CHECK(error_of("[[upstream.u.servers]]\naddress = \"127.0.0.1:1\"\n"
                 "[[upstream.u.servers]]\nweight = 2\n" + kListenerL) ==
        "x.toml:3:1: upstream \"u\" server 2: missing required key \"address\"");
}
