#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "balance/least_conn.hpp"
#include "pool.hpp"

using namespace sluice;

namespace {

char name(std::size_t i) { return static_cast<char>('a' + i); }

}  // namespace

TEST_CASE("least_conn: the least loaded server wins") {
  test::Pool pool;
  pool.add("10.0.0.1:5432").active = 3;
  pool.add("10.0.0.2:5432").active = 1;
  pool.add("10.0.0.3:5432").active = 2;
  LeastConnBalancer lc;
  CHECK(run(lc, pool, 3) == "bbb");  // actives are not changed by choose()
}

TEST_CASE("least_conn: equal load falls back to smooth weighted round-robin") {
  SUBCASE("equal weights rotate") {
    test::Pool pool;
    pool.add("10.0.0.1:5432");
    pool.add("10.0.0.2:5432");
    pool.add("10.0.0.3:5432");
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abcabc");
  }
  SUBCASE("weights 2:1 with no connections") {
    test::Pool pool;
    pool.add("10.0.0.1:5432", 2);
    pool.add("10.0.0.2:5432", 1);
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abaaba");
  }
  SUBCASE("weights 2:1 with actives 2 and 1 are a tie (2/2 == 1/1)") {
    test::Pool pool;
    pool.add("10.0.0.1:5432", 2).active = 2;
    pool.add("10.0.0.2:5432", 1).active = 1;
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 6) == "abaaba");
  }
  SUBCASE("only the tied servers take part in the round-robin") {
    test::Pool pool;
    pool.add("10.0.0.1:5432").active = 1;
    pool.add("10.0.0.2:5432").active = 5;
    pool.add("10.0.0.3:5432").active = 1;
    LeastConnBalancer lc;
    CHECK(run(lc, pool, 4) == "acac");
  }
}

TEST_CASE("least_conn: active is compared relative to weight") {
  test::Pool pool;
  Candidate& a = pool.add("10.0.0.1:5432", 2);
  Candidate& b = pool.add("10.0.0.2:5432", 1);
  LeastConnBalancer lc;
  a.active = 3;  // 1.5 per weight unit
  b.active = 1;  // 1.0
  CHECK(lc.choose(pool.c, "") == 1);
  a.active = 1;  // 0.5
  CHECK(lc.choose(pool.c, "") == 0);
  a.active = 5;  // 2.5
  b.active = 2;  // 2.0
  CHECK(lc.choose(pool.c, "") == 1);
}

namespace {

// active/weight of the lightest eligible candidate, as a fraction (a, w).
bool lightest(const std::vector<Candidate>& c, std::size_t chosen) {
  for (const Candidate& x : c) {
    if (!x.eligible) continue;
    if (std::uint64_t{x.active} * c[chosen].weight < std::uint64_t{c[chosen].active} * x.weight) return false;
  }
  return c[chosen].eligible;
}

// Drives two balancers through one random history of picks, releases,
// eligibility and weight changes: `indexed` answers from its heap, `scanned`
// (updated the same way) from a scan of the span. They share the tie rule,
// so they must agree pick for pick, and every pick must be a lightest one.
void least_conn_agrees_on_random_history(std::uint64_t rebase_at, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto some_weight = [&] { return 100 * (1 + static_cast<std::uint32_t>(rng() % 4)); };
  std::vector<Candidate> c = test::random_candidates(rng, 40, some_weight);
  LeastConnBalancer indexed(rebase_at);
  LeastConnBalancer scanned(rebase_at);
  indexed.reset(c);
  scanned.reset(c);
  auto set = [&](std::size_t i) {
    indexed.update(i, c[i]);
    scanned.update(i, c[i]);
  };
  std::vector<std::size_t> held;  // one entry per open session
  std::size_t picks = 0;
  std::size_t ties = 0;
  for (int step = 0; step < 20000; ++step) {
    const std::uint32_t op = rng() % 20;
    if (op < 9) {
      const std::size_t a = indexed.choose_indexed("");
      const std::size_t b = scanned.choose(c, "");
      REQUIRE(a == b);
      if (a == kNoCandidate) continue;
      REQUIRE(lightest(c, a));
      std::size_t equal = 0;
      for (const Candidate& x : c) {
        if (x.eligible && std::uint64_t{x.active} * c[a].weight == std::uint64_t{c[a].active} * x.weight) ++equal;
      }
      ties += equal > 1 ? 1 : 0;
      ++picks;
      ++c[a].active;
      set(a);
      held.push_back(a);
    } else if (op < 18) {
      if (held.empty()) continue;
      const std::size_t h = rng() % held.size();
      const std::size_t i = held[h];
      held[h] = held.back();
      held.pop_back();
      --c[i].active;
      set(i);
    } else if (op < 19) {
      const std::size_t i = rng() % c.size();
      c[i].eligible = !c[i].eligible;
      set(i);
    } else {
      const std::size_t i = rng() % c.size();
      c[i].weight = rng() % 8 == 0 ? 10 + static_cast<std::uint32_t>(rng() % 400) : some_weight();
      set(i);
    }
  }
  CHECK(picks > 7000);
  CHECK(ties > 2000);  // the rotation was exercised, not only clear winners
}

}  // namespace

