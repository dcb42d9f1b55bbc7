#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/client_table.hpp"
#include "sluice/cidr.hpp"

using sluice::Cause;
using sluice::ClientTable;

namespace {

sockaddr_storage v4(const char* ip) {
  sockaddr_storage ss{};
  auto* a = reinterpret_cast<sockaddr_in*>(&ss);
  a->sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a->sin_addr);
  return ss;
}

sockaddr_storage v6(const char* ip) {
  sockaddr_storage ss{};
  auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
  a->sin6_family = AF_INET6;
  inet_pton(AF_INET6, ip, &a->sin6_addr);
  return ss;
}

const sockaddr* sa(const sockaddr_storage& ss) { return reinterpret_cast<const sockaddr*>(&ss); }

sluice::Cidr cidr(const char* ip, unsigned prefix) {
  sluice::Cidr c;
  c.prefix = prefix;
  if (std::strchr(ip, ':') != nullptr) {
    c.family = AF_INET6;
    inet_pton(AF_INET6, ip, c.addr.data());
  } else {
    c.family = AF_INET;
    inet_pton(AF_INET, ip, c.addr.data());
  }
  return c;
}

}  // namespace

TEST_CASE("cidr_contains: IPv4, IPv6, mapped, odd prefixes") {
  CHECK(sluice::cidr_contains(cidr("10.0.0.0", 8), sa(v4("10.1.2.3"))));
  CHECK_FALSE(sluice::cidr_contains(cidr("10.0.0.0", 8), sa(v4("11.1.2.3"))));
  CHECK(sluice::cidr_contains(cidr("192.168.4.0", 22), sa(v4("192.168.7.255"))));
  CHECK_FALSE(sluice::cidr_contains(cidr("192.168.4.0", 22), sa(v4("192.168.8.0"))));
  CHECK(sluice::cidr_contains(cidr("0.0.0.0", 0), sa(v4("8.8.8.8"))));
  CHECK(sluice::cidr_contains(cidr("127.0.0.1", 32), sa(v6("::ffff:127.0.0.1"))));
  CHECK(sluice::cidr_contains(cidr("2001:db8::", 32), sa(v6("2001:db8:1::7"))));
  CHECK_FALSE(sluice::cidr_contains(cidr("2001:db8::", 33), sa(v6("2001:db8:8000::1"))));
  CHECK_FALSE(sluice::cidr_contains(cidr("::1", 128), sa(v4("127.0.0.1"))));
  CHECK_FALSE(sluice::cidr_contains(cidr("10.0.0.0", 8), sa(v6("::1"))));
}

TEST_CASE("client_max_connections counts open connections per address") {
  ClientTable t;
  const ClientTable::Limits lim{2, 0};
  const auto a = v4("10.0.0.1");
  const auto b = v4("10.0.0.2");
  CHECK(t.admit(sa(a), lim, 0) == Cause::none);
  CHECK(t.admit(sa(a), lim, 0) == Cause::none);
  CHECK(t.admit(sa(a), lim, 0) == Cause::client_limit);
  CHECK(t.admit(sa(b), lim, 0) == Cause::none);
  t.release(sa(a));
  CHECK(t.admit(sa(a), lim, 0) == Cause::none);
  // The same IPv4 client seen through a dual-stack socket is the same entry.
  CHECK(t.admit(sa(v6("::ffff:10.0.0.1")), lim, 0) == Cause::client_limit);
}

TEST_CASE("client_rate_limit is a token bucket with one second of burst") {
  ClientTable t;
  const ClientTable::Limits lim{0, 5};
  const auto a = v4("10.0.0.1");
  int ok = 0;
  for (int i = 0; i < 10; ++i) ok += t.admit(sa(a), lim, 1000) == Cause::none;
  CHECK(ok == 5);
  CHECK(t.admit(sa(a), lim, 1100) == Cause::rate_limited);  // 0.5 token
  CHECK(t.admit(sa(a), lim, 1200) == Cause::none);          // 1 token after 200 ms
  CHECK(t.admit(sa(a), lim, 1200) == Cause::rate_limited);
}

