#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "balance/least_conn.hpp"
#include "pool.hpp"
#include "upstream/upstream.hpp"

using namespace sluice;

namespace {

char name(std::size_t i) { return static_cast<char>('a' + i); }

std::string run(Balancer& b, test::Pool& pool, int picks) {
  std::string seq;
  for (int i = 0; i < picks; ++i) seq += name(b.choose(pool.c, ""));
  return seq;
}

UpstreamConfig least_conn_config(std::vector<ServerConfig> servers) {
  UpstreamConfig c;
  c.name = "pg";
  c.balance = Balance::least_conn;
  c.servers = std::move(servers);
  return c;
}

const TimePoint t0{std::chrono::hours(1)};

}  // namespace

TEST_CASE("least_conn: the least loaded server wins") {
  test::Pool pool;
  pool.add("10.0.0.1:5432").active = 3;
  pool.add("10.0.0.2:5432").active = 1;
  pool.add("10.0.0.3:5432").active = 2;
  LeastConnBalancer lc;
  CHECK(run(lc, pool, 3) == "bbb");  // actives are not changed by choose()
}

TEST_CASE("least_conn: equal load falls back to smooth weighted round-robin") {
  SUBCASE("equal weights rotate") {
    test::Pool pool;
    pool.add("10.0.0.1:5432");
    pool.add("10.0.0.2:5432");
    pool.add("10.0.0.3:5432");
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abcabc");
  }
  SUBCASE("weights 2:1 with no connections") {
    test::Pool pool;
    pool.add("10.0.0.1:5432", 2);
    pool.add("10.0.0.2:5432", 1);
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abaaba");
  }
  SUBCASE("weights 2:1 with actives 2 and 1 are a tie (2/2 == 1/1)") {
    test::Pool pool;
    pool.add("10.0.0.1:5432", 2).active = 2;
    pool.add("10.0.0.2:5432", 1).active = 1;
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abaaba");
  }
  SUBCASE("only the tied servers take part in the round-robin") {
    test::Pool pool;
    pool.add("10.0.0.1:5432").active = 1;
    pool.add("10.0.0.2:5432").active = 5;
    pool.add("10.0.0.3:5432").active = 1;
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 4) == "acac");
  }
}

TEST_CASE("least_conn: active is compared relative to weight") {
  test::Pool pool;
  Candidate& a = pool.add("10.0.0.1:5432", 2);
  Candidate& b = pool.add("10.0.0.2:5432", 1);
  LeastConnBalancer lc;
  a.active = 3;  // 1.5 per weight unit
  b.active = 1;  // 1.0
  CHECK(lc.choose(pool.c, "") == 1);
  a.active = 1;  // 0.5
  CHECK(lc.choose(pool.c, "") == 0);
  a.active = 5;  // 2.5
  b.active = 2;  // 2.0
  CHECK(lc.choose(pool.c, "") == 1);
}

TEST_CASE("least_conn through Upstream::pick: connections spread by weight") {
  auto up_owner = test::make_upstream(least_conn_config({test::server_config("10.0.0.1:5432", 2),
                                 test::server_config("10.0.0.2:5432", 1)}));
  Upstream& up = *up_owner;
  TriedSet tried;
  std::string seq;
  for (int i = 0; i < 9; ++i) seq += name(static_cast<std::size_t>(up.pick(tried, "", t0)));
  CHECK(up.server(0).active == 6);
  CHECK(up.server(1).active == 3);
  // Ties (2/2 == 1/1 and 4/2 == 2/1) are broken by smooth round-robin.
  CHECK(seq == "ababaaaba");

  // Closing two sessions on a makes it the least loaded (4/2 < 3/1).
  up.release(0);
  up.release(0);
  CHECK(up.pick(tried, "", t0) == 0);
}

TEST_CASE("least_conn through Upstream::pick: max_conns is respected") {
  auto up_owner = test::make_upstream(least_conn_config({test::server_config("10.0.0.1:5432", 1, 2),
                                 test::server_config("10.0.0.2:5432", 1, 1)}));
  Upstream& up = *up_owner;
  TriedSet tried;
  CHECK(up.pick(tried, "", t0) == 0);
  CHECK(up.pick(tried, "", t0) == 1);
  CHECK(up.pick(tried, "", t0) == 0);  // b is full (1/1)
  CHECK(up.pick(tried, "", t0) == -1);  // both full
  CHECK(up.server(0).active == 2);
  CHECK(up.server(1).active == 1);
  up.release(1);
  CHECK(up.pick(tried, "", t0) == 1);
}

TEST_CASE("least_conn through Upstream::pick: backups only when no primary is eligible") {
  auto up_owner = test::make_upstream(least_conn_config({test::server_config("10.0.0.1:5432", 1, 1),
                                 test::server_config("10.0.0.9:5432", 1, 0, true),
                                 test::server_config("10.0.0.2:5432", 1, 1)}));
  Upstream& up = *up_owner;
  TriedSet tried;
  // The backup is idle (least loaded) but primaries come first.
  CHECK(up.pick(tried, "", t0) == 0);
  CHECK(up.pick(tried, "", t0) == 2);
  // Both primaries full: the backup takes the rest.
  CHECK(up.pick(tried, "", t0) == 1);
  CHECK(up.pick(tried, "", t0) == 1);
  CHECK(up.server(1).active == 2);
  // A primary frees up: new connections go back to it.
  up.release(2);
  CHECK(up.pick(tried, "", t0) == 2);
}

TEST_CASE("least_conn through Upstream::pick: tried servers are excluded") {
  auto up_owner = test::make_upstream(least_conn_config({test::server_config("10.0.0.1:5432"),
                                 test::server_config("10.0.0.2:5432"),
                                 test::server_config("10.0.0.9:5432", 1, 0, true)}));
  Upstream& up = *up_owner;
  TriedSet tried;
  tried.add(0);
  CHECK(up.pick(tried, "", t0) == 1);
  CHECK(up.pick(tried, "", t0) == 1);  // a is idle, but tried
  tried.add(1);
  CHECK(up.pick(tried, "", t0) == 2);  // every primary tried: the backup
  tried.add(2);
  CHECK(up.pick(tried, "", t0) == -1);
  CHECK(up.server(0).total_sessions == 0);
  CHECK(up.server(1).total_sessions == 2);
  CHECK(up.server(2).total_sessions == 1);
}
