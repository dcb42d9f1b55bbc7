// What ServerState keeps for the status page: downtime, peaks, the last check.
#include <doctest/doctest.h>

#include <chrono>

#include "upstream/server_state.hpp"

#include "fixture.hpp"

using namespace sluice;
using sluice::test::t0;
using namespace std::chrono_literals;

namespace {

Endpoint endpoint() {
  Endpoint e;
  e.text = "127.0.0.1:5001";
  return e;
}

}  // namespace

TEST_CASE("passive downtime ends when fail_timeout lets the server back, not when someone looks") {
  ServerState s("pg", endpoint(), 1, 10s);
  CHECK(s.downtime(t0) == 0ms);
  s.report(ConnectResult::failed, "connection refused", t0);
  CHECK(s.down_count() == 1);
  CHECK(s.downtime(t0 + 3s) == 3s);
  // Nobody looked until long after the 10 s were over: 10 s of downtime.
  CHECK(s.downtime(t0 + 25s) == 10s);
  CHECK(s.downtime(t0 + 40s) == 10s);
  // Down again after a failed trial: the periods add up.
  s.on_selected(t0 + 50s);
  s.report(ConnectResult::failed, "connection refused", t0 + 50s);
  CHECK(s.down_count() == 2);
  CHECK(s.downtime(t0 + 52s) == 12s);
}

TEST_CASE("active checks' downtime, and draining is not downtime") {
  ServerState s("pg", endpoint(), 0, 10s);
  s.set_admin(AdminState::drain);
  CHECK(s.downtime(Clock::now() + 5s) == 0ms);
  s.set_active(ActiveState::down, "connect refused");
  CHECK(s.down_count() == 1);
  CHECK(s.downtime(Clock::now() + 5s) >= 5s);
  s.set_active(ActiveState::up, "connected");
  const Duration d = s.downtime(Clock::now() + 60s);
  CHECK(d < 5s);  // the down period ended when the check said up
  CHECK(s.status(Clock::now()).state == "drained");
}

TEST_CASE("the last check and its failures") {
  ServerState s("pg", endpoint(), 1, 10s);
  CHECK(s.last_check().result == CheckResult::none);
  s.record_check("http", CheckResult::fail, 0.5, "status 503");
  s.record_check("http", CheckResult::local_error, 0, "out of descriptors");
  const ServerState::LastCheck c = s.last_check();
  CHECK(c.type == "http");
  CHECK(c.result == CheckResult::local_error);
  CHECK(c.reason == "out of descriptors");
  CHECK(c.at_ms > 0);
  CHECK(s.check_failures == 1);
  CHECK(s.check_seconds.count() == 1);  // a local error is not timed
  CHECK(to_string(CheckResult::pass) == "pass");
}

TEST_CASE("raise_peak only ever raises") {
  std::atomic<std::uint32_t> peak{0};
  raise_peak(peak, 3u);
  raise_peak(peak, 2u);
  CHECK(peak == 3);
  raise_peak(peak, 9u);
  CHECK(peak == 9);
}

TEST_CASE("standby: answers with another role; not eligible, not downtime") {
  ServerState s("pg", endpoint(), 0, 10s);
  const TimePoint began = Clock::now();
  s.set_active(ActiveState::standby, "role is standby, want primary");
  s.set_role("standby", 0.0);
  CHECK_FALSE(s.eligible(began));
  CHECK_FALSE(s.takes_sessions(began));
  const ServerState::Status st = s.status(began);
  CHECK(st.state == "standby");
  CHECK(st.role == "standby");
  REQUIRE(st.lag_seconds);
  CHECK(*st.lag_seconds == 0.0);
  CHECK(s.down_count() == 0);
  CHECK(s.downtime(began + 5s) == 0ms);
  s.set_active(ActiveState::down, "connect refused");
  CHECK(s.status(began).state == "down");
  CHECK(s.down_count() == 1);
}

TEST_CASE("fenced: no session until the fence is lifted; the status names who serves and why") {
  ServerState s("pg", endpoint(), 0, 10s);
  const TimePoint began = Clock::now();
  s.set_active(ActiveState::up, "role is primary");
  CHECK(s.eligible(began));
  s.fence(FenceKind::lost, "127.0.0.1:5002", "127.0.0.1:5002 also says it is the primary; timeline 2 > timeline 1");
  CHECK(s.fenced());
  CHECK_FALSE(s.eligible(began));
  CHECK_FALSE(s.awaited());
  ServerState::Status st = s.status(began);
  CHECK(st.state == "fenced");
  CHECK(st.fenced_by == "127.0.0.1:5002");
  CHECK(st.fence_reason.find("timeline 2 > timeline 1") != std::string::npos);
  CHECK(s.downtime(began + 5s) == 0ms);
  s.unfence("it no longer says it is the primary");
  CHECK(s.eligible(began));
  st = s.status(began);
  CHECK(st.state == "up");
  CHECK(st.fenced_by.empty());
  // A failover under way: clients may wait for what comes next.
  s.fence(FenceKind::failover, "127.0.0.1:5002", "a failover began");
  CHECK(s.awaited());
  s.unfence("it did not happen");
  CHECK_FALSE(s.awaited());
  s.set_first_pending(true);
  CHECK(s.awaited());
}

TEST_CASE("a session that began before its server's sessions were ended reads the cause; a later one does not") {
  ServerState s("pg", endpoint(), 0, 10s);
  CHECK(s.ended_since(5) == Cause::none);  // never ended
  s.mark_sessions_ended(1000, Cause::server_down);
  CHECK(s.ended_since(400) == Cause::server_down);
  CHECK(s.ended_since(1000) == Cause::server_down);
  CHECK(s.ended_since(1001) == Cause::none);
  // The latest end counts, with its own cause.
  s.mark_sessions_ended(2000, Cause::fenced);
  CHECK(s.ended_since(1500) == Cause::fenced);
  CHECK(s.ended_since(2500) == Cause::none);
}
