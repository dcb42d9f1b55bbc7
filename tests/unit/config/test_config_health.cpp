// [upstream.NAME.health]: one line per bad input and its message, then the
// values each check type yields.
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "config_cases.hpp"
#include "sluice/config.hpp"

using namespace std::chrono_literals;
using namespace config_test;
using sluice::HealthConfig;

namespace {

// The health table's own lines start at line 4.
const std::string kHealthHead = "[upstream.u]\nservers = [{ address = \"127.0.0.1:9001\" }]\n[upstream.u.health]\n";
const std::string kCommon = "type, interval, timeout, rise, fall, jitter, port, initial, on_down, slow_start, all_down";

// One bad health table: its lines after the type line, and where the loader
// points and what it says after "upstream \"u\" health: ".
struct HealthCase {
  std::string body;
  int line;
  int column;
  std::string message;
};

// Each case's table is `type_line` (empty: the tcp default) then its body.
void check_health_cases(const std::string& type_line, const std::vector<HealthCase>& cases) {
  std::vector<Case> full;
  for (const auto& c : cases) {
    const std::string where = "x.toml:" + std::to_string(c.line) + ":" + std::to_string(c.column) + ": ";
    full.push_back({kHealthHead + type_line + c.body + kListenerL, where + "upstream \"u\" health: " + c.message});
  }
  check_cases(full);
}

HealthConfig health_of(const std::string& body) {
  const auto c = sluice::parse_config(kHealthHead + body + kListenerL, "x.toml");
  REQUIRE(c.upstreams.at("u").health.has_value());
  return *c.upstreams.at("u").health;
}

}  // namespace

TEST_CASE("health: keys of another type, unknown keys") {
  check_cases({{"[upstream.u]\nhealth = \"tcp\"\nservers = [{ address = \"127.0.0.1:9001\" }]\n" + kListenerL,
                "x.toml:2:10: upstream \"u\": health must be a table ([upstream.NAME.health]), got string \"tcp\""}});
  check_health_cases("", {
      {"type = \"tcp\"\npath = \"/\"\n", 5, 1,
       "key \"path\" is not allowed with type = \"tcp\"; it belongs to type = \"http\""},
      {"path = \"/\"\n", 4, 1,
       "key \"path\" is not allowed with type = \"tcp\" (the default); it belongs to type = \"http\""},
      {"type = \"http\"\nrole = \"primary\"\n", 5, 1,
       "key \"role\" is not allowed with type = \"http\"; it belongs to type = \"postgres\" or \"redis\" or \"mysql\""},
      {"type = \"redis\"\nuser = \"x\"\n", 5, 1,
       "key \"user\" is not allowed with type = \"redis\"; it belongs to type = \"postgres\" or \"mysql\""},
      {"type = \"http\"\nsend = \"x\"\n", 5, 1,
       "key \"send\" is not allowed with type = \"http\"; it belongs to type = \"send_expect\""},
      {"type = \"postgres\"\nexpect_body = \"ok\"\n", 5, 1,
       "key \"expect_body\" is not allowed with type = \"postgres\"; it belongs to type = \"http\""},
      {"intervl = \"1s\"\n", 4, 1, "unknown key \"intervl\"; allowed: " + kCommon},
      {"type = \"http\"\nbogus = 1\n", 5, 1,
       "unknown key \"bogus\"; allowed: " + kCommon + ", path, method, host, expect_status, expect_body"},
      {"type = 1\n", 4, 8, "type must be a string, got integer 1"},
  });
}