TEST_CASE("the table is bounded: when every entry has an open connection, new addresses are refused") {
  ClientTable t;
  const ClientTable::Limits lim{1, 0};
  sockaddr_storage ss{};
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  a6->sin6_family = AF_INET6;
  std::size_t refused = 0;
  for (std::uint32_t i = 0; i < ClientTable::kMaxClients * 2; ++i) {
    std::memcpy(a6->sin6_addr.s6_addr, &i, sizeof i);
    a6->sin6_addr.s6_addr[15] = 0x42;
    refused += t.admit(sa(ss), lim, 0) != Cause::none;
  }
  CHECK(t.size() <= ClientTable::kMaxClients);
  CHECK(refused >= ClientTable::kMaxClients);
  CHECK(t.refused_full() == refused);
  // Once those clients leave, new ones get in again.
  for (std::uint32_t i = 0; i < ClientTable::kMaxClients * 2; ++i) {
    std::memcpy(a6->sin6_addr.s6_addr, &i, sizeof i);
    a6->sin6_addr.s6_addr[15] = 0x42;
    t.release(sa(ss));
  }
  CHECK(t.admit(sa(v4("10.9.9.9")), lim, 0) == Cause::none);
}

namespace {

// The i-th of many distinct IPv6 addresses (2001:db8::/32, i in the low bits).
sockaddr_storage nth(std::uint32_t i) {
  sockaddr_storage ss{};
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  a6->sin6_family = AF_INET6;
  a6->sin6_addr.s6_addr[0] = 0x20;
  a6->sin6_addr.s6_addr[1] = 0x01;
  a6->sin6_addr.s6_addr[2] = 0x0d;
  a6->sin6_addr.s6_addr[3] = 0xb8;
  std::memcpy(a6->sin6_addr.s6_addr + 12, &i, sizeof i);
  return ss;
}

}  // namespace

TEST_CASE("a per-hour rate limit does not fill the table: new addresses take the place of the oldest idle ones") {
  ClientTable t;
  const ClientTable::Limits per_hour{0, 10.0 / 3600};
  const std::uint64_t now = 1'000'000;  // the clock never moves: no bucket refills
  std::size_t refused = 0;
  std::uint64_t most_forgotten_by_one_admit = 0;
  for (std::uint32_t i = 0; i < ClientTable::kMaxClients * 3; ++i) {
    const std::uint64_t before = t.evicted();
    refused += t.admit(sa(nth(i)), per_hour, now) != Cause::none;
    most_forgotten_by_one_admit = std::max(most_forgotten_by_one_admit, t.evicted() - before);
    if (i % 4096 == 0) CHECK(t.size() <= ClientTable::kMaxClients);
  }
  CHECK(refused == 0);
  CHECK(t.refused_full() == 0);
  CHECK(t.size() <= ClientTable::kMaxClients);
  CHECK(t.size() + t.evicted() == ClientTable::kMaxClients * 3);
  // Bounded work: an accept into a full table forgets one address, never a sweep.
  CHECK(most_forgotten_by_one_admit == 1);
}

TEST_CASE("a client that keeps coming back keeps its bucket; open connections are never forgotten") {
  ClientTable t;
  const ClientTable::Limits lim{1, 1.0 / 3600};
  const std::uint64_t now = 5'000;
  const auto held = v4("192.0.2.1");       // keeps its connection open throughout
  const auto returning = v4("192.0.2.2");  // spent its token, keeps trying
  const auto once = v4("192.0.2.3");       // spent its token, never seen again
  CHECK(t.admit(sa(held), lim, now) == Cause::none);
  for (const auto* c : {&returning, &once}) {
    CHECK(t.admit(sa(*c), lim, now) == Cause::none);
    t.release(sa(*c));
    CHECK(t.admit(sa(*c), lim, now) == Cause::rate_limited);
  }
  for (std::uint32_t i = 0; i < ClientTable::kMaxClients * 4; ++i) {
    const auto other = nth(i);
    REQUIRE(t.admit(sa(other), lim, now) == Cause::none);
    t.release(sa(other));
    // ~60 newcomers per shard between two tries, far less than a shard holds.
    if (i % 1000 == 0) REQUIRE(t.admit(sa(returning), lim, now) == Cause::rate_limited);
  }
  CHECK(t.admit(sa(held), lim, now) == Cause::client_limit);  // its open connection is still counted
  t.release(sa(held));
  CHECK(t.admit(sa(held), lim, now) == Cause::rate_limited);  // and its bucket is still empty
  CHECK(t.admit(sa(returning), lim, now) == Cause::rate_limited);
  // What the bound costs: an address idle while 65 536 others arrived starts afresh.
  CHECK(t.admit(sa(once), lim, now) == Cause::none);
}

