// [global] keys for logging and draining, and the [admin] table.
#include <string>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace std::chrono_literals;
using namespace config_test;

TEST_CASE("[global]: error_log, log_interval, drain_timeout") {
  const std::string not_a_log = "error_log must be a file path, \"stderr\" or \"stdout\", got ";
  check_cases({
      {"[global]\nerror_log = \"\"\n" + kTail,
       "x.toml:2:13: [global]: " + not_a_log + "\"\" (log_level = \"off\" silences it)"},
      {"[global]\nerror_log = \"off\"\n" + kTail,
       "x.toml:2:13: [global]: " + not_a_log + "\"off\" (log_level = \"off\" silences it)"},
      {"[global]\nerror_log = 1\n" + kTail, "x.toml:2:13: [global]: error_log must be a string, got integer 1"},
      {"[global]\nlog_interval = \"500ms\"\n" + kTail,
       "x.toml:2:16: [global]: log_interval must be \"0s\" (off) or at least \"1s\", got \"500ms\""},
      {"[global]\nlog_interval = \"1 m\"\n" + kTail,
       "x.toml:2:16: [global]: log_interval must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got \"1 m\""},
      {"[global]\ndrain_timeout = 5\n" + kTail,
       "x.toml:2:17: [global]: drain_timeout must be a duration string like \"3s\", got integer 5"},
  });
}

TEST_CASE("[global]: new keys, defaults and values") {
  const auto d = sluice::parse_config(kTail, "x.toml");
  CHECK(d.global.error_log == "stderr");
  CHECK(d.global.log_interval == 0ms);
  CHECK(d.global.drain_timeout == 0ms);
  CHECK(d.upstreams.at("u").drain_timeout == 0ms);

  const auto c = sluice::parse_config("[global]\nerror_log = \"/var/log/sluice/error.log\"\nlog_interval = \"1s\"\n"
                                      "drain_timeout = \"45s\"\n" + kListenerL + kUpstreamU +
                                          "[upstream.v]\ndrain_timeout = \"0s\"\n"
                                          "servers = [{ address = \"127.0.0.1:9002\" }]\n",
                                      "x.toml");
  CHECK(c.global.error_log == "/var/log/sluice/error.log");
  CHECK(c.global.log_interval == 1s);
  CHECK(c.global.drain_timeout == 45s);
  CHECK(c.upstreams.at("u").drain_timeout == 45s);  // inherited from [global]
  CHECK(!c.upstreams.at("u").drain_timeout_set);
  CHECK(c.upstreams.at("v").drain_timeout == 0ms);  // its own, even when 0
  CHECK(c.upstreams.at("v").drain_timeout_set);
  CHECK(sluice::parse_config("[global]\nerror_log = \"stdout\"\nlog_interval = \"0s\"\n" + kTail, "x.toml")
            .global.error_log == "stdout");
}

TEST_CASE("[admin]: errors") {
  const TempFile blank(" \n\t\n", "token");
  const TempFile too_long(std::string(sluice::kMaxAdminTokenBytes + 1, 't') + "\n", "token");
  check_cases({
      {"admin = true\n" + kTail, "x.toml:1:9: top level: admin must be a table ([admin]), got boolean true"},
      {"[admin]\nport = 9090\n" + kTail, "x.toml:2:1: [admin]: unknown key \"port\"; allowed: listen, token_file, allowed_hosts"},
      {"[admin]\nlisten = \"[::]:9090\"\n" + kTail,
       "x.toml:2:10: [admin]: listen \"[::]:9090\" is not a loopback address: set token_file so that every request "
       "needs a token"},
      {"[admin]\nlisten = \"10.0.0.1:9090\"\n" + kTail,
       "x.toml:2:10: [admin]: listen \"10.0.0.1:9090\" is not a loopback address: set token_file so that every "
       "request needs a token"},
      {"[admin]\nlisten = \"127.0.0.1\"\n" + kTail,
       "x.toml:2:10: [admin]: listen must be \"host:port\" or \"[ipv6]:port\" (missing port), got \"127.0.0.1\""},
      {"[admin]\ntoken_file = \"/nonexistent/sluice-token\"\n" + kTail,
       "x.toml:2:14: [admin]: token_file \"/nonexistent/sluice-token\" cannot be read: No such file or directory"},
      {"[admin]\ntoken_file = \"conf\"\n" + kTail,
       "x.toml:2:14: [admin]: token_file \"conf\" is not a regular file"},
      {"[admin]\ntoken_file = \"\"\n" + kTail, "x.toml:2:14: [admin]: token_file must be a file path, got \"\""},
      {"[admin]\ntoken_file = \"" + blank.path() + "\"\n" + kTail,
       "x.toml:2:14: [admin]: token_file \"" + blank.path() + "\" holds no token (it is empty)"},
      {"[admin]\nlisten = \"127.0.0.1:7000\"\n[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:7000\"\n"
       "upstream = \"u\"\n" + kUpstreamU,
       "x.toml:2:10: [admin]: listen \"127.0.0.1:7000\" is already used by listener \"l\""},
      {"[admin]\ntoken_file = \"" + too_long.path() + "\"\n" + kTail,
       "x.toml:2:14: [admin]: token_file \"" + too_long.path() + "\" holds a token of 4097 bytes; at most 4096"},
      {"[admin]\nallowed_hosts = \"lb1.example\"\n" + kTail,
       "x.toml:2:17: [admin]: allowed_hosts must be an array of host names like [\"lb1.example\"], got string "
       "\"lb1.example\""},
      {"[admin]\nallowed_hosts = [\"lb1.example\", 7]\n" + kTail,
       "x.toml:2:33: [admin]: allowed_hosts entry 2 must be a host name like \"lb1.example\", got integer 7"},
      {"[admin]\nallowed_hosts = [\"*.example.com\"]\n" + kTail,
       "x.toml:2:18: [admin]: allowed_hosts entry 1 must be a host name like \"lb1.example\", or a name and a port "
       "like \"lb1.example:8443\" (letters, digits, '-', '_' and dots; no wildcard, no scheme), got \"*.example.com\""},
      {"[admin]\nallowed_hosts = [\"lb1.example:0\"]\n" + kTail,
       "x.toml:2:18: [admin]: allowed_hosts entry 1 port must be 1..65535, got \"lb1.example:0\""},
      {"[admin]\nallowed_hosts = [\"127.0.0.1\"]\n" + kTail,
       "x.toml:2:18: [admin]: allowed_hosts entry 1 needs no entry: every literal IP address is allowed, got "
       "\"127.0.0.1\""},
  });
}

