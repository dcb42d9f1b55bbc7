// The Reactor with real sockets: edge-triggered dispatch, deferred work and
// its cancellation, the loop clock.
#include "proxy/reactor.hpp"

#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

using sluice::Deferred;
using sluice::IoWatcher;
using sluice::Reactor;

namespace {

struct Loop {
  uv_loop_t loop{};
  Loop() { uv_loop_init(&loop); }
  ~Loop() { uv_loop_close(&loop); }
};

struct Pair {
  int fd[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd) == 0); }
  ~Pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
};

struct Recorder final : IoWatcher {
  std::vector<std::uint32_t> events;
  void on_io(std::uint32_t e) override { events.push_back(e); }
};

struct Work final : Deferred {
  std::vector<int>* log = nullptr;
  int id = 0;
  Reactor* again = nullptr;  // defers itself once more when run
  void run_deferred() override {
    log->push_back(id);
    if (again != nullptr) {
      Reactor* r = again;
      again = nullptr;
      r->defer(*this);
    }
  }
};

}  // namespace

TEST_CASE("reactor: a stream socket is reported once per edge") {
  Loop l;
  Reactor r(&l.loop);
  Pair p;
  Recorder rec;
  REQUIRE(r.add(p.fd[0], Reactor::kStream, &rec) == 0);
  // Writable from the start: one edge.
  CHECK(r.run_once(100) == 1);
  REQUIRE(rec.events.size() == 1);
  CHECK((rec.events[0] & EPOLLOUT) != 0);
  CHECK((rec.events[0] & EPOLLIN) == 0);
  // Nothing new: no event, however often one waits.
  CHECK(r.run_once(0) == 0);
  CHECK(r.run_once(0) == 0);
  // Bytes arrive: one edge, and none again while they sit unread.
  REQUIRE(::write(p.fd[1], "abc", 3) == 3);
  CHECK(r.run_once(100) == 1);
  CHECK((rec.events.back() & EPOLLIN) != 0);
  CHECK(r.run_once(0) == 0);
  // More bytes: a new edge although the first ones were never read.
  REQUIRE(::write(p.fd[1], "d", 1) == 1);
  CHECK(r.run_once(100) == 1);
  // The peer's FIN says so.
  ::shutdown(p.fd[1], SHUT_WR);
  CHECK(r.run_once(100) == 1);
  CHECK((rec.events.back() & EPOLLRDHUP) != 0);
  // close(2) takes the socket out of the set.
  ::close(p.fd[0]);
  p.fd[0] = -1;
  ::close(p.fd[1]);
  p.fd[1] = -1;
  const auto seen = rec.events.size();
  CHECK(r.run_once(0) == 0);
  CHECK(rec.events.size() == seen);
}

TEST_CASE("reactor: deferred work runs after the events, once, and what it defers waits a round") {
  Loop l;
  Reactor r(&l.loop);
  std::vector<int> log;
  Work a, b;
  a.log = b.log = &log;
  a.id = 1;
  b.id = 2;
  b.again = &r;
  r.defer(a);
  r.defer(a);  // queued once
  r.defer(b);
  CHECK(a.deferred());
  CHECK(r.has_deferred());
  r.run_once(-1);  // does not block: work is queued
  CHECK(log.size() == 2);
  CHECK_FALSE(a.deferred());
  CHECK(b.deferred());  // deferred again from inside its run: the next round
  r.run_once(-1);
  CHECK(log == std::vector<int>{log[0], log[1], 2});
  CHECK_FALSE(r.has_deferred());
}

TEST_CASE("reactor: cancelled or destroyed work does not run") {
  Loop l;
  Reactor r(&l.loop);
  std::vector<int> log;
  Work a;
  a.log = &log;
  a.id = 1;
  r.defer(a);
  {
    Work gone;
    gone.log = &log;
    gone.id = 2;
    r.defer(gone);
  }  // destroyed while queued
  r.cancel(a);
  r.cancel(a);  // harmless when not queued
  CHECK_FALSE(r.has_deferred());
  r.run_once(0);
  CHECK(log.empty());
}

struct Canceller final : Deferred {
  Reactor* r = nullptr;
  Deferred* victim = nullptr;
  bool ran = false;
  void run_deferred() override {
    ran = true;
    r->cancel(*victim);
  }
};

TEST_CASE("reactor: work may cancel other work queued in the same round") {
  Loop l;
  Reactor r(&l.loop);
  std::vector<int> log;
  Work victim;
  victim.log = &log;
  Canceller c;
  c.r = &r;
  c.victim = &victim;
  r.defer(victim);
  r.defer(c);  // at the front: runs first
  r.run_once(0);
  CHECK(c.ran);
  CHECK(log.empty());
}

TEST_CASE("reactor: the loop's clock is brought up to date by a wait") {
  Loop l;
  Reactor r(&l.loop);
  const std::uint64_t before = uv_now(&l.loop);
  r.run_once(30);  // nothing registered: a timeout
  CHECK(uv_now(&l.loop) >= before + 25);
}
