#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>

#include "balance/hash.hpp"
#include "pool.hpp"

using namespace sluice;

namespace {

std::string addr(int i) { return "10.0.0." + std::to_string(i) + ":6379"; }

test::Pool pool_of(const std::vector<std::string>& addrs) {
  test::Pool p;
  for (const auto& a : addrs) p.add(a);
  return p;
}

// The address text that owns each key (by text, so pools in any order compare).
std::vector<std::string> owners(test::Pool& pool, const std::vector<std::string>& keys) {
  HashBalancer h;
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(pool.text(h.choose(pool.c, k)));
  return out;
}

std::vector<std::string> ten_addrs() {
  std::vector<std::string> a;
  for (int i = 1; i <= 10; ++i) a.push_back(addr(i));
  return a;
}

const std::vector<std::string>& keys_100k() {
  static const std::vector<std::string> keys = test::client_keys(100000);
  return keys;
}

}  // namespace

TEST_CASE("hash: the score follows the documented formula") {
  const std::string key = "db.example.com";
  const std::string server = "10.0.0.1:5432";
  const std::uint64_t seed = XXH3_64bits(server.data(), server.size());
  CHECK(rendezvous_server_seed(server) == seed);
  const std::uint32_t slot = hash_slot(key);
  CHECK(slot == XXH3_64bits(key.data(), key.size()) % SlotTable::kSlots);
  const std::uint32_t rank = SlotTable::rank_at(seed, slot);
  const double u = (rank + 0.5) / SlotTable::kSlots;
  CHECK(rendezvous_score(key, seed, 3) == doctest::Approx(3.0 / -std::log(u)).epsilon(1e-12));
  CHECK(rendezvous_score(key, seed, 2) == doctest::Approx(2.0 / 3.0 * rendezvous_score(key, seed, 3)));
  // Keys in the same slot score alike: the slot is all that counts.
  std::string other;
  for (int i = 0; other.empty(); ++i) {
    const std::string k = "k" + std::to_string(i);
    if (hash_slot(k) == slot) other = k;
  }
  CHECK(rendezvous_score(other, seed, 3) == rendezvous_score(key, seed, 3));
}

TEST_CASE("hash: 100000 keys over 10 equal servers are balanced") {
  test::Pool pool = pool_of(ten_addrs());
  std::map<std::string, int> count;
  for (const auto& o : owners(pool, keys_100k())) ++count[o];
  REQUIRE(count.size() == 10);
  int max = 0;
  int min = 1 << 30;
  for (const auto& [a, c] : count) {
    max = std::max(max, c);
    min = std::min(min, c);
  }
  const double mean = 100000.0 / 10.0;
  MESSAGE("10 equal servers: max/mean = " << max / mean << ", min/mean = " << min / mean);
  CHECK(max / mean <= 1.05);
  CHECK(min / mean >= 0.95);
}

TEST_CASE("hash: weights 1:2:3 get 1/6, 2/6, 3/6 of the keys") {
  test::Pool pool;
  pool.add(addr(1), 1);
  pool.add(addr(2), 2);
  pool.add(addr(3), 3);
  std::map<std::string, int> count;
  for (const auto& o : owners(pool, keys_100k())) ++count[o];
  const double s1 = count[addr(1)] / 100000.0;
  const double s2 = count[addr(2)] / 100000.0;
  const double s3 = count[addr(3)] / 100000.0;
  MESSAGE("weights 1:2:3 shares = " << s1 << ", " << s2 << ", " << s3);
  CHECK(std::abs(s1 - 1.0 / 6) <= 0.02);
  CHECK(std::abs(s2 - 2.0 / 6) <= 0.02);
  CHECK(std::abs(s3 - 3.0 / 6) <= 0.02);
}

TEST_CASE("hash: removing a server moves only that server's keys") {
  const auto& keys = keys_100k();
  test::Pool before = pool_of(ten_addrs());
  auto fewer = ten_addrs();
  const std::string removed = fewer[3];
  fewer.erase(fewer.begin() + 3);
  test::Pool after = pool_of(fewer);

  const auto o1 = owners(before, keys);
  const auto o2 = owners(after, keys);
  std::size_t moved = 0;
  std::size_t owned_by_removed = 0;
  std::size_t kept_wrongly_moved = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (o1[i] == removed) ++owned_by_removed;
    if (o1[i] != o2[i]) ++moved;
    if (o1[i] != removed && o1[i] != o2[i]) ++kept_wrongly_moved;
  }
  MESSAGE("remove 1 of 10: moved fraction = " << static_cast<double>(moved) / keys.size());
  CHECK(kept_wrongly_moved == 0);
  CHECK(moved == owned_by_removed);
  CHECK(owned_by_removed > 9000);
}

