// Upstream::pick answers from views and balancer indexes that it keeps
// current from notices, deadlines and ramps. These tests drive random
// histories and compare every pick with what a scan of every server's state,
// read at that moment, allows.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "balance/hash.hpp"
#include "fixture.hpp"
#include "upstream/upstream.hpp"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

// Quiet while the histories mark servers up and down thousands of times.
class QuietLog {
 public:
  QuietLog() : level_(spdlog::get_level()) { spdlog::set_level(spdlog::level::off); }
  ~QuietLog() { spdlog::set_level(level_); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  spdlog::level::level_enum level_;
};

std::string addr(std::size_t i) { return "10.0.0." + std::to_string(i + 1) + ":5432"; }

UpstreamConfig config_of(Balance balance, std::size_t n, std::mt19937& rng, bool slow_start) {
  UpstreamConfig c;
  c.name = "pg";
  c.balance = balance;
  c.max_fails = 1;
  c.fail_timeout = 10s;
  if (slow_start) {
    c.health.emplace();
    c.health->slow_start = 30s;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const bool backup = balance != Balance::hash && i % 7 == 6;
    const std::uint32_t max_conns = rng() % 4 == 0 ? 1 + rng() % 3 : 0;
    c.servers.push_back(test::server_config(addr(i), 1 + static_cast<std::uint32_t>(rng() % 3), max_conns, backup));
  }
  return c;
}

bool has_room(const Upstream& up, std::size_t i) {
  const std::uint32_t max = up.member(i).config.max_conns;
  return max == 0 || up.server(i).active.load() < max;
}

// least_conn by the book, from every server's state now: the members of the
// first tier with an eligible one that have the smallest active/weight.
std::vector<std::size_t> lightest(const Upstream& up, const TriedSet& tried, TimePoint now) {
  for (const bool backup : {false, true}) {
    std::vector<std::size_t> eligible;
    for (std::size_t i = 0; i < up.size(); ++i) {
      if (up.member(i).config.backup != backup || tried.contains(i)) continue;
      if (up.server(i).eligible(now) && has_room(up, i)) eligible.push_back(i);
    }
    if (eligible.empty()) continue;
    auto ratio_less = [&](std::size_t a, std::size_t b) {
      return std::uint64_t{up.server(a).active.load()} * up.effective_weight_centi(b, now) <
             std::uint64_t{up.server(b).active.load()} * up.effective_weight_centi(a, now);
    };
    const std::size_t best = *std::min_element(eligible.begin(), eligible.end(), ratio_less);
    std::vector<std::size_t> out;
    for (std::size_t i : eligible) {
      if (!ratio_less(best, i)) out.push_back(i);
    }
    return out;
  }
  return {};
}

// nginx's rule by the book: when no server is eligible and exactly one is
// enabled and not down by active checks, that one (passive health aside),
// if untried and not full.
std::vector<std::size_t> lone(const Upstream& up, const TriedSet& tried) {
  std::vector<std::size_t> usable;
  for (std::size_t i = 0; i < up.size(); ++i) {
    if (up.server(i).admin() == AdminState::enabled && up.server(i).active_state() != ActiveState::down) {
      usable.push_back(i);
    }
  }
  if (usable.size() != 1 || tried.contains(usable[0]) || !has_room(up, usable[0])) return {};
  return usable;
}

// hash by the book: a slot table built afresh over the servers up now
// (rebuilt only when the servers up or their weights changed, to keep the
// test quick), the rest of the balancer's copy updated.
class FreshHash {
 public:
  std::size_t pick(const Upstream& up, std::string_view key, TimePoint now) {
    std::vector<Candidate> c(up.size());
    for (std::size_t i = 0; i < up.size(); ++i) {
      c[i].seed = up.member(i).seed;
      c[i].weight = up.base_weight(i);
      c[i].active = up.server(i).active.load();
      c[i].up = up.server(i).eligible(now);
      c[i].eligible = c[i].up && has_room(up, i);
    }
    bool same_table = c.size() == last_.size();
    for (std::size_t i = 0; same_table && i < c.size(); ++i) {
      same_table = c[i].up == last_[i].up && c[i].weight == last_[i].weight;
    }
    if (same_table) {
      for (std::size_t i = 0; i < c.size(); ++i) balancer_.update(i, c[i]);
    } else {
      balancer_ = HashBalancer();
      balancer_.reset(c);
    }
    last_ = c;
    return balancer_.choose_indexed(key);
  }

