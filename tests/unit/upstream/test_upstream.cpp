#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "fixture.hpp"
#include "upstream/upstream.hpp"

using namespace sluice;
using sluice::test::t0;
using namespace std::chrono_literals;

namespace {


// Routes the default logger into a string for the lifetime of the object.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%l %v");
    auto logger = std::make_shared<spdlog::logger>("capture", sink);
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

UpstreamConfig pg_config(Balance balance, std::uint32_t max_fails = 1) {
  UpstreamConfig c;
  c.name = "pg";
  c.balance = balance;
  c.max_fails = max_fails;
  c.fail_timeout = 10s;
  c.servers = {test::server_config("127.0.0.1:5432"), test::server_config("127.0.0.2:5432"),
               test::server_config("127.0.0.3:5432", 1, 0, true)};
  return c;
}

}  // namespace

TEST_CASE("ServerState: each transition is logged once, with the reason") {
  LogCapture log;
  ServerState s("pg", test::server_config("127.0.0.1:5432").address, 2, 10s);
  CHECK(s.passive_up());

  s.report(ConnectResult::failed, "connection refused", t0);
  CHECK(s.passive_up());
  CHECK(s.eligible(t0));
  CHECK(log.text().empty());

  s.report(ConnectResult::failed, "connection refused", t0 + 1s);
  CHECK_FALSE(s.passive_up());
  CHECK_FALSE(s.eligible(t0 + 1s));
  // A late failure of an attempt already in flight: no second line.
  s.report(ConnectResult::timed_out, "", t0 + 2s);
  CHECK(s.total_failures == 3);
  CHECK(log.text() ==
        "warning upstream \"pg\" server 127.0.0.1:5432 marked down: "
        "2 passive failures (failed connects) within 10s, last: connection refused (detected in 1s)\n");

  CHECK(s.eligible(t0 + 11s));
  s.on_selected(t0 + 11s);
  CHECK_FALSE(s.eligible(t0 + 11s));  // its trial is in flight
  s.report(ConnectResult::connected, "", t0 + 11500ms);
  CHECK(s.passive_up());
  CHECK(s.eligible(t0 + 11500ms));
  CHECK(log.text() ==
        "warning upstream \"pg\" server 127.0.0.1:5432 marked down: "
        "2 passive failures (failed connects) within 10s, last: connection refused (detected in 1s)\n"
        "info upstream \"pg\" server 127.0.0.1:5432 is up again: "
        "trial connection succeeded after being down for 10.5s (detected in 500ms)\n");
}

TEST_CASE("ServerState: a timeout with no message gets a default reason") {
  LogCapture log;
  ServerState s("pg", test::server_config("127.0.0.1:5432").address, 1, 10s);
  s.report(ConnectResult::timed_out, "", t0);
  CHECK(log.text() ==
        "warning upstream \"pg\" server 127.0.0.1:5432 marked down: "
        "1 passive failure (failed connects) within 10s, last: connect timed out (detected in 0s)\n");
}

TEST_CASE("ServerState: max_fails = 0 counts failures for metrics only") {
  LogCapture log;
  ServerState s("pg", test::server_config("127.0.0.1:5432").address, 0, 10s);
  for (int i = 0; i < 5; ++i) s.report(ConnectResult::failed, "connection refused", t0);
  CHECK(s.total_failures == 5);
  CHECK(s.passive_up());
  CHECK(s.eligible(t0));
  CHECK(log.text().empty());
}

TEST_CASE("ServerState: admin and active states gate eligibility") {
  LogCapture log;
  ServerState s("pg", test::server_config("127.0.0.1:5432").address, 1, 10s);
  CHECK(s.eligible(t0));
  s.set_admin(AdminState::drain);
  CHECK_FALSE(s.eligible(t0));
  s.set_admin(AdminState::enabled);
  // A check's first state (initial = "up"), then a real failure: a warning.
  s.set_active(ActiveState::up, "not checked yet (initial = up)");
  s.set_active(ActiveState::down, "connect refused", 3s);
  CHECK_FALSE(s.eligible(t0));
  CHECK(s.status(t0).state == "down");
  CHECK(log.text().find("marked down (active check): connect refused (detected in 3s)") != std::string::npos);
  s.set_active(ActiveState::up, "HTTP 200", 2s);
  CHECK(s.eligible(t0));
  // A local resource error never counts against the server.
  for (int i = 0; i < 5; ++i) s.report(ConnectResult::local_error, "too many open files", t0);
  CHECK(s.total_failures == 0);
  CHECK(s.passive_up());
}

