// CloseSpread: when each of n sessions closed together closes.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include "net/close_spread.hpp"

using sluice::CloseSpread;

namespace {

std::vector<std::uint64_t> offsets(std::uint64_t n, std::uint64_t window_ms, std::uint64_t seed) {
  CloseSpread s(n, window_ms, seed);
  std::vector<std::uint64_t> out;
  for (std::uint64_t i = 0; i < n; ++i) out.push_back(s.next());
  return out;
}

}  // namespace

TEST_CASE("a thousand sessions over 5 s: every second gets its fifth, none at or after the end") {
  const auto at = offsets(1000, 5000, 42);
  std::vector<int> per_second(5, 0);
  for (std::uint64_t ms : at) {
    REQUIRE(ms < 5000);
    ++per_second[ms / 1000];
  }
  for (int n : per_second) CHECK(n == 200);
  CHECK(std::is_sorted(at.begin(), at.end()));
  // Within each slice the moment is random, not a grid.
  std::vector<std::uint64_t> in_slice;
  for (std::size_t i = 0; i < at.size(); ++i) in_slice.push_back(at[i] - i * 5);
  std::sort(in_slice.begin(), in_slice.end());
  CHECK(std::unique(in_slice.begin(), in_slice.end()) - in_slice.begin() == 5);
}

TEST_CASE("two workers with their own seeds do not close on the same grid") {
  const auto a = offsets(100, 10000, 1);
  const auto b = offsets(100, 10000, 2);
  int same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  CHECK(same < 10);
}

TEST_CASE("a window of 0 closes at once; more sessions than milliseconds stay inside the window") {
  for (std::uint64_t ms : offsets(10, 0, 7)) CHECK(ms == 0);
  const auto dense = offsets(10000, 5, 7);
  for (std::uint64_t ms : dense) CHECK(ms < 5);
  std::vector<int> per_ms(5, 0);
  for (std::uint64_t ms : dense) ++per_ms[ms];
  for (int n : per_ms) CHECK(n == 2000);
  const auto one = offsets(1, 3000, 9);
  CHECK(one[0] < 3000);
  // A huge window cannot overflow the slice arithmetic.
  CloseSpread big(3, UINT64_MAX / 2, 5);
  for (int i = 0; i < 3; ++i) CHECK(big.next() < UINT64_MAX / 2);
}
