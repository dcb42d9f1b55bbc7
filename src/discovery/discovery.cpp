#include "discovery/discovery.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "config/values.hpp"
#include "discovery/run_until.hpp"
#include "sluice/address.hpp"
#include "sluice/time.hpp"
#include "sluice/uv_handle.hpp"

namespace sluice::discovery {

namespace {

bool same_resolver(const ResolverConfig& a, const ResolverConfig& b) {
  if (a.timeout != b.timeout || a.attempts != b.attempts || a.nameservers.size() != b.nameservers.size()) return false;
  for (std::size_t i = 0; i < a.nameservers.size(); ++i) {
    if (a.nameservers[i].port != b.nameservers[i].port || !same_ip(a.nameservers[i].addr, b.nameservers[i].addr)) {
      return false;
    }
  }
  return true;
}

// "10.0.0.7:5432" / "[2001:db8::7]:5432" (from address_text) as an Endpoint.
// The text is numeric, so the loader's parser looks nothing up.
Endpoint endpoint_of(const std::string& address) {
  std::string error;
  std::optional<Endpoint> ep = parse_address(address, false, error);
  if (!ep) throw std::runtime_error("discovered address " + address + " " + error);
  return std::move(*ep);
}

std::string describe_lookup(RecordType type, const std::string& name) {
  return std::string(to_string(type)) + " " + name;
}

}  // namespace

struct Discovery::Lookup {
  Discovery* owner = nullptr;
  RecordType type = RecordType::a;
  std::string name;
  uv_timer_t timer{};
  bool in_flight = false;
  bool retired = false;
  bool timer_closed = false;
  bool asked = false;        // a first answer or failure came
  bool have_answer = false;  // a good answer (or NXDOMAIN) came
  Answer answer;             // the last good one
  Duration refresh = kNoTtlRefresh;
  std::int64_t next_ms = 0;  // wall clock of the next query
  std::int64_t last_answer_ms = 0;
  std::string last_error;    // "" after a good answer
  std::int64_t last_error_ms = 0;
  bool failing = false;      // in an episode of failures (logged once)
  std::uint64_t failures = 0;
  // A failure whose episode is logged once the other family's first answer
  // says whether that one gives addresses meanwhile (then it is no warning).
  bool report_pending = false;
  bool over_cap = false;     // the last answer had more records than the caps let in (warned once)
};

Discovery::Discovery(uv_loop_t* loop, ChangeCallback on_change) : loop_(loop), on_change_(std::move(on_change)) {
  uv_timer_init(loop_, &hold_timer_);
  hold_timer_.data = this;
  uv_timer_init(loop_, &notify_timer_);
  notify_timer_.data = this;
  open_handles_ = 2;
}

Discovery::~Discovery() = default;

Discovery::EntryKey Discovery::key_of(const std::string& upstream, const DiscoveredEntry& e) {
  return {upstream, e.kind, e.name, e.kind == DiscoveryKind::host ? e.port : std::uint16_t{0}};
}

void Discovery::configure(const Config& config) {
  if (stopping_) return;
  std::map<EntryKey, Entry> next;
  std::vector<EntryKey> order;
  for (const auto& [name, up] : config.upstreams) {
    for (const DiscoveredEntry& e : up.discovered) {
      const EntryKey key = key_of(name, e);
      auto it = entries_.find(key);
      Entry entry = it != entries_.end() ? it->second : Entry{};
      entry.config = e;
      entry.no_backups = up.balance == Balance::hash;
      next.emplace(key, std::move(entry));
      order.push_back(key);
    }
  }
  if (!next.empty() && (!resolver_ || !have_resolver_config_ || !same_resolver(resolver_config_, config.resolver))) {
    auto fresh_resolver = std::make_unique<Resolver>(loop_, config.resolver);  // may throw: nothing changed yet
    resolver_config_ = config.resolver;
    have_resolver_config_ = true;
    std::unique_ptr<Resolver> old = std::move(resolver_);
    resolver_ = std::move(fresh_resolver);
    if (old) {
      // Its queries end as `cancelled` and are asked again on the new channel.
      Resolver* raw = old.get();
      closing_resolvers_.push_back(std::move(old));
      raw->close([this, raw] {
        closing_resolvers_.remove_if([raw](const std::unique_ptr<Resolver>& r) { return r.get() == raw; });
        maybe_stopped();
      });
    }
  }
  entries_ = std::move(next);
  order_ = std::move(order);
  resolver_config_.valid = config.resolver.valid;
  resolver_config_.hold = config.resolver.hold;
  resolver_config_.family = config.resolver.family;
  resolver_config_.max_targets = config.resolver.max_targets;
  resolver_config_.max_addresses = config.resolver.max_addresses;
  sync_lookups();
  recompute();
}

Discovery::Lookup& Discovery::lookup(RecordType type, const std::string& name) {
  Lookup*& slot = lookups_[{type, name}];
  if (slot == nullptr) {
    slot = new Lookup;
    slot->owner = this;
    slot->type = type;
    slot->name = name;
    uv_timer_init(loop_, &slot->timer);
    slot->timer.data = slot;
    ++open_handles_;
    ask(*slot);
  }
  return *slot;
}

void Discovery::sync_lookups() {
  std::set<LookupKey> wanted;
  auto want_addresses = [&wanted](AddressFamily family, const std::string& name) {
    for (RecordType t : {RecordType::a, RecordType::aaaa}) {
      if (wants(family, t)) wanted.insert({t, name});
    }
  };
  for (const auto& [key, e] : entries_) {
    if (e.config.kind == DiscoveryKind::host) {
      want_addresses(e.config.family, e.config.name);
      continue;
    }
    wanted.insert({RecordType::srv, e.config.name});
    auto it = lookups_.find({RecordType::srv, e.config.name});
    if (it == lookups_.end()) continue;
    for (const SrvRecord& r : it->second->answer.srv) {
      if (!r.target.empty()) want_addresses(e.config.family, r.target);
    }
  }
  for (auto it = lookups_.begin(); it != lookups_.end();) {
    if (wanted.count(it->first) != 0) {
      ++it;
      continue;
    }
    retire(it->second);
    it = lookups_.erase(it);
  }
  for (const auto& [type, name] : wanted) lookup(type, name);
}

void Discovery::ask(Lookup& l) {
  if (stopping_ || l.retired || l.in_flight || !resolver_) return;
  l.in_flight = true;
  ++queries_;
  Lookup* p = &l;
  resolver_->query(l.name, l.type, [this, p](QueryStatus s, const Answer* a) { on_result(p, s, a); });
}

void Discovery::on_result(Lookup* l, QueryStatus status, const Answer* answer) {
  l->in_flight = false;
  if (l->retired) {
    maybe_delete(l);
    return;
  }
  if (status == QueryStatus::cancelled) {
    ask(*l);  // on the new channel (nothing when stopping)
    return;
  }
  const std::int64_t wall = wall_now_ms();
  l->asked = true;
  bool changed = false;
  const std::string what = describe_lookup(l->type, l->name);
  Lookup* other = sibling(*l);
  if (status == QueryStatus::answer || status == QueryStatus::nxdomain) {
    Answer got = answer != nullptr ? *answer : Answer{};
    // What one answer may bring: the rest is dropped, the same way on every instance.
    const bool srv = l->type == RecordType::srv;
    const std::size_t total = srv ? got.srv.size() : got.ips.size();
    const std::size_t dropped = srv ? cap_records(got.srv, resolver_config_.max_targets)
                                    : cap_addresses(got.ips, resolver_config_.max_addresses);
    if (dropped > 0 && !l->over_cap) {
      spdlog::warn("DNS: {} gives {} {}, more than {} = {}: {} dropped ({})", what, total,
                   srv ? "records" : "addresses", srv ? "max_targets" : "max_addresses",
                   srv ? resolver_config_.max_targets : resolver_config_.max_addresses, dropped,
                   srv ? "the highest priorities, then the smallest weights" : "the last in sorted order");
    } else if (dropped == 0 && l->over_cap) {
      spdlog::info("DNS: {} gives {} {} now, all of them used", what, total, srv ? "records" : "addresses");
    }
    l->over_cap = dropped > 0;
    changed = !l->have_answer || got.ips != l->answer.ips || got.srv != l->answer.srv;
    if (status == QueryStatus::nxdomain) {
      ++errors_["nxdomain"];
      if (l->last_error != "NXDOMAIN" && (!l->answer.ips.empty() || !l->answer.srv.empty())) {
        spdlog::warn("DNS: {} does not exist (NXDOMAIN): its servers leave after hold {}", what,
                     format_duration(resolver_config_.hold));
      }
      l->last_error = "NXDOMAIN";
      l->last_error_ms = wall;
    } else {
      if (l->failing) {
        spdlog::info("DNS: {} answers again after {} failed quer{}", what, l->failures,
                     l->failures == 1 ? "y" : "ies");
      }
      l->last_error.clear();
    }
    l->failing = false;
    l->report_pending = false;
    l->failures = 0;
    l->answer = std::move(got);
    l->have_answer = true;
    l->last_answer_ms = wall;
    l->refresh = refresh_interval(l->answer.ttl, resolver_config_.valid);
  } else {
    const std::string kind(to_string(status));
    // One family failing while the other gives addresses (a name server
    // that refuses AAAA, say) costs nothing: counted once per episode, and
    // no warning. An outage is counted query by query.
    const bool other_answers = other != nullptr && other->have_answer && !other->failing && !other->answer.ips.empty();
    if (!l->failing || !other_answers) ++errors_[kind];
    ++l->failures;
    l->last_error = kind;
    l->last_error_ms = wall;
    if (!l->failing) {
      l->failing = true;
      if (other != nullptr && !other->asked) {
        l->report_pending = true;  // said once the other family's first answer is in
      } else {
        report_failure(*l, other);
      }
    }
  }
  if (other != nullptr && other->report_pending && other->failing) {
    other->report_pending = false;
    report_failure(*other, l);
  }
  const Duration next = l->failing ? retry_interval(l->refresh) : l->refresh;
  l->next_ms = wall + next.count();
  uv_timer_start(&l->timer, [](uv_timer_t* t) {
    auto* lk = static_cast<Lookup*>(t->data);
    lk->owner->ask(*lk);
  }, timer_ms(next), 0);
  if (changed) {
    if (l->type == RecordType::srv) sync_lookups();
    recompute();
  }
}

// The first failure of an episode: a warning, unless the same name's
// other address family gives addresses meanwhile.
void Discovery::report_failure(Lookup& l, const Lookup* other) {
  const std::string what = describe_lookup(l.type, l.name);
  if (other != nullptr && other->have_answer && !other->failing && !other->answer.ips.empty()) {
    const char* family = l.type == RecordType::aaaa ? "ipv4" : "ipv6";
    spdlog::info("DNS: query for {} failed ({}) while {} answers: servers come from {} only until it answers "
                 "(family = \"{}\" does not ask for {})",
                 what, l.last_error, describe_lookup(other->type, other->name), to_string(other->type), family,
                 to_string(l.type));
    return;
  }
  spdlog::warn("DNS: query for {} failed ({}): {}", what, l.last_error,
               l.have_answer ? "keeping its last answer until it answers again" : "no server from it until it answers");
}

Discovery::Lookup* Discovery::sibling(const Lookup& l) const {
  if (l.type == RecordType::srv) return nullptr;
  auto it = lookups_.find({l.type == RecordType::a ? RecordType::aaaa : RecordType::a, l.name});
  return it == lookups_.end() || it->second->retired ? nullptr : it->second;
}

void Discovery::retire(Lookup* l) {
  l->retired = true;
  uv_close(as_handle(&l->timer), [](uv_handle_t* h) {
    auto* lk = static_cast<Lookup*>(h->data);
    lk->timer_closed = true;
    Discovery* d = lk->owner;
    d->maybe_delete(lk);
    d->handle_closed();
  });
}

void Discovery::maybe_delete(Lookup* l) {
  if (l->timer_closed && !l->in_flight) delete l;
}

const std::vector<std::string>* Discovery::ips_of(const std::string& name, AddressFamily family,
                                                  std::vector<std::string>& scratch) const {
  scratch.clear();
  bool known = false;
  for (RecordType t : {RecordType::a, RecordType::aaaa}) {
    if (!wants(family, t)) continue;
    auto it = lookups_.find({t, name});
    if (it == lookups_.end() || !it->second->have_answer) continue;
    known = true;
    scratch.insert(scratch.end(), it->second->answer.ips.begin(), it->second->answer.ips.end());
  }
  return known ? &scratch : nullptr;
}

std::vector<Found> Discovery::fresh(const Entry& e) const {
  std::vector<std::string> scratch;
  if (e.config.kind == DiscoveryKind::host) {
    const auto* ips = ips_of(e.config.name, e.config.family, scratch);
    return ips != nullptr ? servers_of_host(e.config.port, *ips) : std::vector<Found>{};
  }
  auto it = lookups_.find({RecordType::srv, e.config.name});
  if (it == lookups_.end()) return {};
  std::map<std::string, std::vector<std::string>> targets;
  auto out = servers_of_service(it->second->answer.srv, e.no_backups,
                                [&](const std::string& target) -> const std::vector<std::string>* {
                                  const auto* ips = ips_of(target, e.config.family, scratch);
                                  if (ips == nullptr) return nullptr;
                                  return &(targets[target] = *ips);
                                });
  normalize(out);
  return out;
}

void Discovery::recompute() {
  const TimePoint now = Clock::now();
  bool changed = false;
  constexpr std::size_t kMaxLines = 20;  // per entry and change: a big answer is summed up
  for (auto& [key, e] : entries_) {
    const std::string& upstream = std::get<0>(key);
    std::vector<Found> found = fresh(e);
    const std::size_t total = found.size();
    const std::size_t dropped = cap_servers(found, resolver_config_.max_addresses);
    if (dropped > 0 && !e.over_cap) {
      spdlog::warn("DNS: upstream \"{}\" {} gives {} servers, more than max_addresses = {}: {} dropped (backups, "
                   "then the highest priorities, the smallest weights, the last addresses)",
                   upstream, e.config.text, total, resolver_config_.max_addresses, dropped);
    } else if (dropped == 0 && e.over_cap) {
      spdlog::info("DNS: upstream \"{}\" {} gives {} servers now, all of them used", upstream, e.config.text, total);
    }
    e.over_cap = dropped > 0;
    const std::vector<Found> before = e.hold.current();
    const std::vector<std::string> held_before = e.hold.held();
    const std::vector<Found>& after = e.hold.update(found, now, resolver_config_.hold, resolver_config_.max_addresses);
    const std::vector<std::string> held = e.hold.held();
    // What changed, server by server: added, removed, weights and priorities,
    // and servers that left DNS and wait out `hold` (or came back in it).
    std::vector<std::string> lines = describe_changes(before, after, e.config.kind == DiscoveryKind::service);
    for (const std::string& a : held) {
      if (!std::binary_search(held_before.begin(), held_before.end(), a)) {
        lines.push_back(a + " no longer in DNS: kept for hold " + format_duration(resolver_config_.hold));
      }
    }
    for (const std::string& a : held_before) {
      const bool still_here = std::any_of(after.begin(), after.end(), [&a](const Found& f) { return f.address == a; });
      if (still_here && !std::binary_search(held.begin(), held.end(), a)) lines.push_back(a + " back in DNS");
    }
    for (std::size_t i = 0; i < lines.size() && i < kMaxLines; ++i) {
      spdlog::info("DNS: upstream \"{}\" {}: {}", upstream, e.config.name, lines[i]);
    }
    if (lines.size() > kMaxLines) {
      spdlog::info("DNS: upstream \"{}\" {}: and {} more changes", upstream, e.config.name, lines.size() - kMaxLines);
    }
    if (after != before) {
      changed = true;
      spdlog::info("DNS: upstream \"{}\" {} gives {} server(s) now{}", upstream, e.config.text, after.size(),
                   held.empty() ? std::string() : " (" + std::to_string(held.size()) + " held until hold ends)");
    }
  }
  arm_hold_timer();
  if (changed && !stopping_) {
    ++changes_;
    if (!uv_is_active(as_handle(&notify_timer_))) {
      uv_timer_start(&notify_timer_, [](uv_timer_t* t) {
        auto* d = static_cast<Discovery*>(t->data);
        if (d->on_change_ && !d->stopping_) d->on_change_();
      }, 0, 0);
    }
  }
}

void Discovery::arm_hold_timer() {
  if (stopping_) return;
  TimePoint next = TimePoint::max();
  for (const auto& [key, e] : entries_) next = std::min(next, e.hold.next_expiry(resolver_config_.hold));
  if (next == TimePoint::max()) {
    uv_timer_stop(&hold_timer_);
    return;
  }
  const auto wait = std::chrono::ceil<Duration>(next - Clock::now());
  uv_timer_start(&hold_timer_, [](uv_timer_t* t) { static_cast<Discovery*>(t->data)->recompute(); },
                 timer_ms(wait), 0);
}

std::shared_ptr<const Config> Discovery::expand(const std::shared_ptr<const Config>& config) const {
  bool any = false;
  for (const auto& [name, up] : config->upstreams) any = any || !up.discovered.empty();
  if (!any) return config;
  auto out = std::make_shared<Config>(*config);
  for (auto& [name, up] : out->upstreams) {
    if (up.discovered.empty()) continue;
    std::set<std::string> have;
    for (const ServerConfig& s : up.servers) {
      have.insert(s.address.text);
      have.insert(format_sockaddr(reinterpret_cast<const sockaddr*>(&s.address.addr)));
    }
    for (const DiscoveredEntry& e : up.discovered) {
      auto it = entries_.find(key_of(name, e));
      if (it == entries_.end()) continue;
      for (const Found& f : it->second.hold.current()) {
        if (!have.insert(f.address).second) continue;
        ServerConfig s;
        s.address = endpoint_of(f.address);
        s.weight = e.kind == DiscoveryKind::host ? e.weight : f.weight;
        s.backup = e.backup || f.backup;
        s.max_conns = e.max_conns;
        s.from = e.name;
        up.servers.push_back(std::move(s));
      }
    }
  }
  return out;
}

bool Discovery::settled() const {
  for (const auto& [key, l] : lookups_) {
    if (!l->asked) return false;
  }
  return true;
}

Duration Discovery::settle_limit(const ResolverConfig& resolver) {
  // c-ares doubles the timeout on each round over the name servers.
  Duration per_query{0};
  for (std::uint32_t i = 0; i < resolver.attempts; ++i) per_query += resolver.timeout * (1LL << std::min(i, 10U));
  return std::min<Duration>(2 * per_query + std::chrono::seconds(1), std::chrono::seconds(60));
}

void Discovery::wait_settled(Duration max) {
  run_until(loop_, [this] { return settled(); }, max);
}

DnsStatus Discovery::status() const {
  DnsStatus s;
  s.enabled = !entries_.empty();
  for (const Endpoint& ep : resolver_config_.nameservers) s.nameservers.push_back(format_sockaddr(reinterpret_cast<const sockaddr*>(&ep.addr)));
  s.queries = queries_;
  s.errors = errors_;
  s.changes = changes_;
  for (const EntryKey& key : order_) {
    const Entry& e = entries_.at(key);
    DnsEntryStatus st;
    st.upstream = std::get<0>(key);
    st.entry = e.config.text;
    const bool v4 = wants(e.config.family, RecordType::a);
    const bool v6 = wants(e.config.family, RecordType::aaaa);
    const std::string addresses = v4 && v6 ? "A/AAAA" : v4 ? "A" : "AAAA";
    st.type = e.config.kind == DiscoveryKind::host ? addresses : "SRV";
    st.name = e.config.name;
    for (const Found& f : e.hold.current()) st.servers.push_back(f.address);
    st.held = e.hold.held();
    // Its names: the host's, or the service's and each target's.
    std::vector<LookupKey> names;
    auto add_addresses = [&names, &e](const std::string& name) {
      for (RecordType t : {RecordType::a, RecordType::aaaa}) {
        if (wants(e.config.family, t)) names.push_back({t, name});
      }
    };
    if (e.config.kind == DiscoveryKind::host) {
      add_addresses(e.config.name);
    } else {
      names = {{RecordType::srv, e.config.name}};
      if (auto it = lookups_.find(names.front()); it != lookups_.end()) {
        for (const SrvRecord& r : it->second->answer.srv) add_addresses(r.target);
      }
    }
    for (const LookupKey& k : names) {
      auto it = lookups_.find(k);
      if (it == lookups_.end()) continue;
      const Lookup& l = *it->second;
      if (l.have_answer && l.answer.ttl && (!l.answer.ips.empty() || !l.answer.srv.empty())) {
        st.ttl_seconds = st.ttl_seconds < 0 ? *l.answer.ttl : std::min<std::int64_t>(st.ttl_seconds, *l.answer.ttl);
      }
      if (l.next_ms != 0) st.next_refresh_ms = st.next_refresh_ms == 0 ? l.next_ms : std::min(st.next_refresh_ms, l.next_ms);
      st.last_answer_ms = std::max(st.last_answer_ms, l.last_answer_ms);
      if (!l.last_error.empty()) {
        if (!st.last_error.empty()) st.last_error += "; ";
        st.last_error += describe_lookup(l.type, l.name) + ": " + l.last_error;
        st.last_error_ms = std::max(st.last_error_ms, l.last_error_ms);
      }
    }
    s.entries.push_back(std::move(st));
  }
  return s;
}

void Discovery::stop(std::function<void()> done) {
  stopping_ = true;
  stopped_ = std::move(done);
  for (auto& [key, l] : lookups_) retire(l);
  lookups_.clear();
  uv_close(as_handle(&hold_timer_), [](uv_handle_t* h) { static_cast<Discovery*>(h->data)->handle_closed(); });
  uv_close(as_handle(&notify_timer_), [](uv_handle_t* h) { static_cast<Discovery*>(h->data)->handle_closed(); });
  if (resolver_) {
    ++open_handles_;  // the resolver's own, as one
    Resolver* raw = resolver_.get();
    raw->close([this] {
      resolver_.reset();
      handle_closed();
    });
  }
}

void Discovery::handle_closed() {
  --open_handles_;
  maybe_stopped();
}

void Discovery::maybe_stopped() {
  if (!stopping_ || open_handles_ != 0 || !closing_resolvers_.empty() || !stopped_) return;
  auto done = std::move(stopped_);
  stopped_ = nullptr;
  done();
}

std::vector<std::string> check_names(const Config& config) {
  std::vector<std::string> warnings;
  bool any = false;
  for (const auto& [name, up] : config.upstreams) any = any || !up.discovered.empty();
  if (!any) return warnings;
  // Its findings are the warnings below, not log lines.
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    Discovery d(&loop, {});
    try {
      d.configure(config);
      d.wait_settled(Discovery::settle_limit(config.resolver));
      for (const DnsEntryStatus& e : d.status().entries) {
        if (!e.servers.empty()) continue;
        warnings.push_back("upstream \"" + e.upstream + "\": " + e.type + " " + e.name + " gives no server now" +
                           (e.last_error.empty() ? std::string(" (no address)") : " (" + e.last_error + ")") +
                           "; sluice starts without it and keeps asking");
      }
    } catch (const std::exception& ex) {
      warnings.push_back(std::string("DNS discovery cannot start: ") + ex.what());
    }
    d.stop([] {});
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&loop);
  spdlog::set_level(level);
  return warnings;
}

}  // namespace sluice::discovery
