// HealthChecker on a real libuv loop against a real loopback listener: rise
// and fall move the server's active state, reloads keep or drop checks, and
// stop() closes every handle (uv_loop_close succeeds).
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <uv.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "health/checker.hpp"
#include "runtime/registry.hpp"
#include "runtime/snapshot.hpp"
#include "sluice/address.hpp"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

// A listener that accepts and at once closes each connection.
struct Listener {
  uv_tcp_t tcp{};
  int port = 0;

  explicit Listener(uv_loop_t* loop, int at_port = 0) {
    uv_tcp_init(loop, &tcp);
    sockaddr_in sin{};
    uv_ip4_addr("127.0.0.1", at_port, &sin);
    REQUIRE(uv_tcp_bind(&tcp, reinterpret_cast<const sockaddr*>(&sin), 0) == 0);
    REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&tcp), 16, &Listener::on_connection) == 0);
    sockaddr_storage ss{};
    int len = sizeof ss;
    uv_tcp_getsockname(&tcp, reinterpret_cast<sockaddr*>(&ss), &len);
    port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }
  void close() { uv_close(reinterpret_cast<uv_handle_t*>(&tcp), nullptr); }

  static void on_connection(uv_stream_t* server, int status) {
    if (status < 0) return;
    auto* c = new uv_tcp_t;
    uv_tcp_init(server->loop, c);
    uv_accept(server, reinterpret_cast<uv_stream_t*>(c));
    uv_close(reinterpret_cast<uv_handle_t*>(c), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
  }
};

// Runs the loop until `done()` or the deadline; true when done() held.
bool run_until(uv_loop_t* loop, const std::function<bool()>& done, std::chrono::milliseconds limit = 5s) {
  uv_timer_t tick;
  uv_timer_init(loop, &tick);
  uv_timer_start(&tick, [](uv_timer_t*) {}, 5, 5);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool ok = done();
  while (!ok && std::chrono::steady_clock::now() < deadline) {
    uv_run(loop, UV_RUN_ONCE);
    ok = done();
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tick), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);
  return ok;
}

std::shared_ptr<const Config> config_with(const std::string& servers, bool health, HealthInitial initial,
                                          OnDown on_down = OnDown::close_sessions, Duration interval = 20ms) {
  const std::string text = "[global]\naccess_log = \"off\"\n"
                           "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\nupstream = \"pg\"\n"
                           "[upstream.pg]\nservers = [" + servers + "]\n";
  Config config = parse_config(text, "t.toml");
  if (health) {
    HealthConfig h;
    h.interval = interval;
    h.timeout = 500ms;
    h.rise = 2;
    h.fall = 2;
    h.jitter = 0.5;
    h.initial = initial;
    h.on_down = on_down;
    config.upstreams.at("pg").health = h;
  }
  return std::make_shared<const Config>(std::move(config));
}

std::string server(int port) { return "{ address = \"127.0.0.1:" + std::to_string(port) + "\" }"; }

int dead_port(uv_loop_t* loop) {
  Listener l(loop);
  const int port = l.port;
  l.close();
  uv_run(loop, UV_RUN_NOWAIT);
  return port;
}

// This process out of descriptors while it lives: the soft limit lowered and
// every free descriptor below it taken. Gives both back when destroyed.
class FdExhaustion {
 public:
  FdExhaustion() {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    rlimit low = saved_;
    low.rlim_cur = std::min<rlim_t>(saved_.rlim_cur, 256);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    for (int fd; (fd = ::dup(STDERR_FILENO)) >= 0;) held_.push_back(fd);
    REQUIRE(errno == EMFILE);
  }
  ~FdExhaustion() {
    for (int fd : held_) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }
  FdExhaustion(const FdExhaustion&) = delete;
  FdExhaustion& operator=(const FdExhaustion&) = delete;

 private:
  rlimit saved_{};
  std::vector<int> held_;
};