TEST_CASE("hash: adding an 11th server moves about 1/11 of keys, all onto it") {
  const auto& keys = keys_100k();
  test::Pool before = pool_of(ten_addrs());
  auto more = ten_addrs();
  more.push_back(addr(11));
  test::Pool after = pool_of(more);

  const auto o1 = owners(before, keys);
  const auto o2 = owners(after, keys);
  std::size_t moved = 0;
  std::size_t moved_elsewhere = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (o1[i] == o2[i]) continue;
    ++moved;
    if (o2[i] != addr(11)) ++moved_elsewhere;
  }
  const double frac = static_cast<double>(moved) / keys.size();
  MESSAGE("add an 11th: moved fraction = " << frac << " (1/11 = " << 1.0 / 11 << ")");
  CHECK(moved_elsewhere == 0);
  CHECK(frac >= 0.9 / 11);
  CHECK(frac <= 1.1 / 11);
}

TEST_CASE("hash: the server list's order does not matter") {
  const auto& keys = keys_100k();
  auto shuffled = ten_addrs();
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  REQUIRE(shuffled != ten_addrs());
  test::Pool a = pool_of(ten_addrs());
  test::Pool b = pool_of(shuffled);
  CHECK(owners(a, keys) == owners(b, keys));

  // The whole ranking agrees too, not only the winner.
  for (std::size_t k = 0; k < 100; ++k) {
    const auto ra = rendezvous_rank(a.c, keys[k]);
    const auto rb = rendezvous_rank(b.c, keys[k]);
    for (std::size_t i = 0; i < ra.size(); ++i) {
      CHECK(a.text(ra[i]) == b.text(rb[i]));
    }
  }
}

TEST_CASE("hash: a fixed key ranks fixed servers the same way in every process") {
  // Pinned values: a change here breaks stickiness across a rolling upgrade.
  test::Pool pool = pool_of({"10.0.1.1:443", "10.0.1.2:443", "10.0.1.3:443", "10.0.1.4:443"});
  CHECK(rendezvous_rank(pool.c, "db.example.com") == std::vector<std::size_t>{2, 0, 1, 3});
  CHECK(rendezvous_rank(pool.c, "") == std::vector<std::size_t>{3, 2, 0, 1});
}

TEST_CASE("hash: bounded load skips an overloaded server") {
  test::Pool pool = pool_of({addr(1), addr(2), addr(3), addr(4)});
  const std::string key = "10.1.2.3";
  const auto rank = rendezvous_rank(pool.c, key);

  SUBCASE("off: the top-ranked server however loaded") {
    HashBalancer h(0.0);
    pool[rank[0]].active = 50;
    CHECK(h.choose(pool.c, key) == rank[0]);
  }
  SUBCASE("within the bound: the top-ranked server") {
    // total 3, bound ceil(1.25 * 4 / 4) = 2: 1 + 1 <= 2
    HashBalancer h(1.25);
    pool[rank[0]].active = 1;
    pool[rank[1]].active = 1;
    pool[rank[2]].active = 1;
    CHECK(h.choose(pool.c, key) == rank[0]);
  }
  SUBCASE("over the bound: the next-ranked server that fits") {
    // total 7, bound ceil(1.25 * 8 / 4) = 3: rank0 (4+1) and rank1 (3+1) exceed it
    HashBalancer h(1.25);
    pool[rank[0]].active = 4;
    pool[rank[1]].active = 3;
    CHECK(h.choose(pool.c, key) == rank[2]);
  }
  SUBCASE("all over the bound: the top-ranked server") {
    // total 8, bound ceil(0.5 * 9 / 4) = 2: every server would have 3
    HashBalancer h(0.5);
    for (std::size_t i = 0; i < 4; ++i) pool[i].active = 2;
    CHECK(h.choose(pool.c, key) == rank[0]);
  }
}