TEST_CASE("Upstream::pick: a failing server is skipped, tried again, and restored") {
  LogCapture log;
  auto up_owner = test::make_upstream(pg_config(Balance::round_robin));
  Upstream& up = *up_owner;
  REQUIRE(up.size() == 3);
  TriedSet none;

  // Server 0 refuses: marked down at once (max_fails = 1).
  up.server(0).report(ConnectResult::failed, "connection refused", t0);
  for (int i = 0; i < 4; ++i) {
    const long p = up.pick(none, "", t0 + 1s);
    CHECK(p == 1);
    up.release(static_cast<std::size_t>(p));
  }

  // Its period is over: the next pick is its trial, and only one is sent.
  std::vector<long> picks;
  for (int i = 0; i < 4; ++i) picks.push_back(up.pick(none, "", t0 + 10s));
  CHECK(std::count(picks.begin(), picks.end(), 0) == 1);
  CHECK(std::count(picks.begin(), picks.end(), 1) == 3);
  CHECK(up.server(0).active == 1);

  // The trial succeeds: back in the rotation.
  up.server(0).report(ConnectResult::connected, "", t0 + 10100ms);
  std::vector<long> after;
  for (int i = 0; i < 4; ++i) after.push_back(up.pick(none, "", t0 + 11s));
  CHECK(std::count(after.begin(), after.end(), 0) == 2);
  CHECK(std::count(after.begin(), after.end(), 1) == 2);
  CHECK(up.server(0).total_sessions == 3);
  CHECK(log.text().find("upstream \"pg\" server 127.0.0.1:5432 marked down: ") != std::string::npos);
  CHECK(log.text().find("upstream \"pg\" server 127.0.0.1:5432 is up again: ") != std::string::npos);
}

TEST_CASE("Upstream::pick: the backup serves while every primary is down") {
  LogCapture log;
  auto up_owner = test::make_upstream(pg_config(Balance::least_conn));
  Upstream& up = *up_owner;
  TriedSet none;
  up.server(0).report(ConnectResult::failed, "connection refused", t0);
  up.server(1).report(ConnectResult::timed_out, "connect timed out", t0);
  CHECK(up.pick(none, "", t0 + 1s) == 2);
  CHECK(up.pick(none, "", t0 + 1s) == 2);
  CHECK(up.server(2).active == 2);
  CHECK(up.server(2).total_sessions == 2);

  // Both primaries' periods are over: they are tried before the backup again.
  const long a = up.pick(none, "", t0 + 10s);
  const long b = up.pick(none, "", t0 + 10s);
  CHECK(((a == 0 && b == 1) || (a == 1 && b == 0)));
  // Both trials in flight: the backup takes the next one.
  CHECK(up.pick(none, "", t0 + 10s) == 2);
}

TEST_CASE("Upstream::pick: nothing eligible returns -1") {
  LogCapture log;
  auto up_owner = test::make_upstream(pg_config(Balance::hash));
  Upstream& up = *up_owner;
  TriedSet none;
  for (std::size_t i = 0; i < 3; ++i) {
    up.server(i).report(ConnectResult::failed, "connection refused", t0);
  }
  CHECK(up.pick(none, "key", t0 + 5s) == -1);
  for (std::size_t i = 0; i < 3; ++i) CHECK(up.server(i).total_sessions == 0);
  CHECK(up.pick(none, "key", t0 + 10s) >= 0);
}

