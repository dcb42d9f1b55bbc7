// An upstream's eligible servers and the one warning when none is left.
#include <doctest/doctest.h>

#include <chrono>

#include "fixture.hpp"
#include "upstream/availability.hpp"

using namespace sluice;
using sluice::test::t0;
using namespace std::chrono_literals;

namespace {

UpstreamConfig three(std::uint32_t max_conns = 0) {
  UpstreamConfig c;
  c.name = "pg";
  c.max_fails = 1;
  c.fail_timeout = 10s;
  c.servers = {test::server_config("127.0.0.1:5001", 1, max_conns), test::server_config("127.0.0.1:5002"),
               test::server_config("127.0.0.1:5003", 1, 0, true)};
  return c;
}

}  // namespace

TEST_CASE("every reason a server is out is counted under its state's name") {
  const auto up = test::make_upstream(three(2));
  const TimePoint now = Clock::now();
  Availability a = availability(*up, now);
  CHECK(a.servers == 3);
  CHECK(a.eligible == 3);
  CHECK(a.unavailable.empty());

  // Full: up, but at max_conns.
  up->server(0).active.store(2);
  up->server(1).set_active(ActiveState::down, "connection refused");
  up->server(2).set_admin(AdminState::drain);
  a = availability(*up, now);
  CHECK(a.eligible == 0);
  CHECK(a.unavailable == std::map<std::string, std::size_t>{{"down", 1}, {"drained", 1}, {"full", 1}});
  CHECK(describe_unavailable(a) == "1 down, 1 drained, 1 full");

  // Passive health and a disable count as well; one slot frees: eligible again.
  up->server(1).set_active(ActiveState::up, "connected");
  up->server(1).report(ConnectResult::failed, "connection refused", now);
  up->server(2).set_admin(AdminState::disabled);
  a = availability(*up, now);
  CHECK(a.unavailable == std::map<std::string, std::size_t>{{"disabled", 1}, {"down", 1}, {"full", 1}});
  up->server(0).active.store(1);
  a = availability(*up, now);
  CHECK(a.eligible == 1);
  CHECK(describe_unavailable(a) == "1 disabled, 1 down");
}

TEST_CASE("the breakdown names the largest group first; an empty pool says so") {
  Availability a;
  a.servers = 4;
  a.unavailable = {{"down", 1}, {"standby", 3}};
  CHECK(describe_unavailable(a) == "3 standby, 1 down");
  Availability empty;
  CHECK(describe_unavailable(empty) == "the pool is empty");
}

TEST_CASE("one warning when the last server goes, one line when one is back, nothing in between") {
  OutageTracker t;
  Availability ok;
  ok.servers = 2;
  ok.eligible = 2;
  Availability none;
  none.servers = 2;
  none.unavailable = {{"down", 1}, {"standby", 1}};

  CHECK_FALSE(t.observe("pg", ok, t0));
  auto line = t.observe("pg", none, t0 + 1s, "its sessions go to fallback \"b\"");
  REQUIRE(line);
  CHECK(line->warning);
  CHECK(line->text == "upstream \"pg\" has no server available: 1 down, 1 standby (of 2); "
                      "its sessions go to fallback \"b\"");
  CHECK(t.outage_since("pg") == t0 + 1s);
  // While it lasts, whatever the breakdown becomes: quiet.
  none.unavailable = {{"down", 2}};
  CHECK_FALSE(t.observe("pg", none, t0 + 2s));
  CHECK_FALSE(t.observe("pg", none, t0 + 30s));

  ok.eligible = 1;
  line = t.observe("pg", ok, t0 + 61s);
  REQUIRE(line);
  CHECK_FALSE(line->warning);
  CHECK(line->text == "upstream \"pg\" has a server available again after 1m: 1 of 2 eligible");
  CHECK_FALSE(t.outage_since("pg"));
  CHECK_FALSE(t.observe("pg", ok, t0 + 62s));

  // Each upstream on its own; an empty pool is an outage too.
  Availability empty;
  line = t.observe("dns", empty, t0);
  REQUIRE(line);
  CHECK(line->text == "upstream \"dns\" has no server available: the pool is empty");
  CHECK_FALSE(t.observe("pg", ok, t0));
  // A removed upstream is forgotten without a line; back later, it starts afresh.
  t.keep_only({"pg"});
  CHECK_FALSE(t.outage_since("dns"));
  CHECK(t.observe("dns", empty, t0 + 5s));
}