TEST_CASE("health: common keys") {
  const std::string like = "must be a duration like \"250ms\", \"3s\", \"5m\", \"1h\", got ";
  const std::string percent = "jitter must be a percentage from \"0%\" to \"100%\" like \"10%\", got ";
  check_health_cases("", {
      {"interval = \"0s\"\n", 4, 12, "interval must be greater than 0, got \"0s\""},
      {"timeout = \"0ms\"\n", 4, 11, "timeout must be greater than 0, got \"0ms\""},
      {"rise = 0\n", 4, 8, "rise must be 1..100, got 0"},
      {"fall = 101\n", 4, 8, "fall must be 1..100, got 101"},
      {"jitter = 10\n", 4, 10, "jitter must be a percentage string like \"10%\", got integer 10"},
      {"jitter = \"150%\"\n", 4, 10, percent + "\"150%\""},
      {"jitter = \"0.1\"\n", 4, 10, percent + "\"0.1\""},
      {"port = 0\n", 4, 8, "port must be 1..65535, got 0"},
      {"port = \"8008\"\n", 4, 8, "port must be an integer, got string \"8008\""},
      {"initial = \"unknown\"\n", 4, 11, "initial must be one of up|down, got \"unknown\""},
      {"on_down = \"close\"\n", 4, 11, "on_down must be one of keep|close_sessions|drain, got \"close\""},
      {"slow_start = \"fast\"\n", 4, 14, "slow_start " + like + "\"fast\""},
  });
}

TEST_CASE("health: all_down may be written in the health table, and must then agree") {
  check_health_cases("", {
      {"all_down = \"open\"\n", 4, 12, "all_down must be one of fail_closed|fail_open, got \"open\""},
  });
  const auto in_health = sluice::parse_config(kHealthHead + "all_down = \"fail_open\"\n" + kListenerL, "x.toml");
  CHECK(in_health.upstreams.at("u").all_down == sluice::AllDown::fail_open);
  const std::string both = "[upstream.u]\nall_down = \"fail_closed\"\nservers = [{ address = \"127.0.0.1:9001\" }]\n"
                           "[upstream.u.health]\nall_down = \"fail_open\"\n" + kListenerL;
  check_cases({{both, "x.toml:5:12: upstream \"u\" health: all_down is also set for upstream \"u\" outside its "
                      "health table, with another value"}});
  const std::string same = "[upstream.u]\nall_down = \"fail_open\"\nservers = [{ address = \"127.0.0.1:9001\" }]\n"
                           "[upstream.u.health]\nall_down = \"fail_open\"\n" + kListenerL;
  CHECK(sluice::parse_config(same, "x.toml").upstreams.at("u").all_down == sluice::AllDown::fail_open);
}

