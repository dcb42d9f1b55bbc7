// The wait queue behind max_conns: who waits, who is refused, and that a
// freed slot goes to the oldest waiter, already counted on its server.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "upstream/wait_queue.hpp"

using namespace sluice;

namespace {

// A waiter that records its grants (a worker would be told instead).
struct Waiter final : QueueTicket {
  std::vector<std::string>* log = nullptr;
  std::string name;
  int grants = 0;
  TriedSet none;

  void granted(const std::shared_ptr<QueueTicket>& /*self*/) override {
    ++grants;
    if (log != nullptr) log->push_back(name);
  }
};

struct Pool {
  std::unique_ptr<Upstream> up;
  std::shared_ptr<WaitQueue> queue = std::make_shared<WaitQueue>();
  std::vector<std::string> order;

  // Servers with max_conns each `limit` (0: none); `queue` waiters at most.
  Pool(std::vector<std::uint32_t> limits, std::uint32_t queue_len, Balance balance = Balance::least_conn) {
    UpstreamConfig c;
    c.name = "pg";
    c.balance = balance;
    c.queue = queue_len;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      c.servers.push_back(test::server_config("10.0.0." + std::to_string(i + 1) + ":5432", 1, limits[i]));
    }
    up = test::make_upstream(c);
    up->set_queue(queue);
  }

  std::shared_ptr<Waiter> waiter(const std::string& name) {
    auto w = std::make_shared<Waiter>();
    w->upstream = up.get();
    w->tried = &w->none;
    w->log = &order;
    w->name = name;
    return w;
  }

  WaitQueue::Outcome enter(const std::shared_ptr<Waiter>& w, long& index) {
    return queue->enter(w, Clock::now(), index);
  }
};

}  // namespace

TEST_CASE("wait queue: a pick at once while a server has room, a place in line once all are full") {
  Pool p({1, 1}, 2);
  long i = -1;
  auto a = p.waiter("a");
  auto b = p.waiter("b");
  CHECK(p.enter(a, i) == WaitQueue::Outcome::picked);
  const long first = i;
  CHECK(p.enter(b, i) == WaitQueue::Outcome::picked);
  CHECK(i != first);  // least_conn: the other, empty server
  CHECK(p.queue->length() == 0);

  auto c = p.waiter("c");
  auto d = p.waiter("d");
  auto e = p.waiter("e");
  CHECK(p.enter(c, i) == WaitQueue::Outcome::waiting);
  CHECK(p.enter(d, i) == WaitQueue::Outcome::waiting);
  CHECK(p.queue->length() == 2);
  // Two waiting is the upstream's `queue`: the next is refused.
  CHECK(p.enter(e, i) == WaitQueue::Outcome::full);
  CHECK(p.queue->length() == 2);
  CHECK(p.queue->refused() == 1);
  CHECK(p.queue->queued_total() == 2);
  CHECK(c->grants == 0);
  CHECK(d->grants == 0);
}

TEST_CASE("wait queue: freed slots go to the waiters oldest first, counted on their server") {
  Pool p({2}, 5);
  long i = -1;
  auto h1 = p.waiter("h1");
  auto h2 = p.waiter("h2");
  REQUIRE(p.enter(h1, i) == WaitQueue::Outcome::picked);
  REQUIRE(p.enter(h2, i) == WaitQueue::Outcome::picked);
  std::vector<std::shared_ptr<Waiter>> waiters;
  for (const char* n : {"w1", "w2", "w3"}) {
    waiters.push_back(p.waiter(n));
    REQUIRE(p.enter(waiters.back(), i) == WaitQueue::Outcome::waiting);
  }
  CHECK(p.up->server(0).active == 2);

  p.up->release(0);  // a held session ends
  CHECK(p.order == std::vector<std::string>{"w1"});
  // The slot is w1's already: the server is full again, nobody else moves.
  CHECK(p.up->server(0).active == 2);
  CHECK(p.queue->length() == 2);
  // w1's thread takes its server (leave() after a grant names it).
  CHECK(p.queue->leave(*waiters[0], Clock::now(), false) == 0);

  p.up->release(0);
  CHECK(p.order == std::vector<std::string>{"w1", "w2"});
  p.up->release(0);
  CHECK(p.order == std::vector<std::string>{"w1", "w2", "w3"});
  CHECK(p.queue->length() == 0);
  CHECK(p.queue->wait_seconds().count() == 3);
  CHECK(p.queue->timeouts() == 0);
}

