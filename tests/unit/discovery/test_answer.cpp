// The pure parts of DNS discovery: reading answers, refresh times, SRV
// records to servers, and the hold of servers that left an answer.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "discovery/answer.hpp"

using namespace sluice;
using namespace sluice::discovery;
using namespace std::chrono_literals;

namespace {

// Builds DNS messages for the tests: a question, then records.
class Msg {
 public:
  Msg(const std::string& qname, std::uint16_t qtype, std::uint16_t an, std::uint16_t ns = 0) {
    u16(0x1234);
    u16(0x8180);
    u16(1);
    u16(an);
    u16(ns);
    u16(0);
    name(qname);
    u16(qtype);
    u16(1);
  }
  Msg& name(const std::string& n) {
    std::size_t start = 0;
    while (start < n.size()) {
      auto dot = n.find('.', start);
      if (dot == std::string::npos) dot = n.size();
      bytes_.push_back(static_cast<unsigned char>(dot - start));
      bytes_.insert(bytes_.end(), n.begin() + static_cast<long>(start), n.begin() + static_cast<long>(dot));
      start = dot + 1;
    }
    bytes_.push_back(0);
    return *this;
  }
  Msg& pointer(std::uint16_t offset) { return u16(static_cast<std::uint16_t>(0xc000 | offset)); }
  Msg& u16(std::uint16_t v) {
    bytes_.push_back(static_cast<unsigned char>(v >> 8));
    bytes_.push_back(static_cast<unsigned char>(v));
    return *this;
  }
  Msg& u32(std::uint32_t v) { return u16(static_cast<std::uint16_t>(v >> 16)).u16(static_cast<std::uint16_t>(v)); }
  // A record owned by the question's name (a pointer to offset 12).
  Msg& record(std::uint16_t type, std::uint32_t ttl, const std::vector<unsigned char>& rdata) {
    pointer(12).u16(type).u16(1).u32(ttl).u16(static_cast<std::uint16_t>(rdata.size()));
    bytes_.insert(bytes_.end(), rdata.begin(), rdata.end());
    return *this;
  }
  Msg& a(std::uint32_t ttl, std::vector<unsigned char> ip) { return record(1, ttl, ip); }
  Msg& srv(std::uint32_t ttl, std::uint16_t prio, std::uint16_t weight, std::uint16_t port, const std::string& target) {
    std::vector<unsigned char> rdata = {static_cast<unsigned char>(prio >> 8), static_cast<unsigned char>(prio),
                                        static_cast<unsigned char>(weight >> 8), static_cast<unsigned char>(weight),
                                        static_cast<unsigned char>(port >> 8), static_cast<unsigned char>(port)};
    Msg n("", 0, 0);
    n.bytes_.clear();
    n.name(target);
    rdata.insert(rdata.end(), n.bytes_.begin(), n.bytes_.end());
    return record(33, ttl, rdata);
  }
  std::optional<Answer> parse(RecordType type) const { return parse_answer(bytes_.data(), bytes_.size(), type); }
  std::vector<unsigned char> bytes_;
};

}  // namespace

TEST_CASE("A answers: addresses sorted and unique, the smallest TTL of the chain") {
  Msg m("db.test", 1, 4);
  m.record(5, 30, {1, 'x', 0});  // a CNAME on the way (its TTL counts)
  m.a(300, {10, 0, 0, 9}).a(60, {10, 0, 0, 1}).a(300, {10, 0, 0, 9});
  const auto ans = m.parse(RecordType::a);
  REQUIRE(ans);
  CHECK(ans->ips == std::vector<std::string>{"10.0.0.1", "10.0.0.9"});
  REQUIRE(ans->ttl);
  CHECK(*ans->ttl == 30);
}

TEST_CASE("AAAA answers in canonical text") {
  Msg m("db.test", 28, 1);
  std::vector<unsigned char> ip(16, 0);
  ip[0] = 0x20;
  ip[1] = 0x01;
  ip[2] = 0x0d;
  ip[3] = 0xb8;
  ip[15] = 7;
  m.record(28, 10, ip);
  const auto ans = m.parse(RecordType::aaaa);
  REQUIRE(ans);
  CHECK(ans->ips == std::vector<std::string>{"2001:db8::7"});
  CHECK(servers_of_host(5432, ans->ips).front().address == "[2001:db8::7]:5432");
}

