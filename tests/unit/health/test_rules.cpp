// The pure rules of active health checks: rise/fall hysteresis, when checks
// run (jitter), status ranges, expected replies, role verdicts.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "health/match.hpp"
#include "health/mysql_probe.hpp"
#include "health/postgres_probe.hpp"
#include "health/redis_probe.hpp"
#include "health/rise_fall.hpp"
#include "health/schedule.hpp"
#include "health/target.hpp"
#include "sluice/local_error.hpp"

using namespace sluice;
using namespace sluice::health;
using namespace std::chrono_literals;

TEST_CASE("rise/fall: fall consecutive failures take an up server down") {
  RiseFall rf(2, 3, true);
  CHECK_FALSE(rf.record(false));
  CHECK_FALSE(rf.record(false));
  CHECK(rf.streak() == 2);
  const auto changed = rf.record(false);
  REQUIRE(changed);
  CHECK(*changed == false);
  CHECK_FALSE(rf.up());
  CHECK(rf.streak() == 0);
}

TEST_CASE("rise/fall: a pass between failures restarts the count") {
  RiseFall rf(2, 3, true);
  rf.record(false);
  rf.record(false);
  CHECK_FALSE(rf.record(true));
  CHECK(rf.streak() == 0);
  CHECK_FALSE(rf.record(false));
  CHECK_FALSE(rf.record(false));
  CHECK(rf.up());
  CHECK(rf.record(false) == std::optional<bool>(false));
}

TEST_CASE("rise/fall: rise consecutive passes bring a down server up") {
  RiseFall rf(2, 3, false);
  CHECK_FALSE(rf.record(true));
  CHECK_FALSE(rf.record(false));  // resets the passes
  CHECK_FALSE(rf.record(true));
  CHECK(rf.record(true) == std::optional<bool>(true));
  CHECK(rf.up());
}

TEST_CASE("rise/fall: rise = fall = 1 follows every result; 0 counts as 1") {
  RiseFall rf(0, 1, true);
  CHECK(rf.record(false) == std::optional<bool>(false));
  CHECK(rf.record(true) == std::optional<bool>(true));
  CHECK_FALSE(rf.record(true));
}

TEST_CASE("jitter: the first check comes within interval * jitter") {
  CHECK(first_delay(2000ms, 0.1, 0.0) == 0ms);
  CHECK(first_delay(2000ms, 0.1, 0.5) == 100ms);
  CHECK(first_delay(2000ms, 0.1, 0.999999) <= 200ms);
  CHECK(first_delay(2000ms, 0.0, 0.7) == 0ms);  // no jitter: at once
  for (double u = 0; u < 1.0; u += 0.01) {
    const Duration d = first_delay(1000ms, 0.25, u);
    CHECK(d >= 0ms);
    CHECK(d <= 250ms);
  }
}

TEST_CASE("jitter: later pauses are never longer than interval, at most jitter shorter") {
  // Only shorter, so "fall x interval" and "rise x interval" stay bounds
  // whatever the jitter.
  CHECK(next_delay(2000ms, 0.1, 0.0) == 2000ms);
  CHECK(next_delay(2000ms, 0.1, 0.5) == 1900ms);
  CHECK(next_delay(2000ms, 0.1, 0.999999) == 1800ms);
  CHECK(next_delay(2000ms, 0.0, 0.1) == 2000ms);
  CHECK(next_delay(100ms, 1.0, 0.999999) == 0ms);  // never negative
  for (double u = 0; u < 1.0; u += 0.01) {
    const Duration d = next_delay(1000ms, 0.2, u);
    CHECK(d >= 800ms);
    CHECK(d <= 1000ms);
  }
}

TEST_CASE("status ranges are inclusive at both ends") {
  const std::vector<StatusRange> ranges = {{200, 299}, {404, 404}};
  CHECK(status_matches(200, ranges));
  CHECK(status_matches(299, ranges));
  CHECK(status_matches(404, ranges));
  CHECK_FALSE(status_matches(199, ranges));
  CHECK_FALSE(status_matches(300, ranges));
  CHECK_FALSE(status_matches(503, ranges));
  CHECK_FALSE(status_matches(200, {}));
  CHECK(format_ranges(ranges) == "200-299,404");
}