TEST_CASE("a shard whose every slot has an open connection refuses; a slot frees when its client leaves") {
  ClientTable t(ClientTable::kShards);  // one address per shard
  const ClientTable::Limits lim{1, 0};
  std::vector<std::uint32_t> admitted;
  std::vector<std::uint32_t> refused;
  for (std::uint32_t i = 0; i < 1000; ++i) {
    (t.admit(sa(nth(i)), lim, 0) == Cause::none ? admitted : refused).push_back(i);
  }
  CHECK(admitted.size() == ClientTable::kShards);
  CHECK(t.refused_full() == refused.size());
  CHECK(t.evicted() == 0);
  for (std::uint32_t i : refused) CHECK(t.admit(sa(nth(i)), lim, 0) == Cause::client_limit);
  for (std::uint32_t i : admitted) t.release(sa(nth(i)));
  for (std::uint32_t i : refused) {
    REQUIRE(t.admit(sa(nth(i)), lim, 0) == Cause::none);
    t.release(sa(nth(i)));
  }
  CHECK(t.size() == ClientTable::kShards);
}

namespace {

std::vector<ClientTable::SavedBucket> sorted(std::vector<ClientTable::SavedBucket> v) {
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.addr < y.addr; });
  return v;
}

ClientTable::SavedBucket saved(const sockaddr_storage& ss, std::uint64_t tokens_milli, std::uint64_t age_ms) {
  ClientTable::SavedBucket b;
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  b.addr[10] = 0xff;
  b.addr[11] = 0xff;
  std::memcpy(b.addr.data() + 12, &a->sin_addr, 4);
  b.tokens_milli = tokens_milli;
  b.age_ms = age_ms;
  return b;
}

}  // namespace

TEST_CASE("rate-limit buckets move to another table: tokens and refill age kept, full buckets left out") {
  ClientTable from;
  const ClientTable::Limits lim{0, 2};  // a bucket of 2 tokens, 2 per second
  const auto spent = v4("192.0.2.1");   // both tokens used
  const auto half = v4("192.0.2.2");    // one used
  const auto full = v4("192.0.2.3");    // one used, long refilled since
  CHECK(from.admit(sa(full), lim, 0) == Cause::none);
  for (int i = 0; i < 2; ++i) CHECK(from.admit(sa(spent), lim, 1000) == Cause::none);
  CHECK(from.admit(sa(spent), lim, 1000) == Cause::rate_limited);
  CHECK(from.admit(sa(half), lim, 1000) == Cause::none);
  CHECK(from.save_buckets(0, 1250).empty());  // no limit: nothing to carry

  const auto buckets = sorted(from.save_buckets(2, 1250));
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].addr == saved(spent, 0, 0).addr);
  CHECK(buckets[0].tokens_milli == 0);
  CHECK(buckets[0].age_ms == 250);
  CHECK(buckets[1].addr == saved(half, 0, 0).addr);
  CHECK(buckets[1].tokens_milli == 1000);
  CHECK(buckets[1].age_ms == 250);

  // Another process: another clock.
  ClientTable to;
  const std::uint64_t now = 50'000;
  for (const auto& b : buckets) CHECK(to.restore_bucket(b, 2, now));
  CHECK(to.size() == 2);
  const auto again = sorted(to.save_buckets(2, now));
  REQUIRE(again.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(again[i].addr == buckets[i].addr);
    CHECK(again[i].tokens_milli == buckets[i].tokens_milli);
    CHECK(again[i].age_ms == buckets[i].age_ms);
  }
  // 0 + 250 ms of refill = half a token: refused; 250 ms on, one token.
  CHECK(to.admit(sa(spent), lim, now) == Cause::rate_limited);
  CHECK(to.admit(sa(spent), lim, now + 250) == Cause::none);
  CHECK(to.admit(sa(spent), lim, now + 250) == Cause::rate_limited);
  // 1 + 0.5 tokens: one more connection, not two.
  CHECK(to.admit(sa(half), lim, now) == Cause::none);
  CHECK(to.admit(sa(half), lim, now) == Cause::rate_limited);
  // A full bucket was not carried: the address starts with a full one, as it would anyway.
  CHECK(to.admit(sa(full), lim, now) == Cause::none);
  CHECK(to.admit(sa(full), lim, now) == Cause::none);
  CHECK(to.admit(sa(full), lim, now) == Cause::rate_limited);
}

TEST_CASE("a restored bucket is at most full for the limit in force, and keeps thousandths") {
  ClientTable t;
  const auto a = v4("198.51.100.1");
  const auto b = v4("198.51.100.2");
  CHECK(t.restore_bucket(saved(a, 5000, 0), 2, 1000));  // the old limit was higher
  CHECK(t.restore_bucket(saved(b, 333, 7), 2, 1000));
  const auto got = t.save_buckets(2, 1000);
  REQUIRE(got.size() == 1);  // a is full under the limit in force
  CHECK(got[0].tokens_milli == 333);
  CHECK(got[0].age_ms == 7);
  const ClientTable::Limits lim{0, 2};
  CHECK(t.admit(sa(a), lim, 1000) == Cause::none);
  CHECK(t.admit(sa(a), lim, 1000) == Cause::none);
  CHECK(t.admit(sa(a), lim, 1000) == Cause::rate_limited);
}