TEST_CASE("SRV answers: targets lower-cased, '.' kept as no service, bad bytes dropped") {
  Msg m("_pg._tcp.svc.test", 33, 4);
  m.srv(20, 0, 5, 5432, "DB1.test").srv(10, 1, 0, 5433, "db2.test").srv(20, 0, 1, 0, "");
  m.srv(20, 0, 1, 5434, "evil\nname.test");
  const auto ans = m.parse(RecordType::srv);
  REQUIRE(ans);
  REQUIRE(ans->srv.size() == 3);
  CHECK(ans->srv[0].target.empty());
  CHECK(ans->srv[1] == SrvRecord{"db1.test", 5432, 0, 5});
  CHECK(ans->srv[2] == SrvRecord{"db2.test", 5433, 1, 0});
  CHECK(*ans->ttl == 10);
}

TEST_CASE("a negative answer takes its TTL from the SOA") {
  Msg m("gone.test", 1, 0, 1);
  // test. SOA: mname, rname, serial, refresh, retry, expire, minimum
  Msg soa("", 0, 0);
  soa.bytes_.clear();
  soa.name("ns.test").name("root.test").u32(1).u32(2).u32(3).u32(4).u32(45);
  m.pointer(12).u16(6).u16(1).u32(600).u16(static_cast<std::uint16_t>(soa.bytes_.size()));
  m.bytes_.insert(m.bytes_.end(), soa.bytes_.begin(), soa.bytes_.end());
  const auto ans = m.parse(RecordType::a);
  REQUIRE(ans);
  CHECK(ans->ips.empty());
  REQUIRE(ans->ttl);
  CHECK(*ans->ttl == 45);
}

TEST_CASE("malformed messages are no answer") {
  Msg m("db.test", 1, 1);
  m.a(60, {10, 0, 0, 1});
  // The message without its last two bytes (a copy of the front, not a
  // resize: gcc 12 at -O1 warns about a resize it cannot bound).
  REQUIRE(m.bytes_.size() > 2);
  const std::vector<unsigned char> cut(m.bytes_.begin(), m.bytes_.end() - 2);
  CHECK_FALSE(parse_answer(cut.data(), cut.size(), RecordType::a));
  // A name whose pointer points at itself.
  Msg loop("db.test", 1, 1);
  const auto at = static_cast<std::uint16_t>(loop.bytes_.size());
  loop.pointer(at).u16(1).u16(1).u32(1).u16(4).u32(0x0a000001);
  CHECK_FALSE(loop.parse(RecordType::a));
  // An A record of the wrong size.
  Msg bad("db.test", 1, 1);
  bad.a(60, {10, 0, 0});
  CHECK_FALSE(bad.parse(RecordType::a));
}

TEST_CASE("refresh: valid wins, else the TTL clamped to 1s..1h") {
  CHECK(refresh_interval(0, Duration{0}) == 1s);
  CHECK(refresh_interval(30, Duration{0}) == 30s);
  CHECK(refresh_interval(86400, Duration{0}) == 1h);
  CHECK(refresh_interval(std::nullopt, Duration{0}) == kNoTtlRefresh);
  CHECK(refresh_interval(300, 2s) == 2s);
  CHECK(retry_interval(1h) == 5s);
  CHECK(retry_interval(1s) == 1s);
  CHECK(retry_interval(3s) == 3s);
}

TEST_CASE("SRV weight: 0 is 1, capped at 1000") {
  CHECK(srv_weight(0) == 1);
  CHECK(srv_weight(7) == 7);
  CHECK(srv_weight(1000) == 1000);
  CHECK(srv_weight(65535) == 1000);
}