TEST_CASE("wait queue: a waiter that gives up leaves its place; one granted meanwhile hands its server back") {
  Pool p({1}, 5);
  long i = -1;
  auto held = p.waiter("held");
  REQUIRE(p.enter(held, i) == WaitQueue::Outcome::picked);
  auto w1 = p.waiter("w1");
  auto w2 = p.waiter("w2");
  auto w3 = p.waiter("w3");
  REQUIRE(p.enter(w1, i) == WaitQueue::Outcome::waiting);
  REQUIRE(p.enter(w2, i) == WaitQueue::Outcome::waiting);
  REQUIRE(p.enter(w3, i) == WaitQueue::Outcome::waiting);

  // w1's queue_timeout: out of line, counted, nothing to release.
  CHECK(p.queue->leave(*w1, Clock::now(), true) == -1);
  CHECK(p.queue->timeouts() == 1);
  CHECK(p.queue->length() == 2);

  p.up->release(0);
  CHECK(p.order == std::vector<std::string>{"w2"});
  // w2's session ends before it heard of its grant: the server is its to
  // give back, and giving it back serves w3.
  const long granted = p.queue->leave(*w2, Clock::now(), true);
  CHECK(granted == 0);
  CHECK(p.queue->timeouts() == 1);  // not a timeout: it had its server
  p.up->release(static_cast<std::size_t>(granted));
  CHECK(p.order == std::vector<std::string>{"w2", "w3"});
  CHECK(p.up->server(0).active == 1);
  CHECK(p.queue->length() == 0);
}

TEST_CASE("wait queue: no eligible server at all is not a reason to wait") {
  Pool p({1, 1}, 5);
  p.up->server(0).set_admin(AdminState::disabled);
  p.up->server(1).set_admin(AdminState::disabled);
  long i = 0;
  auto a = p.waiter("a");
  CHECK(p.enter(a, i) == WaitQueue::Outcome::none);
  CHECK(i == -1);
  CHECK(p.queue->length() == 0);
}

TEST_CASE("wait queue: a server that comes back serves the waiters before any newcomer") {
  Pool p({1, 1}, 5);
  p.up->server(1).set_admin(AdminState::disabled);
  long i = -1;
  auto held = p.waiter("held");
  REQUIRE(p.enter(held, i) == WaitQueue::Outcome::picked);
  REQUIRE(i == 0);
  auto w1 = p.waiter("w1");
  REQUIRE(p.enter(w1, i) == WaitQueue::Outcome::waiting);

  // Enabling frees no slot, so nothing is served yet...
  p.up->server(1).set_admin(AdminState::enabled);
  CHECK(w1->grants == 0);
  // ...until the next look: a newcomer's arrival serves w1 first and
  // finds the servers full again.
  auto late = p.waiter("late");
  CHECK(p.enter(late, i) == WaitQueue::Outcome::waiting);
  CHECK(p.order == std::vector<std::string>{"w1"});
  CHECK(p.queue->leave(*w1, Clock::now(), false) == 1);
  CHECK(p.queue->length() == 1);
  CHECK(p.queue->oldest_wait(Clock::now()) >= 0.0);

  // Or the tick's serve(): the same hand-over without a newcomer.
  p.up->release(0);
  CHECK(p.order == std::vector<std::string>{"w1", "late"});
}

TEST_CASE("wait queue: least_conn chooses when the slot is handed over") {
  Pool p({2, 2}, 5);
  long i = -1;
  std::vector<std::shared_ptr<Waiter>> held;
  for (int k = 0; k < 4; ++k) {
    held.push_back(p.waiter("h"));
    REQUIRE(p.enter(held.back(), i) == WaitQueue::Outcome::picked);
  }
  auto w = p.waiter("w");
  REQUIRE(p.enter(w, i) == WaitQueue::Outcome::waiting);
  p.up->release(1);
  CHECK(w->grants == 1);
  CHECK(p.queue->leave(*w, Clock::now(), false) == 1);  // the server with room, picked then
  CHECK(p.up->server(1).active == 2);
}

TEST_CASE("a fenced server in a failover makes newcomers wait; the newest pool serves them") {
  Pool old_pool({0}, 4);
  old_pool.up->server(0).set_active(ActiveState::up, "role is master");
  old_pool.up->server(0).fence(FenceKind::failover, "10.0.0.9:5432", "a failover began");
  auto a = old_pool.waiter("a");
  long index = -1;
  // No server is eligible, but one is awaited: wait rather than be refused.
  CHECK(old_pool.enter(a, index) == WaitQueue::Outcome::waiting);
  old_pool.queue->serve(Clock::now());
  CHECK(a->grants == 0);
  // The new configuration's pool (the new master), sharing the queue.
  UpstreamConfig c;
  c.name = "pg";
  c.queue = 4;
  c.servers.push_back(test::server_config("10.0.0.9:5432"));
  std::shared_ptr<Upstream> fresh = test::make_upstream(c);
  fresh->set_queue(old_pool.queue);
  old_pool.queue->set_current(fresh);
  old_pool.queue->serve(Clock::now());
  CHECK(a->grants == 1);
  CHECK(a->pool == fresh);
  CHECK(fresh->server(0).active.load() == 1);
  CHECK(old_pool.queue->leave(*a, Clock::now(), false) == 0);
  fresh->release(0);
}

TEST_CASE("a server fenced for good, or a standby, is nothing to wait for") {
  Pool p({0}, 4);
  p.up->server(0).set_active(ActiveState::up, "role is primary");
  p.up->server(0).fence(FenceKind::lost, "10.0.0.9:5432", "timeline 2 > timeline 1");
  auto a = p.waiter("a");
  long index = -1;
  CHECK(p.enter(a, index) == WaitQueue::Outcome::none);
  p.up->server(0).unfence("no longer primary");
  p.up->server(0).set_active(ActiveState::standby, "role is standby, want primary");
  CHECK(p.enter(a, index) == WaitQueue::Outcome::none);
}
