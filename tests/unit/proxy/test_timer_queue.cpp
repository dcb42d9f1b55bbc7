#include "proxy/timer_queue.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

using sluice::TimerNode;
using sluice::TimerQueue;

namespace {

struct Probe {
  TimerNode node;
  int id = 0;
  std::vector<int>* fired = nullptr;
  TimerQueue* queue = nullptr;
  uv_loop_t* loop = nullptr;
  int rearm_now = 0;              // times to re-arm itself for "now" when fired
  Probe* cancel_other = nullptr;  // cancels this probe when fired
};

void on_fire(void* owner) {
  auto* p = static_cast<Probe*>(owner);
  CHECK_FALSE(p->node.queued());
  p->fired->push_back(p->id);
  if (p->rearm_now > 0) {
    --p->rearm_now;
    p->queue->arm(p->node, uv_now(p->loop));
  }
  if (p->cancel_other != nullptr) p->queue->cancel(p->cancel_other->node);
}

struct Fixture {
  uv_loop_t loop{};
  std::vector<int> fired;
  std::vector<Probe> probes;
  TimerQueue* queue = nullptr;

  explicit Fixture(std::size_t n) : probes(n) {
    uv_loop_init(&loop);
    queue = new TimerQueue(&loop, on_fire);
    for (std::size_t i = 0; i < n; ++i) {
      probes[i].id = static_cast<int>(i);
      probes[i].fired = &fired;
      probes[i].queue = queue;
      probes[i].loop = &loop;
      probes[i].node.owner = &probes[i];
    }
  }
  ~Fixture() {
    for (auto& p : probes) queue->cancel(p.node);
    queue->close();
    uv_run(&loop, UV_RUN_DEFAULT);
    delete queue;
    CHECK(uv_loop_close(&loop) == 0);
  }
  std::uint64_t now() { return uv_now(&loop); }
  // Arms probe i for t + after[i], in order.
  void arm_each(std::uint64_t t, std::initializer_list<std::uint64_t> after) {
    std::size_t i = 0;
    for (std::uint64_t a : after) queue->arm(probes[i++].node, t + a);
  }
  void run_until_empty() {
    while (queue->size() > 0) uv_run(&loop, UV_RUN_ONCE);
  }
  // The smallest due time of the queued probes (0 when none), as the heap
  // must report it.
  std::uint64_t min_due() const {
    std::uint64_t m = 0;
    for (const auto& p : probes) {
      if (p.node.queued() && (m == 0 || p.node.due < m)) m = p.node.due;
    }
    return m;
  }
};

}  // namespace

TEST_CASE("timer queue: the heap top is the earliest node; closing stops the timer") {
  Fixture f(4);
  const std::uint64_t t = f.now();
  f.arm_each(t, {30, 10, 20, 10});
  CHECK(f.queue->size() == 4);
  CHECK(f.queue->next_due() == t + 10);
  f.queue->close();
  // Closing stops the timer: nothing fires and the loop can end.
  uv_run(&f.loop, UV_RUN_DEFAULT);
  CHECK(f.fired.empty());
}

TEST_CASE("timer queue: a run fires every due node by due time") {
  Fixture f(4);
  const std::uint64_t t = f.now();
  f.arm_each(t, {30, 5, 20, 12});
  f.run_until_empty();
  CHECK(f.fired == std::vector<int>{1, 3, 2, 0});
  CHECK(f.now() >= t + 30);
}

TEST_CASE("timer queue: moving a node later or earlier, and cancelling it") {
  Fixture f(3);
  const std::uint64_t t = f.now();
  f.arm_each(t, {5, 10, 15});
  f.queue->arm(f.probes[0].node, t + 40);  // later
  f.queue->arm(f.probes[2].node, t + 1);   // earlier
  CHECK(f.queue->next_due() == t + 1);
  f.queue->cancel(f.probes[1].node);
  f.queue->cancel(f.probes[1].node);  // twice is a no-op
  CHECK_FALSE(f.probes[1].node.queued());
  CHECK(f.queue->size() == 2);
  f.run_until_empty();
  CHECK(f.fired == std::vector<int>{2, 0});
}

TEST_CASE("timer queue: a callback may cancel a node that is due in the same run") {
  Fixture f(2);
  const std::uint64_t t = f.now();
  f.arm_each(t, {0, 0});
  f.probes[0].cancel_other = &f.probes[1];
  f.probes[1].cancel_other = &f.probes[0];
  f.run_until_empty();
  CHECK(f.fired.size() == 1);
}

TEST_CASE("timer queue: a node that re-arms itself for now does not hold the loop") {
  Fixture f(1);
  f.probes[0].rearm_now = 1000;
  f.queue->arm(f.probes[0].node, f.now());
  // Each loop iteration returns; the re-armed node fires on later ones.
  int iterations = 0;
  while (f.queue->size() > 0 && iterations < 5000) {
    uv_run(&f.loop, UV_RUN_ONCE);
    ++iterations;
  }
  CHECK(f.fired.size() == 1001);
  CHECK(iterations > 1);
}

TEST_CASE("timer queue: random arms, moves and cancels keep the heap's minimum") {
  Fixture f(200);
  std::mt19937_64 rng(7);
  const std::uint64_t t = f.now() + 1000000;  // never due during the test
  for (int step = 0; step < 20000; ++step) {
    Probe& p = f.probes[rng() % f.probes.size()];
    if (rng() % 4 == 0) {
      f.queue->cancel(p.node);
    } else {
      f.queue->arm(p.node, t + rng() % 5000);
    }
    REQUIRE(f.queue->next_due() == f.min_due());
  }
  std::size_t queued = 0;
  for (const auto& p : f.probes) queued += p.node.queued() ? 1 : 0;
  CHECK(f.queue->size() == queued);
}