TEST_CASE("SRV records to servers: lowest priority primary, others backup") {
  const std::vector<SrvRecord> records = {
      {"a.test", 5432, 10, 5}, {"b.test", 5433, 10, 0}, {"c.test", 5432, 20, 3}, {"", 0, 0, 0}, {"unknown.test", 1, 0, 1}};
  const std::map<std::string, std::vector<std::string>> ips = {
      {"a.test", {"10.0.0.1", "10.0.0.2"}}, {"b.test", {"10.0.0.3"}}, {"c.test", {"10.0.0.4"}}};
  auto ips_of = [&](const std::string& t) -> const std::vector<std::string>* {
    auto it = ips.find(t);
    return it == ips.end() ? nullptr : &it->second;
  };
  auto out = servers_of_service(records, false, ips_of);
  normalize(out);
  // The lowest priority is that of the records with a target, addresses
  // known or not: unknown.test (priority 0, no address yet) makes the others
  // backups, as they would be once it resolves.
  REQUIRE(out.size() == 4);
  CHECK(out[0] == Found{"10.0.0.1:5432", 5, true});
  CHECK(out[2] == Found{"10.0.0.3:5433", 1, true});
  CHECK(out[3] == Found{"10.0.0.4:5432", 3, true});

  const std::vector<SrvRecord> two = {{"a.test", 5432, 10, 5}, {"c.test", 5432, 20, 3}};
  out = servers_of_service(two, false, ips_of);
  normalize(out);
  CHECK(out == std::vector<Found>{{"10.0.0.1:5432", 5, false}, {"10.0.0.2:5432", 5, false}, {"10.0.0.4:5432", 3, true}});
  out = servers_of_service(two, true, ips_of);
  CHECK(out.size() == 2);  // hash balancing: no backups
}

TEST_CASE("an address given by two SRV records keeps the lower priority's") {
  const std::vector<SrvRecord> records = {{"a.test", 5432, 1, 9}, {"b.test", 5432, 0, 2}};
  const std::vector<std::string> same = {"10.0.0.1"};
  auto out = servers_of_service(records, false, [&](const std::string&) { return &same; });
  CHECK(out == std::vector<Found>{{"10.0.0.1:5432", 2, false}});
}

TEST_CASE("answer order does not matter") {
  const auto x = servers_of_host(80, {"10.0.0.2", "10.0.0.1", "10.0.0.3"});
  const auto y = servers_of_host(80, {"10.0.0.3", "10.0.0.2", "10.0.0.1"});
  CHECK(x == y);
  CHECK(x.front().address == "10.0.0.1:80");
}

TEST_CASE("hold: a server that left stays for hold, then goes; one that comes back is not held") {
  HoldSet h;
  const TimePoint t0{};
  const auto ab = servers_of_host(80, {"10.0.0.1", "10.0.0.2"});
  const auto a = servers_of_host(80, {"10.0.0.1"});
  CHECK(h.update(ab, t0, 10s) == ab);
  CHECK(h.next_expiry(10s) == TimePoint::max());
  // b leaves: held.
  CHECK(h.update(a, t0 + 1s, 10s) == ab);
  CHECK(h.held() == std::vector<std::string>{"10.0.0.2:80"});
  CHECK(h.next_expiry(10s) == t0 + 11s);
  // Still missing later: its hold runs from when it left, not from now.
  CHECK(h.update(a, t0 + 5s, 10s) == ab);
  CHECK(h.update(a, t0 + 11s, 10s) == a);
  CHECK(h.held().empty());
  // Back and gone again: a new hold.
  CHECK(h.update(ab, t0 + 12s, 10s) == ab);
  CHECK(h.update(a, t0 + 13s, 10s) == ab);
  CHECK(h.update(ab, t0 + 14s, 10s) == ab);
  CHECK(h.held().empty());
  // Everything gone (an NXDOMAIN): all held, then nothing.
  CHECK(h.update({}, t0 + 20s, 10s) == ab);
  CHECK(h.update({}, t0 + 30s, 10s).empty());
  // hold = 0: gone at once.
  HoldSet z;
  z.update(ab, t0, 0s);
  CHECK(z.update(a, t0 + 1s, 0s) == a);
}

TEST_CASE("family: which of A and AAAA an entry asks for") {
  using sluice::AddressFamily;
  CHECK(wants(AddressFamily::any, RecordType::a));
  CHECK(wants(AddressFamily::any, RecordType::aaaa));
  CHECK(wants(AddressFamily::ipv4, RecordType::a));
  CHECK_FALSE(wants(AddressFamily::ipv4, RecordType::aaaa));
  CHECK_FALSE(wants(AddressFamily::ipv6, RecordType::a));
  CHECK(wants(AddressFamily::ipv6, RecordType::aaaa));
}