// The error log (spdlog's default logger) into a string while it lives.
class CapturedLog {
 public:
  CapturedLog() : before_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_, true);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(before_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::size_t count(const std::string& needle) const {
    const std::string text = out_.str();
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::shared_ptr<spdlog::logger> before_;
  std::ostringstream out_;
};

// Stops `checker`, runs `loop` dry and closes it: every handle must be gone.
void stop_and_close(HealthChecker& checker, uv_loop_t& loop) {
  bool stopped = false;
  checker.stop([&] { stopped = true; });
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(stopped);
  CHECK(uv_loop_close(&loop) == 0);
}

}  // namespace

TEST_CASE("a check that fails for sluice's own lack of descriptors leaves the server as it was") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  CapturedLog log;
  Listener live(&loop);
  auto snap = Snapshot::build(config_with(server(live.port), true, HealthInitial::down), registry, 1);
  ServerState& a = snap->find_upstream("pg")->server(0);
  int downs = 0;
  HealthChecker checker(&loop, [&](std::shared_ptr<ServerState>, const HealthConfig&, HealthChecker::SessionAction) { ++downs; });
  checker.update(*snap);
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::up; }));

  {
    FdExhaustion exhausted;
    // Every check fails at socket() with EMFILE, many times fall = 2: the
    // server stays up, and the warning comes once per second, with the
    // number held back.
    const bool second_report = run_until(&loop, [&] {
      return a.active_state() != ActiveState::up || log.count("more like it since the last report") > 0;
    }, 5s);
    CHECK(a.active_state() == ActiveState::up);
    CHECK(a.status(Clock::now()).active_reason == "connected");
    CHECK(downs == 0);
    CHECK(second_report);
    CHECK(log.count("local resource error in the active check of upstream \"pg\" server 127.0.0.1:") == 2);
    CHECK(log.count("too many open files") == 2);
  }
  // Descriptors free again: the checks pass as before.
  const std::size_t reports = log.count("local resource error");
  REQUIRE(run_until(&loop, [&] { return a.status(Clock::now()).active_reason == "connected"; }));
  CHECK(a.active_state() == ActiveState::up);
  CHECK(log.count("local resource error") == reports);

  // A down server is not brought up by local errors either.
  live.close();
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::down; }));
  CHECK(downs == 1);
  {
    FdExhaustion exhausted;
    CHECK_FALSE(run_until(&loop, [&] { return a.active_state() != ActiveState::down; }, 300ms));
    CHECK(a.status(Clock::now()).active_reason == "connect refused");
  }

  bool stopped = false;
  checker.stop([&] { stopped = true; });
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(stopped);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("active checks bring a server up after rise passes and down after fall failures") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  const int dead = dead_port(&loop);
  auto live = std::make_unique<Listener>(&loop);
  auto snap = Snapshot::build(config_with(server(live->port) + ", " + server(dead), true, HealthInitial::down),
                              registry, 1);
  Upstream* up = snap->find_upstream("pg");
  REQUIRE(up != nullptr);
  ServerState& a = up->server(0);
  ServerState& b = up->server(1);

  int downs = 0;
  HealthChecker checker(&loop, [&](std::shared_ptr<ServerState> s, const HealthConfig& h,
                                   HealthChecker::SessionAction action) {
    CHECK(s.get() == &a);
    CHECK(h.on_down == OnDown::close_sessions);
    CHECK(action == HealthChecker::SessionAction::close);
    ++downs;
  });
  checker.update(*snap);
  CHECK(checker.size() == 2);
  // initial = "down": nobody is eligible before the first passes.
  CHECK(a.active_state() == ActiveState::down);
  CHECK(b.active_state() == ActiveState::down);
  CHECK(b.status(Clock::now()).active_reason == "waiting for the first check");
  CHECK(checker.waiting_first() == 2);
  CHECK(checker.longest_first_wait() > Duration{0});

  // The first answer decides for a server that was only waiting for it:
  // one pass, not `rise`.
  REQUIRE(run_until(&loop, [&] { return checker.waiting_first() == 0; }));
  CHECK(a.active_state() == ActiveState::up);
  CHECK(a.status(Clock::now()).active_reason == "connected");
  // The dead port never passes: it stays down, and its status says why.
  REQUIRE(run_until(&loop, [&] { return b.status(Clock::now()).active_reason == "connect refused"; }));
  CHECK(b.active_state() == ActiveState::down);

  // A reload with the same servers keeps the checks (and their state).
  auto snap2 = Snapshot::build(config_with(server(live->port) + ", " + server(dead), true, HealthInitial::down),
                               registry, 2);
  checker.update(*snap2);
  CHECK(checker.size() == 2);
  CHECK(a.active_state() == ActiveState::up);

  // The listener goes away: fall failures take the server down, once.
  live->close();
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::down; }));
  CHECK(a.status(Clock::now()).active_reason == "connect refused");
  CHECK(downs == 1);

  // A reload without the health table: no checks, and nobody stays down.
  auto snap3 = Snapshot::build(config_with(server(live->port) + ", " + server(dead), false, HealthInitial::down),
                               registry, 3);
  checker.update(*snap3);
  CHECK(checker.size() == 0);
  CHECK(a.active_state() == ActiveState::unchecked);
  CHECK(b.active_state() == ActiveState::unchecked);

  bool stopped = false;
  checker.stop([&] { stopped = true; });
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(stopped);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("initial = up: a server is eligible before its first check; stop() cancels checks in flight") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  Listener live(&loop);
  auto snap = Snapshot::build(config_with(server(live.port), true, HealthInitial::up), registry, 1);
  ServerState& a = snap->find_upstream("pg")->server(0);
  HealthChecker checker(&loop);
  checker.update(*snap);
  CHECK(a.active_state() == ActiveState::up);
  // Stop at once, with the first check possibly in flight.
  uv_run(&loop, UV_RUN_NOWAIT);
  bool stopped = false;
  checker.stop([&] { stopped = true; });
  checker.update(*snap);  // ignored after stop()
  CHECK(checker.size() == 0);
  live.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(stopped);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("changed health settings replace the check but keep the server's state; on_down = keep closes nothing") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  auto live = std::make_unique<Listener>(&loop);
  auto snap = Snapshot::build(config_with(server(live->port), true, HealthInitial::down, OnDown::keep), registry, 1);
  ServerState& a = snap->find_upstream("pg")->server(0);
  int downs = 0;
  HealthChecker checker(&loop, [&](std::shared_ptr<ServerState>, const HealthConfig&, HealthChecker::SessionAction) { ++downs; });
  checker.update(*snap);
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::up; }));

  // Another interval: a new check, but no return to initial = "down".
  auto snap2 =
      Snapshot::build(config_with(server(live->port), true, HealthInitial::down, OnDown::keep, 30ms), registry, 2);
  checker.update(*snap2);
  CHECK(checker.size() == 1);
  CHECK(a.active_state() == ActiveState::up);

  live->close();
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::down; }));
  CHECK(downs == 0);

  bool stopped = false;
  checker.stop([&] { stopped = true; });
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(stopped);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("the status shows the last check's result, not the initial guess") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  auto live = std::make_unique<Listener>(&loop);
  auto snap = Snapshot::build(config_with(server(live->port), true, HealthInitial::up, OnDown::keep), registry, 1);
  ServerState& a = snap->find_upstream("pg")->server(0);
  HealthChecker checker(&loop);
  checker.update(*snap);
  CHECK(a.active_state() == ActiveState::up);
  CHECK(a.status(Clock::now()).reason == "active check: not checked yet (initial = up)");
  // Passing checks agree with the state: no transition, but the status says so.
  REQUIRE(run_until(&loop, [&] { return a.status(Clock::now()).reason == "active check: connected"; }));
  CHECK(a.status(Clock::now()).state == "up");

  // One failure of fall = 2: still up, and the status says how far it is.
  live->close();
  REQUIRE(run_until(&loop, [&] { return a.status(Clock::now()).active_reason != "connected"; }));
  if (a.active_state() == ActiveState::up) {
    CHECK(a.status(Clock::now()).active_reason == "connect refused (1 of 2 failures to mark it down)");
  }
  REQUIRE(run_until(&loop, [&] { return a.active_state() == ActiveState::down; }));
  CHECK(a.status(Clock::now()).active_reason == "connect refused");

  stop_and_close(checker, loop);
}