TEST_CASE("restoring into a full table takes an idle address's place as admit does; open counts are kept") {
  ClientTable t(ClientTable::kShards);  // one address per shard
  const ClientTable::Limits lim{1, 1};
  std::vector<std::uint32_t> admitted;
  for (std::uint32_t i = 0; i < 1000; ++i) {
    if (t.admit(sa(nth(i)), lim, 0) == Cause::none) admitted.push_back(i);
  }
  REQUIRE(admitted.size() == ClientTable::kShards);  // every shard full, each with an open connection
  const std::uint64_t refused_before = t.refused_full();
  const auto newcomer = v4("203.0.113.9");
  // Every slot holds an open connection: the bucket is skipped, nothing is
  // evicted, and it does not count as a refused connection.
  CHECK_FALSE(t.restore_bucket(saved(newcomer, 0, 0), 1, 0));
  CHECK(t.size() == ClientTable::kShards);
  CHECK(t.evicted() == 0);
  CHECK(t.refused_full() == refused_before);
  // An address already there gets its bucket; its open connection still counts.
  auto held = nth(admitted[0]);
  ClientTable::SavedBucket mine;
  std::memcpy(mine.addr.data(), reinterpret_cast<const sockaddr_in6*>(&held)->sin6_addr.s6_addr, 16);
  mine.tokens_milli = 1000;  // its own token was spent at admit
  CHECK(t.restore_bucket(mine, 1, 0));
  CHECK(t.admit(sa(held), lim, 0) == Cause::client_limit);
  t.release(sa(held));
  CHECK(t.admit(sa(held), lim, 0) == Cause::none);  // the restored token
  // Once they leave, a restored bucket takes the place of an idle address.
  for (std::uint32_t i : admitted) t.release(sa(nth(i)));
  CHECK(t.restore_bucket(saved(newcomer, 0, 0), 1, 0));
  CHECK(t.size() == ClientTable::kShards);
  CHECK(t.evicted() == 1);
  CHECK(t.admit(sa(newcomer), lim, 0) == Cause::rate_limited);
}

TEST_CASE("another process's open sessions count against the limit, and leave with it") {
  ClientTable old_one;
  ClientTable new_one;
  const ClientTable::Limits lim{2, 0};
  const auto a = v4("10.0.0.1");
  REQUIRE(old_one.admit(sa(a), lim, 0) == Cause::none);
  REQUIRE(old_one.admit(sa(v4("10.0.0.2")), lim, 0) == Cause::none);
  const auto counts = old_one.open_counts();
  REQUIRE(counts.size() == 2);
  for (const auto& [addr, open] : counts) {
    CHECK(open == 1);
    CHECK(new_one.add_open(addr, open));
  }
  // One session of 10.0.0.1 is still in the old process: one more here.
  CHECK(new_one.admit(sa(a), lim, 0) == Cause::none);
  CHECK(new_one.admit(sa(a), lim, 0) == Cause::client_limit);
  // The old process's session ends: its count leaves, the slot is free.
  std::array<std::uint8_t, 16> mapped{};
  mapped[10] = mapped[11] = 0xff;
  mapped[12] = 10;
  mapped[15] = 1;
  CHECK(new_one.add_open(mapped, -1));
  CHECK(new_one.admit(sa(a), lim, 0) == Cause::none);
  CHECK(new_one.admit(sa(a), lim, 0) == Cause::client_limit);
  // Taking out more than is there never wraps.
  CHECK(new_one.add_open(mapped, -10));
  CHECK(new_one.admit(sa(a), lim, 0) == Cause::none);
}

TEST_CASE("an address counted for another process is not forgotten to make room") {
  ClientTable t(ClientTable::kShards);  // one address per shard
  std::array<std::uint8_t, 16> addr{};
  addr[15] = 1;
  REQUIRE(t.add_open(addr, 1));
  const std::size_t before = t.size();
  // Whatever shard a newcomer lands in, the address with a remote session
  // is never the one evicted.
  for (int i = 0; i < 64; ++i) {
    t.admit(sa(v4(("10.1.0." + std::to_string(i + 1)).c_str())), ClientTable::Limits{0, 100}, 0);
  }
  CHECK(t.size() <= ClientTable::kShards);
  CHECK(t.size() >= before);
  bool still = false;
  for (const auto& [a, open] : t.open_counts()) still = still || (a == addr && open == 1);
  CHECK(still);
}
