// The slot table (balance/slot_table.hpp) and hash's first choice built on it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "balance/hash.hpp"
#include "balance/slot_table.hpp"
#include "pool.hpp"

using namespace sluice;

namespace {

constexpr std::uint32_t M = SlotTable::kSlots;

std::string addr(std::size_t i) {
  return "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":6379";
}

std::vector<SlotTable::Server> servers(std::size_t n, const std::vector<std::uint32_t>& weights = {}) {
  std::vector<SlotTable::Server> s(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = {rendezvous_server_seed(addr(i)), weights.empty() ? 1 : weights[i], true};
  return s;
}

// The slot's best server up, by asking every server: what the table must hold.
std::uint32_t best_by_asking_all(const std::vector<SlotTable::Server>& s, std::uint32_t slot) {
  std::uint32_t best = SlotTable::kNone;
  std::uint32_t best_rank = 0;
  for (std::uint32_t i = 0; i < s.size(); ++i) {
    if (!s[i].up) continue;
    const std::uint32_t r = SlotTable::rank_at(s[i].seed, slot);
    if (best == SlotTable::kNone ||
        SlotTable::beats(s[i].seed, s[i].weight, r, i, s[best].seed, s[best].weight, best_rank, best)) {
      best = i;
      best_rank = r;
    }
  }
  return best;
}

// Slots of the table that differ from asking every server.
std::size_t wrong_slots(const SlotTable& t, const std::vector<SlotTable::Server>& s) {
  std::size_t wrong = 0;
  for (std::uint32_t slot = 0; slot < M; ++slot) wrong += t.owner(slot) != best_by_asking_all(s, slot) ? 1 : 0;
  return wrong;
}

std::vector<std::size_t> shares(const SlotTable& t, std::size_t n) {
  std::vector<std::size_t> count(n);
  for (std::uint32_t slot = 0; slot < M; ++slot) ++count[t.owner(slot)];
  return count;
}

test::Pool up_pool(std::size_t n) {
  test::Pool p;
  for (std::size_t i = 0; i < n; ++i) p.add(addr(i)).up = true;
  return p;
}

}  // namespace

TEST_CASE("slot table: a server's ranks are a permutation of the slots, and slot_at inverts it") {
  for (const std::uint64_t seed : std::vector<std::uint64_t>{0, 1, rendezvous_server_seed("10.0.0.1:5432"), ~0ULL}) {
    std::vector<bool> seen(M);
    std::size_t bad = 0;
    for (std::uint32_t slot = 0; slot < M; ++slot) {
      const std::uint32_t r = SlotTable::rank_at(seed, slot);
      REQUIRE(r < M);
      bad += seen[r] || SlotTable::slot_at(seed, r) != slot ? 1 : 0;
      seen[r] = true;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("slot table: the score is weight / -ln((rank + 0.5) / slots), rising with the rank") {
  for (const std::uint32_t r : {0U, 1U, 12345U, M - 2, M - 1}) {
    const double u = (r + 0.5) / M;
    CHECK(SlotTable::score(r, 3) == doctest::Approx(3.0 / -std::log(u)).epsilon(1e-12));
  }
  // Strictly: for one weight, comparing ranks is comparing scores.
  std::size_t not_rising = 0;
  for (const std::uint32_t w : {1U, 7U, 1000U}) {
    for (std::uint32_t r = 1; r < M; ++r) not_rising += SlotTable::score(r, w) > SlotTable::score(r - 1, w) ? 0 : 1;
  }
  CHECK(not_rising == 0);
}

TEST_CASE("slot table: every slot's owner is its best server up, however the table was reached") {
  std::mt19937 rng(5);
  // Sizes on both sides of the two ways of filling slots (each slot asked
  // of every server; walking the ranks down from the top), weights equal,
  // few and many.
  for (const std::size_t n : {1UL, 2UL, 5UL, 40UL, 300UL}) {
    for (int weights = 0; weights < 3; ++weights) {
      CAPTURE(n);
      CAPTURE(weights);
      std::vector<std::uint32_t> w(n, 1);
      for (auto& x : w) x = weights == 0 ? 1 : weights == 1 ? 1 + rng() % 3 : 1 + rng() % 1000;
      auto s = servers(n, w);
      for (auto& x : s) x.up = rng() % 8 != 0;
      SlotTable t;
      t.assign(s);
      CHECK(wrong_slots(t, s) == 0);
      // Changes, then the whole table again (a changed server's slots are
      // not enough: a wrong slot elsewhere must show too).
      for (int step = 0; step < 6; ++step) {
        const std::size_t j = rng() % n;
        if (step % 3 == 2) {
          s[j].weight = weights == 0 ? 1 + static_cast<std::uint32_t>(step) : 1 + rng() % 1000;
        } else {
          s[j].up = !s[j].up;
        }
        t.set(j, s[j]);
      }
      CHECK(wrong_slots(t, s) == 0);
    }
  }
}

TEST_CASE("slot table: no server up, no owner; the first one up owns every slot") {
  auto s = servers(3);
  for (auto& x : s) x.up = false;
  SlotTable t;
  t.assign(s);
  CHECK(t.owner(0) == SlotTable::kNone);
  CHECK(t.owner(M - 1) == SlotTable::kNone);
  s[1].up = true;
  t.set(1, s[1]);
  CHECK(shares(t, 3) == std::vector<std::size_t>{0, M, 0});
  s[1].up = false;
  t.set(1, s[1]);
  CHECK(t.owner(17) == SlotTable::kNone);
  CHECK(SlotTable().owner(0) == SlotTable::kNone);
}

TEST_CASE("slot table: equal servers own about equal shares") {
  // Each server wins a slot with probability 1/n; a server's ranks are a
  // permutation, which makes the shares a little closer than independent
  // draws would (binomial standard deviation: 1.2 % at 10 servers, 12 % at
  // 1 000).
  for (const std::size_t n : {2UL, 10UL, 100UL, 1000UL}) {
    SlotTable t;
    t.assign(servers(n));
    const auto count = shares(t, n);
    const double mean = static_cast<double>(M) / static_cast<double>(n);
    double var = 0;
    for (const std::size_t c : count) var += (static_cast<double>(c) - mean) * (static_cast<double>(c) - mean);
    const double sd = std::sqrt(var / static_cast<double>(n)) / mean;
    const double hi = static_cast<double>(*std::max_element(count.begin(), count.end())) / mean;
    const double lo = static_cast<double>(*std::min_element(count.begin(), count.end())) / mean;
    MESSAGE(n << " equal servers: share / mean from " << lo << " to " << hi << ", standard deviation " << sd * 100
              << " %");
    const double binomial = std::sqrt((1.0 - 1.0 / static_cast<double>(n)) / mean);
    CHECK(sd <= binomial * 1.2);
    CHECK(hi <= 1.0 + 5 * binomial);
    CHECK(lo >= 1.0 - 5 * binomial);
  }
}

TEST_CASE("slot table: shares follow the weights") {
  const std::vector<std::uint32_t> w = {1, 2, 3, 4, 5, 1, 2, 3, 10, 20};
  SlotTable t;
  t.assign(servers(w.size(), w));
  const auto count = shares(t, w.size());
  double total = 0;
  for (const auto x : w) total += x;
  double worst = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double ratio = static_cast<double>(count[i]) / M / (w[i] / total);
    worst = std::max(worst, std::abs(ratio - 1));
  }
  MESSAGE("weights 1,2,3,4,5,1,2,3,10,20: share / weight's share within " << worst * 100 << " %");
  CHECK(worst < 0.05);

  // A wide spread: one server of weight 1000 among 99 of weight 1.
  std::vector<std::uint32_t> wide(100, 1);
  wide[42] = 1000;
  t.assign(servers(100, wide));
  const auto c = shares(t, 100);
  CHECK(static_cast<double>(c[42]) / M == doctest::Approx(1000.0 / 1099).epsilon(0.01));
  const double light = static_cast<double>(M - c[42]) / 99 / M;
  CHECK(light == doctest::Approx(1.0 / 1099).epsilon(0.1));
}

TEST_CASE("slot table: the list's order does not matter") {
  std::vector<std::uint32_t> w(50);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = 1 + static_cast<std::uint32_t>(i % 4);
  auto s = servers(50, w);
  SlotTable a;
  a.assign(s);
  std::vector<std::size_t> order(s.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<SlotTable::Server> listed;
  for (const std::size_t i : order) listed.push_back(s[i]);
  SlotTable b;
  b.assign(listed);
  std::size_t differ = 0;
  for (std::uint32_t slot = 0; slot < M; ++slot) differ += order[b.owner(slot)] != a.owner(slot) ? 1 : 0;
  CHECK(differ == 0);
}

TEST_CASE("slot table: a fixed server list gives a fixed table in every process") {
  // Pinned: a change here moves keys across a rolling upgrade.
  const std::vector<std::string> texts = {"10.0.1.1:443", "10.0.1.2:443", "10.0.1.3:443", "10.0.1.4:443"};
  std::vector<SlotTable::Server> s;
  for (const auto& x : texts) s.push_back({rendezvous_server_seed(x), 1, true});
  SlotTable t;
  t.assign(s);
  std::vector<std::string> first;
  for (std::uint32_t slot = 0; slot < 8; ++slot) first.push_back(texts[t.owner(slot)]);
  CHECK(first == std::vector<std::string>{"10.0.1.1:443", "10.0.1.1:443", "10.0.1.3:443", "10.0.1.3:443",
                                          "10.0.1.3:443", "10.0.1.1:443", "10.0.1.3:443", "10.0.1.4:443"});
  CHECK(SlotTable::rank_at(s[0].seed, 0) == 54312);
  CHECK(SlotTable::slot_at(s[0].seed, 54312) == 0);
  CHECK(hash_slot("db.example.com") == 32887);
  test::Pool pool;
  for (const auto& x : texts) pool.add(x).up = true;
  HashBalancer h;
  h.reset(pool.c);
  CHECK(h.choose_indexed("db.example.com") == 2);
  CHECK(h.choose_indexed("") == 3);
  CHECK(h.choose_indexed("10.1.2.3") == 3);
}

TEST_CASE("hash: the scan and the table agree when every server is up and has room") {
  const auto keys = test::client_keys(20000);
  test::Pool pool = up_pool(37);
  for (std::size_t i = 0; i < 37; ++i) pool[i].weight = 1 + static_cast<std::uint32_t>(i % 5);
  HashBalancer h;
  h.reset(pool.c);
  std::size_t differ = 0;
  for (const auto& k : keys) {
    const std::size_t first = h.choose_indexed(k);
    differ += first != h.choose(pool.c, k) || first != rendezvous_rank(pool.c, k)[0] ? 1 : 0;
  }
  CHECK(differ == 0);
}

TEST_CASE("hash: a full server keeps its keys; its connections go to the slot's next ranked server") {
  test::Pool pool = up_pool(8);
  HashBalancer h;
  h.reset(pool.c);
  const auto keys = test::client_keys(2000);
  std::vector<std::size_t> first;
  for (const auto& k : keys) first.push_back(h.choose_indexed(k));
  const std::size_t full = first[0];
  pool[full].eligible = false;  // at max_conns: still up
  h.update(full, pool[full]);
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const std::size_t got = h.choose_indexed(keys[k]);
    if (first[k] != full) {
      wrong += got != first[k] ? 1 : 0;
    } else {
      const auto rank = rendezvous_rank(pool.c, keys[k]);
      REQUIRE(rank[0] == full);
      wrong += got != rank[1] ? 1 : 0;
    }
  }
  CHECK(wrong == 0);
  for (std::uint32_t slot = 0; slot < M; ++slot) {
    if (h.table().owner(slot) == full) return;  // still owns slots
  }
  FAIL("the full server lost its slots");
}

TEST_CASE("hash: bounded load applies to the first choice too") {
  test::Pool pool = up_pool(4);
  HashBalancer h(1.25);
  h.reset(pool.c);
  const std::string key = "10.1.2.3";
  const std::size_t first = h.choose_indexed(key);
  // total 7, bound ceil(1.25 * 8 / 4) = 3: the first choice (4 + 1) is over it.
  pool[first].active = 4;
  h.update(first, pool[first]);
  const std::size_t other = (first + 1) % 4;
  pool[other].active = 3;
  h.update(other, pool[other]);
  const std::size_t got = h.choose_indexed(key);
  const auto rank = rendezvous_rank(pool.c, key);
  REQUIRE(rank[0] == first);
  std::size_t expected = kNoCandidate;
  for (std::size_t i : rank) {
    if (pool[i].active + 1 <= 3) {
      expected = i;
      break;
    }
  }
  REQUIRE(expected != kNoCandidate);
  CHECK(got == expected);
  // Back under the bound: the first choice again.
  pool[first].active = 1;
  h.update(first, pool[first]);
  CHECK(h.choose_indexed(key) == first);
}