TEST_CASE("health: http") {
  const std::string h = "type = \"http\"\n";
  check_health_cases(h, {
      {"path = \"primary\"\n", 5, 8,
       "path must start with \"/\" and contain no spaces or control characters, got \"primary\""},
      {"path = \"/a b\"\n", 5, 8,
       "path must start with \"/\" and contain no spaces or control characters, got \"/a b\""},
      {"method = \"get\"\n", 5, 10, "method must be an HTTP method in capitals like \"GET\" or \"HEAD\", got \"get\""},
      {"host = \"\"\n", 5, 8, "host must be a host name (no spaces or control characters), got \"\""},
      {"expect_status = []\n", 5, 17, "expect_status must not be empty"},
      {"expect_status = 200\n", 5, 17, "expect_status must be an array like [200, \"300-399\"], got integer 200"},
      {"expect_status = [200, 99]\n", 5, 23, "expect_status entry 2 must be a status code 100..599, got 99"},
      {"expect_status = [\"2xx\"]\n", 5, 18,
       "expect_status entry 1 must be a status code 100..599 or a range like \"200-399\", got \"2xx\""},
      {"expect_status = [\"300-200\"]\n", 5, 18,
       "expect_status entry 1 must be a range LOW-HIGH with LOW <= HIGH, got \"300-200\""},
      {"expect_status = [true]\n", 5, 18,
       "expect_status entry 1 must be a status code like 200 or a range like \"200-399\", got boolean true"},
      {"expect_body = \"\"\n", 5, 15, "expect_body must not be empty (leave it out to accept any body)"},
  });
  const HealthConfig c = health_of(h + "path = \"/primary\"\nmethod = \"OPTIONS\"\nhost = \"db.internal\"\n"
                                       "expect_status = [200, \"204\", \"300-302\"]\nexpect_body = \"ok\"\nport = 8008\n");
  CHECK(c.type == sluice::HealthType::http);
  CHECK(c.path == "/primary");
  CHECK(c.method == "OPTIONS");
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
  check_health_cases(h, {
      {"expect = \"+PONG\"\n", 3, 1, "type = \"send_expect\" needs send or send_hex"},
      {"send = \"PING\\r\\n\"\n", 3, 1, "type = \"send_expect\" needs expect or expect_hex"},
      {"send = \"PING\\r\\n\"\nsend_hex = \"50\"\nexpect = \"+PONG\"\n", 6, 1,
       "send and send_hex cannot both be given; use one"},
      {"send_hex = \"50\"\nsend = \"P\"\nexpect = \"+PONG\"\n", 6, 1,
       "send and send_hex cannot both be given; use one"},
      {"send = \"x\"\nexpect = \"a\"\nexpect_hex = \"61\"\n", 7, 1,
       "expect and expect_hex cannot both be given; use one"},
      {"send_hex = \"zz\"\nexpect = \"a\"\n", 5, 12,
       "send_hex must be hex bytes like \"2a310d0a\" (single spaces allowed between bytes), got \"zz\": "
       "unexpected \"z\" at offset 0"},
      {"send = \"x\"\nexpect_hex = \"abc\"\n", 6, 14,
       "expect_hex must have two hex digits per byte, got \"abc\" (an odd number of digits)"},
      {"send = \"x\"\nexpect_hex = \"\"\n", 6, 14, "expect_hex must not be empty"},
      {"send = \"x\"\nexpect = \"\"\n", 6, 10, "expect must not be empty"},
      {"send = 1\nexpect = \"a\"\n", 5, 8, "send must be a string, got integer 1"},
      {"send = \"x\"\nexpect = \"a\"\nexpect_match = \"exact\"\n", 7, 16,
       "expect_match must be one of prefix|substring, got \"exact\""},
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
  check_health_cases("", {
      {"type = \"postgres\"\nrole = \"master\"\n", 5, 8,
       "role must be one of primary|replica|standby|any, got \"master\""},
      {"type = \"postgres\"\nuser = \"\"\n", 5, 8, "user must not be empty"},
      {"type = \"postgres\"\ndatabase = \"\"\n", 5, 12, "database must not be empty"},
      {"type = \"postgres\"\nsslmode = \"on\"\n", 5, 11,
       "sslmode must be one of disable|allow|prefer|require|verify-ca|verify-full, got \"on\""},
      {"type = \"postgres\"\npassword_file = \"/nonexistent/pgpass\"\n", 5, 17,
       "password_file \"/nonexistent/pgpass\" cannot be read: No such file or directory"},
      {"type = \"redis\"\nrole = \"standby\"\n", 5, 8,
       "role must be one of primary|master|replica|any, got \"standby\""},
      {"type = \"redis\"\npassword_file = \"conf\"\n", 5, 17, "password_file \"conf\" is not a regular file"},
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
  // primary/replica for every database; standby and master are aliases.
  CHECK(health_of("type = \"redis\"\nrole = \"primary\"\n").redis_role == sluice::RedisRole::master);
  CHECK(health_of("type = \"postgres\"\nrole = \"replica\"\n").postgres_role == sluice::PostgresRole::standby);
  CHECK(health_of("type = \"postgres\"\nrole = \"standby\"\n").postgres_role == sluice::PostgresRole::standby);
  CHECK(health_of("type = \"postgres\"\nrole = \"replica\"\nmax_lag = \"1500ms\"\n").max_lag == 1500ms);
  check_health_cases("", {
      {"type = \"postgres\"\nrole = \"primary\"\nmax_lag = \"5s\"\n", 6, 11,
       "max_lag applies to replicas; it cannot be used with role = \"primary\""},
  });
}

TEST_CASE("health: mysql") {
  const TempFile password("secret\n", "mypass");
  check_health_cases("", {
      {"type = \"mysql\"\n", 3, 1, "type = \"mysql\" needs user (the account the check logs in with)"},
      {"type = \"mysql\"\nuser = \"\"\n", 5, 8, "user must not be empty"},
      {"type = \"mysql\"\nuser = \"m\"\nrole = \"standby\"\n", 6, 8,
       "role must be one of primary|replica|any, got \"standby\""},
      {"type = \"mysql\"\nuser = \"m\"\nrole = \"primary\"\nmax_lag = \"5s\"\n", 7, 11,
       "max_lag applies to replicas; it cannot be used with role = \"primary\""},
      {"type = \"mysql\"\nuser = \"m\"\nmax_lag = \"500ms\"\n", 6, 11,
       "max_lag must be at least 1s (the server reports whole seconds)"},
      {"type = \"mysql\"\nuser = \"m\"\ngalera = \"yes\"\n", 6, 10, "galera must be a boolean (true or false), got string \"yes\""},
      {"type = \"mysql\"\nuser = \"m\"\ndatabase = \"x\"\n", 6, 1,
       "key \"database\" is not allowed with type = \"mysql\"; it belongs to type = \"postgres\""},
  });
  const HealthConfig m = health_of("type = \"mysql\"\nuser = \"monitor\"\nrole = \"replica\"\nmax_lag = \"30s\"\n"
                                   "galera = true\npassword_file = \"" + password.path() + "\"\n");
  CHECK(m.type == sluice::HealthType::mysql);
  CHECK(m.mysql_role == sluice::MysqlRole::replica);
  CHECK(m.user == "monitor");
  CHECK(m.max_lag == 30s);
  CHECK(m.galera);
  CHECK(m.password_file == password.path());
  const HealthConfig d = health_of("type = \"mysql\"\nuser = \"m\"\n");
  CHECK(d.mysql_role == sluice::MysqlRole::any);
  CHECK(d.max_lag == 0s);
  CHECK_FALSE(d.galera);
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
  CHECK(health_of("on_down = \"drain\"\n").on_down == sluice::OnDown::drain);
}

TEST_CASE("health: a check with a role starts down unless initial says otherwise") {
  CHECK(health_of("type = \"postgres\"\nrole = \"primary\"\n").initial == sluice::HealthInitial::down);
  CHECK(health_of("type = \"postgres\"\nrole = \"standby\"\n").initial == sluice::HealthInitial::down);
  CHECK(health_of("type = \"redis\"\nrole = \"master\"\n").initial == sluice::HealthInitial::down);
  CHECK(health_of("type = \"mysql\"\nuser = \"m\"\nrole = \"replica\"\n").initial == sluice::HealthInitial::down);
  // No role, no reason to hold the server back.
  CHECK(health_of("type = \"postgres\"\n").initial == sluice::HealthInitial::up);
  CHECK(health_of("type = \"redis\"\nrole = \"any\"\n").initial == sluice::HealthInitial::up);
  CHECK(health_of("type = \"http\"\n").initial == sluice::HealthInitial::up);
  // Written, it wins.
  CHECK(health_of("type = \"redis\"\nrole = \"master\"\ninitial = \"up\"\n").initial == sluice::HealthInitial::up);
}

TEST_CASE("health: on_role_change") {
  CHECK(health_of("type = \"redis\"\nrole = \"master\"\n").on_role_change == sluice::OnRoleChange::close_sessions);
  CHECK(health_of("type = \"postgres\"\non_role_change = \"keep\"\n").on_role_change == sluice::OnRoleChange::keep);
  check_health_cases("", {
      {"on_role_change = \"keep\"\n", 4, 1,
       "key \"on_role_change\" is not allowed with type = \"tcp\" (the default); it belongs to type = \"postgres\" or "
       "\"redis\" or \"mysql\""},
  });
  check_health_cases("type = \"redis\"\n", {
      {"on_role_change = \"drain\"\n", 5, 18, "on_role_change must be one of keep|close_sessions, got \"drain\""},
  });
}