TEST_CASE("slow start begins only when a server comes back, not at its first checks") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  auto first = std::make_unique<Listener>(&loop);
  auto second = std::make_unique<Listener>(&loop);
  // Server 0 starts up by its initial guess, server 1 down until it passes.
  Config config = *config_with(server(first->port) + ", " + server(second->port), true, HealthInitial::up);
  auto snap = Snapshot::build(std::make_shared<const Config>(config), registry, 1);
  ServerState& guessed_up = snap->find_upstream("pg")->server(0);
  ServerState& waited = snap->find_upstream("pg")->server(1);
  waited.set_active(ActiveState::down, "waiting for the first check");  // as initial = "down" leaves it
  HealthChecker checker(&loop);
  checker.update(*snap);
  REQUIRE(run_until(&loop, [&] {
    return waited.active_state() == ActiveState::up && guessed_up.status(Clock::now()).active_reason == "connected";
  }));
  CHECK(guessed_up.up_since() == TimePoint{});
  CHECK(waited.up_since() == TimePoint{});

  // A real recovery: down by failing checks, then up again.
  const TimePoint before = Clock::now();
  const int port = first->port;
  first->close();
  REQUIRE(run_until(&loop, [&] { return guessed_up.active_state() == ActiveState::down; }));
  CHECK(guessed_up.up_since() == TimePoint{});
  first = std::make_unique<Listener>(&loop, port);
  REQUIRE(run_until(&loop, [&] { return guessed_up.active_state() == ActiveState::up; }));
  CHECK(guessed_up.up_since() >= before);

  first->close();
  second->close();
  stop_and_close(checker, loop);
}