 private:
  HashBalancer balancer_;
  std::vector<Candidate> last_;
};

// One random history over one upstream, or two sharing their servers (a
// reload in progress: either may pick and release).
void random_history(Balance balance, bool two_pools, bool slow_start, std::uint32_t seed, int steps = 6000) {
  QuietLog quiet;
  std::mt19937 rng(seed);
  const UpstreamConfig config = config_of(balance, 24, rng, slow_start);
  std::vector<std::shared_ptr<ServerState>> states;
  for (const ServerConfig& s : config.servers) {
    states.push_back(std::make_shared<ServerState>(config.name, s.address, config.max_fails, config.fail_timeout));
  }
  if (slow_start) {
    for (auto& s : states) s->set_active(ActiveState::up, "ok");
  }
  std::vector<std::unique_ptr<Upstream>> pools;
  pools.push_back(std::make_unique<Upstream>(config, states, seed));
  if (two_pools) pools.push_back(std::make_unique<Upstream>(config, states, seed + 1));
  const Upstream& ref = *pools[0];

  TimePoint now = Clock::now();
  struct Held {
    std::size_t pool;
    std::size_t index;
  };
  std::vector<Held> held;
  FreshHash fresh;
  std::size_t picks = 0;
  std::size_t none = 0;
  for (int step = 0; step < steps; ++step) {
    const std::uint32_t op = rng() % 100;
    const std::size_t i = rng() % states.size();
    ServerState& s = *states[i];
    if (op < 45) {
      const std::size_t p = rng() % pools.size();
      TriedSet tried;
      if (rng() % 8 == 0) tried.add(rng() % states.size());
      const std::string key = "client-" + std::to_string(rng() % 500);
      std::vector<std::size_t> allowed;
      if (balance == Balance::least_conn) {
        allowed = lightest(ref, tried, now);
      } else if (tried.empty()) {
        const std::size_t h = fresh.pick(ref, key, now);
        if (h != kNoCandidate) allowed.push_back(h);
      }
      if (allowed.empty() && (balance == Balance::least_conn || tried.empty())) allowed = lone(ref, tried);
      const long got = pools[p]->pick(tried, key, now);
      if (balance == Balance::least_conn || tried.empty()) {
        if (allowed.empty()) {
          REQUIRE(got == -1);
        } else {
          REQUIRE(got >= 0);
          REQUIRE(std::find(allowed.begin(), allowed.end(), static_cast<std::size_t>(got)) != allowed.end());
        }
      }
      if (got < 0) {
        ++none;
        continue;
      }
      ++picks;
      held.push_back({p, static_cast<std::size_t>(got)});
      // The connect's outcome: mostly fine, sometimes refused.
      const std::uint32_t outcome = rng() % 10;
      if (outcome < 8) {
        states[static_cast<std::size_t>(got)]->report(ConnectResult::connected, "", now);
      } else if (outcome < 9) {
        states[static_cast<std::size_t>(got)]->report(ConnectResult::failed, "connection refused", now);
      }
    } else if (op < 85) {
      if (held.empty()) continue;
      const std::size_t h = rng() % held.size();
      pools[held[h].pool]->release(held[h].index);
      held[h] = held.back();
      held.pop_back();
    } else if (op < 88) {
      s.set_admin(s.admin() == AdminState::enabled ? AdminState::drain : AdminState::enabled);
    } else if (op < 91) {
      s.set_active(s.active_state() == ActiveState::down ? ActiveState::up : ActiveState::down, "check");
    } else if (op < 93) {
      if (rng() % 2 == 0) {
        s.set_weight_override(1 + rng() % 5, ref.member(i).config.weight);
      } else {
        s.clear_weight_override();
      }
    } else {
      now += std::chrono::milliseconds(rng() % 3000);
    }
  }
  CHECK(picks > static_cast<std::size_t>(steps) / 6);
  CHECK(none > 0);  // the histories reach "nothing eligible" too
  for (const Held& h : held) pools[h.pool]->release(h.index);
  for (const auto& s : states) CHECK(s->active.load() == 0);
}

}  // namespace