TEST_CASE("[admin]: allowed_hosts as the admin API compares them") {
  const auto c = sluice::parse_config("[admin]\nallowed_hosts = [\"LB1.Example.\", \"ops.example:8443\"]\n" + kTail,
                                      "x.toml");
  CHECK(c.admin.allowed_hosts == std::vector<std::string>{"lb1.example", "ops.example:8443"});
  CHECK(sluice::parse_config("[admin]\n" + kTail, "x.toml").admin.allowed_hosts.empty());
}

TEST_CASE("[admin]: absent, empty, loopback and with a token") {
  const auto none = sluice::parse_config(kTail, "x.toml");
  CHECK_FALSE(none.admin.enabled);
  CHECK(none.admin.listen.text == "127.0.0.1:9090");

  const auto empty = sluice::parse_config("[admin]\n" + kTail, "x.toml");
  CHECK(empty.admin.enabled);
  CHECK(empty.admin.listen.text == "127.0.0.1:9090");
  CHECK(empty.admin.listen.port == 9090);
  CHECK(empty.admin.token_file.empty());

  const auto v6 = sluice::parse_config("[admin]\nlisten = \"[::1]:0\"\n" + kTail, "x.toml");
  CHECK(v6.admin.listen.port == 0);
  CHECK(sluice::parse_config("[admin]\nlisten = \"127.1.2.3:9\"\n" + kTail, "x.toml").admin.enabled);

  const TempFile token("s3cret\n", "token");
  const auto open = sluice::parse_config("[admin]\nlisten = \"0.0.0.0:9090\"\ntoken_file = \"" + token.path() + "\"\n" +
                                             kTail,
                                         "x.toml");
  CHECK(open.admin.enabled);
  CHECK(open.admin.listen.text == "0.0.0.0:9090");
  CHECK(open.admin.token_file == token.path());
}

TEST_CASE("[global]: close_spread and watch_config") {
  const auto d = sluice::parse_config(kTail, "x.toml");
  CHECK(d.global.close_spread == 0ms);
  CHECK(!d.global.close_spread_set);
  CHECK(!d.global.watch_config);

  const auto c = sluice::parse_config("[global]\nclose_spread = \"5s\"\nwatch_config = true\n" + kTail, "x.toml");
  CHECK(c.global.close_spread == 5s);
  CHECK(c.global.close_spread_set);
  CHECK(c.global.watch_config);
  // "0s" written means at once, everywhere, drains included.
  const auto z = sluice::parse_config("[global]\nclose_spread = \"0s\"\n" + kTail, "x.toml");
  CHECK(z.global.close_spread == 0ms);
  CHECK(z.global.close_spread_set);

  check_cases({
      {"[global]\nclose_spread = 5\n" + kTail,
       "x.toml:2:16: [global]: close_spread must be a duration string like \"3s\", got integer 5"},
      {"[global]\nclose_spread = \"-1s\"\n" + kTail,
       "x.toml:2:16: [global]: close_spread must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got \"-1s\""},
      {"[global]\nwatch_config = \"yes\"\n" + kTail,
       "x.toml:2:16: [global]: watch_config must be a boolean (true or false), got string \"yes\""},
  });
}

TEST_CASE("[global]: log_phases, off unless set") {
  CHECK(!sluice::parse_config(kTail, "x.toml").global.log_phases);
  CHECK(sluice::parse_config("[global]\nlog_phases = true\n" + kTail, "x.toml").global.log_phases);
  check_cases({
      {"[global]\nlog_phases = 1\n" + kTail,
       "x.toml:2:14: [global]: log_phases must be a boolean (true or false), got integer 1"},
  });
}