TEST_CASE("caps: what one answer may bring, the same whatever its order") {
  std::vector<std::string> ips = {"10.0.0.1", "10.0.0.2", "10.0.0.3"};
  CHECK(cap_addresses(ips, 3) == 0);
  CHECK(cap_addresses(ips, 2) == 1);
  CHECK(ips == std::vector<std::string>{"10.0.0.1", "10.0.0.2"});

  // SRV: the lowest priorities, then the largest weights, are kept.
  const std::vector<SrvRecord> records = {
      {"a.test", 1, 5, 10}, {"b.test", 1, 0, 1}, {"c.test", 1, 0, 9}, {"d.test", 1, 1, 100}, {"e.test", 1, 0, 9}};
  std::vector<SrvRecord> kept = records;
  CHECK(cap_records(kept, 3) == 2);
  CHECK(kept == std::vector<SrvRecord>{{"b.test", 1, 0, 1}, {"c.test", 1, 0, 9}, {"e.test", 1, 0, 9}});
  std::vector<SrvRecord> reversed(records.rbegin(), records.rend());
  CHECK(cap_records(reversed, 3) == 2);
  CHECK(reversed == kept);
  std::vector<SrvRecord> two = records;
  CHECK(cap_records(two, 2) == 3);
  CHECK(two == std::vector<SrvRecord>{{"c.test", 1, 0, 9}, {"e.test", 1, 0, 9}});
  std::vector<SrvRecord> all = records;
  CHECK(cap_records(all, 10) == 0);
  CHECK(all == records);

  // An entry's servers: primaries before backups.
  std::vector<Found> servers = {{"10.0.0.1:1", 1, true, 1}, {"10.0.0.2:1", 5, false, 0}, {"10.0.0.3:1", 9, false, 0},
                                {"10.0.0.4:1", 1, false, 0}};
  CHECK(cap_servers(servers, 2) == 2);
  CHECK(servers == std::vector<Found>{{"10.0.0.2:1", 5, false, 0}, {"10.0.0.3:1", 9, false, 0}});
}

TEST_CASE("changes, server by server") {
  const std::vector<Found> before = {{"10.0.0.1:80", 5, false, 0}, {"10.0.0.2:80", 1, false, 0},
                                     {"10.0.0.3:80", 1, true, 1}, {"10.0.0.4:80", 1, true, 2}};
  const std::vector<Found> after = {{"10.0.0.1:80", 30, false, 0}, {"10.0.0.3:80", 1, false, 1},
                                    {"10.0.0.4:80", 1, true, 3}, {"10.0.0.5:80", 2, true, 2}};
  CHECK(describe_changes(before, after, true) == std::vector<std::string>{
                                                     "10.0.0.1:80 weight 5 -> 30",
                                                     "10.0.0.2:80 removed",
                                                     "10.0.0.3:80 no longer a backup",
                                                     "10.0.0.4:80 priority 2 -> 3",
                                                     "10.0.0.5:80 added (weight 2, priority 2, a backup)",
                                                 });
  const std::vector<Found> demoted = {{"10.0.0.1:80", 5, true, 1}};
  CHECK(describe_changes({before[0]}, demoted, true) ==
        std::vector<std::string>{"10.0.0.1:80 priority 0 -> 1 (now a backup)"});
  CHECK(describe_changes(servers_of_host(80, {"10.0.0.1"}), servers_of_host(80, {"10.0.0.2"}), false) ==
        std::vector<std::string>{"10.0.0.1:80 removed", "10.0.0.2:80 added"});
  CHECK(describe_changes(before, before, true).empty());
  // A priority that moves without changing the role is no change to build.
  CHECK(before[3] == Found{"10.0.0.4:80", 1, true, 3});
}

TEST_CASE("hold: at most max servers, those that left last kept first") {
  HoldSet h;
  const TimePoint t0{};
  const auto abc = servers_of_host(80, {"10.0.0.1", "10.0.0.2", "10.0.0.3"});
  CHECK(h.update(abc, t0, 10s, 3) == abc);
  // 3 leaves, then 2: with room for one held, 2 (the latest) stays.
  CHECK(h.update(servers_of_host(80, {"10.0.0.1", "10.0.0.2"}), t0 + 1s, 10s, 3) == abc);
  CHECK(h.update(servers_of_host(80, {"10.0.0.1"}), t0 + 2s, 10s, 2) == servers_of_host(80, {"10.0.0.1", "10.0.0.2"}));
  CHECK(h.held() == std::vector<std::string>{"10.0.0.2:80"});
}