TEST_CASE("Upstream::pick (least_conn) picks a lightest eligible server, as a scan of every state would") {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) random_history(Balance::least_conn, false, false, seed);
}

TEST_CASE("Upstream::pick (least_conn) stays exact while two pools share the servers") {
  for (std::uint32_t seed = 11; seed <= 14; ++seed) random_history(Balance::least_conn, true, false, seed);
}

TEST_CASE("Upstream::pick (least_conn) stays exact while slow start ramps weights") {
  for (std::uint32_t seed = 21; seed <= 23; ++seed) random_history(Balance::least_conn, seed % 2 == 0, true, seed);
}

TEST_CASE("Upstream::pick (hash) matches a slot table built afresh from every state") {
  // Each change of the servers up rebuilds two tables of 65536 slots here:
  // shorter histories.
  for (std::uint32_t seed = 31; seed <= 34; ++seed) random_history(Balance::hash, seed % 2 == 0, false, seed, 1500);
}

TEST_CASE("Upstream: a release through the previous configuration's pool counts at once in the new one") {
  UpstreamConfig c;
  c.name = "pg";
  c.servers = {test::server_config("10.0.0.1:5432"), test::server_config("10.0.0.2:5432")};
  std::vector<std::shared_ptr<ServerState>> states;
  for (const ServerConfig& s : c.servers) states.push_back(std::make_shared<ServerState>("pg", s.address, 1, 10s));
  Upstream old_pool(c, states, 1);
  Upstream new_pool(c, states, 2);
  const TriedSet none;
  const TimePoint now = Clock::now();
  for (int i = 0; i < 4; ++i) old_pool.pick(none, "", now);
  REQUIRE(states[0]->active == 2);
  REQUIRE(states[1]->active == 2);
  old_pool.release(0);
  old_pool.release(0);
  CHECK(new_pool.pick(none, "", now) == 0);  // 0 against 2
  CHECK(new_pool.pick(none, "", now) == 0);  // 1 against 2
  // And a pick through the old pool counts in the new one too.
  std::vector<TriedSet> tried(1);
  tried[0].add(0);
  CHECK(old_pool.pick(tried[0], "", now) == 1);  // 2 against 3
  CHECK(new_pool.pick(none, "", now) == 0);       // 3 against 2
  CHECK(states[0]->active == 3);
  CHECK(states[1]->active == 3);
}

TEST_CASE("Upstream::pick from many threads over two pools: counts stay exact") {
  UpstreamConfig c;
  c.name = "pg";
  for (std::size_t i = 0; i < 16; ++i) c.servers.push_back(test::server_config(addr(i), 1 + i % 3));
  std::vector<std::shared_ptr<ServerState>> states;
  for (const ServerConfig& s : c.servers) states.push_back(std::make_shared<ServerState>("pg", s.address, 1, 10s));
  Upstream a(c, states, 1);
  Upstream b(c, states, 2);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> picked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Upstream& up = t % 2 == 0 ? a : b;
      const TriedSet none;
      std::vector<std::size_t> held;
      for (int i = 0; i < 20000; ++i) {
        const long p = up.pick(none, "", Clock::now());
        if (p >= 0) {
          held.push_back(static_cast<std::size_t>(p));
          picked.fetch_add(1);
        }
        if (held.size() > 8 || (p < 0 && !held.empty())) {
          up.release(held.front());
          held.erase(held.begin());
        }
      }
      for (std::size_t h : held) up.release(h);
    });
  }
  // Meanwhile the control loop drains and re-enables servers.
  std::thread control([&] {
    QuietLog quiet;
    std::mt19937 rng(5);
    while (!stop.load()) {
      ServerState& s = *states[rng() % states.size()];
      s.set_admin(s.admin() == AdminState::enabled ? AdminState::drain : AdminState::enabled);
      std::this_thread::yield();
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  control.join();
  std::uint64_t sessions = 0;
  for (const auto& s : states) {
    CHECK(s->active.load() == 0);
    sessions += s->total_sessions.load();
  }
  CHECK(sessions == picked.load());
  CHECK(picked.load() > 0);
}
