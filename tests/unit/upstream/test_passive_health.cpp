#include <doctest/doctest.h>

#include <chrono>

#include "upstream/passive_health.hpp"

#include "fixture.hpp"

using namespace sluice;
using sluice::test::t0;
using namespace std::chrono_literals;
using State = PassiveHealth::State;

namespace {


}  // namespace

TEST_CASE("format_duration uses the config file's style") {
  CHECK(format_duration(0ms) == "0s");
  CHECK(format_duration(250ms) == "250ms");
  CHECK(format_duration(10s) == "10s");
  CHECK(format_duration(1500ms) == "1.5s");
  CHECK(format_duration(10250ms) == "10.25s");
  CHECK(format_duration(12345ms) == "12.345s");
  CHECK(format_duration(90s) == "90s");
  CHECK(format_duration(5min) == "5m");
  CHECK(format_duration(2h) == "2h");
}

TEST_CASE("passive health: max_fails = 0 never marks down and never counts") {
  PassiveHealth h(0, 10s);
  for (int i = 0; i < 100; ++i) {
    const auto t = h.on_failure(t0 + std::chrono::milliseconds(i), "connection refused");
    CHECK_FALSE(t.changed);
    CHECK(t.now_up);
  }
  CHECK(h.state() == State::up);
  CHECK(h.fails() == 0);
  CHECK(h.eligible(t0));
}

TEST_CASE("passive health: max_fails = 1 marks down on the first failure") {
  PassiveHealth h(1, 10s);
  CHECK(h.eligible(t0));
  const auto t = h.on_failure(t0, "connection refused");
  CHECK(t.changed);
  CHECK_FALSE(t.now_up);
  CHECK(t.reason == "1 passive failure (failed connects) within 10s, last: connection refused");
  CHECK(t.detect == 0ms);  // the first failure decided it
  CHECK(h.state() == State::down);
  CHECK_FALSE(h.eligible(t0));
  CHECK_FALSE(h.eligible(t0 + 9999ms));
  CHECK(h.eligible(t0 + 10s));  // the period is over: eligible for a trial
  CHECK(h.state() == State::down);  // still down until a connection is sent
}

TEST_CASE("passive health: max_fails failures within fail_timeout") {
  PassiveHealth h(3, 10s);
  CHECK_FALSE(h.on_failure(t0, "connection refused").changed);
  CHECK_FALSE(h.on_failure(t0 + 4s, "connection refused").changed);
  CHECK(h.fails() == 2);
  CHECK(h.eligible(t0 + 4s));
  const auto t = h.on_failure(t0 + 9999ms, "connect timed out");
  CHECK(t.changed);
  CHECK_FALSE(t.now_up);
  CHECK(t.reason == "3 passive failures (failed connects) within 10s, last: connect timed out");
  CHECK(t.detect == 9999ms);  // from the window's first failure
  CHECK_FALSE(h.eligible(t0 + 9999ms));
  // Down for fail_timeout from the failure that tipped it over.
  CHECK_FALSE(h.eligible(t0 + 19998ms));
  CHECK(h.eligible(t0 + 19999ms));
}

TEST_CASE("passive health: a failure after the window restarts the count at 1") {
  PassiveHealth h(2, 250ms);
  h.on_failure(t0, "connection refused");
  CHECK(h.fails() == 1);
  // 250ms after the first failure the window is over.
  CHECK_FALSE(h.on_failure(t0 + 250ms, "connection refused").changed);
  CHECK(h.fails() == 1);
  CHECK(h.state() == State::up);
  const auto t = h.on_failure(t0 + 400ms, "connection reset by peer");
  CHECK(t.changed);
  CHECK(t.reason == "2 passive failures (failed connects) within 250ms, last: connection reset by peer");
  CHECK(t.detect == 150ms);  // the window restarted at t0 + 250ms
  CHECK(h.fails() == 2);
}

TEST_CASE("passive health: a success while up forgets earlier failures") {
  PassiveHealth h(2, 10s);
  h.on_failure(t0, "connection refused");
  CHECK(h.fails() == 1);
  const auto s = h.on_success(t0 + 1s);
  CHECK_FALSE(s.changed);
  CHECK(h.fails() == 0);
  CHECK_FALSE(h.on_failure(t0 + 2s, "connection refused").changed);
  CHECK(h.state() == State::up);
}

TEST_CASE("passive health: down -> trial -> up") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");

  // Selecting before the period is over changes nothing.
  h.on_selected(t0 + 5s);
  CHECK(h.state() == State::down);

  h.on_selected(t0 + 10s);
  CHECK(h.state() == State::trial);
  // One trial at a time.
  CHECK_FALSE(h.eligible(t0 + 10s));
  CHECK_FALSE(h.eligible(t0 + 15s));

  const auto t = h.on_success(t0 + 10s);
  CHECK(t.changed);
  CHECK(t.now_up);
  CHECK(t.reason == "trial connection succeeded after being down for 10s");
  CHECK(h.state() == State::up);
  CHECK(h.fails() == 0);
  CHECK(h.eligible(t0 + 10s));
}

