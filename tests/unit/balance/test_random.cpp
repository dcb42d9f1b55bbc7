#include <doctest/doctest.h>

#include <array>

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
