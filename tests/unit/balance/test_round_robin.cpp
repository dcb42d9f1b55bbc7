#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "balance/round_robin.hpp"
#include "pool.hpp"

using namespace sluice;

namespace {

std::string run(Balancer& b, test::Pool& pool, int picks) {
  std::string seq;
  for (int i = 0; i < picks; ++i) seq += static_cast<char>('a' + b.choose(pool.c, ""));
  return seq;
}

}  // namespace

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
