// [upstream.NAME.health]: one line per bad input and its message, then the
// values each check type yields.
#include <string>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace std::chrono_literals;
using namespace config_test;
using sluice::HealthConfig;

namespace {

// The health table's own lines start at line 4.
const std::string kHead = "[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\" }]\n[upstream.u.health]\n";
const std::string kCtx = "upstream \"u\" health: ";
const std::string kCommon = "type, interval, timeout, rise, fall, jitter, port, initial, on_down, slow_start";

std::string at(int line, int column) {
  return "x.toml:" + std::to_string(line) + ":" + std::to_string(column) + ": " + kCtx;
}

Case health_case(const std::string& body, const std::string& error) { return {kHead + body + kListenerL, error}; }

HealthConfig health_of(const std::string& body) {
  const auto c = sluice::parse_config(kHead + body + kListenerL, "x.toml");
  REQUIRE(c.upstreams.at("u").health.has_value());
  return *c.upstreams.at("u").health;
}

}  // namespace

TEST_CASE("health: keys of another type, unknown keys") {
  check_cases({
      {"[upstream.u]\nhealth = \"tcp\"\nservers = [{ address = \"127.0.0.1:9001\" }]\n" + kListenerL,
       "x.toml:2:10: upstream \"u\": health must be a table ([upstream.NAME.health]), got string \"tcp\""},
      health_case("type = \"tcp\"\npath = \"/\"\n",
                  at(5, 1) + "key \"path\" is not allowed with type = \"tcp\"; it belongs to type = \"http\""),
      health_case("path = \"/\"\n", at(4, 1) + "key \"path\" is not allowed with type = \"tcp\" (the default); it "
                                               "belongs to type = \"http\""),
      health_case("type = \"http\"\nrole = \"primary\"\n",
                  at(5, 1) + "key \"role\" is not allowed with type = \"http\"; it belongs to type = \"postgres\" or "
                             "\"redis\""),
      health_case("type = \"redis\"\nuser = \"x\"\n",
                  at(5, 1) + "key \"user\" is not allowed with type = \"redis\"; it belongs to type = \"postgres\""),
      health_case("type = \"http\"\nsend = \"x\"\n",
                  at(5, 1) + "key \"send\" is not allowed with type = \"http\"; it belongs to type = \"send_expect\""),
      health_case("type = \"postgres\"\nexpect_body = \"ok\"\n",
                  at(5, 1) + "key \"expect_body\" is not allowed with type = \"postgres\"; it belongs to type = "
                             "\"http\""),
      health_case("intervl = \"1s\"\n", at(4, 1) + "unknown key \"intervl\"; allowed: " + kCommon),
      health_case("type = \"http\"\nbogus = 1\n", at(5, 1) + "unknown key \"bogus\"; allowed: " + kCommon +
                                                     ", path, method, host, expect_status, expect_body"),
      health_case("type = 1\n", at(4, 8) + "type must be a string, got integer 1"),
  });
}

TEST_CASE("health: common keys") {
  const std::string like = "must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got ";
  check_cases({
      health_case("interval = \"0s\"\n", at(4, 12) + "interval must be greater than 0, got \"0s\""),
      health_case("timeout = \"0ms\"\n", at(4, 11) + "timeout must be greater than 0, got \"0ms\""),
      health_case("rise = 0\n", at(4, 8) + "rise must be 1..100, got 0"),
      health_case("fall = 101\n", at(4, 8) + "fall must be 1..100, got 101"),
      health_case("jitter = 10\n", at(4, 10) + "jitter must be a percentage string like \"10%\", got integer 10"),
      health_case("jitter = \"150%\"\n",
                  at(4, 10) + "jitter must be a percentage from \"0%\" to \"100%\" like \"10%\", got \"150%\""),
      health_case("jitter = \"0.1\"\n",
                  at(4, 10) + "jitter must be a percentage from \"0%\" to \"100%\" like \"10%\", got \"0.1\""),
      health_case("port = 0\n", at(4, 8) + "port must be 1..65535, got 0"),
      health_case("port = \"8008\"\n", at(4, 8) + "port must be an integer, got string \"8008\""),
      health_case("initial = \"unknown\"\n", at(4, 11) + "initial must be one of up|down, got \"unknown\""),
      health_case("on_down = \"close\"\n", at(4, 11) + "on_down must be one of keep|close_sessions, got \"close\""),
      health_case("slow_start = \"fast\"\n", at(4, 14) + "slow_start " + like + "\"fast\""),
  });
}