TEST_CASE("Upstream::pick: passive failures never keep out the only usable server") {
  LogCapture log;
  UpstreamConfig c = pg_config(Balance::round_robin);
  c.servers.resize(1);
  auto up_owner = test::make_upstream(c);
  Upstream& up = *up_owner;
  TriedSet none;
  up.server(0).report(ConnectResult::failed, "connection refused", t0);
  CHECK_FALSE(up.server(0).passive_up());
  // Well within fail_timeout, the lone server is still picked: its connect
  // is a trial, and a success brings it back at once.
  CHECK(up.pick(none, "", t0 + 1s) == 0);
  up.server(0).report(ConnectResult::connected, "", t0 + 1s);
  CHECK(up.server(0).passive_up());
  // A session that already tried it does not get it again.
  up.server(0).report(ConnectResult::failed, "connection refused", t0 + 2s);
  TriedSet tried;
  tried.add(0);
  CHECK(up.pick(tried, "", t0 + 3s) == -1);

  // Two servers, one disabled: the other is the only usable one.
  auto two_owner = test::make_upstream(pg_config(Balance::round_robin));
  Upstream& two = *two_owner;
  two.server(1).set_admin(AdminState::disabled);
  two.server(2).set_admin(AdminState::disabled);
  two.server(0).report(ConnectResult::failed, "connection refused", t0);
  CHECK(two.pick(none, "", t0 + 1s) == 0);
  // With another usable server, passive health keeps the failed one out.
  auto three_owner = test::make_upstream(pg_config(Balance::round_robin));
  Upstream& three = *three_owner;
  three.server(0).report(ConnectResult::failed, "connection refused", t0);
  three.server(2).report(ConnectResult::failed, "connection refused", t0);
  CHECK(three.pick(none, "", t0 + 1s) == 1);
  CHECK(three.pick(none, "", t0 + 1s) == 1);
}

TEST_CASE("Upstream: make_balancer honours the configured algorithm") {
  // Two idle servers: round_robin and least_conn alternate; hash sticks to
  // one server for one key.
  for (const Balance b : {Balance::round_robin, Balance::least_conn}) {
    auto up_owner = test::make_upstream(pg_config(b));
  Upstream& up = *up_owner;
    TriedSet none;
    const long first = up.pick(none, "k", t0);
    up.release(static_cast<std::size_t>(first));
    const long second = up.pick(none, "k", t0);
    CHECK(first != second);
  }
  auto up_owner = test::make_upstream(pg_config(Balance::hash));
  Upstream& up = *up_owner;
  TriedSet none;
  const long first = up.pick(none, "k", t0);
  for (int i = 0; i < 5; ++i) CHECK(up.pick(none, "k", t0) == first);

  auto rnd_owner = test::make_upstream(pg_config(Balance::random));
  Upstream& rnd = *rnd_owner;
  for (int i = 0; i < 20; ++i) {
    const long p = rnd.pick(none, "", t0);
    CHECK((p == 0 || p == 1));
  }
}

TEST_CASE("Upstream::pick from many threads: counts stay exact, max_conns holds") {
  UpstreamConfig c;
  c.name = "pg";
  c.servers = {test::server_config("127.0.0.1:5432", 1, 3), test::server_config("127.0.0.2:5432", 2, 3)};
  auto up_owner = test::make_upstream(c);
  Upstream& up = *up_owner;
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  std::atomic<std::uint32_t> over_limit{0};
  std::atomic<std::uint64_t> picked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      TriedSet none;
      for (int i = 0; i < kRounds; ++i) {
        const long p = up.pick(none, "", t0);
        if (p < 0) continue;
        const auto idx = static_cast<std::size_t>(p);
        if (up.server(idx).active.load() > up.member(idx).config.max_conns) over_limit.fetch_add(1);
        picked.fetch_add(1);
        up.release(idx);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(over_limit == 0);
  CHECK(up.server(0).active == 0);
  CHECK(up.server(1).active == 0);
  CHECK(up.server(0).total_sessions + up.server(1).total_sessions == picked.load());
  CHECK(picked.load() > 0);
}
