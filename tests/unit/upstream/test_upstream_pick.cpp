// Upstream::pick with each balancer: what the algorithms choose, through the
// upstream's eligibility (max_conns, backups, tried servers) and counts.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "balance/hash.hpp"
#include "fixture.hpp"

using namespace sluice;
using sluice::test::t0;

namespace {

char name(std::size_t i) { return static_cast<char>('a' + i); }

std::string addr(int i) { return "10.0.0." + std::to_string(i) + ":6379"; }

UpstreamConfig least_conn_config(std::vector<ServerConfig> servers) {
  UpstreamConfig c;
  c.name = "pg";
  c.balance = Balance::least_conn;
  c.servers = std::move(servers);
  return c;
}


}  // namespace

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

TEST_CASE("hash: the first pick is the key's best server, retries follow the key's ranking") {
  UpstreamConfig c;
  c.name = "redis";
  c.balance = Balance::hash;
  for (int i = 1; i <= 6; ++i) c.servers.push_back(test::server_config(addr(i)));
  auto up_owner = test::make_upstream(c);
  Upstream& up = *up_owner;
  test::Pool pool;
  for (int i = 1; i <= 6; ++i) pool.add(addr(i));
  const std::vector<std::string> keys = test::client_keys(50);
  for (std::size_t k = 0; k < 50; ++k) {
    const auto expected = rendezvous_rank(pool.c, keys[k]);
    TriedSet tried;
    std::vector<std::size_t> order;
    for (long i; (i = up.pick(tried, keys[k], t0)) >= 0;) {
      order.push_back(static_cast<std::size_t>(i));
      tried.add(static_cast<std::size_t>(i));
      up.release(static_cast<std::size_t>(i));
    }
    CHECK(order == expected);
  }
}