TEST_CASE("health: http") {
  const std::string h = "type = \"http\"\n";
  check_cases({
      health_case(h + "path = \"primary\"\n",
                  at(5, 8) + "path must start with \"/\" and contain no spaces or control characters, got \"primary\""),
      health_case(h + "path = \"/a b\"\n",
                  at(5, 8) + "path must start with \"/\" and contain no spaces or control characters, got \"/a b\""),
      health_case(h + "method = \"get\"\n",
                  at(5, 10) + "method must be an HTTP method in capitals like \"GET\" or \"HEAD\", got \"get\""),
      health_case(h + "host = \"\"\n", at(5, 8) + "host must be a host name (no spaces or control characters), got \"\""),
      health_case(h + "expect_status = []\n", at(5, 17) + "expect_status must not be empty"),
      health_case(h + "expect_status = 200\n",
                  at(5, 17) + "expect_status must be an array like [200, \"300-399\"], got integer 200"),
      health_case(h + "expect_status = [200, 99]\n",
                  at(5, 23) + "expect_status entry 2 must be a status code 100..599, got 99"),
      health_case(h + "expect_status = [\"2xx\"]\n",
                  at(5, 18) + "expect_status entry 1 must be a status code 100..599 or a range like \"200-399\", "
                              "got \"2xx\""),
      health_case(h + "expect_status = [\"300-200\"]\n",
                  at(5, 18) + "expect_status entry 1 must be a range LOW-HIGH with LOW <= HIGH, got \"300-200\""),
      health_case(h + "expect_status = [true]\n",
                  at(5, 18) + "expect_status entry 1 must be a status code like 200 or a range like \"200-399\", "
                              "got boolean true"),
      health_case(h + "expect_body = \"\"\n",
                  at(5, 15) + "expect_body must not be empty (leave it out to accept any body)"),
  });
  const HealthConfig c = health_of(h + "path = \"/primary\"\nmethod = \"HEAD\"\nhost = \"db.internal\"\n"
                                       "expect_status = [200, \"204\", \"300-302\"]\nexpect_body = \"ok\"\nport = 8008\n");
  CHECK(c.type == sluice::HealthType::http);
  CHECK(c.path == "/primary");
  CHECK(c.method == "HEAD");
  CHECK(c.host == "db.internal");
  REQUIRE(c.expect_status.size() == 3);
  CHECK(c.expect_status[0].low == 200);
  CHECK(c.expect_status[0].high == 200);
  CHECK(c.expect_status[1].low == 204);
  CHECK(c.expect_status[2].low == 300);
  CHECK(c.expect_status[2].high == 302);
  CHECK(c.expect_body == "ok");
  CHECK(c.port == 8008);

  const HealthConfig d = health_of(h);
  CHECK(d.path == "/");
  CHECK(d.method == "GET");
  CHECK(d.host.empty());
  REQUIRE(d.expect_status.size() == 1);
  CHECK(d.expect_status[0].low == 200);
  CHECK(d.expect_status[0].high == 399);
  CHECK(d.expect_body.empty());
}

TEST_CASE("health: send_expect") {
  const std::string h = "type = \"send_expect\"\n";
  check_cases({
      health_case(h + "expect = \"+PONG\"\n", at(3, 1) + "type = \"send_expect\" needs send or send_hex"),
      health_case(h + "send = \"PING\\r\\n\"\n", at(3, 1) + "type = \"send_expect\" needs expect or expect_hex"),
      health_case(h + "send = \"PING\\r\\n\"\nsend_hex = \"50\"\nexpect = \"+PONG\"\n",
                  at(6, 1) + "send and send_hex cannot both be given; use one"),
      health_case(h + "send_hex = \"50\"\nsend = \"P\"\nexpect = \"+PONG\"\n",
                  at(6, 1) + "send and send_hex cannot both be given; use one"),
      health_case(h + "send = \"x\"\nexpect = \"a\"\nexpect_hex = \"61\"\n",
                  at(7, 1) + "expect and expect_hex cannot both be given; use one"),
      health_case(h + "send_hex = \"zz\"\nexpect = \"a\"\n",
                  at(5, 12) + "send_hex must be hex bytes like \"2a310d0a\" (single spaces allowed between bytes), "
                              "got \"zz\": unexpected \"z\" at offset 0"),
      health_case(h + "send = \"x\"\nexpect_hex = \"abc\"\n",
                  at(6, 14) + "expect_hex must have two hex digits per byte, got \"abc\" (an odd number of digits)"),
      health_case(h + "send = \"x\"\nexpect_hex = \"\"\n", at(6, 14) + "expect_hex must not be empty"),
      health_case(h + "send = \"x\"\nexpect = \"\"\n", at(6, 10) + "expect must not be empty"),
      health_case(h + "send = 1\nexpect = \"a\"\n", at(5, 8) + "send must be a string, got integer 1"),
      health_case(h + "send = \"x\"\nexpect = \"a\"\nexpect_match = \"exact\"\n",
                  at(7, 16) + "expect_match must be one of prefix|substring, got \"exact\""),
  });
  const HealthConfig c = health_of(h + "send = \"PING\\r\\n\"\nexpect = \"+PONG\"\n");
  CHECK(c.send == "PING\r\n");
  CHECK(c.expect == "+PONG");
  CHECK(c.expect_match == sluice::ExpectMatch::prefix);
  const HealthConfig x = health_of(h + "send_hex = \"2a 31 0d 0a\"\nexpect_hex = \"00FF\"\nexpect_match = \"substring\"\n");
  CHECK(x.send == "*1\r\n");
  CHECK(x.expect == std::string("\0\xff", 2));
  CHECK(x.expect_match == sluice::ExpectMatch::substring);
  // An empty send waits for the server's greeting (banner protocols).
  CHECK(health_of(h + "send = \"\"\nexpect = \"220 \"\n").send.empty());
}

