#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "balance/round_robin.hpp"
#include "pool.hpp"

using namespace sluice;

TEST_CASE("round_robin: equal weights alternate") {
  test::Pool pool;
  pool.add("10.0.0.1:80");
  pool.add("10.0.0.2:80");
  RoundRobinBalancer rr;
  const std::string seq = run(rr, pool, 12);
  CHECK(seq == "abababababab");
}

TEST_CASE("round_robin: weights 2:1 give nginx's smooth sequence") {
  test::Pool pool;
  pool.add("10.0.0.1:80", 2);
  pool.add("10.0.0.2:80", 1);
  RoundRobinBalancer rr;
  const std::string seq = run(rr, pool, 12);
  CHECK(seq == "abaabaabaaba");
  CHECK(std::count(seq.begin(), seq.end(), 'a') == 8);
  CHECK(std::count(seq.begin(), seq.end(), 'b') == 4);
}

TEST_CASE("round_robin: weights 5:1:1 are spread, not bunched") {
  // nginx's documented example: a a b a c a a (never five a's in a row).
  test::Pool pool;
  pool.add("10.0.0.1:80", 5);
  pool.add("10.0.0.2:80", 1);
  pool.add("10.0.0.3:80", 1);
  RoundRobinBalancer rr;
  CHECK(run(rr, pool, 7) == "aabacaa");
}

TEST_CASE("round_robin: only candidates are chosen") {
  test::Pool pool;
  pool.add("10.0.0.1:80");
  pool.add("10.0.0.2:80");
  pool.add("10.0.0.3:80");
  RoundRobinBalancer rr;
  pool.only({0, 2});
  std::string seq;
  for (int i = 0; i < 6; ++i) seq += static_cast<char>('a' + rr.choose(pool.c, ""));
  CHECK(seq == "acacac");
}

namespace {

// Two balancers, one answering from its heaps and one scanning, through one
// random history of picks, eligibility and weight changes: the same nginx
// sequence, pick for pick.
void round_robin_agrees_on_random_history(std::int64_t rebase_at, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto some_weight = [&] {
    return rng() % 4 == 0 ? 1 + static_cast<std::uint32_t>(rng() % 500) : 100 * (1 + static_cast<std::uint32_t>(rng() % 3));
  };
  std::vector<Candidate> c = test::random_candidates(rng, 60, some_weight);
  RoundRobinBalancer indexed(rebase_at);
  RoundRobinBalancer scanned(rebase_at);
  indexed.reset(c);
  std::size_t picks = 0;
  for (int step = 0; step < 20000; ++step) {
    const std::size_t i = rng() % c.size();
    const std::uint32_t op = rng() % 20;
    if (op < 16) {
      const std::size_t a = indexed.choose_indexed("");
      REQUIRE(a == scanned.choose(c, ""));
      picks += a == kNoCandidate ? 0 : 1;
      continue;
    }
    if (op < 18) {
      c[i].eligible = !c[i].eligible;
    } else if (op < 19) {
      c[i].weight = some_weight();
    } else {
      // A retry: a scan over the pool less a few servers picks for both, and
      // the heaps must follow what it did.
      std::vector<Candidate> retry = c;
      for (Candidate& x : retry) x.eligible = x.eligible && rng() % 8 != 0;
      REQUIRE(indexed.choose(retry, "") == scanned.choose(retry, ""));
      continue;
    }
    indexed.update(i, c[i]);
  }
  CHECK(picks > 10000);
}

}  // namespace

TEST_CASE("round_robin: the heaps give the scan's sequence exactly") {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) round_robin_agrees_on_random_history(RoundRobinBalancer::kRebaseAt, seed);
}

TEST_CASE("round_robin: folding the rounds into the values changes nothing") {
  for (std::uint32_t seed = 5; seed <= 7; ++seed) round_robin_agrees_on_random_history(7, seed);
}
