// The pure parts of DNS discovery: reading a DNS answer (A, AAAA and SRV
// records with their TTLs, RFC 1035 and 2782), turning records into
// servers, and keeping servers that went missing for the `hold` time. No
// sockets, no clocks of their own: unit-tested.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/config.hpp"
#include "sluice/time.hpp"

namespace sluice::discovery {

// DNS record types discovery asks for.
enum class RecordType : std::uint16_t { a = 1, aaaa = 28, srv = 33 };
std::string_view to_string(RecordType t);

struct SrvRecord {
  std::string target;  // lower-case, no trailing dot; "" for "." (no service)
  std::uint16_t port = 0;
  std::uint16_t priority = 0;
  std::uint16_t weight = 0;
  bool operator==(const SrvRecord&) const = default;
};

struct Answer {
  std::vector<std::string> ips;   // A/AAAA: canonical text ("10.0.0.7", "2001:db8::7"), sorted, unique
  std::vector<SrvRecord> srv;     // SRV: sorted, unique
  // The smallest TTL of the answer's records (CNAMEs on the way included);
  // for an answer without records, the negative TTL of its SOA (RFC 2308);
  // nullopt when the message says neither.
  std::optional<std::uint32_t> ttl;
};

// Reads the answer section of the DNS message `msg` for records of `type`
// (others, such as the CNAMEs of a chain, count only for the TTL). Returns
// nullopt when the message is malformed.
std::optional<Answer> parse_answer(const unsigned char* msg, std::size_t len, RecordType type);

// How long until a name is asked again after a good answer: `valid` when
// set, else the TTL clamped to [kMinRefresh, kMaxRefresh]; an answer
// without a TTL (no records, no SOA) is asked again after kNoTtlRefresh.
inline constexpr Duration kMinRefresh = std::chrono::seconds(1);
inline constexpr Duration kMaxRefresh = std::chrono::hours(1);
inline constexpr Duration kNoTtlRefresh = std::chrono::seconds(5);
Duration refresh_interval(std::optional<std::uint32_t> ttl, Duration valid);
// After a failed query (timeout, SERVFAIL, ...): soon, but not more often
// than once a second, nor later than the next regular refresh.
inline constexpr Duration kMaxRetry = std::chrono::seconds(5);
Duration retry_interval(Duration refresh);

// Whether an entry of `family` asks for records of type `t` (A or AAAA).
bool wants(AddressFamily family, RecordType t);

// A server found for an entry, before the entry's own keys are applied.
struct Found {
  std::string address;     // "10.0.0.7:5432", "[2001:db8::7]:5432"
  std::uint32_t weight = 0;  // SRV: the record's weight mapped by srv_weight(); host entries: 0 (the entry's)
  bool backup = false;     // SRV: a record of a higher priority than the lowest
  std::uint16_t priority = 0;  // SRV: the record's (shown in the log when it changes)
  // The same server as far as an upstream goes: a priority that changes
  // and leaves `backup` as it was changes nothing to rebuild.
  bool operator==(const Found& o) const { return address == o.address && weight == o.weight && backup == o.backup; }
  bool operator<(const Found& o) const { return address < o.address; }
};

// "ip" + port as the one server address text ("[v6]:port" for IPv6).
std::string address_text(std::string_view ip, std::uint16_t port);

// SRV weight to server weight: 0 -> 1 (RFC 2782's "no preference" still
// gets picked), capped at 1000 (sluice's largest weight).
std::uint32_t srv_weight(std::uint16_t weight);

// The servers of a host entry: every address with the entry's port.
std::vector<Found> servers_of_host(std::uint16_t port, const std::vector<std::string>& ips);

// The servers of an SRV record set: each target's addresses with the
// record's port; the lowest priority's records are servers, the others
// backups (dropped when `no_backups`: hash balancing has none). `ips_of`
// gives a target's addresses (null: not known yet). An address given by
// two records keeps the lower priority's (then the larger weight).
template <typename IpsOf>
std::vector<Found> servers_of_service(const std::vector<SrvRecord>& records, bool no_backups, IpsOf ips_of);

// Sorted by address, one entry per address.
void normalize(std::vector<Found>& servers);

// What one answer may bring ([resolver] max_targets, max_addresses). Each
// returns how many it dropped; what it keeps is the same whatever the
// order of the answer, so that instances agree.
// SRV records: the lowest priorities first, then the largest weights, then
// by target and port. The records stay sorted as parse_answer sorts them.
std::size_t cap_records(std::vector<SrvRecord>& records, std::size_t max);
// Addresses (sorted): the first `max`.
std::size_t cap_addresses(std::vector<std::string>& ips, std::size_t max);
// An entry's servers (sorted by address): primaries before backups, then
// the lowest priorities, the largest weights, the first addresses.
std::size_t cap_servers(std::vector<Found>& servers, std::size_t max);

// What changed between two lists of an entry's servers (sorted by
// address), one line per server: "10.0.0.7:5432 added", "... removed",
// "... weight 5 -> 30", "... priority 0 -> 1 (now a backup)". `srv`: the
// servers come from SRV records (weights and priorities are theirs).
std::vector<std::string> describe_changes(const std::vector<Found>& before, const std::vector<Found>& after, bool srv);

// Servers that left an entry's answers stay for `hold` (the same Found),
// unless DNS gives them back first. Keeps what was last returned.
class HoldSet {
 public:
  // The entry's servers now: `fresh` plus those held, at most `max` in all
  // (the servers that left most recently are kept first; `fresh` must hold
  // no more than `max`); updates the hold times. Sorted by address.
  std::vector<Found> update(const std::vector<Found>& fresh, TimePoint now, Duration hold,
                            std::size_t max = static_cast<std::size_t>(-1));
  // When the next held server is due to leave (TimePoint::max(): none held).
  TimePoint next_expiry(Duration hold) const;
  // Addresses held now (for status).
  std::vector<std::string> held() const;
  const std::vector<Found>& current() const { return current_; }

 private:
  std::vector<Found> current_;
  std::map<std::string, std::pair<Found, TimePoint>> held_;  // address -> server, missing since
};

// ---- template definition ----

template <typename IpsOf>
std::vector<Found> servers_of_service(const std::vector<SrvRecord>& records, bool no_backups, IpsOf ips_of) {
  std::uint32_t lowest = 0x10000;
  for (const SrvRecord& r : records) {
    if (!r.target.empty() && r.port != 0) lowest = std::min<std::uint32_t>(lowest, r.priority);
  }
  std::map<std::string, std::pair<std::uint16_t, Found>> by_address;  // address -> (priority, server)
  for (const SrvRecord& r : records) {
    if (r.target.empty() || r.port == 0) continue;  // "." target: the service is not offered
    const bool backup = r.priority != lowest;
    if (backup && no_backups) continue;
    const std::vector<std::string>* ips = ips_of(r.target);
    if (ips == nullptr) continue;
    for (const std::string& ip : *ips) {
      Found f{address_text(ip, r.port), srv_weight(r.weight), backup, r.priority};
      auto [it, inserted] = by_address.emplace(f.address, std::make_pair(r.priority, f));
      if (inserted) continue;
      auto& [prio, have] = it->second;
      if (r.priority < prio || (r.priority == prio && f.weight > have.weight)) it->second = {r.priority, f};
    }
  }
  std::vector<Found> out;
  out.reserve(by_address.size());
  for (auto& [address, pf] : by_address) out.push_back(std::move(pf.second));
  return out;
}

}  // namespace sluice::discovery