TEST_CASE("health: postgres and redis") {
  const TempFile password("secret\n", "pgpass");
  check_cases({
      health_case("type = \"postgres\"\nrole = \"master\"\n",
                  at(5, 8) + "role must be one of primary|standby|any, got \"master\""),
      health_case("type = \"postgres\"\nuser = \"\"\n", at(5, 8) + "user must not be empty"),
      health_case("type = \"postgres\"\ndatabase = \"\"\n", at(5, 12) + "database must not be empty"),
      health_case("type = \"postgres\"\nsslmode = \"on\"\n",
                  at(5, 11) + "sslmode must be one of disable|allow|prefer|require|verify-ca|verify-full, got \"on\""),
      health_case("type = \"postgres\"\npassword_file = \"/nonexistent/pgpass\"\n",
                  at(5, 17) + "password_file \"/nonexistent/pgpass\" cannot be read: No such file or directory"),
      health_case("type = \"redis\"\nrole = \"primary\"\n",
                  at(5, 8) + "role must be one of master|replica|any, got \"primary\""),
      health_case("type = \"redis\"\npassword_file = \"conf\"\n",
                  at(5, 17) + "password_file \"conf\" is not a regular file"),
  });
  const HealthConfig pg = health_of("type = \"postgres\"\nrole = \"primary\"\nuser = \"monitor\"\ndatabase = \"app\"\n"
                                    "sslmode = \"verify-full\"\npassword_file = \"" + password.path() + "\"\n");
  CHECK(pg.type == sluice::HealthType::postgres);
  CHECK(pg.postgres_role == sluice::PostgresRole::primary);
  CHECK(pg.user == "monitor");
  CHECK(pg.database == "app");
  CHECK(pg.sslmode == "verify-full");
  CHECK(pg.password_file == password.path());
  const HealthConfig pd = health_of("type = \"postgres\"\n");
  CHECK(pd.postgres_role == sluice::PostgresRole::any);
  CHECK(pd.user == "postgres");
  CHECK(pd.database == "postgres");
  CHECK(pd.sslmode == "prefer");
  CHECK(pd.password_file.empty());

  const HealthConfig r = health_of("type = \"redis\"\nrole = \"replica\"\npassword_file = \"" + password.path() + "\"\n");
  CHECK(r.type == sluice::HealthType::redis);
  CHECK(r.redis_role == sluice::RedisRole::replica);
  CHECK(r.password_file == password.path());
  CHECK(health_of("type = \"redis\"\nrole = \"master\"\n").redis_role == sluice::RedisRole::master);
}

TEST_CASE("health: defaults and every common key") {
  const auto none = sluice::parse_config(kTail, "x.toml");
  CHECK_FALSE(none.upstreams.at("u").health.has_value());

  const HealthConfig d = health_of("");
  CHECK(d.type == sluice::HealthType::tcp);
  CHECK(d.interval == 2s);
  CHECK(d.timeout == 1s);
  CHECK(d.rise == 2);
  CHECK(d.fall == 3);
  CHECK(d.jitter == doctest::Approx(0.1));
  CHECK(d.port == 0);
  CHECK(d.initial == sluice::HealthInitial::up);
  CHECK(d.on_down == sluice::OnDown::keep);
  CHECK(d.slow_start == 0ms);

  const HealthConfig c = health_of("type = \"tcp\"\ninterval = \"10s\"\ntimeout = \"10s\"\nrise = 1\nfall = 100\n"
                                   "jitter = \"0%\"\nport = 65535\ninitial = \"down\"\non_down = \"close_sessions\"\n"
                                   "slow_start = \"30s\"\n");
  CHECK(c.interval == 10s);
  CHECK(c.timeout == 10s);  // equal to the interval is allowed
  CHECK(c.rise == 1);
  CHECK(c.fall == 100);
  CHECK(c.jitter == 0.0);
  CHECK(c.port == 65535);
  CHECK(c.initial == sluice::HealthInitial::down);
  CHECK(c.on_down == sluice::OnDown::close_sessions);
  CHECK(c.slow_start == 30s);
  CHECK(health_of("jitter = \"100%\"\n").jitter == 1.0);
  CHECK(health_of("interval = \"500ms\"\ntimeout = \"200ms\"\n").timeout == 200ms);
}