TEST_CASE("least_conn: the heap picks exactly what a scan picks") {
  for (std::uint32_t seed = 1; seed <= 5; ++seed) least_conn_agrees_on_random_history(LeastConnBalancer::kRebaseAt, seed);
}

TEST_CASE("least_conn: rebasing the tags keeps the heap and the scan in step") {
  // A tie advances a tag by at least 1024 (weight 100 000) and at most about
  // 10^7 (weight 10): rebases every few picks here.
  for (std::uint32_t seed = 1; seed <= 3; ++seed) least_conn_agrees_on_random_history(50'000'000, seed);
}

TEST_CASE("least_conn: short connections to idle servers are shared by weight") {
  // Every connection ends before the next starts: all picks are ties, and
  // only the rotation decides.
  std::vector<Candidate> c(4);
  const std::uint32_t weights[] = {100, 200, 300, 400};
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i].weight = weights[i];
    c[i].eligible = true;
  }
  LeastConnBalancer lc;
  lc.reset(c);
  std::vector<int> count(c.size());
  std::string first;
  for (int n = 0; n < 10000; ++n) {
    const std::size_t k = lc.choose_indexed("");
    ++count[k];
    if (n < 10) first += name(k);
    ++c[k].active;
    lc.update(k, c[k]);
    --c[k].active;
    lc.update(k, c[k]);
  }
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(count[i] == doctest::Approx(1000 * (i + 1)).epsilon(0.002));
  CHECK(first == "abcddcbdcd");  // spread out, not bunched
}

TEST_CASE("least_conn: time spent busy or out of the pool earns no burst") {
  std::vector<Candidate> c(3);
  for (Candidate& x : c) {
    x.weight = 100;
    x.eligible = true;
  }
  LeastConnBalancer lc;
  lc.reset(c);
  auto short_connection = [&] {
    const std::size_t k = lc.choose_indexed("");
    ++c[k].active;
    lc.update(k, c[k]);
    --c[k].active;
    lc.update(k, c[k]);
    return k;
  };
  SUBCASE("out of the pool") {
    c[2].eligible = false;
    lc.update(2, c[2]);
    for (int n = 0; n < 1000; ++n) CHECK(short_connection() != 2);
    c[2].eligible = true;
    lc.update(2, c[2]);
  }
  SUBCASE("busy with a long session") {
    c[2].active = 1;
    lc.update(2, c[2]);
    for (int n = 0; n < 1000; ++n) CHECK(short_connection() != 2);
    c[2].active = 0;
    lc.update(2, c[2]);
  }
  // Back: it takes its turn in the rotation, not the next thousand picks.
  std::vector<int> count(3);
  for (int n = 0; n < 30; ++n) ++count[short_connection()];
  CHECK(count[2] >= 9);
  CHECK(count[2] <= 11);
}