TEST_CASE("expected replies: prefix decides as soon as the bytes differ") {
  struct Row {
    const char* reply;
    Expect want;
  };
  const std::vector<Row> rows = {
      {"", Expect::need_more},         {"+PO", Expect::need_more},     {"+PONG\r\n", Expect::matched},
      {"+PONG", Expect::matched},      {"-ERR auth", Expect::mismatch}, {"+PX", Expect::mismatch},
      {"x+PONG", Expect::mismatch},
  };
  for (const Row& r : rows) {
    CAPTURE(r.reply);
    CHECK(match_expect(r.reply, "+PONG", ExpectMatch::prefix) == r.want);
  }
}

TEST_CASE("expected replies: substring waits for more until it is found") {
  CHECK(match_expect("", "role:master", ExpectMatch::substring) == Expect::need_more);
  CHECK(match_expect("# Replication\r\nrole:slave\r\n", "role:master", ExpectMatch::substring) ==
        Expect::need_more);
  CHECK(match_expect("# Replication\r\nrole:master\r\n", "role:master", ExpectMatch::substring) ==
        Expect::matched);
}

TEST_CASE("a peer's bytes are quoted for reasons") {
  CHECK(quote_bytes("-ERR x\r\n") == "\"-ERR x\\x0d\\x0a\"");
  CHECK(quote_bytes("a\"b\\") == "\"a\\x22b\\x5c\"");
  CHECK(quote_bytes("abcdef", 3) == "\"abc\"...");
}

TEST_CASE("library errors read like ours") {
  CHECK(lower_first("Connection refused") == "connection refused");
  CHECK(lower_first("FATAL:  password authentication failed") == "FATAL:  password authentication failed");
  CHECK(lower_first("") == "");
}

TEST_CASE("libraries' connect errors that are sluice's own lack of resources") {
  CHECK(names_local_resource_error("could not create socket: Too many open files"));      // libpq
  CHECK(names_local_resource_error("can't create socket: Too many open files in system"));  // hiredis, lowered
  CHECK(names_local_resource_error("Cannot assign requested address"));
  CHECK(names_local_resource_error("cannot assign requested address"));
  CHECK(names_local_resource_error("No buffer space available"));
  CHECK_FALSE(names_local_resource_error("Connection refused"));
  CHECK_FALSE(names_local_resource_error("could not create socket: Permission denied"));
  // The server's own trouble, even when it names the same errno.
  CHECK_FALSE(names_local_resource_error("FATAL:  out of memory"));
  CHECK_FALSE(names_local_resource_error("could not fork new process for connection: Cannot allocate memory"));
  CHECK_FALSE(names_local_resource_error(""));
}

TEST_CASE("redis roles: slave is a replica; reasons name what was wanted") {
  CHECK(judge_redis_role("master", RedisRole::master) == std::pair<bool, std::string>{true, "role is master"});
  CHECK(judge_redis_role("slave", RedisRole::master) ==
        std::pair<bool, std::string>{false, "role is replica, want master"});
  CHECK(judge_redis_role("slave", RedisRole::replica).first);
  CHECK(judge_redis_role("master", RedisRole::any).first);
  CHECK_FALSE(judge_redis_role("sentinel", RedisRole::any).first);
}

TEST_CASE("postgres roles: pg_is_in_recovery() f is a primary, t a standby") {
  CHECK(judge_postgres_role("f", PostgresRole::primary) == std::pair<bool, std::string>{true, "role is primary"});
  CHECK(judge_postgres_role("t", PostgresRole::primary) ==
        std::pair<bool, std::string>{false, "role is standby, want primary"});
  CHECK(judge_postgres_role("t", PostgresRole::standby).first);
  CHECK(judge_postgres_role("t", PostgresRole::any).first);
  CHECK_FALSE(judge_postgres_role("", PostgresRole::any).first);
}

TEST_CASE("same_check: any setting that changes the check counts") {
  HealthConfig a;
  HealthConfig b;
  CHECK(same_check(a, b));
  b.expect_status = {{200, 200}};
  CHECK_FALSE(same_check(a, b));
  b = a;
  b.interval = 5s;
  CHECK_FALSE(same_check(a, b));
  b = a;
  b.password_file = "/x";
  CHECK_FALSE(same_check(a, b));
}

