// Servers from DNS, on the control loop. Each `servers` entry with
// `resolve = true` (A and AAAA) or `service` (SRV, then each target's A and
// AAAA) is asked through one Resolver; each name is asked once however many
// entries use it, again when its TTL runs out (clamped, or `valid`), and
// sooner after a failure. A failed query (timeout, SERVFAIL, REFUSED, a
// network error) keeps the last good answer; a server missing from a good
// answer, or from an NXDOMAIN, stays for `hold` first.
//
// The control loop builds Snapshots from expand(file config): the file's
// servers plus those DNS gives now, as numeric, canonical addresses. When
// an entry's servers change, `on_change` runs (once per loop turn, however
// many answers came), and the control loop builds a new Snapshot the same
// way a reload does. An answer that changes no entry's servers calls nothing.
#pragma once

#include <uv.h>

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "discovery/answer.hpp"
#include "discovery/resolver.hpp"
#include "sluice/config.hpp"
#include "sluice/dns_status.hpp"
#include "sluice/time.hpp"

namespace sluice::discovery {

class Discovery {
 public:
  using ChangeCallback = std::function<void()>;

  Discovery(uv_loop_t* loop, ChangeCallback on_change);
  ~Discovery();  // stop() must have finished
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Takes the entries and [resolver] of `config` (the file's, as loaded):
  // new names are asked now; names no entry uses any more are dropped;
  // entries that stay keep their answers and hold times. A changed
  // [resolver] starts a new channel and asks every name again. Throws
  // std::runtime_error when c-ares cannot start.
  void configure(const Config& config);

  // `config` with every upstream's discovered servers added after its own,
  // entry by entry, each entry's sorted by address. An address the upstream
  // already has (written in the file, or from an earlier entry) is not
  // added twice.
  std::shared_ptr<const Config> expand(const std::shared_ptr<const Config>& config) const;

  // Some upstream has discovery entries.
  bool active() const { return !entries_.empty(); }
  // Every name has had its first answer or failure.
  bool settled() const;
  // Runs the loop until settled() or `max` has passed (start-up, -t). Call
  // only while nothing else runs the loop.
  void wait_settled(Duration max);
  // How long wait_settled should wait at most for `resolver`: every query's
  // tries, twice (an SRV name, then its targets).
  static Duration settle_limit(const ResolverConfig& resolver);

  DnsStatus status() const;

  // Ends every query and closes every handle; `done` runs from the loop.
  void stop(std::function<void()> done);

 private:
  using LookupKey = std::pair<RecordType, std::string>;
  // upstream, kind, name, port
  using EntryKey = std::tuple<std::string, DiscoveryKind, std::string, std::uint16_t>;
  struct Lookup;
  struct Entry {
    DiscoveredEntry config;
    bool no_backups = false;  // hash balancing
    bool over_cap = false;    // gave more than max_addresses servers last time (warned once)
    HoldSet hold;
  };

  static EntryKey key_of(const std::string& upstream, const DiscoveredEntry& e);
  void sync_lookups();
  Lookup& lookup(RecordType type, const std::string& name);
  void ask(Lookup& l);
  void on_result(Lookup* l, QueryStatus status, const Answer* answer);
  void retire(Lookup* l);
  void maybe_delete(Lookup* l);
  // The ips of `name` from its A and AAAA answers, those of `family` (null
  // when none of them has answered yet).
  const std::vector<std::string>* ips_of(const std::string& name, AddressFamily family,
                                         std::vector<std::string>& scratch) const;
  // The same name's lookup of the other address family, if it is asked.
  Lookup* sibling(const Lookup& l) const;
  void report_failure(Lookup& l, const Lookup* other);
  std::vector<Found> fresh(const Entry& e) const;
  // Recomputes every entry's servers; schedules on_change when one changed.
  void recompute();
  void arm_hold_timer();
  void handle_closed();
  void maybe_stopped();

  uv_loop_t* loop_;
  ChangeCallback on_change_;
  ResolverConfig resolver_config_;
  bool have_resolver_config_ = false;
  std::unique_ptr<Resolver> resolver_;
  std::list<std::unique_ptr<Resolver>> closing_resolvers_;
  std::map<EntryKey, Entry> entries_;
  std::vector<EntryKey> order_;  // entries in file order (status)
  std::map<LookupKey, Lookup*> lookups_;
  uv_timer_t hold_timer_{};
  uv_timer_t notify_timer_{};  // runs on_change once per loop turn
  int open_handles_ = 0;
  bool stopping_ = false;
  std::function<void()> stopped_;
  // counters
  std::uint64_t queries_ = 0;
  std::map<std::string, std::uint64_t> errors_;
  std::uint64_t changes_ = 0;
};

// For `sluice -t`: asks every discovered name once (with the file's
// [resolver]) and returns one warning per entry that gives no server now.
std::vector<std::string> check_names(const Config& config);

}  // namespace sluice::discovery