TEST_CASE("passive health: a forced selection (the only usable server) is a trial at once") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");
  h.on_selected(t0 + 1s, true);
  CHECK(h.state() == State::trial);
  // It fails again: down for a new period, and forced again at once.
  CHECK_FALSE(h.on_failure(t0 + 1s, "connection refused").changed);
  CHECK(h.state() == State::down);
  h.on_selected(t0 + 2s, true);
  CHECK(h.state() == State::trial);
  const auto t = h.on_success(t0 + 2s);
  CHECK(t.changed);
  CHECK(t.now_up);
  CHECK(h.state() == State::up);
}

TEST_CASE("passive health: the recovery reason says how long the server was down") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");
  h.on_selected(t0 + 12s);
  const auto t = h.on_success(t0 + 12250ms);
  CHECK(t.reason == "trial connection succeeded after being down for 12.25s");
  CHECK(t.detect == 250ms);  // the trial connection, from its selection
}

TEST_CASE("passive health: a failed trial is down for another fail_timeout") {
  PassiveHealth h(2, 10s);
  h.on_failure(t0, "connection refused");
  h.on_failure(t0 + 1s, "connection refused");  // down until t0+11s
  h.on_selected(t0 + 11s);
  REQUIRE(h.state() == State::trial);

  const auto t = h.on_failure(t0 + 12s, "connection refused");
  CHECK_FALSE(t.changed);  // it was unavailable already
  CHECK_FALSE(t.now_up);
  CHECK(t.reason == "trial connection failed: connection refused");
  CHECK(h.state() == State::down);
  CHECK_FALSE(h.eligible(t0 + 12s));
  CHECK_FALSE(h.eligible(t0 + 21999ms));
  CHECK(h.eligible(t0 + 22s));

  // The next trial succeeds: down since it was marked at t0+1s.
  h.on_selected(t0 + 22s);
  const auto up = h.on_success(t0 + 23s);
  CHECK(up.changed);
  CHECK(up.reason == "trial connection succeeded after being down for 22s");
}

TEST_CASE("passive health: a trial never reported expires after fail_timeout") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");
  h.on_selected(t0 + 10s);
  REQUIRE(h.state() == State::trial);
  CHECK_FALSE(h.eligible(t0 + 19999ms));
  CHECK(h.eligible(t0 + 20s));
  h.on_selected(t0 + 20s);  // a new trial
  CHECK(h.state() == State::trial);
  CHECK_FALSE(h.eligible(t0 + 29999ms));
}

TEST_CASE("passive health: late reports while down") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");

  SUBCASE("a late failure from an earlier attempt does not extend the period") {
    const auto t = h.on_failure(t0 + 3s, "connect timed out");
    CHECK_FALSE(t.changed);
    CHECK(h.eligible(t0 + 10s));
  }
  SUBCASE("a failure reported after the period starts a new one") {
    h.on_failure(t0 + 12s, "connect timed out");
    CHECK(h.state() == State::down);
    CHECK_FALSE(h.eligible(t0 + 21999ms));
    CHECK(h.eligible(t0 + 22s));
  }
  SUBCASE("a late success does not bring the server back without a trial") {
    const auto t = h.on_success(t0 + 2s);
    CHECK_FALSE(t.changed);
    CHECK(h.state() == State::down);
    CHECK_FALSE(h.eligible(t0 + 5s));
  }
}

TEST_CASE("passive health: save and restore carry a down period to another clock") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "connection refused");
  const auto saved = h.save(t0 + 4s);
  CHECK(saved.state == State::down);
  CHECK(saved.fails == 1);
  CHECK(saved.down_left == 6s);
  CHECK(saved.down_age == 4s);
  // The new process's clock reads something else entirely.
  const TimePoint u0{std::chrono::hours(5)};
  PassiveHealth n(1, 10s);
  n.restore(saved, u0);
  CHECK(n.state() == State::down);
  CHECK(n.fails() == 1);
  CHECK_FALSE(n.eligible(u0 + 5s));
  CHECK(n.eligible(u0 + 6s));
  CHECK(n.down_since() == u0 - 4s);
  // After the rest of the period the next pick is a trial, as before.
  n.on_selected(u0 + 6s);
  CHECK(n.state() == State::trial);
}

TEST_CASE("passive health: a restored count window goes on, and a shorter fail_timeout bounds the period") {
  PassiveHealth h(3, 10s);
  h.on_failure(t0, "refused");
  h.on_failure(t0 + 1s, "refused");
  const auto saved = h.save(t0 + 2s);
  CHECK(saved.state == State::up);
  CHECK(saved.window_age == 2s);
  const TimePoint u0{std::chrono::hours(5)};
  PassiveHealth n(3, 10s);
  n.restore(saved, u0);
  CHECK(n.fails() == 2);
  // The third failure within the window takes the server out.
  CHECK(n.on_failure(u0 + 1s, "refused").changed);
  CHECK(n.state() == State::down);

  PassiveHealth d(1, 60s);
  d.on_failure(t0, "refused");
  PassiveHealth shorter(1, 5s);
  shorter.restore(d.save(t0), u0);
  CHECK(shorter.eligible(u0 + 5s));
}

TEST_CASE("passive health: a trial in flight is handed over as a period that is over") {
  PassiveHealth h(1, 10s);
  h.on_failure(t0, "refused");
  h.on_selected(t0 + 10s);
  REQUIRE(h.state() == State::trial);
  const auto saved = h.save(t0 + 11s);
  CHECK(saved.state == State::down);
  CHECK(saved.down_left == 0s);
  PassiveHealth n(1, 10s);
  n.restore(saved, t0);
  CHECK(n.eligible(t0));
}