TEST_CASE("with_port: another port of the same host") {
  Endpoint e;
  e.host = "::1";
  e.port = 5432;
  e.text = "[::1]:5432";
  e.addr.ss_family = AF_INET6;
  const Endpoint p = with_port(e, 8008);
  CHECK(p.port == 8008);
  CHECK(p.text == "[::1]:8008");
  CHECK(with_port(e, 0).text == "[::1]:5432");
}

TEST_CASE("mysql: read_only and super_read_only decide the role") {
  sluice::HealthConfig c;
  c.type = sluice::HealthType::mysql;
  sluice::health::MysqlFacts f;
  c.mysql_role = sluice::MysqlRole::primary;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{true, "role is primary"});
  f.read_only = true;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{false, "role is replica, want primary"});
  f.read_only = false;
  f.super_read_only = true;
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{false, "role is replica (super_read_only), want primary"});
  c.mysql_role = sluice::MysqlRole::replica;
  f.super_read_only = false;
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{false, "role is primary (read_only is off), want replica"});
  f.read_only = true;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{true, "role is replica"});
  c.mysql_role = sluice::MysqlRole::any;
  CHECK(sluice::health::judge_mysql(f, c).first);
  f.read_only = false;
  CHECK(sluice::health::judge_mysql(f, c).first);
}

TEST_CASE("mysql: a replica whose replication stopped is down; max_lag bounds the lag") {
  using namespace std::chrono_literals;
  sluice::HealthConfig c;
  c.type = sluice::HealthType::mysql;
  c.mysql_role = sluice::MysqlRole::replica;
  sluice::health::MysqlFacts f;
  f.read_only = true;
  f.replicating = true;  // Seconds_Behind_Master NULL: a thread is not running
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{
            false, "role is replica, replication is not running (Seconds_Behind_Master is NULL)"});
  f.lag_seconds = 12;
  CHECK(sluice::health::judge_mysql(f, c).first);
  c.max_lag = 10s;
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{false, "role is replica, 12s behind (max_lag 10s)"});
  f.lag_seconds = 10;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{true, "role is replica, 10s behind"});
  f.replicating = false;
  f.lag_seconds.reset();
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{false, "role is replica, but replicates from no one"});
  // role = "any" with max_lag: a writable server needs no replication.
  c.mysql_role = sluice::MysqlRole::any;
  f.read_only = false;
  CHECK(sluice::health::judge_mysql(f, c).first);
}

TEST_CASE("mysql: galera = true wants a synced, ready node") {
  sluice::HealthConfig c;
  c.type = sluice::HealthType::mysql;
  c.galera = true;
  sluice::health::MysqlFacts f;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{false, "not a Galera node (no wsrep status)"});
  f.wsrep_local_state = 2;
  f.wsrep_ready = true;
  CHECK(sluice::health::judge_mysql(f, c) ==
        std::pair<bool, std::string>{false, "Galera node not synced (wsrep_local_state 2, wsrep_ready ON)"});
  f.wsrep_local_state = 4;
  f.wsrep_ready = false;
  CHECK_FALSE(sluice::health::judge_mysql(f, c).first);
  f.wsrep_ready = true;
  CHECK(sluice::health::judge_mysql(f, c) == std::pair<bool, std::string>{true, "role is primary"});
}

TEST_CASE("postgres max_lag: a standby must stream and be no further behind than max_lag") {
  using namespace std::chrono_literals;
  using sluice::health::judge_postgres_lag;
  CHECK(judge_postgres_lag("f", "0", "0", 5s, "role is primary") ==
        std::pair<bool, std::string>{true, "role is primary"});
  CHECK(judge_postgres_lag("t", "1", "0", 5s, "role is standby") ==
        std::pair<bool, std::string>{true, "role is standby, 0.0s behind"});
  CHECK(judge_postgres_lag("t", "1", "7.25", 5s, "role is standby") ==
        std::pair<bool, std::string>{false, "role is standby, 7.2s behind (max_lag 5s)"});
  CHECK(judge_postgres_lag("t", "0", "0", 5s, "role is standby") ==
        std::pair<bool, std::string>{false, "role is standby, not streaming from a primary"});
  CHECK(judge_postgres_lag("t", "1", "", 5s, "role is standby") ==
        std::pair<bool, std::string>{false, "role is standby, nothing replayed yet"});
}