TEST_CASE("a server whose name resolves elsewhere is checked at its new address") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  Registry registry;
  auto live = std::make_unique<Listener>(&loop);
  const int dead = dead_port(&loop);
  auto snap = Snapshot::build(config_with(server(dead), true, HealthInitial::up, OnDown::keep), registry, 1);
  ServerState& old_state = snap->find_upstream("pg")->server(0);
  HealthChecker checker(&loop);
  checker.update(*snap);
  REQUIRE(run_until(&loop, [&] { return old_state.active_state() == ActiveState::down; }));

  // The same text, resolved to the live port's address: as a host name
  // whose DNS answer changed would be at the next reload.
  Config moved = *config_with(server(dead), true, HealthInitial::up, OnDown::keep);
  Endpoint& ep = moved.upstreams.at("pg").servers.at(0).address;
  set_port(ep.addr, static_cast<std::uint16_t>(live->port));
  const std::string text = ep.text;
  auto snap2 = Snapshot::build(std::make_shared<const Config>(std::move(moved)), registry, 2);
  ServerState& new_state = snap2->find_upstream("pg")->server(0);
  CHECK(&new_state != &old_state);
  CHECK(new_state.address.text == text);
  checker.update(*snap2);
  CHECK(checker.size() == 1);
  REQUIRE(run_until(&loop, [&] { return new_state.status(Clock::now()).active_reason == "connected"; }));
  CHECK(new_state.active_state() == ActiveState::up);
  CHECK(old_state.active_state() == ActiveState::unchecked);

  live->close();
  stop_and_close(checker, loop);
}
