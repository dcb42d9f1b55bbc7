#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "balance/random.hpp"
#include "pool.hpp"

using namespace sluice;

TEST_CASE("random: the less loaded of two choices wins") {
  test::Pool pool;
  pool.add("10.0.0.1:80").active = 10;
  pool.add("10.0.0.2:80").active = 0;
  RandomBalancer r(42);
  // With two candidates both are always drawn, so the idle one always wins.
  for (int i = 0; i < 100; ++i) CHECK(r.choose(pool.c, "") == 1);
}

TEST_CASE("random: idle servers share by weight, and a seed repeats its choices") {
  test::Pool pool;
  pool.add("10.0.0.1:80", 1);
  pool.add("10.0.0.2:80", 3);
  pool.add("10.0.0.3:80", 6);
  RandomBalancer r(1), same(1);
  std::array<int, 3> count{};
  bool repeats = true;
  for (int i = 0; i < 30000; ++i) {
    const auto c = r.choose(pool.c, "");
    repeats = repeats && c == same.choose(pool.c, "");
    ++count[c];
  }
  CHECK(repeats);
  // All idle: the first draw wins, so shares follow weight 1:3:6.
  CHECK(count[0] / 30000.0 == doctest::Approx(0.1).epsilon(0.15));
  CHECK(count[1] / 30000.0 == doctest::Approx(0.3).epsilon(0.05));
  CHECK(count[2] / 30000.0 == doctest::Approx(0.6).epsilon(0.05));
}

TEST_CASE("random: the Fenwick tree draws exactly what the scan draws") {
  // Two balancers with one seed, one answering from its tree, the other
  // scanning, through one random history of picks, releases, eligibility
  // and weight changes: they must agree pick for pick.
  std::mt19937 rng(11);
  std::vector<Candidate> c =
      test::random_candidates(rng, 50, [&] { return 1 + static_cast<std::uint32_t>(rng() % 300); });
  RandomBalancer indexed(99), scanned(99);
  indexed.reset(c);
  std::size_t picks = 0;
  std::size_t lone = 0;
  for (int step = 0; step < 20000; ++step) {
    const std::size_t i = rng() % c.size();
    switch (rng() % 6) {
      case 0:
      case 1: {
        const std::size_t a = indexed.choose_indexed("");
        REQUIRE(a == scanned.choose(c, ""));
        if (a == kNoCandidate) break;
        REQUIRE(c[a].eligible);
        ++picks;
        ++c[a].active;
        indexed.update(a, c[a]);
        break;
      }
      case 2:
        if (c[i].active > 0) --c[i].active;
        break;
      case 3:
        // Sometimes leave a single server, or none.
        c[i].eligible = rng() % 3 == 0 ? !c[i].eligible : rng() % 2 == 0;
        if (rng() % 500 == 0) {
          for (Candidate& x : c) x.eligible = false;
          c[i].eligible = rng() % 2 == 0;
          ++lone;
        }
        break;
      default:
        c[i].weight = 1 + static_cast<std::uint32_t>(rng() % 300);
        break;
    }
    for (std::size_t k = 0; k < c.size(); ++k) indexed.update(k, c[k]);
  }
  CHECK(picks > 5000);
  CHECK(lone > 0);
}
